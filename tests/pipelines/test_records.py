"""The record decoder against batches built by kafka-python's producer-side builder.

Proves, for every codec Kafka clients use (none, gzip, snappy xerial-framed and raw, lz4
frame, zstd): batches decode to exactly the records put in (keys, values incl. null, headers,
timestamps, offsets, timestamp type); offset windows cut inside a batch; control batches are
skipped; ``storage.batch.build_batch`` output decodes; truncated and corrupt input raises
CorruptRecordError with a message saying where.

kafka-python compresses through optional packages (python-snappy, lz4, zstandard) that raylog
does not depend on. Where one is missing, the builder's compressor is backed by pyarrow's
bundled library for the same format (LZ4 frame, zstd frame, raw snappy block): kafka-python's
own framing (xerial for snappy) and batch layout are still the producer's.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from kafka import codec as kcodec
from kafka.record import default_records as kdr
from support.pipelines import BASE_TS, CODECS, kafka_codecs, make_records
from support.pipelines import kafka_batch as producer_batch

from raylog.pipelines import records as R
from raylog.storage import batch as rb
from raylog.storage.errors import CorruptRecordError, UnsupportedCompressionTypeError


@pytest.fixture(autouse=True)
def _codecs() -> Iterator[None]:
    with kafka_codecs():
        yield


def _records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    return make_records(n, seed)


def kafka_batch(
    recs: list[dict[str, Any]], codec: int, base_offset: int = 0, log_append: bool = False
) -> bytes:
    """One batch as kafka-python's producer builds it, then stamped as the broker does."""
    buf = bytearray(producer_batch(recs, codec, base_offset))
    if log_append:
        rb.stamp_log_append_time(buf, BASE_TS + 999_999)
    return bytes(buf)


def _expected(recs: list[dict[str, Any]], base_offset: int) -> list[dict[str, Any]]:
    return [
        {
            "key": r["key"],
            "value": r["value"],
            "offset": base_offset + i,
            "timestamp": r["timestamp"],
            "headers": [{"key": k, "value": v} for k, v in r["headers"]],
        }
        for i, r in enumerate(recs)
    ]


def _rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    table = pa.Table.from_batches([batch])
    ts = table.column("timestamp").cast(pa.int64()).to_pylist()
    rows = table.drop_columns(["timestamp"]).to_pylist()
    for row, t in zip(rows, ts, strict=True):
        row["timestamp"] = t
    return rows


@pytest.mark.parametrize("codec", list(CODECS))
def test_kafka_python_batches_decode_exactly(codec: str) -> None:
    first, second = _records(150, seed=1), _records(40, seed=2)
    buf = kafka_batch(first, CODECS[codec], 100) + kafka_batch(second, CODECS[codec], 250)
    assert rb.parse_header(buf).compression == CODECS[codec], "the builder compressed"
    batch = R.decode_batches(buf, topic="events", partition=3, include_headers=True)
    assert batch.schema == R.schema(include_headers=True)
    rows = _rows(batch)
    expected = _expected(first, 100) + _expected(second, 250)
    assert [{k: r[k] for k in expected[0]} for r in rows] == expected
    assert {r["topic"] for r in rows} == {"events"}
    assert {r["partition"] for r in rows} == {3}
    assert {r["timestampType"] for r in rows} == {R.TIMESTAMP_TYPE_CREATE_TIME}


def test_snappy_raw_block_as_librdkafka_writes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kdr, "snappy_encode", lambda d: kcodec.snappy_encode(d, False))
    recs = _records(60)
    buf = kafka_batch(recs, CODECS["snappy"], 7)
    body = buf[rb.HEADER_SIZE :]
    assert not body.startswith(b"\x82SNAPPY"), "raw, not xerial-framed"
    assert _rows(R.decode_batches(buf, topic="t", partition=0))[5]["offset"] == 12
    assert [r["value"] for r in _rows(R.decode_batches(buf, topic="t", partition=0))] == [
        r["value"] for r in recs
    ]


def test_xerial_snappy_with_several_blocks() -> None:
    # 32 KiB xerial blocks: 400 records of up to 300 bytes span several blocks.
    recs = _records(400)
    buf = kafka_batch(recs, CODECS["snappy"])
    assert buf[rb.HEADER_SIZE :].startswith(b"\x82SNAPPY\x00")
    assert [r["key"] for r in _rows(R.decode_batches(buf, topic="t", partition=0))] == [
        r["key"] for r in recs
    ]


def test_gzip_with_several_members() -> None:
    plain = bytearray(kafka_batch(_records(20), CODECS["none"]))
    body = bytes(plain[rb.HEADER_SIZE :])
    packed = gzip.compress(body[:100]) + gzip.compress(body[100:])
    buf = bytearray(plain[: rb.HEADER_SIZE] + packed)
    struct.pack_into(">i", buf, rb.BATCH_LENGTH_POS, len(buf) - rb.LOG_OVERHEAD)
    struct.pack_into(">h", buf, rb.ATTRIBUTES_POS, CODECS["gzip"])
    rows = _rows(R.decode_batches(_restamp_crc(buf), topic="t", partition=0))
    assert [r["value"] for r in rows] == [r["value"] for r in _records(20)]


def test_log_append_time_gives_every_record_the_batch_max_timestamp() -> None:
    buf = kafka_batch(_records(5), CODECS["gzip"], log_append=True)
    rows = _rows(R.decode_batches(buf, topic="t", partition=0))
    assert {r["timestamp"] for r in rows} == {BASE_TS + 999_999}
    assert {r["timestampType"] for r in rows} == {R.TIMESTAMP_TYPE_LOG_APPEND_TIME}


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_offset_window_cuts_inside_batches(codec: str) -> None:
    buf = kafka_batch(_records(10), CODECS[codec], 0) + kafka_batch(_records(10), CODECS[codec], 10)
    batch = R.decode_batches(buf, topic="t", partition=0, start_offset=4, end_offset=13)
    assert batch.column("offset").to_pylist() == list(range(4, 13))
    assert R.decode_batches(buf, topic="t", partition=0, start_offset=20).num_rows == 0


def test_storage_build_batch_and_control_batches() -> None:
    recs = [
        rb.Record(b"k1", b"v1", BASE_TS, (("a", b"1"),)),
        rb.Record(None, None, BASE_TS + 5),
    ]
    data = (
        rb.build_batch(recs, base_offset=0)
        + rb.build_batch(
            [rb.Record(None, b"\x00\x00\x00\x00", BASE_TS)],
            base_offset=2,
            control=True,
            transactional=True,
            producer_id=1,
            base_sequence=0,
        )
        + rb.build_batch(recs[:1], base_offset=3)
    )
    rows = _rows(R.decode_batches(data, topic="t", partition=1, include_headers=True))
    assert [(r["key"], r["value"], r["offset"], r["timestamp"], r["headers"]) for r in rows] == [
        (b"k1", b"v1", 0, BASE_TS, [{"key": "a", "value": b"1"}]),
        (None, None, 1, BASE_TS + 5, []),
        (b"k1", b"v1", 3, BASE_TS, [{"key": "a", "value": b"1"}]),
    ]


def test_empty_input_gives_an_empty_batch_with_the_schema() -> None:
    batch = R.decode_batches(b"", topic="t", partition=0, include_headers=True)
    assert batch.num_rows == 0 and batch.schema == R.schema(True)


@pytest.mark.parametrize("codec", list(CODECS))
def test_truncated_batch_raises(codec: str) -> None:
    buf = kafka_batch(_records(30), CODECS[codec])
    for cut in (10, rb.HEADER_SIZE + 3, len(buf) - 1):
        with pytest.raises(CorruptRecordError, match=r"byte|truncated"):
            R.decode_batches(buf[:cut], topic="t", partition=0)


def _restamp_crc(buf: bytearray) -> bytes:
    struct.pack_into(">I", buf, rb.CRC_POS, rb.compute_crc(buf, 0, len(buf)))
    return bytes(buf)


@pytest.mark.parametrize("codec", list(CODECS))
def test_corrupt_records_section_raises_even_with_a_valid_crc(codec: str) -> None:
    # A producer bug, not a disk error: the CRC matches, the records inside do not parse.
    buf = bytearray(kafka_batch(_records(30), CODECS[codec]))
    for i in range(rb.HEADER_SIZE, min(len(buf), rb.HEADER_SIZE + 24)):
        buf[i] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        R.decode_batches(_restamp_crc(buf), topic="t", partition=0)


def test_crc_mismatch_and_bad_codec_raise() -> None:
    buf = bytearray(kafka_batch(_records(3), CODECS["none"]))
    buf[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC"):
        R.decode_batches(bytes(buf), topic="t", partition=0)
    buf = bytearray(kafka_batch(_records(3), CODECS["none"]))
    struct.pack_into(">h", buf, rb.ATTRIBUTES_POS, 6)
    with pytest.raises(UnsupportedCompressionTypeError):
        R.decode_batches(_restamp_crc(buf), topic="t", partition=0)


def test_record_count_mismatch_raises() -> None:
    buf = bytearray(kafka_batch(_records(3), CODECS["none"]))
    struct.pack_into(">i", buf, 57, 2)  # recordsCount 2, lastOffsetDelta 2
    with pytest.raises(CorruptRecordError, match="recordsCount"):
        R.decode_batches(_restamp_crc(buf), topic="t", partition=0)
