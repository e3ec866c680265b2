"""Replication channels: replica-to-replica messages over direct TCP instead of Ray calls.

Why: a Ray actor call costs about 1-1.5 ms of CPU on each side on this kind of machine, and
replicating one batch to two followers took five of them (the produce, two pushes, two acks):
13 ms of CPU per batch, which capped RF=3 at a few MB/s on two cores. A framed message on an
open TCP connection costs tens of microseconds. Ray stays the control plane (creating actors,
controller commands, finding a peer's address); the channel carries only the four replication
messages (``FetchRequest``, ``FetchResponse``, ``ReplicateRequest``, ``ReplicateAck``).

The channel keeps the one-way, lossy contract the state machine already assumes (it resends what
matters after timeouts): a message to a peer without a connection yet goes by a Ray call while the
connection is made in the background, and a broken connection drops what was queued on it. TCP
keeps each link's messages in order.

Wire format (sans-IO, :func:`encode_frame` / :class:`FrameReader`): ``u32 length, u8 kind,
msgpack body`` with ``length`` counting kind and body, at most ``FRAME_BYTES_MAX``. Each link is
authenticated before any message: the server sends a random nonce, the client answers with the
name of the replica it wants and HMAC-SHA256(cluster secret, nonce + name); the server closes
the connection unless both match, so a stale address reused by another replica, or a process
without the secret, never gets a message in. The secret is the cluster's Ray auth token (every
process of the cluster has it). Under that, when the ends have certificates from the cluster's
CA (``storage/pki.py``; the controller issues them), the connection is mutual TLS 1.3 and a peer
without such a certificate never completes the TLS handshake.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import hmac
import logging
import os
import ssl
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from raylog.actors.messages import FetchRequest, FetchResponse, ReplicateAck, ReplicateRequest


class CallRequest(msgspec.Struct, frozen=True):
    """A request/response call on a channel (the gateway's produce/fetch/list_offsets).
    ``args`` is the msgpack array of the arguments; the server decodes it for ``method``."""

    call_id: int
    method: str
    args: msgspec.Raw


class CallReply(msgspec.Struct, frozen=True):
    """The answer to a :class:`CallRequest`: ``error`` empty and ``result`` the method's return
    value (msgpack, decoded by the caller, who knows its type), or ``error`` set."""

    call_id: int
    error: str
    result: msgspec.Raw = msgspec.Raw(b"\xc0")  # msgpack nil


__all__ = [
    "CHANNEL_KINDS",
    "FRAME_BYTES_MAX",
    "CallFailed",
    "CallLink",
    "CallReply",
    "CallRequest",
    "ChannelServer",
    "FrameError",
    "FrameReader",
    "PeerLink",
    "channel_secret",
    "encode_frame",
]

log = logging.getLogger(__name__)

# Kind byte on the wire -> message type. Append only: the numbers are the protocol.
CHANNEL_KINDS: tuple[type, ...] = (
    FetchRequest,
    FetchResponse,
    ReplicateRequest,
    ReplicateAck,
    CallRequest,
    CallReply,
)
_KIND_OF: dict[type, int] = {t: i for i, t in enumerate(CHANNEL_KINDS)}
_DECODERS = tuple(msgspec.msgpack.Decoder(t) for t in CHANNEL_KINDS)
_ENCODER = msgspec.msgpack.Encoder()

_HEADER = struct.Struct(">IB")  # length (kind + body), kind
FRAME_BYTES_MAX = 128 << 20  # above any fetch/push (replica.fetch.max.bytes is at most 64 MiB)
LINK_QUEUE_BYTES_MAX = 64 << 20  # queued on one link before new messages are dropped
NONCE_BYTES = 16
HANDSHAKE_NAME_BYTES_MAX = 512
HANDSHAKE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0
RECONNECT_BACKOFF_S = 0.2
_MAC_CONTEXT = b"raylog-replication-channel-v1"


class FrameError(Exception):
    """The peer sent bytes that are not a channel frame; the connection is closed."""


def is_channel_message(message: object) -> bool:
    """A one-way replication message the channel carries (not a call frame)."""
    return type(message) in _KIND_OF and type(message) not in (CallRequest, CallReply)


def encode_frame(message: Any) -> bytes:
    """One frame for ``message`` (one of :data:`CHANNEL_KINDS`)."""
    body = _ENCODER.encode(message)
    if len(body) + 1 > FRAME_BYTES_MAX:
        raise FrameError(f"message of {len(body)} bytes exceeds the frame limit")
    return _HEADER.pack(len(body) + 1, _KIND_OF[type(message)]) + body


class FrameReader:
    """Sans-IO frame parser: ``feed(bytes)`` returns the messages completed so far."""

    def __init__(self, max_bytes: int = FRAME_BYTES_MAX) -> None:
        self._buf = bytearray()
        self._max = max_bytes

    def feed(self, data: bytes) -> list[Any]:
        self._buf += data
        out = []
        while len(self._buf) >= _HEADER.size:
            length, kind = _HEADER.unpack_from(self._buf)
            if not 1 <= length <= self._max:
                raise FrameError(f"frame length {length} outside 1..{self._max}")
            if kind >= len(_DECODERS):
                raise FrameError(f"unknown message kind {kind}")
            end = 4 + length
            if len(self._buf) < end:
                break
            body = bytes(self._buf[_HEADER.size : end])
            del self._buf[:end]
            try:
                out.append(_DECODERS[kind].decode(body))
            except msgspec.DecodeError as exc:
                raise FrameError(f"bad {CHANNEL_KINDS[kind].__name__} body: {exc}") from exc
        return out


def channel_secret() -> bytes:
    """The cluster's shared secret: its Ray auth token (empty when the cluster has none)."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        with contextlib.suppress(OSError):
            return Path(path).read_bytes().strip()
    return os.environ.get("RAY_AUTH_TOKEN", "").encode()


def _mac(secret: bytes, nonce: bytes, name: bytes) -> bytes:
    return hmac.new(secret, _MAC_CONTEXT + nonce + name, hashlib.sha256).digest()


class ChannelServer:
    """Accepts authenticated links addressed to replica ``name``; hands each message to
    ``deliver``. Bad frames or a failed handshake close that connection only."""

    def __init__(
        self,
        name: str,
        secret: bytes,
        deliver: Callable[[Any], None],
        call: Callable[[str, bytes], Awaitable[Any]] | None = None,
    ) -> None:
        self.name = name
        self._secret = secret
        self._deliver = deliver
        self._call = call
        self._calls: set[asyncio.Task[None]] = set()
        self.calls_in = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.messages_in = 0
        self.rejected = 0
        self.tls = False

    async def start(self, host: str, tls: ssl.SSLContext | None = None) -> tuple[str, int]:
        """Listen on ``host`` (a free port); with ``tls``, mutual TLS before the handshake."""
        self.tls = tls is not None
        timeout = HANDSHAKE_TIMEOUT_S if tls is not None else None
        self._server = await asyncio.start_server(
            self._serve, host, 0, ssl=tls, ssl_handshake_timeout=timeout
        )
        sock = self._server.sockets[0]
        return host, sock.getsockname()[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._conns):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            if not await self._handshake(reader, writer):
                self.rejected += 1
                return
            frames = FrameReader()
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    return
                for message in frames.feed(data):
                    if isinstance(message, CallRequest):
                        self._start_call(message, writer)
                    elif isinstance(message, CallReply):
                        raise FrameError("a call reply sent to a server")
                    else:
                        self.messages_in += 1
                        self._deliver(message)
        except (
            FrameError,
            ConnectionError,
            asyncio.IncompleteReadError,
            TimeoutError,
            ssl.SSLError,
        ) as exc:
            log.warning("replication channel to %s: closing a connection: %s", self.name, exc)
        finally:
            self._conns.discard(writer)
            writer.close()

    def _start_call(self, request: CallRequest, writer: asyncio.StreamWriter) -> None:
        # Started in arrival order: each call runs synchronously up to its first await, so
        # calls on one connection reach the replica in the order they were sent.
        self.calls_in += 1
        task = asyncio.get_running_loop().create_task(self._answer(request, writer))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _answer(self, request: CallRequest, writer: asyncio.StreamWriter) -> None:
        if self._call is None:
            reply = CallReply(request.call_id, "this channel takes no calls")
        else:
            try:
                result = await self._call(request.method, bytes(request.args))
                reply = CallReply(request.call_id, "", msgspec.Raw(_ENCODER.encode(result)))
            except Exception as exc:  # the caller gets the error; the channel stays up
                reply = CallReply(request.call_id, f"{type(exc).__name__}: {exc}")
        if not writer.is_closing():
            writer.write(encode_frame(reply))
            with contextlib.suppress(ConnectionError):
                await writer.drain()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        nonce = os.urandom(NONCE_BYTES)
        writer.write(nonce)
        await writer.drain()
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            (name_len,) = struct.unpack(">H", await reader.readexactly(2))
            if name_len > HANDSHAKE_NAME_BYTES_MAX:
                return False
            name = await reader.readexactly(name_len)
            mac = await reader.readexactly(hashlib.sha256().digest_size)
        if name != self.name.encode():
            log.warning("replication channel: a peer asked %s for %r", self.name, name[:80])
            return False
        if not hmac.compare_digest(mac, _mac(self._secret, nonce, name)):
            log.warning("replication channel to %s: a peer failed authentication", self.name)
            return False
        return True


async def _connect(
    resolve: Callable[[], Any], peer_name: str, secret: bytes, tls: ssl.SSLContext | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open and authenticate a connection to replica ``peer_name`` at ``await resolve()``."""
    host, port = await resolve()
    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        reader, writer = await asyncio.open_connection(host, port, ssl=tls)
        try:
            nonce = await reader.readexactly(NONCE_BYTES)
            name = peer_name.encode()
            writer.write(struct.pack(">H", len(name)) + name + _mac(secret, nonce, name))
            await writer.drain()
        except BaseException:
            writer.close()
            raise
    return reader, writer


class _Link:
    """What both outbound links share: one connection to replica ``peer_name``, made in the
    background by :meth:`ensure_connecting`, remade after a backoff once it breaks.
    Subclasses serve the open connection (:meth:`_serve`) and clean up after it (:meth:`_down`).
    """

    def __init__(self, peer_name: str, secret: bytes, tls: ssl.SSLContext | None = None) -> None:
        self.peer_name = peer_name
        self._secret = secret
        self._tls = tls
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._not_before = 0.0

    @property
    def connected(self) -> bool:
        return self._writer is not None

    def ensure_connecting(self, resolve: Callable[[], Any]) -> None:
        """Start connecting unless connected, connecting, or backing off after a failure.
        ``resolve`` is a coroutine function returning the peer's ``(host, port)``."""
        loop = asyncio.get_running_loop()
        if self._task is not None or loop.time() < self._not_before:
            return
        self._task = loop.create_task(self._run(resolve))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def _down(self) -> None:
        raise NotImplementedError

    async def _run(self, resolve: Callable[[], Any]) -> None:
        loop = asyncio.get_running_loop()  # (not callable in `finally` while a loop closes)
        writer = None
        try:
            reader, writer = await _connect(resolve, self.peer_name, self._secret, self._tls)
            self._writer = writer
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # refused, reset, timed out, peer gone: retry after a backoff
            log.debug("channel to %s down: %r", self.peer_name, exc)
        finally:
            self._writer = None
            self._down()
            self._not_before = loop.time() + RECONNECT_BACKOFF_S
            self._task = None
            if writer is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closing
                    writer.close()


class PeerLink(_Link):
    """The outbound link to one peer replica: connect, authenticate, write queued frames.

    :meth:`send` returns False when the link cannot take the message now (not connected yet,
    or too much queued); the caller then uses its fallback path. Connecting happens in the
    background through :meth:`ensure_connecting` with the address ``resolve`` returns.
    """

    def __init__(self, peer_name: str, secret: bytes, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(peer_name, secret, tls)
        self._queue: collections.deque[bytes] = collections.deque()
        self._queued_bytes = 0
        self._wake = asyncio.Event()
        self.messages_out = 0
        self.dropped = 0

    def send(self, message: Any) -> bool:
        if self._writer is None:
            return False
        frame = encode_frame(message)
        if self._queued_bytes + len(frame) > LINK_QUEUE_BYTES_MAX:
            self.dropped += 1
            return True  # taken and dropped: the state machine resends what mattered
        self._queue.append(frame)
        self._queued_bytes += len(frame)
        self.messages_out += 1
        self._wake.set()
        return True

    def _down(self) -> None:
        self.dropped += len(self._queue)
        self._queue.clear()
        self._queued_bytes = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        closed = asyncio.ensure_future(reader.read(1))  # the server never writes after the nonce
        try:
            while True:
                while not self._queue:
                    self._wake.clear()
                    wake = asyncio.ensure_future(self._wake.wait())
                    done, _ = await asyncio.wait({wake, closed}, return_when="FIRST_COMPLETED")
                    if closed in done:
                        wake.cancel()
                        raise ConnectionError("peer closed the channel")
                frames = list(self._queue)
                self._queue.clear()
                self._queued_bytes = 0
                writer.writelines(frames)
                await writer.drain()
        finally:
            closed.cancel()


class CallFailed(Exception):
    """A channel call without an outcome: the link broke (``lost``), or the remote method
    raised (the message names the exception)."""

    def __init__(self, message: str, *, lost: bool) -> None:
        super().__init__(message)
        self.lost = lost


class CallLink(_Link):
    """Request/response calls to one replica over its channel (the gateway's data path).

    :meth:`call` returns None when the link is not connected (the caller uses a Ray call and
    :meth:`ensure_connecting`), else a future of the reply's raw msgpack result. A broken link
    fails every pending call with :class:`CallFailed`; its outcome is unknown to the caller, as
    with a Ray call to an actor that died.
    """

    def __init__(self, peer_name: str, secret: bytes, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(peer_name, secret, tls)
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._next_id = 1
        self.calls_out = 0

    def call(self, method: str, args: tuple[Any, ...]) -> asyncio.Future[bytes] | None:
        writer = self._writer
        if writer is None or writer.is_closing():
            return None
        call_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        raw = msgspec.Raw(_ENCODER.encode(args))
        writer.write(encode_frame(CallRequest(call_id, method, raw)))
        self.calls_out += 1
        return future

    def forget(self, future: asyncio.Future[bytes]) -> None:
        """Drop a call the caller stopped waiting for (its reply, if any, is ignored)."""
        for call_id, pending in list(self._pending.items()):
            if pending is future:
                del self._pending[call_id]
                return

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader()
        while True:
            data = await reader.read(1 << 20)
            if not data:
                raise ConnectionError("peer closed the channel")
            for reply in frames.feed(data):
                if not isinstance(reply, CallReply):
                    raise FrameError(f"{type(reply).__name__} on a call link")
                future = self._pending.pop(reply.call_id, None)
                if future is None or future.done():
                    continue
                if reply.error:
                    future.set_exception(CallFailed(reply.error, lost=False))
                else:
                    future.set_result(bytes(reply.result))

    def _down(self) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(CallFailed(f"channel to {self.peer_name} lost", lost=True))
