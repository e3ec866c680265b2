"""The write-ahead log of one partition replica: segments, epochs, checkpoints, recovery.

Directory layout (Kafka's)::

    00000000000000000000.log        stored RecordBatch v2 bytes, exactly as stamped
    00000000000000000000.index      sparse offset index   (see segment.py)
    00000000000000000000.timeindex  sparse time index     (see segment.py)
    leader-epoch-checkpoint         "0\\n<count>\\n" then "<epoch> <startOffset>" lines
    high-watermark-checkpoint       "0\\n<high watermark>\\n"
    log-start-offset-checkpoint     "0\\n<log start offset>\\n" (DeleteRecords, see below)

The Log owns offset assignment on the leader path (:meth:`Log.append`), contiguity checks on
the follower path (:meth:`Log.append_replicated`), reads of whole batches, the leader-epoch
cache (KIP-101/279), retention, truncation and crash recovery.

The log start offset (Kafka's). It starts as the first segment's base offset and moves up when
retention deletes segments, or, through :meth:`Log.advance_log_start` (DeleteRecords, or a
follower learning its leader's), to any offset up to the high watermark, also inside a
segment. Invariants: first segment's base offset <= log start offset <= log end offset, and no
segment lies wholly below the log start offset (the next segment's base offset is above it).
Offsets below it are never served (OffsetOutOfRangeError), even where their bytes still sit in
the first segment. Only a value set by advance_log_start (or a truncation that lowers it) is
checkpointed: recovery takes the larger of the checkpoint and the first segment's base
offset, clamped to the log end offset.

Durability. Appends write to the page cache and return; :meth:`Log.flush` makes everything
appended so far durable. When to flush (flush.messages, flush.ms, group commit) is the owner's
policy: a replica's, not the log's. Invariant: every segment but the active one is fsync'd (a
roll fsyncs the old segment with its index files before creating the new one), so one fsync of
the active segment makes every earlier write durable. That fsync runs outside ``_lock``, on a
duplicate of the active segment's descriptor (a roll or truncation meanwhile cannot close it
under the fsync), so appends go on during it; they are covered by the next flush.

Every operation holds ``_lock``. Reads hold it too (so a truncation never shrinks a file
under a read); they cost a pread and a CRC pass, never an fsync.

Limits (bounded memory): one batch <= MAX_BATCH_BYTES (64 MiB) on both paths and in
recovery; index positions and relative offsets are int32, so segment.bytes < 2 GiB; the
active segment's indexes live in memory (20 bytes per index.interval.bytes of data, 5 MiB for
a full 1 GiB segment at 4 KiB), plus at most MAX_OPEN_INACTIVE_SEGMENTS inactive segments
with loaded indexes and an open descriptor (LRU); recovery reads 8 MiB at a time. Per
segment the Log keeps a few integers only.

Recovery (:meth:`Log.open`). Inactive segments were fsync'd with their index files when they
rolled; they are trusted when those files pass cheap checks (entries increasing, and a header
walk from the last entry ends exactly at the file's end, at or before the next segment's base
offset; bit flips inside batches are caught by the CRC check on read). Other segments, and
always the last one, are rescanned from their start: whole batches, CRC-32C valid, offsets in
order from the segment's base offset (gaps are allowed: compaction removes batches). A segment
that starts below where its predecessor ends is a leftover of an interrupted cleaning (see
:meth:`Log.clean`) and is deleted. The first bad
batch and everything after it (later segments included) is cut, the indexes rebuilt, the
epoch cache trimmed past the new log end and completed from the rescanned batches, and one
log line (WARNING) says what was cut.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import msgspec

from raylog.storage import batch as rb
from raylog.storage import cleaner
from raylog.storage.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidConfigError,
    InvalidRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RaylogError,
    RecordTooLargeError,
    UnsupportedCompressionTypeError,
)
from raylog.storage.segment import (
    LOG_SUFFIX,
    SCAN_CHUNK_BYTES,
    TMP_SUFFIX,
    Segment,
    fsync_directory,
    pread_exact,
    pwrite_all,
    write_file_atomically,
)

logger = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "high-watermark-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
CLEANED_SUFFIX = ".cleaned"  # a segment the cleaner is writing; deleted by recovery
CHECKPOINT_VERSION = 0

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
# ListOffsets' special timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

# Hard ceiling on one stored batch (leader or follower). Recovery never reads a batch larger
# than this into memory, so max.message.bytes cannot exceed it.
MAX_BATCH_BYTES = 64 << 20
# Relative offsets and positions in index entries are int32.
MAX_SEGMENT_BYTES = (1 << 31) - 1
MAX_RELATIVE_OFFSET = (1 << 31) - 1
# Inactive segments with open descriptors and loaded indexes at once (LRU).
MAX_OPEN_INACTIVE_SEGMENTS = 8
# batch_headers() reads this much at a time while walking headers.
HEADER_SCAN_CHUNK_BYTES = 1 << 20
# read_extents reads batch headers through a window of this size (one read per large batch).
_HEADER_WINDOW = 16 << 10

_DAY_MS = 24 * 60 * 60 * 1000
_T = TypeVar("_T")
_LONG_MAX = (1 << 63) - 1
_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex)$")


def cleanup_policies(value: str) -> frozenset[str]:
    """The policies a cleanup.policy value names (a comma-separated list)."""
    return frozenset(p.strip() for p in value.split(",") if p.strip())


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class LogConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Per-log settings, typed; each field is the Kafka topic config named in its comment.

    The Kafka keys are parsed and validated in one place, the config registry
    (``raylog.actors.control.config_keys.log_config``); the checks here are the log's own
    invariants. The flush policy (flush.messages, flush.ms) is not here: the log's owner
    decides when to call :meth:`Log.flush`.
    """

    segment_bytes: int = 1 << 30  # segment.bytes
    segment_ms: int = 7 * _DAY_MS  # segment.ms
    retention_ms: int = 7 * _DAY_MS  # retention.ms (-1: unlimited)
    retention_bytes: int = -1  # retention.bytes (-1: unlimited)
    max_message_bytes: int = 1048588  # max.message.bytes
    index_interval_bytes: int = 4096  # index.interval.bytes
    message_timestamp_type: str = "CreateTime"  # message.timestamp.type
    cleanup_policy: str = "delete"  # cleanup.policy: delete, compact or compact,delete
    delete_retention_ms: int = _DAY_MS  # delete.retention.ms
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = _LONG_MAX  # max.compaction.lag.ms

    def __post_init__(self) -> None:
        _check_range("segment.bytes", self.segment_bytes, 14, MAX_SEGMENT_BYTES)
        _check_range("segment.ms", self.segment_ms, 1, _LONG_MAX)
        _check_range("retention.ms", self.retention_ms, -1, _LONG_MAX)
        _check_range("retention.bytes", self.retention_bytes, -1, _LONG_MAX)
        _check_range("max.message.bytes", self.max_message_bytes, 0, MAX_BATCH_BYTES)
        _check_range("index.interval.bytes", self.index_interval_bytes, 0, MAX_SEGMENT_BYTES)
        if self.message_timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise InvalidConfigError(
                f"message.timestamp.type={self.message_timestamp_type!r}: "
                "expected CreateTime or LogAppendTime"
            )
        policies = cleanup_policies(self.cleanup_policy)
        if not policies or not policies <= {"delete", "compact"}:
            raise InvalidConfigError(
                f"cleanup.policy={self.cleanup_policy!r}: expected delete, compact or both"
            )
        _check_range("delete.retention.ms", self.delete_retention_ms, 0, _LONG_MAX)
        _check_range("min.compaction.lag.ms", self.min_compaction_lag_ms, 0, _LONG_MAX)
        _check_range("max.compaction.lag.ms", self.max_compaction_lag_ms, 1, _LONG_MAX)
        ratio = self.min_cleanable_dirty_ratio
        if not isinstance(ratio, float | int) or not 0.0 <= ratio <= 1.0:
            raise InvalidConfigError(f"min.cleanable.dirty.ratio={ratio!r}: must be in [0, 1]")

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def compact(self) -> bool:
        """cleanup.policy includes compact: the log cleaner keeps the latest record per key."""
        return "compact" in cleanup_policies(self.cleanup_policy)

    @property
    def delete(self) -> bool:
        """cleanup.policy includes delete: retention.ms / retention.bytes delete segments."""
        return "delete" in cleanup_policies(self.cleanup_policy)


def _check_range(key: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidConfigError(f"{key}={value!r}: must be an integer in [{low}, {high}]")


class AppendInfo(msgspec.Struct, frozen=True):
    """What an append stored: offsets assigned and the LogAppendTime (-1 under CreateTime)."""

    base_offset: int
    last_offset: int
    records_count: int
    size_bytes: int
    log_append_time: int
    log_start_offset: int
    max_timestamp: int


class EpochEntry(NamedTuple):
    """The first offset written under a leader epoch."""

    epoch: int
    start_offset: int


class TimestampOffset(NamedTuple):
    """Answer of :meth:`Log.offset_for_timestamp`."""

    timestamp: int
    offset: int


class Extents(NamedTuple):
    """Batches as :meth:`Log.read_extents` locates them: ``(segment file, position, size)``
    runs in order, and the offsets they span (the first batch's base offset, the offset after
    the last batch; -1 and -1 for none)."""

    runs: tuple[tuple[str, int, int], ...]
    first_offset: int
    next_offset: int


class CleanResult(NamedTuple):
    """What one cleaning pass did (:meth:`Log.clean`)."""

    first_dirty_offset: int  # where the dirty part began
    end_offset: int  # offsets below this were cleaned: the next pass's first dirty offset
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    records_removed: int


class _CleanPlan(NamedTuple):
    targets: list[Segment]  # the cleanable segments, oldest first
    sizes: list[int]  # their sizes when planned
    dirty_index: int  # targets[dirty_index:] are dirty
    cut: int  # the first offset not cleanable
    later: list[tuple[Path, int]]  # the segments after the targets (path, size when planned)
    generation: int


class _CleanedGroup(NamedTuple):
    base: int
    path: Path  # the .cleaned file
    members: range  # indexes of the target segments it replaces
    headers: list[tuple[int, rb.BatchHeader]]  # (position, header) of each batch written
    size: int


def _file_headers(path: Path, size: int) -> Iterator[tuple[int, rb.BatchHeader]]:
    """(position, header) of each batch in the first ``size`` bytes of a segment file,
    reading HEADER_SCAN_CHUNK_BYTES at a time and jumping over large bodies."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = 0
        while pos < size:
            chunk = pread_exact(fd, min(HEADER_SCAN_CHUNK_BYTES, size - pos), pos)
            at = 0
            while len(chunk) - at >= rb.HEADER_SIZE:
                header = rb.parse_header(chunk, at)
                if header.magic != rb.MAGIC or header.batch_length < rb.MIN_BATCH_LENGTH:
                    raise KafkaStorageError(f"corrupt batch header at byte {pos + at} of {path}")
                yield pos + at, header
                at += header.size
            if not at:
                raise KafkaStorageError(f"{path}: short batch header at byte {pos}")
            pos += at
    finally:
        os.close(fd)


def _file_batches(path: Path, size: int) -> Iterator[tuple[int, rb.BatchHeader, memoryview]]:
    """(position, header, bytes) of each whole batch in the first ``size`` bytes of a segment
    file, CRC-checked, reading about SCAN_CHUNK_BYTES at a time (a larger batch alone)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = 0
        while pos < size:
            chunk = memoryview(pread_exact(fd, min(SCAN_CHUNK_BYTES, size - pos), pos))
            at = 0
            while len(chunk) - at >= rb.HEADER_SIZE:
                header = rb.parse_header(chunk, at)
                if (
                    header.magic != rb.MAGIC
                    or header.batch_length < rb.MIN_BATCH_LENGTH
                    or header.size > MAX_BATCH_BYTES
                    or pos + at + header.size > size
                ):
                    raise KafkaStorageError(f"corrupt batch header at byte {pos + at} of {path}")
                if header.size > len(chunk) - at:
                    if at:
                        break  # read again from this batch
                    chunk = memoryview(pread_exact(fd, header.size, pos))
                if not rb.crc_ok(chunk, at, header):
                    raise KafkaStorageError(
                        f"batch at byte {pos + at} of {path} fails its CRC-32C; not cleaned"
                    )
                yield pos + at, header, chunk[at : at + header.size]
                at += header.size
            if not at:
                raise KafkaStorageError(f"{path}: short batch at byte {pos}")
            pos += at
    finally:
        os.close(fd)


def _group_segments(
    bases: list[int], sizes: list[int], cut: int, segment_bytes: int
) -> list[range]:
    """Consecutive runs of segments the cleaner merges into one: at most segment.bytes of
    (uncleaned) data, and offsets within int32 of the run's base."""
    groups: list[range] = []
    start = 0
    total = 0
    for i, size in enumerate(sizes):
        end = bases[i + 1] if i + 1 < len(bases) else cut
        too_big = total + size > segment_bytes
        too_wide = end - bases[start] > MAX_RELATIVE_OFFSET
        if i > start and (too_big or too_wide):
            groups.append(range(start, i))
            start, total = i, 0
        total += size
    groups.append(range(start, len(sizes)))
    return groups


class RewriteJob(NamedTuple):
    """What a cleaning pass reads and writes (files only: it may run in another process)."""

    directory: Path
    segments: list[tuple[int, Path, int]]  # the cleanable segments: (base offset, path, size)
    dirty_index: int  # segments[dirty_index:] are dirty
    cut: int  # the first offset not cleanable
    later: list[tuple[Path, int]]  # the segments after them (their headers only are read)
    config: LogConfig
    now_ms: int
    max_map_entries: int
    # Names this pass's files (``B.log.<token>.cleaned``): a pass never writes into a file of
    # another one, e.g. of an orphaned child still running after its replica was killed.
    token: str = ""


class Rewritten(NamedTuple):
    """What :func:`rewrite_segments` wrote: ``.cleaned`` files for ``segments[:count]``."""

    count: int  # the segments cleaned (fewer than asked when the offset map filled)
    cut: int  # the first offset not cleaned: the next first dirty offset
    groups: list[_CleanedGroup]
    removed: int  # records removed
    horizon: int  # the earliest delete horizon of a kept batch, -1: none
    failure: str | None = None  # a write failed (nothing to swap in; files removed)


RewriteRunner = Callable[[RewriteJob], Rewritten]


def rewrite_segments(job: RewriteJob, fsync: Callable[[int], None] = os.fdatasync) -> Rewritten:
    """Phases 1-3 of a cleaning pass: the offset map of the dirty part, each producer's last
    batch, and a ``.cleaned`` file per merged group (fsync'd). Reads the segment files and
    writes new files only, never the log's state, so it can run in a child process.

    Raises FileNotFoundError (a segment went meanwhile), KafkaStorageError or
    CorruptRecordError (bytes it cannot read); a failed write (OSError) removes what it wrote
    and is returned as ``failure``.
    """
    segments, config = job.segments, job.config
    # 1. The offset map of the dirty part, segment by segment, while it has room.
    offset_map = cleaner.OffsetMap(job.max_map_entries)
    count = len(segments)
    for i in range(job.dirty_index, len(segments)):
        if offset_map.full and i > job.dirty_index:
            count = i  # the map is full: clean up to here, the rest next time
            break
        _, path, size = segments[i]
        for _, header, data in _file_batches(path, size):
            offset_map.add_batch(data, header)
    cut = job.cut if count == len(segments) else segments[count][0]
    later = [(path, size) for _, path, size in segments[count:]] + job.later
    # 2. Each producer's last batch in the log: kept (maybe empty) for its sequence.
    last_of_producer: dict[int, int] = {}
    for _, path, size in segments[:count]:
        for _, header in _file_headers(path, size):
            if header.producer_id >= 0:
                last_of_producer[header.producer_id] = header.base_offset
    for path, size in later:
        for _, header in _file_headers(path, size):
            last_of_producer.pop(header.producer_id, None)
    # 3. Rewrite, group by group.
    bases = [base for base, _, _ in segments[:count]]
    sizes = [size for _, _, size in segments[:count]]
    written: list[_CleanedGroup] = []
    removed = 0
    horizon = -1
    for group in _group_segments(bases, sizes, cut, config.segment_bytes):
        try:
            out, group_removed, group_horizon = _write_group(
                job, group, offset_map, last_of_producer, fsync
            )
        except FileNotFoundError:
            for done in written:
                done.path.unlink(missing_ok=True)
            raise
        except OSError as exc:
            for done in written:
                done.path.unlink(missing_ok=True)
            return Rewritten(count, cut, [], 0, -1, failure=str(exc))
        written.append(out)
        removed += group_removed
        if group_horizon >= 0 and (horizon < 0 or group_horizon < horizon):
            horizon = group_horizon
    return Rewritten(count, cut, written, removed, horizon)


def _write_group(
    job: RewriteJob,
    group: range,
    offset_map: cleaner.OffsetMap,
    last_of_producer: dict[int, int],
    fsync: Callable[[int], None],
) -> tuple[_CleanedGroup, int, int]:
    """Write one group's cleaned ``.cleaned`` file (fsync'd); returns it, the records
    removed and the earliest delete horizon its kept batches carry (-1: none)."""
    base = job.segments[group.start][0]
    path = job.directory / f"{base:020d}{LOG_SUFFIX}.{job.token}{CLEANED_SUFFIX}"
    headers: list[tuple[int, rb.BatchHeader]] = []
    removed = 0
    horizon = -1
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pending: list[bytes | memoryview] = []
        pending_bytes = 0
        pos = 0
        for i in group:
            _, segment_path, size = job.segments[i]
            for _, header, data in _file_batches(segment_path, size):
                keep_if_empty = last_of_producer.get(header.producer_id) == header.base_offset
                result = cleaner.clean_batch(
                    data,
                    header,
                    offset_map,
                    now_ms=job.now_ms,
                    delete_retention_ms=job.config.delete_retention_ms,
                    keep_if_empty=keep_if_empty,
                )
                removed += result.records_removed
                if result.data is None:
                    continue
                out = result.data
                new_header = rb.parse_header(out) if out is not data else header
                headers.append((pos, new_header))
                pos += new_header.size
                if result.delete_horizon_ms >= 0 and (
                    horizon < 0 or result.delete_horizon_ms < horizon
                ):
                    horizon = result.delete_horizon_ms
                pending.append(out)
                pending_bytes += len(out)
                if pending_bytes >= SCAN_CHUNK_BYTES:
                    pwrite_all(fd, pending, pos - pending_bytes)
                    pending, pending_bytes = [], 0
        if pending:
            pwrite_all(fd, pending, pos - pending_bytes)
        fsync(fd)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return _CleanedGroup(base, path, group, headers, pos), removed, horizon


@dataclass
class LogStats:
    """Counters for tests and metrics. ``fsyncs`` counts fsyncs of segment data only."""

    fsyncs: int = 0
    appends: int = 0
    bytes_appended: int = 0
    segments_rolled: int = 0
    segments_deleted: int = 0
    cleanings: int = 0
    records_cleaned: int = 0  # records the cleaner removed


class Log:
    """One partition replica's write-ahead log in its own directory. Thread-safe."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        clock_ms: Callable[[], int],
        fsync: Callable[[int], None],
    ) -> None:
        # Use Log.open(): __init__ only sets fields.
        self.directory = directory
        self.config = config
        self._clock_ms = clock_ms
        self._fsync = fsync
        self.stats = LogStats()
        self._lock = threading.Lock()
        self._segments: list[Segment] = []
        self._bases: list[int] = []  # base offsets of _segments, for bisect
        self._open_inactive: OrderedDict[int, Segment] = OrderedDict()
        self._epochs: list[EpochEntry] = []
        self._high_watermark = 0
        # Invariant: _segments[0].base_offset <= _log_start_offset <= log_end_offset.
        self._log_start_offset = 0
        # Writes counted (under _lock): those below _durable_writes are fsync'd.
        self._writes = 0
        self._durable_writes = 0
        self._failure: str | None = None  # set on a failed fsync: the log refuses all work
        self._closed = False
        # Log cleaner (compaction) state: the first offset not cleaned yet, the earliest
        # delete horizon a kept tombstone waits for (-1: none), one pass at a time, and a
        # counter bumped by every change of the segment list other than appends, so that a
        # pass that read segments while one happened swaps nothing in.
        self._first_dirty_offset = 0
        self._next_delete_horizon_ms = -1
        self._cleaning = threading.Lock()
        self._layout_generation = 0
        self._uncleanable: str | None = None  # why the cleaner gave up on this log

    # -- opening and recovery ------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        fsync: Callable[[int], None] = os.fdatasync,
    ) -> Log:
        """Open (creating if needed) and recover the log in ``directory``.

        ``clock_ms`` (LogAppendTime) and ``fsync`` (every fsync of segment data,
        given a file descriptor) are injectable for tests and simulation.
        """
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        log = cls(path, config or LogConfig(), clock_ms, fsync)
        try:
            log._recover()
        except OSError as exc:
            raise KafkaStorageError(f"cannot open log {path}: {exc}") from exc
        return log

    def _recover(self) -> None:
        bases: set[int] = set()
        for entry in os.listdir(self.directory):
            if entry.endswith((TMP_SUFFIX, CLEANED_SUFFIX)):
                # An interrupted atomic write, or a segment the cleaner did not swap in.
                (self.directory / entry).unlink()
                continue
            m = _SEGMENT_FILE.match(entry)
            if m and m.group(2) == "log":
                bases.add(int(m.group(1)))
        for entry in os.listdir(self.directory):  # index files whose .log is gone
            m = _SEGMENT_FILE.match(entry)
            if m and int(m.group(1)) not in bases:
                (self.directory / entry).unlink()
        ordered = sorted(bases)
        interval = self.config.index_interval_bytes
        cut: str | None = None
        leftovers: list[int] = []
        segments: list[Segment] = []
        for i, base in enumerate(ordered):
            seg = Segment(self.directory, base, interval)
            if segments and base < segments[-1].next_offset:
                # Offsets the segment before already holds: a segment the log cleaner merged
                # into that one, left by a crash before the cleaner unlinked it (see clean()).
                leftovers.append(base)
                seg.delete_files()
                continue
            is_last = i == len(ordered) - 1
            if not is_last and seg.load_trusted(ordered[i + 1]):
                seg.release()
                segments.append(seg)
                continue
            valid = seg.recover(MAX_BATCH_BYTES)
            if valid == seg.size:
                if not is_last:
                    seg.write_index_files()
                    seg.release()
                segments.append(seg)
                continue
            cut = (
                f"cut {seg.size - valid} bytes of torn or corrupt data at byte {valid} of "
                f"{seg.log_path.name} (offset {seg.next_offset})"
            )
            os.ftruncate(seg.fd, valid)
            self._fsync(seg.fd)
            seg.size = valid
            dropped = ordered[i + 1 :]
            for later in dropped:
                Segment(self.directory, later, interval).delete_files()
            if dropped:
                cut += f" and {len(dropped)} later segment(s)"
            segments.append(seg)
            break
        if leftovers:
            logger.warning(
                "log %s: removed segment(s) %s that an interrupted cleaning had merged into "
                "an earlier one",
                self.directory,
                leftovers,
            )
        if segments and segments[-1].base_offset != ordered[-1]:
            # The last file was such a leftover: the segment before it is active again and
            # needs its in-memory indexes (it passed its checks above).
            last = segments[-1]
            if last.recover(MAX_BATCH_BYTES) != last.size:
                raise KafkaStorageError(f"{last.log_path} changed during recovery")
        for seg, following in itertools.pairwise(segments):
            seg.next_offset = following.base_offset  # segments tile the offsets, gaps included
        if not segments:
            segments.append(Segment.create(self.directory, 0, interval))
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        # Invariant: the active (last) segment was rescanned, so its indexes are in memory.
        fsync_directory(self.directory)
        self._log_start_offset = self._load_log_start_offset()
        # Segments a crash left below a checkpointed log start (see advance_log_start).
        if self._delete_segments_below_log_start():
            fsync_directory(self.directory)

        self._load_epochs(self._segments)
        self._high_watermark = self._load_high_watermark()
        self._load_cleaner_checkpoint()
        if cut:
            logger.warning(
                "log %s recovered: %s; log end offset %d", self.directory, cut, self.log_end_offset
            )
        else:
            logger.info(
                "log %s recovered: %d segment(s), offsets [%d, %d)",
                self.directory,
                len(segments),
                self.log_start_offset,
                self.log_end_offset,
            )

    def _load_epochs(self, segments: list[Segment]) -> None:
        path = self.directory / LEADER_EPOCH_CHECKPOINT
        entries: list[EpochEntry] = []
        try:
            lines = path.read_text().split("\n")
            if int(lines[0]) != CHECKPOINT_VERSION:
                raise ValueError(f"version {lines[0]}")
            count = int(lines[1])
            for line in lines[2 : 2 + count]:
                epoch, start = line.split(" ")
                entries.append(EpochEntry(int(epoch), int(start)))
            if len(entries) != count:
                raise ValueError("short file")
        except FileNotFoundError:
            entries = []
        except (ValueError, IndexError) as exc:
            logger.warning("ignoring unreadable %s: %s", path, exc)
            entries = []
        self._epochs = entries
        self._trim_epochs()  # first drop entries past a cut tail, then add what it lacks
        # Batches rescanned by recovery may carry epochs the checkpoint missed.
        self._assign_epochs_from_active(segments[-1])
        self._trim_epochs()
        if self._epochs != entries:
            self._write_epochs()

    def _assign_epochs_from_active(self, seg: Segment) -> None:
        pos = 0
        while pos < seg.size:
            head = seg.read(pos, rb.HEADER_SIZE)
            header = rb.parse_header(head)
            epoch = header.partition_leader_epoch
            if epoch >= 0 and (not self._epochs or epoch > self._epochs[-1].epoch):
                self._epochs.append(EpochEntry(epoch, header.base_offset))
            pos += header.size

    def _trim_epochs(self) -> None:
        """Invariant: entries are strictly increasing in both fields and start below the log
        end; the first entry is moved up to the log start offset when retention passed it."""
        leo, start = self.log_end_offset, self.log_start_offset
        kept = [e for e in self._epochs if e.start_offset < leo]
        while len(kept) > 1 and kept[1].start_offset <= start:
            kept.pop(0)
        if kept and kept[0].start_offset < start:
            kept[0] = EpochEntry(kept[0].epoch, start)
        self._epochs = kept

    def _write_epochs(self) -> None:
        """Persist the epoch cache (atomically, fsync'd) in Kafka's checkpoint text format."""
        lines = [str(CHECKPOINT_VERSION), str(len(self._epochs))]
        lines += [f"{e.epoch} {e.start_offset}" for e in self._epochs]
        try:
            write_file_atomically(
                self.directory / LEADER_EPOCH_CHECKPOINT, ("\n".join(lines) + "\n").encode()
            )
            fsync_directory(self.directory)
        except OSError as exc:
            raise KafkaStorageError(f"leader epoch checkpoint failed: {exc}") from exc

    def _read_offset_checkpoint(self, name: str) -> int | None:
        """The offset in a ``"0\\n<offset>\\n"`` checkpoint file; None when it is missing or
        unreadable (a warning: the caller falls back to what the segments say)."""
        path = self.directory / name
        try:
            version, value = path.read_text().split("\n")[:2]
            if int(version) != CHECKPOINT_VERSION:
                raise ValueError(f"version {version}")
            return int(value)
        except FileNotFoundError:
            return None
        except ValueError as exc:
            logger.warning("ignoring unreadable %s: %s", path, exc)
            return None

    def _write_offset_checkpoint(self, name: str, offset: int) -> None:
        """Write a ``"0\\n<offset>\\n"`` checkpoint: temp file, fsync, rename, fsync the
        directory."""
        try:
            write_file_atomically(
                self.directory / name, f"{CHECKPOINT_VERSION}\n{offset}\n".encode()
            )
            fsync_directory(self.directory)
        except OSError as exc:
            raise KafkaStorageError(f"{name} failed: {exc}") from exc

    def _load_high_watermark(self) -> int:
        hw = self._read_offset_checkpoint(HIGH_WATERMARK_CHECKPOINT) or 0
        return min(max(hw, self.log_start_offset), self.log_end_offset)

    def _load_log_start_offset(self) -> int:
        """The checkpointed log start offset, clamped into the segments (retention may have
        passed it; a cut torn tail may have ended the log below it)."""
        start = self._read_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT) or 0
        return min(max(start, self._segments[0].base_offset), self.log_end_offset)

    # -- state ---------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        """The first offset served (see the module docstring); may lie inside a segment."""
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def high_watermark(self) -> int:
        """The last checkpointed (or recovered) high watermark, clamped to the log."""
        return self._high_watermark

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch in the cache, UNDEFINED_EPOCH (-1) when empty."""
        with self._lock:
            return self._epochs[-1].epoch if self._epochs else UNDEFINED_EPOCH

    @property
    def epoch_entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._epochs)

    def _check_usable(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"log {self.directory} is closed")
        if self._failure is not None:
            raise KafkaStorageError(f"log {self.directory} failed: {self._failure}")

    # -- appends -------------------------------------------------------------------------------

    def append(
        self, batch: bytes | bytearray | memoryview, leader_epoch: int, *, validated: bool = False
    ) -> AppendInfo:
        """Leader path: validate one client batch, assign offsets, stamp, store.

        The payload is never copied: the 61-byte header is stamped in a copy and written with
        the rest of the caller's buffer in one pwritev. Returns once the bytes are written, not
        durable (see :meth:`flush`). ``validated``: the caller already ran
        ``validate_client_batch`` on these bytes with this log's max.message.bytes (a replica
        does before the batch reaches its state machine), so the CRC is not computed twice.
        """
        view = memoryview(batch).cast("B")
        if not validated:
            rb.validate_client_batch(view, self.config.max_message_bytes)
        head = bytearray(view[: rb.HEADER_SIZE])
        body = view[rb.HEADER_SIZE :]
        with self._lock:
            self._check_usable()
            if self._epochs and leader_epoch < self._epochs[-1].epoch:
                raise FencedLeaderEpochError(
                    f"append in epoch {leader_epoch} after epoch {self._epochs[-1].epoch}"
                )
            now = self._clock_ms()
            base = self.log_end_offset
            rb.set_base_offset(head, 0, base)
            rb.set_partition_leader_epoch(head, 0, leader_epoch)
            append_time = -1
            if self.config.log_append_time:
                append_time = now
                # Under the CRC: hash the stamped header tail, then the untouched body.
                rb.stamp_log_append_time(head, now, body)
            stored = rb.parse_header(head)
            try:
                self._maybe_roll(stored)
                self._segments[-1].append([head, body], [stored])
                if leader_epoch >= 0 and (
                    not self._epochs or leader_epoch > self._epochs[-1].epoch
                ):
                    self._epochs.append(EpochEntry(leader_epoch, base))
                    self._write_epochs()
            except OSError as exc:  # Segment.append already cut back its own partial write
                raise KafkaStorageError(f"append to {self.directory} failed: {exc}") from exc
            self._note_written(stored.size)
            return AppendInfo(
                base_offset=base,
                last_offset=stored.last_offset,
                records_count=stored.records_count,
                size_bytes=stored.size,
                log_append_time=append_time,
                log_start_offset=self.log_start_offset,
                max_timestamp=stored.max_timestamp,
            )

    def append_replicated(self, batches: bytes | bytearray | memoryview) -> AppendInfo | None:
        """Follower path: store batches that already carry the leader's offsets and epochs.

        Checks framing and CRC of every batch, that the first starts at or above the log end
        offset and each next one at or above where the previous ended (a leader whose log the
        cleaner compacted serves batches with gaps between them, as Kafka's do), and that
        leader epochs never go backwards.

        One exception to "at or above the log end": a log that holds nothing at or above its
        log start offset (log start = log end, e.g. just started there by
        truncate_fully_and_start_at) accepts a first batch that starts below its log end and
        ends above it. A leader whose log start offset lies inside a batch (DeleteRecords)
        serves that whole batch; the log then restarts at the batch's base offset, keeping its
        log start offset (Kafka's follower does the same on UnexpectedAppendOffsetException).
        Returns None for an empty buffer.
        """
        view = memoryview(batches).cast("B")
        headers = [h for _, h in rb.iter_batches(view, verify=True)]
        if not headers:
            return None
        for h in headers:
            if h.size > MAX_BATCH_BYTES:
                raise RecordTooLargeError(f"replicated batch of {h.size} bytes")
            if h.last_offset_delta < 0:
                raise InvalidRecordError(f"lastOffsetDelta {h.last_offset_delta} < 0")
        with self._lock:
            self._check_usable()
            expected = self.log_end_offset
            first = headers[0]
            restart = first.base_offset < expected < first.next_offset and (
                expected == self._log_start_offset
            )
            if restart:
                expected = first.base_offset
            epoch = self._epochs[-1].epoch if self._epochs else UNDEFINED_EPOCH
            for h in headers:
                if h.base_offset < expected:  # gaps are a compacted leader log's
                    raise InvalidRecordError(
                        f"replicated batch at offset {h.base_offset}, below {expected}"
                    )
                if 0 <= h.partition_leader_epoch < epoch:
                    raise InvalidRecordError(
                        f"replicated batch in epoch {h.partition_leader_epoch} after {epoch}"
                    )
                epoch = max(epoch, h.partition_leader_epoch)
                expected = h.next_offset
            pos = 0
            new_epochs = False
            records = 0
            try:
                if restart:
                    self._start_empty_at(first.base_offset)
                    logger.info(
                        "log %s restarts at %d: the leader's batch there holds the log start "
                        "offset %d",
                        self.directory,
                        first.base_offset,
                        self._log_start_offset,
                    )
                for h in headers:
                    # One batch per write keeps rolls exact.
                    self._maybe_roll(h)
                    self._segments[-1].append([view[pos : pos + h.size]], [h])
                    pos += h.size
                    records += h.records_count
                    e = h.partition_leader_epoch
                    if e >= 0 and (not self._epochs or e > self._epochs[-1].epoch):
                        # Invariant: no epoch entry starts below the log start offset.
                        self._epochs.append(
                            EpochEntry(e, max(h.base_offset, self.log_start_offset))
                        )
                        new_epochs = True
            except (OSError, KafkaStorageError) as exc:
                # The batches before the failing one are stored (a contiguous prefix): account
                # for them so a later flush covers them, then report the failure.
                if pos:
                    self._note_written(pos)
                if new_epochs:
                    self._write_epochs()
                raise KafkaStorageError(f"append to {self.directory} failed: {exc}") from exc
            if new_epochs:
                self._write_epochs()
            self._note_written(len(view))
            return AppendInfo(
                base_offset=headers[0].base_offset,
                last_offset=headers[-1].last_offset,
                records_count=records,
                size_bytes=len(view),
                log_append_time=-1,
                log_start_offset=self.log_start_offset,
                max_timestamp=max(h.max_timestamp for h in headers),
            )

    def _maybe_roll(self, header: rb.BatchHeader) -> None:
        """Start a new segment at the log end when the next batch should not join the active
        one (segment.bytes, segment.ms, or int32 relative offsets).

        segment.ms is judged as Kafka does: the incoming batch's maxTimestamp minus the first
        batch's, so replaying old timestamps does not roll on every append. On a compacted log
        max.compaction.lag.ms caps it (KIP-354), so no record stays in the active segment, out
        of the cleaner's reach, for longer.
        """
        active = self._segments[-1]
        if active.size == 0:
            return
        size, records = header.size, header.records_count
        full = active.size + size > self.config.segment_bytes
        segment_ms = self.config.segment_ms
        if self.config.compact:  # KIP-354: a record waits at most max.compaction.lag.ms
            segment_ms = min(segment_ms, self.config.max_compaction_lag_ms)
        aged = header.max_timestamp - active.first_batch_timestamp > segment_ms
        overflow = active.next_offset + records - active.base_offset > MAX_RELATIVE_OFFSET
        if full or aged or overflow:
            self._roll()

    def _roll(self) -> None:
        # 1. Make the old segment and its indexes durable, so that (invariant) only the
        #    active segment can hold unsynced bytes: every write so far is durable.
        old = self._segments[-1]
        try:
            self._fsync(old.fd)
        except OSError as exc:
            self._failure = f"fsync failed: {exc}"  # as in flush: page cache state unknown
            raise
        old.write_index_files()
        self.stats.fsyncs += 1
        self._durable_writes = self._writes
        # 2. Create the new segment and make its directory entry durable.
        new = Segment.create(self.directory, old.next_offset, self.config.index_interval_bytes)
        fsync_directory(self.directory)
        self._segments.append(new)
        self._bases.append(new.base_offset)
        self._cache_inactive(old)
        self.stats.segments_rolled += 1

    def _cache_inactive(self, seg: Segment) -> None:
        """Keep at most MAX_OPEN_INACTIVE_SEGMENTS inactive segments open (LRU)."""
        self._open_inactive[seg.base_offset] = seg
        self._open_inactive.move_to_end(seg.base_offset)
        while len(self._open_inactive) > MAX_OPEN_INACTIVE_SEGMENTS:
            _, evicted = self._open_inactive.popitem(last=False)
            evicted.release()

    def _note_written(self, size: int) -> None:
        """Under _lock: count a write, which the next flush makes durable."""
        self._writes += 1
        self.stats.appends += 1
        self.stats.bytes_appended += size

    def reconfigure(self, config: LogConfig) -> None:
        """Apply changed topic configs (retention, segment size and age, max.message.bytes,
        timestamp type, compaction) from the next operation on, as Kafka applies a dynamic
        topic config change: the data stays as it is (a smaller segment.bytes rolls the
        active segment at its next append; a shorter retention acts at the next check)."""
        with self._lock:
            self.config = config

    def flush(self) -> None:
        """Make every append that returned before this call durable; no fsync when nothing
        was written since the last one.

        Safe to call from another thread while appends go on: the fsync runs outside the
        lock (see the module docstring). After a failed fsync the page cache state is
        unknown: the log refuses all work until it is reopened and recovered.
        """
        try:
            with self._lock:
                self._check_usable()
                target = self._writes
                if self._durable_writes >= target:
                    return
                fd = os.dup(self._segments[-1].fd)
            try:
                self._fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            with self._lock:
                self._failure = f"fsync failed: {exc}"
            raise KafkaStorageError(f"fsync of log {self.directory} failed: {exc}") from exc
        with self._lock:
            self.stats.fsyncs += 1
            self._durable_writes = max(self._durable_writes, target)

    # -- reads ---------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole stored batches, starting with the one that holds ``offset``.

        The first batch may start before ``offset`` (as in Kafka). At least one batch is
        returned even when it is larger than ``max_bytes``; after the first, batches are added
        while the total stays within ``max_bytes``. With ``max_offset`` (the caller's high
        watermark) no batch whose last offset is >= max_offset is returned: batches are never
        split, and on a leader the high watermark always sits on a batch boundary, so this is
        exactly "only records below the high watermark" (a follower whose high watermark
        falls inside a batch serves up to the batch before it). A read at exactly the log end
        offset (or at/above max_offset) returns b"". Every returned batch has passed its
        CRC-32C: corrupt stored bytes raise KafkaStorageError and are never served.
        """
        return b"".join(data for _, _, data in self._collect(offset, max_bytes, max_offset))

    def read_batches(
        self, offset: int, max_bytes: int, max_offset: int | None = None
    ) -> list[bytes | memoryview]:
        """The batches :meth:`read` would return, each on its own, as views of the bytes read
        rather than joined: a caller that re-frames them (a replica's fetch answer) copies each
        batch once, into its message, instead of twice more."""
        return [data for _, _, data in self._collect(offset, max_bytes, max_offset)]

    def read_extents(self, offset: int, max_bytes: int, max_offset: int | None = None) -> Extents:
        """Where the batches :meth:`read` would return lie on disk, for a reader on this machine
        that reads the segment files itself (:mod:`raylog.storage.short_circuit`).

        Only the batch headers are read here; the reader checks the CRCs of what it reads. The
        bytes stay there until retention, compaction or a truncation removes, replaces or cuts
        a segment file, so such a reader also checks that what it read spans exactly
        ``[first_offset, next_offset)`` and falls back to :meth:`read` when it does not.
        """
        return self._walk(offset, max_bytes, max_offset, self._locate_locked, Extents((), -1, -1))

    def _locate_locked(self, offset: int, max_bytes: int, limit: int) -> Extents:
        """:meth:`_read_locked`'s walk over batch headers alone: the same batches, as runs.

        Headers are read through a small window, so a walk over small batches reads each
        window once and one over large batches reads one window per batch."""
        runs: list[tuple[str, int, int]] = []
        total = 0
        first = next_offset = -1
        i = bisect.bisect_right(self._bases, offset) - 1
        seg = self._segment_at(i)
        path = os.path.abspath(seg.log_path)  # absolute: the reader's working directory is its own
        pos = seg.lookup_position(offset)
        window, window_pos = b"", 0
        while True:
            if pos >= seg.size:
                i += 1
                if i >= len(self._segments):
                    break
                seg = self._segment_at(i)
                path = os.path.abspath(seg.log_path)
                pos = 0
                window = b""
                continue
            at = pos - window_pos
            if not window or at < 0 or at + rb.HEADER_SIZE > len(window):
                window, window_pos, at = seg.read(pos, _HEADER_WINDOW), pos, 0
                if len(window) < rb.HEADER_SIZE:
                    raise KafkaStorageError(f"{seg.log_path} truncated under a read at byte {pos}")
            header = rb.parse_header(window, at)
            self._check_stored(seg, pos, header, offset)
            if header.next_offset <= offset:  # before the wanted batch: skip it
                pos += header.size
                continue
            if header.last_offset >= limit or (total and total + header.size > max_bytes):
                break
            if runs and runs[-1][0] == path and runs[-1][1] + runs[-1][2] == pos:
                runs[-1] = (path, runs[-1][1], runs[-1][2] + header.size)
            else:
                runs.append((path, pos, header.size))
            if first < 0:
                first = header.base_offset
            next_offset = header.next_offset
            total += header.size
            pos += header.size
            if total >= max_bytes:
                break
        return Extents(tuple(runs), first, next_offset)

    def _collect(
        self, offset: int, max_bytes: int, max_offset: int | None
    ) -> list[tuple[Segment, int, bytes | memoryview]]:
        """The batches a read returns, each as (segment, position, bytes): :meth:`read`'s rules."""
        return self._walk(offset, max_bytes, max_offset, self._read_locked, [])

    def _walk(
        self,
        offset: int,
        max_bytes: int,
        max_offset: int | None,
        walk: Callable[[int, int, int], _T],
        nothing: _T,
    ) -> _T:
        """``walk(offset, max_bytes, limit)`` under the lock, after a read's checks; ``nothing``
        when no batch can be read below ``max_offset``."""
        if max_bytes < 0:
            raise ValueError(f"max_bytes {max_bytes} < 0")
        with self._lock:
            self._check_usable()
            start, leo = self.log_start_offset, self.log_end_offset
            if offset < start or offset > leo:
                raise OffsetOutOfRangeError(
                    f"offset {offset} outside the log [{start}, {leo}] of {self.directory}"
                )
            limit = leo if max_offset is None else min(max_offset, leo)
            if offset >= limit:
                return nothing
            try:
                return walk(offset, max_bytes, limit)
            except OSError as exc:
                raise KafkaStorageError(f"read of {self.directory} failed: {exc}") from exc

    def _read_locked(
        self, offset: int, max_bytes: int, limit: int
    ) -> list[tuple[Segment, int, bytes | memoryview]]:
        # Views of the chunks read: a caller joins them once (one copy after the read).
        out: list[tuple[Segment, int, bytes | memoryview]] = []
        total = 0
        i = bisect.bisect_right(self._bases, offset) - 1
        seg = self._segment_at(i)
        pos = seg.lookup_position(offset)
        while True:
            if pos >= seg.size:
                i += 1
                if i >= len(self._segments):
                    break
                seg = self._segment_at(i)
                pos = 0
                continue
            # Read what the budget allows (at least a header), then walk whole batches.
            want = max(max_bytes - total, rb.HEADER_SIZE)
            chunk = seg.read(pos, want)
            view = memoryview(chunk)
            at = 0
            done = False
            while len(chunk) - at >= rb.HEADER_SIZE:
                header = rb.parse_header(chunk, at)
                self._check_stored(seg, pos + at, header, offset)
                if header.next_offset <= offset:  # before the wanted batch: skip it
                    at += header.size
                    continue
                if header.last_offset >= limit:
                    done = True
                    break
                if total and total + header.size > max_bytes:
                    done = True
                    break
                if header.size > len(chunk) - at:
                    if at:
                        break  # the chunk began at skipped batches: re-read from this one
                    if total:  # cannot happen (the budget check above), but never split
                        done = True
                        break
                    # The chunk began here with the whole budget, and this first batch is
                    # larger than max_bytes: served whole anyway.
                    data = seg.read(pos + at, header.size)
                    self._verify_stored(seg, pos + at, data, 0, header)
                    out.append((seg, pos + at, data))
                    total += header.size
                    at += header.size
                    done = True
                    break
                self._verify_stored(seg, pos + at, chunk, at, header)
                out.append((seg, pos + at, view[at : at + header.size]))
                total += header.size
                at += header.size
            if done or (total and total >= max_bytes):
                break
            if at == 0 and len(chunk) < rb.HEADER_SIZE:
                raise KafkaStorageError(f"{seg.log_path} truncated under a read at byte {pos}")
            pos += at
        return out

    def _segment_at(self, i: int) -> Segment:
        seg = self._segments[i]
        if seg is not self._segments[-1]:
            self._cache_inactive(seg)
        return seg

    @staticmethod
    def _check_stored(seg: Segment, pos: int, header: rb.BatchHeader, offset: int) -> None:
        if (
            header.magic != rb.MAGIC
            or header.batch_length < rb.MIN_BATCH_LENGTH
            or pos + header.size > seg.size
            or header.last_offset_delta < 0
        ):
            raise KafkaStorageError(
                f"corrupt batch header at byte {pos} of {seg.log_path} (reading offset {offset})"
            )

    @staticmethod
    def _verify_stored(seg: Segment, pos: int, buf: bytes, at: int, header: rb.BatchHeader) -> None:
        if not rb.crc_ok(buf, at, header):
            raise KafkaStorageError(
                f"stored batch at byte {pos} of {seg.log_path} (offset {header.base_offset}) "
                "fails its CRC-32C; not served"
            )

    def offset_for_timestamp(self, timestamp_ms: int) -> TimestampOffset | None:
        """ListOffsets: the first batch whose maxTimestamp >= ``timestamp_ms``.

        Returns (its maxTimestamp, its base offset), or None when no batch is that late.
        Precision is one batch: records are not decoded here, so the offset is the batch's base
        offset (the replica then reads the batch's records for Kafka's record precision).
        Batches wholly below the log start offset are not considered, and a batch holding it
        answers with the log start offset instead of its base offset (Kafka searches from the
        log start offset too).
        -1 (latest) and -2 (earliest) return the log end / start offset with timestamp -1, as
        Kafka does.
        """
        with self._lock:
            self._check_usable()
            if timestamp_ms == LATEST_TIMESTAMP:
                return TimestampOffset(-1, self.log_end_offset)
            if timestamp_ms == EARLIEST_TIMESTAMP:
                return TimestampOffset(-1, self.log_start_offset)
            for i, seg in enumerate(self._segments):
                if seg.size == 0 or seg.max_timestamp < timestamp_ms:
                    continue
                seg = self._segment_at(i)
                pos = seg.lookup_timestamp_position(timestamp_ms)
                while pos < seg.size:
                    header = rb.parse_header(seg.read(pos, rb.HEADER_SIZE))
                    self._check_stored(seg, pos, header, -1)
                    start = self.log_start_offset
                    if header.last_offset >= start and header.max_timestamp >= timestamp_ms:
                        return TimestampOffset(header.max_timestamp, max(header.base_offset, start))
                    pos += header.size
            return None

    def batch_headers(self) -> Iterator[rb.BatchHeader]:
        """Every stored batch's 61-byte header in log order, without reading record bodies.

        For rebuilding state kept from batch headers (a replica's idempotent-producer state) when
        a replica starts. Reads ``HEADER_SCAN_CHUNK_BYTES`` at a time and jumps over the bodies of
        batches larger than that. The lock is held per chunk, not across yields: run it on a
        log nobody appends to or truncates meanwhile (start-up). CRCs are not checked (recovery
        did); a malformed header raises KafkaStorageError.
        """
        with self._lock:
            self._check_usable()
            segments = list(self._segments)
        for seg in segments:
            pos = 0
            while True:
                with self._lock:
                    self._check_usable()
                    size = seg.size
                    if pos >= size:
                        break
                    if seg is not self._segments[-1]:
                        self._cache_inactive(seg)  # bounded open descriptors, as reads do
                    chunk = seg.read(pos, min(HEADER_SCAN_CHUNK_BYTES, size - pos))
                headers: list[rb.BatchHeader] = []
                at = 0
                while len(chunk) - at >= rb.HEADER_SIZE:
                    header = rb.parse_header(chunk, at)
                    self._check_stored(seg, pos + at, header, -1)
                    headers.append(header)
                    at += header.size
                if not headers:
                    raise KafkaStorageError(f"{seg.log_path}: short batch header at byte {pos}")
                pos += at
                yield from headers

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch (KIP-101/279): ``(epoch, end_offset)`` as Kafka answers it.

        - the latest epoch: (epoch, log end offset);
        - an earlier known epoch, or one between known epochs: (the largest known epoch <=
          the requested one, start offset of the first epoch above the requested one);
        - an epoch below every known epoch: (requested epoch, start offset of the first
          known epoch), as Kafka's LeaderEpochFileCache.endOffsetFor does since KIP-279;
        - an epoch above the latest, -1, or an empty cache: (-1, -1) (UNDEFINED).
        """
        with self._lock:
            if epoch == UNDEFINED_EPOCH or not self._epochs:
                return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
            if epoch == self._epochs[-1].epoch:
                return (epoch, self.log_end_offset)
            epochs = [e.epoch for e in self._epochs]
            higher = bisect.bisect_right(epochs, epoch)
            if higher == len(epochs):
                return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
            if higher == 0:
                return (epoch, self._epochs[0].start_offset)
            return (self._epochs[higher - 1].epoch, self._epochs[higher].start_offset)

    # -- truncation, retention, checkpoints ------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; returns the new log end.

        Batches are never split, so the new log end offset is the base offset of the first
        removed batch, which is <= ``offset`` (the replication layer truncates at batch
        boundaries, where the two agree). No-op at or above the log end offset. Raises
        OffsetOutOfRangeError below the log start offset (see truncate_fully_and_start_at).
        When the cut lands below a log start offset inside a batch, the log start offset
        comes down to the new log end (Kafka's ``min(targetOffset, logStartOffset)``), and is
        checkpointed. The result is durable before returning.
        """
        with self._lock:
            self._check_usable()
            if offset >= self.log_end_offset:
                return self.log_end_offset
            if offset < self.log_start_offset:
                raise OffsetOutOfRangeError(
                    f"truncate to {offset} below log start offset {self.log_start_offset}"
                )
            try:
                i = bisect.bisect_right(self._bases, offset) - 1
                seg = self._segments[i]
                cut = self._first_position_at_or_after(seg, offset)
                if cut == 0 and i > 0:
                    i -= 1  # the whole segment goes: its predecessor becomes active
                    seg = self._segments[i]
                    cut = seg.size
                removed = self._segments[i + 1 :]
                del self._segments[i + 1 :]
                del self._bases[i + 1 :]
                self._open_inactive.pop(seg.base_offset, None)
                # Order matters for a crash in between: 1. unlink later segments newest first
                # and make that durable; 2. cut and fsync the new last segment (rescanned: the
                # active segment's in-memory state must be complete). Every crash point then
                # leaves a prefix of the old log, whole segments, which the replication layer
                # truncates again.
                for dead in reversed(removed):
                    self._open_inactive.pop(dead.base_offset, None)
                    dead.delete_files()
                if removed:
                    fsync_directory(self.directory)
                seg.truncate_to_size(cut)
                self._fsync(seg.fd)
                fsync_directory(self.directory)
            except OSError as exc:
                self._failure = f"truncation failed: {exc}"
                raise KafkaStorageError(f"truncate of {self.directory} failed: {exc}") from exc
            self.stats.fsyncs += 1
            self._durable_writes = self._writes
            if self._log_start_offset > self.log_end_offset:
                self._log_start_offset = self.log_end_offset
                self._write_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT, self._log_start_offset)
            self._trim_epochs_and_persist()
            self._high_watermark = min(self._high_watermark, self.log_end_offset)
            self._layout_generation += 1
            if self._first_dirty_offset > self.log_end_offset:
                self._first_dirty_offset = self.log_end_offset
                self._write_cleaner_checkpoint()
            logger.info(
                "log %s truncated to offset %d (asked %d)",
                self.directory,
                self.log_end_offset,
                offset,
            )
            return self.log_end_offset

    def _first_position_at_or_after(self, seg: Segment, offset: int) -> int:
        """Position of the first batch of ``seg`` whose last offset is >= ``offset``."""
        pos = seg.lookup_position(offset)
        while pos < seg.size:
            header = rb.parse_header(seg.read(pos, rb.HEADER_SIZE))
            self._check_stored(seg, pos, header, offset)
            if header.last_offset >= offset:
                return pos
            pos += header.size
        return seg.size

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and start empty at ``offset`` (follower behind the leader's
        log start offset), which is also the new log start offset (checkpointed). The epoch
        cache is cleared; the high watermark becomes ``offset``."""
        with self._lock:
            self._check_usable()
            try:
                # 1. The log start first: a crash after it leaves old segments wholly below
                #    it, which recovery deletes, never a log that starts below ``offset``.
                self._write_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT, offset)
                self._start_empty_at(offset)
            except OSError as exc:
                self._failure = f"truncation failed: {exc}"
                raise KafkaStorageError(f"truncate of {self.directory} failed: {exc}") from exc
            self._log_start_offset = offset
            self._epochs = []
            self._write_epochs()
            self._high_watermark = offset
            self._write_high_watermark(offset)
            self._first_dirty_offset = offset
            self._next_delete_horizon_ms = -1
            self._write_cleaner_checkpoint()

    def _start_empty_at(self, base_offset: int) -> None:
        """Under _lock: replace every segment by one empty segment at ``base_offset``; the
        log start offset is the caller's to set. Raises OSError."""
        for seg in self._segments:
            seg.delete_files()
        self._open_inactive.clear()
        # The old segments are gone for good before the new one exists: a crash never leaves
        # an old segment below the new start (a gap would look like compaction).
        fsync_directory(self.directory)
        new = Segment.create(self.directory, base_offset, self.config.index_interval_bytes)
        fsync_directory(self.directory)
        self._segments = [new]
        self._bases = [base_offset]
        self._layout_generation += 1
        self._durable_writes = self._writes  # nothing left to fsync: no data is left

    def enforce_retention(self, now_ms: int, high_watermark: int | None = None) -> int:
        """Delete whole inactive segments past retention.ms (by their largest timestamp) or
        beyond retention.bytes, oldest first; returns how many were deleted. Only when
        cleanup.policy includes delete. (Segments wholly below the log start offset need no
        check here: advance_log_start and recovery delete them.)

        Never the active segment; with ``high_watermark``, only segments wholly below it
        (uncommitted data is never deleted). The log start offset advances to the base offset
        of the first remaining segment when that is above it.
        """
        with self._lock:
            self._check_usable()
            if not self.config.delete:
                return 0  # cleanup.policy=compact: the cleaner, not retention, shrinks it
            deleted = self._delete_retained_segments(now_ms, high_watermark)
            if deleted:
                self._after_head_deleted(deleted)
            return deleted

    def _delete_retained_segments(self, now_ms: int, high_watermark: int | None) -> int:
        """Under _lock: retention.ms / retention.bytes; returns segments deleted."""
        total = sum(s.size for s in self._segments)
        deleted = 0
        while len(self._segments) > 1:
            seg = self._segments[0]
            end = self._segments[1].base_offset
            if high_watermark is not None and end > high_watermark:
                break
            expired = (
                self.config.retention_ms >= 0
                and now_ms - seg.max_timestamp > self.config.retention_ms
            )
            oversized = (
                self.config.retention_bytes >= 0 and total - seg.size >= self.config.retention_bytes
            )
            if not (expired or oversized):
                break
            self._delete_first_segment()
            total -= seg.size
            deleted += 1
        self._log_start_offset = max(self._log_start_offset, self._segments[0].base_offset)
        return deleted

    def _delete_segments_below_log_start(self) -> int:
        """Under _lock (or in recovery): delete the segments wholly below the log start offset
        (the next one starts at or below it); returns how many. The caller fsyncs the
        directory."""
        deleted = 0
        while len(self._segments) > 1 and self._segments[1].base_offset <= self._log_start_offset:
            self._delete_first_segment()
            deleted += 1
        return deleted

    def _delete_first_segment(self) -> None:
        # Order: leave the in-memory log first, then unlink (a crash in between leaves either
        # a whole old segment, or index files that open() removes).
        seg = self._segments.pop(0)
        self._bases.pop(0)
        self._open_inactive.pop(seg.base_offset, None)
        try:
            seg.delete_files()
        except OSError as exc:
            raise KafkaStorageError(f"deleting {seg.log_path} failed: {exc}") from exc

    def _after_head_deleted(self, deleted: int) -> None:
        """Under _lock, after segments left the head of the log: make the unlinks durable,
        let a cleaning pass that read them give up, and move the epoch cache and the high
        watermark up to the log start offset."""
        fsync_directory(self.directory)
        self._layout_generation += 1
        self.stats.segments_deleted += deleted
        self._trim_epochs_and_persist()
        self._high_watermark = max(self._high_watermark, self.log_start_offset)
        logger.info(
            "log %s deleted %d segment(s) at its head; log start offset %d",
            self.directory,
            deleted,
            self.log_start_offset,
        )

    def _trim_epochs_and_persist(self) -> None:
        before = list(self._epochs)
        self._trim_epochs()
        if self._epochs != before:
            self._write_epochs()

    def advance_log_start(self, offset: int, high_watermark: int) -> int:
        """Move the log start offset up to ``offset`` (Kafka's maybeIncrementLogStartOffset:
        DeleteRecords on a leader, or a follower adopting its leader's log start offset), and
        delete the segments wholly below it. Never moves it backwards (then a no-op). Returns
        the log start offset.

        Raises OffsetOutOfRangeError when ``offset`` is above ``high_watermark`` (the caller's,
        which the log does not track) or the log end offset: only committed data goes.

        Order, for a crash at any point: 1. the checkpoint (atomic, fsync'd): from here on the
        offsets below are gone, whatever files remain; 2. when the whole log is below the new
        start, roll, so that the active segment is empty and the old one can go (as Kafka rolls
        before retention deletes every segment); 3. unlink the segments wholly below (recovery
        does it again if a crash interrupts it).
        """
        with self._lock:
            self._check_usable()
            leo = self.log_end_offset
            if offset > min(high_watermark, leo):
                raise OffsetOutOfRangeError(
                    f"log start offset {offset} above the high watermark {high_watermark} "
                    f"or the log end offset {leo} of {self.directory}"
                )
            if offset <= self._log_start_offset:
                return self._log_start_offset
            try:
                self._write_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT, offset)
                self._log_start_offset = offset
                if offset == leo and self._segments[-1].size:
                    self._roll()
                deleted = self._delete_segments_below_log_start()
                if deleted:
                    self._after_head_deleted(deleted)
                else:
                    self._trim_epochs_and_persist()
                    self._high_watermark = max(self._high_watermark, offset)
            except OSError as exc:
                self._failure = f"advancing the log start offset failed: {exc}"
                raise KafkaStorageError(
                    f"advancing the log start offset of {self.directory} failed: {exc}"
                ) from exc
            logger.info("log %s: log start offset now %d", self.directory, offset)
            return offset

    def checkpoint_high_watermark(self, high_watermark: int) -> None:
        """Persist the high watermark (atomically, fsync'd); clamped to the log."""
        with self._lock:
            self._check_usable()
            hw = min(max(high_watermark, self.log_start_offset), self.log_end_offset)
            self._write_high_watermark(hw)
            self._high_watermark = hw

    def _write_high_watermark(self, hw: int) -> None:
        self._write_offset_checkpoint(HIGH_WATERMARK_CHECKPOINT, hw)

    # -- compaction (the log cleaner) -------------------------------------------------------------

    def _load_cleaner_checkpoint(self) -> None:
        path = self.directory / CLEANER_CHECKPOINT
        first_dirty, horizon = 0, -1
        try:
            version, first, next_horizon = path.read_text().split("\n")[:3]
            if int(version) != CHECKPOINT_VERSION:
                raise ValueError(f"version {version}")
            first_dirty, horizon = int(first), int(next_horizon)
        except FileNotFoundError:
            pass
        except ValueError as exc:
            logger.warning("ignoring unreadable %s: %s", path, exc)
        self._first_dirty_offset = min(max(first_dirty, self.log_start_offset), self.log_end_offset)
        self._next_delete_horizon_ms = horizon

    def _write_cleaner_checkpoint(self) -> None:
        text = f"{CHECKPOINT_VERSION}\n{self._first_dirty_offset}\n{self._next_delete_horizon_ms}\n"
        write_file_atomically(self.directory / CLEANER_CHECKPOINT, text.encode())
        fsync_directory(self.directory)

    @property
    def uncleanable(self) -> str | None:
        """Why the cleaner gave up on this log (corrupt bytes), None while it is cleanable."""
        return self._uncleanable

    @property
    def first_dirty_offset(self) -> int:
        """The cleaner checkpoint: offsets below it were compacted by an earlier pass."""
        return self._first_dirty_offset

    def _clean_plan(self, now_ms: int, high_watermark: int, force: bool) -> _CleanPlan | None:
        """Under _lock: which segments a pass would clean, or None when it is not due.

        Cleanable: inactive segments wholly below the high watermark and, with
        min.compaction.lag.ms, whose newest record is at least that old. Due when the dirty
        part is at least min.cleanable.dirty.ratio of the cleanable bytes, when its oldest
        segment is older than max.compaction.lag.ms, or when a kept tombstone's delete horizon
        has passed.
        """
        config = self.config
        if not config.compact or self._failure or self._closed or self._uncleanable:
            return None
        segs = self._segments
        count = 0
        for i in range(len(segs) - 1):
            if segs[i + 1].base_offset > high_watermark:
                break
            if config.min_compaction_lag_ms and (
                now_ms - segs[i].max_timestamp < config.min_compaction_lag_ms
            ):
                break
            count = i + 1
        if not count:
            return None
        cut = segs[count].base_offset
        dirty_index, dirty, clean = self._dirty_part(count)
        due = (
            force
            or (dirty and dirty / (dirty + clean) >= config.min_cleanable_dirty_ratio)
            or (
                dirty_index < count
                and now_ms - segs[dirty_index].max_timestamp > config.max_compaction_lag_ms
            )
            or 0 <= self._next_delete_horizon_ms <= now_ms
        )
        if not due:
            return None
        return _CleanPlan(
            targets=list(segs[:count]),
            sizes=[seg.size for seg in segs[:count]],
            dirty_index=dirty_index,
            cut=cut,
            later=[(seg.log_path, seg.size) for seg in segs[count:]],
            generation=self._layout_generation,
        )

    def _dirty_part(self, count: int) -> tuple[int, int, int]:
        """Under _lock, for the first ``count`` segments: the index of the first dirty one,
        the dirty bytes and the clean bytes."""
        segs = self._segments
        cut = segs[count].base_offset if count < len(segs) else self.log_end_offset
        first_dirty = min(max(self._first_dirty_offset, self.log_start_offset), cut)
        dirty_index = min(bisect.bisect_right(self._bases, first_dirty) - 1, count)
        dirty = sum(seg.size for seg in segs[dirty_index:count])
        clean = sum(seg.size for seg in segs[:dirty_index])
        return dirty_index, dirty, clean

    def dirty_ratio(self) -> float:
        """The share of the closed segments' bytes not cleaned yet (Kafka's max-dirty-percent,
        per log, as a ratio); 0.0 for a log that is not compacted or has no closed segment."""
        with self._lock:
            if not self.config.compact or len(self._segments) < 2:
                return 0.0
            _, dirty, clean = self._dirty_part(len(self._segments) - 1)
            return dirty / (dirty + clean) if dirty + clean else 0.0

    def cleaning_due(self, now_ms: int, high_watermark: int) -> bool:
        """Whether :meth:`clean` would run a pass now (cheap: sizes and timestamps only)."""
        with self._lock:
            return self._clean_plan(now_ms, high_watermark, force=False) is not None

    def clean(
        self,
        now_ms: int,
        high_watermark: int,
        *,
        force: bool = False,
        max_map_entries: int = cleaner.MAX_OFFSET_MAP_ENTRIES,
        runner: RewriteRunner | None = None,
    ) -> CleanResult | None:
        """Compact the log (cleanup.policy=compact): one pass of Kafka's log cleaner.

        Builds the offset map from the dirty part, rewrites every cleanable segment into
        ``.cleaned`` files (consecutive segments merged up to segment.bytes) without holding
        the log's lock, then swaps them in under it. Appends, reads and fsyncs go on during
        the rewrite; a truncation or retention meanwhile makes the pass give up (nothing
        swapped). ``runner`` runs the rewrite (:func:`rewrite_segments`, files only) elsewhere,
        e.g. in a child process so that its Python work does not hold this process's GIL;
        by default it runs in the calling thread. Returns what it did, or None when no pass
        was due (``force``: run anyway if anything is cleanable). See
        :mod:`raylog.storage.cleaner` for the rules.

        Crash safety of a swap, per merged group with base offset B: 1. B's index files are
        unlinked; 2. the ``B.log.<token>.cleaned`` file (fsync'd) is renamed over ``B.log``,
        the directory fsync'd: the commit point; 3. the group's other segments are unlinked;
        4. B's index files are written. Recovery deletes ``.cleaned`` files, and a segment
        starting below where the one before it ends is one that step 3 did not reach. (One
        starting past the cleaned segment's last batch survives: it holds only records this
        pass removed, superseded ones, which read before their newer values and go at the
        next pass.) Offsets never change, so a crash at any point leaves every offset
        readable.
        """
        if not self._cleaning.acquire(blocking=False):
            return None  # another pass is running
        try:
            with self._lock:
                self._check_usable()
                plan = self._clean_plan(now_ms, high_watermark, force)
                config = self.config
            if plan is None:
                return None
            try:
                return self._clean(plan, config, now_ms, max_map_entries, runner)
            except (CorruptRecordError, UnsupportedCompressionTypeError, KafkaStorageError) as exc:
                if self._failure is not None or self._closed:
                    raise
                # Bytes the cleaner cannot read (reads of them fail too): as Kafka marks such a
                # partition uncleanable, this log is not cleaned again until it is reopened.
                self._uncleanable = str(exc)
                logger.error("log %s is uncleanable until it is reopened: %s", self.directory, exc)
                return None
            except FileNotFoundError:
                # Retention or a truncation removed a segment this pass was reading.
                logger.info("log %s: cleaning pass abandoned (segment gone)", self.directory)
                return None
            except OSError as exc:
                raise KafkaStorageError(f"cleaning {self.directory} failed: {exc}") from exc
        finally:
            self._cleaning.release()

    def _clean(
        self,
        plan: _CleanPlan,
        config: LogConfig,
        now_ms: int,
        max_map_entries: int,
        runner: RewriteRunner | None,
    ) -> CleanResult | None:
        job = RewriteJob(
            directory=self.directory,
            segments=[
                (seg.base_offset, seg.log_path, size)
                for seg, size in zip(plan.targets, plan.sizes, strict=True)
            ],
            dirty_index=plan.dirty_index,
            cut=plan.cut,
            later=plan.later,
            config=config,
            now_ms=now_ms,
            max_map_entries=max_map_entries,
            token=os.urandom(6).hex(),
        )
        # Phases 1-3 read and write files only: inline, or wherever ``runner`` runs them.
        out = rewrite_segments(job, self._fsync) if runner is None else runner(job)
        try:
            if out.failure is not None:
                # Only new files were written (a full disk, say): the log is untouched and
                # keeps serving; the next pass tries again.
                logger.warning(
                    "log %s: cleaning pass failed, nothing changed: %s", self.directory, out.failure
                )
                return None
            targets, sizes = plan.targets[: out.count], plan.sizes[: out.count]
            # 4. Swap in, under the lock, unless the segment list changed meanwhile.
            with self._lock:
                self._check_usable()
                if (
                    self._layout_generation != plan.generation
                    or self._segments[: len(targets)] != targets
                    or any(seg.size != size for seg, size in zip(targets, sizes, strict=True))
                ):
                    logger.info("log %s: cleaning pass abandoned (log changed)", self.directory)
                    return None
                try:
                    self._swap_cleaned(out.groups, len(targets), out.cut)
                except OSError as exc:
                    # The directory is between states a crash could leave: recovery settles
                    # it, so the log stops serving until it is reopened.
                    self._failure = f"cleaner swap failed: {exc}"
                    raise
                self._first_dirty_offset = out.cut
                self._next_delete_horizon_ms = out.horizon
                self._write_cleaner_checkpoint()
                self.stats.cleanings += 1
                self.stats.records_cleaned += out.removed
                after = sum(seg.size for seg in self._segments[: len(out.groups)])
        finally:
            for group in out.groups:
                group.path.unlink(missing_ok=True)  # gone already when swapped in
        result = CleanResult(
            first_dirty_offset=job.segments[plan.dirty_index][0]
            if plan.dirty_index < out.count
            else out.cut,
            end_offset=out.cut,
            segments_before=len(targets),
            segments_after=len(out.groups),
            bytes_before=sum(sizes),
            bytes_after=after,
            records_removed=out.removed,
        )
        logger.info(
            "log %s cleaned offsets below %d: %d segment(s) of %d bytes -> %d of %d bytes, "
            "%d record(s) removed",
            self.directory,
            out.cut,
            result.segments_before,
            result.bytes_before,
            result.segments_after,
            result.bytes_after,
            out.removed,
        )
        return result

    def _swap_cleaned(self, groups: list[_CleanedGroup], count: int, cut: int) -> None:
        """Under _lock: replace the first ``count`` segments by the cleaned groups."""
        interval = self.config.index_interval_bytes
        old = self._segments[:count]
        new: list[Segment] = []
        for group in groups:
            first = old[group.members.start]
            for seg in (old[i] for i in group.members):
                self._open_inactive.pop(seg.base_offset, None)
                seg.release()
            first.index_path.unlink(missing_ok=True)
            first.timeindex_path.unlink(missing_ok=True)
            fsync_directory(self.directory)
            os.replace(group.path, first.log_path)  # the commit point of this group
            fsync_directory(self.directory)
            for seg in (old[i] for i in group.members if i != group.members.start):
                seg.delete_files()
            fsync_directory(self.directory)
            seg = Segment(self.directory, group.base, interval)
            seg.adopt(group.headers, group.size)
            seg.write_index_files()
            seg.release()
            new.append(seg)
        fsync_directory(self.directory)
        for seg, following in zip(new, new[1:] + self._segments[count : count + 1], strict=True):
            seg.next_offset = following.base_offset
        self._segments[:count] = new
        self._bases[:count] = [seg.base_offset for seg in new]
        self._layout_generation += 1

    def close(self) -> None:
        """Flush, write the active segment's indexes, release every descriptor. Idempotent."""
        if self._closed:
            return
        try:
            if self._failure is None:
                self.flush()
        except RaylogError:
            pass  # closing a failed log still releases its descriptors
        with self._lock:
            try:
                if self._failure is None:
                    self._segments[-1].write_index_files()
            except OSError as exc:
                logger.warning("log %s: index write on close failed: %s", self.directory, exc)
            for seg in self._segments:
                seg.release()
            self._open_inactive.clear()
            self._closed = True

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "HIGH_WATERMARK_CHECKPOINT",
    "LEADER_EPOCH_CHECKPOINT",
    "MAX_BATCH_BYTES",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "AppendInfo",
    "EpochEntry",
    "Log",
    "LogConfig",
    "LogStats",
    "TimestampOffset",
]
