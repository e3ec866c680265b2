"""RecordBatch v2 header handling: every validation check has a failing case, stamping does
what Kafka's broker does, and build_batch interoperates with kafka-python both ways."""

from __future__ import annotations

import struct

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from raylog.storage import batch as rb
from raylog.storage.batch import Record, build_batch, parse_header, validate_client_batch
from raylog.storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RaylogError,
    RecordTooLargeError,
    UnsupportedCompressionTypeError,
)

MAX = 1048588


def _records() -> list[Record]:
    return [
        Record(b"key-0", b"v" * 300, 1_700_000_000_000, [("h1", b"x"), ("h2", None)]),
        Record(None, b"", 1_699_999_999_000),  # negative timestamp delta, empty value
        Record(b"k" * 200, None, 1_700_000_000_500),  # multi-byte varint lengths, null value
    ]


def _patch(batch: bytes, fmt: str, pos: int, value: int, *, recrc: bool = True) -> bytes:
    buf = bytearray(batch)
    struct.pack_into(fmt, buf, pos, value)
    if recrc:
        struct.pack_into(">I", buf, rb.CRC_POS, crc32c.crc32c(bytes(buf[rb.CRC_START :])))
    return bytes(buf)


def test_header_layout_is_61_bytes() -> None:
    assert rb.HEADER_SIZE == 61
    assert rb.MIN_BATCH_LENGTH == 49


def test_build_batch_decodes_with_kafka_python() -> None:
    records = _records()
    data = build_batch(records, base_offset=42, partition_leader_epoch=7)
    kb = DefaultRecordBatch(data)
    assert kb.validate_crc()
    assert kb.base_offset == 42
    assert kb.magic == 2
    decoded = list(kb)
    assert [r.offset for r in decoded] == [42, 43, 44]
    assert [r.key for r in decoded] == [r.key for r in records]
    assert [r.value for r in decoded] == [b"v" * 300, b"", None]
    assert [r.timestamp for r in decoded] == [r.timestamp_ms for r in records]
    assert decoded[0].headers == [("h1", b"x"), ("h2", None)]
    header = validate_client_batch(data, MAX)
    assert header.partition_leader_epoch == 7
    assert header.max_timestamp == 1_700_000_000_500
    assert header.records_count == 3


def test_kafka_python_built_batch_validates() -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=1000,
        producer_epoch=0,
        base_sequence=5,
        batch_size=1 << 20,
    )
    for i in range(5):
        builder.append(i, timestamp=1_000 + i, key=None, value=b"value-%d" % i, headers=[])
    data = bytes(builder.build())
    header = validate_client_batch(data, MAX)
    assert (header.records_count, header.last_offset_delta) == (5, 4)
    assert (header.producer_id, header.base_sequence) == (1000, 5)


def test_stamping_offsets_keeps_crc_valid() -> None:
    data = bytearray(build_batch(_records()))
    crc_before = parse_header(data).crc
    rb.set_base_offset(data, 0, 123_456_789_000)
    rb.set_partition_leader_epoch(data, 0, 9)
    header = parse_header(data)
    assert (header.base_offset, header.partition_leader_epoch) == (123_456_789_000, 9)
    assert header.crc == crc_before
    assert DefaultRecordBatch(bytes(data)).validate_crc()


def test_log_append_time_stamp_split_header_and_body() -> None:
    data = build_batch(_records())
    head = bytearray(data[: rb.HEADER_SIZE])
    rb.stamp_log_append_time(head, 1_800_000_000_000, memoryview(data)[rb.HEADER_SIZE :])
    stamped = bytes(head) + data[rb.HEADER_SIZE :]
    kb = DefaultRecordBatch(stamped)
    assert kb.validate_crc()
    assert kb.timestamp_type == 1
    assert kb.max_timestamp == 1_800_000_000_000
    # Whole-buffer form gives the same bytes.
    whole = bytearray(data)
    rb.stamp_log_append_time(whole, 1_800_000_000_000)
    assert bytes(whole) == stamped


def test_iter_batches_and_valid_prefix() -> None:
    batches = [build_batch([Record(None, b"%d" % i, i)], base_offset=i) for i in range(4)]
    buf = b"".join(batches)
    assert [h.base_offset for _, h in rb.iter_batches(buf)] == [0, 1, 2, 3]
    torn = buf[:-5]
    with pytest.raises(CorruptRecordError):
        list(rb.iter_batches(torn))
    good, used = rb.valid_prefix(torn, min_base_offset=0)
    assert [h.base_offset for _, h in good] == [0, 1, 2]
    assert used == sum(len(b) for b in batches[:3])
    flipped = bytearray(buf)
    flipped[len(batches[0]) + 64] ^= 0x01  # in the records: under the CRC
    good, used = rb.valid_prefix(bytes(flipped), min_base_offset=0)
    assert used == len(batches[0])
    # Offsets must never go back when asked; gaps (a compacted log) are fine.
    good, used = rb.valid_prefix(buf, min_base_offset=1)
    assert (good, used) == ([], 0)
    gapped = batches[0] + batches[2] + batches[3]
    good, used = rb.valid_prefix(gapped, min_base_offset=0)
    assert [h.base_offset for _, h in good] == [0, 2, 3]
    overlapping = batches[0] + batches[2] + batches[1]
    good, used = rb.valid_prefix(overlapping, min_base_offset=0)
    assert [h.base_offset for _, h in good] == [0, 2]


# Each check of validate_client_batch, with a batch that fails only that check.
_BASE = build_batch(_records())
_IDEMPOTENT = build_batch(_records(), producer_id=7, producer_epoch=0, base_sequence=0)

_BAD: dict[str, tuple[bytes, type[RaylogError]]] = {
    "header_truncated": (_BASE[:40], CorruptRecordError),
    "body_truncated": (_BASE[:-1], CorruptRecordError),
    "trailing_bytes": (_BASE + b"\0", CorruptRecordError),
    "length_below_header": (_patch(_BASE, ">i", 8, 10, recrc=False), CorruptRecordError),
    "magic_1": (_patch(_BASE, ">b", 16, 1, recrc=False), InvalidRecordError),
    "crc_flip_in_records": (
        _BASE[:100] + bytes([_BASE[100] ^ 0x40]) + _BASE[101:],
        CorruptRecordError,
    ),
    "crc_flip_in_header": (_patch(_BASE, ">q", 27, 5, recrc=False), CorruptRecordError),
    "codec_6": (_patch(_BASE, ">h", 21, 6), UnsupportedCompressionTypeError),
    "count_mismatch": (_patch(_BASE, ">i", 57, 2), InvalidRecordError),
    "count_zero": (_patch(_patch(_BASE, ">i", 57, 0), ">i", 23, -1), InvalidRecordError),
    "control_batch": (_patch(_BASE, ">h", 21, rb.CONTROL_FLAG), InvalidRecordError),
    "pid_without_sequence": (_patch(_IDEMPOTENT, ">i", 53, -1), InvalidRecordError),
}


@pytest.mark.parametrize("case", sorted(_BAD))
def test_validation_failures(case: str) -> None:
    data, error = _BAD[case]
    with pytest.raises(error) as info:
        validate_client_batch(data, MAX)
    assert type(info.value) is error


def test_too_large() -> None:
    with pytest.raises(RecordTooLargeError):
        validate_client_batch(_BASE, len(_BASE) - 1)
    assert validate_client_batch(_BASE, len(_BASE)).size == len(_BASE)


def test_error_codes_are_kafkas() -> None:
    codes = {
        CorruptRecordError: 2,
        RecordTooLargeError: 10,
        UnsupportedCompressionTypeError: 76,
        InvalidRecordError: 87,
    }
    for cls, code in codes.items():
        assert cls.error_code == code
