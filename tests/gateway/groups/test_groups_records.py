"""``__consumer_offsets`` record formats and the coordinator's partition hash.

Proves: OffsetCommit and GroupMetadata keys and values round-trip; the bytes are Kafka's
layouts (checked against a hand-built OffsetCommitKey v1 and the older value versions Kafka
wrote); truncated or unknown-version bytes raise RecordFormatError; Kafka's
``abs(String.hashCode) % n`` is reproduced (hash values computed by Java's rules, including
non-ASCII and Integer.MIN_VALUE); the replay of a partition's records keeps the last value of a
key and honours tombstones, reads batches in every codec as kafka-python's producer builds them,
skips control batches, and raises CorruptRecordError for records that do not decode.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.kafka_batches import kafka_batch
from support.pipelines import CODECS, kafka_codecs

from raylog.gateway.groups import records as gr
from raylog.gateway.groups.group import GroupState
from raylog.gateway.groups.replay import GroupReplay
from raylog.gateway.internal_topic import java_string_hash, partition_for
from raylog.storage import batch as rb
from raylog.storage.errors import CorruptRecordError
from raylog.storage.log import Log, LogConfig

texts = st.text(max_size=40)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


@given(texts, texts, int32)
def test_offset_commit_key_round_trip(group: str, topic: str, partition: int) -> None:
    key = gr.OffsetCommitKey(group, topic, partition)
    assert gr.decode_key(gr.encode_key(key)) == key


@given(int64, int32, texts, int64)
def test_offset_commit_value_round_trip(offset: int, epoch: int, meta: str, ts: int) -> None:
    key = gr.OffsetCommitKey("g", "t", 0)
    value = gr.OffsetCommitValue(offset, epoch, meta, ts)
    assert gr.decode_value(key, gr.encode_value(value)) == value


members = st.builds(
    gr.MemberMetadata,
    texts,
    st.none(),
    texts,
    texts,
    int32,
    int32,
    st.binary(max_size=30),
    st.binary(max_size=30),
)


@given(texts, int32, st.none() | texts, st.none() | texts, int64, st.lists(members, max_size=4))
def test_group_metadata_round_trip(
    ptype: str, gen: int, proto: str | None, leader: str | None, ts: int, ms: list
) -> None:
    key = gr.GroupMetadataKey("g")
    assert gr.decode_key(gr.encode_key(key)) == key
    value = gr.GroupMetadataValue(ptype, gen, proto, leader, ts, ms)
    assert gr.decode_value(key, gr.encode_value(value)) == value


def test_kafka_layouts() -> None:
    key = struct.pack(">hh1sh1si", 1, 1, b"g", 1, b"t", 7)
    assert gr.encode_key(gr.OffsetCommitKey("g", "t", 7)) == key
    assert gr.encode_key(gr.GroupMetadataKey("g")) == struct.pack(">hh1s", 2, 1, b"g")
    # OffsetCommitValue v1 (Kafka 0.9-2.0: with expire timestamp) and v3 (with leader epoch).
    v1 = struct.pack(">hqh2sqq", 1, 42, 2, b"md", 1000, 2000)
    assert gr.decode_value(gr.decode_key(key), v1) == gr.OffsetCommitValue(42, -1, "md", 1000)
    v3 = struct.pack(">hqihq", 3, 42, 5, 0, 1000)  # metadata "": int16 length 0
    assert gr.encode_value(gr.OffsetCommitValue(42, 5, "", 1000)) == v3


@pytest.mark.parametrize(
    "data", [b"", b"\x00", b"\x00\x05abc", struct.pack(">hh", 1, 10) + b"short"]
)
def test_bad_keys_raise(data: bytes) -> None:
    with pytest.raises(gr.RecordFormatError):
        gr.decode_key(data)


def test_bad_values_raise() -> None:
    key = gr.OffsetCommitKey("g", "t", 0)
    with pytest.raises(gr.RecordFormatError):
        gr.decode_value(key, struct.pack(">hq", 9, 1))
    with pytest.raises(gr.RecordFormatError):
        gr.decode_value(key, struct.pack(">h", 3))


@pytest.mark.parametrize(
    ("text", "java_hash"),
    [
        ("", 0),
        ("a", 97),
        ("group", 98629247),
        ("my-consumer-group", 1513705513),
        ("polygenelubricants", -(2**31)),  # Java's famous Integer.MIN_VALUE hash
        ("é€", 233 * 31 + 8364),  # UTF-16 code units, not UTF-8 bytes
    ],
)
def test_java_string_hash(text: str, java_hash: int) -> None:
    assert java_string_hash(text) == java_hash


def test_partition_for_matches_kafka() -> None:
    assert partition_for("polygenelubricants", 50) == 0  # Utils.abs(MIN_VALUE) == 0
    assert partition_for("my-consumer-group", 50) == 1513705513 % 50
    assert all(0 <= partition_for(f"g{i}", 3) < 3 for i in range(100))


def _batch(*records: tuple[gr.Key, gr.Value | None], base: int = 0) -> bytes:
    return rb.build_batch(
        [
            rb.Record(gr.encode_key(k), None if v is None else gr.encode_value(v), 0)
            for k, v in records
        ],
        base_offset=base,
    )


def test_replay_last_value_wins_and_tombstones_delete() -> None:
    off = gr.OffsetCommitKey
    meta = gr.GroupMetadataValue(
        "consumer",
        4,
        "range",
        "m1",
        0,
        [gr.MemberMetadata("m1", None, "c", "/h", 30000, 10000, b"sub", b"asg")],
    )
    data = _batch(
        (off("g", "t", 0), gr.OffsetCommitValue(5, -1, "", 0)),
        (off("g", "t", 1), gr.OffsetCommitValue(7, -1, "", 0)),
        (gr.GroupMetadataKey("g"), meta),
        (off("gone", "t", 0), gr.OffsetCommitValue(1, -1, "", 0)),
    ) + _batch(
        (off("g", "t", 0), gr.OffsetCommitValue(9, -1, "x", 0)),
        (off("g", "t", 1), None),
        (off("gone", "t", 0), None),
        (gr.GroupMetadataKey(""), None),  # the load barrier
        base=4,
    )
    replay = GroupReplay()
    assert replay.apply(data, 0) == 8
    groups = replay.groups(now_ms=123)
    assert set(groups) == {"g"}
    g = groups["g"]
    assert {tp: c.offset for tp, c in g.offsets.items()} == {("t", 0): 9}
    assert g.state is GroupState.STABLE
    assert (g.generation_id, g.leader_id, g.protocol_name) == (4, "m1", "range")
    assert g.members["m1"].assignment == b"asg"
    assert g.members["m1"].last_heartbeat_ms == 123
    # Records before the fetch offset (a batch may start before it) are not applied twice.
    again = GroupReplay()
    assert again.apply(data, 5) == 8
    assert set(again.groups(0)) == set()


def test_replay_of_a_compacted_offsets_log_rebuilds_the_same_groups(tmp_path: Path) -> None:
    """A coordinator that loads ``__consumer_offsets`` after the log cleaner ran (gaps between
    batches, batches holding fewer records than offsets, tombstones kept with a delete
    horizon) rebuilds exactly the groups and offsets it would from the whole log."""
    off = gr.OffsetCommitKey
    config = LogConfig(segment_bytes=2048, cleanup_policy="compact")
    with Log.open(tmp_path, config) as log:
        for i in range(60):
            records = [
                (off("g", "t", p), gr.OffsetCommitValue(i * 10 + p, -1, "", i)) for p in range(3)
            ]
            if i % 7 == 0:
                records.append((off("other", "t", i % 2), gr.OffsetCommitValue(i, -1, "", i)))
            if i == 40:
                records.append((off("g", "t", 2), None))  # OffsetDelete
                records.append((off("other", "t", 0), None))
            log.append(_batch(*records), 0)
        whole = log.read(0, 1 << 30)
        result = log.clean(now_ms=1_000, high_watermark=log.log_end_offset)
        assert result is not None and result.records_removed > 0
        compacted = log.read(0, 1 << 30)
        assert len(compacted) < len(whole)
    full, cleaned = GroupReplay(), GroupReplay()
    assert full.apply(whole, 0) == cleaned.apply(compacted, 0)
    expected = {g: dict(v.offsets) for g, v in full.groups(0).items()}
    assert {g: dict(v.offsets) for g, v in cleaned.groups(0).items()} == expected
    assert {tp: c.offset for tp, c in expected["g"].items()} == {
        ("t", 0): 590,
        ("t", 1): 591,
        ("t", 2): 592,
    }


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_replay_reads_every_codec_and_skips_control_batches(
    codec: str, caplog: pytest.LogCaptureFixture
) -> None:
    def offsets(*commits: tuple[int, int | None]) -> list[dict[str, object]]:
        return [
            {
                "key": gr.encode_key(gr.OffsetCommitKey("g", "t", partition)),
                "value": None
                if at is None
                else gr.encode_value(gr.OffsetCommitValue(at, -1, "", 0)),
                "timestamp": 0,
                "headers": [],
            }
            for partition, at in commits
        ]

    marker = rb.build_batch(  # a transaction marker: its record is no group record
        [rb.Record(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", 0)],
        base_offset=3,
        control=True,
        transactional=True,
        producer_id=1,
        base_sequence=0,
    )
    with kafka_codecs():
        data = (
            kafka_batch(offsets((0, 0), (1, 10), (2, 20)), CODECS[codec], 0)
            + marker
            + kafka_batch(offsets((1, None), (2, 21)), CODECS[codec], 4)
        )
    assert rb.parse_header(data).compression == CODECS[codec]
    replay = GroupReplay()
    assert replay.apply(data, 0) == 6
    assert {tp: c.offset for tp, c in replay.groups(0)["g"].offsets.items()} == {
        ("t", 0): 0,
        ("t", 2): 21,
    }
    assert "skipping" not in caplog.text


def test_replay_raises_for_records_that_do_not_decode() -> None:
    batch = bytearray(_batch((gr.OffsetCommitKey("g", "t", 0), gr.OffsetCommitValue(1, -1, "", 0))))
    batch[-1] = 0x01  # the record's header count, -1 (the CRC is the log's to check)
    with pytest.raises(CorruptRecordError):
        GroupReplay().apply(bytes(batch), 0)
