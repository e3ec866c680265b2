"""ReplicaActor on real Ray: three replica actors, each with its own WAL on disk.

Proves, in pull and in push mode, with the test standing in for the controller:
- a stream of acks=all produces (several in flight) is acknowledged and readable below the HW;
- the leader actor killed (Ray restarts it from its WAL) and a follower promoted: every
  acknowledged batch is on the new leader, which keeps taking acks=all writes;
- the old leader, which had appended an acks=1 suffix nobody else has, comes back as a
  follower, truncates that divergent suffix (KIP-320/279) and converges byte for byte;
- a storage-level rejection (a corrupt batch) gets its Kafka error code and loses nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
from support.replica_reads import served_batches
from support.waiting import wait_until

from raylog.actors import raycluster
from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.storage import batch as rb
from raylog.storage.errors import CorruptRecordError

pytestmark = pytest.mark.slow

RF = 3
CALL_TIMEOUT_S = 30.0
IN_FLIGHT = 8


def _value(i: int, size: int = 200) -> bytes:
    return f"record-{i:06d}-".encode() + bytes(size)


def _batch(i: int) -> bytes:
    value = _value(i)
    return rb.build_batch(
        [rb.Record(key=str(i).encode(), value=value, timestamp_ms=1_700_000_000_000 + i)]
    )


def _start(tmp_path: Path, topic: str, mode: str) -> dict[int, Any]:
    config = ReplicaConfig(replication_mode=mode, min_insync_replicas=2, fetch_max_wait_ms=200)
    replicas = {}
    for rid in range(RF):
        replicas[rid] = ReplicaActor.options(  # type: ignore[attr-defined]
            name=replica_actor_name(topic, 0, rid), namespace=NAMESPACE
        ).remote(
            topic, 0, rid, str(tmp_path / f"replica-{rid}"), {"min.insync.replicas": "2"}, config
        )
    return replicas


def _lead(
    replicas: dict[int, Any],
    leader: int,
    epoch: int,
    isr: tuple[int, ...],
    followers: tuple[int, ...],
) -> None:
    calls = [
        replicas[leader].become_leader.remote(
            BecomeLeader(
                controller_epoch=1,
                leader_epoch=epoch,
                partition_epoch=epoch,
                isr=isr,
                replicas=tuple(range(RF)),
            )
        )
    ]
    for f in followers:
        calls.append(
            replicas[f].become_follower.remote(
                BecomeFollower(
                    controller_epoch=1, leader_id=leader, leader_epoch=epoch, partition_epoch=epoch
                )
            )
        )
    ray.get(calls, timeout=CALL_TIMEOUT_S)


def _produce_all(leader: Any, start: int, count: int, acks: int = -1) -> dict[int, int]:
    """Produce batches start..start+count with IN_FLIGHT calls outstanding; returns {i: offset}."""
    acked: dict[int, int] = {}
    pending: dict[Any, int] = {}
    i = start
    while i < start + count or pending:
        while i < start + count and len(pending) < IN_FLIGHT:
            pending[leader.produce.remote(_batch(i), acks, 10_000)] = i
            i += 1
        done, _ = ray.wait(list(pending), num_returns=1, timeout=CALL_TIMEOUT_S)
        assert done, "a produce call did not return in time"
        for ref in done:
            n = pending.pop(ref)
            outcome = ray.get(ref)
            assert outcome.error_code == 0, outcome
            acked[n] = outcome.base_offset
    return acked


def _values(data: bytes) -> list[bytes]:
    from kafka.record.default_records import DefaultRecordBatch

    values = []
    for pos, header in rb.iter_batches(data):
        for record in DefaultRecordBatch(data[pos : pos + header.size]):
            values.append(bytes(record.value))
    return values


def _restarted(replica: Any, replica_id: int) -> bool:
    try:
        return ray.get(replica.ping.remote(), timeout=CALL_TIMEOUT_S) == replica_id
    except ray.exceptions.RayActorError:  # ActorUnavailableError while it restarts
        return False


def _state(replica: Any) -> Any:
    return ray.get(replica.state.remote(), timeout=CALL_TIMEOUT_S)


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_failover_keeps_acknowledged_writes_and_truncates_divergence(
    ray_local: Path, tmp_path: Path, mode: str
) -> None:
    topic = f"failover-{mode}"
    replicas = _start(tmp_path, topic, mode)
    # Epoch 1: replica 0 leads, 1 and 2 follow.
    _lead(replicas, 0, 1, (0, 1, 2), (1, 2))
    acked = _produce_all(replicas[0], 0, 200)
    assert sorted(acked.values()) == list(range(200)), "one record per batch, offsets dense"
    wait_until(
        lambda: all(_state(r).high_watermark == 200 for r in replicas.values()),
        timeout_s=CALL_TIMEOUT_S,
        message="HW 200 on every replica",
    )

    # The followers lose their leader (the controller would say so) while replica 0 still
    # takes acks=1 writes in epoch 1: a suffix only replica 0 has.
    for f in (1, 2):
        ray.get(
            replicas[f].become_follower.remote(
                BecomeFollower(controller_epoch=1, leader_id=-1, leader_epoch=2, partition_epoch=2)
            ),
            timeout=CALL_TIMEOUT_S,
        )
    divergent = _produce_all(replicas[0], 10_000, 5, acks=1)
    assert sorted(divergent.values()) == list(range(200, 205))

    # Hard-kill the leader; Ray restarts it from its WAL. Promote replica 1 in epoch 3.
    ray.kill(replicas[0], no_restart=False)
    _lead(replicas, 1, 3, (1, 2), (2,))
    acked.update(_produce_all(replicas[1], 200, 100))
    new_leader_end = 300
    wait_until(
        lambda: _state(replicas[1]).high_watermark == new_leader_end,
        timeout_s=CALL_TIMEOUT_S,
        message="HW 300 on the new leader",
    )
    # Calls in flight may be applied in any order: the offsets say which order won.
    assert sorted(acked.values()) == list(range(300))
    expected = [_value(i) for i in sorted(acked, key=acked.__getitem__)]
    assert _values(served_batches(replicas[1], new_leader_end)) == expected

    # The old leader recovered its WAL (with the epoch-1 suffix) and now follows in epoch 3.
    wait_until(
        lambda: _restarted(replicas[0], 0),
        timeout_s=CALL_TIMEOUT_S,
        message="replica 0 restarted",
    )
    restarted = _state(replicas[0])
    assert restarted.log_end_offset == 205, "the acks=1 suffix survived the crash on disk"
    ray.get(
        replicas[0].become_follower.remote(
            BecomeFollower(controller_epoch=1, leader_id=1, leader_epoch=3, partition_epoch=3)
        ),
        timeout=CALL_TIMEOUT_S,
    )
    wait_until(
        lambda: (
            (s := _state(replicas[0])).log_end_offset == new_leader_end
            and s.high_watermark == new_leader_end
        ),
        timeout_s=CALL_TIMEOUT_S,
        message="old leader truncated and caught up",
    )
    # A follower learns the high watermark from the leader's next message: in push mode, with
    # nothing left to push, from its idle fetch. Each replica serves only below its own.
    wait_until(
        lambda: all(_state(r).high_watermark == new_leader_end for r in replicas.values()),
        timeout_s=CALL_TIMEOUT_S,
        message="every replica's high watermark at the new leader's log end",
    )
    logs = {rid: served_batches(r, new_leader_end) for rid, r in replicas.items()}
    assert logs[0] == logs[1] == logs[2], "logs differ below the high watermark"
    assert _values(logs[0]) == expected


def test_corrupt_batch_is_refused_and_loses_nothing(ray_local: Path, tmp_path: Path) -> None:
    replicas = _start(tmp_path, "corrupt", "pull")
    _lead(replicas, 0, 1, (0, 1, 2), (1, 2))
    _produce_all(replicas[0], 0, 3)
    bad = bytearray(_batch(99))
    bad[-1] ^= 0xFF  # flips a byte under the CRC
    outcome = ray.get(replicas[0].produce.remote(bytes(bad), -1, 5_000), timeout=CALL_TIMEOUT_S)
    assert outcome.error_code == CorruptRecordError.error_code
    _produce_all(replicas[0], 3, 2)
    wait_until(
        lambda: _state(replicas[0]).high_watermark == 5, timeout_s=CALL_TIMEOUT_S, message="HW 5"
    )
    assert len(_values(served_batches(replicas[0], 5))) == 5


def test_replica_processes_keep_freed_batch_buffers_in_the_heap(ray_local: Path) -> None:
    """The cluster's processes get raylog's glibc malloc tunables (raycluster.MALLOC_ENV), so a
    replica does not map and unmap every megabyte batch it handles."""

    @ray.remote(num_cpus=0)
    def malloc_env() -> dict[str, str]:
        import os

        return {key: os.environ.get(key, "") for key in raycluster.MALLOC_ENV}

    assert ray.get(malloc_env.remote(), timeout=CALL_TIMEOUT_S) == raycluster.MALLOC_ENV


def test_cluster_processes_run_at_raylog_s_worker_niceness(ray_local: Path) -> None:
    """The cluster's worker processes (its brokers and replicas) run at the niceness of
    raycluster.PRIORITY_ENV (0), not Ray's default 15 for workers."""

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        import os

        return os.nice(0)

    expected = int(raycluster.PRIORITY_ENV["RAY_worker_niceness"])
    assert ray.get(niceness.remote(), timeout=CALL_TIMEOUT_S) == expected


def test_read_committed_returns_fetchs_batches_in_ray_s_object_store(
    ray_local: Path, tmp_path: Path
) -> None:
    """The pipelines' read: the same committed batches as a consumer fetch, whole batches up
    to max_bytes (more than replica.fetch.max.bytes), handed over as a read-only view of the
    object store rather than an unpickled copy; an empty answer stays plain bytes."""
    replicas = _start(tmp_path, "bulk", "pull")
    _lead(replicas, 0, 1, (0, 1, 2), (1, 2))
    leader = replicas[0]
    _produce_all(leader, 0, 12)
    big = rb.build_batch([rb.Record(b"k", bytes(600_000), 1_700_000_000_000)])
    for _ in range(3):  # each below max.message.bytes, together above 1 MiB
        outcome = ray.get(leader.produce.remote(big, -1, 10_000), timeout=CALL_TIMEOUT_S)
        assert outcome.error_code == 0, outcome
    wait_until(
        lambda: _state(leader).high_watermark == 15, timeout_s=CALL_TIMEOUT_S, message="HW 15"
    )
    bulk = ray.get(leader.read_committed.remote(0, 8 << 20), timeout=CALL_TIMEOUT_S)
    fetched = ray.get(leader.fetch.remote(0, 8 << 20), timeout=CALL_TIMEOUT_S)
    assert bulk.error_code == 0 and bulk.high_watermark == 15
    assert not isinstance(bulk.records, bytes)  # a buffer in the object store
    assert bytes(memoryview(bulk.records)) == fetched.records == served_batches(leader, 15)
    assert len(fetched.records) > 1 << 20  # one call past replica.fetch.max.bytes (1 MiB)
    at_end = ray.get(leader.read_committed.remote(15, 8 << 20), timeout=CALL_TIMEOUT_S)
    assert at_end.error_code == 0 and at_end.records == b""


def test_list_offsets_by_time_finds_the_record_inside_a_batch(
    ray_local: Path, tmp_path: Path
) -> None:
    """ListOffsets by timestamp answers the first record at or after it, with that record's
    timestamp, also when it sits in the middle of a batch (Kafka reads inside the batch)."""
    replicas = _start(tmp_path, "by-time", "pull")
    _lead(replicas, 0, 1, (0, 1, 2), (1, 2))
    leader = replicas[0]
    stamps = [1_000, 1_000, 1_500, 2_000, 2_000, 2_600]  # offsets 0-5 in one batch
    batch = rb.build_batch([rb.Record(None, f"v{i}".encode(), t) for i, t in enumerate(stamps)])
    late = rb.build_batch([rb.Record(None, b"late", 9_000)])  # offset 6
    for data in (batch, late):
        outcome = ray.get(leader.produce.remote(data, -1, 10_000), timeout=CALL_TIMEOUT_S)
        assert outcome.error_code == 0, outcome

    def by_time(ts: int) -> tuple[int, int]:
        code, stamp, offset, _ = ray.get(leader.list_offsets.remote(ts), timeout=CALL_TIMEOUT_S)
        assert code == 0
        return stamp, offset

    assert by_time(900) == (1_000, 0)
    assert by_time(1_200) == (1_500, 2)  # not the batch's base offset 0
    assert by_time(2_000) == (2_000, 3)
    assert by_time(2_001) == (2_600, 5)
    assert by_time(2_601) == (9_000, 6)  # the next batch
    assert by_time(9_001) == (-1, -1)  # nothing that late


def test_flush_ms_fsyncs_a_relaxed_policys_appends_while_no_more_come(
    ray_local: Path, tmp_path: Path
) -> None:
    """With flush.messages above what is produced, acks=1 completes before any fsync, and
    flush.ms still bounds how long the appends stay unflushed: the replica's timer fsyncs them
    with no further append (Kafka's log flusher), not the next append inline."""
    topic = "flush-ms"
    configs = {"flush.messages": "1000000", "flush.ms": "300"}
    replica = ReplicaActor.options(  # type: ignore[attr-defined]
        name=replica_actor_name(topic, 0, 0), namespace=NAMESPACE
    ).remote(topic, 0, 0, str(tmp_path / topic), configs, ReplicaConfig())
    ray.get(replica.become_leader.remote(BecomeLeader(1, 1, 1, (0,), (0,))), timeout=CALL_TIMEOUT_S)

    def fsyncs() -> int:
        return ray.get(replica.__ray_call__.remote(lambda self: self._log.stats.fsyncs), timeout=5)

    before = fsyncs()
    outcome = ray.get(replica.produce.remote(_batch(0), 1, 5_000), timeout=CALL_TIMEOUT_S)
    assert outcome.error_code == 0
    wait_until(lambda: fsyncs() > before, timeout_s=10, message="the flush.ms fsync")
    ray.kill(replica, no_restart=True)
