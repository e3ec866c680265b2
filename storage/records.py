"""Records inside a stored batch, for the broker's own needs: the log cleaner and the produce
check of compacted topics (every record needs a key).

The broker's produce, replication and fetch paths never look inside a batch; this module is
used only where Kafka's broker decodes records too (compacted topics). Readers that want rows
use :mod:`raylog.pipelines.records`. Pure: no I/O.

A record (Kafka's DefaultRecord, see :mod:`raylog.storage.batch` for the batch header)::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint (-1 = null) | key | valueLength varint (-1 = null) | value |
    headerCount varint | headers...

:func:`iter_records` yields each record's offset and timestamp deltas, its key, whether its
value is null (a tombstone) and the byte span of everything after the offset delta, so a
record can be re-encoded with a new timestamp delta (:func:`encode_record`) without decoding
its value or headers. Every length is checked against the records section: a corrupt record
raises CorruptRecordError, never reads out of bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from raylog.storage import batch as rb
from raylog.storage.compression import CODEC_NONE, decompress
from raylog.storage.errors import CorruptRecordError

Buffer = bytes | bytearray | memoryview

_VARINT_MAX_BYTES = 10


class StoredRecord(NamedTuple):
    """One record of a records section (offsets into that section)."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value_is_null: bool
    start: int  # the record's first byte (its length varint)
    end: int  # one past its last byte
    tail_start: int  # first byte after offsetDelta: key, value and headers, kept verbatim


def read_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """A zigzag LEB128 varint at ``pos`` (below ``end``); returns (value, next position)."""
    n = 0
    shift = 0
    for i in range(_VARINT_MAX_BYTES):
        if pos + i >= end:
            raise CorruptRecordError(f"varint runs past the record at byte {pos}")
        b = buf[pos + i]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), pos + i + 1
        shift += 7
    raise CorruptRecordError(f"varint longer than {_VARINT_MAX_BYTES} bytes at byte {pos}")


def write_varint(value: int, out: bytearray) -> None:
    """Append ``value`` as a zigzag LEB128 varint."""
    n = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def records_section(batch: Buffer, header: rb.BatchHeader) -> bytes | memoryview:
    """The records of one whole batch (``batch`` starts at its header), uncompressed."""
    body = memoryview(batch).cast("B")[rb.HEADER_SIZE : header.size]
    if header.compression == CODEC_NONE:
        return body
    return decompress(header.compression, body)


def iter_records(section: Buffer, count: int) -> Iterator[StoredRecord]:
    """The ``count`` records of an uncompressed records section, which they must fill exactly.

    The hot loop of the log cleaner: each varint takes a one-byte fast path inline (nearly
    every length and delta fits in one byte) and calls :func:`read_varint` otherwise.
    """
    data = bytes(section)  # indexing bytes is faster than a memoryview
    end = len(data)
    pos = 0
    for _ in range(count):  # bounded by the header's count
        b = data[pos] if pos < end else 0x80
        if b < 0x80:
            length, body = (b >> 1) ^ -(b & 1), pos + 1
        else:
            length, body = read_varint(data, pos, end)
        record_end = body + length
        if length < 6 or record_end > end:  # attributes + 5 one-byte varints at least
            raise CorruptRecordError(f"record of {length} bytes at byte {pos} of {end}")
        at = body + 1  # attributes: unused
        b = data[at]
        if b < 0x80:
            ts_delta, at = (b >> 1) ^ -(b & 1), at + 1
        else:
            ts_delta, at = read_varint(data, at, record_end)
        b = data[at] if at < record_end else 0x80
        if b < 0x80:
            offset_delta, tail = (b >> 1) ^ -(b & 1), at + 1
        else:
            offset_delta, tail = read_varint(data, at, record_end)
        b = data[tail] if tail < record_end else 0x80
        if b < 0x80:
            key_len, at = (b >> 1) ^ -(b & 1), tail + 1
        else:
            key_len, at = read_varint(data, tail, record_end)
        key: bytes | None = None
        if key_len >= 0:
            if at + key_len > record_end:
                raise CorruptRecordError(f"key of {key_len} bytes overruns the record at {pos}")
            key = data[at : at + key_len]
            at += key_len
        elif key_len != -1:
            raise CorruptRecordError(f"key length {key_len} at byte {pos}")
        b = data[at] if at < record_end else 0x80
        if b < 0x80:
            value_len = (b >> 1) ^ -(b & 1)
        else:
            value_len, _ = read_varint(data, at, record_end)
        if value_len < -1:
            raise CorruptRecordError(f"value length {value_len} at byte {pos}")
        yield StoredRecord(offset_delta, ts_delta, key, value_len == -1, pos, record_end, tail)
        pos = record_end
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes after the batch's {count} records")


def encode_record(section: Buffer, record: StoredRecord, timestamp_delta: int) -> bytes:
    """``record`` re-encoded with a new timestamp delta (everything else verbatim)."""
    inner = bytearray((section[record.start + _length_bytes(section, record)],))  # attributes
    write_varint(timestamp_delta, inner)
    write_varint(record.offset_delta, inner)
    inner += section[record.tail_start : record.end]
    out = bytearray()
    write_varint(len(inner), out)
    out += inner
    return bytes(out)


def _length_bytes(section: Buffer, record: StoredRecord) -> int:
    _, body = read_varint(section, record.start, record.end)
    return body - record.start


def first_record_without_key(batch: Buffer) -> int | None:
    """Offset delta of the first record with a null key in one client batch, else None.

    Control batches are skipped (their records are markers, not data). Raises
    CorruptRecordError for records that do not decode.
    """
    header = rb.parse_header(batch)
    if header.is_control:
        return None
    section = records_section(batch, header)
    for record in iter_records(section, header.records_count):
        if record.key is None:
            return record.offset_delta
    return None


__all__ = [
    "StoredRecord",
    "encode_record",
    "first_record_without_key",
    "iter_records",
    "read_varint",
    "records_section",
    "write_varint",
]
