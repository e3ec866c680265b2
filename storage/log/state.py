"""What a log knows about itself (:class:`LogState`): the state its modules share, read and
changed only under the Log's lock.

Invariants: first segment's base offset <= ``log_start_offset`` <= log end offset; the
epoch cache starts at or above the log start offset and below the log end offset;
``log_start_offset`` <= ``high_watermark`` <= log end offset; every write counted below
``durable_writes`` is fsync'd; once ``failure`` is set (a failed fsync, truncation or swap:
the page cache or the directory is in a state the log cannot know) the log refuses all work
until it is reopened and recovered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from raylog.storage.errors import KafkaStorageError
from raylog.storage.log.checkpoints import CleanerCheckpoint
from raylog.storage.log.config import LogConfig
from raylog.storage.log.epochs import LeaderEpochCache
from raylog.storage.log.segment_list import SegmentList


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


@dataclass(eq=False)
class LogState:
    directory: Path
    config: LogConfig
    fsync: Callable[[int], None]  # every fsync of segment data, given a file descriptor
    segments: SegmentList
    epochs: LeaderEpochCache
    log_start_offset: int
    high_watermark: int
    cleaner: CleanerCheckpoint  # the log cleaner's checkpoint
    stats: LogStats = field(default_factory=LogStats)
    writes: int = 0  # writes counted
    durable_writes: int = 0  # the writes below this count are fsync'd
    failure: str | None = None  # why the log refuses all work

    @property
    def log_end_offset(self) -> int:
        return self.segments.log_end_offset

    def failed(self, why: str, exc: OSError) -> KafkaStorageError:
        """Refuse all work from now on; the error to raise."""
        self.failure = f"{why} failed: {exc}"
        return KafkaStorageError(f"{why} of {self.directory} failed: {exc}")

    def all_durable(self) -> None:
        """Every write so far is durable (or gone): a roll or truncation fsync'd it."""
        self.durable_writes = self.writes
