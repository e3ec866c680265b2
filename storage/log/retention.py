"""What leaves the head of a log: whole segments past retention, and segments wholly below the
log start offset.

Retention (cleanup.policy includes delete) deletes inactive segments oldest first while the
oldest is past retention.ms (judged by its largest timestamp) or the log is larger than
retention.bytes without it. Never the active segment, and with a high watermark only segments
wholly below it (uncommitted data is never deleted).

The log start offset (Kafka's) starts as the first segment's base offset and moves up when
retention deletes segments, or, through :meth:`Log.advance_log_start` (DeleteRecords, or a
follower learning its leader's), to any offset up to the high watermark, also inside a
segment. Invariants: first segment's base offset <= log start offset <= log end offset, and no
segment lies wholly below the log start offset (the next segment's base offset is above it).

Tiered storage (KIP-405): for a topic whose closed segments are copied to the object store,
the log holds the local tier only, and its log start offset is Kafka's localLogStartOffset
(the first offset held locally); the partition's log start (Kafka's logStartOffset, the
remote one) is its owner's. :meth:`Log.delete_local_segments` deletes the oldest segments
its owner found copied and past local retention, as retention does (same order, same
invariants): the log starts at the next segment's base offset.

Only a value set by :meth:`Log.advance_log_start` (or a truncation that lowers it) is
checkpointed. Order of an advance, for a crash at any point: 1. the checkpoint (atomic,
fsync'd): from here on the offsets below are gone, whatever files remain (recovery takes the
larger of the checkpoint and the first segment's base offset); 2. when the whole log is below
the new start, roll, so that the active segment is empty and the old one can go (as Kafka
rolls before retention deletes every segment); 3. unlink the segments wholly below (recovery
does it again if a crash interrupts it).

Order of a deletion: the segment leaves the in-memory list first, then its files are
unlinked (a crash in between leaves either a whole old segment, which retention or recovery
deletes again, or index files that recovery removes); then the directory is fsync'd.
Functions here run under the Log's lock.
"""

from __future__ import annotations

import logging

from raylog.storage.errors import KafkaStorageError, OffsetOutOfRangeError
from raylog.storage.log import checkpoints, snapshots
from raylog.storage.log.appends import roll
from raylog.storage.log.checkpoints import LOG_START_OFFSET_CHECKPOINT
from raylog.storage.log.config import LogConfig
from raylog.storage.log.segment import fsync_directory
from raylog.storage.log.segment_list import SegmentList
from raylog.storage.log.state import LogState

logger = logging.getLogger(__name__)


def enforce_retention(state: LogState, now_ms: int, high_watermark: int | None) -> int:
    """:meth:`Log.enforce_retention`; returns how many segments were deleted."""
    if not state.config.delete:
        return 0  # cleanup.policy=compact: the cleaner, not retention, shrinks it
    deleted = delete_retained_segments(state.segments, state.config, now_ms, high_watermark)
    state.log_start_offset = max(state.log_start_offset, state.segments[0].base_offset)
    if deleted:
        _after_head_deleted(state, deleted)
    return deleted


def delete_local_segments(state: LogState, count: int, high_watermark: int) -> int:
    """:meth:`Log.delete_local_segments`; returns how many segments were deleted."""
    deleted = 0
    while deleted < count and len(state.segments) > 1:
        if state.segments[1].base_offset > high_watermark:
            break  # uncommitted data is never deleted
        _delete_first(state.segments)
        deleted += 1
    if deleted:
        state.log_start_offset = max(state.log_start_offset, state.segments[0].base_offset)
        _after_head_deleted(state, deleted)
    return deleted


def advance_log_start(state: LogState, offset: int, high_watermark: int) -> int:
    """:meth:`Log.advance_log_start`, in the order of the module docstring; returns the log
    start offset."""
    leo = state.log_end_offset
    if offset > min(high_watermark, leo):
        raise OffsetOutOfRangeError(
            f"log start offset {offset} above the high watermark {high_watermark} "
            f"or the log end offset {leo} of {state.directory}"
        )
    if offset <= state.log_start_offset:
        return state.log_start_offset
    try:
        checkpoints.write_offset(state.directory, LOG_START_OFFSET_CHECKPOINT, offset)
        state.log_start_offset = offset
        if offset == leo and state.segments.active.size:
            roll(state)
        deleted = delete_segments_below(state.segments, offset)
        if deleted:
            _after_head_deleted(state, deleted)
        else:
            snapshots.delete_outside(state.directory, offset, None)
            state.epochs.trim_and_persist(offset, leo)
            state.high_watermark = max(state.high_watermark, offset)
    except OSError as exc:
        raise state.failed("advancing the log start offset", exc) from exc
    logger.info("log %s: log start offset now %d", state.directory, offset)
    return offset


def _after_head_deleted(state: LogState, deleted: int) -> None:
    """After segments left the head of the log: make the unlinks durable, delete the
    producer-state snapshots below the log start offset (the batches after them are gone) and
    move the epoch cache and the high watermark up to it."""
    snapshots.delete_outside(state.directory, state.log_start_offset, None)
    fsync_directory(state.directory)
    state.stats.segments_deleted += deleted
    state.epochs.trim_and_persist(state.log_start_offset, state.log_end_offset)
    state.high_watermark = max(state.high_watermark, state.log_start_offset)
    logger.info(
        "log %s deleted %d segment(s) at its head; log start offset %d",
        state.directory,
        deleted,
        state.log_start_offset,
    )


def delete_retained_segments(
    segments: SegmentList, config: LogConfig, now_ms: int, high_watermark: int | None
) -> int:
    """Delete the segments past retention.ms / retention.bytes; returns how many."""
    total = segments.size_bytes
    deleted = 0
    while len(segments) > 1:
        seg = segments[0]
        end = segments[1].base_offset
        if high_watermark is not None and end > high_watermark:
            break
        expired = config.retention_ms >= 0 and now_ms - seg.max_timestamp > config.retention_ms
        oversized = config.retention_bytes >= 0 and total - seg.size >= config.retention_bytes
        if not (expired or oversized):
            break
        _delete_first(segments)
        total -= seg.size
        deleted += 1
    return deleted


def delete_segments_below(segments: SegmentList, log_start_offset: int) -> int:
    """Delete the segments wholly below ``log_start_offset`` (the next one starts at or below
    it); returns how many."""
    deleted = 0
    while len(segments) > 1 and segments[1].base_offset <= log_start_offset:
        _delete_first(segments)
        deleted += 1
    return deleted


def _delete_first(segments: SegmentList) -> None:
    seg = segments.pop_first()
    try:
        seg.delete_files()
    except OSError as exc:
        raise KafkaStorageError(f"deleting {seg.log_path} failed: {exc}") from exc
