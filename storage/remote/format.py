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

Memory: a copy holds ``CHUNK_BYTES`` of the ``.log`` at a time (one batch, when a batch is
larger): :func:`build_segment` scans it, then :func:`read_span` reads it again while it
uploads, checking that the bytes are the ones scanned.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
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
CHUNK_BYTES = 8 << 20  # what a copy reads of a local .log at a time

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


class LogSpan(NamedTuple):
    """The bytes of a local ``.log`` a copy uploads as its ``log`` object: ``size`` bytes from
    ``start``, whose CRC-32C the scan computed (:func:`read_span` checks it again)."""

    path: str
    start: int
    size: int
    crc32c: int


class BuiltSegment(NamedTuple):
    """The objects of one copy, ready to upload, and its metadata entry."""

    entry: RemoteSegment  # state COPY_STARTED
    log: LogSpan  # the ``log`` object, read from the local file while it uploads
    objects: dict[str, bytes]  # the other objects by name, the manifest excluded
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
    chunk_bytes: int = CHUNK_BYTES,
) -> BuiltSegment:
    """The objects a copy of ``files`` from the batch holding ``from_offset`` on uploads.

    Scans the ``.log`` once, ``chunk_bytes`` at a time (KafkaStorageError on an I/O error, a
    corrupt batch, or no batch at or above ``from_offset``), building the indexes and the log
    span's CRC-32C; the log's bytes are read again while they upload (:func:`read_span`).
    ``producer_snapshot``: (offset, bytes) of the producer-state snapshot at the segment's
    next offset, uploaded with it (Kafka uploads one per segment).
    """
    try:
        scan, log = _scan(files, from_offset, index_interval_bytes, chunk_bytes)
        aborted = read_entries(files.txnindex_path, files.base_offset)
    except OSError as exc:
        raise KafkaStorageError(f"cannot read {files.log_path} to copy it: {exc}") from exc
    if aborted is None:
        raise KafkaStorageError(f"{files.txnindex_path} is bad: restore it before copying")
    first, last, max_ts = scan.first, scan.last, scan.max_ts
    objects = {INDEX: bytes(scan.index), TIMEINDEX: bytes(scan.timeindex)}
    kept = [a for a in aborted if a.last_offset >= first]
    if kept:
        objects[TXNINDEX] = encode_txnindex(kept)
    if producer_snapshot is not None:
        objects[SNAPSHOT] = producer_snapshot[1]
    epochs = epochs_spanned(scan.batch_epochs, first, last)
    entry = RemoteSegment(
        segment_id=segment_id,
        base_offset=first,
        end_offset=last,
        max_timestamp_ms=max_ts,
        size_bytes=log.size,
        leader_epochs=epochs,
        state=SegmentState.COPY_STARTED,
        writer_epoch=-1,
    )
    infos = {LOG: ObjectInfo(log.size, log.crc32c)}
    infos.update((name, ObjectInfo(len(b), crc32c.crc32c(b))) for name, b in objects.items())
    manifest = Manifest(
        segment_id=segment_id,
        base_offset=first,
        end_offset=last,
        max_timestamp_ms=max_ts,
        leader_epochs=epochs,
        aborted_txns=len(kept),
        producer_snapshot_offset=None if producer_snapshot is None else producer_snapshot[0],
        objects=infos,
    )
    return BuiltSegment(entry, log, objects, manifest)


def read_span(span: LogSpan, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The bytes of ``span``, ``chunk_bytes`` at a time, for a streaming upload. Raises
    KafkaStorageError, before the last chunk, when the file no longer holds what was scanned
    (a size or CRC-32C mismatch): an upload that stops on it never completes."""
    try:
        fd = os.open(span.path, os.O_RDONLY)
    except OSError as exc:
        raise KafkaStorageError(f"cannot read {span.path} to copy it: {exc}") from exc
    try:
        pos, end, crc = span.start, span.start + span.size, 0
        while pos < end:
            try:
                chunk = pread_exact(fd, min(chunk_bytes, end - pos), pos)
            except OSError as exc:
                raise KafkaStorageError(f"cannot read {span.path} to copy it: {exc}") from exc
            if not chunk:
                raise KafkaStorageError(f"{span.path} ends at byte {pos}, scanned to {end}")
            crc = crc32c.crc32c(chunk, crc)
            pos += len(chunk)
            if pos >= end and crc != span.crc32c:
                raise KafkaStorageError(f"{span.path} changed while it was copied")
            yield chunk
    finally:
        os.close(fd)


class _Scan:
    """What one pass over a ``.log`` builds: the indexes and the epochs."""

    def __init__(self, index_interval_bytes: int) -> None:
        self.index, self.timeindex = bytearray(), bytearray()
        self.batch_epochs: list[tuple[int, int]] = []
        self.first = self.last = self.max_ts = -1
        self.interval = index_interval_bytes
        self.since_index = index_interval_bytes  # the first batch is always indexed

    def add(self, pos: int, header: rb.BatchHeader) -> None:
        """One batch at ``pos`` bytes into the span."""
        if self.first < 0:
            self.first = header.base_offset
        self.last = header.last_offset
        self.max_ts = max(self.max_ts, header.max_timestamp)
        self.batch_epochs.append((header.partition_leader_epoch, header.base_offset))
        if self.since_index >= self.interval:
            rel = header.base_offset - self.first
            self.index += INDEX_ENTRY.pack(rel, pos)
            if self.max_ts > self._last_indexed_ts():
                self.timeindex += TIMEINDEX_ENTRY.pack(self.max_ts, rel)
            self.since_index = 0
        self.since_index += header.size

    def finish(self) -> None:
        """The time index's last entry holds the segment's max timestamp."""
        if self._last_indexed_ts() < self.max_ts:
            last_indexed = INDEX_ENTRY.unpack_from(self.index, len(self.index) - 8)[0]
            self.timeindex += TIMEINDEX_ENTRY.pack(self.max_ts, last_indexed)

    def _last_indexed_ts(self) -> int:
        if not self.timeindex:
            return -1
        return int(TIMEINDEX_ENTRY.unpack_from(self.timeindex, len(self.timeindex) - 12)[0])


def _scan(
    files: ClosedSegment, from_offset: int, interval: int, chunk_bytes: int
) -> tuple[_Scan, LogSpan]:
    """One pass over ``files``' ``.log`` from the first batch whose last offset is >=
    ``from_offset``: the headers before it walked one by one, the rest read ``chunk_bytes`` at
    a time (more for a batch larger than that), every batch's CRC-32C checked; returns what
    it built and the span it read."""
    scan = _Scan(interval)
    fd = os.open(files.log_path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_SEGMENT_BYTES:
            raise KafkaStorageError(f"{files.log_path} is larger than a segment can be")
        start = _first_batch_at(fd, files, size, from_offset)
        pos, crc = start, 0
        while pos < size:
            chunk = pread_exact(fd, min(chunk_bytes, size - pos), pos)
            whole = _whole_batches(chunk)
            if whole == 0:  # one batch larger than a chunk: read it whole
                header = _header_at(fd, files, size, pos)
                chunk = pread_exact(fd, header.size, pos)
                whole = len(chunk)
            view = memoryview(chunk)[:whole]
            try:
                for at, header in rb.iter_batches(view):
                    scan.add(pos - start + at, header)
            except CorruptRecordError as exc:
                raise KafkaStorageError(f"{files.log_path}: {exc} (at byte {pos} on)") from exc
            crc = crc32c.crc32c(view, crc)
            pos += whole
    finally:
        os.close(fd)
    if scan.first < 0:
        raise KafkaStorageError(f"{files.log_path} holds no batch at or above {from_offset}")
    scan.finish()
    return scan, LogSpan(str(files.log_path), start, size - start, crc)


def _whole_batches(chunk: bytes) -> int:
    """How many leading bytes of ``chunk`` are whole batches (by their length fields; the
    batches themselves are checked by the caller)."""
    pos = 0
    while len(chunk) - pos >= rb.HEADER_SIZE:
        try:
            header = rb.parse_header(chunk, pos)
        except CorruptRecordError:
            break  # the next read starts here, and says what is wrong
        if pos + header.size > len(chunk):
            break
        pos += header.size
    return pos


def _header_at(fd: int, files: ClosedSegment, size: int, pos: int) -> rb.BatchHeader:
    head = pread_exact(fd, rb.HEADER_SIZE, pos)
    if len(head) < rb.HEADER_SIZE:
        raise KafkaStorageError(f"{files.log_path} ends inside a batch header")
    try:
        header = rb.parse_header(head)
    except CorruptRecordError as exc:
        raise KafkaStorageError(f"{files.log_path}: {exc} (at byte {pos})") from exc
    if header.batch_length < rb.MIN_BATCH_LENGTH or pos + header.size > size:
        raise KafkaStorageError(f"{files.log_path}: bad batch length at byte {pos}")
    return header


def _first_batch_at(fd: int, files: ClosedSegment, size: int, from_offset: int) -> int:
    """Where the first batch whose last offset is >= ``from_offset`` starts (``size`` if
    none); the headers before it are walked one by one."""
    pos = 0
    while pos < size:
        header = _header_at(fd, files, size, pos)
        if header.next_offset > from_offset:
            break
        pos += header.size
    return pos


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
