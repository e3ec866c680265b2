"""One replica's view of its own log, pure: offsets, high watermark, leader epochs, producers.

``ReplicaLog`` holds what the replication state machine (``partition.PartitionReplica``) knows
of the log the shell keeps on disk: where it starts, ends and is durable, the high watermark,
the epoch cache (Kafka's LeaderEpochFileCache: the first offset of each leader epoch), the
idempotent producers' state, and a generation counter. Its operations change that view and
put the matching log operations (``AppendBatch``, ``TruncateTo``, ``AdvanceLogStart``) and HW
checkpoints into the Ready the shell carries out.

Decisions:
- Truncation is synchronous from the state machine's view: the shell applies ``TruncateTo``
  before anything that follows it in the Ready. The ``generation``, bumped on every truncation,
  lets fsync reports from before a truncation be recognised and dropped.
- A truncation at or below the log start empties the log and starts it over at the log start
  (a full truncation): the log start may lie inside a batch (DeleteRecords moved it there, and
  the epoch cache's first entry with it), where no cut can land.
- Only committed data leaves the head of the log (the log start never passes the HW, which
  never moves back), so moving the log start changes nothing else; the epoch cache keeps the
  epoch in force at the new start, as Kafka's truncateFromStart.
- Producers' idempotent state (``producer_state``) and transaction state (``txn_state``)
  follow every append, truncation and log start move, so that they always equal what a
  replica rebuilt from the remaining log would hold; the last stable offset comes from the
  latter. A replica starts from a snapshot of them and the batches after it when it has one
  (``producer_snapshot``); a follower of a tiered topic that starts over at its leader's log
  start takes them from the remote tier's snapshot there (``adopt_remote_state``).
- A truncation below the high watermark happens only after an unclean election, when
  ``unclean_leader_election_enable`` is set, or where acknowledged records may never have
  reached a disk (``acks_before_fsync``: flush.messages > 1) and a power loss took them:
  committed data is then given up, knowingly.

Invariants (checked with explicit raises that survive ``python -O``):
- log_start_offset <= high_watermark <= log_end_offset; durable_end_offset <= log_end_offset;
- epochs in the epoch cache strictly increase, with non-decreasing start offsets, none below
  the log start, none above the log end;
- batches are appended contiguously at the log end (a follower's may start above it: a
  compacted leader log has gaps), with epochs never lower than the last one.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from raylog.actors.replication import producer_snapshot
from raylog.actors.replication.messages import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    BatchMeta,
    EpochEndOffset,
)
from raylog.actors.replication.producer_snapshot import ProducerSnapshot
from raylog.actors.replication.producer_state import NO_SEQUENCE, ProducerStateTable
from raylog.actors.replication.ready import (
    AdvanceLogStart,
    AppendBatch,
    Ready,
    TruncateTo,
    check_invariant,
)
from raylog.actors.replication.txn_state import NOT_CONTROL, TxnTable


class ReplicaLog:
    """The log as the state machine sees it. See the module docstring for the rules."""

    def __init__(
        self,
        log_start_offset: int,
        log_end_offset: int,
        epoch_cache: Iterable[tuple[int, int]],
        high_watermark: int,
        producer_batches: Iterable[BatchMeta],
        snapshot: ProducerSnapshot | None = None,
    ) -> None:
        """``producer_batches``: the headers of the log's producer batches in log order; with
        ``snapshot`` (usable for this log: :meth:`ProducerSnapshot.usable`), only those from
        its offset on, replayed over it."""
        check_invariant(0 <= log_start_offset <= log_end_offset, "log start must be <= log end")
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        # The shell fsync'd the recovered log: it is all durable.
        self.durable_end_offset = log_end_offset
        self.epoch_cache: list[tuple[int, int]] = list(epoch_cache)
        # The checkpoint, clamped into the log.
        self.high_watermark = max(log_start_offset, min(high_watermark, log_end_offset))
        self.generation = 0
        # Idempotent producers and transactions: checked on the leader, updated on every
        # replica's append.
        self.producers = ProducerStateTable()
        self.txns = TxnTable()
        self.producers.pinned = self.txns.has_open
        # Whether the two tables equal what the log below its end rebuilds: what a snapshot
        # may be taken of (see ``producer_snapshot``); a truncation that cuts ends it.
        self.snapshot_exact = True
        first = 0
        if snapshot is not None:
            self._load(snapshot)
            first = snapshot.offset
        batches = [b for b in producer_batches if b.producer_id >= 0 and b.base_offset >= first]
        # As a full rebuild does: the transactions first (the memory bound of the producers
        # keeps those with an open transaction), then the producers.
        for batch in batches:
            self.txns.update(batch, self.high_watermark)
        for b in batches:
            if has_sequence(b):
                self.producers.update(
                    b.producer_id, b.producer_epoch, b.base_sequence, b.base_offset, b.record_count
                )
        # Batches below the log start may still be on disk.
        self.producers.remove_before(log_start_offset)
        self.txns.remove_before(log_start_offset)

    def _load(self, snapshot: ProducerSnapshot) -> None:
        check_invariant(
            snapshot.usable(self.log_start_offset, self.log_end_offset, self.high_watermark),
            f"snapshot at {snapshot.offset} is usable",
        )
        self.producers, self.txns = snapshot.producers, snapshot.txns
        self.producers.pinned = self.txns.has_open
        self.txns.on_high_watermark(self.high_watermark)

    def adopt_remote_state(self, snapshot: ProducerSnapshot) -> None:
        """Tiered storage: after a full truncation, the log empty at its start, take the
        producer and transaction state the remote tier holds there (``snapshot``, at the log
        start), as a replica started from that snapshot would: a transaction open across the
        log start stays open, so its marker spans it and the LSO waits for it."""
        check_invariant(
            snapshot.offset == self.log_start_offset == self.log_end_offset,
            f"remote state at {snapshot.offset} for a log empty at {self.log_start_offset}",
        )
        self._load(snapshot)
        self.producers.remove_before(self.log_start_offset)
        self.txns.remove_before(self.log_start_offset)

    # --- epochs --------------------------------------------------------------------------------

    def epoch_at(self, offset: int) -> int:
        """Epoch of the batch holding ``offset`` (UNDEFINED below the log or in an empty log)."""
        if offset < self.log_start_offset or offset >= self.log_end_offset:
            return UNDEFINED_EPOCH
        index = bisect.bisect_right([start for _, start in self.epoch_cache], offset) - 1
        return self.epoch_cache[index][0] if index >= 0 else UNDEFINED_EPOCH

    @property
    def last_epoch(self) -> int:
        """Epoch of the last batch in the log (UNDEFINED_EPOCH when the log is empty)."""
        return self.epoch_at(self.log_end_offset - 1)

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        """Kafka's LeaderEpochFileCache.endOffsetFor over the epoch cache.

        - UNDEFINED requested, or requested above every known epoch: (UNDEFINED, UNDEFINED);
        - the latest epoch: (epoch, log end offset);
        - otherwise the largest known epoch <= requested (or the requested one itself when it is
          below every known epoch) with the start offset of the first epoch above requested.
        """
        if epoch == UNDEFINED_EPOCH or not self.epoch_cache:
            return EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        latest_epoch = self.epoch_cache[-1][0]
        if epoch == latest_epoch:
            return EpochEndOffset(epoch, self.log_end_offset)
        if epoch > latest_epoch:
            return EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        index = bisect.bisect_right(self.epoch_cache, (epoch, 1 << 62))
        higher_start = self.epoch_cache[index][1]
        floor_epoch = self.epoch_cache[index - 1][0] if index > 0 else epoch
        return EpochEndOffset(floor_epoch, higher_start)

    def start_epoch(self, leader_epoch: int) -> None:
        """KIP-101: a new leader's epoch starts at its log end."""
        self.epoch_cache.append((leader_epoch, self.log_end_offset))

    def drop_empty_epochs(self) -> None:
        """Forget epochs that start at our log end: they hold no batch (an earlier leadership of
        ours that wrote nothing), and would otherwise block the batches of older epochs that a
        new leader may still send us."""
        while self.epoch_cache and self.epoch_cache[-1][1] >= self.log_end_offset:
            self.epoch_cache.pop()

    # --- appends -------------------------------------------------------------------------------

    def empty_above_log_start(self) -> bool:
        """Nothing at or above our log start: a first batch from the leader may then start
        below our log end, when the leader's log start (where a full truncation started ours)
        lies inside that batch. The log restarts at the batch's base offset for it."""
        return self.log_end_offset == self.log_start_offset

    def append(self, batch: BatchMeta, data: bytes, replicated: bool, ready: Ready) -> None:
        if replicated:
            # A leader's compacted log has gaps between batches, and may hold a batch whose
            # records the cleaner all removed (kept for its producer's sequence).
            check_invariant(
                batch.base_offset >= self.log_end_offset or self.empty_above_log_start(),
                "offsets never go back",
            )
        else:
            check_invariant(batch.base_offset == self.log_end_offset, "offsets are contiguous")
        check_invariant(batch.record_count >= 1, "a batch spans at least one offset")
        if not self.epoch_cache or self.epoch_cache[-1][0] < batch.leader_epoch:
            # Invariant: no epoch starts below the log start (a batch may straddle it).
            start = max(batch.base_offset, self.log_start_offset)
            self.epoch_cache.append((batch.leader_epoch, start))
        check_invariant(
            self.epoch_cache[-1][0] == batch.leader_epoch, "batch epochs never go backwards"
        )
        self.log_end_offset = batch.next_offset
        aborted = self.txns.update(batch, self.high_watermark)
        if has_sequence(batch):
            self.producers.update(
                batch.producer_id,
                batch.producer_epoch,
                batch.base_sequence,
                batch.base_offset,
                batch.record_count,
            )
        ready.log_ops.append(AppendBatch(batch, data, self.generation, replicated, aborted))

    def mark_durable(self, generation: int, end_offset: int) -> bool:
        """An fsync covering ``end_offset`` completed; returns whether the durable end grew
        (a report from before a truncation, another generation, changes nothing)."""
        if generation != self.generation:
            return False  # those offsets may hold other batches now
        new_durable = min(end_offset, self.log_end_offset)
        if new_durable <= self.durable_end_offset:
            return False
        self.durable_end_offset = new_durable
        return True

    # --- high watermark and log start ----------------------------------------------------------

    def set_high_watermark(self, new_hw: int, ready: Ready) -> None:
        check_invariant(new_hw >= self.high_watermark, "the high watermark never moves backwards")
        check_invariant(new_hw <= self.log_end_offset, "high_watermark <= log_end_offset")
        if new_hw != self.high_watermark:
            self.high_watermark = new_hw
            self.txns.on_high_watermark(new_hw)
            ready.checkpoint_high_watermark = new_hw

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: the first offset of the oldest transaction not decided yet, or the
        high watermark (see ``txn_state``)."""
        return self.txns.last_stable_offset(self.log_start_offset, self.high_watermark)

    def advance_log_start(self, offset: int, ready: Ready) -> None:
        """Move our log start up to ``offset`` (<= the HW) and have the shell do it on disk."""
        check_invariant(offset <= self.high_watermark, "the log start never passes the HW")
        self.move_log_start(offset)
        ready.log_ops.append(AdvanceLogStart(offset))

    def move_log_start(self, start: int) -> None:
        """Only committed data goes (never above the high watermark, which never moves back),
        so nothing else changes; the epoch cache keeps the epoch in force at the new start, as
        Kafka's truncateFromStart."""
        self.log_start_offset = start
        self.producers.remove_before(start)
        self.txns.remove_before(start)
        if start >= self.log_end_offset:
            self.txns.forget_open()  # nothing of them is left (``txn_state``)
        kept = [(e, s) for e, s in self.epoch_cache if s > start]
        covering = [e for e, s in self.epoch_cache if s <= start]
        if covering:
            kept.insert(0, (covering[-1], start))
        self.epoch_cache = kept

    # --- truncation ----------------------------------------------------------------------------

    def truncate(self, offset: int, unclean: bool, ready: Ready) -> None:
        """Cut the log at ``offset`` (a batch boundary); ``unclean``: giving up committed data
        is acceptable (an unclean election, or acknowledged records that no disk may hold)."""
        if offset >= self.log_end_offset:
            self.drop_empty_epochs()
            return
        if offset <= self.log_start_offset:
            # Nothing at or above our log start stays, and the log start may lie inside a
            # batch, where no cut can land: empty the log and start over at the log start.
            self.truncate_fully(self.log_start_offset, unclean, ready)
            return
        if offset < self.high_watermark:
            check_invariant(
                unclean, f"truncation to {offset} below the high watermark {self.high_watermark}"
            )
            # Only where committed data may be given up (see the module's docstring).
            self.high_watermark = offset
            ready.checkpoint_high_watermark = offset
        self.generation += 1
        self.snapshot_exact = False
        self.log_end_offset = offset
        self.durable_end_offset = min(self.durable_end_offset, offset)
        self.epoch_cache = [(e, s) for e, s in self.epoch_cache if s < offset]
        self.producers.truncate(offset)
        self.txns.truncate(offset)
        ready.log_ops.append(TruncateTo(offset, self.generation))

    def truncate_fully(self, new_start_offset: int, unclean: bool, ready: Ready) -> None:
        """Empty the log and start it over at ``new_start_offset`` (Kafka's
        truncateFullyAndStartAt)."""
        check_invariant(
            self.high_watermark <= new_start_offset or unclean,
            "a full truncation may not drop data below the high watermark",
        )
        self.generation += 1
        self.snapshot_exact = True  # empty, as a rebuild of an empty log
        self.log_start_offset = new_start_offset
        self.log_end_offset = new_start_offset
        self.durable_end_offset = new_start_offset
        self.high_watermark = new_start_offset
        self.epoch_cache = []
        self.producers.clear()
        self.txns.clear()
        ready.log_ops.append(TruncateTo(new_start_offset, self.generation, full=True))
        ready.checkpoint_high_watermark = new_start_offset

    # --- snapshots -----------------------------------------------------------------------------

    def snapshot(self) -> bytes | None:
        """A producer-state snapshot at the log end (``producer_snapshot``), or None when none
        may be taken now: the log end is not durable yet, or the state is not exact."""
        if not self.snapshot_exact or self.durable_end_offset != self.log_end_offset:
            return None
        return producer_snapshot.encode(
            self.log_end_offset, self.high_watermark, self.producers, self.txns
        )

    def check_invariants(self) -> None:
        check_invariant(
            self.log_start_offset <= self.high_watermark <= self.log_end_offset,
            f"log_start {self.log_start_offset} <= hw {self.high_watermark} <= "
            f"leo {self.log_end_offset}",
        )
        check_invariant(self.durable_end_offset <= self.log_end_offset, "durable_end <= log_end")
        previous_epoch, previous_start = UNDEFINED_EPOCH, self.log_start_offset
        for epoch, start in self.epoch_cache:
            check_invariant(epoch > previous_epoch, "epoch cache epochs strictly increase")
            check_invariant(
                previous_start <= start <= self.log_end_offset, "epoch starts are ordered"
            )
            previous_epoch, previous_start = epoch, start


def has_sequence(batch: BatchMeta) -> bool:
    """Whether ``batch`` joins its producer's idempotent state: a data batch with a sequence
    (not a transaction marker, nor a coordinator's write without one)."""
    return (
        batch.producer_id >= 0
        and batch.control_type == NOT_CONTROL
        and batch.base_sequence != NO_SEQUENCE
    )
