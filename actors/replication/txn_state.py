"""Transaction state of one partition replica: pure, deterministic, no I/O.

This module owns the partition side of Kafka's transactions (KIP-98), as Kafka's
ProducerStateManager, ProducerAppendInfo, TxnMetadata and the transaction index keep it: per
transactional producer its open transaction (Kafka's currentTxnFirstOffset), its recent
completed transactions and the coordinator epoch of its last marker; for the partition the
aborted transactions (Kafka's .txnindex entries) and the first unstable offset, from which the
last stable offset (LSO) follows. Every replica updates it from batch metadata alone
(``messages.BatchMeta``: the transactional bit, the marker type and coordinator epoch), so
followers and a restarted replica rebuild the same state from the log.

Rules (Kafka's):
- A transactional data batch of a producer with no open transaction opens one at its base
  offset. A transaction marker (a control batch) of that producer closes it; the transaction
  spans [first offset, marker offset]. An ABORT adds (producer id, first offset, marker offset)
  to the aborted list. A marker of a producer with no open transaction spans only itself
  (Kafka's ``currentTxnFirstOffset.orElse(offset)``): harmless, and a retried marker is safe.
- First unstable offset: the first offset of the oldest transaction that is open, or closed by
  a marker the high watermark has not passed yet (Kafka's unreplicatedTxns: its outcome may
  still be truncated away). LSO = that offset, never below the log start nor above the high
  watermark; the high watermark when there is none.
- Leader checks (:meth:`TxnTable.check`): a marker's producer epoch below the producer's
  current one -> INVALID_PRODUCER_EPOCH (47); a marker's coordinator epoch below the last one
  seen for the producer -> TRANSACTION_COORDINATOR_FENCED (52); a non-transactional batch of a
  producer with an open transaction -> INVALID_TXN_STATE (48); a data batch of an epoch below
  the one a marker bumped the producer to -> INVALID_PRODUCER_EPOCH (47). Sequence checks of
  transactional batches are the idempotent ones (``producer_state``).
- Truncation at ``offset``: transactions opened at or above it disappear; a transaction whose
  marker is cut but whose first offset stays is open again; aborted entries whose marker is
  cut leave the list. Each producer keeps its last ``TXNS_RETAINED`` completed transactions
  for this; past that, as ``producer_state`` forgets batches, a cut may forget instead of
  reopening (only when more than that many transactions of one producer ended above the cut).
- Log start moves (retention, DeleteRecords): aborted entries wholly below the new start
  leave; open transactions stay (their LSO is clamped to the log start, as Kafka's
  maybeIncrementFirstUnstableOffset does) until their marker comes, except when the log start
  reaches the log end (:meth:`forget_open`): a log that holds nothing holds no transaction, as
  a rebuild of it would say. (A mirror topic's source may have deleted the markers with the
  rest: the mirror's LSO would otherwise stay at its log start for good.)
- Memory: transactional producers past ``max_producers`` are forgotten least recently
  appended first, never one with an open transaction (the coordinator's
  transaction.timeout.ms ends every transaction with a marker). The aborted list holds the
  log's aborted transactions, each as its ``.txnindex`` entry (with the LSO when its marker
  came: the first offset of the oldest other open transaction, else the marker's offset + 1).
  The list is kept whole, not bounded to the active segment: truncation and the log start
  act on it, and a replica's state must equal what the remaining log rebuilds; it costs one
  small tuple per aborted transaction. Read_committed fetches are answered from the log's
  ``.txnindex`` files (the replica shell writes each entry :meth:`update` returns).
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from raylog.actors.replication.messages import BatchMeta
from raylog.actors.replication.producer_state import MAX_PRODUCERS_DEFAULT, NO_SEQUENCE
from raylog.storage.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    TransactionCoordinatorFencedError,
)
from raylog.storage.log.txnindex import AbortedTxn

NOT_CONTROL = -1  # BatchMeta.control_type of a data batch
# BatchMeta.control_type of a control batch that is no transaction marker: one the log cleaner
# emptied (kept for its producer's sequence), or another control type. It changes nothing here.
CONTROL_NONE = -2
CONTROL_ABORT = 0  # Kafka's ControlRecordType.ABORT
CONTROL_COMMIT = 1
NO_COORDINATOR_EPOCH = -1
TXNS_RETAINED = 5  # completed transactions remembered per producer (for truncation)


class CompletedTxn(NamedTuple):
    """A transaction a marker closed: [first_offset, last_offset] (the marker's offset)."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool
    producer_epoch: int
    coordinator_epoch: int


class TxnTableState(NamedTuple):
    """A :class:`TxnTable`'s whole state (:meth:`TxnTable.export`): per producer ``(producer
    id, open first offset, open epoch, completed transactions, marker epoch, coordinator
    epoch)``, the aborted list and the unreplicated transactions, each in marker order."""

    entries: list[tuple[int, int, int, list[CompletedTxn], int, int]]
    aborted: list[AbortedTxn]
    unreplicated: list[CompletedTxn]


@dataclass
class TxnEntry:
    """One transactional producer's state."""

    open_first_offset: int = -1  # Kafka's currentTxnFirstOffset; -1: no open transaction
    open_epoch: int = -1  # the producer epoch of the open transaction's batches
    completed: deque[CompletedTxn] = field(default_factory=lambda: deque(maxlen=TXNS_RETAINED))
    # What the newest marker said, kept when a truncation empties ``completed``.
    marker_epoch: int = -1
    coordinator_epoch: int = NO_COORDINATOR_EPOCH

    @property
    def is_open(self) -> bool:
        return self.open_first_offset >= 0

    @property
    def producer_epoch(self) -> int:
        """The newest epoch this producer's transactional batches and markers carried."""
        return max(self.open_epoch, self.marker_epoch)


class TxnTable:
    """The transaction state of one partition replica (see the module docstring)."""

    def __init__(self, max_producers: int = MAX_PRODUCERS_DEFAULT) -> None:
        if max_producers < 1:
            raise ValueError(f"max_producers must be >= 1, got {max_producers}")
        self.max_producers = max_producers
        # Insertion order is append recency: the first entry appended least recently.
        self._entries: dict[int, TxnEntry] = {}
        # Aborted transactions in marker (last offset) order.
        self._aborted: list[AbortedTxn] = []
        # Closed transactions whose marker the high watermark has not passed, marker order.
        self._unreplicated: list[CompletedTxn] = []

    # --- reading ------------------------------------------------------------------------------

    def entry(self, producer_id: int) -> TxnEntry | None:
        return self._entries.get(producer_id)

    def has_open(self, producer_id: int) -> bool:
        entry = self._entries.get(producer_id)
        return entry is not None and entry.is_open

    @property
    def open_transactions(self) -> int:
        return sum(1 for e in self._entries.values() if e.is_open)

    def open_spans(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction."""
        return {pid: e.open_first_offset for pid, e in self._entries.items() if e.is_open}

    @property
    def aborted(self) -> list[AbortedTxn]:
        return list(self._aborted)

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open or unreplicated transaction (None: none)."""
        firsts = [e.open_first_offset for e in self._entries.values() if e.is_open]
        firsts += [t.first_offset for t in self._unreplicated]
        return min(firsts) if firsts else None

    def last_stable_offset(self, log_start_offset: int, high_watermark: int) -> int:
        """Kafka's LSO: the first unstable offset within [log start, high watermark]."""
        first = self.first_unstable_offset()
        if first is None:
            return high_watermark
        return min(max(first, log_start_offset), high_watermark)

    def aborted_between(self, start_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [start_offset, upper_offset) (Kafka's
        collectAbortedTransactions): first offset below the upper bound, marker at or above
        the start."""
        index = bisect.bisect_left(self._aborted, start_offset, key=lambda t: t.last_offset)
        return [t for t in self._aborted[index:] if t.first_offset < upper_offset]

    # --- the leader's checks ----------------------------------------------------------------------

    def check(
        self,
        producer_id: int,
        producer_epoch: int,
        is_transactional: bool,
        control_type: int,
        coordinator_epoch: int,
        idempotent_epoch: int,
    ) -> tuple[int, str]:
        """The leader's transaction checks of one batch (the module docstring's rules):
        ``(0, "")`` or ``(error code, message)``. ``idempotent_epoch`` is the producer's epoch
        in the idempotent state (-1: unknown)."""
        if producer_id < 0:
            return 0, ""
        entry = self._entries.get(producer_id)
        if control_type != NOT_CONTROL:
            current = max(idempotent_epoch, entry.producer_epoch if entry else -1)
            if producer_epoch < current:
                return (
                    InvalidProducerEpochError.error_code,
                    f"marker of producer {producer_id}: epoch {producer_epoch} is older "
                    f"than {current}",
                )
            if entry is not None and coordinator_epoch < entry.coordinator_epoch:
                return (
                    TransactionCoordinatorFencedError.error_code,
                    f"marker of producer {producer_id}: coordinator epoch {coordinator_epoch} "
                    f"is older than {entry.coordinator_epoch}",
                )
            return 0, ""
        if entry is None:
            return 0, ""
        if not is_transactional and entry.is_open:
            return (
                InvalidTxnStateError.error_code,
                f"non-transactional batch of producer {producer_id}, whose transaction "
                f"from offset {entry.open_first_offset} is open",
            )
        if producer_epoch < entry.producer_epoch:
            return (
                InvalidProducerEpochError.error_code,
                f"producer {producer_id}: epoch {producer_epoch} is older than "
                f"{entry.producer_epoch}",
            )
        return 0, ""

    # --- updates (every replica, every append, in log order) -------------------------------------

    def update(self, batch: BatchMeta, high_watermark: int) -> AbortedTxn | None:
        """Record an appended batch; returns the aborted transaction an ABORT marker closed
        (for the log's ``.txnindex``), else None."""
        if batch.producer_id < 0 or not batch.is_transactional:
            return None
        if batch.control_type == CONTROL_NONE:
            return None
        pid = batch.producer_id
        aborted = None
        entry = self._entries.pop(pid, None) or TxnEntry()  # re-inserted last: most recent
        self._entries[pid] = entry
        if batch.control_type == NOT_CONTROL:
            if not entry.is_open:
                entry.open_first_offset = batch.base_offset
            entry.open_epoch = max(entry.open_epoch, batch.producer_epoch)
        else:
            first = entry.open_first_offset if entry.is_open else batch.base_offset
            done = CompletedTxn(
                pid,
                first,
                batch.base_offset,
                batch.control_type == CONTROL_ABORT,
                batch.producer_epoch,
                batch.coordinator_epoch,
            )
            entry.open_first_offset = -1
            entry.open_epoch = -1
            entry.completed.append(done)
            entry.marker_epoch = batch.producer_epoch
            entry.coordinator_epoch = batch.coordinator_epoch
            if done.aborted:
                aborted = AbortedTxn(
                    pid, done.first_offset, done.last_offset, self._stable_after(done)
                )
                self._aborted.append(aborted)
            if done.last_offset >= high_watermark:
                self._unreplicated.append(done)
        self._evict()
        return aborted

    def _stable_after(self, done: CompletedTxn) -> int:
        """The LSO a ``.txnindex`` entry records for ``done`` (Kafka's
        ProducerStateManager.lastStableOffset(completedTxn)): the first offset of the oldest
        other open transaction, else the offset after the marker."""
        firsts = [
            e.open_first_offset
            for pid, e in self._entries.items()
            if e.is_open and pid != done.producer_id
        ]
        return min(firsts, default=done.last_offset + 1)

    def _evict(self) -> None:
        excess = len(self._entries) - self.max_producers
        if excess <= 0:
            return
        idle: list[int] = []
        for pid, entry in self._entries.items():
            if not entry.is_open:
                idle.append(pid)
                if len(idle) == excess:
                    break
        for pid in idle:
            del self._entries[pid]

    def on_high_watermark(self, high_watermark: int) -> None:
        """The high watermark moved: transactions whose marker it passed are stable."""
        if self._unreplicated and self._unreplicated[0].last_offset < high_watermark:
            self._unreplicated = [t for t in self._unreplicated if t.last_offset >= high_watermark]

    def truncate(self, offset: int) -> None:
        """Forget every batch at or above ``offset`` (see the module docstring)."""
        self._aborted = [t for t in self._aborted if t.last_offset < offset]
        # Every transaction whose marker the HW has not passed is here, so a cut at or above
        # the HW (every clean one) finds each producer's cut transaction among them.
        cut = [t for t in self._unreplicated if t.last_offset >= offset]
        self._unreplicated = [t for t in self._unreplicated if t.last_offset < offset]
        for pid in list(self._entries):
            entry = self._entries[pid]
            if entry.is_open and entry.open_first_offset >= offset:
                entry.open_first_offset = entry.open_epoch = -1
            lost = [t for t in cut if t.producer_id == pid]
            while entry.completed and entry.completed[-1].last_offset >= offset:
                lost.append(entry.completed.pop())
            if lost:
                # The producer's oldest transaction whose marker is cut: open again if it
                # began below the cut (every later one began after that marker).
                oldest = min(lost, key=lambda t: t.last_offset)
                if oldest.first_offset < offset:
                    entry.open_first_offset = oldest.first_offset
                    entry.open_epoch = oldest.producer_epoch
                if not entry.completed:
                    entry.completed.extend(t for t in self._unreplicated if t.producer_id == pid)
                newest = entry.completed[-1] if entry.completed else None
                entry.marker_epoch = newest.producer_epoch if newest else -1
                entry.coordinator_epoch = newest.coordinator_epoch if newest else -1
            if not entry.is_open and not entry.completed:
                del self._entries[pid]  # nothing of it is left below the cut that we know

    def remove_before(self, log_start_offset: int) -> None:
        """The log start moved: aborted transactions wholly below it leave the list."""
        index = bisect.bisect_left(self._aborted, log_start_offset, key=lambda t: t.last_offset)
        if index:
            del self._aborted[:index]
        self._unreplicated = [t for t in self._unreplicated if t.last_offset >= log_start_offset]

    def forget_open(self) -> None:
        """Close every open transaction without a marker (the log holds none of their
        batches any more); a producer with nothing else to remember leaves the table."""
        for pid in list(self._entries):
            entry = self._entries[pid]
            if entry.is_open:
                entry.open_first_offset = -1
                if not entry.completed:
                    del self._entries[pid]

    def clear(self) -> None:
        self._entries.clear()
        self._aborted.clear()
        self._unreplicated.clear()

    def export(self) -> TxnTableState:
        """The whole state, producers least recently appended first: what :meth:`load`
        restores exactly (the aborted list included: see ``producer_snapshot``)."""
        return TxnTableState(
            [
                (
                    pid,
                    e.open_first_offset,
                    e.open_epoch,
                    list(e.completed),
                    e.marker_epoch,
                    e.coordinator_epoch,
                )
                for pid, e in self._entries.items()
            ],
            list(self._aborted),
            list(self._unreplicated),
        )

    def load(self, state: TxnTableState) -> None:
        """Replace the state with what :meth:`export` gave (raises ValueError on one that
        breaks the table's invariants)."""
        self.clear()
        for pid, first, epoch, completed, marker_epoch, coordinator_epoch in state.entries:
            if pid < 0 or len(completed) > TXNS_RETAINED or (first < 0 and not completed):
                raise ValueError(f"transactional producer {pid}: bad entry")
            entry = TxnEntry(first, epoch, marker_epoch=marker_epoch)
            entry.completed.extend(completed)
            entry.coordinator_epoch = coordinator_epoch
            self._entries[pid] = entry
        for txns in (state.aborted, state.unreplicated):
            if any(a.last_offset >= b.last_offset for a, b in itertools.pairwise(txns)):
                raise ValueError("transactions out of marker order")
        self._aborted = list(state.aborted)
        self._unreplicated = list(state.unreplicated)

    def rebuild(self, batches: Iterable[BatchMeta], high_watermark: int) -> None:
        """Replace the state with the one a log of these batches leaves, in log order."""
        self.clear()
        for batch in batches:
            self.update(batch, high_watermark)


def is_coordinator_write(batch_producer_id: int, base_sequence: int, transactional: bool) -> bool:
    """A transactional batch with a producer id and no sequence: a raylog coordinator's write
    to an internal topic (Kafka's AppendOrigin.COORDINATOR), which skips sequence checks."""
    return batch_producer_id >= 0 and transactional and base_sequence == NO_SEQUENCE
