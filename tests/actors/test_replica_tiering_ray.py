"""Tiered storage on real ReplicaActors (real Ray, real WALs), the test as controller, with the
object store a local directory and S3 (moto's server):

- the leader copies each closed segment below the last stable offset; every replica, leader
  and follower, deletes local segments once they are copied and past local.retention.bytes,
  so its log start offset moves up while every offset stays readable, byte for byte, from
  one tier or the other (the remote segments read back with RemoteReader, the rest fetched);
- a leader change in the middle: the new leader continues from the last offset copied in
  its lineage (the remote segments tile from offset 0: no gap, nothing listed twice);
- remote retention (retention.bytes over both tiers) deletes the oldest remote segments;
- DeleteRecords moves the partition's log start into the remote tier (nothing below it is
  served, the segments wholly below it go) or, at or above the local log start, in both;
- the store cut off (a TCP proxy in front of moto that resets every connection) stops
  copying and local deletion with a clear error; restored, copying goes on.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from support.tcp_proxy import TcpProxy
from support.waiting import wait_until

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replica_tiering import RemoteStoreLocation
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.storage import batch as rb
from raylog.storage.errors import KafkaStorageError, OffsetOutOfRangeError
from raylog.storage.localstore import LocalObjectStore
from raylog.storage.objectstore import ObjectStore
from raylog.storage.remote import RemotePartition, RemoteReader, metadata_store
from raylog.storage.remote.cache import ByteLRU
from raylog.storage.remote.metadata import check_tiling
from raylog.storage.s3store import S3ObjectStore

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 30.0
WAIT_S = 120.0
VALUE_BYTES = 900  # with the header each batch is ~1 KiB: segment.bytes 4096 holds ~4
TIERED = {
    "segment.bytes": "4096",
    "remote.storage.enable": "true",
    "local.retention.bytes": "8192",
}
INTERVAL_MS = 200  # remote.log.manager.task.interval.ms of these replicas


class Tier:
    """Where a test's replicas tier to, and the same store opened in the test."""

    def __init__(self, location: RemoteStoreLocation, store: ObjectStore, env: Any) -> None:
        self.location, self.store, self.env = location, store, env


def _s3_env(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        "env_vars": {
            "AWS_ACCESS_KEY_ID": kwargs["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": kwargs["aws_secret_access_key"],
            "AWS_DEFAULT_REGION": kwargs["region_name"],
        }
    }


@pytest.fixture(params=["local", "s3"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tier]:
    if request.param == "local":
        path = tmp_path / "store"
        yield Tier(RemoteStoreLocation(str(path)), LocalObjectStore(path), None)
        return
    kwargs: dict[str, Any] = request.getfixturevalue("s3_client_kwargs")
    bucket = request.getfixturevalue("create_bucket")()
    store = S3ObjectStore(bucket, prefix="cluster", **kwargs)
    location = RemoteStoreLocation(f"s3://{bucket}/cluster", kwargs["endpoint_url"])
    yield Tier(location, store, _s3_env(kwargs))
    store.close()


def _get(ref: Any) -> Any:
    return ray.get(ref, timeout=CALL_TIMEOUT_S)


def _value(i: int) -> bytes:
    return f"record-{i:06d}-".encode() + bytes(VALUE_BYTES)


T0_MS = time.time_ns() // 1_000_000  # record i is stamped T0_MS + i


def _produce(leader: Any, start: int, count: int) -> None:
    for i in range(start, start + count):
        record = rb.Record(key=b"%d" % i, value=_value(i), timestamp_ms=T0_MS + i)
        batch = rb.build_batch([record])
        outcome = _get(leader.produce.remote(batch, -1, 10_000))
        assert outcome.error_code == 0, outcome
        assert outcome.base_offset == i


def _start(
    tmp_path: Path, topic_id: str, tier: Tier, count: int, configs: dict[str, str] | None = None
) -> list[Any]:
    config = ReplicaConfig(min_insync_replicas=1, fetch_max_wait_ms=100)
    return [
        ReplicaActor.options(  # type: ignore[attr-defined]
            name=replica_actor_name(topic_id, 0, rid), namespace=NAMESPACE, runtime_env=tier.env
        ).remote(
            topic_id,
            0,
            rid,
            str(tmp_path / f"replica-{rid}"),
            configs or TIERED,
            config,
            topic_id=topic_id,
            remote_store=tier.location,
            remote_log_manager_interval_ms=INTERVAL_MS,
        )
        for rid in range(count)
    ]


def _lead(replicas: list[Any], leader: int, epoch: int) -> None:
    everyone = tuple(range(len(replicas)))
    calls = [
        replicas[leader].become_leader.remote(BecomeLeader(1, epoch, epoch, everyone, everyone))
    ]
    calls += [
        r.become_follower.remote(BecomeFollower(1, leader, epoch, epoch))
        for rid, r in enumerate(replicas)
        if rid != leader
    ]
    _get(calls)


def _stats(replica: Any) -> dict[str, Any]:
    return dict(_get(replica.tiering_stats.remote()))


def _log_start(replica: Any) -> int:
    return int(_get(replica.state.remote()).log_start_offset)


def _every_value(store: ObjectStore, partition: RemotePartition, replica: Any, upto: int) -> list:
    """(offset, value) of every record below ``upto``: the remote segments first (read back
    with RemoteReader, every batch CRC-checked), then the replica's local log from where the
    remote log ends. Asserts that the tiers meet with no gap: the local log start read
    before the metadata is at most where the remote log ends (a read that a deletion
    overtook meanwhile is made again)."""
    return wait_until(lambda: _read_tiers(store, partition, replica, upto), timeout_s=WAIT_S)


def _read_tiers(
    store: ObjectStore, partition: RemotePartition, replica: Any, upto: int
) -> list[tuple[int, bytes]] | None:
    from kafka.record.default_records import DefaultRecordBatch

    local_start = _log_start(replica)
    meta, _ = metadata_store.read(store, partition)
    finished = meta.finished()
    reader = RemoteReader(store, ByteLRU())
    batches: list[bytes] = []
    for segment in finished:
        offset = segment.base_offset
        while offset <= segment.end_offset:
            got = reader.read(partition, segment, offset, 1 << 20)
            assert got, f"nothing at {offset} in remote segment {segment.segment_id}"
            batches += got
            offset = rb.parse_header(got[-1]).next_offset
    offset = finished[-1].next_offset if finished else 0
    assert local_start <= offset, "offsets between the tiers are in neither"
    while offset < upto:
        fetched = _get(replica.fetch.remote(offset, 1 << 20))
        if fetched.error_code == OffsetOutOfRangeError.error_code:
            return None  # copied and deleted locally since the metadata was read
        assert fetched.error_code == 0, fetched
        for pos, header in rb.iter_batches(fetched.records):
            batches.append(fetched.records[pos : pos + header.size])
            offset = header.next_offset
    return [(r.offset, bytes(r.value)) for data in batches for r in DefaultRecordBatch(data)]


def _fetch_all(replica: Any, upto: int, isolation_level: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of every record below ``upto`` as a consumer fetches them from 0:
    below the local log start the replica serves them from the object store."""
    from kafka.record.default_records import DefaultRecordBatch

    out: list[tuple[int, bytes]] = []
    offset = 0
    while offset < upto:
        fetched = _get(replica.fetch.remote(offset, 4096, 0, 1, -1, isolation_level))
        assert fetched.error_code == 0, fetched
        assert fetched.records, f"nothing at {offset}"
        assert fetched.log_start_offset == 0  # the partition's: the remote one
        for pos, header in rb.iter_batches(fetched.records):
            data = fetched.records[pos : pos + header.size]
            out += [(r.offset, bytes(r.value)) for r in DefaultRecordBatch(data)]
            offset = header.next_offset
    return out


def _list_offsets(replica: Any, timestamp: int) -> tuple[int, int]:
    code, stamp, offset, _ = _get(replica.list_offsets.remote(timestamp))
    assert code == 0
    return stamp, offset


def _local_logs(directory: Path) -> int:
    return len(list(directory.glob("*.log")))


def test_copies_local_deletion_and_a_leader_change(
    ray_local: Path, tmp_path: Path, tier: Tier
) -> None:
    topic_id = f"tiered-{uuid.uuid4().hex[:8]}"
    partition = RemotePartition(topic_id, 0)
    replicas = _start(tmp_path, topic_id, tier, 2)
    try:
        _lead(replicas, 0, 1)
        _produce(replicas[0], 0, 60)
        # ~15 segments of ~4 batches; all but ~8 KiB of them copied and deleted locally, on
        # the leader by its own round and on the follower by its own (it reads the metadata).
        for r in replicas:
            wait_until(lambda r=r: _log_start(r) >= 30, timeout_s=WAIT_S, message="local deletion")
        assert _stats(replicas[0])["segments_copied"] >= 7
        assert _stats(replicas[1])["segments_copied"] == 0, "a follower never copies"
        assert _every_value(tier.store, partition, replicas[0], 60) == [
            (i, _value(i)) for i in range(60)
        ]

        # A leader change: replica 1 continues from the last offset copied in its lineage.
        _lead(replicas, 1, 2)
        _produce(replicas[1], 60, 60)
        wait_until(
            lambda: _stats(replicas[1])["remote_next_offset"] >= 100,
            timeout_s=WAIT_S,
            message="the new leader copies",
        )
        wait_until(lambda: _log_start(replicas[0]) >= 90, timeout_s=WAIT_S, message="deletion")
        meta, _ = metadata_store.read(tier.store, partition)
        finished = meta.finished()
        assert finished[0].base_offset == 0
        check_tiling(meta)  # consecutive offsets: no gap, no overlap
        assert {e for s in finished for e, _ in s.leader_epochs} == {1, 2}
        for r in replicas:
            assert _every_value(tier.store, partition, r, 120) == [
                (i, _value(i)) for i in range(120)
            ]
        # Consumers read everything from offset 0, below the local log start from the store,
        # from both replicas (a follower serves consumers too, KIP-392), either isolation.
        expected = [(i, _value(i)) for i in range(120)]
        for r in replicas:
            assert _fetch_all(r, 120) == expected
        assert _fetch_all(replicas[1], 120, isolation_level=1) == expected
        local_start = _log_start(replicas[1])
        assert local_start > 0
        assert _list_offsets(replicas[1], -2) == (-1, 0)  # earliest: the remote log start
        assert _list_offsets(replicas[1], -4)[1] >= local_start  # earliest-local (KIP-1005)
        # latest-tiered (KIP-1005): the remote log's last offset, as the metadata says now
        stamp, tiered = _list_offsets(replicas[1], -5)
        assert (stamp, tiered) == (-1, _stats(replicas[1])["remote_next_offset"] - 1)
        assert local_start <= tiered + 1 <= 120
        assert _list_offsets(replicas[1], T0_MS + 3) == (T0_MS + 3, 3)  # remote, by time
        assert _list_offsets(replicas[1], T0_MS + 119) == (T0_MS + 119, 119)  # local
        assert _local_logs(tmp_path / "replica-0") <= 5
        assert _local_logs(tmp_path / "replica-1") <= 5
    finally:
        for r in replicas:
            ray.kill(r, no_restart=True)


def test_remote_retention_deletes_the_oldest_remote_segments(
    ray_local: Path, tmp_path: Path
) -> None:
    path = tmp_path / "store"
    tier = Tier(RemoteStoreLocation(str(path)), LocalObjectStore(path), None)
    topic_id = f"retained-{uuid.uuid4().hex[:8]}"
    partition = RemotePartition(topic_id, 0)
    configs = {**TIERED, "local.retention.bytes": "4096", "retention.bytes": "16384"}
    (replica,) = _start(tmp_path, topic_id, tier, 1, configs)
    try:
        _lead([replica], 0, 1)
        _produce(replica, 0, 80)
        wait_until(
            lambda: _stats(replica)["remote_segments_deleted"] >= 5,
            timeout_s=WAIT_S,
            message="remote retention",
        )

        def bounded() -> bool:
            meta, _ = metadata_store.read(tier.store, partition)
            remote = sum(s.size_bytes for s in meta.finished())
            return remote + int(_get(replica.state.remote()).log_size_bytes) < 16384 + 2 * 4096

        wait_until(bounded, timeout_s=WAIT_S, message="both tiers within retention.bytes")
        meta, _ = metadata_store.read(tier.store, partition)
        start = meta.finished()[0].base_offset
        assert start > 0
        assert _stats(replica)["remote_log_start_offset"] >= start
        values = _every_value(tier.store, partition, replica, 80)
        assert values == [(i, _value(i)) for i in range(start, 80)]
    finally:
        ray.kill(replica, no_restart=True)


def test_delete_records_moves_the_log_start_across_both_tiers(
    ray_local: Path, tmp_path: Path
) -> None:
    """DeleteRecords below the local log start moves the partition's log start into the remote
    tier (the local one stays): nothing below it is fetched or listed, the remote segments
    wholly below it are deleted; at or above the local log start it moves both, and the remote
    tier is emptied."""
    path = tmp_path / "store"
    tier = Tier(RemoteStoreLocation(str(path)), LocalObjectStore(path), None)
    topic_id = f"deleted-{uuid.uuid4().hex[:8]}"
    partition = RemotePartition(topic_id, 0)
    (replica,) = _start(tmp_path, topic_id, tier, 1, {**TIERED, "retention.ms": "-1"})
    try:
        _lead([replica], 0, 1)
        _produce(replica, 0, 60)
        wait_until(lambda: _log_start(replica) >= 30, timeout_s=WAIT_S, message="local deletion")
        local_start = _log_start(replica)
        meta, _ = metadata_store.read(tier.store, partition)
        assert meta.finished()[0].base_offset == 0
        below = [s for s in meta.finished() if s.end_offset < 13]
        assert below and local_start > 13  # 13 lies in the remote tier only
        outcome = _get(replica.delete_records.remote(13, 10_000))
        assert (outcome.error_code, outcome.low_watermark) == (0, 13)
        assert _log_start(replica) >= local_start  # the local tier is not touched
        assert _list_offsets(replica, -2) == (-1, 13)
        assert _list_offsets(replica, T0_MS + 3) == (T0_MS + 13, 13)  # by time: from 13 on
        assert _get(replica.fetch.remote(12, 4096)).error_code == OffsetOutOfRangeError.error_code
        fetched = _get(replica.fetch.remote(13, 4096))
        assert fetched.error_code == 0 and fetched.log_start_offset == 13
        assert rb.parse_header(fetched.records).base_offset == 13
        meta, _ = metadata_store.read(tier.store, partition)
        assert meta.log_start_offset == 13
        assert all(s.end_offset >= 13 for s in meta.segments)  # those below: deleted
        for s in below:
            assert tier.store.list(partition.segment_prefix(s.base_offset, s.segment_id)) == []

        # Above the local log start (local retention keeps about 8 of the 60 records): both
        # tiers move.
        assert _log_start(replica) < 58
        outcome = _get(replica.delete_records.remote(58, 10_000))
        assert (outcome.error_code, outcome.low_watermark) == (0, 58)
        assert _log_start(replica) >= 58
        assert _list_offsets(replica, -2) == (-1, 58)
        meta, _ = metadata_store.read(tier.store, partition)
        assert meta.log_start_offset == 58

        def below_gone() -> bool:  # a copy in flight may finish below it: retention takes it
            meta, _ = metadata_store.read(tier.store, partition)
            return all(s.end_offset >= 58 for s in meta.finished())

        wait_until(below_gone, timeout_s=WAIT_S, message="remote segments below 58 deleted")
    finally:
        ray.kill(replica, no_restart=True)


def test_a_cut_off_store_stops_copying_and_local_deletion(
    ray_local: Path, tmp_path: Path, s3_client_kwargs: dict[str, Any], create_bucket: Callable
) -> None:
    moto_port = int(s3_client_kwargs["endpoint_url"].rsplit(":", 1)[1])
    proxy = TcpProxy(moto_port)
    proxy.start()
    bucket = create_bucket()
    store = S3ObjectStore(bucket, prefix="cluster", **s3_client_kwargs)
    location = RemoteStoreLocation(f"s3://{bucket}/cluster", f"http://127.0.0.1:{proxy.port}")
    tier = Tier(location, store, _s3_env(s3_client_kwargs))
    topic_id = f"cut-{uuid.uuid4().hex[:8]}"
    (replica,) = _start(tmp_path, topic_id, tier, 1)
    try:
        _lead([replica], 0, 1)
        _produce(replica, 0, 30)
        wait_until(lambda: _log_start(replica) > 0, timeout_s=WAIT_S, message="first copies")
        proxy.cut()
        copied = _stats(replica)["segments_copied"]
        start = _log_start(replica)
        _produce(replica, 30, 40)
        wait_until(
            lambda: (
                "ObjectStoreError" in _stats(replica)["last_error"]
                or "unreachable" in _stats(replica)["last_error"].lower()
            ),
            timeout_s=WAIT_S,
            message="a clear error",
        )
        rounds = _stats(replica)["rounds"]
        wait_until(lambda: _stats(replica)["rounds"] >= rounds + 2, timeout_s=WAIT_S)
        assert _stats(replica)["segments_copied"] <= copied + 1  # one in flight at the cut
        assert _log_start(replica) == start, "nothing deleted locally while the store is away"
        assert _local_logs(tmp_path / "replica-0") >= 10
        # A read below the local log start fails with KAFKA_STORAGE_ERROR, saying why.
        below = _get(replica.fetch.remote(0, 4096))
        assert below.error_code == KafkaStorageError.error_code
        assert below.message.startswith("remote read:"), below.message

        proxy.restore()
        wait_until(lambda: _log_start(replica) >= 50, timeout_s=WAIT_S, message="resumed")
        assert _stats(replica)["last_error"] == ""
        values = _every_value(store, RemotePartition(topic_id, 0), replica, 70)
        assert values == [(i, _value(i)) for i in range(70)]
    finally:
        ray.kill(replica, no_restart=True)
        proxy.stop()
        store.close()


TXN_PRODUCER = 77


def _txn_batch(seq: int, offset: int) -> bytes:
    record = rb.Record(key=b"txn", value=_value(offset), timestamp_ms=T0_MS + offset)
    return rb.build_batch(
        [record], producer_id=TXN_PRODUCER, producer_epoch=0, base_sequence=seq, transactional=True
    )


def test_a_new_follower_takes_the_producer_state_at_its_leaders_log_start(
    ray_local: Path, tmp_path: Path, tier: Tier
) -> None:
    """A transaction open across the leader's local log start (its first batch below it, in
    the remote tier only, its marker above it): a new follower, which starts over there,
    takes the producer state from the remote tier, so the ABORT marker it replicates spans
    the whole transaction, as on the leader; once it leads, read_committed consumers are
    told the transaction's first offset, as Kafka tells them (without that state the
    follower knows the transaction only from its first batch at or above its log start,
    40 here). Every copy uploads its producer snapshot at its segment's end."""
    topic_id = f"tiered-{uuid.uuid4().hex[:8]}"
    [leader] = _start(tmp_path, topic_id, tier, 1)
    follower = None
    try:
        _get(leader.become_leader.remote(BecomeLeader(1, 1, 1, (0,), (0,))))
        assert _get(leader.produce.remote(_txn_batch(0, 0), -1, 10_000)).base_offset == 0
        _produce(leader, 1, 39)
        assert _get(leader.produce.remote(_txn_batch(1, 40), -1, 10_000)).base_offset == 40
        marker = _get(leader.write_txn_marker.remote(TXN_PRODUCER, 0, 0, False, 10_000))
        assert (marker.error_code, marker.base_offset) == (0, 41)
        # Copied and deleted locally but for the last ~8 KiB: the log start lands between
        # the transaction's two batches.
        start = wait_until(
            lambda: (s := _log_start(leader)) >= 20 and s,
            timeout_s=WAIT_S,
            message="local deletion on the leader",
        )
        assert 0 < start <= 40
        meta, _ = metadata_store.read(tier.store, RemotePartition(topic_id, 0))
        reader = RemoteReader(tier.store, ByteLRU())
        for segment in meta.finished():  # each copy's snapshot is at its segment's end
            snapshot = reader.producer_snapshot(RemotePartition(topic_id, 0), segment)
            assert snapshot is not None and snapshot[0] == segment.next_offset

        [follower] = [
            ReplicaActor.options(  # type: ignore[attr-defined]
                name=replica_actor_name(topic_id, 0, 1), namespace=NAMESPACE, runtime_env=tier.env
            ).remote(
                topic_id,
                0,
                1,
                str(tmp_path / "replica-1"),
                TIERED,
                ReplicaConfig(min_insync_replicas=1, fetch_max_wait_ms=100, remote_storage=True),
                topic_id=topic_id,
                remote_store=tier.location,
                remote_log_manager_interval_ms=INTERVAL_MS,
            )
        ]
        # Reassigned: the leader's new epoch (the controller's) knows the new replica.
        _get(leader.become_leader.remote(BecomeLeader(1, 2, 2, (0,), (0, 1))))
        _get(follower.become_follower.remote(BecomeFollower(1, 0, 2, 2)))
        wait_until(
            lambda: _get(follower.state.remote()).log_end_offset == 42,
            timeout_s=WAIT_S,
            message="the new follower caught up",
        )
        state = _get(follower.state.remote())
        assert state.log_start_offset == _log_start(leader) or state.log_start_offset >= start
        assert _stats(follower)["remote_states_taken"] == 1

        ray.kill(leader, no_restart=True)
        _get(follower.become_leader.remote(BecomeLeader(1, 3, 3, (1,), (0, 1))))
        local = _get(follower.state.remote()).log_start_offset
        answer = _get(follower.fetch.remote(local, 1 << 20, 0, 1, -1, 1))
        assert answer.error_code == 0 and answer.last_stable_offset == 42
        assert answer.aborted_transactions == ((TXN_PRODUCER, 0),)
    finally:
        for r in (leader, follower):
            if r is not None:
                ray.kill(r, no_restart=True)
