"""A live gateway on loopback, bootstrapped by real Kafka clients.

Unit-level for the gateway layer: the backend is ``InMemoryBackend`` (no Ray actors), everything
else is real: TCP on 127.0.0.1, the asyncio server, the sans-IO connection, the handlers, and
unmodified kafka-python, confluent-kafka (librdkafka), aiokafka and kcat. Proves that each client
completes the ApiVersions handshake (including the unsupported-version retry that kafka-python
and librdkafka go through) and sees the brokers and topics the backend returns, without the
gateway closing any of their connections; that responses on one connection leave in request
order when handlers finish out of order and requests exceed the in-flight bound; that a handler
bug closes only its own connection; that stopping the server answers what is in flight; and that
the server's event loop is uvloop's when ``import uvloop`` succeeds, asyncio's when it fails.

kafka-python infers the broker's version from the advertised table. With only ApiVersions and
Metadata advertised it identifies the broker as 1.0 and still bootstraps; the tests run it both
that way and with ``api_version=(3, 0)`` pinned (the version the full table reads as; a pin below
it makes kafka-python use that Kafka version's own table of request versions instead).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import socket
import struct
import subprocess
import sys
import threading
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from kafka.protocol.metadata import ApiVersionsResponse, MetadataRequest
from support.gateway import (
    CLUSTER_ID,
    HOST,
    InMemoryBackend,
    LiveGateway,
    api_versions_v0_frame,
    raw_api_versions_roundtrip,
    read_frame,
    sample_topics,
    wait_for,
)

from raylog.gateway import protocol, server
from raylog.gateway.backend import TopicState
from raylog.gateway.handlers import HANDLERS, RequestContext, advertised_versions
from raylog.gateway.protocol import Request

CLIENT_TIMEOUT_S = 20.0


@pytest.fixture
def no_closed_connections(live_gateway: LiveGateway) -> Iterator[None]:
    """Fail the test if the gateway closed any connection on its side while it ran."""
    before = live_gateway.server.connections_rejected
    yield
    assert live_gateway.server.connections_rejected == before


def expected_partitions() -> dict[str, set[int]]:
    return {name: {p.partition for p in t.partitions} for name, t in sample_topics().items()}


def test_raw_api_versions(live_gateway: LiveGateway, no_closed_connections: None) -> None:
    frame = raw_api_versions_roundtrip(live_gateway.port, correlation_id=99)
    response = ApiVersionsResponse.decode(frame[4:], version=0)
    assert int.from_bytes(frame[:4], "big") == 99
    assert response.error_code == 0
    assert {k.api_key: (k.min_version, k.max_version) for k in response.api_keys} == dict(
        advertised_versions()
    )
    assert len(response.api_keys) == 40


@pytest.mark.parametrize("api_version", [None, (3, 0)])
def test_kafka_python_consumer(
    live_gateway: LiveGateway, no_closed_connections: None, api_version: Any
) -> None:
    from kafka import KafkaConsumer

    kwargs = {} if api_version is None else {"api_version": api_version}
    consumer = KafkaConsumer(
        bootstrap_servers=live_gateway.bootstrap, request_timeout_ms=10000, **kwargs
    )
    try:
        assert consumer.topics() == {"orders", "events"}
        assert consumer.partitions_for_topic("orders") == {0, 1, 2}
        assert consumer.partitions_for_topic("events") == {0, 1}
    finally:
        consumer.close()


def test_kafka_python_infers_the_broker_version_from_the_advertised_table(
    live_gateway: LiveGateway, no_closed_connections: None
) -> None:
    """docs/PROTOCOL.md: the table reads as Kafka 3.0 (ListOffsets v7+); kafka-python then
    needs InitProducerId v3+, which is offered. A new API must not move the guess further."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=live_gateway.bootstrap, request_timeout_ms=10000)
    try:
        assert admin._client.check_version() == (3, 0)
    finally:
        admin.close()


def test_kafka_python_admin(live_gateway: LiveGateway, no_closed_connections: None) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=live_gateway.bootstrap, request_timeout_ms=10000)
    try:
        cluster = admin.describe_cluster()
        assert cluster["cluster_id"] == CLUSTER_ID
        assert cluster["controller_id"] == 1
        assert {(b["broker_id"], b["port"], b["rack"]) for b in cluster["brokers"]} == {
            (n, live_gateway.port, f"rack-{n}") for n in (1, 2, 3)
        }
        assert sorted(admin.list_topics()) == ["events", "orders"]
    finally:
        admin.close()


def test_confluent_kafka(live_gateway: LiveGateway, no_closed_connections: None) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": live_gateway.bootstrap})
    metadata = admin.list_topics(timeout=10)
    assert metadata.cluster_id == CLUSTER_ID
    assert metadata.controller_id == 1
    assert sorted(metadata.brokers) == [1, 2, 3]
    assert {b.port for b in metadata.brokers.values()} == {live_gateway.port}
    assert {n: set(t.partitions) for n, t in metadata.topics.items()} == expected_partitions()
    leaderless = metadata.topics["events"].partitions[1]
    assert leaderless.leader == -1 and leaderless.error.code() == 5


def test_aiokafka(live_gateway: LiveGateway, no_closed_connections: None) -> None:
    from aiokafka.client import AIOKafkaClient

    async def bootstrap() -> Any:
        client = AIOKafkaClient(bootstrap_servers=live_gateway.bootstrap)
        try:
            await asyncio.wait_for(client.bootstrap(), CLIENT_TIMEOUT_S)
            return await asyncio.wait_for(client.fetch_all_metadata(), CLIENT_TIMEOUT_S)
        finally:
            await client.close()

    cluster = asyncio.run(bootstrap())
    assert {b.nodeId for b in cluster.brokers()} == {1, 2, 3}
    assert cluster.topics() == {"orders", "events"}
    assert cluster.partitions_for_topic("orders") == {0, 1, 2}
    assert cluster.leader_for_partition(_topic_partition("events", 1)) == -1


def _topic_partition(topic: str, partition: int) -> Any:
    from aiokafka.structs import TopicPartition

    return TopicPartition(topic, partition)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not on PATH")
def test_kcat_list(live_gateway: LiveGateway, no_closed_connections: None) -> None:
    kcat = shutil.which("kcat")
    assert kcat is not None
    result = subprocess.run(
        [kcat, "-b", live_gateway.bootstrap, "-L", "-J", "-m", "10"],
        capture_output=True,
        timeout=CLIENT_TIMEOUT_S,
        check=True,
    )
    listing = json.loads(result.stdout)
    assert listing["controllerid"] == 1
    assert sorted(b["id"] for b in listing["brokers"]) == [1, 2, 3]
    topics = {t["topic"]: {p["partition"] for p in t["partitions"]} for t in listing["topics"]}
    assert topics == expected_partitions()


class ReversedLatencyBackend(InMemoryBackend):
    """Answers the i-th of ``n`` calls after the (i+1)-th: later requests finish first."""

    def __init__(self, n: int) -> None:
        super().__init__(topic_states=sample_topics())
        self.remaining = n

    async def topics(self, names: Sequence[str] | None) -> Mapping[str, TopicState]:
        self.remaining -= 1
        # Simulated backend latency (not a wait for a test condition): earlier calls are slower.
        await asyncio.sleep(0.0001 * self.remaining)
        return await super().topics(names)


def metadata_v1_frame(correlation_id: int) -> bytes:
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="orders")])
    request.API_VERSION = 1
    request.with_header(correlation_id=correlation_id, client_id="pipeline")
    return bytes(request.encode(version=1, header=True, framed=True))


def test_pipelined_responses_keep_request_order() -> None:
    count = 200  # above max_in_flight, so the reader pauses and resumes
    gateway = LiveGateway(ReversedLatencyBackend(count), max_in_flight=16)
    gateway.start()
    try:
        frames = [metadata_v1_frame(i) if i % 2 else api_versions_v0_frame(i) for i in range(count)]
        with socket.create_connection((HOST, gateway.port), timeout=CLIENT_TIMEOUT_S) as sock:
            sock.sendall(b"".join(frames))
            correlation_ids = [struct.unpack(">i", read_frame(sock)[:4])[0] for _ in frames]
        assert correlation_ids == list(range(count))
        assert gateway.server.connections_rejected == 0
    finally:
        gateway.stop()


def test_a_client_that_does_not_read_its_responses_is_held_back_by_tcp() -> None:
    """A client pipelining 64 kB Metadata requests and reading no response: the gateway stops
    admitting requests while its unsent responses are over the transport's high mark, and
    stops reading at READ_AHEAD_BYTES, so what it holds for that client stays bounded (TCP
    holds the client back); every response still arrives, in order, once the client reads."""
    names = [f"no-such-topic-{i:06d}" for i in range(3000)]

    def request(correlation_id: int) -> bytes:
        body = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names])
        body.API_VERSION = 1
        body.with_header(correlation_id=correlation_id, client_id="unread")
        return bytes(body.encode(version=1, header=True, framed=True))

    count = 160  # 10 MB of requests and 14 MB of responses: more than the socket buffers hold
    max_in_flight = 4
    gateway = LiveGateway(InMemoryBackend(topic_states=sample_topics()), max_in_flight=4)
    gateway.start()
    try:
        with socket.create_connection((HOST, gateway.port), timeout=CLIENT_TIMEOUT_S) as sock:
            sender = threading.Thread(
                target=sock.sendall, args=(b"".join(request(i) for i in range(count)),)
            )
            sender.start()
            # Until the gateway holds back (or, were it not to, piles up responses).
            response_bytes = 91_000  # about one response's size; checked below
            write_bound = (64 << 10) + (max_in_flight + 1) * response_bytes
            wait_for(
                lambda: (
                    gateway.server.reads_held_for_writes > 0
                    or gateway.server.write_buffered_peak > write_bound
                ),
                CLIENT_TIMEOUT_S,
                "the gateway to stop admitting requests its client does not read answers to",
            )
            responses = [read_frame(sock) for _ in range(count)]
            sender.join(CLIENT_TIMEOUT_S)
        assert [struct.unpack(">i", r[:4])[0] for r in responses] == list(range(count))
        assert max(len(r) for r in responses) + 4 <= response_bytes
        # The transport's high mark (asyncio's 64 KiB) plus the answers already admitted.
        assert gateway.server.write_buffered_peak <= write_bound
        bound = server.READ_AHEAD_BYTES + protocol.RECEIVE_SCRATCH_BYTES + len(request(0))
        assert gateway.server.read_buffered_peak <= bound
    finally:
        gateway.stop()


def test_handler_bug_closes_only_its_connection() -> None:
    async def broken(context: RequestContext, request: Request) -> Any:
        raise RuntimeError("a bug in a handler")

    handlers = {18: HANDLERS[18], 3: broken}
    gateway = LiveGateway(InMemoryBackend(topic_states=sample_topics()), handlers=handlers)
    gateway.start()
    try:
        with socket.create_connection((HOST, gateway.port), timeout=CLIENT_TIMEOUT_S) as good:
            good.sendall(api_versions_v0_frame(1))
            read_frame(good)
            with socket.create_connection((HOST, gateway.port), timeout=CLIENT_TIMEOUT_S) as bad:
                bad.sendall(metadata_v1_frame(2))
                with pytest.raises((ConnectionError, OSError)):
                    read_frame(bad)
            good.sendall(api_versions_v0_frame(3))
            assert read_frame(good)[:4] == struct.pack(">i", 3)
        assert gateway.alive()
        assert gateway.server.connections_rejected == 1
    finally:
        gateway.stop()


class BlockingBackend(InMemoryBackend):
    """Holds every ``topics`` call until ``release`` is set (in the gateway's loop)."""

    def __init__(self) -> None:
        super().__init__(topic_states=sample_topics())
        self.release: asyncio.Event | None = None
        self.waiting = 0

    async def topics(self, names: Sequence[str] | None) -> Mapping[str, TopicState]:
        self.release = self.release or asyncio.Event()
        self.waiting += 1
        await asyncio.wait_for(self.release.wait(), CLIENT_TIMEOUT_S)
        return await super().topics(names)


def test_stop_answers_requests_in_flight() -> None:
    backend = BlockingBackend()
    gateway = LiveGateway(backend)
    gateway.start()
    try:
        stop_with_request_in_flight(gateway, backend)
    finally:
        gateway.stop()  # the server is already stopped: this stops the loop and its thread


def stop_with_request_in_flight(gateway: LiveGateway, backend: BlockingBackend) -> None:
    with socket.create_connection((HOST, gateway.port), timeout=CLIENT_TIMEOUT_S) as sock:
        sock.sendall(metadata_v1_frame(5))
        wait_for(lambda: backend.waiting == 1, CLIENT_TIMEOUT_S, "the request to reach the backend")

        async def stop_then_release() -> None:
            stopping = asyncio.ensure_future(gateway.server.stop())
            # One turn of the loop: stop() closes the listener and cancels the connection's
            # reader before the backend answers, so the answer is written during the drain.
            await asyncio.sleep(0)
            assert not gateway.server.serving
            assert backend.release is not None
            backend.release.set()
            await stopping

        gateway.call(stop_then_release(), timeout_s=30.0)
        assert read_frame(sock)[:4] == struct.pack(">i", 5)
        assert sock.recv(1) == b""  # then closed


def test_connections_over_the_limit_are_closed() -> None:
    gateway = LiveGateway(InMemoryBackend(topic_states=sample_topics()), max_connections=1)
    gateway.start()
    try:
        with socket.create_connection((HOST, gateway.port), timeout=CLIENT_TIMEOUT_S) as first:
            first.sendall(api_versions_v0_frame(1))
            read_frame(first)  # now certainly registered as open
            with socket.create_connection((HOST, gateway.port), timeout=CLIENT_TIMEOUT_S) as extra:
                extra.sendall(api_versions_v0_frame(2))
                with pytest.raises((ConnectionError, OSError)):
                    read_frame(extra)
            first.sendall(api_versions_v0_frame(3))
            assert read_frame(first)[:4] == struct.pack(">i", 3)
        assert gateway.server.connections_rejected == 1
    finally:
        gateway.stop()


def test_event_loop_factory_is_uvloops_when_it_imports_else_asyncios(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Which loop the gateway runs on is decided by whether ``import uvloop`` succeeds: the
    import is controlled here (a module that cannot be imported, then one that can)."""
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert server.event_loop_factory() is asyncio.new_event_loop

    def uvloop_new_event_loop() -> asyncio.AbstractEventLoop:
        return asyncio.new_event_loop()

    installed = types.ModuleType("uvloop")
    installed.new_event_loop = uvloop_new_event_loop  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "uvloop", installed)
    assert server.event_loop_factory() is uvloop_new_event_loop


def test_idle_connection_is_closed() -> None:
    gateway = LiveGateway(InMemoryBackend(), connections_max_idle_ms=200)
    gateway.start()
    try:
        with socket.create_connection((HOST, gateway.port), timeout=CLIENT_TIMEOUT_S) as sock:
            sock.sendall(api_versions_v0_frame(1))
            read_frame(sock)
            # Blocks until the gateway closes the idle connection (bounded by the timeout).
            assert sock.recv(1) == b""
        wait_for(lambda: gateway.server.open_connections == 0, CLIENT_TIMEOUT_S, "the close")
    finally:
        gateway.stop()


def test_garbage_logs_one_line_and_closes(
    live_gateway: LiveGateway, caplog: pytest.LogCaptureFixture
) -> None:
    before = live_gateway.server.connections_rejected
    with caplog.at_level(logging.WARNING, logger="raylog.gateway.server"):
        with socket.create_connection((HOST, live_gateway.port), timeout=CLIENT_TIMEOUT_S) as sock:
            sock.sendall(struct.pack(">i", 2**31 - 1))  # a size prefix far above the limit
            assert sock.recv(1) == b""  # closed by the gateway
        wait_for(
            lambda: live_gateway.server.connections_rejected == before + 1,
            CLIENT_TIMEOUT_S,
            "the gateway to count the rejected connection",
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "raylog.gateway.server"]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "socket.request.max.bytes" in lines[0]
