"""How raylog's processes find and call each other through Ray: actor names and call helpers.

Every raylog actor lives in the ``raylog`` Ray namespace under a name derived from what it is
(a replica from its topic, partition and replica id; a broker, its gateway and a controller from
their ids), so that a process finds a peer with ``ray.get_actor(name, namespace=NAMESPACE)``
without asking anyone. This module owns those names, the one wrapper that turns Ray's failures
into raylog's errors (:func:`ray_call`), the clock actors read (:func:`monotonic_ms`), and
the shapes a replica's calls answer with (:class:`ProduceOutcome`, :class:`FetchOutcome`, ...).
Pipelines and the gateway use this module, never the actor modules, to reach actors. Ray itself
is imported by the helpers that call it: a Spark worker that reads segment files directly
imports this module for the names and never pays for importing Ray.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from raylog.actors.replication.messages import UNDEFINED_EPOCH
from raylog.storage.errors import BrokerNotAvailableError, RequestTimedOutError
from raylog.storage.log import Extents

NAMESPACE = "raylog"
CONTROLLERS = 2  # controller actors of a cluster: the active one and a standby
SUPERVISOR_ACTOR_NAME = "supervisor"
# A broker's bound on one new replica actor answering (its process started, its log opened).
# Ray starts worker processes a few at a time, so a broker creating many replicas at once
# waits for the last of them about as long as they all take one after another.
REPLICA_START_TIMEOUT_MS = 60_000


def controller_actor_name(index: int) -> str:
    """The Ray actor name of controller ``index`` (0 .. CONTROLLERS - 1)."""
    return f"controller:{index}"


def broker_actor_name(broker_id: int) -> str:
    """The Ray actor name of a broker."""
    return f"broker:{broker_id}"


def gateway_actor_name(broker_id: int) -> str:
    """The Ray actor name of broker ``broker_id``'s gateway."""
    return f"gateway:{broker_id}"


def replica_actor_name(topic: str, partition: int, replica_id: int) -> str:
    """The Ray actor name of a partition replica."""
    return f"replica:{topic}:{partition}:{replica_id}"


def monotonic_ms() -> int:
    """This machine's monotonic clock in milliseconds: the time actors feed their state."""
    return time.monotonic_ns() // 1_000_000


async def ray_call(ref: Any, timeout_ms: int | None) -> Any:
    """Await one Ray call; the only place Ray failures are translated.

    - the peer cannot answer (:data:`_PEER_GONE`: dead or restarting, or it or the task cannot
      be placed, e.g. pinned to a node that is gone) -> BrokerNotAvailableError;
    - no answer within ``timeout_ms`` (None: wait forever) -> RequestTimedOutError;
    - an exception raised by the remote method comes back as itself (Ray re-raises it as an
      instance of its own class), e.g. NotControllerError.
    """
    try:
        if timeout_ms is None:
            return await ref
        return await asyncio.wait_for(_awaited(ref), timeout=timeout_ms / 1000)
    except _peer_gone() as exc:
        raise BrokerNotAvailableError(f"peer actor gone: {type(exc).__name__}") from exc
    except TimeoutError as exc:
        raise RequestTimedOutError(f"no answer within {timeout_ms} ms") from exc


async def _awaited(ref: Any) -> Any:
    return await ref


def _peer_gone() -> tuple[type[BaseException], ...]:
    """Ray's errors for a call that no peer will answer: the actor is dead or restarting
    (RayActorError), cannot be placed (an actor restarted while pinned to a node that is gone
    raises ActorUnschedulableError on every call, for ever), or the task's node or worker died.
    """
    import ray

    e = ray.exceptions
    return (
        e.RayActorError,
        e.ActorUnschedulableError,
        e.ActorPlacementGroupRemoved,
        e.TaskUnschedulableError,
        e.NodeDiedError,
        e.WorkerCrashedError,
    )


# --- what a replica's calls answer -------------------------------------------------------------


class ProduceOutcome(msgspec.Struct, frozen=True):
    """What a produce call returns: Kafka's error code, base offset and log start offset.

    ``needs_verification``: nothing was appended; the batch would open a transaction of its
    producer here, and the caller asked to verify that first (KIP-890, ``verify_txn``)."""

    error_code: int
    base_offset: int
    log_start_offset: int
    message: str = ""
    needs_verification: bool = False


class FetchOutcome(msgspec.Struct, frozen=True):
    """What a consumer fetch returns: whole stored batches as one opaque byte string (a
    read-only buffer from :meth:`ReplicaActor.read_committed`)."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records: bytes
    leader_epoch: int = UNDEFINED_EPOCH
    message: str = ""
    # From fetch_extents: where the batches lie instead of their bytes.
    extents: Extents | None = None
    node_id: str = ""  # the Ray node of the replica that answered fetch_extents
    # read_committed: (producer id, first offset) of every aborted transaction the answer
    # overlaps (Kafka's FetchResponse AbortedTransactions); empty for read_uncommitted.
    aborted_transactions: tuple[tuple[int, int], ...] = ()

    @property
    def size(self) -> int:
        """The bytes the answer holds or locates."""
        if self.extents is not None:
            return sum(size for _, _, size in self.extents.runs)
        return len(self.records)


class DeleteRecordsOutcome(msgspec.Struct, frozen=True):
    """What a delete_records call returns: Kafka's error code and the partition's low
    watermark (-1 on error)."""

    error_code: int
    low_watermark: int
    message: str = ""


class MirrorOutcome(msgspec.Struct, frozen=True):
    """What a mirror append returns (:meth:`ReplicaActor.mirror_append`, KIP-986 links): Kafka's
    error code, and where the mirror's log stands after the call. ``log_end_offset`` is the
    next source offset to fetch; ``appended`` counts the batches this call appended."""

    error_code: int  # 0 or Kafka's code
    log_end_offset: int  # the leader's log end after the call: the next source offset to fetch
    high_watermark: int
    log_start_offset: int
    message: str = ""
    appended: int = 0  # batches appended by this call


class ReplicaState(msgspec.Struct, frozen=True):
    """A snapshot for operators and tests."""

    topic: str
    partition: int
    replica_id: int
    role: str
    leader_id: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    durable_end_offset: int
    offline: str | None
    last_stable_offset: int = -1  # Kafka's LSO: read_committed consumers read below it
    open_transactions: int = 0  # producers whose transaction on this partition is open
    log_size_bytes: int = 0  # every segment's bytes (Kafka's Log Size)
    cleaner_passes: int = 0  # log compaction passes this replica ran since it started
    cleaner_records_removed: int = 0
    cleaner_dirty_ratio: float = 0.0  # closed segments' bytes not compacted yet, as a share
    mirror_link: str = ""  # the cluster link this leader mirrors its topic from ("": none)


# A call an actor makes to itself from its constructor is refused while Ray still sees the actor
# as restarting ("The actor is restarting"); without retries it is lost.
SELF_CALL_RETRIES = 10


def call_self_after_init(method: str) -> None:
    """Call the current actor's ``method`` once its constructor has returned, also when Ray is
    restarting the actor; retried until Ray delivers it (``method`` must be idempotent)."""
    import ray

    handle = ray.get_runtime_context().current_actor
    getattr(handle, method).options(max_task_retries=SELF_CALL_RETRIES).remote()
