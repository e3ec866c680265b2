"""Kafka RecordBatch v2 headers: the one place in raylog that knows the batch's byte layout.

Pure functions over bytes (no I/O): parse a header zero-copy from a ``memoryview``, validate a
batch a client produced, stamp the fields the broker owns, walk a buffer of concatenated
batches, give a batch's records section uncompressed, and build a valid uncompressed batch
from records (for tests, benchmarks and the records the broker writes).

Byte table (all integers big-endian; "batchLength" counts the bytes after its own field, so a
batch occupies ``batchLength + 12`` bytes):

| byte | field                 | type   | notes                                                 |
|------|-----------------------|--------|-------------------------------------------------------|
|    0 | baseOffset            | int64  | stamped by the leader; not under the CRC              |
|    8 | batchLength           | int32  | >= 49 (the header after this field)                   |
|   12 | partitionLeaderEpoch  | int32  | stamped by the leader; not under the CRC              |
|   16 | magic                 | int8   | must be 2                                             |
|   17 | crc                   | uint32 | CRC-32C (Castagnoli) over bytes [21, end)             |
|   21 | attributes            | int16  | bits 0-2 codec (0 none, 1 gzip, 2 snappy, 3 lz4,      |
|      |                       |        | 4 zstd), bit 3 LogAppendTime, 4 transactional,        |
|      |                       |        | 5 control                                             |
|   23 | lastOffsetDelta       | int32  | recordsCount - 1                                      |
|   27 | baseTimestamp         | int64  | ms                                                    |
|   35 | maxTimestamp          | int64  | ms; set to the append time under LogAppendTime        |
|   43 | producerId            | int64  | -1 when not idempotent                                |
|   51 | producerEpoch         | int16  |                                                       |
|   53 | baseSequence          | int32  | >= 0 whenever producerId >= 0                         |
|   57 | recordsCount          | int32  | > 0                                                   |
|   61 | records               | bytes  | one compressed blob when codec != 0                   |

The records section is one compressed blob when the codec is not 0
(:mod:`raylog.storage.compression`); uncompressed, it holds the records, whose layout
:mod:`raylog.storage.records` owns.

Everything here works from the 61-byte header, except :func:`build_batch` and
:func:`records_section` with what uses it: :func:`check_client_records` (the produce check of
a batch's records, and of a compacted topic's keys) and :func:`parse_end_txn_marker`, which
reads the one record of a transaction marker (a control batch of a few dozen bytes): the only
places the produce and replication paths decode records.

Transaction markers (Kafka's EndTransactionMarker): a control batch (attributes bits 4 and 5)
of one record whose key is (version int16 0, type int16: 0 ABORT, 1 COMMIT) and whose value
is (version int16 0, coordinatorEpoch int32). Other control types (Kafka's LEADER_CHANGE and
the KRaft snapshot records) are not transaction markers.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import crc32c as _crc32c

from raylog.storage.compression import CODEC_NONE, DECOMPRESSED_SIZE_MAX, decompress
from raylog.storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordTooLargeError,
    UnsupportedCompressionTypeError,
)
from raylog.storage.records import check_records, encode_record, iter_decoded, iter_records

Buffer = bytes | bytearray | memoryview

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes batchLength does not count
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49
MAGIC = 2

# Field positions, for in-place rewrites.
BASE_OFFSET_POS = 0
BATCH_LENGTH_POS = 8
PARTITION_LEADER_EPOCH_POS = 12
MAGIC_POS = 16
CRC_POS = 17
ATTRIBUTES_POS = 21
MAX_TIMESTAMP_POS = 35
CRC_START = 21

_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")

COMPRESSION_MASK = 0x07
MAX_COMPRESSION_CODEC = 4  # zstd
TIMESTAMP_TYPE_LOG_APPEND_TIME = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20

NO_PRODUCER_ID = -1
NO_PARTITION_LEADER_EPOCH = -1

# Upper bound on a batch we will even try to frame while walking a buffer or a segment file.
# Anything larger is a corrupt length field, not a batch (max.message.bytes is capped far below).
MAX_BATCH_SIZE_SANITY = 1 << 30


class BatchHeader(NamedTuple):
    """The 61-byte v2 header, field for field (see the module's byte table)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_LOG_APPEND_TIME)


def parse_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Read the header at ``pos`` without copying the batch.

    Raises CorruptRecordError when fewer than 61 bytes remain.
    """
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(
            f"record batch header truncated at byte {pos}: {len(buf) - pos} < {HEADER_SIZE} bytes"
        )
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def compute_crc(buf: Buffer, pos: int, size: int) -> int:
    """CRC-32C of the batch at ``pos`` of ``size`` bytes, over [pos + 21, pos + size)."""
    view = memoryview(buf)[pos + CRC_START : pos + size]
    return _crc32c.crc32c(view)


def crc_ok(buf: Buffer, pos: int, header: BatchHeader) -> bool:
    return compute_crc(buf, pos, header.size) == header.crc


def check_framing(buf: Buffer, pos: int, header: BatchHeader) -> None:
    """Magic and length checks: the batch at ``pos`` is a whole v2 batch inside ``buf``."""
    if header.magic != MAGIC:
        raise InvalidRecordError(f"record batch magic {header.magic} at byte {pos}, expected 2")
    if header.batch_length < MIN_BATCH_LENGTH or header.size > MAX_BATCH_SIZE_SANITY:
        raise CorruptRecordError(f"record batch length {header.batch_length} at byte {pos}")
    if header.size > len(buf) - pos:
        raise CorruptRecordError(
            f"record batch at byte {pos} claims {header.size} bytes, {len(buf) - pos} remain"
        )


def verify_crc(buf: Buffer, pos: int, header: BatchHeader) -> None:
    if not crc_ok(buf, pos, header):
        raise CorruptRecordError(
            f"record batch at byte {pos} (base offset {header.base_offset}) fails its CRC-32C"
        )


def validate_client_batch(
    buf: Buffer, max_message_bytes: int, *, coordinator_writes: bool = False
) -> BatchHeader:
    """Check one batch a client produced; returns its header.

    The buffer must hold exactly one batch (produce v3+ carries one batch per partition).
    Checks, in order: framing (length, magic), size <= ``max_message_bytes``, CRC-32C, codec,
    recordsCount == lastOffsetDelta + 1 > 0, not a control batch, baseSequence >= 0 when
    producerId >= 0. Each failure raises its own RaylogError subclass.

    ``coordinator_writes``: the writer is a raylog coordinator on an internal topic (Kafka's
    AppendOrigin.COORDINATOR), whose transactional batches carry a producerId and baseSequence
    -1 (no sequence checks apply to them).
    """
    header = parse_header(buf, 0)
    check_framing(buf, 0, header)
    if header.size != len(buf):
        raise CorruptRecordError(
            f"produce data holds {len(buf)} bytes but its batch claims {header.size}"
        )
    if header.size > max_message_bytes:
        raise RecordTooLargeError(
            f"record batch of {header.size} bytes exceeds max.message.bytes={max_message_bytes}"
        )
    verify_crc(buf, 0, header)
    if header.compression > MAX_COMPRESSION_CODEC:
        raise UnsupportedCompressionTypeError(f"compression codec {header.compression}")
    if header.records_count <= 0 or header.records_count != header.last_offset_delta + 1:
        raise InvalidRecordError(
            f"recordsCount {header.records_count} != lastOffsetDelta "
            f"{header.last_offset_delta} + 1, or not positive"
        )
    if header.is_control:
        raise InvalidRecordError("control batches may only be written by the broker")
    if header.producer_id >= 0 and header.base_sequence < 0:
        if coordinator_writes and header.is_transactional and header.base_sequence == -1:
            return header
        raise InvalidRecordError(
            f"producerId {header.producer_id} with negative baseSequence {header.base_sequence}"
        )
    return header


# The most a produced batch may inflate to while its records are checked: Kafka's default
# max.message.bytes caps a batch at 1 MiB compressed, and 64 MiB of records from it is far more
# than real data compresses to; a batch that inflates further is refused, not held in memory.
PRODUCE_INFLATE_MAX = 64 << 20
PRODUCE_INFLATE_RATIO_MAX = 64  # ... or 64 times its own size, whichever is more


def check_client_records(
    batch: Buffer, header: BatchHeader, *, keys_required: bool = False
) -> int | None:
    """Kafka's LogValidator over one client batch (``validate_client_batch`` passed it): its
    records decompress and parse (``records.check_records``), so that no consumer meets a
    batch it cannot read. Raises CorruptRecordError. With ``keys_required`` (a compacted
    topic), returns the offset delta of its first record without a key, else None (from the
    same decompression)."""
    limit = max(PRODUCE_INFLATE_MAX, PRODUCE_INFLATE_RATIO_MAX * header.size)
    body = records_section(batch, header, limit)
    check_records(body, header.records_count)
    if keys_required and not header.is_control:
        for record in iter_records(body, header.records_count):
            if record.key is None:
                return record.offset_delta
    return None


def records_section(
    batch: Buffer, header: BatchHeader, limit: int = DECOMPRESSED_SIZE_MAX
) -> bytes | memoryview:
    """The records of one whole batch (``batch`` starts at its header), uncompressed (at most
    ``limit`` bytes of them, else CorruptRecordError)."""
    body = memoryview(batch).cast("B")[HEADER_SIZE : header.size]
    if header.compression == CODEC_NONE:
        return body
    return decompress(header.compression, body, limit)


CONTROL_ABORT = 0  # Kafka's ControlRecordType.ABORT
CONTROL_COMMIT = 1  # Kafka's ControlRecordType.COMMIT
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_END_TXN_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch


class EndTxnMarker(NamedTuple):
    """What a transaction marker says: COMMIT or ABORT, and the coordinator's epoch."""

    control_type: int  # CONTROL_ABORT or CONTROL_COMMIT
    coordinator_epoch: int

    @property
    def commit(self) -> bool:
        return self.control_type == CONTROL_COMMIT


def end_txn_marker_record(commit: bool, coordinator_epoch: int, timestamp_ms: int) -> Record:
    """The one record of a transaction marker (see the module docstring)."""
    return Record(
        _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT),
        _END_TXN_VALUE.pack(0, coordinator_epoch),
        timestamp_ms,
    )


def parse_end_txn_marker(batch: Buffer, header: BatchHeader) -> EndTxnMarker | None:
    """The transaction marker in the whole control batch ``batch`` (starting at its header),
    None for a data batch or another control type. Raises CorruptRecordError for a control
    record that does not decode (a key or value shorter than Kafka's)."""
    if not header.is_control or not header.records_count:
        return None  # no record: a marker the log cleaner emptied
    for record in iter_decoded(records_section(batch, header), 1):
        key, value = record.key, record.value
        if key is None or len(key) < _CONTROL_KEY.size:
            raise CorruptRecordError(f"control batch at offset {header.base_offset}: bad key")
        _, control_type = _CONTROL_KEY.unpack_from(key)
        if control_type not in (CONTROL_ABORT, CONTROL_COMMIT):
            return None
        if value is None or len(value) < _END_TXN_VALUE.size:
            raise CorruptRecordError(
                f"transaction marker at offset {header.base_offset}: bad value"
            )
        return EndTxnMarker(control_type, _END_TXN_VALUE.unpack_from(value)[1])
    return None


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Stamp baseOffset in place. Not under the CRC: no re-hash needed."""
    _INT64.pack_into(buf, pos + BASE_OFFSET_POS, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    """Stamp partitionLeaderEpoch in place. Not under the CRC: no re-hash needed."""
    _INT32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_POS, epoch)


def stamp_log_append_time(
    head: bytearray | memoryview, timestamp_ms: int, body: Buffer = b""
) -> None:
    """Apply LogAppendTime: set attribute bit 3 and maxTimestamp, then recompute the CRC.

    ``head`` starts with the batch header and ``body`` holds whatever of the batch ``head``
    does not (empty when ``head`` is the whole batch), so a caller can stamp a copy of the
    61-byte header without copying the payload. Both fields are under the CRC, so this costs
    one CRC pass. Consumers read maxTimestamp as every record's timestamp when bit 3 is set.
    """
    header = parse_header(head, 0)
    _INT16.pack_into(head, ATTRIBUTES_POS, header.attributes | TIMESTAMP_TYPE_LOG_APPEND_TIME)
    _INT64.pack_into(head, MAX_TIMESTAMP_POS, timestamp_ms)
    crc = _crc32c.crc32c(body, _crc32c.crc32c(memoryview(head)[CRC_START:]))
    _UINT32.pack_into(head, CRC_POS, crc)


def iter_batches(buf: Buffer, *, verify: bool = True) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each batch of a buffer of concatenated batches.

    Raises CorruptRecordError (or InvalidRecordError for a bad magic) at the first batch that
    is truncated, mis-framed or, with ``verify``, fails its CRC. The buffer must end exactly
    at a batch boundary.
    """
    pos = 0
    end = len(buf)
    while pos < end:
        header = parse_header(buf, pos)
        check_framing(buf, pos, header)
        if verify:
            verify_crc(buf, pos, header)
        yield pos, header
        pos += header.size


def valid_prefix(
    buf: Buffer, *, min_base_offset: int | None = None
) -> tuple[list[tuple[int, BatchHeader]], int]:
    """The longest prefix of ``buf`` made of whole, CRC-valid batches in offset order.

    Never raises on bad bytes: returns the good batches and the byte length of the good
    prefix; whatever follows it is a torn or corrupt tail. Used by recovery. With
    ``min_base_offset`` the first batch must start at or above it and each next one at or
    above where the previous one ended (a compacted log has gaps between batches, never
    overlaps).
    """
    good: list[tuple[int, BatchHeader]] = []
    pos = 0
    end = len(buf)
    expected = min_base_offset
    while end - pos >= HEADER_SIZE:
        header = BatchHeader._make(HEADER.unpack_from(buf, pos))
        if (
            header.magic != MAGIC
            or header.batch_length < MIN_BATCH_LENGTH
            or header.size > end - pos
            or header.last_offset_delta < 0
            or (expected is not None and header.base_offset < expected)
            or not crc_ok(buf, pos, header)
        ):
            break
        good.append((pos, header))
        pos += header.size
        expected = header.next_offset
    return good, pos


# ---------------------------------------------------------------------------------------------
# Building batches (tests, benchmarks, broker-written records).


class Record(NamedTuple):
    """One record to put in a batch; ``timestamp_ms`` is CreateTime."""

    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Sequence[tuple[str, bytes | None]] = ()


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """Encode ``records`` as one valid, uncompressed v2 batch with CreateTime timestamps."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    base_timestamp = records[0].timestamp_ms
    max_timestamp = max(r.timestamp_ms for r in records)
    body = b"".join(
        encode_record(i, r.timestamp_ms - base_timestamp, r.key, r.value, r.headers)
        for i, r in enumerate(records)
    )
    attributes = (TRANSACTIONAL_FLAG if transactional else 0) | (CONTROL_FLAG if control else 0)
    buf = bytearray(HEADER_SIZE + len(body))
    HEADER.pack_into(
        buf,
        0,
        base_offset,
        len(buf) - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC,
        0,  # crc, filled below
        attributes,
        len(records) - 1,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    buf[HEADER_SIZE:] = body
    _UINT32.pack_into(buf, CRC_POS, compute_crc(buf, 0, len(buf)))
    return bytes(buf)
