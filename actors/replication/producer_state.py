"""Idempotent-producer state of one partition replica: pure, deterministic, no I/O.

This module owns Kafka's per-partition producer bookkeeping (ProducerStateManager,
ProducerAppendInfo and ProducerStateEntry in Kafka's storage module) for idempotent,
non-transactional producers: per producer id its epoch and its last five batches (first and
last sequence, base and next offset), the check a leader makes before appending a client batch,
the update every replica makes on every append (from the batch header alone, so followers and a
restarted replica rebuild the same state from the log), and what a truncation leaves.

Kafka's rules (ProducerAppendInfo.checkProducerEpoch / checkSequence, Kafka >= 2.5), in order:

1. producerId < 0: not idempotent, none of this applies.
2. No state for the producer (never seen, or forgotten): accept any sequence (KIP-360: the
   leader no longer answers UNKNOWN_PRODUCER_ID; its records may have been removed by
   retention, and refusing would make the client reset and re-send, duplicating).
3. Duplicate: same epoch, and (first, last) sequence equal to one of the last five batches:
   success with that batch's ORIGINAL offsets, nothing appended (never
   DUPLICATE_SEQUENCE_NUMBER: kafkajs cannot handle it).
4. Epoch below the producer's current epoch: INVALID_PRODUCER_EPOCH (47).
5. Epoch above it (a bumped epoch): the batch must start at sequence 0, else
   OUT_OF_ORDER_SEQUENCE_NUMBER (45).
6. Same epoch: the first sequence must be the last sequence + 1, where Int32.MaxValue is
   followed by 0 (sequences wrap), else OUT_OF_ORDER_SEQUENCE_NUMBER (45).

Updates (every replica, leader or follower, on every append, no checks: the leader checked):
an epoch different from the producer's clears its batches; the batch joins the window and the
oldest of more than five leaves it. The last batch that left is remembered so that a
truncation which removes the whole window can still restore the newest batch below it.

Truncation (a follower cutting its log at ``offset``): batches at or above ``offset`` leave the
window. If none is left, the producer falls back to the last evicted batch when that lies below
``offset`` (exact: it is the newest batch of the producer below the cut), else it is forgotten,
which rule 2 makes safe (Kafka's own answer when it has no state). Forgetting instead of
guessing happens only when more than five batches of one producer sat above the cut.

Retention: when the log start moves, producers whose last batch lies below it are forgotten
(Kafka's evictUnretainedProducers), so a live replica keeps what one restarted from the
remaining log would rebuild.

Not implemented (Kafka has it): ``producer.id.expiration.ms`` (batch timestamps are not
tracked). Snapshots of this state (``producer_snapshot``) spare a restarted replica most of
the log's batch headers: :meth:`ProducerStateTable.export` and :meth:`ProducerStateTable.load`.
Transactions are ``txn_state``'s. Memory is bounded
instead by ``max_producers``: past it the producer that appended least recently is forgotten
(rule 2 again), never one that ``pinned`` names (a producer with an open transaction).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from raylog.storage.errors import InvalidProducerEpochError, OutOfOrderSequenceError

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
MAX_SEQUENCE = (1 << 31) - 1  # Int32.MaxValue: the sequence after it is 0
BATCHES_RETAINED = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
MAX_PRODUCERS_DEFAULT = 10_000  # per partition replica; bounds memory (see the docstring)

APPEND = "append"
DUPLICATE = "duplicate"
ERROR = "error"


def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment`` in Kafka's wrapping sequence space [0, Int32.MaxValue]."""
    if sequence > MAX_SEQUENCE - increment:
        return increment - (MAX_SEQUENCE - sequence) - 1
    return sequence + increment


def in_sequence(last_sequence: int, next_sequence: int) -> bool:
    return next_sequence == last_sequence + 1 or (
        next_sequence == 0 and last_sequence == MAX_SEQUENCE
    )


class ProducerBatch(NamedTuple):
    """One appended batch of a producer, as the window keeps it."""

    producer_epoch: int
    first_sequence: int
    last_sequence: int
    base_offset: int
    next_offset: int  # the batch's last offset + 1


class Verdict(NamedTuple):
    """The leader's decision on a client batch.

    ``kind`` is APPEND, DUPLICATE (``base_offset``/``next_offset`` are the original batch's) or
    ERROR (``error_code`` 45 or 47, ``message`` for logs).
    """

    kind: str
    error_code: int = 0
    base_offset: int = -1
    next_offset: int = -1
    message: str = ""


_APPEND = Verdict(APPEND)


@dataclass
class ProducerEntry:
    producer_epoch: int
    batches: deque[ProducerBatch] = field(default_factory=lambda: deque(maxlen=BATCHES_RETAINED))
    last_evicted: ProducerBatch | None = None

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE


class ProducerStateTable:
    """The producer state of one partition replica (see the module docstring)."""

    def __init__(self, max_producers: int = MAX_PRODUCERS_DEFAULT) -> None:
        if max_producers < 1:
            raise ValueError(f"max_producers must be >= 1, got {max_producers}")
        self.max_producers = max_producers
        # Insertion order is append recency: the first entry appended least recently.
        self._entries: dict[int, ProducerEntry] = {}
        # Producers the memory bound must keep (those with an open transaction).
        self.pinned: Callable[[int], bool] = lambda producer_id: False

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._entries.get(producer_id)

    def check(
        self, producer_id: int, producer_epoch: int, base_sequence: int, record_count: int
    ) -> Verdict:
        """Rules 1-6 of the module docstring for a client batch, before the leader appends it."""
        if producer_id < 0:
            return _APPEND
        entry = self._entries.get(producer_id)
        if entry is None:
            return _APPEND  # rule 2 (KIP-360)
        last_sequence = increment_sequence(base_sequence, record_count - 1)
        if producer_epoch == entry.producer_epoch:
            for batch in entry.batches:
                if batch.first_sequence == base_sequence and batch.last_sequence == last_sequence:
                    return Verdict(DUPLICATE, 0, batch.base_offset, batch.next_offset)
        if producer_epoch < entry.producer_epoch:
            return Verdict(
                ERROR,
                InvalidProducerEpochError.error_code,
                message=f"producer {producer_id}: epoch {producer_epoch} is older than "
                f"{entry.producer_epoch}",
            )
        if producer_epoch > entry.producer_epoch:
            if base_sequence != 0:
                return Verdict(
                    ERROR,
                    OutOfOrderSequenceError.error_code,
                    message=f"producer {producer_id}: new epoch {producer_epoch} starts at "
                    f"sequence {base_sequence}, not 0",
                )
            return _APPEND
        if not in_sequence(entry.last_sequence, base_sequence):
            return Verdict(
                ERROR,
                OutOfOrderSequenceError.error_code,
                message=f"producer {producer_id}: sequence {base_sequence} does not follow "
                f"{entry.last_sequence} (epoch {producer_epoch})",
            )
        return _APPEND

    def update(
        self,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        base_offset: int,
        record_count: int,
    ) -> None:
        """Record an appended batch (every replica, every append, in log order)."""
        if producer_id < 0:
            return
        entry = self._entries.pop(producer_id, None)  # re-inserted last: most recent
        if entry is None or entry.producer_epoch != producer_epoch:
            entry = ProducerEntry(producer_epoch)
        if len(entry.batches) == BATCHES_RETAINED:
            entry.last_evicted = entry.batches[0]
        entry.batches.append(
            ProducerBatch(
                producer_epoch,
                base_sequence,
                increment_sequence(base_sequence, record_count - 1),
                base_offset,
                base_offset + record_count,
            )
        )
        self._entries[producer_id] = entry
        if len(self._entries) > self.max_producers:
            self._evict(len(self._entries) - self.max_producers)

    def _evict(self, excess: int) -> None:
        """Forget the ``excess`` least recently appended producers that are not pinned."""
        idle: list[int] = []
        for producer_id in self._entries:
            if not self.pinned(producer_id):
                idle.append(producer_id)
                if len(idle) == excess:
                    break
        for producer_id in idle:
            del self._entries[producer_id]

    def truncate(self, offset: int) -> None:
        """Forget every batch at or above ``offset`` (see the module docstring)."""
        for producer_id in list(self._entries):
            entry = self._entries[producer_id]
            # Invariant: an entry's window is never empty. Batches are whole, so each lies
            # entirely below the cut or entirely at or above it.
            if entry.batches[-1].base_offset < offset:
                continue
            while entry.batches and entry.batches[-1].base_offset >= offset:
                entry.batches.pop()
            if entry.batches:
                continue
            evicted = entry.last_evicted
            if evicted is not None and evicted.next_offset <= offset:
                entry.producer_epoch = evicted.producer_epoch
                entry.batches.append(evicted)
                entry.last_evicted = None
            else:
                del self._entries[producer_id]

    def remove_before(self, log_start_offset: int) -> None:
        """Retention moved the log start: forget producers whose last batch lies wholly below
        it (Kafka's evictUnretainedProducers), as a replica rebuilding from the log would."""
        for producer_id in list(self._entries):
            if self._entries[producer_id].batches[-1].next_offset <= log_start_offset:
                del self._entries[producer_id]

    def clear(self) -> None:
        self._entries.clear()

    def export(self) -> list[tuple[int, int, list[ProducerBatch], ProducerBatch | None]]:
        """Every producer's ``(producer id, epoch, window, last evicted batch)``, least
        recently appended first: what :meth:`load` restores exactly."""
        return [
            (pid, e.producer_epoch, list(e.batches), e.last_evicted)
            for pid, e in self._entries.items()
        ]

    def load(
        self, entries: Iterable[tuple[int, int, list[ProducerBatch], ProducerBatch | None]]
    ) -> None:
        """Replace the state with what :meth:`export` gave (raises ValueError on an entry that
        breaks the table's invariants: an empty or oversized window)."""
        self.clear()
        for producer_id, producer_epoch, batches, last_evicted in entries:
            if not 1 <= len(batches) <= BATCHES_RETAINED or producer_id < 0:
                raise ValueError(f"producer {producer_id}: {len(batches)} batches")
            entry = ProducerEntry(producer_epoch)
            entry.batches.extend(batches)
            entry.last_evicted = last_evicted
            self._entries[producer_id] = entry

    def rebuild(self, batches: Iterable[tuple[int, int, int, int, int]]) -> None:
        """Replace the state with the one a log of these batches leaves: ``(producer_id,
        producer_epoch, base_sequence, base_offset, record_count)`` in log order."""
        self.clear()
        for producer_id, producer_epoch, base_sequence, base_offset, record_count in batches:
            self.update(producer_id, producer_epoch, base_sequence, base_offset, record_count)
