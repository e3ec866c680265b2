"""Log compaction driven by the ReplicaActor: every ``log.cleaner.backoff.ms`` a replica of a
compacted topic runs a cleaning pass when one is due, below its high watermark; consumers then
read the latest record per key at the offsets it was produced at, also after a restart.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from support.waiting import wait_until

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import (
    AlterPartitionResponse,
    BecomeFollower,
    BecomeLeader,
)
from raylog.pipelines import records as R
from raylog.storage import batch as rb

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 30.0
KEYS = 5
BATCHES = 60
CONFIGS = {
    "segment.bytes": "2048",
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": "0.01",
}


def _start(topic: str, log_dir: Path, replicas: tuple[int, ...] = (0,)) -> object:
    """Replica 0, leading alone (its ISR) with ``replicas`` assigned."""
    replica = ReplicaActor.options(  # type: ignore[attr-defined]
        name=replica_actor_name(topic, 0, 0), namespace=NAMESPACE
    ).remote(topic, 0, 0, str(log_dir), CONFIGS, cleaner_backoff_ms=50)
    ray.get(
        replica.become_leader.remote(
            BecomeLeader(
                controller_epoch=1, leader_epoch=1, partition_epoch=1, isr=(0,), replicas=replicas
            )
        ),
        timeout=CALL_TIMEOUT_S,
    )
    if replicas != (0,):
        # A fresh leader given a partial ISR fences it first (its process may have replaced
        # one that led): commit that as the controller would, partition epoch 2.
        committed = AlterPartitionResponse(0, leader_epoch=1, partition_epoch=2, isr=(0,))
        ray.get(replica.alter_partition_response.remote(committed), timeout=CALL_TIMEOUT_S)
    return replica


def _consume(replica: object) -> list[tuple[int, bytes, bytes]]:
    out = ray.get(replica.fetch.remote(0, 1 << 24), timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
    assert out.error_code == 0, out
    rows = R.decode_batches(out.records, topic="t", partition=0).to_pylist()
    return [(r["offset"], r["key"], r["value"]) for r in rows]


def _produce_keyed(replica: object, batches: int) -> list[tuple[int, bytes, bytes]]:
    """``batches`` batches of 3 records over KEYS keys, acks=all; (offset, key, value) of each."""
    produced: list[tuple[int, bytes, bytes]] = []
    for i in range(batches):
        records = [
            rb.Record(key=b"k%d" % ((i * 3 + j) % KEYS), value=b"v%d" % (i * 3 + j) * 20,
                      timestamp_ms=1_000 + i)
            for j in range(3)
        ]  # fmt: skip
        outcome = ray.get(
            replica.produce.remote(rb.build_batch(records), -1, 10_000),  # type: ignore[attr-defined]
            timeout=CALL_TIMEOUT_S,
        )
        assert outcome.error_code == 0, outcome
        produced += [(outcome.base_offset + j, r.key, r.value) for j, r in enumerate(records)]
    return produced


def _compacted(produced: list[tuple[int, bytes, bytes]], below: int) -> list:
    latest = {key: offset for offset, key, _ in produced if offset < below}
    return [r for r in produced if r[0] >= below or latest[r[1]] == r[0]]


def _check_compacted(replica: object, produced: list[tuple[int, bytes, bytes]]) -> int:
    """Consume from 0 and check the rows are exactly the log compacted below the cleaner's
    first dirty offset (read before and after, so a pass in between is retried); returns it."""

    def settled() -> int | None:
        before = ray.get(replica.cleaner_stats.remote(), timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
        rows = _consume(replica)
        after = ray.get(replica.cleaner_stats.remote(), timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
        below = after["first_dirty_offset"]
        if below != before["first_dirty_offset"] or not below:
            return None  # a pass ran meanwhile, or none has yet
        assert rows == _compacted(produced, below)
        assert len([r for r in rows if r[0] < below]) == KEYS
        return below

    return wait_until(settled, timeout_s=CALL_TIMEOUT_S)


def test_replica_compacts_its_log_below_the_high_watermark(ray_local: Path, tmp_path: Path) -> None:
    topic = "compacted-replica"
    replica = _start(topic, tmp_path / "r0")
    try:
        produced = _produce_keyed(replica, BATCHES)

        def cleaned() -> dict[str, int] | None:
            stats = ray.get(replica.cleaner_stats.remote(), timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
            return stats if stats["passes"] and stats["records_removed"] else None

        stats = wait_until(cleaned, timeout_s=CALL_TIMEOUT_S)
        assert 0 < stats["first_dirty_offset"] <= len(produced)
        below = _check_compacted(replica, produced)
        assert below >= stats["first_dirty_offset"]
    finally:
        ray.kill(replica, no_restart=True)

    # A restarted replica recovers the compacted log and appends after it.
    replica = _start(topic, tmp_path / "r0")
    try:
        assert _check_compacted(replica, produced) >= below
        more = rb.build_batch([rb.Record(key=b"k1", value=b"after", timestamp_ms=9_000)])
        outcome = ray.get(replica.produce.remote(more, -1, 10_000), timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
        assert outcome.error_code == 0 and outcome.base_offset == len(produced)
    finally:
        ray.kill(replica, no_restart=True)


def test_a_new_follower_copies_a_compacted_leader_and_can_lead(
    ray_local: Path, tmp_path: Path
) -> None:
    """A replica added with an empty log (a reassignment) fetches the leader's compacted log,
    gaps included, into the same bytes; then it leads and appends after them."""
    topic = "compacted-catch-up"
    leader = _start(topic, tmp_path / "r0", replicas=(0, 1))
    follower = ReplicaActor.options(  # type: ignore[attr-defined]
        name=replica_actor_name(topic, 0, 1), namespace=NAMESPACE
    ).remote(topic, 0, 1, str(tmp_path / "r1"), CONFIGS, cleaner_backoff_ms=3_600_000)
    try:
        produced = _produce_keyed(leader, BATCHES)
        _check_compacted(leader, produced)

        def fully_compacted() -> bool:  # every closed segment cleaned: no pass is due any more
            state = ray.get(leader.state.remote(), timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
            return state.cleaner_dirty_ratio == 0.0

        wait_until(fully_compacted, timeout_s=CALL_TIMEOUT_S)
        end = len(produced)
        ray.get(
            follower.become_follower.remote(
                BecomeFollower(controller_epoch=1, leader_id=0, leader_epoch=1, partition_epoch=1)
            ),
            timeout=CALL_TIMEOUT_S,
        )

        def caught_up() -> bool:
            state = ray.get(follower.state.remote(), timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
            return state.log_end_offset == end and state.high_watermark == end

        wait_until(caught_up, timeout_s=CALL_TIMEOUT_S)
        leader_bytes = ray.get(leader.fetch.remote(0, 1 << 24), timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
        follower_bytes = ray.get(follower.fetch.remote(0, 1 << 24), timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
        assert follower_bytes.records == leader_bytes.records
        assert _consume(follower) == _consume(leader)
        assert len(_consume(follower)) < end  # gaps were copied, not filled

        ray.kill(leader, no_restart=True)
        ray.get(
            follower.become_leader.remote(
                BecomeLeader(
                    controller_epoch=1, leader_epoch=2, partition_epoch=2, isr=(1,), replicas=(1,)
                )
            ),
            timeout=CALL_TIMEOUT_S,
        )
        more = rb.build_batch([rb.Record(key=b"k0", value=b"new leader", timestamp_ms=9_000)])
        outcome = ray.get(follower.produce.remote(more, -1, 10_000), timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
        assert outcome.error_code == 0 and outcome.base_offset == end
    finally:
        for handle in (leader, follower):
            ray.kill(handle, no_restart=True)
