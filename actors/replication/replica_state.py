"""The state every part of one replica's state machine shares, pure: identity, role, epochs,
the log view, the leader's and the follower's state, and the effects produced so far.

``ReplicaState`` is the base of ``partition.PartitionReplica``: it creates the state over a
recovered log and holds the small operations both the leader's side (``leader.LeaderSide``)
and the follower's side (``follower.FollowerSide``) use: log operations through the
``ReplicaLog`` (``replica_log``), messages to other replicas, and the invariants. The handlers
of the two sides are separate classes over this one state, rather than helpers handed parts
of it, because both sides read and change the same role, epochs and log, and because tests
replace single handlers (a replica with a known bug overrides ``_append``,
``_truncate_diverged``, ``_maybe_advance_high_watermark`` ...) to show that the simulator's
checkers catch it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from raylog.actors.replication import isr as isr_rules
from raylog.actors.replication.delete_records import (
    MAX_PENDING_DELETE_RECORDS,
    DeleteRecordsQueue,
    PendingDeleteRecords,
)
from raylog.actors.replication.isr import FollowerState
from raylog.actors.replication.messages import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    AlterPartitionRequest,
    BatchMeta,
    EpochEndOffset,
    FetchRequest,
)
from raylog.actors.replication.producer_snapshot import ProducerSnapshot
from raylog.actors.replication.producer_state import ProducerStateTable
from raylog.actors.replication.ready import (
    Ready,
    ReplicaConfig,
    Role,
    SendToReplica,
    check_invariant,
)
from raylog.actors.replication.refused_batches import RefusedBatches
from raylog.actors.replication.replica_log import ReplicaLog
from raylog.actors.replication.sync_links import SyncLinkState
from raylog.actors.replication.txn_state import TxnTable

if TYPE_CHECKING:
    from raylog.actors.replication.leader import ParkedFetch, PendingProduce

NONE = 0  # Kafka's error code for success
# Upper bounds that keep every loop in the state machine finite even on bad input.
MAX_REPLICAS = 64
MAX_BATCHES_PER_MESSAGE = 10_000


class ReplicaState:
    """One replica's state. See the module docstring; ``partition`` has the contract."""

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
        producer_snapshot: ProducerSnapshot | None = None,
    ) -> None:
        """Create a replica over a recovered log.

        ``log_end_offset`` is the end of the recovered log, which the shell has fsync'd during
        recovery (so it is also the durable end); ``epoch_cache`` lists (epoch, start_offset) of
        the batches in it; ``high_watermark`` is the checkpoint, clamped into the log here;
        ``producer_batches`` are the headers of the log's idempotent and transactional batches
        in log order (with each transaction marker's type and coordinator epoch), from which
        the producer and transaction state is rebuilt; with ``producer_snapshot``, those from
        its offset on, replayed over it (``producer_snapshot``).
        """
        self.config = config or ReplicaConfig()
        self.config.validate()
        check_invariant(replica_id >= 0, "replica ids are >= 0")
        self.replica_id = replica_id
        self.role = Role.NONE
        self.leader_id = -1
        self.leader_epoch = UNDEFINED_EPOCH
        self.partition_epoch = -1
        self.controller_epoch = -1
        # A re-created replica (Role.NONE) may hear how its predecessor's last AlterPartition
        # ended before the controller's command reaches it: (leader epoch, partition epoch)
        # of that committed state. A BecomeLeader older than it is stale (_on_become_leader).
        self.committed_partition_state = (UNDEFINED_EPOCH, -1)
        # The cluster link (KIP-986) this replica's topic mirrors, from the BecomeLeader that
        # made it leader ("": a normal topic, and on every replica that does not lead).
        self.mirror_link = ""
        self.log = ReplicaLog(
            log_start_offset,
            log_end_offset,
            epoch_cache,
            high_watermark,
            producer_batches,
            producer_snapshot,
        )
        # Leader state.
        self.isr: tuple[int, ...] = ()
        self.replicas: tuple[int, ...] = ()
        self.observers: tuple[int, ...] = ()
        self.followers: dict[int, FollowerState] = {}
        self.leader_epoch_start_offset = UNDEFINED_OFFSET
        # The log start a follower must hold to join the ISR (isr.may_join_isr): ours when we
        # became leader, raised by each DeleteRecords we apply.
        self.isr_join_log_start = 0
        self.alter_in_flight: AlterPartitionRequest | None = None
        # A leader resumed in a new process: its predecessor's last AlterPartition may still be
        # committed, so every replica counts towards the HW until a newer partition epoch is
        # known (a fencing proposal bumps it; see isr's docstring).
        self.isr_unconfirmed = False
        self.alter_sent_ms = 0
        self.alter_not_before_ms = 0
        # Followers whose addition to the ISR the controller refused (a broker shutting down or
        # fenced: INELIGIBLE_REPLICA), until when: they hold no HW meanwhile (isr's docstring).
        self.refused_until_ms: dict[int, int] = {}
        self.pending: dict[int, PendingProduce] = {}
        # Idempotent batches refused without an append, which the producer's later batches
        # wait behind (``refused_batches``).
        self.refused_batches: RefusedBatches[int] = RefusedBatches()
        self.pending_acks_all = 0
        self.deletes = DeleteRecordsQueue()
        self.parked: dict[int, ParkedFetch] = {}
        # Synchronous cluster links (KIP-986 sync mode; ``sync_links``) that hold acks=all
        # acknowledgements, by link name, as of the controller's ``sync_links_version``.
        self.sync_links: dict[str, SyncLinkState] = {}
        self.sync_links_version = -1
        # Follower state.
        self.fetch_in_flight: FetchRequest | None = None
        self.fetch_sent_ms = 0
        self.next_request_id = 1
        self.fetch_not_before_ms = 0
        self.push_active = False
        self.last_push_ms = 0
        self.push_ack_owed = False
        # Tiered storage: the offset a follower started over at and whose producer state it
        # waits for from the remote tier (None: none), whether the shell is reading it, and
        # when to ask again after a failed read (``follower``).
        self.remote_state_wanted: int | None = None
        self.remote_state_asked = False
        self.remote_state_not_before_ms = 0
        self._ready = Ready()
        self._check_invariants()

    # --- the log, as the rest of raylog reads it -------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def durable_end_offset(self) -> int:
        return self.log.durable_end_offset

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: read_committed consumers read below it (``txn_state``)."""
        return self.log.last_stable_offset

    @property
    def txns(self) -> TxnTable:
        return self.log.txns

    @property
    def generation(self) -> int:
        return self.log.generation

    @property
    def epoch_cache(self) -> list[tuple[int, int]]:
        return self.log.epoch_cache

    @property
    def producers(self) -> ProducerStateTable:
        return self.log.producers

    @property
    def last_epoch(self) -> int:
        """Epoch of the last batch in the log (UNDEFINED_EPOCH when the log is empty)."""
        return self.log.last_epoch

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        """Kafka's LeaderEpochFileCache.endOffsetFor (see ``ReplicaLog``)."""
        return self.log.end_offset_for_epoch(epoch)

    # --- ISR and low watermark -------------------------------------------------------------------

    def maximal_isr(self) -> tuple[int, ...]:
        """The committed ISR plus the members an in-flight AlterPartition would add (every
        replica while the predecessor's proposals are not fenced yet)."""
        return isr_rules.maximal_isr(
            self.isr, self.replicas, self.alter_in_flight, self.isr_unconfirmed
        )

    @property
    def low_watermark(self) -> int:
        """The leader's lowest log start offset over the maximal ISR; UNDEFINED_OFFSET while a
        member's is unknown."""
        return isr_rules.low_watermark(
            self.replica_id, self.maximal_isr(), self.followers, self.log.log_start_offset
        )

    @property
    def pending_deletes(self) -> dict[int, PendingDeleteRecords]:
        """The DeleteRecords requests waiting for the low watermark, by request id."""
        return self.deletes.pending

    # --- operations both sides use -------------------------------------------------------------

    def _send(self, to: int, message: Any) -> None:
        self._ready.messages.append(SendToReplica(to, message))

    def _append(self, batch: BatchMeta, data: bytes, *, replicated: bool) -> None:
        self.log.append(batch, data, replicated, self._ready)

    def _may_lose_committed(self) -> bool:
        """Whether giving up records below the HW can be right: after an unclean election, or
        where acknowledged records may not have reached any disk (a relaxed flush policy)."""
        return self.config.unclean_leader_election_enable or self.config.acks_before_fsync

    def _truncate(self, offset: int) -> None:
        self.log.truncate(offset, self._may_lose_committed(), self._ready)

    def _truncate_fully(self, new_start_offset: int) -> None:
        self.log.truncate_fully(new_start_offset, self._may_lose_committed(), self._ready)

    def _set_high_watermark(self, new_hw: int) -> None:
        self.log.set_high_watermark(new_hw, self._ready)

    def _advance_log_start(self, offset: int) -> None:
        """Move our log start up to ``offset`` (<= the HW) and have the shell do it on disk."""
        self.log.advance_log_start(offset, self._ready)

    def _check_invariants(self) -> None:
        self.log.check_invariants()
        check_invariant(
            len(self.pending)
            <= self.config.max_pending_acks_all + self.config.max_pending_acks_local,
            "pending produce requests are bounded",
        )
        check_invariant(self.pending_acks_all <= self.config.max_pending_acks_all, "acks=all bound")
        check_invariant(len(self.deletes) <= MAX_PENDING_DELETE_RECORDS, "DeleteRecords bound")
        if self.role is Role.LEADER:
            check_invariant(self.replica_id in self.isr, "a leader is in its own ISR")
            check_invariant(
                len(self.parked) <= len(self.followers), "one parked fetch per follower"
            )
