"""A simulated replica disk: an in-memory log of batches with a durable prefix.

What it models: appends land in the page cache (``batches``) and become durable only when an
fsync covering them completes (``durable_count``). A crash keeps the durable prefix plus, when
the write tears, some prefix of the unsynced batches (never a partial batch: the real log's
recovery drops a torn batch by its CRC, which is the same as keeping a prefix of whole batches),
or all of them when the machine stays up (a process crash: the page cache survives).
Recovery then fsyncs what survived. An fsync reports the log generation it started in (the
state machine's, which every truncation bumps): one started before a truncation syncs nothing.
Truncation is immediate and durable, as the state machine's contract says, and so is a move of
the log start offset (DeleteRecords; the real log checkpoints it before it deletes anything):
batches wholly below it go, whole, at once.

Invariant: batches are contiguous from the first one's base offset, which is at or below
``log_start`` (and the log end is at or above it), and ``durable_count <= len(batches)``. A
mirror's disk (``gaps``, links.py) takes batches above its end too, as a log does a compacted
source's, and is cut at any offset between batches.
"""

from __future__ import annotations

import bisect
import random

from raylog.actors.replication.messages import BatchMeta, RecordBatch


class SimDisk:
    def __init__(self) -> None:
        self.batches: list[RecordBatch] = []
        self.bases: list[int] = []  # base offsets, for bisect
        self.durable_count = 0
        self.generation = 0
        self.hw_checkpoint = 0
        self.log_start = 0
        self.gaps = False

    @property
    def end_offset(self) -> int:
        return self.batches[-1].meta.next_offset if self.batches else self.log_start

    def append(self, meta: BatchMeta, data: bytes, generation: int) -> int:
        """Append at the log end; returns the offset the batch got there: ``meta.base_offset``,
        or the log end when that differs (then nothing is written: the shell's executor stops
        on the mismatch, as the real log's caller does)."""
        # The one exception to contiguity: an empty log started inside the leader's first batch
        # (its log start lies there) takes that batch whole.
        straddles = not self.batches and meta.base_offset < self.end_offset < meta.next_offset
        gap = self.gaps and meta.base_offset > self.end_offset
        if meta.base_offset != self.end_offset and not straddles and not gap:
            return self.end_offset
        self.generation = generation
        self.batches.append(RecordBatch(meta, data))
        self.bases.append(meta.base_offset)
        return meta.base_offset

    def truncate(self, offset: int, generation: int) -> None:
        index = bisect.bisect_left(self.bases, offset)
        if self.gaps:  # not inside a batch (but the one holding the log start)
            before = self.batches[index - 1].meta if index > 0 else None
            bad = before is not None and before.next_offset > offset > self.log_start
        else:
            bad = index < len(self.bases) and self.bases[index] != offset
        if bad:
            raise AssertionError(f"truncation to {offset} is not a batch boundary")
        if index < len(self.bases):
            self.log_start = min(self.log_start, offset)  # the new log end
        del self.batches[index:]
        del self.bases[index:]
        self.durable_count = min(self.durable_count, index)
        self.generation = generation

    def start_at(self, offset: int, generation: int) -> None:
        """A full truncation: empty, starting at ``offset`` (the leader's log start)."""
        self.batches.clear()
        self.bases.clear()
        self.durable_count = 0
        self.generation = generation
        self.log_start = offset

    def advance_log_start(self, offset: int) -> int:
        """Move the log start up to ``offset``; returns how many batches went from the head."""
        if offset > self.end_offset:
            raise AssertionError(f"log start {offset} above the log end {self.end_offset}")
        self.log_start = max(self.log_start, offset)
        gone = 0
        while gone < len(self.batches) and self.batches[gone].meta.next_offset <= self.log_start:
            gone += 1
        del self.batches[:gone]
        del self.bases[:gone]
        self.durable_count = max(0, self.durable_count - gone)
        return gone

    def sync(self, end_offset: int, generation: int) -> bool:
        """Complete an fsync issued when the log ended at ``end_offset``; False if stale."""
        if generation != self.generation:
            return False
        count = bisect.bisect_left(self.bases, end_offset)
        self.durable_count = max(self.durable_count, min(count, len(self.batches)))
        return True

    def crash(self, rng: random.Random, tear: bool, keep_page_cache: bool = False) -> None:
        """The process stops: the unsynced batches are lost (a prefix of them kept when the
        write tears), or all kept with ``keep_page_cache`` (the machine stays up)."""
        unsynced = len(self.batches) - self.durable_count
        keep = rng.randint(0, unsynced) if tear and unsynced else 0
        if keep_page_cache:
            keep = unsynced
        cut = self.durable_count + keep
        del self.batches[cut:]
        del self.bases[cut:]
        self.durable_count = cut  # recovery fsyncs the surviving tail
        self.generation += 1
        self.log_start = min(self.log_start, self.end_offset)  # recovery clamps it

    def epoch_cache(self) -> list[tuple[int, int]]:
        cache: list[tuple[int, int]] = []
        for batch in self.batches:
            if not cache or cache[-1][0] < batch.meta.leader_epoch:
                start = max(batch.meta.base_offset, self.log_start)
                cache.append((batch.meta.leader_epoch, start))
        return cache

    def batch_at(self, base_offset: int) -> RecordBatch | None:
        index = bisect.bisect_left(self.bases, base_offset)
        if index < len(self.bases) and self.bases[index] == base_offset:
            return self.batches[index]
        return None

    def read(self, fetch_offset: int, max_bytes: int, upper_offset: int) -> tuple[RecordBatch, ...]:
        """Whole batches from the one holding ``fetch_offset``, below ``upper_offset``, up to
        ``max_bytes`` but at least one (as Kafka does)."""
        index = bisect.bisect_right(self.bases, fetch_offset) - 1
        index = max(index, 0)
        out: list[RecordBatch] = []
        size = 0
        limit = 1000  # bound one read
        while index < len(self.batches) and len(out) < limit:
            batch = self.batches[index]
            if batch.meta.next_offset > upper_offset or (
                out and size + batch.meta.size_bytes > max_bytes
            ):
                break
            if batch.meta.next_offset > fetch_offset:
                out.append(batch)
                size += batch.meta.size_bytes
            index += 1
        return tuple(out)
