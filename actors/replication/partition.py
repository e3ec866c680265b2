"""The replication state machine of one partition replica: pure, deterministic, no I/O.

``PartitionReplica`` decides Kafka-style replication for one replica of one partition: offset
assignment on the leader, the ISR (shrink on lag, expand on catch-up, proposed to the
controller with AlterPartition), the high watermark, acks, follower fetching with KIP-320
divergence detection and epoch-based truncation (KIP-101/279), push replication, DeleteRecords,
and fencing by leader epoch. It imports no Ray, asyncio, sockets, clock or randomness: the
shell feeds it messages and the current time, and carries out what it returns, in the shape of
etcd's raft:

    replica.step(message, now_ms)     # any message of replication.messages.InboundMessage
    replica.tick(now_ms)              # timers: ISR shrink, request timeouts, fetch retries
    ready = replica.ready()           # drains the effects produced so far (a Ready)

The shell carries out a Ready in this order (never another):
  1. ``log_ops`` in order (``TruncateTo``, ``AppendBatch``, ``AdvanceLogStart``) on the real
     log (the log must assign exactly ``batch.base_offset``; the shell asserts it). Then
     fsync, possibly asynchronously, and step ``LocalAppendDurable(end_offset, generation)``
     when it is done.
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

Where the decisions are (each module's docstring states its own):
- this module: the controller's commands (become leader, follower or observer, stop), the
  answers to AlterPartition proposals, leading an epoch again after being re-created, and the
  dispatch of messages and timers;
- ``leader``: produce and acks, idempotent producers, serving fetches (long poll, KIP-320 on
  the leader), pushes, the ISR proposals and the HW as the leader moves them, DeleteRecords;
- ``mirror``: a mirror topic's leader appending a source cluster's batches (KIP-986 links);
- ``sync_links`` (rules) and ``sync_link_side`` (handlers): a source leader's synchronous
  links, which hold acks=all acknowledgements until their destinations have the writes;
- ``follower``: fetching, divergence and out-of-range truncation, taking pushes;
- ``isr``: the rules for followers' progress, the ISR, the high and low watermarks;
- ``delete_records``: DeleteRecords' waiting requests and the log start rules;
- ``replica_log``: the replica's view of its log (offsets, epochs, producers, truncation);
- ``replica_state``: the state the parts share.

Invariants (checked with explicit raises that survive ``python -O``; the log's own are in
``replica_log``):
- the high watermark never decreases (a truncation below it is refused, except after an
  unclean election when ``unclean_leader_election_enable`` is set);
- batches never come from a leader epoch above the current one;
- a leader is a member of its own ISR; pending requests stay within their bounds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raylog.actors.replication import isr as isr_rules
from raylog.actors.replication.follower import FollowerSide
from raylog.actors.replication.messages import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    AlterPartitionResponse,
    BecomeFollower,
    BecomeLeader,
    BecomeObserver,
    DeleteRecordsRequest,
    FetchRequest,
    FetchResponse,
    LocalAppendDurable,
    LocalLogStartAdvanced,
    MirrorAppendRequest,
    ProduceRequest,
    RemoteStateBuilt,
    ReplicateAck,
    ReplicateRequest,
    StopReplica,
    SyncLinkProgress,
    SyncLinksChanged,
)
from raylog.actors.replication.mirror import MirrorSide
from raylog.actors.replication.ready import (
    AppendBatch,
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
from raylog.actors.replication.replica_state import MAX_REPLICAS, NONE
from raylog.actors.replication.sync_link_side import SyncLinkSide, SyncLinkStatus, check_refs
from raylog.storage.errors import (
    FencedLeaderEpochError,
    InvalidUpdateVersionError,
    NotEnoughReplicasAfterAppendError,
    NotLeaderOrFollowerError,
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
    "SyncLinkStatus",
    "TruncateTo",
]


class PartitionReplica(SyncLinkSide, MirrorSide, FollowerSide):
    """One replica's replication state machine. See the module docstring for the contract."""

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
            self._tick_follower(now_ms)
        self._check_invariants()

    def ready(self) -> Ready:
        """Take the effects produced since the last call (the caller must carry them all out)."""
        ready, self._ready = self._ready, Ready()
        return ready

    def has_ready(self) -> bool:
        return not self._ready.is_empty()

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
        check_refs(msg.sync_links)
        if msg.leader_epoch == self.leader_epoch:
            # Same epoch: only an ISR change decided by the controller, or a newer set of sync
            # links, can be new.
            if self.role is Role.LEADER and msg.partition_epoch > self.partition_epoch:
                self.alter_in_flight = None
                self._adopt_isr(msg.isr, msg.partition_epoch, now_ms)
            if self.role is Role.LEADER:
                self._change_sync_links(msg.sync_links, msg.sync_links_version)
            return
        # Checked before anything changes: a refused command leaves this replica as it was.
        self.log.drop_empty_epochs()
        last_epoch = self.log.epoch_cache[-1][0] if self.log.epoch_cache else UNDEFINED_EPOCH
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
        self.mirror_link = msg.mirror_link
        self.partition_epoch = msg.partition_epoch
        self.isr = tuple(sorted(msg.isr))
        self.replicas = tuple(msg.replicas)
        self.observers = tuple(msg.observers)
        self.alter_in_flight = None
        self.fetch_in_flight = None
        self.push_active = False
        self.push_ack_owed = False
        self.remote_state_wanted = None  # a leader serves the state it has
        self.remote_state_asked = False
        self._start_sync_links(msg.sync_links, msg.sync_links_version, now_ms)
        if not resuming:
            # KIP-101: the new epoch starts at our log end; followers truncate against it.
            self.log.start_epoch(msg.leader_epoch)
        # Kafka's leaderEpochStartOffset: the log end at becoming leader. A resumed leader's
        # recovered HW may lie below the one its predecessor exposed (the checkpoint is lazy),
        # and a follower whose end reached only that must not rejoin the ISR: it may lack
        # committed batches. Our log end holds every one of them, so it is the bar.
        self.leader_epoch_start_offset = self.log.log_end_offset
        self.isr_join_log_start = self.log.log_start_offset
        self.isr_unconfirmed = may_resume
        if may_resume:
            # Our predecessor may have proposed adding a follower that the controller has not
            # committed yet. Until it is fenced, the HW must not pass any replica that may be
            # in the ISR by then: a proposal of our ISR with ``fence`` bumps the partition
            # epoch, after which none of its proposals can be committed (the ticks resend it).
            self._propose_isr(self.isr, now_ms, fence=True)
        self.refused_until_ms = {}
        self.followers = isr_rules.reset_followers(
            self.replica_id,
            self.replicas,
            self.observers,
            self.isr,
            self.log.log_end_offset,
            now_ms,
        )
        self._maybe_advance_high_watermark(now_ms)

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
        self.mirror_link = ""
        self.sync_links = {}
        self.partition_epoch = msg.partition_epoch
        self.isr = ()
        self.followers = {}
        self.alter_in_flight = None
        self.leader_epoch_start_offset = UNDEFINED_OFFSET
        self.fetch_in_flight = None
        self.fetch_not_before_ms = now_ms
        self.push_active = False
        self.push_ack_owed = False
        self.log.drop_empty_epochs()
        self._maybe_fetch(now_ms)

    def _on_stop(self, msg: StopReplica, now_ms: int) -> None:
        if self._is_stale_command(msg.controller_epoch, msg.leader_epoch):
            return
        self._fail_all_pending(NotLeaderOrFollowerError.error_code, "replica stopped")
        self._answer_parked_with_error(NotLeaderOrFollowerError.error_code)
        self.role = Role.STOPPED
        self.remote_state_wanted = None
        self.remote_state_asked = False
        self.mirror_link = ""
        self.sync_links = {}
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
        elif answers_in_flight and msg.error_code == FencedLeaderEpochError.error_code:
            # Our leader epoch is over, but the proposal may have been committed before it
            # ended (an answer lost): its additions keep counting towards the HW until the
            # controller tells us our new role, as Kafka keeps its pending ISR state on this
            # error. Resending it is harmless: refused again, once per timeout at most.
            return
        elif answers_in_flight:
            # INELIGIBLE_REPLICA and the rest: the controller refused this proposal, so it was
            # not committed: drop it, and wait before proposing again so a refusal cannot turn
            # into a request per tick. The HW keeps using the committed ISR, and the followers
            # it would have added stop holding it until then (Kafka's isReplicaIsrEligible).
            self.alter_in_flight = None
            self.alter_not_before_ms = now_ms + self.config.alter_partition_timeout_ms
            for rid in set(in_flight.new_isr) - set(self.isr):
                self.refused_until_ms[rid] = self.alter_not_before_ms
            self._maybe_advance_high_watermark(now_ms)

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
        self._maybe_advance_high_watermark(now_ms)
        self._maybe_complete_deletes()  # a member that left no longer holds the low watermark

    # --- the local log --------------------------------------------------------------------------

    def _on_local_append_durable(self, msg: LocalAppendDurable, now_ms: int) -> None:
        if not self.log.mark_durable(msg.generation, msg.end_offset):
            return  # a report from before a truncation, or nothing new
        if self.role is Role.LEADER:
            self._complete_durable()
            self._maybe_advance_high_watermark(now_ms)
        elif self.role in (Role.FOLLOWER, Role.OBSERVER):
            self._follower_durable(now_ms)

    def _on_log_start_advanced(self, msg: LocalLogStartAdvanced, now_ms: int) -> None:
        """Retention removed the log's head (the log has done it: no AdvanceLogStart)."""
        start = min(msg.log_start_offset, self.log.high_watermark)
        if start > self.log.log_start_offset:
            self.log.move_log_start(start)
            self._maybe_complete_deletes()

    # Dispatch by method name, so a subclass (e.g. a test's deliberately buggy replica) can
    # override a handler.
    _handlers: dict[type, str] = {
        ProduceRequest: "_on_produce",
        MirrorAppendRequest: "_on_mirror_append",
        FetchRequest: "_on_fetch",
        FetchResponse: "_on_fetch_response",
        ReplicateRequest: "_on_replicate",
        ReplicateAck: "_on_replicate_ack",
        BecomeLeader: "_on_become_leader",
        BecomeFollower: "_on_become_follower",
        BecomeObserver: "_on_become_observer",
        StopReplica: "_on_stop",
        SyncLinksChanged: "_on_sync_links_changed",
        SyncLinkProgress: "_on_sync_link_progress",
        AlterPartitionResponse: "_on_alter_partition_response",
        LocalAppendDurable: "_on_local_append_durable",
        LocalLogStartAdvanced: "_on_log_start_advanced",
        RemoteStateBuilt: "_on_remote_state_built",
        DeleteRecordsRequest: "_on_delete_records",
    }
