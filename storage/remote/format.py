"""The remote segment format: the objects one closed local segment becomes, and their keys.

Keys, under one prefix per partition (topic id, not name: a re-created topic starts afresh)::

    tiered/<topic id>/<partition>/metadata                        the remote log metadata
    tiered/<topic id>/<partition>/segments/<base>-<segment id>/   one copy of one segment:
        log        the stored batches as they are in the local .log (from the first batch
                   copied), so any byte range starting at a batch is a run of whole batches
        index      offset index, Kafka's layout (relative offset int32, position int32),
                   positions into ``log``
        timeindex  time index, Kafka's layout (timestamp int64, relative offset int32), with
                   a last entry holding the segment's max timestamp
        txnindex   the aborted transactions whose ABORT marker is in the segment, Kafka's
                   .txnindex layout (only when there are some)
        snapshot   the producer-state snapshot at the segment's next offset (when given)
        manifest   written last: what the copy holds (see :class:`Manifest`)

``<base>`` is the base offset in 20 digits (keys sort by offset) and ``<segment id>`` a uuid
chosen per copy: a crashed copy leaves objects no later copy writes over.

The indexes are built here from the batches copied (not uploaded from the local files), so a
copy may start at any batch of a local segment (a new leader's segments need not be cut where
the old leader's were). Every batch's CRC-32C is checked while indexing: corrupt local bytes
are never uploaded. The manifest holds the offsets, the epochs spanned, each object's size
and CRC-32C, and its own CRC-32C in front (:func:`encode_manifest`).

Memory: building a segment reads its ``.log`` from the first batch copied to its end (at most
segment.bytes).
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

import crc32c
import msgspec

from raylog.storage import batch as rb
from raylog.storage.errors import CorruptRecordError, CorruptRemoteObjectError, KafkaStorageError
from raylog.storage.log.config import MAX_SEGMENT_BYTES
from raylog.storage.log.segment import pread_exact
from raylog.storage.log.segment_list import ClosedSegment
from raylog.storage.log.txnindex import encode as encode_txnindex
from raylog.storage.log.txnindex import read_entries
from raylog.storage.remote.metadata import RemoteSegment, SegmentState, epochs_spanned

ROOT = "tiered"
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 4 << 20

INDEX_ENTRY = struct.Struct(">ii")
TIMEINDEX_ENTRY = struct.Struct(">qi")

LOG, INDEX, TIMEINDEX, TXNINDEX, SNAPSHOT, MANIFEST = (
    "log",
    "index",
    "timeindex",
    "txnindex",
    "snapshot",
    "manifest",
)


class RemotePartition(NamedTuple):
    """A partition's place in the object store."""

    topic_id: str
    partition: int

    @property
    def prefix(self) -> str:
        return f"{ROOT}/{self.topic_id}/{self.partition}/"

    @property
    def metadata_key(self) -> str:
        return self.prefix + "metadata"

    @property
    def segments_prefix(self) -> str:
        return self.prefix + "segments/"

    def segment_prefix(self, base_offset: int, segment_id: str) -> str:
        return f"{self.segments_prefix}{base_offset:020d}-{segment_id}/"

    def object_key(self, segment: RemoteSegment, name: str) -> str:
        return self.segment_prefix(segment.base_offset, segment.segment_id) + name


class ObjectInfo(msgspec.Struct, frozen=True):
    size: int
    crc32c: int


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """What one remote segment holds; ``objects`` maps names (LOG, INDEX, ...) to their size
    and CRC-32C."""

    version: int = MANIFEST_VERSION
    segment_id: str
    base_offset: int
    end_offset: int
    max_timestamp_ms: int
    leader_epochs: tuple[tuple[int, int], ...]
    aborted_txns: int  # entries in the txnindex object
    producer_snapshot_offset: int | None  # the offset the snapshot object was taken at
    objects: dict[str, ObjectInfo]


class BuiltSegment(NamedTuple):
    """The objects of one copy, ready to upload, and its metadata entry."""

    entry: RemoteSegment  # state COPY_STARTED
    objects: dict[str, bytes]  # name -> bytes, the manifest excluded
    manifest: Manifest


_manifest_encoder = msgspec.json.Encoder()
_manifest_decoder = msgspec.json.Decoder(Manifest)


def encode_manifest(manifest: Manifest) -> bytes:
    body = _manifest_encoder.encode(manifest)
    return crc32c.crc32c(body).to_bytes(4, "big") + body


def decode_manifest(data: bytes, key: str) -> Manifest:
    """The manifest in ``data``; CorruptRemoteObjectError when its CRC or shape is wrong."""
    if len(data) < 4 or crc32c.crc32c(data[4:]) != int.from_bytes(data[:4], "big"):
        raise CorruptRemoteObjectError(f"remote manifest {key}: CRC-32C mismatch")
    try:
        manifest = _manifest_decoder.decode(data[4:])
    except msgspec.DecodeError as exc:
        raise CorruptRemoteObjectError(f"remote manifest {key}: {exc}") from exc
    if manifest.version != MANIFEST_VERSION or LOG not in manifest.objects:
        raise CorruptRemoteObjectError(f"remote manifest {key}: unknown version or no log")
    return manifest


def check_object(data: bytes, info: ObjectInfo, key: str) -> bytes:
    """``data`` if it has the size and CRC-32C the manifest gives, else raise."""
    if len(data) != info.size or crc32c.crc32c(data) != info.crc32c:
        raise CorruptRemoteObjectError(f"remote object {key} fails its size or CRC-32C check")
    return data


def build_segment(
    files: ClosedSegment,
    from_offset: int,
    segment_id: str,
    *,
    index_interval_bytes: int = 4096,
    producer_snapshot: tuple[int, bytes] | None = None,
) -> BuiltSegment:
    """The objects a copy of ``files`` from the batch holding ``from_offset`` on uploads.

    Reads the ``.log`` (KafkaStorageError on an I/O error, a corrupt batch, or no batch at
    or above ``from_offset``). ``producer_snapshot``: (offset, bytes) of the producer-state
    snapshot at the segment's next offset, uploaded with it (Kafka uploads one per segment).
    """
    try:
        data, skipped = _read_from(files, from_offset)
        aborted = read_entries(files.txnindex_path, files.base_offset)
    except OSError as exc:
        raise KafkaStorageError(f"cannot read {files.log_path} to copy it: {exc}") from exc
    if aborted is None:
        raise KafkaStorageError(f"{files.txnindex_path} is bad: restore it before copying")
    index, timeindex = bytearray(), bytearray()
    batch_epochs: list[tuple[int, int]] = []
    first = last = max_ts = -1
    since_index = index_interval_bytes  # the first batch is always indexed
    try:
        for pos, header in rb.iter_batches(data):
            if first < 0:
                first = header.base_offset
            last = header.last_offset
            max_ts = max(max_ts, header.max_timestamp)
            batch_epochs.append((header.partition_leader_epoch, header.base_offset))
            if since_index >= index_interval_bytes:
                rel = header.base_offset - first
                index += INDEX_ENTRY.pack(rel, pos)
                last_ts = (
                    TIMEINDEX_ENTRY.unpack_from(timeindex, len(timeindex) - 12)[0]
                    if timeindex
                    else -1
                )
                if max_ts > last_ts:
                    timeindex += TIMEINDEX_ENTRY.pack(max_ts, rel)
                since_index = 0
            since_index += header.size
    except CorruptRecordError as exc:
        raise KafkaStorageError(f"{files.log_path}: {exc} (at byte {skipped} on)") from exc
    if first < 0:
        raise KafkaStorageError(f"{files.log_path} holds no batch at or above {from_offset}")
    last_indexed = INDEX_ENTRY.unpack_from(index, len(index) - 8)[0]
    if TIMEINDEX_ENTRY.unpack_from(timeindex, len(timeindex) - 12)[0] < max_ts:
        timeindex += TIMEINDEX_ENTRY.pack(max_ts, last_indexed)
    objects = {LOG: data, INDEX: bytes(index), TIMEINDEX: bytes(timeindex)}
    kept = [a for a in aborted if a.last_offset >= first]
    if kept:
        objects[TXNINDEX] = encode_txnindex(kept)
    if producer_snapshot is not None:
        objects[SNAPSHOT] = producer_snapshot[1]
    epochs = epochs_spanned(batch_epochs, first, last)
    entry = RemoteSegment(
        segment_id=segment_id,
        base_offset=first,
        end_offset=last,
        max_timestamp_ms=max_ts,
        size_bytes=len(data),
        leader_epochs=epochs,
        state=SegmentState.COPY_STARTED,
        writer_epoch=-1,
    )
    manifest = Manifest(
        segment_id=segment_id,
        base_offset=first,
        end_offset=last,
        max_timestamp_ms=max_ts,
        leader_epochs=epochs,
        aborted_txns=len(kept),
        producer_snapshot_offset=None if producer_snapshot is None else producer_snapshot[0],
        objects={name: ObjectInfo(len(b), crc32c.crc32c(b)) for name, b in objects.items()},
    )
    return BuiltSegment(entry, objects, manifest)


def _read_from(files: ClosedSegment, from_offset: int) -> tuple[bytes, int]:
    """The ``.log`` bytes from the first batch whose last offset is >= ``from_offset`` to the
    end, and where they start; the headers before it are walked one by one."""
    fd = os.open(files.log_path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_SEGMENT_BYTES:
            raise KafkaStorageError(f"{files.log_path} is larger than a segment can be")
        pos = 0
        while pos < size:
            head = pread_exact(fd, rb.HEADER_SIZE, pos)
            if len(head) < rb.HEADER_SIZE:
                raise KafkaStorageError(f"{files.log_path} ends inside a batch header")
            header = rb.parse_header(head)
            if header.next_offset > from_offset:
                break
            if header.batch_length < rb.MIN_BATCH_LENGTH:
                raise KafkaStorageError(f"{files.log_path}: bad batch length at byte {pos}")
            pos += header.size
        return pread_exact(fd, size - pos, pos), pos
    finally:
        os.close(fd)


class OffsetIndex(NamedTuple):
    """A remote segment's offset index, parsed: batch base offsets (absolute) and positions."""

    offsets: list[int]
    positions: list[int]

    @classmethod
    def parse(cls, data: bytes, base_offset: int) -> OffsetIndex:
        if len(data) % INDEX_ENTRY.size:
            raise CorruptRemoteObjectError("remote offset index: length not a whole entry")
        offsets, positions = [], []
        for rel, pos in INDEX_ENTRY.iter_unpack(data):
            offsets.append(base_offset + rel)
            positions.append(pos)
        return cls(offsets, positions)
