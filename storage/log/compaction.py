"""A cleaning pass over a log (cleanup.policy=compact): when one is due, which segments it
cleans, and how its cleaned files replace them. :meth:`Log.clean` runs the steps:

1. plan (:func:`plan_pass`, under the Log's lock): the cleanable segments are the inactive
   ones wholly below the upper bound the caller gives (the last stable offset: no open
   transaction's batch is ever cleaned; the high watermark without transactions) and, with
   min.compaction.lag.ms, whose newest record is at least that old. The part of them at or
   above the first dirty offset (the cleaner checkpoint) is dirty. A pass is due when the
   dirty part is at least
   min.cleanable.dirty.ratio of the cleanable bytes, when its oldest segment is older than
   max.compaction.lag.ms, or when a kept tombstone's delete horizon has passed;
2. rewrite (:func:`raylog.storage.log.rewrite.rewrite_segments`, without the lock, maybe in
   a child process): the offset map of the dirty part, then every cleanable segment rewritten
   into ``.cleaned`` files, consecutive segments merged up to segment.bytes;
3. swap (:func:`swap_cleaned`, under the lock), unless the segment list changed meanwhile
   (a truncation or retention: its generation moved, or a segment's size): then the pass
   gives up and nothing is swapped.

Crash safety of a swap, per merged group with base offset B: 1. B's index files are
unlinked; 2. the ``B.log.<token>.cleaned`` file (fsync'd) is renamed over ``B.log``, the
directory fsync'd: the commit point; 3. the group's other segments are unlinked; 4. B's index
files are written, and its ``.txnindex`` (the aborted transactions whose markers it kept).
Recovery deletes ``.cleaned`` files, and a segment starting below where the
one before it ends is one that step 3 did not reach. (One starting past the cleaned segment's
last batch survives: it holds only records this pass removed, superseded ones, which read
before their newer values and go at the next pass.) Offsets never change, so a crash at any
point leaves every offset readable.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

from raylog.storage.log import checkpoints, txnindex
from raylog.storage.log.checkpoints import CleanerCheckpoint
from raylog.storage.log.rewrite import CleanedGroup, RewriteJob, Rewritten
from raylog.storage.log.segment import Segment, fsync_directory
from raylog.storage.log.segment_list import SegmentList
from raylog.storage.log.state import LogState

logger = logging.getLogger(__name__)


class CleanResult(NamedTuple):
    """What one cleaning pass did (:meth:`Log.clean`)."""

    first_dirty_offset: int  # where the dirty part began
    end_offset: int  # offsets below this were cleaned: the next pass's first dirty offset
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    records_removed: int


class CleanPlan(NamedTuple):
    targets: list[Segment]  # the cleanable segments, oldest first
    sizes: list[int]  # their sizes when planned
    dirty_index: int  # targets[dirty_index:] are dirty
    cut: int  # the first offset not cleanable
    later: list[tuple[Path, int]]  # the segments after the targets (path, size when planned)
    generation: int  # of the segment list when planned


def plan_pass(state: LogState, now_ms: int, high_watermark: int, force: bool) -> CleanPlan | None:
    """Which segments a pass would clean, or None when none is cleanable or (unless
    ``force``) no pass is due (step 1 of the module docstring)."""
    segments, config = state.segments, state.config
    count = 0
    for i in range(len(segments) - 1):
        if segments[i + 1].base_offset > high_watermark:
            break
        if config.min_compaction_lag_ms and (
            now_ms - segments[i].max_timestamp < config.min_compaction_lag_ms
        ):
            break
        count = i + 1
    if not count:
        return None
    cut = segments[count].base_offset
    dirty_index, dirty, clean = dirty_part(state, count)
    due = (
        force
        or (dirty and dirty / (dirty + clean) >= config.min_cleanable_dirty_ratio)
        or (
            dirty_index < count
            and now_ms - segments[dirty_index].max_timestamp > config.max_compaction_lag_ms
        )
        or 0 <= state.cleaner.next_delete_horizon_ms <= now_ms
    )
    if not due:
        return None
    targets = segments.head(count)
    return CleanPlan(
        targets=targets,
        sizes=[seg.size for seg in targets],
        dirty_index=dirty_index,
        cut=cut,
        later=[(segments[i].log_path, segments[i].size) for i in range(count, len(segments))],
        generation=segments.generation,
    )


def dirty_part(state: LogState, count: int) -> tuple[int, int, int]:
    """For the first ``count`` segments: the index of the first dirty one, the dirty bytes
    and the clean bytes."""
    segments = state.segments
    cut = segments[count].base_offset if count < len(segments) else segments.log_end_offset
    first_dirty = min(max(state.cleaner.first_dirty_offset, state.log_start_offset), cut)
    dirty_index = min(segments.index_of(first_dirty), count)
    dirty = sum(segments[i].size for i in range(dirty_index, count))
    clean = sum(segments[i].size for i in range(dirty_index))
    return dirty_index, dirty, clean


def dirty_ratio(state: LogState) -> float:
    """The share of the closed segments' bytes not cleaned yet; 0.0 without one."""
    if len(state.segments) < 2:
        return 0.0
    _, dirty, clean = dirty_part(state, len(state.segments) - 1)
    return dirty / (dirty + clean) if dirty + clean else 0.0


def rewrite_job(state: LogState, plan: CleanPlan, now_ms: int, max_map_entries: int) -> RewriteJob:
    """The files step 2 reads and writes."""
    return RewriteJob(
        directory=state.directory,
        segments=[
            (seg.base_offset, seg.log_path, size)
            for seg, size in zip(plan.targets, plan.sizes, strict=True)
        ],
        dirty_index=plan.dirty_index,
        cut=plan.cut,
        later=plan.later,
        config=state.config,
        now_ms=now_ms,
        max_map_entries=max_map_entries,
        token=os.urandom(6).hex(),
        aborted=tuple(
            txnindex.collect_aborted(state.segments, plan.targets[0].base_offset, plan.cut)
        ),
    )


def swap_in(state: LogState, plan: CleanPlan, out: Rewritten) -> CleanResult | None:
    """Step 3: the rewritten files in place of the segments they clean, and the cleaner
    checkpoint moved past them; None (nothing swapped) when the segment list changed since
    the plan."""
    if not unchanged_since(state.segments, plan, out.count):
        logger.info("log %s: cleaning pass abandoned (log changed)", state.directory)
        return None
    try:
        swap_cleaned(state.segments, out.groups, out.count, state.config.index_interval_bytes)
    except OSError as exc:
        raise state.failed("cleaner swap", exc) from exc
    state.cleaner = CleanerCheckpoint(out.cut, out.horizon)
    checkpoints.write_cleaner(state.directory, state.cleaner)
    state.stats.cleanings += 1
    state.stats.records_cleaned += out.removed
    after = sum(state.segments[i].size for i in range(len(out.groups)))
    return clean_result(state.directory, plan, out, after)


def unchanged_since(segments: SegmentList, plan: CleanPlan, count: int) -> bool:
    """Whether the first ``count`` planned segments are still the log's, as planned."""
    targets, sizes = plan.targets[:count], plan.sizes[:count]
    return (
        segments.generation == plan.generation
        and segments.head(count) == targets
        and all(seg.size == size for seg, size in zip(targets, sizes, strict=True))
    )


def swap_cleaned(
    segments: SegmentList, groups: list[CleanedGroup], count: int, index_interval_bytes: int
) -> None:
    """Replace the first ``count`` segments by the cleaned groups, in the order the module
    docstring gives; raises OSError (the directory is then between states a crash could
    leave: the Log stops serving until recovery settles it)."""
    directory = segments.directory
    old = segments.head(count)
    new: list[Segment] = []
    for group in groups:
        first = old[group.members.start]
        # The aborted transactions whose markers the cleaned group keeps (Kafka's cleaner
        # indexes those only): read before step 3 unlinks the members' indexes.
        markers = {header.base_offset for _, header in group.headers if header.is_control}
        aborted = [
            entry
            for i in group.members
            for entry in txnindex.segment_entries(old[i])
            if entry.last_offset in markers
        ]
        for seg in (old[i] for i in group.members):
            segments.forget(seg)
            seg.release()
        first.index_path.unlink(missing_ok=True)
        first.timeindex_path.unlink(missing_ok=True)
        fsync_directory(directory)
        os.replace(group.path, first.log_path)  # the commit point of this group
        fsync_directory(directory)
        for seg in (old[i] for i in group.members if i != group.members.start):
            seg.delete_files()
        fsync_directory(directory)
        seg = Segment(directory, group.base, index_interval_bytes)
        seg.adopt(group.headers, group.size)
        txnindex.write_entries(seg.txnindex_path, aborted)
        seg.txn_entries = len(aborted)
        seg.write_index_files()
        seg.release()
        new.append(seg)
    fsync_directory(directory)
    following = new[1:] + ([segments[count]] if count < len(segments) else [])
    for seg, after in zip(new, following, strict=True):
        seg.next_offset = after.base_offset
    segments.replace_head(count, new)


def clean_result(directory: Path, plan: CleanPlan, out: Rewritten, bytes_after: int) -> CleanResult:
    """What a swapped-in pass did, also said in a log line."""
    sizes = plan.sizes[: out.count]
    result = CleanResult(
        first_dirty_offset=plan.targets[plan.dirty_index].base_offset
        if plan.dirty_index < out.count
        else out.cut,
        end_offset=out.cut,
        segments_before=len(sizes),
        segments_after=len(out.groups),
        bytes_before=sum(sizes),
        bytes_after=bytes_after,
        records_removed=out.removed,
    )
    logger.info(
        "log %s cleaned offsets below %d: %d segment(s) of %d bytes -> %d of %d bytes, "
        "%d record(s) removed",
        directory,
        out.cut,
        result.segments_before,
        result.bytes_before,
        result.segments_after,
        result.bytes_after,
        out.removed,
    )
    return result
