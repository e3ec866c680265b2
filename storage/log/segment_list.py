"""The segments of one log, oldest first: lookup by offset, rolls, and the bounded set of
inactive segments kept open.

Invariants: never empty; base offsets strictly increasing; each segment's ``next_offset`` is
the next one's base offset (the segments tile the offsets, gaps left by compaction included);
the last (active) segment has its indexes in memory; at most MAX_OPEN_INACTIVE_SEGMENTS
inactive segments hold an open descriptor and loaded indexes, the least recently used
released first. Not thread-safe: the Log calls it under its lock.
"""

from __future__ import annotations

import bisect
import itertools
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from raylog.storage.log.segment import Segment, fsync_directory

# Inactive segments with open descriptors and loaded indexes at once (LRU).
MAX_OPEN_INACTIVE_SEGMENTS = 8


class ClosedSegment(NamedTuple):
    """A closed (inactive) segment as :meth:`Log.closed_segments` describes it: its files do
    not change until retention, compaction or a truncation removes or replaces them."""

    base_offset: int
    next_offset: int  # the next segment's base offset
    size_bytes: int
    max_timestamp_ms: int
    log_path: Path
    txnindex_path: Path


class SegmentList:
    """The ordered segments of the log in ``directory``."""

    def __init__(self, directory: Path, segments: list[Segment]) -> None:
        self.directory = directory
        self._segments = segments
        self._bases = [s.base_offset for s in segments]  # for bisect
        self._open_inactive: OrderedDict[int, Segment] = OrderedDict()
        # Bumped by every change of the list other than an append or a roll, so that a
        # cleaning pass that read segments while one happened swaps nothing in.
        self.generation = 0

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._segments)

    def __getitem__(self, i: int) -> Segment:
        return self._segments[i]

    def closed(self) -> list[ClosedSegment]:
        """Every segment but the active one, oldest first."""
        segs = self._segments
        return [
            ClosedSegment(
                s.base_offset, n.base_offset, s.size, s.max_timestamp, s.log_path, s.txnindex_path
            )
            for s, n in itertools.pairwise(segs)
        ]

    def head(self, count: int) -> list[Segment]:
        """The first ``count`` segments."""
        return self._segments[:count]

    @property
    def active(self) -> Segment:
        return self._segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def index_of(self, offset: int) -> int:
        """Index of the segment holding ``offset``: the last one whose base offset is <= it."""
        return bisect.bisect_right(self._bases, offset) - 1

    def open(self, i: int) -> Segment:
        """The ``i``-th segment, for reading: counted as recently used when inactive."""
        seg = self._segments[i]
        self.touch(seg)
        return seg

    def touch(self, seg: Segment) -> None:
        """Count an inactive segment as recently used, releasing the least recently used one
        beyond MAX_OPEN_INACTIVE_SEGMENTS."""
        if seg is self._segments[-1]:
            return
        self._open_inactive[seg.base_offset] = seg
        self._open_inactive.move_to_end(seg.base_offset)
        while len(self._open_inactive) > MAX_OPEN_INACTIVE_SEGMENTS:
            _, evicted = self._open_inactive.popitem(last=False)
            evicted.release()

    def forget(self, seg: Segment) -> None:
        """Stop counting ``seg`` among the open inactive segments (it is going away or
        becoming active)."""
        self._open_inactive.pop(seg.base_offset, None)

    def roll(self, index_interval_bytes: int) -> None:
        """Start a new, empty active segment at the log end.

        The caller has fsync'd the old active segment; here its index files are written
        (atomically), then the new segment created and its directory entry made durable.
        """
        old = self._segments[-1]
        old.write_index_files()
        new = Segment.create(self.directory, old.next_offset, index_interval_bytes)
        fsync_directory(self.directory)
        self._segments.append(new)
        self._bases.append(new.base_offset)
        self.touch(old)

    def pop_first(self) -> Segment:
        """Remove the first segment from the list; the caller deletes its files."""
        seg = self._segments.pop(0)
        self._bases.pop(0)
        self.forget(seg)
        self.generation += 1
        return seg

    def drop_after(self, i: int) -> list[Segment]:
        """Remove the segments after the ``i``-th from the list, which makes it the active
        segment; returns them, oldest first (the caller deletes their files)."""
        removed = self._segments[i + 1 :]
        del self._segments[i + 1 :]
        del self._bases[i + 1 :]
        for seg in (self._segments[i], *removed):
            self.forget(seg)
        self.generation += 1
        return removed

    def reset(self, seg: Segment) -> None:
        """Make ``seg`` the only segment; the caller deleted the files of the others."""
        self._segments = [seg]
        self._bases = [seg.base_offset]
        self._open_inactive.clear()
        self.generation += 1

    def replace_head(self, count: int, new: list[Segment]) -> None:
        """Put ``new`` in place of the first ``count`` segments (a cleaning pass's swap)."""
        self._segments[:count] = new
        self._bases[:count] = [seg.base_offset for seg in new]
        self.generation += 1

    def release_all(self) -> None:
        """Close every descriptor and drop every loaded index (the log is closing)."""
        for seg in self._segments:
            seg.release()
        self._open_inactive.clear()
