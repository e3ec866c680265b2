"""Crash recovery: what :meth:`Log.open` finds in a log's directory, in this order:

1. the segments, with a torn or corrupt tail cut (below);
2. the log start offset: its checkpoint, clamped into the segments (retention may have passed
   it; a cut tail may have ended the log below it); segments a crash left wholly below it
   (see :meth:`Log.advance_log_start`) are deleted;
3. the leader-epoch cache, trimmed past a cut tail and completed from the rescanned batches;
4. the high watermark and the cleaner checkpoint, clamped into the log;
5. damage: a damage checkpoint (a read found a batch failing its CRC-32C, see log.py) cuts the
   log at its cut offset, as a truncation does; a cut below the checkpointed high watermark
   (committed data lost) writes one. Either way the log reports it (:attr:`Log.damage`) until
   the replica has fetched its log back up to the damage's repair offset.

Inactive segments were fsync'd with their index files when they rolled; they are trusted when
those files pass cheap checks (entries increasing, and a header walk from the last entry ends
exactly at the file's end, at or before the next segment's base offset; bit flips inside
batches are caught by the CRC check on read). Other segments, and always the last one, are
rescanned from their start: whole batches, CRC-32C valid, offsets in order from the segment's
base offset (gaps are allowed: compaction removes batches). A segment that starts below where
its predecessor ends is a leftover of an interrupted cleaning (see compaction.py) and is
deleted. The first bad batch and everything after it (later segments included) is cut, the
indexes rebuilt, and one log line (WARNING) says what was cut.

Files recovery removes: ``*.tmp`` (an interrupted atomic write), ``*.cleaned`` (a segment the
cleaner did not swap in), index files whose ``.log`` is gone, and producer-state snapshots
(snapshots.py) below the log start or above the log end. A segment's ``.txnindex``
(aborted transactions, see txnindex.py) loses its entries past a cut tail; it is checked when
read, and the replica makes every index from its log start on match the log when it starts
(:meth:`Log.restore_aborted_txns`).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

from raylog.storage.errors import KafkaStorageError
from raylog.storage.log import checkpoints, snapshots, truncation, txnindex
from raylog.storage.log.checkpoints import (
    HIGH_WATERMARK_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    Damage,
)
from raylog.storage.log.config import MAX_BATCH_BYTES, LogConfig
from raylog.storage.log.epochs import LeaderEpochCache
from raylog.storage.log.retention import delete_segments_below
from raylog.storage.log.segment import CLEANED_SUFFIX, TMP_SUFFIX, Segment, fsync_directory
from raylog.storage.log.segment_list import SegmentList
from raylog.storage.log.state import LogState

logger = logging.getLogger(__name__)

_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)$")


def recover(
    directory: Path, config: LogConfig, fsync: Callable[[int], None]
) -> tuple[LogState, Damage | None]:
    """The state of the log in ``directory`` after steps 1-5 of the module docstring, and the
    damage it has to repair (None: none); raises OSError, or KafkaStorageError when a file
    changes during recovery."""
    found, cut = _recover_segments(directory, config.index_interval_bytes, fsync)
    segments = SegmentList(directory, found)
    end = segments.log_end_offset
    start = checkpoints.read_offset(directory, LOG_START_OFFSET_CHECKPOINT) or 0
    start = min(max(start, segments[0].base_offset), end)
    if delete_segments_below(segments, start):
        fsync_directory(directory)
    snapshots.delete_outside(directory, start, end)  # left by a crash, or past a cut tail
    epochs = LeaderEpochCache(directory)
    epochs.recover(segments.active, start, end)
    high_watermark = checkpoints.read_offset(directory, HIGH_WATERMARK_CHECKPOINT) or 0
    cleaner = checkpoints.read_cleaner(directory)
    first_dirty = min(max(cleaner.first_dirty_offset, start), end)
    if cut:
        logger.warning("log %s recovered: %s; log end offset %d", directory, cut, end)
    else:
        count = len(segments)
        logger.info(
            "log %s recovered: %d segment(s), offsets [%d, %d)", directory, count, start, end
        )
    state = LogState(
        directory=directory,
        config=config,
        fsync=fsync,
        segments=segments,
        epochs=epochs,
        log_start_offset=start,
        high_watermark=min(max(high_watermark, start), end),
        cleaner=cleaner._replace(first_dirty_offset=first_dirty),
    )
    damage = checkpoints.read_damage(directory)
    if cut and high_watermark > end:
        # The cut took committed records: fetched back from the leader, not served meanwhile.
        damage = Damage(end, high_watermark).merged(damage)
        checkpoints.write_damage(directory, damage)
    if damage is not None:
        cut_damaged(state, damage.cut_offset)
    return state, damage


def cut_damaged(state: LogState, offset: int) -> None:
    """Drop every batch from the damaged one at ``offset`` on (truncation.truncate_to); the
    whole log, starting over at its log start, when the walk to ``offset`` meets damage too."""
    if offset >= state.log_end_offset:
        return
    try:
        truncation.truncate_to(state, max(offset, state.log_start_offset))
    except KafkaStorageError as exc:
        if state.failure is not None:
            raise
        logger.warning("log %s: %s; dropping every segment", state.directory, exc)
        truncation.truncate_fully_and_start_at(state, state.log_start_offset)
    logger.warning(
        "log %s: damaged data from offset %d dropped; log end offset %d, to be fetched again",
        state.directory,
        offset,
        state.log_end_offset,
    )


def _recover_segments(
    directory: Path, index_interval_bytes: int, fsync: Callable[[int], None]
) -> tuple[list[Segment], str | None]:
    """The valid segments of the log in ``directory``, after removing what a crash left
    (see the module docstring); one empty segment at offset 0 for a new log. Raises OSError,
    or KafkaStorageError when a file changes during recovery; returns them with what was cut
    (None: nothing)."""
    ordered = _segment_bases(directory)
    cut: str | None = None
    leftovers: list[int] = []
    segments: list[Segment] = []
    for i, base in enumerate(ordered):
        seg = Segment(directory, base, index_interval_bytes)
        if segments and base < segments[-1].next_offset:
            # Offsets the segment before already holds: a segment the log cleaner merged
            # into that one, left by a crash before the cleaner unlinked it.
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
        fsync(seg.fd)
        seg.size = valid
        txnindex.truncate(seg)  # entries of the markers cut
        dropped = ordered[i + 1 :]
        for later in dropped:
            Segment(directory, later, index_interval_bytes).delete_files()
        if dropped:
            cut += f" and {len(dropped)} later segment(s)"
        segments.append(seg)
        break
    if leftovers:
        logger.warning(
            "log %s: removed segment(s) %s that an interrupted cleaning had merged into "
            "an earlier one",
            directory,
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
        segments.append(Segment.create(directory, 0, index_interval_bytes))
    # Invariant: the active (last) segment was rescanned, so its indexes are in memory.
    fsync_directory(directory)
    return segments, cut


def _segment_bases(directory: Path) -> list[int]:
    """The base offsets of the ``.log`` files in ``directory``, sorted, after removing the
    files a crash leaves (see the module docstring)."""
    bases: set[int] = set()
    for entry in os.listdir(directory):
        if entry.endswith((TMP_SUFFIX, CLEANED_SUFFIX)):
            (directory / entry).unlink()
            continue
        m = _SEGMENT_FILE.match(entry)
        if m and m.group(2) == "log":
            bases.add(int(m.group(1)))
    for entry in os.listdir(directory):  # index files whose .log is gone
        m = _SEGMENT_FILE.match(entry)
        if m and int(m.group(1)) not in bases:
            (directory / entry).unlink()
    return sorted(bases)
