"""The gateway's TCP server: asyncio sockets around the sans-IO :class:`Connection`.

This module owns the I/O of the Kafka listener: accepting connections, reading bytes into each
connection's state machine, running one task per admitted request, and writing the bytes the
state machine releases. Protocol decisions (framing, admission, ordering, limits) are the
connection's; dispatch is by API key through ``handlers.HANDLERS``.

Per connection:

1. The socket reads straight into the connection's buffers (``get_buffer`` /
   ``buffer_updated`` under an ``asyncio.BufferedProtocol``: a large request is received in
   place, in one copy). One reader task asks ``next_event`` for requests. While the connection
   is PAUSED (``max_in_flight`` requests unanswered) the socket stops being read once
   ``READ_AHEAD_BYTES`` are buffered, so a client that pipelines faster than we answer is held
   back by TCP; and no request is admitted while the transport holds more unsent responses
   than its high mark, so one that does not read its responses is held back too.
2. Each request runs in its own task, so a slow Fetch does not hold up a Metadata behind it; the
   connection releases responses in request order regardless.
3. Client garbage (``RemoteProtocolError``) logs one line and closes that connection. A handler
   that raises is a bug: it is logged with its traceback and that connection is closed. Neither
   touches other connections or the listening socket.

Limits: ``max_connections`` open connections (more are closed on accept), ``max_frame_bytes``
per request, ``max_in_flight`` requests and ``max_in_flight_bytes`` per connection,
``connections_max_idle_ms`` (Kafka's key and default: a connection with nothing in flight and
nothing received for that long is closed; a peer that does not read its responses for that long
is dropped too), and ``close_timeout_s`` for in-flight requests to finish when the server stops.

Listeners: ``start`` opens one, and may be called once per listener (each its own socket,
optionally TLS); it may bind the port without accepting until ``start_serving`` (the gateway
actor serves once its metadata is current). A connection on a SASL listener is served its
requests one at a time until its SASL exchange succeeds, and only those
``authentication.ClientSession.admits``; anything else closes it. A failed exchange's answer is
held for the throttle's delay, sent, and the connection closed, with one log line naming the
user and the address (never a secret).

Client quotas (``gateway/quotas.py``): for a client with a quota, each handler's time on the
event loop counts against request_percentage (clients without one are not measured); a
response carrying ``throttle_time_ms`` is sent at once and the connection is then muted for
that long (KIP-219): no further request is read from it. A client with a quota has its requests
admitted one at a time, as Kafka serves every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from raylog.actors.control.principal_mapping import PrincipalMapper, peer_principal
from raylog.actors.transport.arena import ArenaPool
from raylog.actors.transport.channel import Buffer, WritableProtocol
from raylog.gateway.authentication import ANONYMOUS, Authenticator, ClientSession, SessionState
from raylog.gateway.authorization import Authorization
from raylog.gateway.backend import Backend
from raylog.gateway.errors import RemoteProtocolError
from raylog.gateway.groups.coordinator import GroupCoordinator
from raylog.gateway.handlers import (
    HANDLERS,
    CloseConnection,
    Handler,
    RequestContext,
    advertised_versions,
)
from raylog.gateway.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_IN_FLIGHT,
    Connection,
    Request,
    Signal,
)
from raylog.gateway.quotas import ClientQuotas, busy_time
from raylog.gateway.request_stats import RequestStats
from raylog.gateway.transactions.coordinator import TransactionCoordinator
from raylog.storage.errors import RaylogError

__all__ = ["GatewayServer", "Limits", "ListenerSocket", "event_loop_factory"]

log = logging.getLogger(__name__)

READ_AHEAD_BYTES = 1 << 20  # buffered while the reader task is not asking for data


@dataclass(frozen=True, slots=True)
class Limits:
    """Every bound the server keeps, with Kafka's key names where Kafka has one."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # socket.request.max.bytes
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_in_flight_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_connections: int = 1024  # max.connections
    connections_max_idle_ms: int = 600_000  # connections.max.idle.ms
    close_timeout_s: float = 5.0


@dataclass(frozen=True, slots=True)
class ListenerSocket:
    """What the server needs of one listener: its name (Metadata answers with its addresses),
    whether it runs SASL, its TLS context (None: no TLS) and, for SSL listeners that ask for
    client certificates, how a certificate maps to a principal."""

    name: str = ""
    sasl: bool = False
    ssl_context: ssl.SSLContext | None = None
    # SSL with client certificates: the certificate's subject, mapped, names the principal.
    principal_mapper: PrincipalMapper | None = None


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's event loop when it is installed, else asyncio's default one."""
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop  # type: ignore[no-any-return]


class GatewayServer:
    """A Kafka protocol listener serving ``handlers`` against ``backend``."""

    def __init__(
        self,
        backend: Backend,
        *,
        handlers: Mapping[int, Handler] = HANDLERS,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_in_flight_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_connections: int = 1024,
        connections_max_idle_ms: int = 600_000,
        close_timeout_s: float = 5.0,
        groups: GroupCoordinator | None = None,
        transactions: TransactionCoordinator | None = None,
        authenticator: Authenticator | None = None,
        authorization: Authorization | None = None,
        quotas: ClientQuotas | None = None,
    ) -> None:
        self.backend = backend
        self.quotas = quotas or ClientQuotas()  # client quotas (gateway/quotas.py)
        self.authenticator = authenticator  # SASL listeners need one
        self.authorization = authorization  # None: every request allowed
        self.groups = groups  # the group coordinator the group APIs use (None: unavailable)
        self.transactions = transactions  # the transaction coordinator (None: unavailable)
        # Shared memory that large requests are received into, when the backend hands them to
        # its replicas from there (``raylog.actors.transport.arena``).
        self.arenas: ArenaPool | None = getattr(backend, "arenas", None)
        self._handlers = dict(handlers)
        self._api_versions = advertised_versions(self._handlers)
        self.limits = Limits(
            max_frame_bytes=max_frame_bytes,
            max_in_flight=max_in_flight,
            max_in_flight_bytes=max_in_flight_bytes,
            max_connections=max_connections,
            connections_max_idle_ms=connections_max_idle_ms,
            close_timeout_s=close_timeout_s,
        )
        self._servers: list[asyncio.Server] = []
        self._clients: set[asyncio.Task[None]] = set()
        self.connections_accepted = 0
        self.connections_rejected = 0  # closed by us for garbage, handler bugs or over the limit
        self.read_buffered_peak = 0  # most bytes one connection held read and not yet taken
        self.write_buffered_peak = 0  # most response bytes one connection's transport held
        self.reads_held_for_writes = 0  # times a reader waited for its client to read
        self.authentication_failures = 0
        self.request_stats = RequestStats()  # for the metrics endpoint

    @property
    def api_versions(self) -> Mapping[int, tuple[int, int]]:
        """The advertised table: the target versions of the APIs with a handler."""
        return self._api_versions

    @property
    def open_connections(self) -> int:
        return len(self._clients)

    @property
    def serving(self) -> bool:
        return bool(self._servers) and all(server.is_serving() for server in self._servers)

    async def start(
        self,
        host: str,
        port: int,
        listener: ListenerSocket | None = None,
        *,
        serve: bool = True,
    ) -> int:
        """Listen on ``host:port`` (0 = any free port) as ``listener`` (default: plaintext,
        no SASL); return the bound port. Called once per listener. ``serve`` False: bind the
        port (a port in use fails here) but refuse connections until :meth:`start_serving`."""
        listener = listener or ListenerSocket()
        if listener.sasl and self.authenticator is None:
            raise ValueError(f"listener {listener.name} runs SASL: the server needs credentials")
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _ClientSocket(self, listener),
            host,
            port,
            ssl=listener.ssl_context,
            start_serving=serve,
        )
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def start_serving(self) -> None:
        """Accept connections on every listener bound with ``serve`` False (idempotent)."""
        for server in self._servers:
            if not server.is_serving():
                await server.start_serving()

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (bounded), then close every connection."""
        if not self._servers:
            return
        for server in self._servers:
            server.close()
        clients = list(self._clients)
        for task in clients:
            task.cancel()
        if clients:
            # Each connection drains within close_timeout_s; the margin covers closing itself.
            await asyncio.wait(clients, timeout=self.limits.close_timeout_s * 2)
        for server in self._servers:
            await server.wait_closed()
        self._servers = []

    def _on_connect(self, sock: _ClientSocket) -> None:
        assert sock.transport is not None
        if len(self._clients) >= self.limits.max_connections:
            self.connections_rejected += 1
            log.warning("refusing connection: %d connections open", len(self._clients))
            sock.transport.abort()
            return
        self.connections_accepted += 1
        client = _ClientConnection(self, self._handlers, sock, sock.listener)
        task = asyncio.get_running_loop().create_task(client.run())
        self._clients.add(task)
        task.add_done_callback(self._clients.discard)


class _ClientSocket(WritableProtocol):
    """The socket side of one client connection: bytes go straight into the sans-IO
    :class:`Connection`'s buffers; ``readable`` wakes the reader task."""

    def __init__(self, server: GatewayServer, listener: ListenerSocket) -> None:
        super().__init__()
        self._server = server
        self.listener = listener
        self.connection: Connection | None = None  # set by the _ClientConnection
        self.readable = asyncio.Event()  # bytes, or the end, arrived
        self.want_data = False  # the reader task waits for data: keep reading the socket

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._server._on_connect(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        assert self.connection is not None
        if self.connection.at_eof:
            # TLS may hand over bytes after the end the connection saw (a close_notify's
            # companions): nothing more is read, so they are dropped.
            return memoryview(bytearray(max(1, min(sizehint, 1 << 16))))
        return self.connection.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        assert self.connection is not None and self.transport is not None
        if self.connection.at_eof:
            return  # dropped (see get_buffer)
        self.connection.buffer_updated(nbytes)
        server = self._server
        server.request_stats.received(nbytes)
        server.read_buffered_peak = max(server.read_buffered_peak, self.connection.buffered_bytes)
        self.readable.set()
        if not self.want_data and self.connection.buffered_bytes >= READ_AHEAD_BYTES:
            self.pause_reading()

    def write(self, data: Buffer) -> None:
        super().write(data)
        assert self.transport is not None
        server = self._server
        server.write_buffered_peak = max(
            server.write_buffered_peak, self.transport.get_write_buffer_size()
        )

    def eof_received(self) -> bool:
        self._end()
        # Keep the write side open: answers to what is in flight still go out. (TLS cannot
        # half-close: asyncio ignores the answer there, and warns when it is True.)
        return self.listener.ssl_context is None

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._end()

    def _end(self) -> None:
        if self.connection is not None and not self.connection.at_eof:
            self.connection.receive_data(b"")
        self.readable.set()


class _ClientConnection:
    """The I/O shell of one connection: a reader loop plus one task per request."""

    def __init__(
        self,
        server: GatewayServer,
        handlers: Mapping[int, Handler],
        sock: _ClientSocket,
        listener: ListenerSocket,
    ) -> None:
        self._server = server  # for its counters
        self._handlers = handlers
        self._limits = limits = server.limits
        self._idle_s = limits.connections_max_idle_ms / 1000
        self._sock = sock
        assert sock.transport is not None
        self._transport = sock.transport
        peer = sock.transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._peer_host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        self._connection = Connection(
            server.api_versions,
            max_frame_bytes=limits.max_frame_bytes,
            max_in_flight=limits.max_in_flight,
            max_in_flight_bytes=limits.max_in_flight_bytes,
            allocate=server.arenas.allocate if server.arenas is not None else None,
        )
        sock.connection = self._connection
        self._closing = False
        self._session = ClientSession(self._peer_host, listener.sasl, self._principal(listener))
        self._context = RequestContext(
            server.backend,
            server.api_versions,
            self._peer,
            server.groups,
            transactions=server.transactions,
            listener=listener.name,
            session=self._session,
            authenticator=server.authenticator,
            authorization=server.authorization,
            quotas=server.quotas,
        )
        self._requests: set[asyncio.Task[None]] = set()
        self._answered = asyncio.Event()  # set whenever a response is released
        self._muted_until = 0.0  # monotonic s: KIP-219, no request is read before it
        self._client_id: str | None = None  # of the last request admitted

    def _principal(self, listener: ListenerSocket) -> str:
        """The principal of a connection without SASL: its client certificate's, mapped, on an
        SSL listener that asks for one; else ANONYMOUS. A certificate no rule maps fails the
        connection (closed once ``run`` starts), as in Kafka."""
        if listener.principal_mapper is None or listener.sasl:
            return ANONYMOUS
        ssl_object = self._transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        try:
            return peer_principal(der, listener.principal_mapper)
        except RaylogError as exc:
            log.warning("closing connection from %s: %s", self._peer, exc)
            self._closing = True
            return ANONYMOUS

    async def run(self) -> None:
        try:
            if self._closing:  # refused as it opened (an unmappable client certificate)
                self._server.connections_rejected += 1
                return
            await self._read_loop()
            # The peer closed its side, or sent garbage: answer nothing more than what is in
            # flight (for EOF) and close.
            await self._drain_requests()
        except asyncio.CancelledError:
            # The server is stopping: finish what was admitted, within the close timeout.
            await self._drain_requests()
        finally:
            self._close()

    async def _read_loop(self) -> None:
        connection = self._connection
        sock = self._sock
        while not self._closing:
            muted_s = self._muted_until - time.monotonic()
            if muted_s > 0:  # throttled (bounded by the quota window): read nothing yet
                await asyncio.sleep(muted_s)
                continue
            if connection.in_flight and self._server.quotas.limited(
                self._session.principal, self._client_id
            ):
                # A client with a quota is served one request at a time, as Kafka serves every
                # connection: pipelined requests would outrun its throttle.
                self._answered.clear()
                await self._answered.wait()
                continue
            if sock.write_paused:
                # The client is not reading its responses: admit no more requests until it
                # does (their answers would pile up in the transport without bound); TCP then
                # holds the client back. One that reads nothing for the idle time is dropped.
                self._server.reads_held_for_writes += 1
                try:
                    async with asyncio.timeout(self._idle_s):
                        await sock.drain()
                except TimeoutError:
                    log.info("closing connection from %s: it reads no responses", self._peer)
                    self._abort()
                    return
                except ConnectionError:
                    return
                continue
            try:
                event = connection.next_event()
            except RemoteProtocolError as exc:
                self._server.connections_rejected += 1
                log.warning("closing connection from %s: %s", self._peer, exc)
                self._abort()
                return
            if isinstance(event, Request):
                self._client_id = event.header.client_id
                if not self._session.authenticated:
                    # One at a time until authenticated: each answer decides what is admitted.
                    if not self._session.admits(event.api_key):
                        self._server.connections_rejected += 1
                        log.warning(
                            "closing connection from %s: API %d before SASL authentication",
                            self._peer,
                            event.api_key,
                        )
                        if event.hold is not None:
                            event.hold.release()
                        self._abort()
                        return
                    await self._answer(event)
                    if self._session.authenticated and self._server.authenticator is not None:
                        self._server.authenticator.throttle.succeeded(self._peer_host)
                        log.debug("%s authenticated as %s", self._peer, self._session.principal)
                    continue
                task = asyncio.create_task(self._answer(event))
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)
            elif event is Signal.NEED_DATA:
                sock = self._sock
                sock.want_data = True
                sock.resume_reading()
                try:
                    if not sock.readable.is_set():
                        # asyncio.timeout rather than wait_for: no extra task per read.
                        async with asyncio.timeout(self._idle_s):
                            await sock.readable.wait()
                except TimeoutError:
                    if connection.in_flight:
                        continue  # quiet while its requests are served: not idle
                    log.info("closing idle connection from %s", self._peer)
                    return
                finally:
                    sock.want_data = False
                sock.readable.clear()
            elif event is Signal.PAUSED:
                self._answered.clear()
                if connection.paused:
                    await self._answered.wait()
            else:  # Signal.CLOSED
                return

    async def _answer(self, request: Request) -> None:
        try:
            await self._answer_held(request)
        finally:
            if request.hold is not None:
                request.hold.release()  # the calls that handed it on hold it themselves

    async def _answer_held(self, request: Request) -> None:
        handler = self._handlers[request.api_key]
        started_s = time.monotonic()
        try:
            if self._server.quotas.limited(self._session.principal, request.header.client_id):
                # Its handler time counts against request_percentage: measured step by step.
                response, busy_s = await busy_time(handler(self._context, request), time.monotonic)
            else:  # no quota applies: nothing to measure on the request path
                response, busy_s = await handler(self._context, request), None
            if self._closing:
                return
            throttle_ms = self._throttle(request, response, busy_s)
            if response is None:
                data = self._connection.send_nothing(request)
            else:
                data = self._connection.send(request, response)
        except CloseConnection as exc:
            # Kafka's answer to some requests (a failed acks=0 Produce) is to close. Responses
            # still pending before this one are dropped with the connection, as Kafka's
            # Processor.close drops them (Kafka serves one request per connection at a time,
            # so it never has any).
            log.info("closing connection from %s as Kafka does: %s", self._peer, exc)
            self._abort()
            return
        except Exception:
            # A handler or encoding bug, not the client's fault: keep the traceback, close this
            # connection (its response order can no longer be kept), leave the others alone.
            self._server.connections_rejected += 1
            log.exception(
                "closing connection from %s: API %d v%d (correlation id %d) failed",
                self._peer,
                request.api_key,
                request.api_version,
                request.correlation_id,
            )
            self._abort()
            return
        self._answered.set()
        self._server.request_stats.answered(
            request.api_key, time.monotonic() - started_s, len(data) if data else 0
        )
        if self._session.state is SessionState.FAILED:
            await self._refuse(data)
            return
        if throttle_ms:  # KIP-219: the answer goes out now, then the connection is muted
            self._muted_until = max(self._muted_until, time.monotonic() + throttle_ms / 1000)
        if data:
            self._sock.write(data)
            try:
                async with asyncio.timeout(self._idle_s):
                    await self._sock.drain()
            except (ConnectionError, OSError, TimeoutError):
                self._abort()

    def _throttle(self, request: Request, response: Any, busy_s: float | None) -> int:
        """Record the handler's time (None: not measured, no quota applies) against
        request_percentage; the response's throttle time (the larger of that and a byte
        rate's, which Produce and Fetch set)."""
        answered_ms = getattr(response, "throttle_time_ms", None)
        if busy_s is None:
            return int(answered_ms or 0)
        throttle_ms = self._server.quotas.record_request_time(
            request.api_key,
            self._session.principal,
            request.header.client_id,
            busy_s,
            int(time.monotonic() * 1000),
        )
        if answered_ms is None:
            return 0
        if throttle_ms > answered_ms:
            response.throttle_time_ms = throttle_ms
        return int(response.throttle_time_ms)

    async def _refuse(self, answer: bytes | memoryview | None) -> None:
        """A failed SASL exchange: hold the answer for the throttle's delay, send it, close."""
        server = self._server
        server.authentication_failures += 1
        assert server.authenticator is not None
        throttle = server.authenticator.throttle
        delay_ms = throttle.failed(self._peer_host, int(time.monotonic() * 1000))
        log.warning(
            "authentication of user %r (%s) from %s failed: %s; closing the connection in %d ms",
            self._session.user,
            self._session.mechanism or "no mechanism",
            self._peer,
            self._session.failure,
            delay_ms,
        )
        self._closing = True
        await asyncio.sleep(delay_ms / 1000)
        if answer:
            self._sock.write(answer)
        self._transport.close()  # sends what is buffered, then closes
        self._answered.set()

    async def _drain_requests(self) -> None:
        # After an abort nobody can read the answers: cancel at once instead of waiting.
        if self._requests and not self._closing:
            await asyncio.wait(set(self._requests), timeout=self._limits.close_timeout_s)
        for task in list(self._requests):
            task.cancel()

    def _abort(self) -> None:
        self._closing = True
        self._answered.set()  # wake a paused reader so that it sees _closing
        self._transport.abort()

    def _close(self) -> None:
        self._closing = True
        for task in list(self._requests):
            task.cancel()
        with contextlib.suppress(Exception):
            self._transport.close()
        self._connection.discard()
