"""The replication state machine of one partition replica: pure, deterministic, no I/O.

This module owns the decisions of Kafka-style replication for one replica of one partition:
offset assignment on the leader, the ISR (shrink on lag, expand on catch-up, proposed to the
controller with AlterPartition), the high watermark, acks, follower fetching with KIP-320
divergence detection and epoch-based truncation (KIP-101/279), push replication, and fencing by
leader epoch. It imports no Ray, asyncio, sockets, clock or randomness: the shell feeds it
messages and the current time, and carries out what it returns, in the shape of etcd's raft:

    replica.step(message, now_ms)     # any message of replication.messages.InboundMessage
    replica.tick(now_ms)              # timers: ISR shrink, request timeouts, fetch retries
    ready = replica.ready()           # drains the effects produced so far (a Ready)

The shell carries out a Ready in this order (never another):
  1. ``log_ops`` in order (``TruncateTo``, ``AppendBatch``, ``AdvanceLogStart``) on the real
     log (the log must
     assign exactly ``batch.base_offset``; the shell asserts it). Then fsync, possibly
     asynchronously, and step ``LocalAppendDurable(end_offset, generation)`` when it is done.
  2. ``checkpoint_high_watermark`` (lazily persisted; recovery clamps it to the log end).
  3. ``messages``: ``SendToReplica`` as is; ``SendFetchData`` and ``SendPushData`` after the
     shell fills their ``batches`` by reading its log; then ``alter_partition`` to the
     controller (the shell adds topic, partition and broker epoch). One exception: a leader
     may send a ``SendPushData`` or a follower's ``SendFetchData`` whose batches are exactly
     this Ready's own ``AppendBatch``es *before* step 1, filled from memory and stamped as
     the log will store them, so that replication overlaps the local write. Nothing this
     machine decides depends on the order: the high watermark waits for the leader's own
     ``LocalAppendDurable`` either way.
  4. ``produce_results``. A result is only ever produced after the data it acknowledges is
     durable (acks 0/1: locally; acks=all: on every member of the ISR), so "persist, then send,
     then acknowledge" holds even though the leader's fsync runs in parallel with the sends.
     Then ``delete_records_results``.

Decisions:
- High watermark. The leader's HW is the minimum of the log end offsets over the *maximal* ISR
  (KIP-497: the committed ISR plus members of an in-flight expansion; an in-flight shrink still
  counts the members it would remove), where the leader contributes its *durable* end offset:
  raylog counts a write as replicated only once fsync'd on every such member (followers report
  only durable offsets: they fetch from their log end only after it is durable, and push acks
  carry the durable end). The HW never moves backwards.
- Below ``min.insync.replicas`` the HW is frozen (Kafka 4.x, KIP-966): while the committed ISR
  is smaller than min ISR the leader does not advance it. Reason: everything below the HW must
  then be on at least min ISR replicas, so acks=1 writes made while the ISR is shrunk do not
  become visible to consumers on a single copy, and a later election (clean or from the
  eligible-leader set) cannot lose what consumers have read.
- A committed shrink below min ISR fails every pending acks=all request at once with
  NOT_ENOUGH_REPLICAS_AFTER_APPEND (Kafka gives that code at completion time; with a frozen HW
  those requests could otherwise only time out).
- ISR membership (Kafka's Replica.updateFetchStateOrThrow): a follower's ``last_caught_up_ms``
  advances to the time of a fetch whose offset reaches the leader's log end at that fetch, or
  to the time of the previous fetch if this fetch reaches the leader's log end as it was then.
  An ISR member is out of sync when its end differs from the leader's and it has not caught up
  for longer than ``replica.lag.time.max.ms``. A non-ISR follower joins once its end reaches
  both the HW and the start offset of the current leader epoch, and its log start reaches ours
  (raylog's rule, not Kafka's: an acknowledged DeleteRecords then holds on every replica a
  clean election can pick). Observers never join.
- A replica re-created from its log (its broker replaced the actor, not the machine) is told
  again to lead the epoch it led, and resumes it at its log end. Its predecessor may have
  proposed adding a follower, which the controller may commit after sending the command, and
  a leadership that wrote no batch leaves no trace in the log. So a fresh replica that leads
  an epoch its log ends with, or that is given an ISR lacking some replica, first proposes
  its ISR with ``fence`` (a new partition epoch: no older proposal can be committed after
  it), and until the answer every replica counts towards the HW and the low watermark.
- Long poll lives here: a replica's fetch that finds no data (pull mode; observers in push
  mode too) is parked, at most one per replica, and answered when data or a new HW arrives, or
  at ``max_wait_ms`` (on tick). Consumers' fetches are answered at once (the shell long-polls
  them). In push mode followers' fetches are answered at once: a caught-up follower then waits
  for pushes and fetches again only after ``push_idle_fetch_ms`` without one (which is also how
  it learns a new HW when no writes arrive).
- Push and pull share one code path on the leader: a push ack and a fetch both go through
  ``_record_follower_progress``. The leader pushes a new batch to a follower only when that
  follower is known to end exactly at the batch's base offset (``pushed_end_offset``) and no
  push to it is in flight (``push_in_flight_from``); the batches appended while one is in
  flight go together in the next push (up to replica.fetch.max.bytes), sent when the follower
  acknowledges the last one, from where its ack says its log ends: one push and one fsync per
  round trip, not per batch, as a fetch takes what accumulated. Any fetch below the leader's
  end, or a refusing ack, stops pushes to it until it fetches at the leader's end again; a
  fetch also clears a push in flight (a lost push or ack costs one idle fetch). An ack whose
  log end lies below the leader's log start (DeleteRecords or retention moved it while the
  follower was outside the ISR) stops pushes too: nothing is left to push from there, and
  the follower's next fetch is OFFSET_OUT_OF_RANGE (Kafka's rule), on which it starts over at
  the leader's log start. A follower accepts a push only if its first batch starts at its log
  end and the epoch below matches its own; otherwise it refuses and pulls.
- Idempotent producers (``raylog.actors.replication.producer_state``, Kafka's rules): the leader
  checks a client batch's producer id, epoch and sequence before appending it; a retry of one of the
  producer's last five batches is answered with the ORIGINAL offsets once this request's acks
  hold for the original batch (acks=all: the HW covers it), and nothing is appended. Every
  replica updates the producer state from the header of every batch it appends, so a follower
  elected leader deduplicates as its predecessor did; a truncation drops the state above the
  cut; recovery rebuilds it from the log's batch headers (``producer_batches``).
- DeleteRecords (Kafka's Partition.deleteRecordsOnLeader and DelayedDeleteRecords): the leader
  moves its log start offset up to the requested offset (-1: the high watermark; negative or
  above the high watermark: OFFSET_OUT_OF_RANGE) at once (``AdvanceLogStart``), and answers
  when the low watermark, the lowest log start offset over the maximal ISR (as the HW: a
  member an in-flight expansion adds may already be in the controller's ISR), reaches it, or
  with REQUEST_TIMED_OUT at its timeout. Followers report their log start offset in fetches and
  push acks, and adopt the leader's from every fetch answer and push, bounded by their own
  high watermark (Kafka's maybeIncrementLogStartOffset on the follower). The leader answers
  parked fetches at once when its log start moves, so followers learn it without waiting out
  a long poll. A follower started (by a full truncation) at a log start inside one of the
  leader's batches takes that whole batch as its first one. The cleanup.policy check
  (POLICY_VIOLATION) is the shell's: the state machine does not know topic configs.
- Truncation is synchronous from the state machine's view: the shell applies ``TruncateTo``
  before anything that follows it in the Ready. A log ``generation`` counter, bumped on every
  truncation, lets fsync reports from before a truncation be recognised and dropped.

Invariants (checked with explicit raises that survive ``python -O``):
- log_start_offset <= high_watermark <= log_end_offset; durable_end_offset <= log_end_offset;
- the high watermark never decreases (a truncation below it is refused, except after an
  unclean election when ``unclean_leader_election_enable`` is set);
- epochs in the epoch cache strictly increase, with non-decreasing start offsets <= log end;
- batches are appended contiguously at the log end (a follower's may start above it: a
  compacted leader log has gaps) with epochs never lower than the last one and never above
  the current leader epoch;
- a leader is a member of its own ISR; pending requests stay within their bounds.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from raylog.actors.replication.messages import (
    CONSUMER_REPLICA_ID,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    AlterPartitionRequest,
    AlterPartitionResponse,
    BatchMeta,
    BecomeFollower,
    BecomeLeader,
    BecomeObserver,
    DeleteRecordsRequest,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    LocalAppendDurable,
    LocalLogStartAdvanced,
    ProduceRequest,
    RecordBatch,
    ReplicateAck,
    ReplicateRequest,
    StopReplica,
)
from raylog.actors.replication.producer_state import DUPLICATE, ERROR, ProducerStateTable
from raylog.actors.replication.ready import (
    AdvanceLogStart,
    AppendBatch,
    DeleteRecordsResult,
    InvariantViolation,
    ProduceResult,
    Ready,
    ReplicaConfig,
    Role,
    SendFetchData,
    SendPushData,
    SendToReplica,
    TruncateTo,
    check_invariant,
)
from raylog.storage.errors import (
    FencedLeaderEpochError,
    InvalidRecordError,
    InvalidUpdateVersionError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    UnknownLeaderEpochError,
)

__all__ = [
    "AppendBatch",
    "InvariantViolation",
    "PartitionReplica",
    "ProduceResult",
    "Ready",
    "ReplicaConfig",
    "Role",
    "SendFetchData",
    "SendPushData",
    "SendToReplica",
    "TruncateTo",
]

NONE = 0
# Upper bounds that keep every loop in this module finite even on bad input.
MAX_REPLICAS = 64
MAX_BATCHES_PER_MESSAGE = 10_000
MAX_PENDING_DELETE_RECORDS = 1_000  # DeleteRecords requests waiting for the low watermark
DELETE_RECORDS_HIGH_WATERMARK = -1  # DeleteRecords' offset -1: up to the high watermark


# --- internal state ---------------------------------------------------------------------------


@dataclass
class FollowerState:
    """The leader's view of one follower or observer (Kafka's ReplicaState)."""

    log_end_offset: int = UNDEFINED_OFFSET  # unknown until it fetches in this epoch
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    last_fetch_leader_log_end_offset: int = UNDEFINED_OFFSET
    # Push mode: where the follower's log ends once every push sent so far lands; None while
    # it catches up by fetching.
    pushed_end_offset: int | None = None
    # Push mode: where the one push in flight starts (None: none in flight). Batches appended
    # meanwhile go together in the next push, sent when this one is acknowledged.
    push_in_flight_from: int | None = None
    log_start_offset: int = UNDEFINED_OFFSET  # unknown until it fetches or acks in this epoch


@dataclass
class PendingProduce:
    request_id: int
    acks: int
    base_offset: int
    end_offset: int  # the batch's last offset + 1
    deadline_ms: int


@dataclass
class PendingDeleteRecords:
    request_id: int
    offset: int  # answered once the low watermark reaches it
    deadline_ms: int


@dataclass
class ParkedFetch:
    request: FetchRequest
    deadline_ms: int


class PartitionReplica:
    """One replica's replication state machine. See the module docstring for the contract."""

    def __init__(
        self,
        replica_id: int,
        config: ReplicaConfig | None = None,
        *,
        log_start_offset: int = 0,
        log_end_offset: int = 0,
        epoch_cache: Iterable[tuple[int, int]] = (),
        high_watermark: int = 0,
        producer_batches: Iterable[BatchMeta] = (),
    ) -> None:
        """Create a replica over a recovered log.

        ``log_end_offset`` is the end of the recovered log, which the shell has fsync'd during
        recovery (so it is also the durable end); ``epoch_cache`` lists (epoch, start_offset) of
        the batches in it; ``high_watermark`` is the checkpoint, clamped into the log here;
        ``producer_batches`` are the headers of the log's idempotent batches in log order (at
        least the last five of each producer), from which the producer state is rebuilt.
        """
        self.config = config or ReplicaConfig()
        self.config.validate()
        check_invariant(replica_id >= 0, "replica ids are >= 0")
        check_invariant(0 <= log_start_offset <= log_end_offset, "log start must be <= log end")
        self.replica_id = replica_id
        self.role = Role.NONE
        self.leader_id = -1
        self.leader_epoch = UNDEFINED_EPOCH
        self.partition_epoch = -1
        self.controller_epoch = -1
        # A re-created replica (Role.NONE) may hear how its predecessor's last AlterPartition
        # ended before the controller's command reaches it: (leader epoch, partition epoch)
        # of that committed state. A BecomeLeader older than it is stale (see _on_become_leader).
        self.committed_partition_state = (UNDEFINED_EPOCH, -1)
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        self.durable_end_offset = log_end_offset
        self.epoch_cache: list[tuple[int, int]] = list(epoch_cache)
        self.high_watermark = max(log_start_offset, min(high_watermark, log_end_offset))
        self.generation = 0
        # Idempotent producers: checked on the leader, updated on every replica's append.
        self.producers = ProducerStateTable()
        self.producers.rebuild(
            (b.producer_id, b.producer_epoch, b.base_sequence, b.base_offset, b.record_count)
            for b in producer_batches
            if b.producer_id >= 0
        )
        self.producers.remove_before(log_start_offset)  # batches below it may still be on disk
        # Leader state.
        self.isr: tuple[int, ...] = ()
        self.replicas: tuple[int, ...] = ()
        self.observers: tuple[int, ...] = ()
        self.followers: dict[int, FollowerState] = {}
        self.leader_epoch_start_offset = UNDEFINED_OFFSET
        self.alter_in_flight: AlterPartitionRequest | None = None
        # A leader resumed in a new process: its predecessor's last AlterPartition may still be
        # committed, so every replica counts towards the HW until a newer partition epoch is
        # known (a fencing proposal bumps it; see _on_become_leader).
        self.isr_unconfirmed = False
        self.alter_sent_ms = 0
        self.alter_not_before_ms = 0
        self.pending: dict[int, PendingProduce] = {}
        self.pending_acks_all = 0
        self.pending_deletes: dict[int, PendingDeleteRecords] = {}
        self.parked: dict[int, ParkedFetch] = {}
        # Follower state.
        self.fetch_in_flight: FetchRequest | None = None
        self.fetch_sent_ms = 0
        self.next_request_id = 1
        self.fetch_not_before_ms = 0
        self.push_active = False
        self.last_push_ms = 0
        self.push_ack_owed = False
        self._ready = Ready()
        self._check_invariants()

    # --- public API ---------------------------------------------------------------------------

    def step(self, message: Any, now_ms: int) -> None:
        """Feed one inbound message (:data:`raylog.actors.replication.messages.InboundMessage`)
        at time ``now_ms``."""
        name = self._handlers.get(type(message))
        if name is None:
            raise TypeError(f"not a replication message: {type(message).__name__}")
        getattr(self, name)(message, now_ms)
        self._check_invariants()

    def tick(self, now_ms: int) -> None:
        """Advance timers: request timeouts, ISR shrink, parked fetches, fetch retries."""
        if self.role is Role.LEADER:
            self._tick_leader(now_ms)
        elif self.role in (Role.FOLLOWER, Role.OBSERVER):
            if (
                self.fetch_in_flight is not None
                and now_ms - self.fetch_sent_ms >= self.config.fetch_timeout_ms
            ):
                self.fetch_in_flight = None  # lost request or response: ask again
            self._maybe_fetch(now_ms)
        self._check_invariants()

    def ready(self) -> Ready:
        """Take the effects produced since the last call (the caller must carry them all out)."""
        ready, self._ready = self._ready, Ready()
        return ready

    def has_ready(self) -> bool:
        return not self._ready.is_empty()

    @property
    def last_epoch(self) -> int:
        """Epoch of the last batch in the log (UNDEFINED_EPOCH when the log is empty)."""
        return self._epoch_at(self.log_end_offset - 1)

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        """Kafka's LeaderEpochFileCache.endOffsetFor over this replica's epoch cache.

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

    @property
    def low_watermark(self) -> int:
        """The leader's lowest log start offset over the maximal ISR (Kafka's
        lowWatermarkIfLeader takes every live replica); UNDEFINED_OFFSET while a member's is
        unknown."""
        low = self.log_start_offset
        for rid in self.maximal_isr():
            if rid != self.replica_id:
                low = min(low, self.followers[rid].log_start_offset)
        return low

    def maximal_isr(self) -> tuple[int, ...]:
        """The committed ISR plus the members an in-flight AlterPartition would add (every
        replica while the predecessor's proposals are not fenced yet)."""
        if self.isr_unconfirmed:
            return tuple(sorted(set(self.isr) | set(self.replicas)))
        if self.alter_in_flight is None:
            return self.isr
        return tuple(sorted(set(self.isr) | set(self.alter_in_flight.new_isr)))

    # --- controller commands ------------------------------------------------------------------

    def _is_stale_command(self, controller_epoch: int, leader_epoch: int) -> bool:
        if controller_epoch < self.controller_epoch or leader_epoch < self.leader_epoch:
            return True
        self.controller_epoch = controller_epoch
        return False

    def _on_become_leader(self, msg: BecomeLeader, now_ms: int) -> None:
        if self._is_stale_command(msg.controller_epoch, msg.leader_epoch):
            return
        check_invariant(self.replica_id in msg.isr, "the controller elects only an ISR member")
        check_invariant(self.replica_id not in msg.observers, "an observer is never elected")
        check_invariant(len(msg.replicas) + len(msg.observers) <= MAX_REPLICAS, "too many replicas")
        if msg.leader_epoch == self.leader_epoch:
            # Same epoch: only an ISR change decided by the controller can be new.
            if self.role is Role.LEADER and msg.partition_epoch > self.partition_epoch:
                self.alter_in_flight = None
                self._adopt_isr(msg.isr, msg.partition_epoch, now_ms)
            return
        # Checked before anything changes: a refused command leaves this replica as it was.
        self._drop_empty_epochs()
        last_epoch = self.epoch_cache[-1][0] if self.epoch_cache else UNDEFINED_EPOCH
        # A replica actor re-created from its WAL (its topic's replication.mode changed, or it
        # died alone and its broker re-created it) is told again to lead the epoch it led, and
        # resumes that leadership where its log ends. Kafka bumps the epoch on every leader
        # restart because a crashed machine may lose the unflushed tail; here the process was
        # replaced, not the machine, so nothing its followers could have copied is missing (a
        # whole-node crash fences the broker and elects a new leader with a new epoch).
        fresh = self.role is Role.NONE
        # A fresh replica whose log ends with this epoch's batches resumes it. One whose log
        # does not may resume it too: a leadership that wrote no batch leaves no trace in the
        # log. Its predecessor may then have proposed adding a follower, a proposal the
        # controller may commit (or have committed) after sending this command, so the ISR
        # below may lack a member the controller counts; unless it already holds every
        # replica, this replica leads as a resumed one (the fence below) until it knows.
        resuming = fresh and last_epoch == msg.leader_epoch
        may_resume = resuming or (fresh and not set(msg.replicas) <= set(msg.isr))
        if may_resume and (msg.leader_epoch, msg.partition_epoch) < self.committed_partition_state:
            # A command older than the ISR our predecessor already had committed (reordered
            # in flight): leading on its smaller ISR could advance the HW, and answer
            # DeleteRecords, without a member the controller counts. The next one is current.
            return
        check_invariant(
            resuming or last_epoch < msg.leader_epoch,
            "a new leader epoch must exceed every epoch in the log",
        )
        self._fail_all_pending(NotLeaderOrFollowerError.error_code, "leadership changed")
        self._answer_parked_with_error(NotLeaderOrFollowerError.error_code)
        self.role = Role.LEADER
        self.leader_id = self.replica_id
        self.leader_epoch = msg.leader_epoch
        self.partition_epoch = msg.partition_epoch
        self.isr = tuple(sorted(msg.isr))
        self.replicas = tuple(msg.replicas)
        self.observers = tuple(msg.observers)
        self.alter_in_flight = None
        self.fetch_in_flight = None
        self.push_active = False
        self.push_ack_owed = False
        if not resuming:
            # KIP-101: the new epoch starts at our log end; followers truncate against it.
            self.epoch_cache.append((msg.leader_epoch, self.log_end_offset))
        # Kafka's leaderEpochStartOffset: the log end at becoming leader. A resumed leader's
        # recovered HW may lie below the one its predecessor exposed (the checkpoint is lazy),
        # and a follower whose end reached only that must not rejoin the ISR: it may lack
        # committed batches. Our log end holds every one of them, so it is the bar.
        self.leader_epoch_start_offset = self.log_end_offset
        self.isr_unconfirmed = may_resume
        if may_resume:
            # Our predecessor may have proposed adding a follower that the controller has not
            # committed yet. Until it is fenced, the HW must not pass any replica that may be
            # in the ISR by then: a proposal of our ISR with ``fence`` bumps the partition
            # epoch, after which none of its proposals can be committed (the ticks resend it).
            self._propose_isr(self.isr, now_ms, fence=True)
        # Kafka's resetReplicaState: ISR members count as caught up now; every follower's end
        # is unknown until it fetches in this epoch, which holds the HW until they all do.
        self.followers = {}
        for rid in (*self.replicas, *self.observers):
            if rid == self.replica_id:
                continue
            in_isr = rid in self.isr
            self.followers[rid] = FollowerState(
                last_caught_up_ms=now_ms if in_isr else 0,
                last_fetch_ms=now_ms if in_isr else 0,
                last_fetch_leader_log_end_offset=self.log_end_offset if in_isr else -1,
            )
        self._maybe_advance_high_watermark()

    def _on_become_follower(self, msg: BecomeFollower, now_ms: int) -> None:
        self._become_follower_like(msg, Role.FOLLOWER, now_ms)

    def _on_become_observer(self, msg: BecomeObserver, now_ms: int) -> None:
        self._become_follower_like(msg, Role.OBSERVER, now_ms)

    def _become_follower_like(
        self, msg: BecomeFollower | BecomeObserver, role: Role, now_ms: int
    ) -> None:
        if self._is_stale_command(msg.controller_epoch, msg.leader_epoch):
            return
        check_invariant(msg.leader_id != self.replica_id, "cannot follow myself")
        same_epoch = msg.leader_epoch == self.leader_epoch
        if same_epoch and self.role is role and self.leader_id == msg.leader_id:
            self.partition_epoch = max(self.partition_epoch, msg.partition_epoch)
            return
        if same_epoch and self.role is Role.LEADER:
            return  # refuse: the controller demotes a leader only with a new epoch
        self._fail_all_pending(NotLeaderOrFollowerError.error_code, "leadership changed")
        self._answer_parked_with_error(NotLeaderOrFollowerError.error_code)
        self.role = role
        self.leader_id = msg.leader_id
        self.leader_epoch = msg.leader_epoch
        self.partition_epoch = msg.partition_epoch
        self.isr = ()
        self.followers = {}
        self.alter_in_flight = None
        self.leader_epoch_start_offset = UNDEFINED_OFFSET
        self.fetch_in_flight = None
        self.fetch_not_before_ms = now_ms
        self.push_active = False
        self.push_ack_owed = False
        self._drop_empty_epochs()
        self._maybe_fetch(now_ms)

    def _on_stop(self, msg: StopReplica, now_ms: int) -> None:
        if self._is_stale_command(msg.controller_epoch, msg.leader_epoch):
            return
        self._fail_all_pending(NotLeaderOrFollowerError.error_code, "replica stopped")
        self._answer_parked_with_error(NotLeaderOrFollowerError.error_code)
        self.role = Role.STOPPED
        self.leader_epoch = msg.leader_epoch
        self.partition_epoch = msg.partition_epoch
        self.leader_id = -1
        self.followers = {}
        self.alter_in_flight = None
        self.fetch_in_flight = None

    def _on_alter_partition_response(self, msg: AlterPartitionResponse, now_ms: int) -> None:
        if self.role is Role.NONE and msg.error_code in (
            NONE,
            InvalidUpdateVersionError.error_code,
        ):
            # The answer to our predecessor's proposal: remember what is committed.
            self.committed_partition_state = max(
                self.committed_partition_state, (msg.leader_epoch, msg.partition_epoch)
            )
            return
        if self.role is not Role.LEADER or msg.leader_epoch != self.leader_epoch:
            return  # an answer for an earlier leadership of ours
        in_flight = self.alter_in_flight
        answers_in_flight = in_flight is not None and msg.request_id == in_flight.request_id
        if msg.error_code in (NONE, InvalidUpdateVersionError.error_code):
            if msg.partition_epoch > self.partition_epoch:
                # Committed state newer than ours: adopt it, whichever request it answers. Our
                # proposal in flight names an older partition epoch, so the controller can no
                # longer commit it: dropping it is safe.
                self.alter_in_flight = None
                self._adopt_isr(msg.isr, msg.partition_epoch, now_ms)
            elif answers_in_flight:
                # Refused as stale, or a retry of what is already committed: re-decide on tick.
                self.alter_in_flight = None
            # Otherwise a late answer to an earlier proposal: the one in flight may still be
            # committed, so its additions must keep counting towards the HW (maximal ISR).
        elif answers_in_flight:
            # FENCED_LEADER_EPOCH (the controller will tell us our new role), INELIGIBLE_REPLICA
            # and the rest: drop the proposal, and wait before proposing again so a refusal
            # cannot turn into a request per tick. The HW keeps using the committed ISR.
            self.alter_in_flight = None
            self.alter_not_before_ms = now_ms + self.config.alter_partition_timeout_ms

    def _adopt_isr(self, isr: Iterable[int], partition_epoch: int, now_ms: int) -> None:
        new_isr = tuple(sorted(isr))
        check_invariant(self.replica_id in new_isr, "a committed ISR always holds its leader")
        check_invariant(partition_epoch > self.partition_epoch, "adopted ISRs are newer")
        self.isr = new_isr
        self.partition_epoch = partition_epoch
        self.isr_unconfirmed = False  # a newer partition epoch fences the older proposals
        if len(self.isr) < self.config.min_insync_replicas:
            self._fail_pending_acks_all(
                NotEnoughReplicasAfterAppendError.error_code,
                f"ISR {list(self.isr)} shrank below min.insync.replicas="
                f"{self.config.min_insync_replicas} after the append",
            )
        self._maybe_advance_high_watermark()
        self._maybe_complete_deletes()  # a member that left no longer holds the low watermark

    # --- produce ------------------------------------------------------------------------------

    def _on_produce(self, msg: ProduceRequest, now_ms: int) -> None:
        if msg.request_id in self.pending:
            return  # a duplicate delivery of a request still in progress: answered once
        if self.role is not Role.LEADER:
            self._result(msg.request_id, NotLeaderOrFollowerError.error_code, "not the leader")
            return
        if msg.record_count < 1 or msg.size_bytes < 0:
            self._result(msg.request_id, InvalidRecordError.error_code, "empty batch")
            return
        if msg.acks == -1:
            if len(self.isr) < self.config.min_insync_replicas:
                self._result(
                    msg.request_id,
                    NotEnoughReplicasError.error_code,
                    f"ISR {list(self.isr)} is below min.insync.replicas="
                    f"{self.config.min_insync_replicas}",
                )
                return
            if self.pending_acks_all >= self.config.max_pending_acks_all:
                self._result(
                    msg.request_id,
                    RequestTimedOutError.error_code,
                    f"refused: {self.pending_acks_all} acks=all requests already pending "
                    f"(max_pending_acks_all={self.config.max_pending_acks_all})",
                )
                return
        elif len(self.pending) - self.pending_acks_all >= self.config.max_pending_acks_local:
            self._result(
                msg.request_id,
                RequestTimedOutError.error_code,
                f"refused: max_pending_acks_local={self.config.max_pending_acks_local} reached",
            )
            return
        # 1. Idempotent producers: a duplicate of a recent batch completes with that batch's
        # offsets under this request's acks; a sequence or epoch error refuses the batch.
        verdict = self.producers.check(
            msg.producer_id, msg.producer_epoch, msg.base_sequence, msg.record_count
        )
        if verdict.kind == ERROR:
            self._result(msg.request_id, verdict.error_code, verdict.message)
            return
        if verdict.kind == DUPLICATE:
            self._complete_duplicate(msg, verdict.base_offset, verdict.next_offset, now_ms)
            return
        # 2. Assign offsets: the batch goes at our log end in our epoch.
        batch = BatchMeta(
            self.log_end_offset,
            msg.record_count,
            msg.size_bytes,
            self.leader_epoch,
            msg.producer_id,
            msg.producer_epoch,
            msg.base_sequence,
        )
        self._append(batch, msg.data, replicated=False)
        self.pending[msg.request_id] = PendingProduce(
            msg.request_id, msg.acks, batch.base_offset, batch.next_offset, now_ms + msg.timeout_ms
        )
        if msg.acks == -1:
            self.pending_acks_all += 1
        # 3. Push mode: send it to every caught-up follower in parallel with our own fsync.
        if self.config.replication_mode == "push":
            for rid, state in self.followers.items():
                if (
                    rid not in self.observers
                    and state.pushed_end_offset == batch.base_offset
                    and state.push_in_flight_from is None  # else it rides the next push
                ):
                    self._push(rid, state, batch.base_offset, 1 << 30)
        # 4. Parked fetches (pull mode, and observers in push mode) now have data.
        self._answer_parked(now_ms, only_expired=False)

    def _complete_duplicate(
        self, msg: ProduceRequest, base_offset: int, next_offset: int, now_ms: int
    ) -> None:
        """Answer a retried batch with its original offsets once this request's acks hold for
        the original (acks=all: the HW covers it; acks=1: it is durable here)."""
        done = {
            0: True,
            1: next_offset <= self.durable_end_offset,
            -1: next_offset <= self.high_watermark,
        }[msg.acks]
        if done:
            self._result(msg.request_id, NONE, "duplicate of an appended batch", base_offset)
            return
        self.pending[msg.request_id] = PendingProduce(
            msg.request_id, msg.acks, base_offset, next_offset, now_ms + msg.timeout_ms
        )
        if msg.acks == -1:
            self.pending_acks_all += 1

    # --- DeleteRecords ------------------------------------------------------------------------

    def _on_delete_records(self, msg: DeleteRecordsRequest, now_ms: int) -> None:
        if msg.request_id in self.pending_deletes:
            return  # a duplicate delivery of a request still waiting: answered once
        if self.role is not Role.LEADER:
            self._delete_result(msg.request_id, NotLeaderOrFollowerError.error_code, "not leader")
            return
        offset = self.high_watermark if msg.offset == DELETE_RECORDS_HIGH_WATERMARK else msg.offset
        if not 0 <= offset <= self.high_watermark:
            self._delete_result(
                msg.request_id,
                OffsetOutOfRangeError.error_code,
                f"offset {msg.offset} is not in [0, high watermark {self.high_watermark}]",
            )
            return
        if len(self.pending_deletes) >= MAX_PENDING_DELETE_RECORDS:
            self._delete_result(
                msg.request_id, RequestTimedOutError.error_code, "too many DeleteRecords waiting"
            )
            return
        if offset > self.log_start_offset:
            self._advance_log_start(offset)
            # Followers learn the new start from the answers to their parked fetches now.
            self._answer_parked(now_ms, only_expired=False)
        self.pending_deletes[msg.request_id] = PendingDeleteRecords(
            msg.request_id, offset, now_ms + max(0, msg.timeout_ms)
        )
        self._maybe_complete_deletes()

    def _advance_log_start(self, offset: int) -> None:
        """Move our log start up to ``offset`` (<= the HW) and have the shell do it on disk."""
        check_invariant(offset <= self.high_watermark, "the log start never passes the HW")
        self._move_log_start(offset)
        self._ready.log_ops.append(AdvanceLogStart(offset))

    def _adopt_leader_log_start(self, leader_log_start_offset: int) -> None:
        """Follower: Kafka's maybeIncrementLogStartOffset(leaderLogStartOffset), bounded by our
        high watermark (so also by our log end)."""
        start = min(leader_log_start_offset, self.high_watermark)
        if start > self.log_start_offset:
            self._advance_log_start(start)

    def _maybe_complete_deletes(self) -> None:
        if not self.pending_deletes or self.role is not Role.LEADER:
            return
        low = self.low_watermark
        for p in [p for p in self.pending_deletes.values() if p.offset <= low]:
            del self.pending_deletes[p.request_id]
            self._delete_result(p.request_id, NONE, "", low)

    def _delete_result(
        self, request_id: int, error_code: int, message: str, low_watermark: int = -1
    ) -> None:
        self._ready.delete_records_results.append(
            DeleteRecordsResult(request_id, error_code, low_watermark, message)
        )

    def _fail_pending_deletes(self, error_code: int, message: str, now_ms: int | None) -> None:
        """Answer the waiting DeleteRecords with an error: all, or (``now_ms``) the expired."""
        for p in list(self.pending_deletes.values()):
            if now_ms is None or p.deadline_ms <= now_ms:
                del self.pending_deletes[p.request_id]
                self._delete_result(p.request_id, error_code, message)

    def _on_local_append_durable(self, msg: LocalAppendDurable, now_ms: int) -> None:
        if msg.generation != self.generation:
            return  # reported before a truncation: those offsets may hold other batches now
        new_durable = min(msg.end_offset, self.log_end_offset)
        if new_durable <= self.durable_end_offset:
            return
        self.durable_end_offset = new_durable
        if self.role is Role.LEADER:
            done = [
                p for p in self.pending.values() if p.acks != -1 and p.end_offset <= new_durable
            ]
            for p in done:
                self._complete(p, NONE, "")
            self._maybe_advance_high_watermark()
        elif self.role in (Role.FOLLOWER, Role.OBSERVER):
            if self.push_ack_owed:
                # Ack every durable advance, not only a fully synced log: under a steady stream
                # of pushes the log may never be fully synced at an fsync's completion.
                self.push_ack_owed = self.durable_end_offset < self.log_end_offset
                self._send(
                    self.leader_id,
                    ReplicateAck(
                        self.replica_id,
                        self.leader_epoch,
                        self.durable_end_offset,
                        log_start_offset=self.log_start_offset,
                        log_end_offset=self.log_end_offset,
                    ),
                )
            self._maybe_fetch(now_ms)

    # --- leader: fetches and push acks --------------------------------------------------------

    def _epoch_error(self, current_leader_epoch: int) -> int:
        """Fencing of a request that names a leader epoch (-1 from a consumer: not checked)."""
        if current_leader_epoch == UNDEFINED_EPOCH:
            return NONE
        if current_leader_epoch < self.leader_epoch:
            return FencedLeaderEpochError.error_code
        if current_leader_epoch > self.leader_epoch:
            return UnknownLeaderEpochError.error_code
        return NONE

    def _fetch_header(self, request: FetchRequest, error_code: int, **kw: Any) -> FetchResponse:
        return FetchResponse(
            leader_id=self.leader_id,
            request_id=request.request_id,
            leader_epoch=self.leader_epoch,
            error_code=error_code,
            high_watermark=self.high_watermark,
            log_start_offset=self.log_start_offset,
            log_end_offset=self.log_end_offset,
            **kw,
        )

    def _reply_fetch(self, request: FetchRequest, error_code: int = NONE, **kw: Any) -> None:
        """Answer with no data (an error, a divergence, or nothing to read)."""
        header = self._fetch_header(request, error_code, **kw)
        self._ready.messages.append(
            SendFetchData(request.replica_id, header, request.fetch_offset, 0, request.fetch_offset)
        )

    def _reply_fetch_data(self, request: FetchRequest) -> None:
        is_consumer = request.replica_id == CONSUMER_REPLICA_ID
        upper = self.high_watermark if is_consumer else self.log_end_offset
        cap = self.config.consumer_fetch_max_bytes if is_consumer else self.config.fetch_max_bytes
        max_bytes = min(request.max_bytes, cap)
        self._ready.messages.append(
            SendFetchData(
                request.replica_id,
                self._fetch_header(request, NONE),
                request.fetch_offset,
                max_bytes,
                upper,
            )
        )

    def _on_fetch(self, msg: FetchRequest, now_ms: int) -> None:
        is_consumer = msg.replica_id == CONSUMER_REPLICA_ID
        if self.role is Role.LEADER:
            pass
        elif is_consumer and self.role in (Role.FOLLOWER, Role.OBSERVER):
            # KIP-392: any replica serves consumers up to its own high watermark.
            error = self._epoch_error(msg.current_leader_epoch)
            if error == NONE and not (
                self.log_start_offset <= msg.fetch_offset <= self.log_end_offset
            ):
                error = OffsetOutOfRangeError.error_code
            if error != NONE:
                self._reply_fetch(msg, error)
            else:
                self._reply_fetch_data(msg)
            return
        else:
            self._reply_fetch(msg, NotLeaderOrFollowerError.error_code)
            return
        if not is_consumer and msg.replica_id not in self.followers:
            self._reply_fetch(msg, NotLeaderOrFollowerError.error_code)  # not a replica of ours
            return
        error = self._epoch_error(msg.current_leader_epoch)
        if error != NONE:
            self._reply_fetch(msg, error)
            return
        # KIP-320: check the fetcher's log against ours before anything else.
        if msg.last_fetched_epoch != UNDEFINED_EPOCH:
            epoch_end = self.end_offset_for_epoch(msg.last_fetched_epoch)
            if epoch_end.leader_epoch == UNDEFINED_EPOCH:
                self._reply_fetch(msg)  # it knows an epoch we do not: nothing to say, no data
                return
            if (
                epoch_end.leader_epoch < msg.last_fetched_epoch
                or epoch_end.end_offset < msg.fetch_offset
            ):
                self._reply_fetch(msg, diverging_epoch=epoch_end)
                return
        if not self.log_start_offset <= msg.fetch_offset <= self.log_end_offset:
            self._reply_fetch(msg, OffsetOutOfRangeError.error_code)
            return
        if is_consumer:
            self._reply_fetch_data(msg)
            return
        state = self.followers[msg.replica_id]
        state.log_start_offset = max(state.log_start_offset, msg.log_start_offset)
        self._record_follower_progress(msg.replica_id, state, msg.fetch_offset, now_ms)
        if self.config.replication_mode == "push" and msg.replica_id not in self.observers:
            # Caught up: pushes carry it from here. Behind: it pulls, and we stop pushing.
            caught_up = msg.fetch_offset == self.log_end_offset
            state.pushed_end_offset = self.log_end_offset if caught_up else None
            state.push_in_flight_from = None  # what it fetched from says where it is
            self._reply_fetch_data(msg)
            return
        if msg.fetch_offset < self.log_end_offset or msg.max_wait_ms <= 0:
            self.parked.pop(msg.replica_id, None)
            self._reply_fetch_data(msg)
        else:
            # Long poll: answer when data or a new HW arrives, or at the deadline. A newer fetch
            # from the same follower replaces an older parked one (it gave up on that one).
            self.parked[msg.replica_id] = ParkedFetch(msg, now_ms + msg.max_wait_ms)

    def _on_replicate_ack(self, msg: ReplicateAck, now_ms: int) -> None:
        if self.role is not Role.LEADER or msg.leader_epoch != self.leader_epoch:
            return
        state = self.followers.get(msg.replica_id)
        if state is None or msg.error_code != NONE:
            return
        if msg.durable_end_offset > self.log_end_offset:
            return  # cannot be from this epoch's log: ignore rather than trust it
        state.log_start_offset = max(state.log_start_offset, msg.log_start_offset)
        if not msg.in_push:
            state.pushed_end_offset = None
            state.push_in_flight_from = None
        elif (
            state.push_in_flight_from is not None
            and state.pushed_end_offset is not None
            and msg.durable_end_offset > state.push_in_flight_from
        ):
            # The push in flight landed (some of it durable): the next one takes everything
            # appended since, from where the follower's log ends.
            state.push_in_flight_from = None
            if msg.log_end_offset != UNDEFINED_OFFSET:
                state.pushed_end_offset = min(msg.log_end_offset, self.log_end_offset)
            self._push_next(msg.replica_id, state)
        if msg.durable_end_offset < state.log_end_offset:
            return  # a late ack overtaken by a newer one: a follower's durable end only grows
        self._record_follower_progress(msg.replica_id, state, msg.durable_end_offset, now_ms)

    def _push_next(self, replica_id: int, state: FollowerState) -> None:
        """Push mode: send ``replica_id`` what was appended since its last push, up to
        replica.fetch.max.bytes (the shell cuts at whole batches; the ack says where the
        follower's log then ends)."""
        start = state.pushed_end_offset
        if start is None or start >= self.log_end_offset or replica_id in self.observers:
            return
        if start < self.log_start_offset:
            # Its log ends below our log start (DeleteRecords or retention moved it while the
            # push was in flight, the follower being outside the ISR): what it lacks is gone
            # here, and no batch starts where it ends. Kafka's rule for a fetch from there is
            # OFFSET_OUT_OF_RANGE, on which the follower starts over at our log start: stop
            # pushing, so that its next fetch gets that answer.
            state.pushed_end_offset = None
            return
        self._push(replica_id, state, start, self.config.fetch_max_bytes)

    def _push(self, replica_id: int, state: FollowerState, start: int, max_bytes: int) -> None:
        """Push [``start``, our log end) to ``replica_id``, within ``max_bytes``. The shell
        fills the batches from its log: the bytes as stored, with the base offset and leader
        epoch (and LogAppendTime) that the log stamped in them."""
        request = ReplicateRequest(
            self.replica_id,
            self.leader_epoch,
            self.high_watermark,
            self._epoch_at(start - 1),
            (),
            log_start_offset=self.log_start_offset,
        )
        state.push_in_flight_from = start
        state.pushed_end_offset = self.log_end_offset
        self._ready.messages.append(
            SendPushData(replica_id, request, start, self.log_end_offset, max_bytes)
        )

    def _record_follower_progress(
        self, replica_id: int, state: FollowerState, end_offset: int, now_ms: int
    ) -> None:
        """Kafka's updateFetchStateOrThrow, then ISR expansion and HW advance."""
        leader_end = self.log_end_offset
        if end_offset >= leader_end:
            state.last_caught_up_ms = max(state.last_caught_up_ms, now_ms)
        elif end_offset >= state.last_fetch_leader_log_end_offset:
            state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
        state.log_end_offset = end_offset
        state.last_fetch_leader_log_end_offset = leader_end
        state.last_fetch_ms = now_ms
        self._maybe_expand_isr(replica_id, state, now_ms)
        self._maybe_advance_high_watermark()
        self._maybe_complete_deletes()

    # --- leader: ISR and high watermark -------------------------------------------------------

    def _is_in_sync(self, state: FollowerState, now_ms: int) -> bool:
        return (
            state.log_end_offset == self.log_end_offset
            or now_ms - state.last_caught_up_ms <= self.config.replica_lag_time_max_ms
        )

    def _maybe_expand_isr(self, replica_id: int, state: FollowerState, now_ms: int) -> None:
        if (
            self.alter_in_flight is not None
            or self.isr_unconfirmed
            or now_ms < self.alter_not_before_ms
            or replica_id in self.isr
            or replica_id in self.observers
            or replica_id not in self.replicas
        ):
            return
        if (
            state.log_end_offset >= self.high_watermark
            and state.log_end_offset >= self.leader_epoch_start_offset
            # It adopts our log start from the answer to the fetch that got it here, and
            # reports it in the next one: at most one more round.
            and state.log_start_offset >= self.log_start_offset
        ):
            self._propose_isr((*self.isr, replica_id), now_ms)

    def _propose_isr(self, new_isr: Iterable[int], now_ms: int, fence: bool = False) -> None:
        request = AlterPartitionRequest(
            self.next_request_id,
            self.replica_id,
            self.leader_epoch,
            self.partition_epoch,
            tuple(sorted(new_isr)),
            fence,
        )
        self.next_request_id += 1
        check_invariant(
            self.replica_id in request.new_isr, "a leader never removes itself from the ISR"
        )
        self.alter_in_flight = request
        self.alter_sent_ms = now_ms
        self._ready.alter_partition.append(request)

    def _maybe_advance_high_watermark(self) -> None:
        if self.role is not Role.LEADER:
            return
        if len(self.isr) < self.config.min_insync_replicas:
            return  # KIP-966: frozen while the committed ISR is below min.insync.replicas
        new_hw = self.durable_end_offset
        for rid in self.maximal_isr():
            if rid != self.replica_id:
                new_hw = min(new_hw, self.followers[rid].log_end_offset)
        if new_hw <= self.high_watermark:
            return
        self._set_high_watermark(new_hw)
        done = [p for p in self.pending.values() if p.acks == -1 and p.end_offset <= new_hw]
        for p in done:
            self._complete(p, NONE, "")
        self._answer_parked(0, only_expired=False)  # parked fetchers learn the new HW at once

    def _set_high_watermark(self, new_hw: int) -> None:
        check_invariant(new_hw >= self.high_watermark, "the high watermark never moves backwards")
        check_invariant(new_hw <= self.log_end_offset, "high_watermark <= log_end_offset")
        if new_hw != self.high_watermark:
            self.high_watermark = new_hw
            self._ready.checkpoint_high_watermark = new_hw

    def _tick_leader(self, now_ms: int) -> None:
        expired = [p for p in self.pending.values() if p.deadline_ms <= now_ms]
        for p in expired:
            self._complete(p, RequestTimedOutError.error_code, "not replicated within timeout")
        self._fail_pending_deletes(
            RequestTimedOutError.error_code, "low watermark not reached within timeout", now_ms
        )
        self._answer_parked(now_ms, only_expired=True)
        if (
            self.alter_in_flight is not None
            and now_ms - self.alter_sent_ms >= self.config.alter_partition_timeout_ms
        ):
            # Resend: the controller answers a duplicate with its current state.
            self.alter_sent_ms = now_ms
            self._ready.alter_partition.append(self.alter_in_flight)
        if self.alter_in_flight is not None or now_ms < self.alter_not_before_ms:
            return
        if self.isr_unconfirmed:
            self._propose_isr(self.isr, now_ms, fence=True)
            return
        out_of_sync = [
            rid
            for rid in self.isr
            if rid != self.replica_id and not self._is_in_sync(self.followers[rid], now_ms)
        ]
        if out_of_sync:
            self._propose_isr((r for r in self.isr if r not in out_of_sync), now_ms)
            return
        for rid, state in self.followers.items():
            self._maybe_expand_isr(rid, state, now_ms)
            if self.alter_in_flight is not None:
                break

    def _answer_parked(self, now_ms: int, *, only_expired: bool) -> None:
        if not self.parked:
            return
        for rid in list(self.parked):
            parked = self.parked[rid]
            if only_expired and parked.deadline_ms > now_ms:
                continue
            del self.parked[rid]
            self._reply_fetch_data(parked.request)

    def _answer_parked_with_error(self, error_code: int) -> None:
        for parked in self.parked.values():
            self._reply_fetch(parked.request, error_code)
        self.parked.clear()

    # --- produce completion -------------------------------------------------------------------

    def _result(self, request_id: int, error_code: int, message: str, base: int = -1) -> None:
        self._ready.produce_results.append(ProduceResult(request_id, error_code, base, message))

    def _complete(self, pending: PendingProduce, error_code: int, message: str) -> None:
        del self.pending[pending.request_id]
        if pending.acks == -1:
            self.pending_acks_all -= 1
        self._result(pending.request_id, error_code, message, pending.base_offset)

    def _fail_all_pending(self, error_code: int, message: str) -> None:
        for p in list(self.pending.values()):
            self._complete(p, error_code, message)
        self._fail_pending_deletes(error_code, message, None)

    def _fail_pending_acks_all(self, error_code: int, message: str) -> None:
        for p in [p for p in self.pending.values() if p.acks == -1]:
            self._complete(p, error_code, message)

    # --- follower -----------------------------------------------------------------------------

    def _maybe_fetch(self, now_ms: int) -> None:
        if (
            self.role not in (Role.FOLLOWER, Role.OBSERVER)
            or self.leader_id < 0
            or self.fetch_in_flight is not None
            or now_ms < self.fetch_not_before_ms
            # Fetch only from a durable end: the fetch offset tells the leader what we hold
            # durably, and the leader counts it towards the HW.
            or self.durable_end_offset != self.log_end_offset
        ):
            return
        push = self._receives_pushes()
        if (
            push
            and self.push_active
            and now_ms - self.last_push_ms < self.config.push_idle_fetch_ms
        ):
            return  # pushes are flowing; fetch only when they go quiet
        request = FetchRequest(
            replica_id=self.replica_id,
            request_id=self.next_request_id,
            current_leader_epoch=self.leader_epoch,
            fetch_offset=self.log_end_offset,
            last_fetched_epoch=self.last_epoch,
            max_bytes=self.config.fetch_max_bytes,
            max_wait_ms=0 if push else self.config.fetch_max_wait_ms,
            log_start_offset=self.log_start_offset,
        )
        self.next_request_id += 1
        self.fetch_in_flight = request
        self.fetch_sent_ms = now_ms
        self._send(self.leader_id, request)

    def _straddles_leader_log_start(self, msg: FetchResponse, request: FetchRequest) -> bool:
        """The leader's first batch starts below our log end, which is the leader's log start
        and lies inside that batch, above our HW: our bytes just below it are not the
        leader's, which cannot tell (it knows no epoch below its log start, so KIP-320's check
        passed), and are deleted there anyway. Then we start over at its log start."""
        first = msg.batches[0].meta if msg.batches else None
        return (
            first is not None
            and first.base_offset < request.fetch_offset < first.next_offset
            and request.fetch_offset == msg.log_start_offset > self.high_watermark
            and self.log_end_offset > self.log_start_offset
        )

    def _receives_pushes(self) -> bool:
        """Push mode serves followers only; observers always pull (with long poll)."""
        return self.config.replication_mode == "push" and self.role is Role.FOLLOWER

    def _on_fetch_response(self, msg: FetchResponse, now_ms: int) -> None:
        request = self.fetch_in_flight
        if request is None or msg.request_id != request.request_id:
            return  # stale or duplicate answer
        if self.role not in (Role.FOLLOWER, Role.OBSERVER):
            return
        self.fetch_in_flight = None
        if msg.leader_epoch != self.leader_epoch or msg.error_code not in (
            NONE,
            OffsetOutOfRangeError.error_code,
        ):
            self.fetch_not_before_ms = now_ms + self.config.fetch_backoff_ms
            return
        if msg.error_code == OffsetOutOfRangeError.error_code:
            self._handle_out_of_range(msg, request)
        elif msg.diverging_epoch is not None:
            if msg.diverging_epoch.end_offset <= msg.log_start_offset and (
                msg.log_start_offset > self.high_watermark
                or self.config.unclean_leader_election_enable
            ):
                # The leader knows nothing below its log start (its first epoch entry was moved
                # up to it, possibly inside a batch, where no truncation can cut), and all we
                # hold below it is deleted there: start over at its log start, as Kafka's
                # follower ends up doing after its next fetch is out of range. After a clean
                # election our HW is below it (the logs agree below it, and diverge below the
                # leader's log start); after an unclean one our HW says nothing, and where we
                # diverge below the leader's log start is unknowable.
                self._truncate_fully(msg.log_start_offset)
            else:
                self._truncate_diverged(msg.diverging_epoch)
        else:
            if self._straddles_leader_log_start(msg, request):
                self._truncate_fully(msg.log_start_offset)
            appended = self._append_from_leader(msg.batches, request.fetch_offset)
            self._update_follower_high_watermark(msg.high_watermark)
            self._adopt_leader_log_start(msg.log_start_offset)
            if self._receives_pushes():
                caught_up = not appended and msg.log_end_offset == request.fetch_offset
                self.push_active = caught_up
                self.last_push_ms = now_ms
            elif not appended and msg.log_end_offset > request.fetch_offset:
                # The leader had data but sent none (e.g. a read limit): do not spin.
                self.fetch_not_before_ms = now_ms + self.config.fetch_backoff_ms
        self._maybe_fetch(now_ms)

    def _on_replicate(self, msg: ReplicateRequest, now_ms: int) -> None:
        if msg.leader_epoch < self.leader_epoch:
            ack = ReplicateAck(
                self.replica_id, msg.leader_epoch, -1, FencedLeaderEpochError.error_code
            )
            self._send(msg.leader_id, ack)
            return
        if (
            msg.leader_epoch > self.leader_epoch
            or self.role not in (Role.FOLLOWER, Role.OBSERVER)
            or msg.leader_id != self.leader_id
        ):
            code = (
                UnknownLeaderEpochError.error_code
                if msg.leader_epoch > self.leader_epoch
                else NotLeaderOrFollowerError.error_code
            )
            self._send(msg.leader_id, ReplicateAck(self.replica_id, msg.leader_epoch, -1, code))
            return
        first = msg.batches[0].meta if msg.batches else None
        if (
            first is None
            or first.base_offset != self.log_end_offset
            or msg.prev_epoch != self.last_epoch
        ):
            # A gap (a lost push), an overlap or a divergence: fall back to pull.
            self.push_active = False
            self._send(
                self.leader_id,
                ReplicateAck(
                    self.replica_id,
                    self.leader_epoch,
                    self.durable_end_offset,
                    in_push=False,
                    log_start_offset=self.log_start_offset,
                ),
            )
            self._maybe_fetch(now_ms)
            return
        self._append_from_leader(msg.batches, self.log_end_offset)
        self._update_follower_high_watermark(msg.high_watermark)
        self._adopt_leader_log_start(msg.log_start_offset)
        self.push_active = True
        self.last_push_ms = now_ms
        self.push_ack_owed = True  # acknowledged once LocalAppendDurable covers it

    def _append_from_leader(self, batches: tuple[RecordBatch, ...], fetch_offset: int) -> bool:
        """Append the leader's batches that extend our log; returns whether any did."""
        check_invariant(len(batches) <= MAX_BATCHES_PER_MESSAGE, "too many batches in one message")
        if fetch_offset != self.log_end_offset:
            return False  # our log moved (a push landed) since this fetch was sent
        appended = False
        for record_batch in batches:
            meta = record_batch.meta
            if meta.next_offset <= self.log_end_offset:
                continue  # the first batch may start before the fetch offset
            check_invariant(
                meta.base_offset >= self.log_end_offset or self._empty_above_log_start(),
                "fetched batches never go back (gaps are a compacted leader log's)",
            )
            check_invariant(meta.leader_epoch <= self.leader_epoch, "a batch from a future epoch")
            self._append(meta, record_batch.data, replicated=True)
            appended = True
        return appended

    def _update_follower_high_watermark(self, leader_high_watermark: int) -> None:
        # A follower's HW is min(leader's HW, own log end), and, unlike Kafka's, never moves
        # backwards: a new leader may report a lower HW than its predecessor did.
        candidate = min(leader_high_watermark, self.log_end_offset)
        if candidate > self.high_watermark:
            self._set_high_watermark(candidate)

    def _truncate_diverged(self, diverging: EpochEndOffset) -> None:
        """Kafka's follower truncation for a KIP-320 diverging epoch."""
        if diverging.leader_epoch == UNDEFINED_EPOCH:
            target = min(diverging.end_offset, self.log_end_offset)
        else:
            mine = self.end_offset_for_epoch(diverging.leader_epoch)
            if mine.leader_epoch == UNDEFINED_EPOCH:
                target = min(diverging.end_offset, self.log_end_offset)
            elif mine.leader_epoch != diverging.leader_epoch:
                # We do not know the leader's epoch: cut back to the end of our largest epoch
                # below it, and fetch again with that epoch for the leader to check.
                target = min(mine.end_offset, self.log_end_offset)
            else:
                target = min(diverging.end_offset, mine.end_offset, self.log_end_offset)
        self._truncate(max(target, self.log_start_offset))

    def _handle_out_of_range(self, msg: FetchResponse, request: FetchRequest) -> None:
        if request.fetch_offset > msg.log_end_offset and msg.log_end_offset < self.log_start_offset:
            # Only after an unclean election (a clean leader holds our HW, and our log start
            # is below that): the leader's log ends below our log start, so nothing we hold is
            # in its log. Start over at its end, as Kafka's truncateTo does.
            self._truncate_fully(msg.log_end_offset)
        elif request.fetch_offset > msg.log_end_offset:
            self._truncate(msg.log_end_offset)
        elif request.fetch_offset < msg.log_start_offset:
            self._truncate_fully(msg.log_start_offset)

    # --- log metadata -------------------------------------------------------------------------

    def _epoch_at(self, offset: int) -> int:
        """Epoch of the batch holding ``offset`` (UNDEFINED below the log or in an empty log)."""
        if offset < self.log_start_offset or offset >= self.log_end_offset:
            return UNDEFINED_EPOCH
        index = bisect.bisect_right([start for _, start in self.epoch_cache], offset) - 1
        return self.epoch_cache[index][0] if index >= 0 else UNDEFINED_EPOCH

    def _empty_above_log_start(self) -> bool:
        """Nothing at or above our log start: a first batch from the leader may then start
        below our log end, when the leader's log start (where a full truncation started ours)
        lies inside that batch. The log restarts at the batch's base offset for it."""
        return self.log_end_offset == self.log_start_offset

    def _append(self, batch: BatchMeta, data: bytes, *, replicated: bool) -> None:
        if replicated:
            # A leader's compacted log has gaps between batches, and may hold a batch whose
            # records the cleaner all removed (kept for its producer's sequence).
            check_invariant(
                batch.base_offset >= self.log_end_offset or self._empty_above_log_start(),
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
        self.producers.update(
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            batch.base_offset,
            batch.record_count,
        )
        self._ready.log_ops.append(AppendBatch(batch, data, self.generation, replicated))

    def _drop_empty_epochs(self) -> None:
        """Forget epochs that start at our log end: they hold no batch (an earlier leadership of
        ours that wrote nothing), and would otherwise block the batches of older epochs that a
        new leader may still send us."""
        while self.epoch_cache and self.epoch_cache[-1][1] >= self.log_end_offset:
            self.epoch_cache.pop()

    def _truncate(self, offset: int) -> None:
        if offset >= self.log_end_offset:
            self._drop_empty_epochs()
            return
        if offset <= self.log_start_offset:
            # Nothing at or above our log start stays, and the log start may lie inside a
            # batch (DeleteRecords; the epoch cache's first entry was moved up to it), where
            # no cut can land: empty the log and start over at the log start.
            self._truncate_fully(self.log_start_offset)
            return
        if offset < self.high_watermark:
            check_invariant(
                self.config.unclean_leader_election_enable,
                f"truncation to {offset} below the high watermark {self.high_watermark}",
            )
            # Only after an unclean election: committed data is being given up, knowingly.
            self.high_watermark = offset
            self._ready.checkpoint_high_watermark = offset
        self.generation += 1
        self.log_end_offset = offset
        self.durable_end_offset = min(self.durable_end_offset, offset)
        self.epoch_cache = [(e, s) for e, s in self.epoch_cache if s < offset]
        self.producers.truncate(offset)
        self._ready.log_ops.append(TruncateTo(offset, self.generation))

    def _on_log_start_advanced(self, msg: LocalLogStartAdvanced, now_ms: int) -> None:
        """Retention removed the log's head (the log has done it: no AdvanceLogStart)."""
        start = min(msg.log_start_offset, self.high_watermark)
        if start > self.log_start_offset:
            self._move_log_start(start)
            self._maybe_complete_deletes()

    def _move_log_start(self, start: int) -> None:
        """Only committed data goes (never above the high watermark, which never moves back),
        so nothing else changes; the epoch cache keeps the epoch in force at the new start, as
        Kafka's truncateFromStart."""
        self.log_start_offset = start
        self.producers.remove_before(start)
        kept = [(e, s) for e, s in self.epoch_cache if s > start]
        covering = [e for e, s in self.epoch_cache if s <= start]
        if covering:
            kept.insert(0, (covering[-1], start))
        self.epoch_cache = kept

    def _truncate_fully(self, new_start_offset: int) -> None:
        check_invariant(
            self.high_watermark <= new_start_offset or self.config.unclean_leader_election_enable,
            "a full truncation may not drop data below the high watermark",
        )
        self.generation += 1
        self.log_start_offset = new_start_offset
        self.log_end_offset = new_start_offset
        self.durable_end_offset = new_start_offset
        self.high_watermark = new_start_offset
        self.epoch_cache = []
        self.producers.clear()
        self._ready.log_ops.append(TruncateTo(new_start_offset, self.generation, full=True))
        self._ready.checkpoint_high_watermark = new_start_offset

    def _send(self, to: int, message: Any) -> None:
        self._ready.messages.append(SendToReplica(to, message))

    def _check_invariants(self) -> None:
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
        check_invariant(
            len(self.pending)
            <= self.config.max_pending_acks_all + self.config.max_pending_acks_local,
            "pending produce requests are bounded",
        )
        check_invariant(self.pending_acks_all <= self.config.max_pending_acks_all, "acks=all bound")
        check_invariant(
            len(self.pending_deletes) <= MAX_PENDING_DELETE_RECORDS, "DeleteRecords bound"
        )
        if self.role is Role.LEADER:
            check_invariant(self.replica_id in self.isr, "a leader is in its own ISR")
            check_invariant(
                len(self.parked) <= len(self.followers), "one parked fetch per follower"
            )

    def reconfigure(self, config: ReplicaConfig) -> None:
        """Apply changed settings (min.insync.replicas, unclean election, lag time, bounds)
        from the next message on, as Kafka applies a topic config change. The replication mode
        cannot change here: followers and leader would disagree on who moves the data until
        both had switched; the shell re-creates the replica for that (ValueError)."""
        config.validate()
        if config.replication_mode != self.config.replication_mode:
            raise ValueError(
                f"replication.mode {self.config.replication_mode} -> {config.replication_mode} "
                "needs a new replica"
            )
        self.config = config

    # Dispatch by method name, so a subclass (e.g. a test's deliberately buggy replica) can
    # override a handler.
    _handlers: dict[type, str] = {
        ProduceRequest: "_on_produce",
        FetchRequest: "_on_fetch",
        FetchResponse: "_on_fetch_response",
        ReplicateRequest: "_on_replicate",
        ReplicateAck: "_on_replicate_ack",
        BecomeLeader: "_on_become_leader",
        BecomeFollower: "_on_become_follower",
        BecomeObserver: "_on_become_observer",
        StopReplica: "_on_stop",
        AlterPartitionResponse: "_on_alter_partition_response",
        LocalAppendDurable: "_on_local_append_durable",
        LocalLogStartAdvanced: "_on_log_start_advanced",
        DeleteRecordsRequest: "_on_delete_records",
    }
