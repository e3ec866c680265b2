"""raylog's own asyncio Kafka client, for cross-cluster links (KIP-986): the controller
discovers a source cluster's topics, configs and consumer groups with it, and the gateways
fetch partition data with it. Fetch responses keep their record batches as the raw bytes the
source sent (never decoded records), so a link copies them byte for byte at the same offsets.

- One connection per broker (keyed by address), opened on first use: ApiVersions first (each
  API then at the highest version both sides speak), then SASL (SaslHandshake v1 and
  SaslAuthenticate: PLAIN, SCRAM-SHA-256/512 with the server's signature checked) when the
  security protocol says so, over TLS when it says so. kafka_connection.py owns the framing,
  pipelining, correlation ids and the SASL exchange; kafka_sasl_client.py :class:`LinkSecurity`
  and the SASL client steps.
- Pipelining: concurrent calls to one broker share its connection, answers matched by
  correlation id. Kafka's brokers (and raylog's gateway) answer one connection's requests in
  order, so a long-polling Fetch delays the requests sent behind it on that connection.
- Every call is bounded by ``request_timeout_ms`` (opening the connection included); a call
  that times out drops its connection, as Kafka's clients do. No call retries: a broken
  connection is dropped and the next call opens a new one; callers retry.
- :meth:`KafkaClient.metadata` tries the bootstrap addresses in turn and refreshes the broker
  address book that the calls naming a ``broker_id`` use.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)

from raylog.actors.transport.kafka_connection import BrokerConnection, KafkaClientError
from raylog.actors.transport.kafka_sasl_client import LinkSecurity

__all__ = [
    "FetchedPartition",
    "KafkaClient",
    "KafkaClientError",
    "LinkSecurity",
    "PartitionInfo",
    "SourceMetadata",
    "TopicInfo",
]

Address = tuple[str, int]


def _ours(request: type[ApiMessage], response: type[ApiMessage], low: int, high: int = 99) -> Any:
    return (low, min(high, request.max_version, response.max_version))


# The versions this client speaks, per API key: (lowest, highest).
_VERSIONS = {
    # >= 4: record batches arrive as raw bytes; 12 adds DivergingEpoch; 13+ names topics by id.
    FetchRequest.API_KEY: _ours(FetchRequest, FetchResponse, 4, 12),
    ListOffsetsRequest.API_KEY: _ours(ListOffsetsRequest, ListOffsetsResponse, 1),
    # >= 1: controller id and internal topics; 13 only adds a top-level error code.
    MetadataRequest.API_KEY: _ours(MetadataRequest, MetadataResponse, 1, 12),
    DescribeConfigsRequest.API_KEY: _ours(DescribeConfigsRequest, DescribeConfigsResponse, 0),
    ListGroupsRequest.API_KEY: _ours(ListGroupsRequest, ListGroupsResponse, 0),
    # 2..7: one group, null topics = every committed offset; 8+ batch groups.
    OffsetFetchRequest.API_KEY: _ours(OffsetFetchRequest, OffsetFetchResponse, 2, 7),
    # 0..3: one key; 4+ batch keys.
    FindCoordinatorRequest.API_KEY: _ours(FindCoordinatorRequest, FindCoordinatorResponse, 0, 3),
}
TOPIC_RESOURCE = 2  # DescribeConfigs' resource type for a topic
DEFAULT_CONFIG = 5  # DescribeConfigs' config source (v1+) of a default value


@dataclass(frozen=True)
class PartitionInfo:
    partition: int
    leader: int
    leader_epoch: int
    error_code: int


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: str  # the topic's UUID as a string, "" when the source has none
    error_code: int
    partitions: dict[int, PartitionInfo]
    is_internal: bool


@dataclass(frozen=True)
class SourceMetadata:
    cluster_id: str
    controller_id: int
    brokers: dict[int, tuple[str, int]]
    topics: dict[str, TopicInfo]


@dataclass(frozen=True)
class FetchedPartition:
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    # Raw concatenated v2 batches as the source sent them; may end with a partial batch
    # (callers cut at the last whole batch).
    records: bytes
    diverging_epoch: tuple[int, int] | None  # (epoch, end offset) when the source says so


def _parse_address(text: str) -> Address:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bootstrap server {text!r} is not host:port")
    return host.strip("[]"), int(port)


def _tls_context(security: LinkSecurity) -> ssl.SSLContext | None:
    if not security.tls:
        return None
    try:
        context = ssl.create_default_context(cafile=security.ssl_cafile or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ssl.ca.location {security.ssl_cafile!r}: {exc}") from None
    context.check_hostname = security.ssl_check_hostname
    return context


class KafkaClient:
    """A client of one source cluster. Calls may run concurrently (they share connections);
    every one is bounded by ``request_timeout_ms`` and raises KafkaClientError on trouble."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        client_id: str = "raylog-link",
        security: LinkSecurity | None = None,
        request_timeout_ms: int = 30_000,
        max_response_bytes: int = 64 << 20,
    ) -> None:
        if isinstance(bootstrap, str):
            bootstrap = bootstrap.split(",")
        self._bootstrap = [_parse_address(b) for b in bootstrap if b.strip()]
        if not self._bootstrap:
            raise ValueError("a Kafka client needs at least one bootstrap server")
        if request_timeout_ms <= 0 or max_response_bytes <= 0:
            raise ValueError("request_timeout_ms and max_response_bytes must be positive")
        self._client_id = client_id
        self._security = security or LinkSecurity()
        self._tls = _tls_context(self._security)
        self._timeout_ms = request_timeout_ms
        self._max_response_bytes = max_response_bytes
        self._brokers: dict[int, Address] = {}
        self._connections: dict[Address, BrokerConnection] = {}
        self._opening: dict[Address, asyncio.Task[BrokerConnection]] = {}
        self._closed = False

    # --- connections -----------------------------------------------------------------------

    async def _connection(self, address: Address, name: str) -> BrokerConnection:
        if self._closed:
            raise KafkaClientError(f"{name}: the client is closed")
        connection = self._connections.get(address)
        if connection is not None and connection.alive:
            return connection
        task = self._opening.get(address)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._open(address, name))
            self._opening[address] = task
            task.add_done_callback(lambda t: self._opened(address, t))
        # Shielded: a caller that gives up does not cancel the open others wait for (it is
        # bounded by its own timeout).
        return await asyncio.shield(task)

    def _opened(self, address: Address, task: asyncio.Task[BrokerConnection]) -> None:
        if self._opening.get(address) is task:
            del self._opening[address]
        if not task.cancelled() and task.exception() is None:
            self._connections[address] = task.result()

    async def _open(self, address: Address, name: str) -> BrokerConnection:
        host, port = address
        try:
            async with asyncio.timeout(self._timeout_ms / 1000):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=self._tls, server_hostname=host if self._tls else None
                )
        except TimeoutError:
            raise KafkaClientError(f"{name}: no connection within {self._timeout_ms} ms") from None
        except (OSError, ssl.SSLError) as exc:
            raise KafkaClientError(f"{name}: cannot connect: {exc}") from None
        connection = BrokerConnection(
            name,
            reader,
            writer,
            client_id=self._client_id,
            max_response_bytes=self._max_response_bytes,
        )
        try:
            async with asyncio.timeout(self._timeout_ms / 1000):
                await connection.handshake()
                if self._security.sasl:
                    await connection.authenticate(self._security)
        except TimeoutError:
            await connection.close()
            raise KafkaClientError(f"{name}: no handshake within {self._timeout_ms} ms") from None
        except BaseException:
            await connection.close()
            raise
        return connection

    async def _call(
        self,
        address: Address,
        name: str,
        build: Callable[[int], ApiMessage],
        response_cls: type[ApiMessage],
    ) -> Any:
        """Send ``build(version)`` to ``address`` and decode the answer, within the timeout."""
        api_key = response_cls.API_KEY
        connection: BrokerConnection | None = None
        try:
            async with asyncio.timeout(self._timeout_ms / 1000):
                connection = await self._connection(address, name)
                version = connection.version(api_key, _VERSIONS[api_key])
                return await connection.call(build(version), response_cls)
        except TimeoutError:
            if connection is not None:
                # As Kafka's clients: a request without an answer drops its connection.
                connection.fail(f"no answer within {self._timeout_ms} ms")
            raise KafkaClientError(
                f"{name}: API {api_key} got no answer within {self._timeout_ms} ms"
            ) from None

    def _broker(self, broker_id: int) -> tuple[Address, str]:
        address = self._brokers.get(broker_id)
        if address is None:
            raise KafkaClientError(f"broker {broker_id} is not in the source's metadata")
        return address, f"broker {broker_id} at {address[0]}:{address[1]}"

    async def _any_broker(self) -> tuple[Address, str]:
        """A broker to ask cluster-wide questions: one already connected, else the first."""
        if not self._brokers:
            await self.metadata([])
        for broker_id, address in sorted(self._brokers.items()):
            connection = self._connections.get(address)
            if connection is not None and connection.alive:
                return self._broker(broker_id)
        if not self._brokers:
            raise KafkaClientError("the source's metadata names no brokers")
        return self._broker(min(self._brokers))

    async def close(self) -> None:
        """Close every connection; calls after this raise KafkaClientError."""
        self._closed = True
        for task in list(self._opening.values()):
            task.cancel()
        for task in list(self._opening.values()):
            with contextlib.suppress(BaseException):
                await task
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections))

    # --- the calls -------------------------------------------------------------------------

    async def metadata(self, topics: Sequence[str] | None = None) -> SourceMetadata:
        """Metadata for ``topics`` (None: every topic), from the first bootstrap address that
        answers; refreshes the broker address book."""

        def build(version: int) -> ApiMessage:
            wanted = None
            if topics is not None:
                wanted = [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
            return MetadataRequest(
                version=version,
                topics=wanted,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )

        failures = []
        for address in self._bootstrap:  # bounded: each attempt within the timeout
            name = f"bootstrap server {address[0]}:{address[1]}"
            try:
                answer = await self._call(address, name, build, MetadataResponse)
            except KafkaClientError as exc:
                failures.append(str(exc))
                continue
            brokers = {b.node_id: (b.host, b.port) for b in answer.brokers}
            self._brokers = dict(brokers)
            return SourceMetadata(
                cluster_id=answer.cluster_id or "",
                controller_id=answer.controller_id,
                brokers=brokers,
                topics={t.name: _topic_info(t) for t in answer.topics if t.name is not None},
            )
        raise KafkaClientError("no bootstrap server answered Metadata: " + "; ".join(failures))

    async def list_offsets(
        self,
        broker_id: int,
        requests: Sequence[tuple[str, int, int]],
        isolation_level: int = 0,
    ) -> dict[tuple[str, int], tuple[int, int, int]]:
        """(topic, partition, timestamp: -1 latest, -2 earliest) -> (error_code, offset,
        leader_epoch), asked of ``broker_id`` (the partitions' leader)."""
        by_topic: dict[str, list[Any]] = {}
        for topic, partition, timestamp in requests:
            by_topic.setdefault(topic, []).append(
                ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                    partition_index=partition, current_leader_epoch=-1, timestamp=timestamp
                )
            )

        def build(version: int) -> ApiMessage:
            return ListOffsetsRequest(
                version=version,
                replica_id=-1,
                isolation_level=isolation_level,
                topics=[
                    ListOffsetsRequest.ListOffsetsTopic(name=t, partitions=p)
                    for t, p in by_topic.items()
                ],
                timeout_ms=self._timeout_ms,
            )

        address, name = self._broker(broker_id)
        answer = await self._call(address, name, build, ListOffsetsResponse)
        return {
            (t.name, p.partition_index): (p.error_code, p.offset, p.leader_epoch)
            for t in answer.topics
            for p in t.partitions
        }

    async def fetch(
        self,
        broker_id: int,
        partitions: Sequence[tuple[str, int, int, int, int] | tuple[str, int, int, int, int, int]],
        *,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        max_bytes: int = 32 << 20,
        isolation_level: int = 0,
    ) -> dict[tuple[str, int], FetchedPartition]:
        """Fetch from ``broker_id``: each partition is (topic, partition, fetch_offset,
        current_leader_epoch (-1: none), partition_max_bytes[, last_fetched_epoch]); the
        source answers a diverging epoch (Fetch v12) only when given the last fetched epoch.
        ``request_timeout_ms`` must exceed ``max_wait_ms``."""
        by_topic: dict[str, list[Any]] = {}
        for topic, partition, offset, leader_epoch, partition_max_bytes, *last in partitions:
            by_topic.setdefault(topic, []).append(
                FetchRequest.FetchTopic.FetchPartition(
                    partition=partition,
                    current_leader_epoch=leader_epoch,
                    fetch_offset=offset,
                    last_fetched_epoch=last[0] if last else -1,
                    log_start_offset=-1,
                    partition_max_bytes=partition_max_bytes,
                )
            )

        def build(version: int) -> ApiMessage:
            return FetchRequest(
                version=version,
                replica_id=-1,
                max_wait_ms=max_wait_ms,
                min_bytes=min_bytes,
                max_bytes=max_bytes,
                isolation_level=isolation_level,
                session_id=0,  # with epoch -1: a full fetch, no fetch session (KIP-227)
                session_epoch=-1,
                topics=[
                    FetchRequest.FetchTopic(topic=t, partitions=p) for t, p in by_topic.items()
                ],
                forgotten_topics_data=[],
                rack_id="",
            )

        address, name = self._broker(broker_id)
        answer = await self._call(address, name, build, FetchResponse)
        if getattr(answer, "error_code", 0):
            raise KafkaClientError(
                f"{name}: Fetch failed (error {answer.error_code})", answer.error_code
            )
        out = {}
        for topic in answer.responses:
            for p in topic.partitions:
                diverging = p.diverging_epoch
                out[topic.topic, p.partition_index] = FetchedPartition(
                    error_code=p.error_code,
                    high_watermark=p.high_watermark,
                    last_stable_offset=p.last_stable_offset,
                    log_start_offset=p.log_start_offset,
                    records=bytes(p.records or b""),
                    diverging_epoch=(
                        (diverging.epoch, diverging.end_offset)
                        if diverging is not None and diverging.epoch >= 0
                        else None
                    ),
                )
        return out

    async def describe_topic_configs(
        self, topics: Sequence[str]
    ) -> dict[str, dict[str, tuple[str, bool]]]:
        """topic -> {config name: (value, is_default)}; sensitive and null values left out,
        topics the source does not have (UNKNOWN_TOPIC_OR_PARTITION) too. Any other error of
        a topic raises KafkaClientError."""

        def build(version: int) -> ApiMessage:
            resource = DescribeConfigsRequest.DescribeConfigsResource
            return DescribeConfigsRequest(
                version=version,
                resources=[
                    resource(resource_type=TOPIC_RESOURCE, resource_name=t, configuration_keys=None)
                    for t in topics
                ],
                include_synonyms=False,
                include_documentation=False,
            )

        if not topics:
            return {}
        address, name = await self._any_broker()
        answer = await self._call(address, name, build, DescribeConfigsResponse)
        out: dict[str, dict[str, tuple[str, bool]]] = {}
        for result in answer.results:
            if result.error_code == 3:
                continue
            if result.error_code:
                raise KafkaClientError(
                    f"{name}: DescribeConfigs of topic {result.resource_name!r} failed "
                    f"(error {result.error_code}): {result.error_message or ''}",
                    result.error_code,
                )
            out[result.resource_name] = {
                c.name: (c.value, _is_default(c, answer.API_VERSION))
                for c in result.configs
                if not c.is_sensitive and c.value is not None
            }
        return out

    async def list_groups(self) -> list[str]:
        """Every group id the source's brokers coordinate (each broker lists its own)."""
        if not self._brokers:
            await self.metadata([])

        async def one(broker_id: int) -> list[str]:
            address, name = self._broker(broker_id)
            answer = await self._call(
                address,
                name,
                lambda v: ListGroupsRequest(version=v, states_filter=[], types_filter=[]),
                ListGroupsResponse,
            )
            if answer.error_code:
                raise KafkaClientError(
                    f"{name}: ListGroups failed (error {answer.error_code})", answer.error_code
                )
            return [g.group_id for g in answer.groups]

        lists = await asyncio.gather(*(one(b) for b in sorted(self._brokers)))
        return sorted({g for groups in lists for g in groups})

    async def offset_fetch(
        self, group: str, topics: Sequence[str] | None = None
    ) -> dict[tuple[str, int], int]:
        """``group``'s committed offsets in ``topics`` (None: every non-internal topic of the
        source), from its coordinator; partitions without one, or with an error, left out.
        The partitions are named (not OffsetFetch's null "all topics", which some brokers,
        Tansu among them, answer with a malformed response). The group's errors raise
        KafkaClientError with the code (e.g. 14, 15, 16 while the coordinator moves)."""
        source = await self.metadata(topics)
        wanted = [
            OffsetFetchRequest.OffsetFetchRequestTopic(
                name=topic.name, partition_indexes=sorted(topic.partitions)
            )
            for topic in source.topics.values()
            if topic.error_code == 0 and (topics is not None or not topic.is_internal)
        ]
        if not wanted:
            return {}
        address, name = await self._any_broker()
        found = await self._call(
            address,
            name,
            lambda v: FindCoordinatorRequest(version=v, key=group, key_type=0),
            FindCoordinatorResponse,
        )
        if found.error_code:
            raise KafkaClientError(
                f"{name}: FindCoordinator for group {group!r} failed (error {found.error_code})",
                found.error_code,
            )
        address = (found.host, found.port)
        name = f"broker {found.node_id} at {found.host}:{found.port}"
        answer = await self._call(
            address,
            name,
            lambda v: OffsetFetchRequest(
                version=v, group_id=group, topics=wanted, require_stable=False
            ),
            OffsetFetchResponse,
        )
        if answer.error_code:
            raise KafkaClientError(
                f"{name}: OffsetFetch of group {group!r} failed (error {answer.error_code})",
                answer.error_code,
            )
        return {
            (t.name, p.partition_index): p.committed_offset
            for t in answer.topics
            for p in t.partitions
            if p.error_code == 0 and p.committed_offset >= 0
        }


def _topic_info(topic: Any) -> TopicInfo:
    topic_id = getattr(topic, "topic_id", None)
    return TopicInfo(
        name=topic.name,
        topic_id=str(topic_id) if topic_id is not None and topic_id.int != 0 else "",
        error_code=topic.error_code,
        partitions={
            p.partition_index: PartitionInfo(
                partition=p.partition_index,
                leader=p.leader_id,
                leader_epoch=p.leader_epoch,
                error_code=p.error_code,
            )
            for p in topic.partitions
        },
        is_internal=bool(topic.is_internal),
    )


def _is_default(config: Any, version: int) -> bool:
    if version == 0:
        return bool(config.is_default)
    return bool(config.config_source == DEFAULT_CONFIG)
