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
   request to the leader's gateway, which Metadata advertises. Fetch v11+ is the exception
   (rule 5).
3. Otherwise the call goes to this broker's replica of the partition, the Ray actor named
   ``replica_actor_name(topic, partition, this_broker_id)`` (replica ids are broker ids). The
   replica checks leadership and leader epochs again, so a stale view cannot make a follower
   accept a write.

Follower fetching (KIP-392), as Kafka's ReplicaManager does it, for Fetch v11+ (requests that
carry client metadata, ``rack_id`` not None):

4. On the leader, a consumer whose ``rack_id`` is set and differs from the leader's rack is
   pointed at an in-sync replica on a live broker in its rack: the answer carries
   ``preferred_read_replica`` and no records, and the client fetches from that broker. The ISR
   is the leader replica's own (fresher than the metadata), and only fetch offsets at or below
   the high watermark qualify: every ISR member holds them (HW = min log end over the ISR).
   Kafka excludes out-of-sync followers for the same reason: a lagging one would leave the
   consumer behind for as long as the client keeps its preferred replica.
5. On a broker that holds a replica but does not lead, a v11+ fetch is served by the local
   replica up to its own high watermark (the replica checks its role and the leader epoch). A
   follower that falls out of the ISR keeps serving, as in Kafka, but stops being preferred;
   clients return to the leader when their preferred replica expires or on any error. Before
   v11 (no client metadata) only the leader serves, as rule 2 says.

Admin requests (CreateTopics, DeleteTopics, AlterConfigs, ...) may arrive at any broker: they go
to the active controller, found through a :class:`ControllerLocator` (the gateway actor), and
retried once on a freshly found controller when the one asked is gone or no longer active.
``validate_only`` runs the same pure checks the controller runs (``metadata``, ``placement``,
``config_keys``) on the controller's current metadata, and writes nothing.

Actor handles are cached by name and looked up again when a call fails with RayActorError (a
dead or restarting actor). A produce that failed that way is not retried here: whether it was
appended is unknown, so the client decides (it gets 6, refreshes metadata and retries). Reads are
retried once on a fresh handle. Every call is awaited as an asyncio future (``await ref``), never
with a blocking ``ray.get``, and bounded: produce by its ``timeout_ms``, fetch by ``max_wait_ms``,
each plus ``call_margin_ms``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import msgspec
import ray
from ray.exceptions import RayActorError, RayTaskError

from raylog.actors.calls import (
    NAMESPACE,
    FetchOutcome,
    ProduceOutcome,
    ray_call,
    replica_actor_name,
)
from raylog.actors.control import config_keys, placement
from raylog.actors.control import metadata as md_
from raylog.actors.transport import arena
from raylog.actors.transport.arena import ArenaPool, ArenaRef, Block
from raylog.actors.transport.channel import CallFailed, CallLink, ChannelAddress, channel_secret
from raylog.gateway.backend import (
    AdminResult,
    Broker,
    ClusterView,
    DeleteRecordsResult,
    FetchResult,
    ListOffsetsResult,
    PartitionState,
    ProduceResult,
    TopicConfigsResult,
    TopicState,
)
from raylog.gateway.errors import ErrorCode
from raylog.gateway.producer_ids import ProducerIdBlocks, ProducerIdResult
from raylog.storage import pki, short_circuit
from raylog.storage.errors import (
    BrokerNotAvailableError,
    InvalidPartitionsError,
    NotControllerError,
    RaylogError,
    one_line,
)
from raylog.storage.pki import LeafCertificate

__all__ = ["ControllerLocator", "MetadataSource", "MetadataView", "ReplicaBackend"]

log = logging.getLogger(__name__)

# Beyond the wait a request asks for (timeout_ms, max_wait_ms), the time a replica call may take:
# a Ray round trip, an fsync, a slow disk. Past it the gateway answers instead of hanging.
CALL_MARGIN_MS = 10_000
LOOKUP_TIMEOUT_S = 10.0  # ray.get_actor, run in a thread: a GCS round trip
ACKS_VALID = (0, 1, -1)
# Replica methods called over the replica's channel once it is connected, and their results.
_CHANNEL_RESULTS: dict[str, msgspec.msgpack.Decoder[Any]] = {
    "produce": msgspec.msgpack.Decoder(ProduceOutcome),
    "produce_shared": msgspec.msgpack.Decoder(ProduceOutcome),
    "open_arena": msgspec.msgpack.Decoder(bool),
    "fetch": msgspec.msgpack.Decoder(FetchOutcome),
    "fetch_extents": msgspec.msgpack.Decoder(FetchOutcome),
    "list_offsets": msgspec.msgpack.Decoder(tuple[int, int, int, int]),
}
ADMIN_CALL_TIMEOUT_MS = 30_000  # bound on one admin call to the controller (a CAS write or two)
VIEW_POLL_S = 0.02  # how often a create/delete looks for its result in the local metadata
COLD_READ_THREADS = 4  # short-circuit fetches reading from the disk at once, not the cache
VALIDATE_ONLY_TOPIC_ID = "validate-only"  # never stored: validate_only writes nothing


class ControllerLocator(Protocol):
    """Finds the active controller's Ray handle (the gateway actor, which already polls it)."""

    async def active_controller(self, refresh: bool = False) -> Any:
        """The handle last found active (looked up again when ``refresh``); None if none is."""
        ...


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
        controller: ControllerLocator | None = None,
        broker_configs: Mapping[str, str] | None = None,
        use_channels: bool = True,
    ) -> None:
        self.metadata = metadata
        self._controller = controller
        self._producer_ids = ProducerIdBlocks(self._allocate_producer_ids)
        # Validated once here, so that a bad broker config fails the gateway's start.
        self._broker_overrides = config_keys.BROKER_CONFIGS.validate(broker_configs or {})
        self._namespace = namespace
        self._call_margin_s = call_margin_ms / 1000
        self._handles: dict[str, Any] = {}
        # Data calls go over each local replica's TCP channel (actors/transport/channel.py) once it
        # is connected; until then, and when it is down, by Ray calls. ``_ray_in_flight`` counts
        # Ray calls per replica: the channel is used only when none is outstanding, so a
        # partition's calls never overtake each other while switching paths.
        self._use_channels = use_channels
        self._channel_secret = channel_secret() if use_channels else b""
        self._links: dict[str, CallLink] = {}
        self._ray_in_flight: dict[str, int] = {}
        self._channel_tls: ssl.SSLContext | None = None
        # One lookup at a time: callers queue FIFO on it, so calls for one partition are still
        # submitted in the order they arrived (see produce's ordering in handlers/produce.py).
        self._lookup_lock = asyncio.Lock()
        # Short-circuit fetches (storage/short_circuit.py): a replica on this gateway's Ray
        # node says where the batches lie and the gateway reads the segment files itself.
        # A replica found on another node is asked for the bytes from then on.
        self._short_circuit = short_circuit.enabled()
        self._remote_replicas: set[str] = set()
        self._node_id: str | None = None
        self.read_stats = short_circuit.ReadStats()
        # Reads that would wait for the disk run here: threads of their own, so that they never
        # queue behind (or hold up) the default executor's Ray lookups.
        self._read_pool = ThreadPoolExecutor(COLD_READ_THREADS, thread_name_prefix="raylog-read")
        # Produce by reference (actors/transport/arena.py): the server receives large requests into
        # this shared memory, and a replica on a same-host link that could open it is handed
        # each batch's place instead of its bytes. Per (replica, arena): True once it opened
        # it, False if it could not, None while asking.
        self.arenas = ArenaPool() if use_channels and arena.enabled() else None
        self._arena_open: dict[tuple[str, ArenaRef], bool | None] = {}

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
        self,
        topic: str,
        partition: int,
        records: bytes | memoryview,
        acks: int,
        timeout_ms: int,
        *,
        on_sent: Callable[[], None] | None = None,
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
                on_sent=on_sent,
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
        rack_id: str | None = None,
    ) -> FetchResult:
        error = self._route(topic, partition)
        if error == ErrorCode.NOT_LEADER_OR_FOLLOWER and rack_id is not None:
            error = self._route_to_replica(topic, partition)  # rule 5
        if error:
            return FetchResult(error, -1, -1, -1, b"")
        if rack_id:
            preferred = await self._preferred_read_replica(topic, partition, fetch_offset, rack_id)
            if preferred is not None:
                return preferred
        max_wait_ms = max(0, max_wait_ms)
        args = (fetch_offset, max_bytes, max_wait_ms, min_bytes, current_leader_epoch)
        name = replica_actor_name(topic, partition, self.metadata.this_broker_id)
        method = "fetch"
        if self._short_circuit and name not in self._remote_replicas:
            method = "fetch_extents"
        try:
            outcome = await self._call(
                topic,
                partition,
                method,
                args,
                timeout_s=max_wait_ms / 1000 + self._call_margin_s,
                retry=True,
            )
            records = outcome.records
            if outcome.extents is not None:
                located = await self._read_located(name, outcome)
                if located is None:  # it did not hold: ask for the bytes, which are there
                    outcome = await self._call(
                        topic,
                        partition,
                        "fetch",
                        (fetch_offset, max_bytes, 0, 1, current_leader_epoch),
                        timeout_s=self._call_margin_s,
                        retry=True,
                    )
                    located = outcome.records
                records = located
            if outcome.extents is None:
                self.read_stats.ray_bytes += len(outcome.records)
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
            records,
            -1,
            outcome.message,
        )

    async def _read_located(self, name: str, outcome: FetchOutcome) -> bytes | bytearray | None:
        """The batches ``outcome`` locates, read from the segment files on this node and
        checked (each CRC, and the span located); None when they cannot be read here or did
        not hold (a file removed, replaced or cut since), so the caller asks for the bytes.

        Reads from the page cache happen inline; a read that would wait for the disk goes to
        a thread, so one cold read does not stall every connection on this event loop."""
        extents = outcome.extents
        assert extents is not None
        if not extents.runs:
            return b""
        if outcome.node_id != self._this_node():
            self._remote_replicas.add(name)  # on another node: ask it for the bytes from now on
            return None
        try:
            try:
                data = short_circuit.read_runs(extents.runs, nowait=True)
            except short_circuit.WouldBlock:
                self.read_stats.disk_reads += 1
                loop = asyncio.get_running_loop()
                async with asyncio.timeout(self._call_margin_s):  # then the replica is asked
                    data = await loop.run_in_executor(
                        self._read_pool, short_circuit.read_runs, extents.runs
                    )
        except (OSError, TimeoutError) as exc:
            log.info("short-circuit fetch of %s did not hold (%s); asking for bytes", name, exc)
            self.read_stats.fallbacks += 1
            return None
        if not short_circuit.spans(data, extents.first_offset, extents.next_offset, verify=True):
            log.info("short-circuit fetch of %s read other batches; asking for bytes", name)
            self.read_stats.fallbacks += 1
            return None
        self.read_stats.local_bytes += len(data)
        return data

    def _this_node(self) -> str:
        if self._node_id is None:
            self._node_id = (
                str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else ""
            )
        return self._node_id

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

    async def delete_records(
        self, topic: str, partition: int, offset: int, timeout_ms: int
    ) -> DeleteRecordsResult:
        error = self._route(topic, partition)
        if error:
            return DeleteRecordsResult(error, -1)
        timeout_ms = max(0, timeout_ms)
        try:
            outcome = await self._call(
                topic,
                partition,
                "delete_records",
                (offset, timeout_ms),
                timeout_s=timeout_ms / 1000 + self._call_margin_s,
                retry=False,
            )
        except _CallFailed as exc:
            return DeleteRecordsResult(exc.error_code, -1, str(exc))
        except TimeoutError:
            return DeleteRecordsResult(ErrorCode.REQUEST_TIMED_OUT, -1, "replica call timed out")
        return DeleteRecordsResult(outcome.error_code, outcome.low_watermark, outcome.message)

    async def _preferred_read_replica(
        self, topic: str, partition: int, fetch_offset: int, rack_id: str
    ) -> FetchResult | None:
        """Rule 4: the answer naming a replica in the client's rack, or None to serve here."""
        state = find_partition(self.metadata.topics(), topic, partition)
        if state is None or state.leader != self.metadata.this_broker_id:
            return None  # a follower serving (rule 5): only the leader prefers
        racks = {b.node_id: b.rack for b in self.metadata.cluster().brokers}
        if racks.get(self.metadata.this_broker_id) == rack_id:
            return None  # the leader is in the client's rack
        candidates = [r for r in state.replicas if r in racks and racks[r] == rack_id]
        if not candidates:
            return None
        try:
            replica = await self._call(
                topic, partition, "state", (), timeout_s=self._call_margin_s, retry=True
            )
        except (_CallFailed, TimeoutError):
            return None  # serve from the leader: the read reports what is wrong, if anything
        if replica.role != "leader" or not 0 <= fetch_offset <= replica.high_watermark:
            return None
        chosen = next((r for r in candidates if r in replica.isr), None)
        if chosen is None:
            return None
        # Kafka's answer: the leader's offsets, no records, and where to fetch from instead.
        return FetchResult(
            ErrorCode.NONE,
            replica.high_watermark,
            replica.high_watermark,  # no transactions yet: the LSO is the HW
            replica.log_start_offset,
            b"",
            chosen,
        )

    # --- admin, through the active controller ----------------------------------------------------

    async def broker_configs(self) -> tuple[int, Mapping[str, str]]:
        return self.metadata.this_broker_id, dict(self._broker_overrides)

    async def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        assignment: Sequence[Sequence[int]] | None,
        configs: Mapping[str, str],
        validate_only: bool,
        timeout_ms: int,
    ) -> AdminResult:
        chosen = [list(r) for r in assignment] if assignment else None
        try:
            if validate_only:
                md = await self._controller_call("metadata")
                _check_create(md, name, num_partitions, replication_factor, chosen, configs)
                return AdminResult(ErrorCode.NONE)
            await self._controller_call(
                "create_topic", name, num_partitions, replication_factor, dict(configs), chosen
            )
        except RaylogError as exc:
            return AdminResult(exc.error_code, one_line(exc))
        return await self._wait_view(
            lambda topics: name in topics, timeout_ms, f"Topic {name!r} was created but is"
        )

    async def delete_topic(self, name: str, timeout_ms: int) -> AdminResult:
        try:
            await self._controller_call("delete_topic", name)
        except RaylogError as exc:
            return AdminResult(exc.error_code, one_line(exc))
        return await self._wait_view(
            lambda topics: name not in topics, timeout_ms, f"Topic {name!r} was deleted but is"
        )

    async def topic_configs(self, name: str) -> TopicConfigsResult:
        try:
            topic = await self._controller_call("describe_topic", name)
        except RaylogError as exc:
            return TopicConfigsResult(exc.error_code, {}, one_line(exc))
        return TopicConfigsResult(ErrorCode.NONE, dict(topic.configs))

    async def alter_topic_configs(
        self, name: str, overrides: Mapping[str, str], validate_only: bool
    ) -> AdminResult:
        try:
            if validate_only:
                md_.alter_configs(await self._controller_call("metadata"), name, overrides)
            else:
                await self._controller_call("alter_configs", name, dict(overrides))
        except RaylogError as exc:
            return AdminResult(exc.error_code, one_line(exc))
        return AdminResult(ErrorCode.NONE)

    # --- idempotent producers ---------------------------------------------------------------------

    async def init_producer_id(self) -> ProducerIdResult:
        """A fresh producer id from this gateway's block (a new block from the controller when
        it is used up); COORDINATOR_LOAD_IN_PROGRESS (14, retriable) when none can be had."""
        try:
            producer_id = await self._producer_ids.next_id()
        except (RaylogError, TimeoutError, ray.exceptions.RayError) as exc:
            return ProducerIdResult(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, message=str(exc))
        return ProducerIdResult(ErrorCode.NONE, producer_id, 0)

    async def _allocate_producer_ids(self) -> tuple[int, int]:
        first, count = await self._controller_call("allocate_producer_ids")
        return int(first), int(count)

    async def create_partitions(
        self, name: str, total_count: int, validate_only: bool, timeout_ms: int
    ) -> AdminResult:
        try:
            if validate_only:
                _check_partitions(await self._controller_call("metadata"), name, total_count)
                return AdminResult(ErrorCode.NONE)
            await self._controller_call("create_partitions", name, total_count)
        except RaylogError as exc:
            return AdminResult(exc.error_code, one_line(exc))
        return await self._wait_view(
            lambda topics: name in topics and len(topics[name].partitions) >= total_count,
            timeout_ms,
            f"Topic {name!r} grew to {total_count} partitions but is",
        )

    async def elect_leaders(
        self, election_type: str, partitions: Sequence[tuple[str, int]] | None
    ) -> Mapping[tuple[str, int], AdminResult]:
        wanted = None if partitions is None else [list(tp) for tp in partitions]
        try:
            codes = await self._controller_call("elect_leaders", election_type, wanted)
        except RaylogError as exc:
            every = partitions or []
            return {tp: AdminResult(exc.error_code, one_line(exc)) for tp in every}
        return {tuple(tp): AdminResult(code) for tp, code in codes.items()}

    async def _controller_call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on the active controller; raises RaylogError with Kafka's code.

        A controller that is gone or no longer active is looked up again once: the active one
        may have moved since the gateway last polled.
        """
        if self._controller is None:
            raise NotControllerError("this gateway was started without a controller to ask")
        for attempt in (1, 2):
            handle = await self._controller.active_controller(refresh=attempt > 1)
            if handle is None:
                raise NotControllerError("no active controller found; retry")
            try:
                return await ray_call(getattr(handle, method).remote(*args), ADMIN_CALL_TIMEOUT_MS)
            except (NotControllerError, BrokerNotAvailableError):
                if attempt == 2:
                    raise
            except RaylogError:
                raise
            except RayTaskError as exc:  # a bug in the controller: answer, do not drop the client
                log.error("controller failed in %s: %s", method, exc)
                raise RaylogError(f"controller failed in {method}: {one_line(exc)}") from exc
        raise AssertionError("unreachable")

    async def _wait_view(
        self,
        done: Callable[[Mapping[str, TopicState]], bool],
        timeout_ms: int,
        what: str,
    ) -> AdminResult:
        """Kafka's rule for CreateTopics/DeleteTopics: with ``timeout_ms`` <= 0 answer once the
        controller committed; else wait until this broker's metadata shows the change, and
        answer REQUEST_TIMED_OUT (7) if it does not within ``timeout_ms``."""
        if timeout_ms <= 0:
            return AdminResult(ErrorCode.NONE)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while not done(self.metadata.topics()):  # bounded by the deadline
            if loop.time() >= deadline:
                return AdminResult(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"{what} not in this broker's metadata after {timeout_ms} ms",
                )
            await asyncio.sleep(VIEW_POLL_S)
        return AdminResult(ErrorCode.NONE)

    # --- plumbing ------------------------------------------------------------------------------

    def _route(self, topic: str, partition: int) -> int:
        """0 when this broker leads the partition, else the error the client must see."""
        state = find_partition(self.metadata.topics(), topic, partition)
        if state is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if state.leader != self.metadata.this_broker_id:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    def _route_to_replica(self, topic: str, partition: int) -> int:
        """0 when this broker holds a replica of the partition (it may serve a v11+ fetch)."""
        state = find_partition(self.metadata.topics(), topic, partition)
        if state is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if self.metadata.this_broker_id not in state.replicas:
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
        on_sent: Callable[[], None] | None = None,
    ) -> Any:
        """Call ``method`` on this broker's replica of the partition; bounded by ``timeout_s``.

        ``on_sent`` is called when the call went onto the replica's channel: one TCP stream,
        whose calls the replica starts in arrival order, so a later call cannot overtake it.
        A Ray call gives no such promise (an argument in the object store may arrive later
        than a later call's), so on that path the caller learns nothing before the outcome.
        Raises _CallFailed when there is no outcome, TimeoutError past the bound.
        """
        name = replica_actor_name(topic, partition, self.metadata.this_broker_id)
        attempts = 2 if retry else 1
        async with asyncio.timeout(timeout_s):
            if method in _CHANNEL_RESULTS and self._use_channels:
                done, result = await self._channel_call(
                    name, method, args, retry=retry, on_sent=on_sent
                )
                if done:
                    return result
            # Ray pickles its arguments, and a memoryview does not pickle: bytes of it.
            args = tuple(bytes(a) if isinstance(a, memoryview) else a for a in args)
            for attempt in range(1, attempts + 1):
                # Invariant: with a cached handle nothing is awaited before .remote(), so calls
                # are submitted in the order this coroutine was entered.
                handle = self._handles.get(name)
                if handle is None:
                    handle = await self._lookup(name)
                self._ray_in_flight[name] = self._ray_in_flight.get(name, 0) + 1
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
                finally:
                    self._ray_in_flight[name] -= 1
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Close the channels to the replicas (the gateway stops)."""
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(link.aclose() for link in links))
        self._read_pool.shutdown(wait=False)

    def set_channel_tls(self, leaf: LeafCertificate) -> None:
        """Use mutual TLS with ``leaf`` (from the cluster CA) on the channels to the replicas;
        links made before are closed and remade."""
        self._channel_tls = pki.client_context(leaf)
        for link in self._links.values():
            link.close()
        self._links.clear()

    async def _channel_call(
        self,
        name: str,
        method: str,
        args: tuple[Any, ...],
        *,
        retry: bool,
        on_sent: Callable[[], None] | None = None,
    ) -> tuple[bool, Any]:
        """``(True, result)`` when the call went over the replica's channel, ``(False, None)``
        when it must go by Ray (no link yet, or Ray calls to that replica outstanding)."""
        link = self._links.get(name)
        if link is None:
            link = self._links[name] = CallLink(name, self._channel_secret, self._channel_tls)
        if link.full:  # the replica is behind on this link: wait (never go round it by Ray)
            await link.wait_room()
        hold = None
        if method == "produce" and self.arenas is not None and link.local:
            method, args, hold = self._by_reference(name, link, args)
        future = link.call(method, args, hold) if not self._ray_in_flight.get(name) else None
        if future is None:
            link.ensure_connecting(lambda: self._channel_address(name))
            return False, None
        if on_sent is not None:
            on_sent()
        try:
            raw = await future
        except CallFailed as exc:
            if not exc.lost and hold is not None:
                # It opened the arena before, and cannot read this batch from it now: hand it
                # batches in the calls from now on; the client resends this one.
                self._arena_open[(name, hold.arena.ref)] = False
                log.warning("replica %s refused a batch by reference: %s", name, exc)
                raise _CallFailed(ErrorCode.NOT_LEADER_OR_FOLLOWER, str(exc)) from exc
            if not exc.lost:
                log.error("replica %s failed in %s: %s", name, method, exc)
                code = ErrorCode.UNKNOWN_SERVER_ERROR
                raise _CallFailed(code, f"{name}.{method} failed") from exc
            if retry:  # a read: ask again by Ray
                return False, None
            raise _CallFailed(ErrorCode.NOT_LEADER_OR_FOLLOWER, str(exc)) from exc
        finally:
            if future.cancelled():  # timed out here: its reply, if it comes, is dropped
                link.forget(future)
        return True, _CHANNEL_RESULTS[method].decode(raw)

    def _by_reference(
        self, name: str, link: CallLink, args: tuple[Any, ...]
    ) -> tuple[str, tuple[Any, ...], Block | None]:
        """A produce call that hands the replica its batch's place in the arena, when the
        batch is in it and the replica opened it; else the call as it is. The first batch
        from an arena to a replica goes as it is while the replica is asked to open it."""
        records = args[0]
        assert self.arenas is not None
        found = self.arenas.locate(records) if isinstance(records, memoryview) else None
        if found is None:
            return "produce", args, None
        block, offset = found
        ref = block.arena.ref
        key = (name, ref)
        if key not in self._arena_open:
            probe = link.call("open_arena", ref)
            if probe is not None:
                self._arena_open[key] = None
                probe.add_done_callback(functools.partial(self._arena_opened, key))
            return "produce", args, None
        if not self._arena_open[key]:
            return "produce", args, None
        return "produce_shared", (*ref, offset, len(records), *args[1:]), block

    def _arena_opened(self, key: tuple[str, ArenaRef], probe: asyncio.Future[Any]) -> None:
        if probe.cancelled() or probe.exception() is not None:
            self._arena_open.pop(key, None)  # the link broke: ask again on the next connection
            return
        opened = _CHANNEL_RESULTS["open_arena"].decode(probe.result())
        self._arena_open[key] = opened
        if not opened:
            log.info("replica %s cannot open the produce arena: batches go in calls", key[0])

    async def _channel_address(self, name: str) -> ChannelAddress:
        handle = self._handles.get(name) or await self._lookup(name)
        address = await asyncio.wait_for(handle.channel_address.remote(), LOOKUP_TIMEOUT_S)
        if address is None:
            raise LookupError(f"{name} has no channel")
        return tuple(address)  # type: ignore[return-value]

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


def _check_create(
    md: md_.ClusterMetadata,
    name: str,
    num_partitions: int,
    replication_factor: int,
    assignment: list[list[int]] | None,
    configs: Mapping[str, str],
) -> None:
    """CreateTopics with validate_only: the controller's checks, nothing written (raises)."""
    md_.validate_topic_name(name)
    chosen = assignment or placement.place_replicas(
        md_.active_brokers(md), num_partitions, replication_factor
    )
    md_.create_topic(md, name, VALIDATE_ONLY_TOPIC_ID, chosen, configs)


def _check_partitions(md: md_.ClusterMetadata, name: str, total_count: int) -> None:
    """CreatePartitions with validate_only: the controller's checks, nothing written (raises)."""
    t = md_.get_topic(md, name)
    if total_count <= len(t.partitions):
        raise InvalidPartitionsError(
            f"Topic {name!r} has {len(t.partitions)} partitions; {total_count} is not more"
        )
    new = placement.place_new_partitions(
        md_.active_brokers(md),
        [p.replicas for p in t.partitions],
        total_count - len(t.partitions),
    )
    md_.add_partitions(md, name, new)
