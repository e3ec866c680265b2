"""Helpers for the gateway's tests: an in-memory backend, a live gateway, raw frames.

These are unit-level tests of the gateway layer: ``InMemoryBackend`` stands in for raylog's actors
(it is the gateway's input, not a mock of the part under test), while the connection, codec,
handlers and server are the real ones, driven by real Kafka clients over real TCP.

- ``InMemoryBackend``: a fixed cluster (three brokers, all advertising the one live gateway's
  port, because only that address is reachable) and its topics.
- ``InMemoryLogBackend``: the same, plus a log per partition that Produce appends to and
  Fetch and ListOffsets read (whole stored batches, as replicas answer); a log start that
  moves up (``delete_before``: retention), a log end that moves down (``truncate``: an unclean
  election), a partition's Fetch answered with an error (``fetch_errors``) and leader epochs
  checked as a leader checks them (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH).
- ``LiveGateway``: a ``GatewayServer`` on 127.0.0.1, port 0, running in its own thread
  and event loop so that blocking clients (kafka-python, confluent-kafka, kcat) can be driven
  from the test thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from raylog.gateway.backend import (
    Broker,
    ClusterView,
    FetchResult,
    ListOffsetsResult,
    PartitionFetch,
    PartitionState,
    ProduceResult,
    TopicState,
)
from raylog.gateway.server import GatewayServer, ListenerSocket
from raylog.storage import batch as rb
from support.waiting import wait_until

HOST = "127.0.0.1"
CLUSTER_ID = "raylog-test-cluster"
START_TIMEOUT_S = 10.0
FETCHED_MAX = 10_000  # the fetches an InMemoryLogBackend remembers


@dataclass
class InMemoryBackend:
    """A ``Backend`` over fixed data, for tests of the gateway alone."""

    port: int = 0
    cluster_id: str = CLUSTER_ID
    controller_id: int = 1
    topic_states: dict[str, TopicState] = field(default_factory=dict)
    calls: int = 0

    def brokers(self) -> list[Broker]:
        # Every node id points at the one live listener, so that a client following a leader to
        # node 2 or 3 still reaches this gateway.
        return [Broker(node, HOST, self.port, f"rack-{node}") for node in (1, 2, 3)]

    async def cluster(self) -> ClusterView:
        self.calls += 1
        return ClusterView(self.cluster_id, self.controller_id, self.brokers())

    async def topics(self, names: Sequence[str] | None) -> Mapping[str, TopicState]:
        self.calls += 1
        if names is None:
            return dict(self.topic_states)
        return {name: self.topic_states[name] for name in names if name in self.topic_states}


@dataclass
class InMemoryLogBackend(InMemoryBackend):
    """An ``InMemoryBackend`` whose partitions hold logs: Produce appends the client's batch
    (stamped with its base offset), Fetch answers whole batches from the one holding the fetch
    offset (waiting up to ``max_wait_ms`` for one; OFFSET_OUT_OF_RANGE outside the log),
    ListOffsets the earliest (the log start) and latest."""

    logs: dict[tuple[str, int], list[tuple[int, bytes]]] = field(default_factory=dict)
    log_starts: dict[tuple[str, int], int] = field(default_factory=dict)
    # A partition's Fetch answers this error code while it is set.
    fetch_errors: dict[tuple[str, int], int] = field(default_factory=dict)
    # Every partition fetched: (topic, partition, fetch offset, partition max bytes).
    fetched: deque[tuple[str, int, int, int]] = field(
        default_factory=lambda: deque(maxlen=FETCHED_MAX)
    )
    _appended: asyncio.Event | None = None

    def append(self, topic: str, partition: int, batch: bytes) -> int:
        """Append ``batch`` to the partition's log; return its base offset."""
        base = self.end(topic, partition)
        log = self.logs.setdefault((topic, partition), [])
        stamped = bytearray(batch)
        rb.set_base_offset(stamped, 0, base)
        log.append((base, bytes(stamped)))
        if self._appended is not None:
            self._appended.set()
        return base

    def start(self, topic: str, partition: int) -> int:
        return self.log_starts.get((topic, partition), 0)

    def end(self, topic: str, partition: int) -> int:
        log = self.logs.get((topic, partition), [])
        if not log:
            return self.start(topic, partition)
        base, batch = log[-1]
        return base + rb.parse_header(batch, 0).last_offset_delta + 1

    def delete_before(self, topic: str, partition: int, offset: int) -> None:
        """Move the log start up to ``offset`` (retention), dropping the batches below it."""
        key = (topic, partition)
        end = max(self.end(topic, partition), offset)
        self.logs[key] = [
            (base, batch)
            for base, batch in self.logs.get(key, [])
            if base + rb.parse_header(batch, 0).last_offset_delta >= offset
        ]
        self.log_starts[key] = offset
        if not self.logs[key]:
            self.log_starts[key] = end

    def truncate(self, topic: str, partition: int, end: int) -> None:
        """Drop the batches at and above ``end`` (whole batches: the log ends where the last
        one kept ends), as an unclean election on a source does."""
        key = (topic, partition)
        self.logs[key] = [(base, batch) for base, batch in self.logs.get(key, []) if base < end]

    def _epoch_error(self, topic: str, partition: int, epoch: int) -> int:
        """A leader's check of the fetcher's current leader epoch (-1: not checked)."""
        state = self.topic_states.get(topic)
        if epoch < 0 or state is None:
            return 0
        for p in state.partitions:
            if p.partition == partition and epoch != p.leader_epoch:
                return 74 if epoch < p.leader_epoch else 75  # FENCED / UNKNOWN_LEADER_EPOCH
        return 0

    async def produce(
        self, topic: str, partition: int, records: Any, acks: int, timeout_ms: int, **_: Any
    ) -> ProduceResult:
        base = self.append(topic, partition, bytes(records))
        return ProduceResult(0, base, -1, 0)

    async def fetch(self, topic: str, partition: int, read: PartitionFetch) -> FetchResult:
        self.fetched.append((topic, partition, read.fetch_offset, read.max_bytes))
        error = self.fetch_errors.get((topic, partition)) or self._epoch_error(
            topic, partition, read.current_leader_epoch
        )
        if error:
            return FetchResult(error, -1, -1, -1, b"")
        end = self.end(topic, partition)
        if read.fetch_offset >= end and read.max_wait_ms > 0:
            self._appended = self._appended or asyncio.Event()
            self._appended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._appended.wait(), read.max_wait_ms / 1000)
            end = self.end(topic, partition)
        start = self.start(topic, partition)
        if not start <= read.fetch_offset <= end:
            return FetchResult(1, -1, -1, -1, b"")  # OFFSET_OUT_OF_RANGE
        out = bytearray()
        for base, batch in self.logs.get((topic, partition), []):
            last = base + rb.parse_header(batch, 0).last_offset_delta
            if last < read.fetch_offset:
                continue
            if out and len(out) + len(batch) > read.max_bytes:
                break
            out += batch
        return FetchResult(0, end, end, start, bytes(out))

    async def list_offsets(
        self, topic: str, partition: int, timestamp: int, *args: Any
    ) -> ListOffsetsResult:
        if timestamp == -2:
            return ListOffsetsResult(0, -1, self.start(topic, partition))
        return ListOffsetsResult(0, -1, self.end(topic, partition))


def sample_topics() -> dict[str, TopicState]:
    """Two topics: ``orders`` (3 partitions, all led) and ``events`` (partition 1 leaderless)."""
    orders = TopicState(
        "orders",
        [
            PartitionState(
                p,
                leader=1 + p % 3,
                leader_epoch=4,
                replicas=[1, 2, 3],
                isr=[1, 2, 3],
                offline_replicas=[],
            )
            for p in range(3)
        ],
    )
    events = TopicState(
        "events",
        [
            PartitionState(
                0, leader=2, leader_epoch=7, replicas=[2, 3], isr=[2, 3], offline_replicas=[]
            ),
            PartitionState(
                1, leader=-1, leader_epoch=8, replicas=[1, 3], isr=[], offline_replicas=[1, 3]
            ),
        ],
    )
    return {"orders": orders, "events": events}


class LiveGateway:
    """A GatewayServer running in a background thread's event loop."""

    def __init__(
        self,
        backend: InMemoryBackend,
        listener: ListenerSocket | None = None,
        **server_kwargs: Any,
    ) -> None:
        self.backend = backend
        self.listener = listener
        self.loop = asyncio.new_event_loop()
        self.server = GatewayServer(backend, **server_kwargs)
        self._thread = threading.Thread(target=self.loop.run_forever, name="gateway", daemon=True)
        self.port = 0

    def start(self) -> None:
        self._thread.start()
        self.port = self.call(self.server.start(HOST, 0, self.listener))
        self.backend.port = self.port

    def call(self, coroutine: Any, timeout_s: float = START_TIMEOUT_S) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout=timeout_s)

    def alive(self) -> bool:
        return self._thread.is_alive() and self.server.serving

    def stop(self) -> None:
        self.call(self.server.stop(), timeout_s=30.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10.0)
        self.loop.close()

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"


def handled(
    request: Any, version: int, response_type: Any, backend: Any, transactions: Any = None
) -> Any:
    """``request`` at ``version`` through a real sans-io connection and its registered handler
    (no socket, no Ray), with ``backend`` (and ``transactions`` as the transaction coordinator);
    the response decoded as a ``response_type``, as the client would decode it."""
    from raylog.gateway.handlers import HANDLERS, RequestContext, advertised_versions
    from raylog.gateway.protocol import Connection, Request

    request.API_VERSION = version
    request.with_header(correlation_id=5, client_id="t")
    connection = Connection(advertised_versions())
    connection.receive_data(bytes(request.encode(version=version, header=True, framed=True)))
    event = connection.next_event()
    assert isinstance(event, Request) and event.api_key == request.API_KEY
    context = RequestContext(backend, advertised_versions(), "test", transactions=transactions)
    frame = bytes(connection.send(event, asyncio.run(HANDLERS[event.api_key](context, event))))
    # size, correlation id and, in a flexible response header, its empty tagged fields
    header = 9 if request.flexible_version_q(version) else 8
    return response_type.decode(frame[header:], version=version)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` until true or the deadline passes (then fail naming ``what``)."""
    wait_until(condition, timeout_s=timeout_s, interval_s=0.01, message=what)


def api_versions_v0_frame(correlation_id: int, client_id: str = "raw") -> bytes:
    """A framed ApiVersions v0 request, built by hand (header v1, empty body)."""
    cid = client_id.encode()
    payload = struct.pack(">hhih", 18, 0, correlation_id, len(cid)) + cid
    return struct.pack(">i", len(payload)) + payload


def read_frame(sock: socket.socket) -> bytes:
    """Read one size-prefixed frame from a blocking socket (with its timeout)."""
    size = struct.unpack(">i", _read_exactly(sock, 4))[0]
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError(f"peer closed after {len(chunks)} of {n} bytes")
        chunks += chunk
    return bytes(chunks)


def raw_api_versions_roundtrip(port: int, correlation_id: int = 7, timeout_s: float = 5.0) -> bytes:
    """Open a new connection, send ApiVersions v0, and return the response frame."""
    with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
        sock.sendall(api_versions_v0_frame(correlation_id))
        return read_frame(sock)
