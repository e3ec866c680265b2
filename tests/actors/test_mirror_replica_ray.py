"""Mirror appends on real ReplicaActors (real Ray, real WALs, RF=3), the test as the
controller and as the cluster link's fetcher (KIP-986).

Proves, with a source log built by kafka-python and raylog's batch builder (gzip, headers, a
gap, committed, aborted and open transactions with their markers):
- ``mirror_append`` takes the source's batches at their own offsets (a position query first,
  a trailing partial batch left for the next call, a refetched overlap skipped) and answers
  acks=all with the log end, the HW and the batches appended;
- every replica's log holds the same bytes below the HW, and each stored batch equals the
  source's bytes except the 4 bytes of its partition-leader-epoch, restamped with the mirror
  leader's epoch;
- read_committed on the mirror honours the mirrored markers (LSO, aborted transactions);
- clients' produce, transaction markers and DeleteRecords are refused while the link is
  active, with the message naming the topic and the link; ``state()`` shows the link;
- after a leader change the new leader's log end is the next source offset, the old leader
  is refused, and the log goes on without gap or duplicate; a corrupt batch answers
  CORRUPT_MESSAGE with the batches before it appended;
- a gateway's mirror appends reach the leader over its channel (``ReplicaCalls``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import ray
from kafka.record.default_records import DefaultRecordBatch
from support.kafka_batches import kafka_batch
from support.waiting import wait_until

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.storage import batch as rb

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 30.0
TIMEOUT_MS = 10_000
TOPIC = "mirrored"
LINK = "east"
RECS = [
    {"key": b"k%d" % i, "value": b"value %d" % i, "timestamp": 1_000 + i, "headers": [("h", b"x")]}
    for i in range(5)
]
COMMITTED, ABORTED, OPEN = 9, 10, 11  # producer ids


def _txn(base_offset: int, pid: int, count: int) -> bytes:
    recs = RECS[:count]
    return kafka_batch(
        recs,
        DefaultRecordBatch.CODEC_NONE,
        base_offset,
        transactional=True,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=0,
    )


def _marker(base_offset: int, pid: int, commit: bool) -> bytes:
    record = rb.end_txn_marker_record(commit, 4, 2_000)
    return rb.build_batch(
        [record],
        base_offset=base_offset,
        producer_id=pid,
        producer_epoch=0,
        transactional=True,
        control=True,
    )


def source_log() -> dict[int, bytes]:
    """The source partition's batches by base offset, stamped with the source's epochs."""
    batches = [
        kafka_batch(RECS, DefaultRecordBatch.CODEC_GZIP, 0),
        kafka_batch(RECS, DefaultRecordBatch.CODEC_NONE, 5),
        _txn(12, COMMITTED, 5),  # after a gap: the source was compacted
        _marker(17, COMMITTED, True),
        _txn(18, ABORTED, 2),
        _marker(20, ABORTED, False),
        _txn(21, OPEN, 2),
        _marker(23, OPEN, True),
    ]
    source = {}
    for data in batches:
        stamped = bytearray(data)
        rb.set_partition_leader_epoch(stamped, 0, 77)
        source[rb.parse_header(stamped).base_offset] = bytes(stamped)
    return source


def _get(ref: Any) -> Any:
    return ray.get(ref, timeout=CALL_TIMEOUT_S)


def _lead(replicas: dict[int, Any], leader: int, epoch: int) -> None:
    """The controller's commands: ``leader`` leads ``epoch`` of the mirror, the rest follow."""
    command = BecomeLeader(1, epoch, epoch, (0, 1, 2), (0, 1, 2), mirror_link=LINK)
    _get(
        [
            replica.become_leader.remote(command)
            if rid == leader
            else replica.become_follower.remote(BecomeFollower(1, leader, epoch, epoch))
            for rid, replica in replicas.items()
        ]
    )


def _stored(replica: Any) -> dict[int, bytes]:
    """A replica's batches below its HW, by base offset (a consumer's fetch: KIP-392)."""
    out: dict[int, bytes] = {}
    offset = 0
    for _ in range(100):  # bounded: a few batches per fetch
        answer = _get(replica.fetch.remote(offset, 1 << 20))
        assert answer.error_code == 0, answer
        if not answer.records:
            return out
        data = bytes(answer.records)
        for pos, header in rb.iter_batches(data):
            out[header.base_offset] = data[pos : pos + header.size]
            offset = header.next_offset
    raise AssertionError("too many fetches")


def _logs_at(replicas: dict[int, Any], high_watermark: int) -> list[dict[int, bytes]]:
    """Every replica's batches once its HW is ``high_watermark``; checked identical."""
    for rid, replica in replicas.items():
        wait_until(
            lambda replica=replica: _get(replica.state.remote()).high_watermark == high_watermark,
            timeout_s=CALL_TIMEOUT_S,
            message=f"replica {rid} at HW {high_watermark}",
        )
    logs = [_stored(replica) for replica in replicas.values()]
    assert logs[0] == logs[1] == logs[2]
    return logs


def _same_but_epoch(stored: dict[int, bytes], source: dict[int, bytes]) -> dict[int, int]:
    """Check the stored batches equal the source's but for the epoch; their epochs."""
    assert sorted(stored) == sorted(source)
    for offset, data in stored.items():
        assert data[:12] + data[16:] == source[offset][:12] + source[offset][16:], offset
    return {offset: rb.parse_header(data).partition_leader_epoch for offset, data in stored.items()}


def test_a_mirror_leader_appends_the_source_and_its_followers_replicate(
    ray_local: Path, tmp_path: Path
) -> None:
    config = ReplicaConfig(fetch_max_wait_ms=100)
    replicas = {
        rid: ReplicaActor.options(  # type: ignore[attr-defined]
            name=replica_actor_name(TOPIC, 0, rid), namespace=NAMESPACE
        ).remote(TOPIC, 0, rid, str(tmp_path / f"r{rid}"), {}, config)
        for rid in (0, 1, 2)
    }
    _lead(replicas, 0, 1)
    leader = replicas[0]
    source = source_log()
    offsets = sorted(source)

    def mirror(replica: Any, epoch: int, data: bytes) -> Any:
        return _get(replica.mirror_append.remote(epoch, data, -1, TIMEOUT_MS))

    assert mirror(leader, 1, b"").log_end_offset == 0  # where to start fetching
    first = b"".join(source[o] for o in offsets[:3]) + source[17][:20]  # cut by max bytes
    outcome = mirror(leader, 1, first)
    assert (outcome.error_code, outcome.appended) == (0, 3)
    assert (outcome.log_end_offset, outcome.high_watermark) == (17, 17)
    # The fetcher's next fetch from 12 (say) overlaps what is there.
    outcome = mirror(leader, 1, b"".join(source[o] for o in offsets[2:7]))
    assert (outcome.error_code, outcome.appended, outcome.log_end_offset) == (0, 4, 23)
    assert outcome.high_watermark == 23 and outcome.log_start_offset == 0

    # Read-only for clients while the link is active.
    read_only = (
        f"topic {TOPIC} is a mirror of link {LINK}: it is read-only while the link is active"
    )
    produced = _get(leader.produce.remote(kafka_batch(RECS, 0), -1, TIMEOUT_MS))
    marker = _get(leader.write_txn_marker.remote(OPEN, 0, 4, True, TIMEOUT_MS))
    deleted = _get(leader.delete_records.remote(5, TIMEOUT_MS))
    assert (produced.error_code, produced.message) == (42, read_only)
    assert (marker.error_code, marker.message) == (42, read_only)
    assert (deleted.error_code, deleted.message) == (42, read_only)
    state = _get(leader.state.remote())
    assert (state.mirror_link, state.last_stable_offset, state.open_transactions) == (LINK, 21, 1)

    # Every replica holds the source's bytes, restamped with the mirror leader's epoch.
    logs = _logs_at(replicas, 23)
    below = {o: data for o, data in source.items() if o < 23}
    assert set(_same_but_epoch(logs[0], below).values()) == {1}

    # read_committed honours the mirrored markers.
    committed = _get(leader.fetch.remote(0, 1 << 20, 0, 1, -1, 1))
    assert committed.last_stable_offset == 21
    assert committed.aborted_transactions == ((ABORTED, 18),)

    # A leader change: replica 1 leads epoch 2; its log end is the next source offset.
    _lead(replicas, 1, 2)
    new_leader = replicas[1]
    assert mirror(leader, 1, source[23]).error_code == 6  # NOT_LEADER_OR_FOLLOWER
    assert mirror(new_leader, 1, source[23]).error_code == 74  # FENCED_LEADER_EPOCH
    position = mirror(new_leader, 2, b"")
    assert position.error_code == 0 and position.log_end_offset == 23
    corrupt = bytearray(kafka_batch(RECS, 0, 24))
    corrupt[-1] ^= 0xFF
    outcome = mirror(new_leader, 2, source[21] + source[23] + bytes(corrupt))
    assert (outcome.error_code, outcome.appended, outcome.log_end_offset) == (2, 1, 24)
    assert "batch with base offset 24" in outcome.message and "CRC" in outcome.message
    logs = _logs_at(replicas, 24)
    epochs = _same_but_epoch(logs[1], source)  # no gap, no duplicate
    assert epochs == {**{o: 1 for o in offsets[:-1]}, 23: 2}
    assert _get(new_leader.state.remote()).last_stable_offset == 24


def test_a_gateways_mirror_appends_go_over_the_replica_channel(
    ray_local: Path, tmp_path: Path
) -> None:
    """The cluster link's fetcher calls the leader as the gateway's Produce does: over the
    replica's channel once it is connected."""
    from raylog.gateway.replica_calls import ReplicaCalls

    name = replica_actor_name("mirror-channel", 0, 0)
    leader = ReplicaActor.options(  # type: ignore[attr-defined]
        name=name, namespace=NAMESPACE
    ).remote("mirror-channel", 0, 0, str(tmp_path / "r0"), {}, ReplicaConfig())
    _get(leader.become_leader.remote(BecomeLeader(1, 1, 1, (0,), (0,), mirror_link=LINK)))
    source = [kafka_batch(RECS[:1], 0, offset) for offset in range(50)]

    async def appends() -> list[tuple[int, int, int]]:
        calls = ReplicaCalls()
        try:
            before = _get(leader.channel_stats.remote())["calls_in"]
            answers = []
            for data in source:  # bounded: the first calls go by Ray while the link connects
                outcome = await calls.call(
                    name, "mirror_append", (1, data, -1, TIMEOUT_MS, -1),
                    timeout_s=CALL_TIMEOUT_S, retry=False,
                )  # fmt: skip
                answers.append((outcome.error_code, outcome.appended, outcome.log_end_offset))
                if _get(leader.channel_stats.remote())["calls_in"] > before:
                    break
            assert _get(leader.channel_stats.remote())["calls_in"] > before, "never by channel"
            return answers
        finally:
            await calls.aclose()

    answers = asyncio.run(appends())
    assert answers == [(0, 1, offset + 1) for offset in range(len(answers))]
