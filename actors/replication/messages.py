"""Every message between partition replicas, and between a replica and the controller.

This module owns the wire shapes of replication (msgspec Structs, so the Ray shell can encode
them cheaply and validate what it receives). It holds no logic: the state machine in
``raylog.actors.replication.partition`` consumes the inbound messages and produces the outbound ones
and the effects defined in ``raylog.actors.replication.partition``.

Record batches stay opaque: a :class:`RecordBatch` is the batch's metadata (base offset, record
count, size, the leader epoch that wrote it, the idempotent producer's id, epoch and first
sequence) next to its bytes. The state machine routes a
batch's bytes but never looks inside them.

Vocabulary and invariants (Kafka's):
- offsets are int64 record offsets; every log end offset and high watermark lies on a batch
  boundary because batches are appended whole;
- ``leader_epoch`` of a batch is the epoch of the leader that assigned its offsets; the epochs of
  batches in one log never decrease;
- ``-1`` means "undefined" for epochs and offsets (Kafka's ``UNDEFINED_EPOCH`` and
  ``UNDEFINED_EPOCH_OFFSET``); ``replica_id == -1`` marks a consumer, not a replica.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
CONSUMER_REPLICA_ID = -1

Acks = Literal[0, 1, -1]
ReplicationMode = Literal["pull", "push"]


class BatchMeta(msgspec.Struct, frozen=True):
    """What the state machine knows about one batch: where it sits and who wrote it."""

    base_offset: int
    # Offsets the batch spans (lastOffsetDelta + 1): its record count, unless the log
    # cleaner removed records from it (a compacted batch keeps its offsets).
    record_count: int
    size_bytes: int
    leader_epoch: int
    # The idempotent producer's header fields (-1: not idempotent); every replica rebuilds its
    # producer state from them (raylog.actors.replication.producer_state).
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    # Transactions (raylog.actors.replication.txn_state): attributes bit 4; for a transaction
    # marker (a control batch) its type (0 ABORT, 1 COMMIT; -1: not a marker) and the
    # coordinator epoch it carries.
    is_transactional: bool = False
    control_type: int = -1
    coordinator_epoch: int = -1

    @property
    def next_offset(self) -> int:
        """The offset just after this batch (its last offset + 1)."""
        return self.base_offset + self.record_count


class RecordBatch(msgspec.Struct, frozen=True):
    """One batch on the replication wire: metadata plus the untouched bytes.

    ``data`` is any bytes-like object where a replica builds one (the bytes it read from its
    log, or stamped in memory); decoded from a replication channel frame it is a view into
    that frame, so a follower stores the batch without another copy of it.
    """

    meta: BatchMeta
    data: memoryview


class EpochEndOffset(msgspec.Struct, frozen=True):
    """Answer of ``end_offset_for_epoch`` and the KIP-320 ``diverging_epoch`` of a fetch."""

    leader_epoch: int
    end_offset: int


# --- client → leader ------------------------------------------------------------------------


class ProduceRequest(msgspec.Struct, frozen=True):
    """One batch from a producer (Produce v3+ carries exactly one batch per partition).

    ``request_id`` is the shell's handle to answer on; unique among this replica's pending
    requests. ``acks`` is 0, 1 or -1 (all): the gateway's Produce handler refuses any other
    value (INVALID_REQUIRED_ACKS), as Kafka's broker does, before a request is made.
    """

    request_id: int
    acks: int
    timeout_ms: int
    record_count: int
    size_bytes: int
    data: bytes
    producer_id: int = -1  # from the batch header; -1: not idempotent
    producer_epoch: int = -1
    base_sequence: int = -1
    # As in BatchMeta: the transactional bit, and for a transaction marker (written by the
    # replica itself, never by a client) its type and coordinator epoch.
    is_transactional: bool = False
    control_type: int = -1
    coordinator_epoch: int = -1


class DeleteRecordsRequest(msgspec.Struct, frozen=True):
    """DeleteRecords for one partition: move the log start offset up to ``offset`` (-1: the
    high watermark), and answer once every in-sync replica's log starts there too, or after
    ``timeout_ms`` (Kafka's DelayedDeleteRecords). ``request_id`` is the shell's handle, from
    the same numbering as produce requests."""

    request_id: int
    offset: int
    timeout_ms: int


class MirrorAppendRequest(msgspec.Struct, frozen=True):
    """A mirror topic's leader appends a source cluster's batches at their own offsets
    (KIP-986 cluster links; the rules are in ``raylog.actors.replication.mirror``).

    ``batches`` are whole, checked batches in offset order, each with its metadata as stored:
    the source's offsets, producer fields and attributes, and ``leader_epoch`` restamped by the
    shell to ``leader_epoch`` (in the bytes too). Empty: a position query (where does the log
    end?). ``request_id`` comes from the same numbering as produce requests and is answered
    with a ``ProduceResult`` whose ``appended`` counts the batches appended.
    ``source_log_start``: the source partition's log start when it answered the Fetch.
    """

    request_id: int
    leader_epoch: int
    acks: int
    timeout_ms: int
    batches: tuple[RecordBatch, ...] = ()
    # The source partition's log start as its Fetch answered it (-1: not known), which the
    # mirror's follows (see ``mirror``).
    source_log_start: int = -1


# --- replica ↔ replica and consumer → replica -------------------------------------------------


class FetchRequest(msgspec.Struct, frozen=True):
    """A fetch from a follower, an observer or (``replica_id == -1``) a consumer.

    ``last_fetched_epoch`` is the epoch of the batch just below ``fetch_offset`` (KIP-320);
    ``UNDEFINED_EPOCH`` skips the divergence check. ``request_id`` lets the follower drop stale
    responses: it accepts only the answer to its one fetch in flight.
    """

    replica_id: int
    request_id: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_bytes: int
    max_wait_ms: int = 0
    # A replica's own log start offset (Kafka's FetchPartition.logStartOffset): the leader's
    # low watermark for DeleteRecords. UNDEFINED_OFFSET from a consumer.
    log_start_offset: int = UNDEFINED_OFFSET
    # A consumer's isolation level: 0 read_uncommitted (up to the HW), 1 read_committed (up
    # to the last stable offset).
    isolation_level: int = 0


class FetchResponse(msgspec.Struct, frozen=True):
    """The answer to a :class:`FetchRequest`.

    The state machine emits it with ``batches`` empty inside a ``SendFetchData`` effect; the shell
    reads the log and fills ``batches`` before sending. ``diverging_epoch`` is set when the
    follower's log has diverged: it must truncate (see ``PartitionReplica``) and fetch again.
    """

    leader_id: int
    request_id: int
    leader_epoch: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    diverging_epoch: EpochEndOffset | None = None
    batches: tuple[RecordBatch, ...] = ()
    # Kafka's lastStableOffset (followers ignore it) and, for a read_committed consumer, the
    # (producer id, first offset) of the aborted transactions the answer overlaps (the shell
    # fills them in once it knows where the batches it read end).
    last_stable_offset: int = UNDEFINED_OFFSET
    aborted_transactions: tuple[tuple[int, int], ...] = ()


class ReplicateRequest(msgspec.Struct, frozen=True):
    """Push mode: the leader sends freshly appended batches to an in-sync follower.

    ``prev_epoch`` is the epoch of the batch just below the first pushed batch on the leader
    (``UNDEFINED_EPOCH`` at offset 0): the follower accepts the push only if its own log ends
    exactly there, with that epoch; otherwise it falls back to pull.
    """

    leader_id: int
    leader_epoch: int
    high_watermark: int
    prev_epoch: int
    batches: tuple[RecordBatch, ...]
    log_start_offset: int = UNDEFINED_OFFSET  # the leader's, which the follower adopts


class ReplicateAck(msgspec.Struct, frozen=True):
    """Push mode: a follower reports its durable log end offset (sent after fsync).

    ``error_code`` 0 with ``in_push`` False means "I could not take that push (gap or
    divergence), stop pushing to me; I will catch up by fetching".
    """

    replica_id: int
    leader_epoch: int
    durable_end_offset: int
    error_code: int = 0
    in_push: bool = True
    log_start_offset: int = UNDEFINED_OFFSET  # the follower's, as in its fetches
    # The follower's log end (durable or not): where the leader's next push must start.
    log_end_offset: int = UNDEFINED_OFFSET


# --- replica ↔ controller ---------------------------------------------------------------------


class SyncLinkRef(msgspec.Struct, frozen=True):
    """One synchronous cluster link (KIP-986 sync mode) whose destination copies this
    partition: its name, and its id (a link deleted and created again under the same name is
    another link, whose destination holds nothing of its predecessor's)."""

    name: str
    link_id: str


class BecomeLeader(msgspec.Struct, frozen=True):
    """Controller command: lead ``leader_epoch`` with this committed ISR.

    ``mirror_link`` names the cluster link (KIP-986) this topic mirrors while that link is
    active ("" for a normal topic): the leader then appends the source's batches
    (:class:`MirrorAppendRequest`) and refuses clients' writes. Disconnecting the link is a
    new leader epoch with ``mirror_link`` "", which fences mirror appends still in flight.

    ``sync_links``: the synchronous links that copy this partition to their destinations and
    hold its acks=all acknowledgements while in sync (``raylog.actors.replication.sync_links``),
    as of ``sync_links_version`` (the metadata epoch that last changed the set; a
    :class:`SyncLinksChanged` changes it within the epoch).
    """

    controller_epoch: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    observers: tuple[int, ...] = ()
    mirror_link: str = ""
    sync_links: tuple[SyncLinkRef, ...] = ()
    sync_links_version: int = -1


class SyncLinksChanged(msgspec.Struct, frozen=True):
    """Controller command: the synchronous links of this partition are now ``sync_links``,
    without a new leader epoch (creating or deleting a link must not move leadership).
    Applied by the leader of ``leader_epoch`` only, and only if ``version`` (the metadata epoch
    that made the change) is above the one it holds: a late or repeated command changes
    nothing."""

    controller_epoch: int
    leader_epoch: int
    version: int
    sync_links: tuple[SyncLinkRef, ...]


class SyncLinkProgress(msgspec.Struct, frozen=True):
    """A synchronous link's destination reports how far it holds this partition durably
    (through the source cluster's gateway): ``durable_end_offset`` is the offset its link
    fetches from next, which it fetches only once everything below was appended with acks=all
    on its mirror's ISR. Delivered late, twice or out of order, it must change nothing wrong
    (``raylog.actors.replication.sync_links``)."""

    link: str
    link_id: str
    durable_end_offset: int


class BecomeFollower(msgspec.Struct, frozen=True):
    """Controller command: follow ``leader_id`` in ``leader_epoch`` (``leader_id`` -1: none)."""

    controller_epoch: int
    leader_id: int
    leader_epoch: int
    partition_epoch: int


class BecomeObserver(msgspec.Struct, frozen=True):
    """Controller command: replicate from ``leader_id`` but never join the ISR or lead."""

    controller_epoch: int
    leader_id: int
    leader_epoch: int
    partition_epoch: int


class StopReplica(msgspec.Struct, frozen=True):
    """Controller command: stop serving (pending requests fail with NOT_LEADER_OR_FOLLOWER)."""

    controller_epoch: int
    leader_epoch: int
    partition_epoch: int


class AlterPartitionRequest(msgspec.Struct, frozen=True):
    """Leader → controller: propose ``new_isr`` (KIP-497). At most one in flight per leader.

    ``request_id`` identifies this proposal (resends of it keep the id); the controller echoes it
    so that the leader can tell the answer to its proposal in flight from a late answer to an
    earlier one.
    """

    request_id: int
    leader_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    # A leader that resumed its epoch in a new process cannot know whether its predecessor's
    # last proposal is still on its way. ``fence`` commits even an unchanged ISR and bumps the
    # partition epoch, so that no proposal made at the old one can be committed any more.
    fence: bool = False


class AlterPartitionResponse(msgspec.Struct, frozen=True):
    """Controller → leader: the committed state for ``leader_epoch``.

    With ``error_code`` 0 the proposal was committed as ``isr`` at ``partition_epoch``. With
    INVALID_UPDATE_VERSION (108) the proposal was stale, and ``isr``/``partition_epoch`` carry the
    state the controller holds for this same leader epoch (the leader adopts it: only this
    leader changes the ISR within its epoch, so it is the outcome of an earlier proposal whose
    answer was lost). FENCED_LEADER_EPOCH (74) means this leader is stale.
    """

    error_code: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    request_id: int = -1  # the request_id of the AlterPartitionRequest answered


# --- shell → state machine (local events) -----------------------------------------------------


class LocalAppendDurable(msgspec.Struct, frozen=True):
    """The shell fsync'd the log up to ``end_offset`` (exclusive).

    ``generation`` is the log generation of the appends being reported (see ``AppendBatch``);
    a report from before a truncation is ignored, because its offsets may have been reused.
    """

    end_offset: int
    generation: int


class LocalLogStartAdvanced(msgspec.Struct, frozen=True):
    """The shell deleted whole segments (retention): the log now starts at ``log_start_offset``,
    which is never above the high watermark the shell read before deleting."""

    log_start_offset: int


class RemoteStateBuilt(msgspec.Struct, frozen=True):
    """The shell's answer to ``Ready.build_remote_state`` (tiered storage, KIP-405): the
    producer and transaction state at ``offset`` as the remote tier holds it (``snapshot``:
    a ``producer_snapshot.ProducerSnapshot`` at ``offset``; None when the remote tier has none
    there), or why it could not be read (``failed``: the object store unreachable, say)."""

    offset: int
    snapshot: Any = None
    failed: str = ""


InboundMessage = (
    ProduceRequest
    | MirrorAppendRequest
    | DeleteRecordsRequest
    | FetchRequest
    | FetchResponse
    | ReplicateRequest
    | ReplicateAck
    | BecomeLeader
    | BecomeFollower
    | BecomeObserver
    | StopReplica
    | SyncLinksChanged
    | SyncLinkProgress
    | AlterPartitionResponse
    | LocalAppendDurable
    | LocalLogStartAdvanced
    | RemoteStateBuilt
)
