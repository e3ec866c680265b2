"""Types at the edge of the replication state machine: its configuration, the effects it
returns in a Ready, and the InvariantViolation it raises.

This module owns the contract between ``raylog.actors.replication.partition.PartitionReplica`` and
the shell that runs it (the Ray actor, or the simulator in tests/sim): what comes out of ``ready()``
and in which order the shell must carry it out (the field order of :class:`Ready`). It holds no
logic beyond validating the configuration.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import msgspec

from raylog.actors.replication.messages import (
    AlterPartitionRequest,
    BatchMeta,
    FetchResponse,
    ReplicateRequest,
)
from raylog.storage.errors import InvalidConfigError
from raylog.storage.log.txnindex import AbortedTxn


class InvariantViolation(AssertionError):
    """An invariant of the state machine broke: a bug, never an expected failure.

    A subclass of AssertionError so test tools treat it as one, but raised explicitly so that
    ``python -O`` does not remove the check. The shell lets it crash the actor.
    """


def check_invariant(condition: bool, message: str) -> None:
    """Raise InvariantViolation unless ``condition`` holds (kept under ``python -O``)."""
    if not condition:
        raise InvariantViolation(message)


class Role(enum.Enum):
    NONE = "none"  # recovered or new, no command from the controller yet
    LEADER = "leader"
    FOLLOWER = "follower"
    OBSERVER = "observer"
    STOPPED = "stopped"


# replica.fetch.max.bytes: raylog's default and bound (see its note in topic_config). A fetch
# answer holds at most this or one whole batch (at most 64 MiB), whichever is larger, so it
# fits one replication channel frame (``channel.FRAME_BYTES_MAX``).
REPLICA_FETCH_BYTES_DEFAULT = 10 << 20
REPLICA_FETCH_BYTES_MAX = 64 << 20


class ReplicaConfig(msgspec.Struct, frozen=True):
    """Per-topic settings the state machine needs (Kafka's keys in the comments)."""

    replica_lag_time_max_ms: int = 30_000  # replica.lag.time.max.ms
    min_insync_replicas: int = 1  # min.insync.replicas
    replication_mode: str = "pull"  # replication.mode: "pull" (Kafka's) or "push" (klite's)
    unclean_leader_election_enable: bool = False  # unclean.leader.election.enable
    # flush.messages > 1: records are acknowledged before they are fsync'd, so a power loss of
    # every replica may lose acknowledged ones; a follower then truncates below its high
    # watermark to the elected leader's shorter log, as Kafka's does, instead of failing.
    acks_before_fsync: bool = False
    max_pending_acks_all: int = 1_000  # acks=all requests waiting for the HW
    max_pending_acks_local: int = 10_000  # acks 0/1 requests waiting for the local fsync
    fetch_max_bytes: int = REPLICA_FETCH_BYTES_DEFAULT  # replica.fetch.max.bytes
    # fetch.max.bytes (broker): a consumer's fetch of one partition returns up to what it asks
    # for, within this; Kafka caps consumers by this, not by replica.fetch.max.bytes.
    consumer_fetch_max_bytes: int = 57_671_680
    fetch_max_wait_ms: int = 500  # replica.fetch.wait.max.ms (long poll)
    fetch_timeout_ms: int = 5_000  # a follower resends a fetch unanswered for this long
    fetch_backoff_ms: int = 100  # replica.fetch.backoff.ms, after an error
    push_idle_fetch_ms: int = 500  # push mode: fetch if no push arrived for this long
    alter_partition_timeout_ms: int = 5_000  # resend an unanswered AlterPartition
    # link.sync.lag.time.max.ms (KIP-986 sync mode): a synchronous link not caught up with
    # the HW for this long stops holding acks=all acknowledgements (replica.lag.time.max.ms's
    # rule for the ISR, applied to the link's destination).
    link_sync_lag_time_max_ms: int = 30_000
    # remote.storage.enable (KIP-405): a follower that starts over at its leader's log start
    # first takes the producer and transaction state there from the remote tier.
    remote_storage: bool = False

    def validate(self) -> None:
        if self.replication_mode not in ("pull", "push"):
            raise InvalidConfigError(
                f"replication.mode must be pull or push, not {self.replication_mode!r}"
            )
        positive = {
            "replica.lag.time.max.ms": self.replica_lag_time_max_ms,
            "min.insync.replicas": self.min_insync_replicas,
            "max_pending_acks_all": self.max_pending_acks_all,
            "max_pending_acks_local": self.max_pending_acks_local,
            "replica.fetch.max.bytes": self.fetch_max_bytes,
            "fetch.max.bytes": self.consumer_fetch_max_bytes,
            "fetch_timeout_ms": self.fetch_timeout_ms,
            "push_idle_fetch_ms": self.push_idle_fetch_ms,
            "alter_partition_timeout_ms": self.alter_partition_timeout_ms,
            "link.sync.lag.time.max.ms": self.link_sync_lag_time_max_ms,
        }
        for key, value in positive.items():
            if value < 1:
                raise InvalidConfigError(f"{key} must be >= 1, got {value}")
        if self.fetch_max_bytes > REPLICA_FETCH_BYTES_MAX:
            raise InvalidConfigError(
                f"replica.fetch.max.bytes must be <= {REPLICA_FETCH_BYTES_MAX}, "
                f"got {self.fetch_max_bytes}"
            )
        if self.fetch_max_wait_ms < 0 or self.fetch_backoff_ms < 0:
            raise InvalidConfigError("fetch wait and backoff must be >= 0")


# --- effects (what a Ready holds) -------------------------------------------------------------


class AppendBatch(msgspec.Struct, frozen=True):
    """Append ``data`` to the log at exactly ``batch.base_offset`` with ``batch.leader_epoch``.

    ``replicated`` False (leader path): ``data`` is the client's batch; the log assigns and
    stamps offsets and epoch (``Log.append(data, batch.leader_epoch)``), and the shell asserts
    that it assigned ``batch.base_offset``. ``replicated`` True (follower path): ``data`` is
    the leader's stored bytes, already stamped (``Log.append_replicated(data)``).
    ``generation`` is the log generation the append belongs to: echo it in LocalAppendDurable.
    ``aborted``: the batch is an ABORT marker, and this the transaction it aborted, for the
    log's ``.txnindex`` (``Log.append_aborted_txn`` after the append).
    """

    batch: BatchMeta
    data: bytes
    generation: int
    replicated: bool = False
    aborted: AbortedTxn | None = None


class TruncateTo(msgspec.Struct, frozen=True):
    """Remove every batch at or above ``offset`` (a batch boundary); the log generation is now
    ``generation``. ``offset`` may also be a new log start (``full`` True: empty the log and
    start it at ``offset``, after the leader's log start moved past our end)."""

    offset: int
    generation: int
    full: bool = False


class AdvanceLogStart(msgspec.Struct, frozen=True):
    """Move the log start offset up to ``offset`` and delete the segments wholly below it
    (``Log.advance_log_start(offset, high_watermark)``): DeleteRecords on the leader, or a
    follower adopting its leader's log start. ``offset`` is never above the high watermark."""

    offset: int


class SendToReplica(msgspec.Struct, frozen=True):
    to: int
    message: Any  # FetchRequest (follower → leader) or ReplicateAck (push mode)


class SendFetchData(msgspec.Struct, frozen=True):
    """Answer a fetch: read whole batches from ``fetch_offset`` (the first may start before it)
    up to ``max_bytes`` (at least one batch if any), never reaching ``upper_offset``, put them in
    ``response.batches`` and send to ``to`` (a replica id, or CONSUMER_REPLICA_ID: the client
    request ``response.request_id``). With an error code or ``fetch_offset >= upper_offset``
    the response goes out with no batches."""

    to: int
    response: FetchResponse
    fetch_offset: int
    max_bytes: int
    upper_offset: int


class SendPushData(msgspec.Struct, frozen=True):
    """Push mode: read the whole batches in [``base_offset``, ``end_offset``) (within
    ``max_bytes``) from the log (just
    appended by this same Ready, so read them after its log operations, or build them from
    the Ready's ``AppendBatch``es and send before those: see the partition module), put them
    in ``request.batches`` and send the ReplicateRequest to replica ``to``. Do not wait for
    the local fsync: the push runs in parallel with it."""

    to: int
    request: ReplicateRequest
    base_offset: int
    end_offset: int
    # At most this many bytes (at least one batch): the batches appended while the previous
    # push was in flight go together, up to replica.fetch.max.bytes.
    max_bytes: int = 1 << 30


class ProduceResult(msgspec.Struct, frozen=True):
    """Complete produce request ``request_id``: ``error_code`` 0 and the assigned base offset,
    or an error (``base_offset`` -1 unless the batch was appended) and a message for logs.
    A mirror append's result (``MirrorAppendRequest``) counts the batches it ``appended``."""

    request_id: int
    error_code: int
    base_offset: int
    message: str = ""
    appended: int = 0


class DeleteRecordsResult(msgspec.Struct, frozen=True):
    """Complete DeleteRecords request ``request_id``: ``error_code`` 0 and the partition's low
    watermark (the lowest log start offset over the in-sync replicas), or an error and -1."""

    request_id: int
    error_code: int
    low_watermark: int
    message: str = ""


@dataclass
class Ready:
    """Everything the shell must do, in field order (see the module docstring)."""

    log_ops: list[TruncateTo | AppendBatch | AdvanceLogStart] = field(default_factory=list)
    checkpoint_high_watermark: int | None = None
    messages: list[SendToReplica | SendFetchData | SendPushData] = field(default_factory=list)
    alter_partition: list[AlterPartitionRequest] = field(default_factory=list)
    produce_results: list[ProduceResult] = field(default_factory=list)
    delete_records_results: list[DeleteRecordsResult] = field(default_factory=list)
    # Tiered storage: read the producer and transaction state at this offset from the remote
    # tier (after the log ops: the log now starts there, empty), and step RemoteStateBuilt.
    build_remote_state: int | None = None

    def is_empty(self) -> bool:
        return not (
            self.log_ops
            or self.checkpoint_high_watermark is not None
            or self.build_remote_state is not None
            or self.messages
            or self.alter_partition
            or self.produce_results
            or self.delete_records_results
        )
