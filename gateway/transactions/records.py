"""The records of ``__transaction_state`` in Kafka's formats, pure encoding and decoding.

This module owns encoding and decoding the keys and values of the internal topic,
so that a new coordinator rebuilds every transactional id's state by reading the partition
back, and a Kafka tool reads raylog's topic as it reads Kafka's. The formats are Kafka's
(``transaction-coordinator/src/main/resources/common/message/TransactionLog{Key,Value}.json``),
big-endian, each prefixed by its int16 version.

TransactionLogKey (version 0; the prefix is also Kafka's coordinator record type 0)::

    version int16 | transactional_id string (int16 length + UTF-8)

TransactionLogValue version 0 (not flexible; what Kafka 3.x writes, and what raylog writes)::

    version int16 | producer_id int64 | producer_epoch int16 | transaction_timeout_ms int32
                  | transaction_status int8
                  | transaction_partitions [topic string | partition_ids [int32]]  (nullable)
                  | transaction_last_update_timestamp_ms int64
                  | transaction_start_timestamp_ms int64

An array is int32 count + elements, -1 for null (the partitions of an Empty transaction).

TransactionLogValue version 1 (flexible, KIP-890): the same fields with compact strings and
arrays (unsigned varint length + 1, 0 for null), a tagged-field section after each partition
entry and after the value, and three tagged fields: previous_producer_id int64 (tag 0,
default -1), next_producer_id int64 (tag 1, default -1), client_transaction_version int16
(tag 2, default 0). Unknown tags are skipped, as Kafka skips them.

A record with a null value is a tombstone: the transactional id expired. Bad bytes raise
:class:`RecordFormatError`, never anything else.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

from raylog.storage.errors import CorruptRecordError
from raylog.storage.records import read_uvarint

__all__ = [
    "KEY_VERSION",
    "VALUE_VERSIONS",
    "RecordFormatError",
    "TransactionLogKey",
    "TransactionLogValue",
    "TransactionStatus",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
]

KEY_VERSION = 0
VALUE_VERSIONS = (0, 1)

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_VALUE_HEAD = struct.Struct(">qhib")  # producer_id, producer_epoch, timeout_ms, status
_TIMESTAMPS = struct.Struct(">qq")  # last update, start
_UVARINT_MAX_BYTES = 5  # Kafka's lengths and tags are 32-bit unsigned varints

_TAG_PREVIOUS_PRODUCER_ID = 0
_TAG_NEXT_PRODUCER_ID = 1
_TAG_CLIENT_TRANSACTION_VERSION = 2


class RecordFormatError(ValueError):
    """A key or value of ``__transaction_state`` that is not in a known format."""


class TransactionStatus(IntEnum):
    """``transaction_status``: Kafka's TransactionState ids."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7


class TransactionLogKey(NamedTuple):
    transactional_id: str


class TransactionLogValue(NamedTuple):
    """One TransactionLogValue. ``transaction_partitions`` is None for Kafka's null array,
    else (topic, partition ids) pairs; the last three fields are version 1's tagged ones."""

    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_status: TransactionStatus
    transaction_partitions: tuple[tuple[str, tuple[int, ...]], ...] | None
    transaction_last_update_timestamp_ms: int
    transaction_start_timestamp_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0


# --- writing ----------------------------------------------------------------------------------


def _uvarint(n: int) -> bytes:
    """Kafka's unsigned varint: LEB128, seven bits a byte, the low ones first."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string_bytes(s: str) -> bytes:
    data = s.encode("utf-8")
    if len(data) > 0x7FFF:
        raise RecordFormatError(f"string of {len(data)} bytes is longer than 32767")
    return data


def _string(s: str, flexible: bool) -> bytes:
    data = _string_bytes(s)
    return (_uvarint(len(data) + 1) if flexible else _INT16.pack(len(data))) + data


def _array_length(n: int | None, flexible: bool) -> bytes:
    if flexible:
        return _uvarint(0 if n is None else n + 1)
    return _INT32.pack(-1 if n is None else n)


def encode_key(key: TransactionLogKey) -> bytes:
    return _INT16.pack(KEY_VERSION) + _string(key.transactional_id, flexible=False)


def encode_value(value: TransactionLogValue, version: int = 0) -> bytes:
    """``value`` as TransactionLogValue ``version``. Version 0 (Kafka 3.x's) has no place for
    the tagged fields: they are dropped, as Kafka drops them."""
    if version not in VALUE_VERSIONS:
        raise RecordFormatError(f"TransactionLogValue has no version {version}")
    flexible = version >= 1
    out = bytearray(_INT16.pack(version))
    out += _VALUE_HEAD.pack(
        value.producer_id,
        value.producer_epoch,
        value.transaction_timeout_ms,
        int(value.transaction_status),
    )
    partitions = value.transaction_partitions
    out += _array_length(None if partitions is None else len(partitions), flexible)
    for topic, partition_ids in partitions or ():
        out += _string(topic, flexible)
        out += _array_length(len(partition_ids), flexible)
        out += b"".join(_INT32.pack(p) for p in partition_ids)
        if flexible:
            out += _uvarint(0)  # the entry's tagged fields: none
    out += _TIMESTAMPS.pack(
        value.transaction_last_update_timestamp_ms, value.transaction_start_timestamp_ms
    )
    if flexible:
        tags = []  # written only when not their default, in tag order, as Kafka writes them
        if value.previous_producer_id != -1:
            tags.append((_TAG_PREVIOUS_PRODUCER_ID, _INT64.pack(value.previous_producer_id)))
        if value.next_producer_id != -1:
            tags.append((_TAG_NEXT_PRODUCER_ID, _INT64.pack(value.next_producer_id)))
        if value.client_transaction_version != 0:
            version_bytes = _INT16.pack(value.client_transaction_version)
            tags.append((_TAG_CLIENT_TRANSACTION_VERSION, version_bytes))
        out += _uvarint(len(tags))
        for tag, data in tags:
            out += _uvarint(tag) + _uvarint(len(data)) + data
    return bytes(out)


# --- reading ----------------------------------------------------------------------------------


class _Reader:
    """Reads one key or value; every overrun raises RecordFormatError."""

    def __init__(self, data: bytes, flexible: bool = False) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.flexible = flexible

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise RecordFormatError(f"record ends early (need {n} bytes at byte {self.pos})")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        return tuple(fmt.unpack(self.take(fmt.size)))

    def uvarint(self) -> int:
        try:
            n, self.pos = read_uvarint(self.data, self.pos, len(self.data), _UVARINT_MAX_BYTES)
        except CorruptRecordError as exc:
            raise RecordFormatError(str(exc)) from None
        return n

    def length(self, what: str, element_size: int) -> int | None:
        """An array's or string's length (None for null), at most what the bytes left hold."""
        if self.flexible:
            n = self.uvarint() - 1
        else:
            n = self.unpack(_INT16 if what == "string" else _INT32)[0]
        if n < 0:
            return None
        if n * element_size > len(self.data) - self.pos:
            raise RecordFormatError(f"{what} of {n} at byte {self.pos} runs past the record")
        return n

    def string(self) -> str:
        n = self.length("string", 1)
        if n is None:
            raise RecordFormatError(f"null string at byte {self.pos}")
        try:
            return bytes(self.take(n)).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordFormatError(f"string is not UTF-8: {exc}") from None

    def skip_tagged_fields(self) -> dict[int, memoryview]:
        fields: dict[int, memoryview] = {}
        count = self.uvarint()
        if 2 * count > len(self.data) - self.pos:  # a tag and a size take a byte each at least
            raise RecordFormatError(f"{count} tagged fields at byte {self.pos} run past the end")
        for _ in range(count):
            tag = self.uvarint()
            fields[tag] = self.take(self.uvarint())
        return fields

    def end(self) -> None:
        if self.pos != len(self.data):
            raise RecordFormatError(f"{len(self.data) - self.pos} bytes after the record's end")


def decode_key(data: bytes) -> TransactionLogKey:
    r = _Reader(data)
    version = r.unpack(_INT16)[0]
    if version != KEY_VERSION:
        raise RecordFormatError(f"unknown __transaction_state key version {version}")
    key = TransactionLogKey(r.string())
    r.end()
    return key


def decode_value(data: bytes) -> TransactionLogValue:
    """The value in ``data`` (a tombstone's null value is the caller's to recognise)."""
    r = _Reader(data)
    version = r.unpack(_INT16)[0]
    if version not in VALUE_VERSIONS:
        raise RecordFormatError(f"unknown TransactionLogValue version {version}")
    r.flexible = version >= 1
    producer_id, producer_epoch, timeout_ms, status = r.unpack(_VALUE_HEAD)
    try:
        transaction_status = TransactionStatus(status)
    except ValueError:
        raise RecordFormatError(f"unknown transaction status {status}") from None
    count = r.length("partitions array", 2)
    partitions: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    if count is not None:
        entries = []
        for _ in range(count):
            topic = r.string()
            n = r.length("partition ids array", 4) or 0
            ids = struct.unpack(f">{n}i", r.take(4 * n))
            if r.flexible:
                r.skip_tagged_fields()
            entries.append((topic, tuple(ids)))
        partitions = tuple(entries)
    last_update_ms, start_ms = r.unpack(_TIMESTAMPS)
    tagged = r.skip_tagged_fields() if r.flexible else {}
    r.end()
    return TransactionLogValue(
        producer_id,
        producer_epoch,
        timeout_ms,
        transaction_status,
        partitions,
        last_update_ms,
        start_ms,
        previous_producer_id=_tagged(tagged, _TAG_PREVIOUS_PRODUCER_ID, _INT64, -1),
        next_producer_id=_tagged(tagged, _TAG_NEXT_PRODUCER_ID, _INT64, -1),
        client_transaction_version=_tagged(tagged, _TAG_CLIENT_TRANSACTION_VERSION, _INT16, 0),
    )


def _tagged(fields: dict[int, memoryview], tag: int, fmt: struct.Struct, default: int) -> int:
    data = fields.get(tag)
    if data is None:
        return default
    if len(data) != fmt.size:
        raise RecordFormatError(f"tagged field {tag} has {len(data)} bytes, not {fmt.size}")
    return int(fmt.unpack(data)[0])
