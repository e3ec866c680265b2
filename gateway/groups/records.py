"""The records the group coordinator keeps in ``__consumer_offsets``, in Kafka's own formats.

This module owns encoding and decoding the keys and values of the internal topic, so that a new
coordinator rebuilds every group and committed offset by reading the partition back. The formats
are Kafka's (``group-coordinator/src/main/resources/common/message/*.json``), non-flexible
versions, big-endian; a string is int16 length + UTF-8 (-1 = null), bytes are int32 length +
data, an array is int32 count + elements. Every key and value starts with its int16 version.

OffsetCommitKey (versions 0-1; written as 1) — one per (group, topic, partition)::

    version int16 | group string | topic string | partition int32

OffsetCommitValue (versions 0-3 read, written as 3)::

    version int16 | offset int64 | leader_epoch int32 (v3+) | metadata string
                  | commit_timestamp int64 | expire_timestamp int64 (v1 only)

GroupMetadataKey (version 2) — one per group::

    version int16 | group string

GroupMetadataValue (versions 0-3 read, written as 3)::

    version int16 | protocol_type string | generation int32 | protocol string? | leader string?
                  | current_state_timestamp int64 (v2+) | members [MemberMetadata]
    MemberMetadata: member_id string | group_instance_id string? (v3+) | client_id string
                  | client_host string | rebalance_timeout int32 (v1+) | session_timeout int32
                  | subscription bytes | assignment bytes

A record with a null value is a tombstone: it deletes the offset or the group. Bad bytes raise
:class:`RecordFormatError`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "GroupMetadataKey",
    "GroupMetadataValue",
    "MemberMetadata",
    "OffsetCommitKey",
    "OffsetCommitValue",
    "RecordFormatError",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
]

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3


class RecordFormatError(ValueError):
    """A key or value of ``__consumer_offsets`` that is not in a known format."""


class OffsetCommitKey(NamedTuple):
    group: str
    topic: str
    partition: int


class GroupMetadataKey(NamedTuple):
    group: str


class OffsetCommitValue(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


class MemberMetadata(NamedTuple):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


class GroupMetadataValue(NamedTuple):
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int
    members: Sequence[MemberMetadata]


Key = OffsetCommitKey | GroupMetadataKey
Value = OffsetCommitValue | GroupMetadataValue

# --- writing ----------------------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def int16(self, v: int) -> None:
        self.out += struct.pack(">h", v)

    def int32(self, v: int) -> None:
        self.out += struct.pack(">i", v)

    def int64(self, v: int) -> None:
        self.out += struct.pack(">q", v)

    def string(self, v: str | None) -> None:
        if v is None:
            self.int16(-1)
            return
        data = v.encode("utf-8")
        if len(data) > 0x7FFF:
            raise RecordFormatError(f"string of {len(data)} bytes is too long")
        self.int16(len(data))
        self.out += data

    def bytes_(self, v: bytes) -> None:
        self.int32(len(v))
        self.out += v


def encode_key(key: Key) -> bytes:
    w = _Writer()
    if isinstance(key, OffsetCommitKey):
        w.int16(OFFSET_COMMIT_KEY_VERSION)
        w.string(key.group)
        w.string(key.topic)
        w.int32(key.partition)
    else:
        w.int16(GROUP_METADATA_KEY_VERSION)
        w.string(key.group)
    return bytes(w.out)


def encode_value(value: Value) -> bytes:
    w = _Writer()
    if isinstance(value, OffsetCommitValue):
        w.int16(OFFSET_COMMIT_VALUE_VERSION)
        w.int64(value.offset)
        w.int32(value.leader_epoch)
        w.string(value.metadata)
        w.int64(value.commit_timestamp_ms)
        return bytes(w.out)
    w.int16(GROUP_METADATA_VALUE_VERSION)
    w.string(value.protocol_type)
    w.int32(value.generation)
    w.string(value.protocol)
    w.string(value.leader)
    w.int64(value.current_state_timestamp_ms)
    w.int32(len(value.members))
    for m in value.members:
        w.string(m.member_id)
        w.string(m.group_instance_id)
        w.string(m.client_id)
        w.string(m.client_host)
        w.int32(m.rebalance_timeout_ms)
        w.int32(m.session_timeout_ms)
        w.bytes_(m.subscription)
        w.bytes_(m.assignment)
    return bytes(w.out)


# --- reading ----------------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise RecordFormatError(f"record ends early (need {n} bytes at {self.pos})")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int16(self) -> int:
        return int(struct.unpack(">h", self._take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self._take(4))[0])

    def int64(self) -> int:
        return int(struct.unpack(">q", self._take(8))[0])

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n == -1:
            return None
        try:
            return bytes(self._take(n)).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordFormatError(f"string is not UTF-8: {exc}") from None

    def string(self) -> str:
        v = self.nullable_string()
        if v is None:
            raise RecordFormatError("null where a string is required")
        return v

    def bytes_(self) -> bytes:
        n = self.int32()
        return b"" if n == -1 else bytes(self._take(n))


def decode_key(data: bytes) -> Key:
    r = _Reader(data)
    version = r.int16()
    if version in (0, 1):
        return OffsetCommitKey(r.string(), r.string(), r.int32())
    if version == 2:
        return GroupMetadataKey(r.string())
    raise RecordFormatError(f"unknown __consumer_offsets key version {version}")


def decode_value(key: Key, data: bytes) -> Value:
    r = _Reader(data)
    version = r.int16()
    if isinstance(key, OffsetCommitKey):
        if not 0 <= version <= 3:
            raise RecordFormatError(f"unknown OffsetCommitValue version {version}")
        offset = r.int64()
        leader_epoch = r.int32() if version >= 3 else -1
        metadata = r.nullable_string() or ""
        timestamp = r.int64()
        if version == 1:
            r.int64()  # expire_timestamp: offsets do not expire in raylog yet
        return OffsetCommitValue(offset, leader_epoch, metadata, timestamp)
    if not 0 <= version <= 3:
        raise RecordFormatError(f"unknown GroupMetadataValue version {version}")
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    timestamp = r.int64() if version >= 2 else -1
    count = r.int32()
    if count < 0 or count > len(data):
        raise RecordFormatError(f"bad member count {count}")
    members = []
    for _ in range(count):
        member_id = r.string()
        instance_id = r.nullable_string() if version >= 3 else None
        client_id = r.string()
        client_host = r.string()
        rebalance_timeout = r.int32() if version >= 1 else -1
        session_timeout = r.int32()
        members.append(
            MemberMetadata(
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout if version >= 1 else session_timeout,
                session_timeout,
                r.bytes_(),
                r.bytes_(),
            )
        )
    return GroupMetadataValue(protocol_type, generation, protocol, leader, timestamp, members)
