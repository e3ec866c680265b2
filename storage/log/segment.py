"""One log segment: its ``.log`` file of stored batches and its two sparse indexes.

A segment is named by its base offset (the first batch's baseOffset), 20 digits:
``00000000000000000000.log``, ``.index``, ``.timeindex``, as Kafka names them.

Index files (Kafka's layouts, big-endian, rebuilt from the ``.log`` when missing or bad):

| file        | entry bytes | fields                                                         |
|-------------|-------------|----------------------------------------------------------------|
| .index      |           8 | relativeOffset int32 (batch baseOffset - segment base),        |
|             |             | position int32 (byte of that batch in the .log)                |
| .timeindex  |          12 | timestamp int64 (no batch up to and including the entry's      |
|             |             | batch has a larger maxTimestamp), relativeOffset int32         |

An entry is added for the first batch of the segment and then for the first batch after each
``index.interval.bytes`` of appended data; time entries only when the timestamp grows, plus a
final time entry holding the segment's largest timestamp when the segment rolls (so retention
knows it without a scan). Deviation from Kafka: offset entries name a batch's base offset
(Kafka's name its last offset); the lookup is the same floor search. The active segment keeps
its indexes in memory and writes them to disk when it stops being active (roll) or the log
closes; a truncation empties them. Recovery always rescans the last segment, so its index
files on disk are never trusted. Inactive segments load their indexes on demand (the
segment list bounds how many are loaded at once). Memory bound per loaded segment: 20 bytes
per ``index.interval.bytes`` of log, e.g. 5 MiB for a full 1 GiB segment at the 4 KiB
default.

Invariants: entries are strictly increasing in both fields; every position is a batch start
below ``size``; ``size`` is the file length (writes that fail are cut back before returning).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import struct
from array import array
from collections.abc import Sequence
from pathlib import Path

from raylog.storage.batch import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_BATCH_SIZE_SANITY,
    MIN_BATCH_LENGTH,
    BatchHeader,
    valid_prefix,
)
from raylog.storage.errors import KafkaStorageError

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
TXNINDEX_SUFFIX = ".txnindex"  # aborted transactions (txnindex.py), only when there are some
TMP_SUFFIX = ".tmp"  # an atomic write in progress (write_file_atomically)
CLEANED_SUFFIX = ".cleaned"  # a segment the log cleaner is writing (rewrite.py)

_INDEX_ENTRY = struct.Struct(">ii")
_TIMEINDEX_ENTRY = struct.Struct(">qi")

# Recovery and index rebuilding read the .log in chunks of this size (bounded memory).
SCAN_CHUNK_BYTES = 8 << 20


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def fsync_directory(directory: Path) -> None:
    """Make creates, renames and unlinks in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, parts: Sequence[bytes | bytearray | memoryview], offset: int) -> int:
    """Write every part at ``offset``, looping over short writes; returns bytes written.

    Raises OSError (e.g. ENOSPC, EFBIG) with nothing undone: the caller cuts the file back.
    """
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    written = 0
    while views:
        n = os.pwritev(fd, views, offset + written)
        if n <= 0:  # a zero-length write on a regular file means no space
            raise OSError(errno.ENOSPC, "short write")
        written += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]
    return written


def pread_exact(fd: int, size: int, offset: int) -> bytes:
    """Read ``size`` bytes at ``offset`` or fewer only at end of file."""
    data = os.pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    chunks = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, offset + got)
        if not more:
            break
        chunks.append(more)
        got += len(more)
    return b"".join(chunks)


def write_file_atomically(path: Path, data: bytes) -> None:
    """tmp file, fsync, rename over ``path``; the caller fsyncs the directory."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pwrite_all(fd, [data], 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def fsync_if_present(path: Path) -> None:
    """fsync the file at ``path`` when there is one. Raises OSError."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Segment:
    """A ``.log`` file plus its offset and time indexes. Not thread-safe: the Log locks."""

    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        name = segment_name(base_offset)
        self.log_path = directory / (name + LOG_SUFFIX)
        self.index_path = directory / (name + INDEX_SUFFIX)
        self.timeindex_path = directory / (name + TIMEINDEX_SUFFIX)
        self.txnindex_path = directory / (name + TXNINDEX_SUFFIX)
        # Entries in the .txnindex (txnindex.py): None until it is read.
        self.txn_entries: int | None = None
        # Invariant: size == length of the .log file == end of the last whole batch.
        self.size = 0
        # One past the last offset stored here (== base_offset when empty).
        self.next_offset = base_offset
        self.max_timestamp = -1
        # maxTimestamp of the first batch: segment.ms rolls are timed from it, as in Kafka.
        self.first_batch_timestamp = -1
        self._fd: int | None = None
        self._idx_offsets: array[int] | None = None  # relative offsets
        self._idx_positions: array[int] | None = None
        self._ti_timestamps: array[int] | None = None
        self._ti_offsets: array[int] | None = None  # relative offsets
        self._bytes_since_index = 0

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, index_interval_bytes: int) -> Segment:
        """A new empty segment; the caller fsyncs the directory."""
        seg = cls(directory, base_offset, index_interval_bytes)
        seg._fd = os.open(seg.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        for path in (seg.index_path, seg.timeindex_path):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        seg._reset_indexes()
        return seg

    @property
    def fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.log_path, os.O_RDWR)
        return self._fd

    def release(self) -> None:
        """Drop the file descriptor and in-memory indexes (they reload on demand)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._idx_offsets = self._idx_positions = None
        self._ti_timestamps = self._ti_offsets = None

    def delete_files(self) -> None:
        self.release()
        for path in (self.log_path, self.index_path, self.timeindex_path, self.txnindex_path):
            path.unlink(missing_ok=True)

    def _reset_indexes(self) -> None:
        self._idx_offsets = array("i")
        self._idx_positions = array("i")
        self._ti_timestamps = array("q")
        self._ti_offsets = array("i")
        # The first batch of a segment is always indexed.
        self._bytes_since_index = self.index_interval_bytes

    # -- appends -----------------------------------------------------------------------------

    def append(
        self, parts: Sequence[bytes | bytearray | memoryview], headers: Sequence[BatchHeader]
    ) -> None:
        """Write whole batches at the end (``parts`` concatenated are exactly ``headers``).

        On an OSError the file is cut back to its previous size and KafkaStorageError raised:
        the segment is then exactly as before the call.
        """
        start = self.size
        try:
            written = pwrite_all(self.fd, parts, start)
        except OSError as exc:
            # If even this fails, the next recovery cuts the partial batch (length or CRC).
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)
            raise KafkaStorageError(f"write to {self.log_path} failed: {exc}") from exc
        pos = start
        for header in headers:
            self._note_batch(header, pos)
            pos += header.size
        if pos != start + written:
            raise AssertionError(f"batch sizes {pos - start} != bytes written {written}")
        self.size = pos

    def _note_batch(self, header: BatchHeader, pos: int) -> None:
        """Account one stored batch at ``pos`` in the in-memory state and indexes."""
        assert self._idx_offsets is not None and self._idx_positions is not None
        assert self._ti_timestamps is not None and self._ti_offsets is not None
        if self.first_batch_timestamp < 0 and pos == 0:
            self.first_batch_timestamp = header.max_timestamp
        self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
        if self._bytes_since_index >= self.index_interval_bytes:
            rel = header.base_offset - self.base_offset
            self._idx_offsets.append(rel)
            self._idx_positions.append(pos)
            if not self._ti_timestamps or self.max_timestamp > self._ti_timestamps[-1]:
                self._ti_timestamps.append(self.max_timestamp)
                self._ti_offsets.append(rel)
            self._bytes_since_index = 0
        self._bytes_since_index += header.size
        self.next_offset = header.next_offset

    # -- durability --------------------------------------------------------------------------

    def write_index_files(self) -> None:
        """Persist both indexes (atomically) for a segment that stops being active.

        A final time-index entry records the segment's largest timestamp, so an inactive
        segment's ``max_timestamp`` (retention) is known from its ``.timeindex`` alone.
        """
        self.ensure_indexes()
        assert self._idx_offsets is not None and self._idx_positions is not None
        assert self._ti_timestamps is not None and self._ti_offsets is not None
        if self.size and (not self._ti_timestamps or self.max_timestamp > self._ti_timestamps[-1]):
            self._ti_timestamps.append(self.max_timestamp)
            self._ti_offsets.append(self._idx_offsets[-1])
        index = b"".join(
            _INDEX_ENTRY.pack(o, p)
            for o, p in zip(self._idx_offsets, self._idx_positions, strict=True)
        )
        timeindex = b"".join(
            _TIMEINDEX_ENTRY.pack(t, o)
            for t, o in zip(self._ti_timestamps, self._ti_offsets, strict=True)
        )
        write_file_atomically(self.index_path, index)
        write_file_atomically(self.timeindex_path, timeindex)
        fsync_if_present(self.txnindex_path)

    # -- loading and recovery ----------------------------------------------------------------

    def load_trusted(self, next_offset: int) -> bool:
        """Open an inactive segment from its index files; False if they are missing or bad.

        ``next_offset`` is the next segment's base offset (batches end at or before it: a
        compacted segment may end in a gap). The checks are cheap (no CRC pass); corrupt
        bytes are caught on read.
        """
        try:
            self.size = os.stat(self.log_path).st_size
        except FileNotFoundError:
            return False
        if not self._read_index_files():
            return False
        assert self._idx_offsets is not None and self._idx_positions is not None
        assert self._ti_timestamps is not None
        if self.size == 0 or not self._idx_offsets or not self._ti_timestamps:
            return False
        if self._idx_positions[0] != 0 or self._idx_positions[-1] >= self.size:
            return False
        # Walk the headers from the last indexed batch to the end of the file (bounded by
        # index.interval.bytes plus one batch): the entry must name the batch it points at,
        # later batches must follow in offset order (gaps are compaction's), and the batches
        # must end exactly at the file's end and at or before the next segment's base.
        pos = self._idx_positions[-1]
        expected = self.base_offset + self._idx_offsets[-1]
        first = True
        while pos < self.size:
            head = pread_exact(self.fd, HEADER_SIZE, pos)
            if len(head) < HEADER_SIZE:
                return False
            header = BatchHeader._make(HEADER.unpack_from(head))
            if (
                (header.base_offset != expected if first else header.base_offset < expected)
                or header.magic != MAGIC
                or header.batch_length < MIN_BATCH_LENGTH
                or header.last_offset_delta < 0
            ):
                return False
            first = False
            pos += header.size
            expected = header.next_offset
        if pos != self.size or expected > next_offset:
            return False
        self.next_offset = next_offset
        self.max_timestamp = self._ti_timestamps[-1]
        return True

    def adopt(self, headers: Sequence[tuple[int, BatchHeader]], size: int) -> None:
        """In-memory state and indexes for a file written elsewhere (the log cleaner's), from
        the ``(position, header)`` of each of its batches."""
        self.size = size
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.first_batch_timestamp = -1
        self._reset_indexes()
        for pos, header in headers:
            self._note_batch(header, pos)

    def ensure_indexes(self) -> None:
        """Load the index files of an inactive segment (validated when it was opened)."""
        if self._idx_offsets is None and not self._read_index_files():
            self.rebuild_indexes()

    def _read_index_files(self) -> bool:
        try:
            index = self.index_path.read_bytes()
            timeindex = self.timeindex_path.read_bytes()
        except FileNotFoundError:
            return False
        if len(index) % _INDEX_ENTRY.size or len(timeindex) % _TIMEINDEX_ENTRY.size:
            return False
        offsets, positions = array("i"), array("i")
        for o, p in _INDEX_ENTRY.iter_unpack(index):
            if (offsets and (o <= offsets[-1] or p <= positions[-1])) or o < 0 or p < 0:
                return False
            offsets.append(o)
            positions.append(p)
        timestamps, toffsets = array("q"), array("i")
        for t, o in _TIMEINDEX_ENTRY.iter_unpack(timeindex):
            if timestamps and t <= timestamps[-1]:
                return False
            timestamps.append(t)
            toffsets.append(o)
        self._idx_offsets, self._idx_positions = offsets, positions
        self._ti_timestamps, self._ti_offsets = timestamps, toffsets
        self._bytes_since_index = 0
        return True

    def rebuild_indexes(self) -> None:
        """Rebuild in-memory state by scanning the .log; the file must hold whole batches."""
        valid = self.recover(max_batch_bytes=MAX_BATCH_SIZE_SANITY)
        if valid != self.size:
            raise KafkaStorageError(f"{self.log_path} changed under an index rebuild")

    def recover(self, max_batch_bytes: int) -> int:
        """Scan the whole .log, rebuilding indexes; returns the length of its valid prefix.

        Valid = whole batches, each passing its CRC-32C, in offset order from the base offset
        (gaps allowed: compaction removes batches; overlaps are not), none larger than
        ``max_batch_bytes``. The caller cuts what follows.
        """
        self.size = os.fstat(self.fd).st_size
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.first_batch_timestamp = -1
        self._reset_indexes()
        pos = 0
        want = SCAN_CHUNK_BYTES
        while pos < self.size:
            chunk = pread_exact(self.fd, min(want, self.size - pos), pos)
            good, used = valid_prefix(chunk, min_base_offset=self.next_offset)
            for at, header in good:
                self._note_batch(header, pos + at)
            pos += used
            if used:
                want = SCAN_CHUNK_BYTES
                continue
            # Nothing whole in this chunk: either a batch bigger than the chunk, or a bad tail.
            if len(chunk) < HEADER_SIZE:
                break
            claimed = struct.unpack_from(">i", chunk, 8)[0] + 12
            if len(chunk) < claimed <= min(max_batch_bytes, self.size - pos):
                want = claimed
                continue
            break
        return pos

    def truncate_to_size(self, size: int) -> None:
        """Cut the .log to ``size`` (a batch boundary) and rebuild the in-memory state.

        The index files on disk described the old content: they are emptied, so that open()
        never trusts them (the segment is active now; they are rewritten when it rolls).
        """
        for path in (self.index_path, self.timeindex_path):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        os.ftruncate(self.fd, size)
        valid = self.recover(max_batch_bytes=MAX_BATCH_SIZE_SANITY)
        if valid != size:
            raise KafkaStorageError(f"{self.log_path} is not valid up to byte {size}")

    # -- lookups -----------------------------------------------------------------------------

    def lookup_position(self, offset: int) -> int:
        """Position of an indexed batch whose base offset is <= ``offset`` (0 if none)."""
        self.ensure_indexes()
        assert self._idx_offsets is not None and self._idx_positions is not None
        i = bisect.bisect_right(self._idx_offsets, offset - self.base_offset) - 1
        return self._idx_positions[i] if i >= 0 else 0

    def lookup_timestamp_position(self, timestamp_ms: int) -> int:
        """A batch position before which every batch's maxTimestamp is < ``timestamp_ms``."""
        self.ensure_indexes()
        assert self._ti_timestamps is not None and self._ti_offsets is not None
        i = bisect.bisect_left(self._ti_timestamps, timestamp_ms) - 1
        if i < 0:
            return 0
        return self.lookup_position(self.base_offset + self._ti_offsets[i])

    def read(self, position: int, size: int) -> bytes:
        return pread_exact(self.fd, min(size, self.size - position), position)
