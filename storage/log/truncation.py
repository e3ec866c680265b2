"""What leaves the tail of a log: a truncation to an offset (a follower's divergent suffix
after an election), and a full truncation that starts the log over, empty, at an offset (a
follower behind its leader's log start offset).

Both change files in an order that leaves, at every crash point, a log recovery accepts: a
prefix of the old one, whole segments, or the new empty log; both are durable on return. A
failed step leaves the log refusing all work until it is reopened and recovered. Functions
here run under the Log's lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from raylog.storage.errors import OffsetOutOfRangeError
from raylog.storage.log import checkpoints, snapshots, txnindex
from raylog.storage.log.checkpoints import (
    HIGH_WATERMARK_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    CleanerCheckpoint,
)
from raylog.storage.log.reads import first_position_at_or_after
from raylog.storage.log.segment import Segment, fsync_directory
from raylog.storage.log.segment_list import SegmentList
from raylog.storage.log.state import LogState

logger = logging.getLogger(__name__)


def truncate_to(state: LogState, offset: int) -> int:
    """:meth:`Log.truncate_to`: cut the segments, then bring the log start offset, the epoch
    cache, the high watermark and the cleaner checkpoint down to the new log end."""
    if offset >= state.log_end_offset:
        return state.log_end_offset
    if offset < state.log_start_offset:
        raise OffsetOutOfRangeError(
            f"truncate to {offset} below log start offset {state.log_start_offset}"
        )
    try:
        truncate_segments(state.segments, offset, state.fsync)
        # A snapshot above the new end describes batches that are gone (recovery deletes
        # those a crash leaves here).
        snapshots.delete_outside(state.directory, 0, state.log_end_offset)
    except OSError as exc:
        raise state.failed("truncation", exc) from exc
    state.stats.fsyncs += 1
    state.all_durable()
    leo = state.log_end_offset
    if state.log_start_offset > leo:
        state.log_start_offset = leo
        checkpoints.write_offset(state.directory, LOG_START_OFFSET_CHECKPOINT, leo)
    state.epochs.trim_and_persist(state.log_start_offset, leo)
    state.high_watermark = min(state.high_watermark, leo)
    if state.cleaner.first_dirty_offset > leo:
        state.cleaner = state.cleaner._replace(first_dirty_offset=leo)
        checkpoints.write_cleaner(state.directory, state.cleaner)
    logger.info("log %s truncated to offset %d (asked %d)", state.directory, leo, offset)
    return leo


def truncate_fully_and_start_at(state: LogState, offset: int) -> None:
    """:meth:`Log.truncate_fully_and_start_at`: every segment gone, the log empty at
    ``offset``, which is its log start offset and high watermark; no epoch known."""
    try:
        # 1. The log start first: a crash after it leaves old segments wholly below it,
        #    which recovery deletes, never a log that starts below ``offset``.
        checkpoints.write_offset(state.directory, LOG_START_OFFSET_CHECKPOINT, offset)
        snapshots.delete_outside(state.directory, offset + 1, None)  # every one
        start_empty_at(state.segments, offset, state.config.index_interval_bytes)
    except OSError as exc:
        raise state.failed("truncation", exc) from exc
    state.all_durable()  # what was written is gone
    state.log_start_offset = offset
    state.epochs.clear()
    state.high_watermark = offset
    checkpoints.write_offset(state.directory, HIGH_WATERMARK_CHECKPOINT, offset)
    state.cleaner = CleanerCheckpoint(offset)
    checkpoints.write_cleaner(state.directory, state.cleaner)


def truncate_segments(segments: SegmentList, offset: int, fsync: Callable[[int], None]) -> None:
    """Remove every batch whose last offset is >= ``offset`` (``offset`` is below the log end
    offset and at or above the first segment's base offset); durable on return."""
    i = segments.index_of(offset)
    seg = segments[i]
    cut = first_position_at_or_after(seg, offset)
    if cut == 0 and i > 0:
        i -= 1  # the whole segment goes: its predecessor becomes active
        seg = segments[i]
        cut = seg.size
    removed = segments.drop_after(i)
    # Order matters for a crash in between: 1. unlink later segments newest first and make
    # that durable; 2. cut and fsync the new last segment (rescanned: the active segment's
    # in-memory state must be complete). Every crash point then leaves a prefix of the old
    # log, whole segments, which the replication layer truncates again.
    for dead in reversed(removed):
        dead.delete_files()
    if removed:
        fsync_directory(segments.directory)
    seg.truncate_to_size(cut)
    fsync(seg.fd)
    txnindex.truncate(seg)  # aborted transactions whose markers were cut
    fsync_directory(segments.directory)


def start_empty_at(segments: SegmentList, base_offset: int, index_interval_bytes: int) -> None:
    """Replace every segment by one empty segment at ``base_offset``; the log start offset
    is the caller's to set (before this, when it is checkpointed)."""
    for seg in segments:
        seg.delete_files()
    # The old segments are gone for good before the new one exists: a crash never leaves
    # an old segment below the new start (a gap would look like compaction).
    fsync_directory(segments.directory)
    new = Segment.create(segments.directory, base_offset, index_interval_bytes)
    fsync_directory(segments.directory)
    segments.reset(new)
