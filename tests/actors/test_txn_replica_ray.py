"""Transactions on real ReplicaActors (real Ray, real WALs), the test as controller and as
transaction coordinator.

Proves, on a leader and a follower:
- ``write_txn_marker`` appends COMMIT and ABORT markers with acks=all, refuses an older
  producer epoch (47), an older coordinator epoch (52) and a non-leader (6);
- a read_committed fetch returns whole batches below the LSO (the first offset of the open
  transaction) and the aborted transactions it overlaps; read_uncommitted reads to the HW and
  is told the LSO; ListOffsets latest answers the LSO under read_committed;
- the follower replicates the markers: after failover the new leader answers read_committed
  with the same LSO and aborted list, and a read_committed long poll parked at the LSO wakes
  when a marker commits the open transaction;
- a gateway's markers (``ReplicaCalls``) reach the leader over its channel, not by Ray call,
  with their answers and refusals.
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

CALL_TIMEOUT_S = 30.0
TIMEOUT_MS = 10_000
COMMITTED, ABORTED, OPEN = 100, 200, 300  # producer ids


def _batch(pid: int, seq: int, epoch: int = 0, count: int = 2) -> bytes:
    records = [
        rb.Record(None, f"{pid}-{seq + i}".encode(), 1_700_000_000_000) for i in range(count)
    ]
    return rb.build_batch(
        records,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq if pid >= 0 else -1,
        transactional=pid >= 0,
    )


def _get(ref: Any) -> Any:
    return ray.get(ref, timeout=CALL_TIMEOUT_S)


def _produce(replica: Any, data: bytes) -> tuple[int, int]:
    outcome = _get(replica.produce.remote(data, -1, TIMEOUT_MS))
    return outcome.error_code, outcome.base_offset


def _marker(replica: Any, pid: int, commit: bool, epoch: int = 0, coordinator: int = 0) -> Any:
    outcome = _get(replica.write_txn_marker.remote(pid, epoch, coordinator, commit, TIMEOUT_MS))
    return outcome.error_code, outcome.base_offset


def _offsets(records: Any) -> list[tuple[int, int]]:
    """(base offset, record count) of each batch in a fetch answer."""
    return [(h.base_offset, h.records_count) for _, h in rb.iter_batches(bytes(records))]


def test_markers_lso_and_aborted_lists_across_failover(ray_local: Path, tmp_path: Path) -> None:
    config = ReplicaConfig(fetch_max_wait_ms=100)
    replicas = {
        rid: ReplicaActor.options(  # type: ignore[attr-defined]
            name=replica_actor_name("txn", 0, rid), namespace=NAMESPACE
        ).remote("txn", 0, rid, str(tmp_path / f"r{rid}"), {}, config)
        for rid in (0, 1)
    }
    _get(
        [
            replicas[0].become_leader.remote(BecomeLeader(1, 1, 1, (0, 1), (0, 1))),
            replicas[1].become_follower.remote(BecomeFollower(1, 0, 1, 1)),
        ]
    )
    leader, follower = replicas[0], replicas[1]

    assert _produce(leader, _batch(COMMITTED, 0, epoch=1)) == (0, 0)  # 0..1
    assert _marker(leader, COMMITTED, True, epoch=1, coordinator=5) == (0, 2)
    assert _produce(leader, _batch(ABORTED, 0)) == (0, 3)  # 3..4
    assert _produce(leader, _batch(-1, 0, count=1)) == (0, 5)  # plain data
    assert _marker(leader, ABORTED, False) == (0, 6)
    assert _produce(leader, _batch(OPEN, 0)) == (0, 7)  # 7..8, left open
    assert _produce(leader, _batch(-1, 0, count=1)) == (0, 9)
    # Kafka's refusals.
    assert _marker(leader, COMMITTED, False, epoch=0, coordinator=5)[0] == 47
    assert _marker(leader, COMMITTED, False, epoch=1, coordinator=4)[0] == 52
    assert _marker(follower, OPEN, True)[0] == 6
    assert _produce(leader, _plain_from(OPEN))[0] == 48

    state = _get(leader.state.remote())
    assert (state.high_watermark, state.last_stable_offset, state.open_transactions) == (10, 7, 1)
    committed = _get(leader.fetch.remote(0, 1 << 20, 0, 1, -1, 1))
    assert committed.last_stable_offset == 7 and committed.high_watermark == 10
    assert _offsets(committed.records) == [(0, 2), (2, 1), (3, 2), (5, 1), (6, 1)]
    assert committed.aborted_transactions == ((ABORTED, 3),)
    uncommitted = _get(leader.fetch.remote(0, 1 << 20))
    assert uncommitted.last_stable_offset == 7 and uncommitted.aborted_transactions == ()
    assert _offsets(uncommitted.records)[-1] == (9, 1)
    assert _get(leader.list_offsets.remote(-1, -1, 1))[2] == 7
    assert _get(leader.list_offsets.remote(-1))[2] == 10
    wait_until(
        lambda: _get(follower.state.remote()).last_stable_offset == 7,
        timeout_s=CALL_TIMEOUT_S,
        message="the follower's LSO",
    )

    # Failover: the follower leads, with the same transaction state.
    ray.kill(leader, no_restart=True)
    _get(follower.become_leader.remote(BecomeLeader(1, 2, 2, (1,), (0, 1))))
    again = _get(follower.fetch.remote(0, 1 << 20, 0, 1, -1, 1))
    assert (again.last_stable_offset, again.aborted_transactions) == (7, ((ABORTED, 3),))
    assert _offsets(again.records) == _offsets(committed.records)
    # A read_committed long poll at the LSO waits for the marker that commits OPEN.
    poll = follower.fetch.remote(7, 1 << 20, 20_000, 1, -1, 1)
    ready, _ = ray.wait([poll], timeout=0.5)
    assert ready == []
    assert _marker(follower, OPEN, True) == (0, 10)
    woken = _get(poll)
    assert woken.last_stable_offset == 11 and woken.aborted_transactions == ()
    assert _offsets(woken.records) == [(7, 2), (9, 1), (10, 1)]


def _plain_from(pid: int) -> bytes:
    """A non-transactional idempotent batch of ``pid``, next in its sequence (2)."""
    records = [rb.Record(None, b"plain", 1_700_000_000_000)]
    return rb.build_batch(records, producer_id=pid, producer_epoch=0, base_sequence=2)


def test_markers_from_a_gateway_go_over_the_replica_channel(
    ray_local: Path, tmp_path: Path
) -> None:
    """The transaction coordinator's markers take the gateway's channel to the leader (one per
    partition per commit: a Ray call's cost on every transaction), answers and refusals alike."""
    import asyncio

    from raylog.gateway.replica_calls import ReplicaCalls

    name = replica_actor_name("txn-channel", 0, 0)
    leader = ReplicaActor.options(  # type: ignore[attr-defined]
        name=name, namespace=NAMESPACE
    ).remote("txn-channel", 0, 0, str(tmp_path / "r0"), {}, ReplicaConfig())
    _get(leader.become_leader.remote(BecomeLeader(1, 1, 1, (0,), (0,))))

    async def markers() -> list[tuple[int, int]]:
        calls = ReplicaCalls()
        try:
            before = _get(leader.channel_stats.remote())["calls_in"]
            answers = []
            for _ in range(50):  # bounded: the first calls go by Ray while the link connects
                outcome = await calls.call(
                    name, "write_txn_marker", (COMMITTED, 0, 3, True, TIMEOUT_MS),
                    timeout_s=CALL_TIMEOUT_S, retry=False,
                )  # fmt: skip
                answers.append((outcome.error_code, outcome.base_offset))
                if _get(leader.channel_stats.remote())["calls_in"] > before:
                    break
            assert _get(leader.channel_stats.remote())["calls_in"] > before, "never by channel"
            refused = await calls.call(
                name, "write_txn_marker", (COMMITTED, 0, 2, False, TIMEOUT_MS),
                timeout_s=CALL_TIMEOUT_S, retry=False,
            )  # fmt: skip
            answers.append((refused.error_code, refused.base_offset))
            return answers
        finally:
            await calls.aclose()

    answers = asyncio.run(markers())
    assert answers[:-1] == [(0, offset) for offset in range(len(answers) - 1)]
    assert answers[-1][0] == 52  # an older coordinator epoch, answered over the channel too
