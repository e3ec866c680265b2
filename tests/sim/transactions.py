"""Transactions in the simulator (KIP-98): transactional producers, a stand-in transaction
coordinator, and the read_committed consumer's filter.

A run with ``Scenario.transactions`` adds, over the one partition the simulator has (a
transaction spanning two partitions is not simulated):

- Transactional producers: each has a producer id and epoch and runs one transaction at a
  time, of one to ``TXN_BATCHES_MAX`` acks=all batches flagged transactional, with sequences,
  resent as the idempotent producers resend theirs (after an error, after a lost answer,
  sometimes early), across leader changes. Once every batch is acknowledged it ends the
  transaction (EndTxn): the coordinator decides COMMIT, or ABORT now and then (``TXN_ABORT``).
  It begins the next one only once that marker is written (Kafka's coordinator answers
  CONCURRENT_TRANSACTIONS to AddPartitionsToTxn until then).
- Fencing: now and then (``TXN_FENCE``) a new instance of a producer's transactional.id
  fences the running one: the coordinator bumps the producer epoch and aborts the open
  transaction with a marker of the bumped epoch; the old instance, a zombie, goes on sending
  its batches of the old epoch for a while. When the run settles, the coordinator aborts every
  transaction still open the same way (transaction.timeout.ms, with Kafka's epoch bump).
- The coordinator stand-in writes each decision as a COMMIT or ABORT control batch through
  the leader (acks=all, the coordinator epoch it has then), a marker as the replica actor's
  ``write_txn_marker`` builds it, and retries until one try is acknowledged: after an error
  (backing off), or ``MARKER_RETRY_MS`` without an answer (longer than a try can take to be
  answered), and some tries are lost on the way (``MARKER_DROP``). Now and then the
  coordinator's own partition moves (``COORDINATOR_MOVE``): later tries carry the next
  coordinator epoch, and the deposed coordinator sends a try of each marker it was writing
  late (while it is still being written): refused (TRANSACTION_COORDINATOR_FENCED) once a
  newer try is in the log, else harmless (the same outcome).
- Every batch's data says what it is (checker 7's ``...p<id>e<epoch>q<seq>n<count>`` for data
  batches; markers are unique per try) and is registered with the checkers (13-16), with each
  decision and each acknowledgement.

The read_committed consumer is cluster.py's ``Consumer`` with ``read_committed``: it fetches up
to the LSO of the replica it asks, which attaches the aborted transactions its answer overlaps
(as raylog's replica actor does), and filters with :class:`AbortedFilter`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raylog.actors.replication.messages import BatchMeta, ProduceRequest
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.ready import ProduceResult
from raylog.actors.replication.txn_state import CONTROL_ABORT, CONTROL_COMMIT, NOT_CONTROL
from raylog.storage.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)

from .checkers import SimViolation
from .node import CLIENT

if TYPE_CHECKING:
    from .cluster import Simulation

TXN_PRODUCERS = 3
TXN_PRODUCER_ID_BASE = 2000
TXN_BATCHES_MAX = 3  # data batches per transaction
TXN_ABORT = 0.25  # the producer aborts instead of committing
TXN_FENCE = 0.01  # per turn of a producer whose transaction is open: a new instance fences it
ZOMBIE_SENDS_MAX = 4  # tries a fenced instance still makes
TXN_RETRY_MS = 1_500  # resend a data batch after this long without an answer
TXN_EARLY_RETRY = 0.1  # chance to resend while the first try is still in flight
MARKER_RETRY_MS = 1_500  # more than a try takes to be answered (its timeout, 1 s, and delays)
MARKER_DROP = 0.1  # a marker try lost on its way
MARKER_TICK_MS = 50  # how often the coordinator looks at its markers to write
MARKER_BACKOFF_MAX_MS = 1_000  # after the n-th refused try: MARKER_TICK_MS * 2^n, up to this
COORDINATOR_MOVE = 0.15  # per decision: the coordinator's partition moves (its epoch bumps)
REQUEST_TIMEOUT_MS = 1_000

STATS = (
    "txn_committed",
    "txn_aborted",
    "txn_fenced",
    "txn_timed_out",
    "txn_batches_acked",
    "txn_errors",
    "txn_zombie_refused",
    "txn_markers_written",
    "txn_marker_retries",
    "txn_coordinator_moves",
    "txn_coordinator_fenced",
    "txn_read_committed",
)

# What a producer's answer may never be for its current try, with the current epochs.
_NEVER_FOR_CURRENT = (
    OutOfOrderSequenceError.error_code,
    InvalidProducerEpochError.error_code,
    InvalidTxnStateError.error_code,
    TransactionCoordinatorFencedError.error_code,
)


@dataclass
class TxnBatch:
    data: bytes
    sequence: int
    count: int
    in_flight: int | None = None  # request id of the latest try
    sent_ms: int = 0
    tries: int = 0


@dataclass
class Instance:
    """One instance of a transactional producer (the live one, or a fenced zombie)."""

    producer_id: int
    producer_epoch: int
    txn: int = 0  # its transaction's number
    next_sequence: int = 0
    batch: TxnBatch | None = None
    sends_left: int = -1  # a zombie's remaining tries (-1: live, unbounded)


@dataclass
class TxnProducer:
    live: Instance
    open: bool = False  # a transaction begun and not yet ended
    batches_left: int = 0  # data batches still to send in it
    ending: bool = False  # its outcome decided, the marker not yet written
    zombie: Instance | None = None


@dataclass
class PendingMarker:
    producer_id: int
    producer_epoch: int
    txn: int
    commit: bool
    in_flight: int | None = None
    next_try_ms: int = 0  # overdue, or backed off after a refusal
    tries: int = 0
    refusals: int = 0


@dataclass(eq=False)
class TxnWorkload:
    sim: Simulation
    producers: list[TxnProducer] = field(default_factory=list)
    markers: dict[int, PendingMarker] = field(default_factory=dict)  # producer id -> pending
    coordinator_epoch: int = 0
    # request id -> (instance, None) for a data batch, (None, marker) for a marker try, with
    # the coordinator epoch a marker try carried.
    requests: dict[int, tuple[Instance | None, PendingMarker | None, int]] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        for key in STATS:
            self.sim.stats.setdefault(key, 0)
        self.producers = [
            TxnProducer(Instance(TXN_PRODUCER_ID_BASE + i, 0)) for i in range(TXN_PRODUCERS)
        ]

    def start(self) -> None:
        self.sim._schedule(13, "txn", "produce")
        self.sim._schedule(MARKER_TICK_MS, "txn", "marker_tick")

    # --- producers ----------------------------------------------------------------------------

    def on_produce(self) -> None:
        sim = self.sim
        if sim.settling:
            return
        sim._schedule(sim.rng.randint(1, sim.scenario.produce_interval_ms), "txn", "produce")
        producer = sim.rng.choice(self.producers)
        if sim.leader < 0:
            return
        if producer.zombie is not None and sim.rng.random() < 0.5:
            self._zombie_turn(producer)
            return
        if producer.ending:
            return
        live = producer.live
        if producer.open and live.batch is None and producer.batches_left == 0:
            self._decide(producer, commit=sim.rng.random() >= TXN_ABORT, fenced=False)
            return
        if producer.open and sim.rng.random() < TXN_FENCE:
            self._fence(producer)
            return
        if live.batch is None:
            if not producer.open:
                producer.open = True
                live.txn += 1
                producer.batches_left = sim.rng.randint(1, TXN_BATCHES_MAX)
            producer.batches_left -= 1
            live.batch = self._new_batch(live)
        self._send_batch(live, early_retry=True)

    def _zombie_turn(self, producer: TxnProducer) -> None:
        zombie = producer.zombie
        assert zombie is not None
        if zombie.sends_left <= 0:
            producer.zombie = None
            return
        if zombie.batch is None:
            zombie.batch = self._new_batch(zombie)
        if self._send_batch(zombie, early_retry=False):
            zombie.sends_left -= 1

    def _new_batch(self, instance: Instance) -> TxnBatch:
        count = self.sim.rng.randint(1, 3)
        seq = instance.next_sequence
        data = (
            f"s{self.sim.seed}x{instance.txn}p{instance.producer_id}e{instance.producer_epoch}"
            f"q{seq}n{count}"
        ).encode()
        self.sim.checkers.txn_of[data] = (instance.producer_id, instance.txn)
        return TxnBatch(data, seq, count)

    def _send_batch(self, instance: Instance, early_retry: bool) -> bool:
        """Send (again) the instance's batch, unless its try in flight is young; True if sent."""
        sim = self.sim
        batch = instance.batch
        assert batch is not None
        if batch.in_flight is not None:
            waited_ms = sim.now_ms - batch.sent_ms
            early = early_retry and sim.rng.random() < TXN_EARLY_RETRY
            if waited_ms < TXN_RETRY_MS and not early:
                return False
        request_id = sim.next_request_id
        sim.next_request_id += 1
        batch.in_flight, batch.sent_ms = request_id, sim.now_ms
        batch.tries += 1
        self.requests[request_id] = (instance, None, -1)
        request = ProduceRequest(
            request_id,
            -1,
            REQUEST_TIMEOUT_MS,
            batch.count,
            len(batch.data),
            batch.data,
            instance.producer_id,
            instance.producer_epoch,
            batch.sequence,
            True,
        )
        sim._send(CLIENT, sim._route(), request, client=True)
        return True

    def _fence(self, producer: TxnProducer) -> None:
        """A new instance of the producer's transactional.id: the coordinator bumps the epoch
        and aborts the open transaction; the old instance goes on as a zombie."""
        live = producer.live
        zombie = Instance(live.producer_id, live.producer_epoch, live.txn, live.next_sequence)
        zombie.batch, zombie.sends_left = live.batch, self.sim.rng.randint(1, ZOMBIE_SENDS_MAX)
        producer.zombie = zombie
        for request_id, (instance, _, _) in self.requests.items():
            if instance is live:  # its tries in flight answer the zombie now
                self.requests[request_id] = (zombie, None, -1)
        live.producer_epoch += 1
        live.next_sequence, live.batch = 0, None
        producer.batches_left = 0
        self._decide(producer, commit=False, fenced=True)

    def _decide(self, producer: TxnProducer, commit: bool, fenced: bool) -> None:
        """EndTxn (or the coordinator's own abort): the outcome is decided; the marker is
        written from now on."""
        sim = self.sim
        live = producer.live
        key = (live.producer_id, live.txn)
        if fenced:
            sim.checkers.fenced.add(key)
        outcome = "committed" if commit else "fenced" if fenced else "aborted"
        sim.stats["txn_timed_out" if sim.settling else f"txn_{outcome}"] += 1
        producer.open, producer.ending = False, True
        if sim.rng.random() < COORDINATOR_MOVE:
            # The deposed coordinator may still send a try of a marker it was writing, late.
            for marker in self.markers.values():
                late_ms = sim.rng.randint(1, MARKER_RETRY_MS)
                sim._schedule(late_ms, "txn", "stale_marker", marker, self.coordinator_epoch)
            self.coordinator_epoch += 1
            sim.stats["txn_coordinator_moves"] += 1
        self.markers[live.producer_id] = PendingMarker(
            live.producer_id, live.producer_epoch, live.txn, commit
        )

    # --- the coordinator's markers ------------------------------------------------------------

    def on_marker_tick(self) -> None:
        """Send a try of every marker not yet written whose last try failed or is overdue; on
        through settling (the coordinator retries until every marker is written)."""
        sim = self.sim
        sim._schedule(MARKER_TICK_MS, "txn", "marker_tick")
        if sim.leader < 0:
            return
        for marker in self.markers.values():
            if sim.now_ms < marker.next_try_ms:
                continue
            request_id = self._send_marker(marker, self.coordinator_epoch)
            marker.in_flight, marker.next_try_ms = request_id, sim.now_ms + MARKER_RETRY_MS
            if marker.tries > 1:
                sim.stats["txn_marker_retries"] += 1

    def on_stale_marker(self, marker: PendingMarker, coordinator_epoch: int) -> None:
        """A deposed coordinator's late try of a marker it was writing, while that marker is
        still being written. Not later, after the producer's next transaction began: only the
        coordinator epoch fences that try, and a replica restarted over a log whose newer
        markers DeleteRecords removed has lost it (txn_state rebuilds from the log), so the
        late marker closes the open transaction with the older outcome (seed 8000271)."""
        if self.sim.leader >= 0 and self.markers.get(marker.producer_id) is marker:
            self._send_marker(marker, coordinator_epoch)

    def _send_marker(self, marker: PendingMarker, coordinator_epoch: int) -> int:
        """Send a try of ``marker`` (unless it is lost on its way); returns its request id."""
        sim = self.sim
        marker.tries += 1
        outcome = "C" if marker.commit else "A"
        data = f"s{sim.seed}m{marker.producer_id}k{marker.txn}{outcome}t{marker.tries}".encode()
        sim.checkers.marker_of[data] = ((marker.producer_id, marker.txn), marker.commit)
        request_id = sim.next_request_id
        sim.next_request_id += 1
        self.requests[request_id] = (None, marker, coordinator_epoch)
        if not sim.settling and sim.rng.random() < MARKER_DROP:
            return request_id  # lost on its way: retried when overdue
        request = ProduceRequest(
            request_id,
            -1,
            REQUEST_TIMEOUT_MS,
            1,
            len(data),
            data,
            marker.producer_id,
            marker.producer_epoch,
            -1,
            True,
            CONTROL_COMMIT if marker.commit else CONTROL_ABORT,
            coordinator_epoch,
        )
        sim._send(CLIENT, sim._route(), request, client=True)
        return request_id

    # --- answers ------------------------------------------------------------------------------

    def receive(self, result: ProduceResult) -> bool:
        """Take a produce answer if it is one of ours (True)."""
        entry = self.requests.pop(result.request_id, None)
        if entry is None:
            return False
        instance, marker, coordinator_epoch = entry
        if marker is not None:
            self._marker_result(marker, coordinator_epoch, result)
        elif instance is not None:
            self._batch_result(instance, result)
        return True

    def _batch_result(self, instance: Instance, result: ProduceResult) -> None:
        sim = self.sim
        batch = instance.batch
        current = batch is not None and batch.in_flight == result.request_id
        if batch is None or not current:
            return  # an answer to an earlier try of an already acknowledged batch
        if result.error_code != 0:
            sim.stats["txn_errors"] += 1
            if instance.sends_left >= 0:
                sim.stats["txn_zombie_refused"] += 1
            elif result.error_code in _NEVER_FOR_CURRENT and not sim.checkers.lossy:
                raise SimViolation(
                    f"transactional producer {instance.producer_id} got error "
                    f"{result.error_code} for its current batch {batch.data!r}: {result.message}"
                )
            batch.in_flight = None  # resend on its next turn
            return
        if instance.sends_left < 0:
            key = (instance.producer_id, instance.txn)
            sim.checkers.acked.setdefault(key, {})[batch.data] = result.base_offset
            sim.stats["txn_batches_acked"] += 1
        instance.next_sequence += batch.count
        instance.batch = None

    def _marker_result(
        self, marker: PendingMarker, coordinator_epoch: int, result: ProduceResult
    ) -> None:
        sim = self.sim
        if result.error_code == TransactionCoordinatorFencedError.error_code:
            sim.stats["txn_coordinator_fenced"] += 1
        if self.markers.get(marker.producer_id) is not marker:
            return  # an answer to an earlier try of a marker already written
        if result.error_code == 0:
            del self.markers[marker.producer_id]
            sim.stats["txn_markers_written"] += 1
            for producer in self.producers:
                if producer.live.producer_id == marker.producer_id:
                    producer.ending = False
            return
        if (
            result.error_code in _NEVER_FOR_CURRENT
            and coordinator_epoch == self.coordinator_epoch
            and not sim.checkers.lossy
        ):
            raise SimViolation(
                f"the coordinator's marker {marker} got error {result.error_code}: {result.message}"
            )
        if marker.in_flight == result.request_id:  # retried, backing off (the log grows by
            # every try a leader appends and then fails: a throttled follower must catch up)
            marker.in_flight = None
            backoff_ms = min(MARKER_BACKOFF_MAX_MS, MARKER_TICK_MS << min(marker.refusals, 8))
            marker.next_try_ms = sim.now_ms + backoff_ms
            marker.refusals += 1

    # --- settling -----------------------------------------------------------------------------

    def settle(self) -> None:
        """The faults and the writes stop: zombies stop, and the coordinator aborts every open
        transaction with a bumped epoch (transaction.timeout.ms)."""
        for producer in self.producers:
            producer.zombie = None
            if producer.open:
                live = producer.live
                live.producer_epoch += 1
                live.next_sequence, live.batch = 0, None
                self._decide(producer, commit=False, fenced=True)

    def unfinished(self, leader: PartitionReplica) -> str:
        """What keeps the transactions from having settled ("" once they have): a marker not
        yet written, or the leader's LSO below its log end (a transaction left open)."""
        if self.markers:
            return f"markers not yet written: {sorted(self.markers)}"
        if leader.last_stable_offset < leader.log_end_offset:
            return f"leader LSO {leader.last_stable_offset} below its log end"
        return ""


class AbortedFilter:
    """Kafka's read_committed filter over one fetch answer (the consumer's CompletedFetch):
    a transactional data batch is skipped while its producer is aborted, which it becomes at
    the first offset of one of its aborted transactions the answer lists and stops being at
    its ABORT marker; control batches are never delivered."""

    def __init__(self, aborted_transactions: tuple[tuple[int, int], ...]) -> None:
        self._pending = [(first, pid) for pid, first in aborted_transactions]
        heapq.heapify(self._pending)
        self._aborted: set[int] = set()

    def delivers(self, meta: BatchMeta) -> bool:
        """Whether the consumer delivers this batch's records (call for every batch in order)."""
        if meta.producer_id < 0:
            return meta.control_type == NOT_CONTROL
        last_offset = meta.next_offset - 1
        while self._pending and self._pending[0][0] <= last_offset:
            self._aborted.add(heapq.heappop(self._pending)[1])
        if meta.control_type != NOT_CONTROL:
            if meta.control_type == CONTROL_ABORT:
                self._aborted.discard(meta.producer_id)
            return False
        return not (meta.is_transactional and meta.producer_id in self._aborted)
