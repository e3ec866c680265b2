"""The :class:`Log` of one partition replica: its public operations and its lock. Each
operation's work is done by the module of its concern (see the package docstring), on the
state they share (:class:`~raylog.storage.log.state.LogState`).

Durability. Appends write to the page cache and return; :meth:`Log.flush` makes everything
appended so far durable. When to flush (flush.messages, flush.ms, group commit) is the owner's
policy: a replica's, not the log's. Invariant: every segment but the active one is fsync'd (a
roll fsyncs the old segment with its index files before creating the new one), so one fsync of
the active segment makes every earlier write durable. That fsync runs outside ``_lock``, on a
duplicate of the active segment's descriptor (a roll or truncation meanwhile cannot close it
under the fsync), so appends go on during it; they are covered by the next flush.

Damage. A read that meets a stored batch failing its checks (reads.py) raises
:class:`DamagedBatchError` and records the damage first (the damage checkpoint, see
checkpoints.py): the next :meth:`Log.open` cuts the log there, and :attr:`Log.damage` tells the
owner what it must fetch again before it holds every committed record (recovery.py, step 5).

Thread safety. Every operation holds ``_lock``, reads too (so a truncation never shrinks a
file under a read); a read costs a pread and a CRC pass, never an fsync. A cleaning pass holds
it only to plan and to swap its files in.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from raylog.storage import batch as rb
from raylog.storage.errors import (
    CorruptRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RaylogError,
    UnsupportedCompressionTypeError,
)
from raylog.storage.log import (
    appends,
    checkpoints,
    compaction,
    reads,
    retention,
    snapshots,
    truncation,
    txnindex,
)
from raylog.storage.log.appends import AppendInfo
from raylog.storage.log.checkpoints import HIGH_WATERMARK_CHECKPOINT, Damage
from raylog.storage.log.cleaner import MAX_OFFSET_MAP_ENTRIES
from raylog.storage.log.config import LogConfig
from raylog.storage.log.epochs import EpochEntry
from raylog.storage.log.reads import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    DamagedBatchError,
    Extents,
    TimestampOffset,
)
from raylog.storage.log.recovery import recover
from raylog.storage.log.rewrite import RewriteRunner, Rewritten, rewrite_segments
from raylog.storage.log.segment_list import ClosedSegment, SegmentList
from raylog.storage.log.state import LogState, LogStats
from raylog.storage.log.txnindex import AbortedTxn

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Log:
    """One partition replica's write-ahead log in its own directory. Thread-safe."""

    def __init__(
        self, state: LogState, clock_ms: Callable[[], int], damage: Damage | None = None
    ) -> None:
        # Use Log.open().
        self._state = state
        self._damage = damage
        self._damage_in_log = False  # a read found damage that is still in the segments
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._closed = False
        self._cleaning = threading.Lock()  # one cleaning pass at a time
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

        ``clock_ms`` (LogAppendTime) and ``fsync`` (every fsync of segment data, given a file
        descriptor) are injectable for tests and simulation.
        """
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        try:
            state, damage = recover(path, config or LogConfig(), fsync)
        except OSError as exc:
            raise KafkaStorageError(f"cannot open log {path}: {exc}") from exc
        return cls(state, clock_ms, damage)

    # -- state ---------------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._state.directory

    @property
    def config(self) -> LogConfig:
        return self._state.config

    @property
    def stats(self) -> LogStats:
        return self._state.stats

    @property
    def log_start_offset(self) -> int:
        """The first offset served (see retention.py); may lie inside a segment. Offsets below
        it are never served (OffsetOutOfRangeError), even where their bytes still sit in the
        first segment. With tiered storage, the first offset held locally (Kafka's
        localLogStartOffset); the offsets below it may be remote."""
        return self._state.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._state.log_end_offset

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._state.segments.size_bytes

    @property
    def segment_count(self) -> int:
        return len(self._state.segments)

    @property
    def high_watermark(self) -> int:
        """The last checkpointed (or recovered) high watermark, clamped to the log."""
        return self._state.high_watermark

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch in the cache, UNDEFINED_EPOCH (-1) when empty."""
        with self._lock:
            return self._state.epochs.latest_epoch

    @property
    def epoch_entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._state.epochs.entries)

    @property
    def damage(self) -> Damage | None:
        """Data this log lost or holds damaged (recovery.py, step 5), None when it holds
        every record it had: until :meth:`clear_damage`, the replica lacks committed records
        below ``repair_offset`` and must not lead. A damage found by a read since the log was
        opened is still in the log (``cut_offset`` below the log end): the log is cut there
        when next opened."""
        return self._damage

    @property
    def holds_damage(self) -> bool:
        """Whether a read found damage still in the segments (cut when the log is reopened)."""
        return self._damage_in_log

    def record_damage(self, cut_offset: int, repair_offset: int) -> Damage:
        """Record damaged data from ``cut_offset`` on, committed up to ``repair_offset``
        (merged with what is recorded already), durably; returns the damage now recorded."""
        with self._lock:
            return self._record_damage(cut_offset, repair_offset)

    def _record_damage(self, cut_offset: int, repair_offset: int) -> Damage:
        damage = Damage(cut_offset, max(repair_offset, self._state.high_watermark))
        damage = damage.merged(self._damage)
        if damage != self._damage:
            checkpoints.write_damage(self.directory, damage)
            self._damage = damage
        self._damage_in_log = True
        return damage

    def clear_damage(self) -> bool:
        """Forget the damage once the log holds what it lost again: the damaged data gone
        (cut when the log was opened) and the log ending at or above the repair offset.
        Returns whether it is clear (False: not repaired yet)."""
        with self._lock:
            damage = self._damage
            if damage is None:
                return True
            end = self.log_end_offset
            if self._damage_in_log or damage.repair_offset > end:
                return False
            checkpoints.write_damage(self.directory, None)
            self._damage = None
        logger.info("log %s repaired: it holds every offset below %d", self.directory, end)
        return True

    def _check_usable(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"log {self.directory} is closed")
        if self._state.failure is not None:
            raise KafkaStorageError(f"log {self.directory} failed: {self._state.failure}")

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
        with self._lock:
            self._check_usable()
            return appends.append(self._state, view, leader_epoch, self._clock_ms())

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
        Returns None for an empty buffer; never fsyncs the data (see :meth:`flush`).
        """
        view = memoryview(batches).cast("B")
        headers = appends.replicated_headers(view)
        if not headers:
            return None
        with self._lock:
            self._check_usable()
            return appends.append_replicated(self._state, view, headers)

    def reconfigure(self, config: LogConfig) -> None:
        """Apply changed topic configs (retention, segment size and age, max.message.bytes,
        timestamp type, compaction) from the next operation on, as Kafka applies a dynamic
        topic config change: the data stays as it is (a smaller segment.bytes rolls the
        active segment at its next append; a shorter retention acts at the next check)."""
        with self._lock:
            self._state.config = config

    def flush(self) -> None:
        """Make every append that returned before this call durable; no fsync when nothing
        was written since the last one.

        Safe to call from another thread while appends go on: the fsync runs outside the
        lock (see the module docstring). After a failed fsync the log refuses all work.
        """
        state = self._state
        try:
            with self._lock:
                self._check_usable()
                target = state.writes
                if state.durable_writes >= target:
                    return
                fd = os.dup(state.segments.active.fd)
            try:
                state.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            with self._lock:
                raise state.failed("fsync", exc) from exc
        with self._lock:
            state.stats.fsyncs += 1
            state.durable_writes = max(state.durable_writes, target)

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
        return b"".join(self.read_batches(offset, max_bytes, max_offset))

    def read_batches(
        self, offset: int, max_bytes: int, max_offset: int | None = None
    ) -> list[bytes | memoryview]:
        """The batches :meth:`read` would return, each on its own, as views of the bytes read
        rather than joined: a caller that re-frames them (a replica's fetch answer) copies each
        batch once, into its message, instead of twice more."""
        return self._walk(offset, max_bytes, max_offset, reads.collect, [])

    def read_extents(self, offset: int, max_bytes: int, max_offset: int | None = None) -> Extents:
        """Where the batches :meth:`read` would return lie on disk, for a reader on this machine
        that reads the segment files itself (:mod:`raylog.storage.short_circuit`).

        Only the batch headers are read here; the reader checks the CRCs of what it reads. The
        bytes stay there until retention, compaction or a truncation removes, replaces or cuts
        a segment file, so such a reader also checks that what it read spans exactly
        ``[first_offset, next_offset)`` and falls back to :meth:`read` when it does not.
        """
        return self._walk(offset, max_bytes, max_offset, reads.locate, Extents((), -1, -1))

    def _walk(
        self,
        offset: int,
        max_bytes: int,
        max_offset: int | None,
        walk: Callable[[SegmentList, int, int, int], _T],
        nothing: _T,
    ) -> _T:
        """``walk(segments, offset, max_bytes, limit)`` under the lock, after a read's checks;
        ``nothing`` when no batch can be read below ``max_offset``."""
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
                return walk(self._state.segments, offset, max_bytes, limit)
            except DamagedBatchError as exc:
                self._record_damage(exc.offset, exc.offset)
                raise
            except OSError as exc:
                raise KafkaStorageError(f"read of {self.directory} failed: {exc}") from exc

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
            try:
                return reads.offset_for_timestamp(
                    self._state.segments, self.log_start_offset, timestamp_ms
                )
            except DamagedBatchError as exc:
                self._record_damage(exc.offset, exc.offset)
                raise

    def max_timestamp_batch(self) -> TimestampOffset | None:
        """ListOffsets' MAX_TIMESTAMP: (the largest maxTimestamp of a batch at or above the log
        start offset, that batch's base offset or the log start offset), the first such batch;
        None when the log holds no batch (``reads.max_timestamp_batch``)."""
        with self._lock:
            self._check_usable()
            try:
                return reads.max_timestamp_batch(self._state.segments, self.log_start_offset)
            except DamagedBatchError as exc:
                self._record_damage(exc.offset, exc.offset)
                raise

    def batch_headers(self) -> Iterator[rb.BatchHeader]:
        """Every stored batch's 61-byte header in log order, without reading record bodies.

        Reads ``reads.HEADER_SCAN_CHUNK_BYTES`` at a time and jumps over the bodies of batches
        larger than that. The lock is held per chunk, not across yields: run it on a log
        nobody appends to or truncates meanwhile (start-up). CRCs are not checked (recovery
        did); a malformed header raises KafkaStorageError.
        """
        for header, _ in self._walk_headers(markers=False):
            yield header

    def producer_batch_headers(
        self, from_offset: int = 0
    ) -> Iterator[tuple[rb.BatchHeader, rb.EndTxnMarker | None]]:
        """The headers of the batches of idempotent and transactional producers (producerId
        >= 0) whose base offset is at or above ``from_offset``, each with its transaction
        marker when it is one: what a replica rebuilds its producer and transaction state from
        when it starts (from a snapshot's offset: see :meth:`write_producer_snapshot`). As
        :meth:`batch_headers`, from the segment holding ``from_offset`` (its offset index
        finds where to start); a marker's body (its one record) is read too."""
        for header, marker in self._walk_headers(markers=True, from_offset=from_offset):
            if header.producer_id >= 0 and header.base_offset >= from_offset:
                yield header, marker

    def _walk_headers(
        self, *, markers: bool, from_offset: int = 0
    ) -> Iterator[tuple[rb.BatchHeader, rb.EndTxnMarker | None]]:
        with self._lock:
            self._check_usable()
            first = max(0, self._state.segments.index_of(from_offset))
            segments = list(self._state.segments)[first:]
            start_pos = segments[0].lookup_position(from_offset) if from_offset else 0
        for seg in segments:
            pos, start_pos = start_pos, 0
            while True:
                with self._lock:
                    self._check_usable()
                    size = seg.size
                    if pos >= size:
                        break
                    self._state.segments.touch(seg)  # bounded open descriptors, as reads do
                    chunk = seg.read(pos, min(reads.HEADER_SCAN_CHUNK_BYTES, size - pos))
                    headers, used = reads.chunk_headers(seg, pos, chunk, markers=markers)
                pos += used
                yield from headers

    # -- aborted transactions (the .txnindex files) ---------------------------------------------

    def append_aborted_txn(self, entry: AbortedTxn) -> None:
        """Index an aborted transaction whose ABORT marker (at ``entry.last_offset``) was just
        appended, in the ``.txnindex`` of the marker's segment (see txnindex.py). Written, not
        fsync'd: a roll makes it durable with its segment, and a replica restores the
        indexes from its log when it starts (:meth:`restore_aborted_txns`)."""
        with self._lock:
            self._check_usable()
            if not self.log_start_offset <= entry.last_offset < self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"aborted transaction marker {entry.last_offset} outside the log "
                    f"[{self.log_start_offset}, {self.log_end_offset}) of {self.directory}"
                )
            try:
                txnindex.append_aborted(self._state.segments, entry)
            except OSError as exc:
                raise KafkaStorageError(f"txnindex of {self.directory}: {exc}") from exc

    def aborted_txns(self, start_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [start_offset, upper_offset) (Kafka's
        collectAbortedTransactions: marker at or above the start, first offset below the
        bound), in marker order, from the ``.txnindex`` files."""
        with self._lock:
            self._check_usable()
            try:
                return txnindex.collect_aborted(self._state.segments, start_offset, upper_offset)
            except OSError as exc:
                raise KafkaStorageError(f"txnindex of {self.directory}: {exc}") from exc

    def restore_aborted_txns(self, from_offset: int, entries: Iterable[AbortedTxn]) -> int:
        """Make the ``.txnindex`` files hold exactly ``entries`` for the markers at or above
        ``from_offset`` (what the caller rebuilt from the batches there), rewriting only the
        files that differ (missing entries a crash lost, a bad file); returns how many."""
        with self._lock:
            self._check_usable()
            try:
                rewritten = txnindex.restore(self._state.segments, from_offset, entries)
            except OSError as exc:
                raise KafkaStorageError(f"txnindex of {self.directory}: {exc}") from exc
        if rewritten:
            logger.info("log %s: %d txnindex file(s) restored", self.directory, rewritten)
        return rewritten

    # -- producer-state snapshots (snapshots.py) ------------------------------------------------

    def write_producer_snapshot(
        self, offset: int, data: bytes, keep: int = snapshots.SNAPSHOTS_KEPT_DEFAULT
    ) -> None:
        """Store a producer-state snapshot (opaque bytes) taken when the log ended at
        ``offset``, durably, keeping the ``keep`` newest. The caller takes it only of state
        whose batches are durable. Raises OffsetOutOfRangeError outside [log start, log end].
        """
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        with self._lock:
            self._check_usable()
            if not self.log_start_offset <= offset <= self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"snapshot at {offset} outside the log [{self.log_start_offset}, "
                    f"{self.log_end_offset}] of {self.directory}"
                )
            try:
                snapshots.write(self.directory, offset, data, keep)
            except OSError as exc:
                raise KafkaStorageError(f"snapshot of {self.directory}: {exc}") from exc

    def producer_snapshot_offsets(self) -> list[int]:
        """The offsets of the stored producer-state snapshots, newest first."""
        with self._lock:
            self._check_usable()
            try:
                return snapshots.list_offsets(self.directory)[::-1]
            except OSError as exc:
                raise KafkaStorageError(f"snapshots of {self.directory}: {exc}") from exc

    def read_producer_snapshot(self, offset: int) -> bytes | None:
        """The bytes of the snapshot at ``offset`` (None: gone, or too large to read)."""
        with self._lock:
            self._check_usable()
            try:
                return snapshots.read(self.directory, offset)
            except OSError as exc:
                raise KafkaStorageError(f"snapshot of {self.directory}: {exc}") from exc

    def delete_producer_snapshot(self, offset: int) -> None:
        """Delete the snapshot at ``offset`` (its owner found it does not load)."""
        with self._lock:
            self._check_usable()
            try:
                snapshots.delete(self.directory, offset)
            except OSError as exc:
                raise KafkaStorageError(f"snapshot of {self.directory}: {exc}") from exc

    def closed_segments(self) -> list[ClosedSegment]:
        """The closed segments, oldest first, with their files (what tiered storage copies)."""
        with self._lock:
            self._check_usable()
            return self._state.segments.closed()

    @property
    def active_segment_size_bytes(self) -> int:
        with self._lock:
            return self._state.segments.active.size

    @property
    def active_segment_base_offset(self) -> int:
        """Where the active segment starts: it moves up when the log rolls."""
        with self._lock:
            return self._state.segments.active.base_offset

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch (KIP-101/279): ``(epoch, end_offset)`` as Kafka answers it
        (see :meth:`LeaderEpochCache.end_offset_for`)."""
        with self._lock:
            return self._state.epochs.end_offset_for(epoch, self.log_end_offset)

    # -- truncation, log start offset, retention, checkpoints ------------------------------------

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
            return truncation.truncate_to(self._state, offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and start empty at ``offset`` (follower behind the leader's
        log start offset), which is also the new log start offset (checkpointed). The epoch
        cache is cleared; the high watermark becomes ``offset``."""
        with self._lock:
            self._check_usable()
            truncation.truncate_fully_and_start_at(self._state, offset)

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
            return retention.enforce_retention(self._state, now_ms, high_watermark)

    def delete_local_segments(self, count: int, high_watermark: int) -> int:
        """Tiered storage: delete the ``count`` oldest closed segments (fewer when one is not
        wholly below ``high_watermark``), which the caller found copied to the object store
        and past local retention; returns how many were deleted. The log start offset (here
        the local one, Kafka's localLogStartOffset: see retention.py) moves to the base
        offset of the first segment left, as after retention."""
        with self._lock:
            self._check_usable()
            return retention.delete_local_segments(self._state, count, high_watermark)

    def advance_log_start(self, offset: int, high_watermark: int) -> int:
        """Move the log start offset up to ``offset`` (Kafka's maybeIncrementLogStartOffset:
        DeleteRecords on a leader, or a follower adopting its leader's log start offset), and
        delete the segments wholly below it. Never moves it backwards (then a no-op). Returns
        the log start offset.

        Raises OffsetOutOfRangeError when ``offset`` is above ``high_watermark`` (the caller's,
        which the log does not track) or the log end offset: only committed data goes.

        See retention.py for the order of its steps, which a crash at any point leaves safe.
        """
        with self._lock:
            self._check_usable()
            return retention.advance_log_start(self._state, offset, high_watermark)

    def checkpoint_high_watermark(self, high_watermark: int) -> None:
        """Persist the high watermark (atomically, fsync'd); clamped to the log."""
        with self._lock:
            self._check_usable()
            hw = min(max(high_watermark, self.log_start_offset), self.log_end_offset)
            checkpoints.write_offset(self.directory, HIGH_WATERMARK_CHECKPOINT, hw)
            self._state.high_watermark = hw

    # -- compaction (the log cleaner) -------------------------------------------------------------

    @property
    def uncleanable(self) -> str | None:
        """Why the cleaner gave up on this log (corrupt bytes), None while it is cleanable."""
        return self._uncleanable

    @property
    def first_dirty_offset(self) -> int:
        """The cleaner checkpoint: offsets below it were compacted by an earlier pass."""
        return self._state.cleaner.first_dirty_offset

    def dirty_ratio(self) -> float:
        """The share of the closed segments' bytes not cleaned yet (Kafka's max-dirty-percent,
        per log, as a ratio); 0.0 for a log that is not compacted or has no closed segment."""
        with self._lock:
            if not self.config.compact:
                return 0.0
            return compaction.dirty_ratio(self._state)

    def cleaning_due(self, now_ms: int, high_watermark: int) -> bool:
        """Whether :meth:`clean` would run a pass now (cheap: sizes and timestamps only)."""
        with self._lock:
            return self._plan_pass(now_ms, high_watermark, force=False) is not None

    def _plan_pass(
        self, now_ms: int, high_watermark: int, force: bool
    ) -> compaction.CleanPlan | None:
        """Under _lock: :func:`compaction.plan_pass` for a log the cleaner may clean."""
        if not self.config.compact or self._state.failure or self._closed or self._uncleanable:
            return None
        return compaction.plan_pass(self._state, now_ms, high_watermark, force)

    def clean(
        self,
        now_ms: int,
        high_watermark: int,
        *,
        force: bool = False,
        max_map_entries: int = MAX_OFFSET_MAP_ENTRIES,
        runner: RewriteRunner | None = None,
    ) -> compaction.CleanResult | None:
        """Compact the log (cleanup.policy=compact): one pass of Kafka's log cleaner, in the
        steps :mod:`raylog.storage.log.compaction` gives.

        The rewrite runs without the log's lock: appends, reads and flushes go on meanwhile;
        a truncation or retention meanwhile makes the pass give up (nothing swapped).
        ``runner`` runs the rewrite (:func:`rewrite_segments`, files only) elsewhere, e.g. in a
        child process so that its Python work does not hold this process's GIL; by default it
        runs in the calling thread. Returns what it did, or None when no pass was due
        (``force``: run anyway if anything is cleanable). See :mod:`raylog.storage.log.cleaner`
        for the rules.

        ``high_watermark`` bounds what a pass may clean: a replica gives its last stable offset
        (at most the high watermark), so that no batch of an open transaction is cleaned, as
        Kafka's cleaner stops at the first unstable offset.
        """
        if not self._cleaning.acquire(blocking=False):
            return None  # another pass is running
        try:
            with self._lock:
                self._check_usable()
                plan = self._plan_pass(now_ms, high_watermark, force)
                if plan is None:
                    return None
                try:
                    job = compaction.rewrite_job(self._state, plan, now_ms, max_map_entries)
                except OSError as exc:  # reading the .txnindex files
                    raise KafkaStorageError(f"cleaning {self.directory} failed: {exc}") from exc
            try:
                out = rewrite_segments(job, self._state.fsync) if runner is None else runner(job)
            except (CorruptRecordError, UnsupportedCompressionTypeError, KafkaStorageError) as exc:
                if self._state.failure is not None or self._closed:
                    raise
                # Bytes the cleaner cannot read (reads of them fail too): as Kafka marks such a
                # partition uncleanable, this log is not cleaned again until it is reopened.
                self._uncleanable = str(exc)
                if isinstance(exc, KafkaStorageError):  # damaged on disk, somewhere it read
                    with self._lock:
                        self._record_damage(plan.targets[0].base_offset, 0)
                logger.error("log %s is uncleanable until it is reopened: %s", self.directory, exc)
                return None
            except FileNotFoundError:
                # Retention or a truncation removed a segment this pass was reading.
                logger.info("log %s: cleaning pass abandoned (segment gone)", self.directory)
                return None
            except OSError as exc:
                raise KafkaStorageError(f"cleaning {self.directory} failed: {exc}") from exc
            try:
                return self._swap_in(plan, out)
            finally:
                for group in out.groups:
                    group.path.unlink(missing_ok=True)  # gone already when swapped in
        finally:
            self._cleaning.release()

    def _swap_in(self, plan: compaction.CleanPlan, out: Rewritten) -> compaction.CleanResult | None:
        """Step 3 of a pass, unless the rewrite failed."""
        if out.failure is not None:
            # Only new files were written (a full disk, say): the log is untouched and keeps
            # serving; the next pass tries again.
            logger.warning(
                "log %s: cleaning pass failed, nothing changed: %s", self.directory, out.failure
            )
            return None
        with self._lock:
            self._check_usable()
            return compaction.swap_in(self._state, plan, out)

    def close(self) -> None:
        """Flush, write the active segment's indexes, release every descriptor. Idempotent."""
        if self._closed:
            return
        try:
            if self._state.failure is None:
                self.flush()
        except RaylogError:
            pass  # closing a failed log still releases its descriptors
        with self._lock:
            try:
                if self._state.failure is None:
                    self._state.segments.active.write_index_files()
            except OSError as exc:
                logger.warning("log %s: index write on close failed: %s", self.directory, exc)
            self._state.segments.release_all()
            self._closed = True

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
