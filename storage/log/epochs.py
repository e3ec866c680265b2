"""The leader-epoch cache (KIP-101/279) of one log, and its checkpoint file.

Each entry is the first offset written under a leader epoch. The cache answers
OffsetForLeaderEpoch (:meth:`LeaderEpochCache.end_offset_for`), which a follower uses to find
where its log diverges from its leader's. ``leader-epoch-checkpoint`` holds it in Kafka's
text format (see checkpoints.py): ``0``, ``<count>``, then ``<epoch> <startOffset>`` per
entry, rewritten atomically whenever the cache changes.

Invariants: entries are strictly increasing in both fields, start below the log end offset,
and none starts below the log start offset (the first one is moved up to it when retention
or DeleteRecords passes it). Not thread-safe: the Log calls it under its lock.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import NamedTuple

from raylog.storage import batch as rb
from raylog.storage.log.checkpoints import (
    LEADER_EPOCH_CHECKPOINT,
    read_checkpoint,
    write_checkpoint,
)
from raylog.storage.log.segment import Segment

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEntry(NamedTuple):
    """The first offset written under a leader epoch."""

    epoch: int
    start_offset: int


def _parse_entries(values: list[str]) -> list[EpochEntry]:
    count = int(values[0])
    entries = []
    for line in values[1 : 1 + count]:
        epoch, start = line.split(" ")
        entries.append(EpochEntry(int(epoch), int(start)))
    if len(entries) != count:
        raise ValueError("short file")
    return entries


class LeaderEpochCache:
    """The epochs of the log in ``directory``, oldest first (``entries``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.entries: list[EpochEntry] = []

    @property
    def latest_epoch(self) -> int:
        """The newest epoch, UNDEFINED_EPOCH (-1) when the cache is empty."""
        return self.entries[-1].epoch if self.entries else UNDEFINED_EPOCH

    def recover(self, active: Segment, log_start_offset: int, log_end_offset: int) -> None:
        """Load the checkpoint, drop entries past a cut tail, then add the epochs of the
        active segment's batches (rescanned by recovery) that the checkpoint missed; rewrite
        the checkpoint when that changed it."""
        loaded = read_checkpoint(self.directory / LEADER_EPOCH_CHECKPOINT, _parse_entries) or []
        self.entries = list(loaded)
        self.trim(log_start_offset, log_end_offset)
        pos = 0
        while pos < active.size:
            header = rb.parse_header(active.read(pos, rb.HEADER_SIZE))
            self.note(header.partition_leader_epoch, header.base_offset)
            pos += header.size
        self.trim(log_start_offset, log_end_offset)
        if self.entries != loaded:
            self.persist()

    def note(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` when it is newer than every known
        epoch (batches without an epoch carry -1); returns whether it was. The caller
        persists."""
        if epoch >= 0 and (not self.entries or epoch > self.entries[-1].epoch):
            self.entries.append(EpochEntry(epoch, start_offset))
            return True
        return False

    def trim(self, log_start_offset: int, log_end_offset: int) -> None:
        """Restore the invariants after the log's ends moved: drop entries at or past the log
        end, and move the first entry up to the log start offset."""
        kept = [e for e in self.entries if e.start_offset < log_end_offset]
        while len(kept) > 1 and kept[1].start_offset <= log_start_offset:
            kept.pop(0)
        if kept and kept[0].start_offset < log_start_offset:
            kept[0] = EpochEntry(kept[0].epoch, log_start_offset)
        self.entries = kept

    def trim_and_persist(self, log_start_offset: int, log_end_offset: int) -> None:
        before = list(self.entries)
        self.trim(log_start_offset, log_end_offset)
        if self.entries != before:
            self.persist()

    def clear(self) -> None:
        """Forget every epoch, durably (a log started over empty)."""
        self.entries = []
        self.persist()

    def persist(self) -> None:
        """Rewrite the checkpoint (atomically, fsync'd); raises KafkaStorageError."""
        values = [str(len(self.entries))] + [f"{e.epoch} {e.start_offset}" for e in self.entries]
        write_checkpoint(self.directory, LEADER_EPOCH_CHECKPOINT, values)

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: ``(epoch, end_offset)`` as Kafka answers it.

        - the latest epoch: (epoch, log end offset);
        - an earlier known epoch, or one between known epochs: (the largest known epoch <=
          the requested one, start offset of the first epoch above the requested one);
        - an epoch below every known epoch: (requested epoch, start offset of the first
          known epoch), as Kafka's LeaderEpochFileCache.endOffsetFor does since KIP-279;
        - an epoch above the latest, -1, or an empty cache: (-1, -1) (UNDEFINED).
        """
        if epoch == UNDEFINED_EPOCH or not self.entries:
            return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        if epoch == self.entries[-1].epoch:
            return (epoch, log_end_offset)
        epochs = [e.epoch for e in self.entries]
        higher = bisect.bisect_right(epochs, epoch)
        if higher == len(epochs):
            return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        if higher == 0:
            return (epoch, self.entries[0].start_offset)
        return (self.entries[higher - 1].epoch, self.entries[higher].start_offset)
