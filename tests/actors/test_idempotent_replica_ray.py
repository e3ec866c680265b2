"""Idempotent producers on real ReplicaActors (real Ray, real WALs), the test as controller.

Proves:
- the leader deduplicates: a retry of an acknowledged batch is answered with its original
  offset and appends nothing; a sequence gap is OUT_OF_ORDER_SEQUENCE_NUMBER (45) and an older
  producer epoch INVALID_PRODUCER_EPOCH (47);
- dedupe survives a failover: a batch replicated to every follower whose answer the producer
  never saw is, retried at the new leader, answered with the original offset (the follower
  rebuilt the producer state from replicated batch headers);
- dedupe survives a restart: a replica hard-killed and restarted by Ray rebuilds the producer
  state from its WAL and, made leader, answers a retry with the original offset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
from support.waiting import wait_until

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.storage import batch as rb

pytestmark = pytest.mark.slow

RF = 3
CALL_TIMEOUT_S = 30.0
PRODUCER_ID = 77


def _batch(seq: int, epoch: int = 0, count: int = 2) -> bytes:
    records = [
        rb.Record(key=None, value=f"seq-{seq + i}".encode(), timestamp_ms=1_700_000_000_000)
        for i in range(count)
    ]
    return rb.build_batch(records, producer_id=PRODUCER_ID, producer_epoch=epoch, base_sequence=seq)


def _get(ref: Any) -> Any:
    return ray.get(ref, timeout=CALL_TIMEOUT_S)


def _lead(replicas: dict[int, Any], leader: int, epoch: int, isr: tuple[int, ...]) -> None:
    calls = [
        replicas[leader].become_leader.remote(BecomeLeader(1, epoch, epoch, isr, tuple(range(RF))))
    ]
    calls += [
        replicas[f].become_follower.remote(BecomeFollower(1, leader, epoch, epoch))
        for f in replicas
        if f != leader
    ]
    _get(calls)


def _produce(replica: Any, data: bytes, acks: int = -1) -> tuple[int, int]:
    outcome = _get(replica.produce.remote(data, acks, 10_000))
    return outcome.error_code, outcome.base_offset


def _state(replica: Any) -> Any:
    return _get(replica.state.remote())


def _restarted(replica: Any) -> bool:
    """The new incarnation answers (a kill lands asynchronously: the old one may still answer,
    but it has a role, and a restarted replica has none until the controller speaks)."""
    try:
        return bool(ray.get(replica.state.remote(), timeout=CALL_TIMEOUT_S).role == "none")
    except ray.exceptions.RayActorError:
        return False


def test_dedupe_on_the_leader_across_failover_and_after_restart(
    ray_local: Path, tmp_path: Path
) -> None:
    config = ReplicaConfig(min_insync_replicas=2, fetch_max_wait_ms=100)
    replicas = {
        rid: ReplicaActor.options(  # type: ignore[attr-defined]
            name=replica_actor_name("idem", 0, rid), namespace=NAMESPACE
        ).remote("idem", 0, rid, str(tmp_path / f"r{rid}"), {"min.insync.replicas": "2"}, config)
        for rid in range(RF)
    }
    _lead(replicas, 0, 1, (0, 1, 2))

    # 1. The leader: in-order batches, a retry, a gap, an old epoch.
    offsets = [_produce(replicas[0], _batch(seq, epoch=1)) for seq in range(0, 10, 2)]
    assert offsets == [(0, o) for o in range(0, 10, 2)]
    assert _produce(replicas[0], _batch(6, epoch=1)) == (0, 6)
    assert _produce(replicas[0], _batch(30, epoch=1))[0] == 45
    assert _produce(replicas[0], _batch(10, epoch=0))[0] == 47
    assert _state(replicas[0]).log_end_offset == 10

    # 2. Batch seq 10 reaches every replica, but its answer is "lost"; the leader is killed.
    assert _produce(replicas[0], _batch(10, epoch=1)) == (0, 10)
    wait_until(
        lambda: all(_state(r).high_watermark == 12 for r in replicas.values()),
        timeout_s=CALL_TIMEOUT_S,
        message="HW 12 everywhere",
    )
    ray.kill(replicas[0], no_restart=False)
    _lead({1: replicas[1], 2: replicas[2]}, 1, 2, (1, 2))
    assert _produce(replicas[1], _batch(10, epoch=1)) == (0, 10), "a retry after failover"
    assert _produce(replicas[1], _batch(12, epoch=1)) == (0, 12)
    assert _state(replicas[1]).log_end_offset == 14

    # 3. Replica 0 comes back from its WAL, catches up, is killed again, and leads.
    wait_until(lambda: _restarted(replicas[0]), timeout_s=CALL_TIMEOUT_S, message="restarted")
    _get(replicas[0].become_follower.remote(BecomeFollower(1, 1, 2, 2)))
    wait_until(
        lambda: _state(replicas[0]).log_end_offset == 14,
        timeout_s=CALL_TIMEOUT_S,
        message="replica 0 caught up",
    )
    ray.kill(replicas[0], no_restart=False)
    wait_until(lambda: _restarted(replicas[0]), timeout_s=CALL_TIMEOUT_S, message="restarted")
    assert _state(replicas[0]).log_end_offset == 14
    _lead(replicas, 0, 3, (0, 1, 2))
    assert _produce(replicas[0], _batch(12, epoch=1)) == (0, 12), "rebuilt from the WAL"
    assert _produce(replicas[0], _batch(8, epoch=1)) == (0, 8)
    assert _produce(replicas[0], _batch(14, epoch=1)) == (0, 14)
    assert _produce(replicas[0], _batch(0, epoch=1))[0] == 45, "older than the last five"
