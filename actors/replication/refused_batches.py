"""Idempotent batches a leader refused without appending them, pure: what keeps the batches a
producer pipelined behind a refused one from being answered OUT_OF_ORDER_SEQUENCE_NUMBER.

A Kafka client keeps up to five batches of one partition in flight. The leader may refuse the
first of them (R1) with a retriable error before appending it: not the leader yet, its broker
session lease lapsed, the ISR below ``min.insync.replicas``, too many requests pending. If its
state changes before the next one (R2) arrives (it becomes leader, its lease is renewed, a
follower rejoins the ISR), R2 passes the admission checks, and its sequence does not follow the
producer's last one: Kafka's answer is OUT_OF_ORDER_SEQUENCE_NUMBER (45). librdkafka takes a 45
on a batch that was not the first in flight as "skipped sequence numbers" and bumps the
producer's epoch, which renumbers every record not yet acknowledged on every partition,
including records whose answer was lost with a broken connection although they were
appended: those are appended a second time under the new epoch, the duplicates idempotence
exists to prevent. A restarting cluster, where leaderships, leases and ISRs change by the
second, makes this likely (a whole-cluster crash and restart under an idempotent producer
showed it).

So the leader remembers, per producer, the lowest sequence it refused with a retriable error,
with its epoch and error, for :data:`HOLD_MS`. A later batch of the same producer and epoch
whose sequence lies after it, while the producer's state has not reached it, gets that same
retriable error instead: the client retries the refused batch and the ones behind it in order,
as if the leader had refused them together. The retry of the refused batch itself goes on as
usual; once the producer's state has reached the refused sequence (the retry was appended,
here or, replicated, from another leader), or the producer moved to a newer epoch, the record
is dropped. A gap that no retry fills (the client gave the refused records up) is answered 45
once the record expires, as Kafka answers it.

The gateway keeps the same table per partition and producer for the refusals it answers
itself (no leader in its metadata, the leader's replica not reachable), which the replica
never sees: ``raylog.gateway.handlers.produce``, rule 3.

Sequences wrap from Int32.MaxValue to 0 (``producer_state``): "after" means less than half the
sequence space ahead. Bounded: at most :data:`MAX_PRODUCERS` records, the oldest leaves first.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, NamedTuple, TypeVar

from raylog.actors.replication.producer_state import MAX_SEQUENCE
from raylog.storage.errors import (
    KafkaStorageError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
)

LEADER_NOT_AVAILABLE = 5  # Kafka's code; the gateway answers it when no leader is known
# The refusals a client retries without moving on (Kafka's retriable produce errors that
# leave nothing appended).
RETRIABLE = frozenset(
    {
        LEADER_NOT_AVAILABLE,
        NotLeaderOrFollowerError.error_code,
        RequestTimedOutError.error_code,
        NotEnoughReplicasError.error_code,
        KafkaStorageError.error_code,
    }
)
HOLD_MS = 30_000  # a client's request.timeout.ms: its pipelined batches arrive within it
MAX_PRODUCERS = 1_000
_SPACE = MAX_SEQUENCE + 1
_HALF = _SPACE // 2


def _ahead(sequence: int, of: int) -> int:
    """How far ``sequence`` lies after ``of`` in the wrapping sequence space, in [0, 2^31)."""
    return (sequence - of) % _SPACE


class Refusal(NamedTuple):
    producer_epoch: int
    base_sequence: int
    error_code: int
    until_ms: int


K = TypeVar("K", bound=Hashable)


class RefusedBatches(Generic[K]):
    """Refusals by producer (see the module docstring): a replica keys them by producer id, the
    gateway by (topic, partition, producer id)."""

    def __init__(self, hold_ms: int = HOLD_MS) -> None:
        self.hold_ms = hold_ms
        # Insertion order is age: the first record is the oldest.
        self._refusals: dict[K, Refusal] = {}

    def __len__(self) -> int:
        return len(self._refusals)

    def record(
        self,
        producer: K,
        producer_epoch: int,
        base_sequence: int,
        error_code: int,
        now_ms: int,
    ) -> None:
        """The batch starting at ``base_sequence`` was refused with ``error_code`` and nothing
        was appended (the caller passes idempotent batches only). Only retriable errors are
        kept; of two refusals of one producer and epoch the lower sequence stays (the gap
        starts there)."""
        if base_sequence < 0 or error_code not in RETRIABLE:
            return
        old = self._refusals.pop(producer, None)
        if (
            old is not None
            and old.producer_epoch == producer_epoch
            and old.until_ms > now_ms
            and 0 < _ahead(base_sequence, old.base_sequence) < _HALF
        ):
            base_sequence, error_code = old.base_sequence, old.error_code
        self._refusals[producer] = Refusal(
            producer_epoch, base_sequence, error_code, now_ms + self.hold_ms
        )
        while len(self._refusals) > MAX_PRODUCERS:
            del self._refusals[next(iter(self._refusals))]

    def held_back(
        self,
        producer: K,
        producer_epoch: int,
        base_sequence: int,
        last_sequence: int | None,
        now_ms: int,
    ) -> Refusal | None:
        """The refusal a batch starting at ``base_sequence`` must share, or None to go on.

        ``last_sequence``: the producer's last appended sequence in ``producer_epoch``, None
        when its state holds no batch of that epoch (or the caller has no state)."""
        refusal = self._refusals.get(producer)
        if refusal is None:
            return None
        if (
            refusal.until_ms <= now_ms
            or producer_epoch > refusal.producer_epoch
            or (
                last_sequence is not None
                and producer_epoch == refusal.producer_epoch
                and _ahead(last_sequence, refusal.base_sequence) < _HALF
            )
        ):
            del self._refusals[producer]  # expired, a newer epoch, or the gap is filled
            return None
        if producer_epoch != refusal.producer_epoch:
            return None  # an older epoch: the epoch check answers it
        if not 0 < _ahead(base_sequence, refusal.base_sequence) < _HALF:
            return None  # the refused batch itself (the retry), or one before it
        return refusal

    def forget(self, producer: K, base_sequence: int) -> None:
        """The batch at ``base_sequence`` was appended: a refusal at or before it is over."""
        refusal = self._refusals.get(producer)
        if refusal is not None and _ahead(base_sequence, refusal.base_sequence) < _HALF:
            del self._refusals[producer]

    def clear(self) -> None:
        self._refusals.clear()
