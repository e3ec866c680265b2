"""Producer-state snapshots on a real ReplicaActor (real Ray, a real WAL), the test as
controller.

Proves: a replica whose log rolls writes a snapshot in its log directory at a tick after the
roll; hard-killed and restarted by Ray with that snapshot below its log end, it starts from
the snapshot and the batches after it and, made leader again, answers retries of batches from
both sides of the snapshot with their original offsets, and refuses a sequence gap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
from support.waiting import wait_until

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.storage import batch as rb

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 30.0
PRODUCER_ID = 91


def _batch(seq: int) -> bytes:
    record = rb.Record(key=None, value=b"v" * 2000, timestamp_ms=1_700_000_000_000)
    return rb.build_batch([record], producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=seq)


def _get(ref: Any) -> Any:
    return ray.get(ref, timeout=CALL_TIMEOUT_S)


def _produce(replica: Any, seq: int) -> tuple[int, int]:
    outcome = _get(replica.produce.remote(_batch(seq), -1, 10_000))
    return outcome.error_code, outcome.base_offset


def _snapshots(directory: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in directory.glob("*.snapshot"))


def _restarted(replica: Any) -> bool:
    try:
        return bool(ray.get(replica.state.remote(), timeout=CALL_TIMEOUT_S).role == "none")
    except ray.exceptions.RayActorError:
        return False


def test_a_restarted_replica_starts_from_its_snapshot(ray_local: Path, tmp_path: Path) -> None:
    log_dir = tmp_path / "r0"
    replica = ReplicaActor.options(  # type: ignore[attr-defined]
        name=replica_actor_name("snap", 0, 0), namespace=NAMESPACE
    ).remote("snap", 0, 0, str(log_dir), {"segment.bytes": "16384"}, ReplicaConfig())
    _get(replica.become_leader.remote(BecomeLeader(1, 1, 1, (0,), (0,))))
    # Batches of ~2 KiB in segments of 16 KiB: the first roll comes after eight.
    assert [_produce(replica, seq) for seq in range(10)] == [(0, o) for o in range(10)]
    wait_until(lambda: _snapshots(log_dir), timeout_s=CALL_TIMEOUT_S, message="a snapshot")
    snapshot = _snapshots(log_dir)[-1]
    assert [_produce(replica, seq) for seq in (10, 11)] == [(0, 10), (0, 11)]
    assert _snapshots(log_dir)[-1] == snapshot  # no roll since
    # The window of five after the restart holds batches of the snapshot and of the tail.
    assert 12 - 4 <= snapshot <= 10

    ray.kill(replica, no_restart=False)
    wait_until(lambda: _restarted(replica), timeout_s=CALL_TIMEOUT_S, message="restarted")
    _get(replica.become_leader.remote(BecomeLeader(1, 2, 2, (0,), (0,))))
    assert _produce(replica, 11) == (0, 11), "a retry from the tail after the snapshot"
    assert _produce(replica, 7) == (0, 7), "a retry from the snapshot's window"
    assert _produce(replica, 20)[0] == 45
    assert _produce(replica, 12) == (0, 12)
