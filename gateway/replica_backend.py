"""The gateway's backend over real ReplicaActors: the data path of one broker's listener.

This module owns routing a partition's data request (Produce, Fetch, ListOffsets) from a
gateway to the replica actor that serves it, and turning what goes wrong on the way into Kafka
error codes. Metadata comes from a :class:`MetadataSource`: a local, synchronous view of topics,
leaders and brokers that the controller will keep current (today :class:`MetadataView`, set by
whoever starts the gateway, e.g. a test standing in for the controller).

Routing, as Kafka's brokers do it:

1. A partition the view does not hold is UNKNOWN_TOPIC_OR_PARTITION (3).
2. A partition this broker does not lead (``leader != this_broker_id``, including leaderless
   ones) is NOT_LEADER_OR_FOLLOWER (6): every client refreshes Metadata on 6 and sends the
   request to the leader's gateway, which Metadata advertises. Consumers fetch from leaders
   only until KIP-392 follower fetching lands.
3. Otherwise the call goes to this broker's replica of the partition, the Ray actor named
   ``replica_actor_name(topic, partition, this_broker_id)`` (replica ids are broker ids). The
   replica checks leadership and leader epochs again, so a stale view cannot make a follower
   accept a write.

Actor handles are cached by name and looked up again when a call fails with RayActorError (a
dead or restarting actor). A produce that failed that way is not retried here: whether it was
appended is unknown, so the client decides (it gets 6, refreshes metadata and retries). Reads are
retried once on a fresh handle. Every call is awaited as an asyncio future (``await ref``), never
with a blocking ``ray.get``, and bounded: produce by its ``timeout_ms``, fetch by ``max_wait_ms``,
each plus ``call_margin_ms``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import ray
from ray.exceptions import RayActorError, RayTaskError

from raylog.actors.replica import NAMESPACE, replica_actor_name
from raylog.gateway.backend import (
    Broker,
    ClusterView,
    FetchResult,
    ListOffsetsResult,
    PartitionState,
    ProduceResult,
    TopicState,
)
from raylog.gateway.errors import ErrorCode

__all__ = ["MetadataSource", "MetadataView", "ReplicaBackend"]

log = logging.getLogger(__name__)

# Beyond the wait a request asks for (timeout_ms, max_wait_ms), the time a replica call may take:
# a Ray round trip, an fsync, a slow disk. Past it the gateway answers instead of hanging.
CALL_MARGIN_MS = 10_000
LOOKUP_TIMEOUT_S = 10.0  # ray.get_actor, run in a thread: a GCS round trip
ACKS_VALID = (0, 1, -1)


class MetadataSource(Protocol):
    """The local metadata a gateway routes by: cheap, synchronous snapshots."""

    @property
    def this_broker_id(self) -> int: ...

    def cluster(self) -> ClusterView: ...

    def topics(self) -> Mapping[str, TopicState]: ...


class MetadataView:
    """A settable :class:`MetadataSource`: what the controller will push, set by hand for now.

    Every ``update`` replaces whole values, so a reader always sees one consistent snapshot.
    """

    def __init__(
        self,
        this_broker_id: int,
        cluster_id: str,
        *,
        controller_id: int = -1,
        brokers: Sequence[Broker] = (),
        topics: Mapping[str, TopicState] | None = None,
    ) -> None:
        self._this_broker_id = this_broker_id
        self._cluster = ClusterView(cluster_id, controller_id, tuple(brokers))
        self._topics: Mapping[str, TopicState] = dict(topics or {})

    @property
    def this_broker_id(self) -> int:
        return self._this_broker_id

    def cluster(self) -> ClusterView:
        return self._cluster

    def topics(self) -> Mapping[str, TopicState]:
        return self._topics

    def update(
        self,
        *,
        controller_id: int | None = None,
        brokers: Sequence[Broker] | None = None,
        topics: Mapping[str, TopicState] | None = None,
    ) -> None:
        cluster = self._cluster
        self._cluster = ClusterView(
            cluster.cluster_id,
            cluster.controller_id if controller_id is None else controller_id,
            cluster.brokers if brokers is None else tuple(brokers),
        )
        if topics is not None:
            self._topics = dict(topics)


def find_partition(
    topics: Mapping[str, TopicState], topic: str, partition: int
) -> PartitionState | None:
    state = topics.get(topic)
    if state is None or partition < 0:
        return None
    partitions = state.partitions
    # Partitions are normally listed by index; fall back to a scan if they are not.
    if partition < len(partitions) and partitions[partition].partition == partition:
        return partitions[partition]
    return next((p for p in partitions if p.partition == partition), None)


class _CallFailed(Exception):
    """A replica call that produced no outcome; ``error_code`` is what the client gets.

    NOT_LEADER_OR_FOLLOWER (6) when the actor could not be reached (missing, dead, restarting):
    clients refresh metadata and retry. UNKNOWN_SERVER_ERROR (-1) when the replica raised (a bug
    there, logged here): the gateway answers rather than dropping the client's connection.
    """

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class ReplicaBackend:
    """A :class:`~raylog.gateway.backend.DataBackend` whose data calls go to ReplicaActors."""

    def __init__(
        self,
        metadata: MetadataSource,
        *,
        namespace: str = NAMESPACE,
        call_margin_ms: int = CALL_MARGIN_MS,
    ) -> None:
        self.metadata = metadata
        self._namespace = namespace
        self._call_margin_s = call_margin_ms / 1000
        self._handles: dict[str, Any] = {}
        # One lookup at a time: callers queue FIFO on it, so calls for one partition are still
        # submitted in the order they arrived (see produce's ordering in handlers/produce.py).
        self._lookup_lock = asyncio.Lock()

    # --- metadata -----------------------------------------------------------------------------

    async def cluster(self) -> ClusterView:
        return self.metadata.cluster()

    async def topics(self, names: Sequence[str] | None) -> Mapping[str, TopicState]:
        topics = self.metadata.topics()
        if names is None:
            return dict(topics)
        return {name: topics[name] for name in names if name in topics}

    # --- the data path ------------------------------------------------------------------------

    async def produce(
        self, topic: str, partition: int, records: bytes, acks: int, timeout_ms: int
    ) -> ProduceResult:
        error = self._route(topic, partition)
        if error:
            return ProduceResult(error, -1, -1, -1)
        if acks not in ACKS_VALID:
            return ProduceResult(ErrorCode.INVALID_REQUIRED_ACKS, -1, -1, -1)
        timeout_ms = max(0, timeout_ms)
        try:
            outcome = await self._call(
                topic,
                partition,
                "produce",
                (records, acks, timeout_ms),
                timeout_s=timeout_ms / 1000 + self._call_margin_s,
                retry=False,
            )
        except _CallFailed as exc:
            return ProduceResult(exc.error_code, -1, -1, -1, str(exc))
        except TimeoutError:
            return ProduceResult(ErrorCode.REQUEST_TIMED_OUT, -1, -1, -1, "replica call timed out")
        # LogAppendTime is stamped inside the replica, which does not report the time yet: -1
        # tells the client to keep its own CreateTime (Kafka's answer for CreateTime topics).
        return ProduceResult(
            outcome.error_code, outcome.base_offset, -1, outcome.log_start_offset, outcome.message
        )

    async def fetch(
        self,
        topic: str,
        partition: int,
        fetch_offset: int,
        max_bytes: int,
        max_wait_ms: int,
        min_bytes: int,
        isolation_level: int,
        current_leader_epoch: int,
    ) -> FetchResult:
        error = self._route(topic, partition)
        if error:
            return FetchResult(error, -1, -1, -1, b"")
        max_wait_ms = max(0, max_wait_ms)
        try:
            outcome = await self._call(
                topic,
                partition,
                "fetch",
                (fetch_offset, max_bytes, max_wait_ms, min_bytes, current_leader_epoch),
                timeout_s=max_wait_ms / 1000 + self._call_margin_s,
                retry=True,
            )
        except _CallFailed as exc:
            return FetchResult(exc.error_code, -1, -1, -1, b"", -1, str(exc))
        except TimeoutError:
            return FetchResult(ErrorCode.REQUEST_TIMED_OUT, -1, -1, -1, b"", -1, "timed out")
        # The replica serves records below the HW only, which is also the LSO while raylog has
        # no transactions: one read answers both isolation levels.
        return FetchResult(
            outcome.error_code,
            outcome.high_watermark,
            outcome.last_stable_offset,
            outcome.log_start_offset,
            outcome.records,
            -1,
            outcome.message,
        )

    async def list_offsets(
        self,
        topic: str,
        partition: int,
        timestamp: int,
        isolation_level: int,
        current_leader_epoch: int,
    ) -> ListOffsetsResult:
        error = self._route(topic, partition)
        if error:
            return ListOffsetsResult(error, -1, -1)
        try:
            code, found_timestamp, offset, leader_epoch = await self._call(
                topic,
                partition,
                "list_offsets",
                (timestamp, current_leader_epoch),
                timeout_s=self._call_margin_s,
                retry=True,
            )
        except _CallFailed as exc:
            return ListOffsetsResult(exc.error_code, -1, -1)
        except TimeoutError:
            return ListOffsetsResult(ErrorCode.REQUEST_TIMED_OUT, -1, -1)
        return ListOffsetsResult(code, found_timestamp, offset, leader_epoch)

    # --- plumbing ------------------------------------------------------------------------------

    def _route(self, topic: str, partition: int) -> int:
        """0 when this broker leads the partition, else the error the client must see."""
        state = find_partition(self.metadata.topics(), topic, partition)
        if state is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if state.leader != self.metadata.this_broker_id:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    async def _call(
        self,
        topic: str,
        partition: int,
        method: str,
        args: tuple[Any, ...],
        *,
        timeout_s: float,
        retry: bool,
    ) -> Any:
        """Call ``method`` on this broker's replica of the partition; bounded by ``timeout_s``.

        Raises _CallFailed when there is no outcome, TimeoutError past the bound.
        """
        name = replica_actor_name(topic, partition, self.metadata.this_broker_id)
        attempts = 2 if retry else 1
        async with asyncio.timeout(timeout_s):
            for attempt in range(1, attempts + 1):
                # Invariant: with a cached handle nothing is awaited before .remote(), so calls
                # are submitted in the order this coroutine was entered.
                handle = self._handles.get(name)
                if handle is None:
                    handle = await self._lookup(name)
                try:
                    return await getattr(handle, method).remote(*args)
                except RayActorError as exc:
                    # Dead or restarting: the name may point at a new incarnation next time.
                    if self._handles.get(name) is handle:
                        del self._handles[name]
                    if attempt == attempts:
                        raise _CallFailed(
                            ErrorCode.NOT_LEADER_OR_FOLLOWER, f"replica {name}: {exc!r}"
                        ) from exc
                except RayTaskError as exc:
                    log.error("replica %s failed in %s: %s", name, method, exc)
                    raise _CallFailed(
                        ErrorCode.UNKNOWN_SERVER_ERROR, f"{name}.{method} failed"
                    ) from exc
        raise AssertionError("unreachable")

    async def _lookup(self, name: str) -> Any:
        async with self._lookup_lock:
            handle = self._handles.get(name)
            if handle is not None:
                return handle
            try:
                async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                    handle = await asyncio.to_thread(ray.get_actor, name, namespace=self._namespace)
            except ValueError as exc:  # no such actor (yet): metadata is ahead of placement
                raise _CallFailed(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER, f"no replica actor {name}"
                ) from exc
            except TimeoutError as exc:
                raise _CallFailed(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER, f"looking up {name} timed out"
                ) from exc
            self._handles[name] = handle
            return handle
