"""Replication channels: replica-to-replica messages over direct sockets instead of Ray calls.

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

Each connection's outgoing frames wait in a bounded queue (:class:`_Outbox`) written by one task
that lets the socket drain between frames: a one-way message finding the queue full is dropped
(the state machine resends), a gateway call waits for room (``CallLink.full``/``wait_room``), and
a server with too many replies queued stops reading calls until its peer takes them. Frames are
encoded in place after their header, and a large one is received straight into a buffer of its
own (:class:`FrameParser`, under an ``asyncio.BufferedProtocol``), so a megabyte batch is copied
once on each side.

Wire format (:func:`encode_frame` / :class:`FrameParser`): ``u32 length, u8 kind,
msgpack body`` with ``length`` counting kind and body, at most ``FRAME_BYTES_MAX``. Each link is
authenticated before any message: the server sends a random nonce, the client answers with the
name of the replica it wants and HMAC-SHA256(cluster secret, nonce + name); the server closes
the connection unless both match, so a stale address reused by another replica, or a process
without the secret, never gets a message in. The secret is the cluster's Ray auth token (every
process of the cluster has it). Under that, when the ends have certificates from the cluster's
CA (``storage/pki.py``; the controller issues them), the connection is mutual TLS 1.3 and a peer
without such a certificate never completes the TLS handshake.

Same-host links (a broker's gateway and its own replicas, always; replicas of one topic on one
machine) use a Unix socket in Linux's abstract namespace instead of TCP, without TLS: a server
also listens there and says so in its address (with the kernel's boot id, so a peer on another
machine never tries it). Both ends check with ``SO_PEERCRED`` that the other runs as their own
user, and the HMAC handshake above runs as on TCP: a local peer needs the cluster's token, which
anything able to call the replica actors through Ray has anyway. TLS guards traffic on a
network; a Unix socket never leaves the kernel, and skipping TLS and the TCP stack there makes
the local hop several times cheaper (1 MiB sends on this kind of machine, CPU seconds per GiB
for both ends: TLS 1.3 on loopback 2.2, plain TCP 0.7, Unix socket 0.35).
``RAYLOG_CHANNEL_LOCAL_SOCKETS=0`` in the cluster's environment turns them off (every link then
TCP, with TLS when configured).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import hmac
import logging
import os
import socket
import ssl
import struct
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from raylog.actors.replication.messages import (
    FetchRequest,
    FetchResponse,
    ReplicateAck,
    ReplicateRequest,
)

Buffer = bytes | bytearray | memoryview


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


class _CallRequestOut(msgspec.Struct, frozen=True):
    """How a caller encodes a :class:`CallRequest`: the same bytes on the wire, with the
    arguments encoded straight into the frame instead of first into a Raw of their own."""

    call_id: int
    method: str
    args: tuple[Any, ...]


__all__ = [
    "CHANNEL_KINDS",
    "FRAME_BYTES_MAX",
    "CallFailed",
    "CallLink",
    "CallReply",
    "CallRequest",
    "ChannelServer",
    "FrameError",
    "FrameParser",
    "PeerLink",
    "WritableProtocol",
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
_KIND_OF[_CallRequestOut] = _KIND_OF[CallRequest]
_DECODERS = tuple(msgspec.msgpack.Decoder(t) for t in CHANNEL_KINDS)
_ENCODER = msgspec.msgpack.Encoder()

_HEADER = struct.Struct(">IB")  # length (kind + body), kind
FRAME_BYTES_MAX = 128 << 20  # above any fetch/push (replica.fetch.max.bytes is at most 64 MiB)
LINK_QUEUE_BYTES_MAX = 64 << 20  # queued on one connection: messages dropped, calls wait
WRITE_BUFFER_HIGH = 256 << 10  # a transport holding more is drained before the next frame
READ_QUEUE_BYTES_MAX = 8 << 20  # decoded frames waiting on a connection before it stops reading
SCRATCH_BYTES = 256 << 10  # receive buffer of small frames; larger ones get their own
HANDSHAKE_READ_BYTES = 4096
NONCE_BYTES = 16
HANDSHAKE_NAME_BYTES_MAX = 512
HANDSHAKE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0
RECONNECT_BACKOFF_S = 0.2
_MAC_CONTEXT = b"raylog-replication-channel-v1"
LOCAL_SOCKETS_ENV = "RAYLOG_CHANNEL_LOCAL_SOCKETS"  # "0": same-host links over TCP too
LOCAL_SEND_BUFFER_BYTES = 4 << 20
_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

# Where a channel server listens: (host, port, local), ``local`` naming its same-host Unix
# socket as "<boot id>/<abstract name>", or "" when it has none.
ChannelAddress = tuple[str, int, str]


class FrameError(Exception):
    """The peer sent bytes that are not a channel frame; the connection is closed."""


def is_channel_message(message: object) -> bool:
    """A one-way replication message the channel carries (not a call frame)."""
    kind = type(message)
    return kind in _KIND_OF and kind not in (CallRequest, CallReply, _CallRequestOut)


def encode_frame(message: Any) -> bytearray:
    """One frame for ``message`` (one of :data:`CHANNEL_KINDS`). The body is encoded in place
    after the header: a megabyte batch is not copied again to put five bytes in front of it."""
    frame = bytearray(_HEADER.size)
    _ENCODER.encode_into(message, frame, _HEADER.size)
    length = len(frame) - _HEADER.size + 1
    if length > FRAME_BYTES_MAX:
        raise FrameError(f"message of {length - 1} bytes exceeds the frame limit")
    _HEADER.pack_into(frame, 0, length, _KIND_OF[type(message)])
    return frame


def _decode(kind: int, body: Buffer) -> Any:
    try:
        return _DECODERS[kind].decode(body)
    except msgspec.DecodeError as exc:
        raise FrameError(f"bad {CHANNEL_KINDS[kind].__name__} body: {exc}") from exc


class FrameParser:
    """Sans-IO frame parser that owns its receive buffers (the ``get_buffer`` /
    ``buffer_updated`` shape of :class:`asyncio.BufferedProtocol`).

    Small frames arrive in a scratch buffer, several per read, and are decoded from it. A frame
    too large for that gets a buffer of its own, which the socket fills in place: a megabyte
    batch crosses from the kernel into the bytes it is decoded from with one copy, where an
    ``asyncio.StreamReader`` made four (chunks, its growing buffer, ``readexactly``, decode) and
    cost about 1 ms of CPU per MiB here against 0.1-0.3 ms. Decoded messages wait in
    :attr:`messages`; :attr:`queued_bytes` counts their frames (the owner stops reading above
    its bound). Raises FrameError for bytes that are not a frame.
    """

    def __init__(
        self, max_bytes: int = FRAME_BYTES_MAX, scratch_bytes: int = SCRATCH_BYTES
    ) -> None:
        self._max = max_bytes
        self._scratch = bytearray(scratch_bytes)
        self._start = 0  # first byte of the scratch not parsed yet
        self._end = 0  # end of the bytes received into the scratch
        self._body: bytearray | None = None  # a large frame's body, received in place
        self._body_pos = 0
        self._body_kind = 0
        self.messages: collections.deque[tuple[Any, int]] = collections.deque()
        self.queued_bytes = 0

    @property
    def inside_frame(self) -> bool:
        """Part of a frame has arrived (an end of stream now is a truncated frame)."""
        return self._body is not None or self._end > self._start

    def get_buffer(self) -> memoryview:
        """Where the next bytes received go (never empty)."""
        if self._body is not None:
            return memoryview(self._body)[self._body_pos :]
        if self._end == len(self._scratch):  # a partial small frame sits at the end: move it
            pending = self._end - self._start
            self._scratch[:pending] = self._scratch[self._start : self._end]
            self._start, self._end = 0, pending
        return memoryview(self._scratch)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` arrived in the last :meth:`get_buffer`; decode every complete frame."""
        if self._body is not None:
            self._body_pos += nbytes
            if self._body_pos == len(self._body):
                body, self._body = self._body, None
                self._push(_decode(self._body_kind, body), len(body) + _HEADER.size)
            return
        self._end += nbytes
        self._parse_scratch()

    def feed(self, data: Buffer) -> None:
        """Take ``data`` as if received (bytes already read from elsewhere; tests)."""
        view = memoryview(data).cast("B")
        while view:
            target = self.get_buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            view = view[n:]
            self.buffer_updated(n)

    def take(self) -> Any:
        message, size = self.messages.popleft()
        self.queued_bytes -= size
        return message

    def _push(self, message: Any, size: int) -> None:
        self.messages.append((message, size))
        self.queued_bytes += size

    def _parse_scratch(self) -> None:
        scratch = self._scratch
        view = memoryview(scratch)
        while self._end - self._start >= _HEADER.size:
            length, kind = _HEADER.unpack_from(scratch, self._start)
            if not 1 <= length <= self._max:
                raise FrameError(f"frame length {length} outside 1..{self._max}")
            if kind >= len(_DECODERS):
                raise FrameError(f"unknown message kind {kind}")
            body_start = self._start + _HEADER.size
            body_end = body_start + length - 1
            if body_end <= self._end:
                # Decoded from a copy: a Raw field would otherwise point into the scratch.
                self._push(_decode(kind, bytes(view[body_start:body_end])), length + 4)
                self._start = body_end
                continue
            if length - 1 > len(scratch) // 2:
                # Large: the rest of the body goes straight into a buffer of its own.
                have = self._end - body_start
                self._body = bytearray(length - 1)
                self._body[:have] = view[body_start : self._end]
                self._body_pos, self._body_kind = have, kind
                self._start = self._end = 0
                return
            break  # a small frame not complete yet
        if self._start == self._end:
            self._start = self._end = 0


class WritableProtocol(asyncio.BufferedProtocol):
    """What a buffered protocol needs to write as a StreamWriter does: :meth:`write` to the
    transport and :meth:`drain` while the transport's buffer is over its high mark (the
    transport calls pause_writing/resume_writing); and its own read flow control
    (:meth:`pause_reading` / :meth:`resume_reading`, each done once). Subclasses call this
    class's ``connection_made`` and ``connection_lost`` from theirs."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._lost = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._reading_paused = False

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and not self.is_closing():
            self._reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._wake_drain()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain()

    @property
    def write_paused(self) -> bool:
        """The transport holds more than its high mark: :meth:`drain` would wait."""
        return self._write_paused

    def write(self, data: Buffer) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        """Until the transport takes more (raises ConnectionError once the connection is gone)."""
        while True:
            if self._lost or self.is_closing():
                raise ConnectionError("the connection closed")
            if not self._write_paused:
                return
            self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _wake_drain(self) -> None:
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Connection(WritableProtocol):
    """One channel connection: the socket fills the frame parser's buffers in place
    (:class:`FrameParser`); reads wait in :meth:`readexactly` (the handshake, before frames)
    and :meth:`read_frame`; writes go to the transport, :meth:`drain` waiting while it is
    paused. Reading stops while more than ``READ_QUEUE_BYTES_MAX`` of decoded frames wait.
    """

    def __init__(self, on_connect: Callable[[_Connection], None] | None = None) -> None:
        super().__init__()
        self._on_connect = on_connect
        self._parser: FrameParser | None = None  # set by start_frames(), after the handshake
        self._raw = bytearray()  # bytes before start_frames()
        self._raw_buffer = bytearray(HANDSHAKE_READ_BYTES)
        self._eof = False
        self._error: BaseException | None = None
        self._read_waiter: asyncio.Future[None] | None = None
        self.local = False  # a same-host Unix socket to a peer of this user (_connect_local)

    # -- asyncio.BufferedProtocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._on_connect is not None:
            self._on_connect(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._parser is not None:
            return self._parser.get_buffer()
        return memoryview(self._raw_buffer)

    def buffer_updated(self, nbytes: int) -> None:
        if self._parser is None:
            self._raw += self._raw_buffer[:nbytes]
            if len(self._raw) > READ_QUEUE_BYTES_MAX:
                self.pause_reading()  # until start_frames(), if the handshake passes
        else:
            try:
                self._parser.buffer_updated(nbytes)
            except FrameError as exc:
                self._fail(exc)
                return
            if self._parser.queued_bytes > READ_QUEUE_BYTES_MAX:
                self.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake_reader()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._error is None:
            self._error = exc or ConnectionError("the channel connection closed")
        self._eof = True
        self._wake_reader()

    # -- reading --------------------------------------------------------------------------------

    async def readexactly(self, n: int) -> bytes:
        """The next ``n`` bytes before frames start (the handshake)."""
        while len(self._raw) < n:
            if self._eof:
                raise ConnectionError("the stream ended inside the handshake")
            await self._wait_readable()
        data = bytes(self._raw[:n])
        del self._raw[:n]
        return data

    def start_frames(self) -> None:
        """From now on the bytes are frames (what already arrived after the handshake too)."""
        self._parser = FrameParser()
        raw, self._raw = self._raw, bytearray()
        try:
            self._parser.feed(raw)
        except FrameError as exc:
            self._fail(exc)  # read_frame() raises it
        if self._parser.queued_bytes <= READ_QUEUE_BYTES_MAX // 2:
            self.resume_reading()

    async def read_frame(self) -> Any:
        """The next message, or None when the stream ends between two frames. Raises
        FrameError for bytes that are not a frame, ConnectionError for a broken link."""
        parser = self._parser
        assert parser is not None, "start_frames() first"
        while not parser.messages:
            if isinstance(self._error, FrameError):
                raise self._error
            if self._eof:
                if parser.inside_frame:
                    raise FrameError("the stream ended inside a frame")
                if self._error is not None and not isinstance(self._error, ConnectionError):
                    raise ConnectionError(f"the channel connection failed: {self._error!r}")
                return None
            await self._wait_readable()
        message = parser.take()
        if parser.queued_bytes <= READ_QUEUE_BYTES_MAX // 2:
            self.resume_reading()
        return message

    async def _wait_readable(self) -> None:
        self._read_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._read_waiter
        finally:
            self._read_waiter = None

    def _wake_reader(self) -> None:
        waiter = self._read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        self._eof = True
        if self.transport is not None:
            self.transport.abort()


class _Outbox:
    """The frames waiting for one connection, written in order by one task (:meth:`pump`).

    The pump hands the transport one frame at a time and waits for it to drain before the
    next, so frames are never joined nor piled up in the transport's buffer: on Python 3.11
    that buffer is a bytearray copied whole as it grows, which made a gateway pipelining
    megabyte produce calls spend most of its CPU in ``transport.write``. ``queued_bytes`` is
    bounded by the owner: :meth:`has_room` before :meth:`put`, or :meth:`wait_room`.

    A frame put while nothing waits (no queued frame, the transport's buffer empty) goes to
    the socket at once, inside :meth:`put`: the caller's next step (a leader's local write,
    after its push) then overlaps the transfer instead of delaying it, and order is kept
    because anything later queues behind it.
    """

    def __init__(self, max_bytes: int = LINK_QUEUE_BYTES_MAX) -> None:
        self._frames: collections.deque[bytes | bytearray] = collections.deque()
        self.queued_bytes = 0
        self._max = max_bytes
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._writer: _Connection | None = None

    def has_room(self, nbytes: int = 0) -> bool:
        return self.queued_bytes + nbytes <= self._max

    def put(self, frame: bytes | bytearray) -> None:
        writer = self._writer
        if (
            writer is not None
            and not self._frames
            and writer.transport is not None
            and not writer.transport.is_closing()
            and writer.transport.get_write_buffer_size() == 0
        ):
            writer.write(memoryview(frame))  # a partial send keeps a view, not a copy
            return
        self._frames.append(frame)
        self.queued_bytes += len(frame)
        self._wake.set()
        if not self.has_room():
            self._room.clear()

    async def wait_room(self) -> None:
        """Until the queue is back under its bound (or dropped by :meth:`clear`)."""
        await self._room.wait()

    def clear(self) -> int:
        """Drop every queued frame (the connection broke); returns how many."""
        dropped = len(self._frames)
        self._frames.clear()
        self.queued_bytes = 0
        self._room.set()
        return dropped

    async def pump(self, writer: _Connection) -> None:
        """Write queued frames until cancelled or the connection fails (then it closes it)."""
        assert writer.transport is not None
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self._writer = writer
        try:
            while True:
                while not self._frames:
                    self._wake.clear()
                    await self._wake.wait()
                frame = self._frames.popleft()
                self.queued_bytes -= len(frame)
                if self.has_room():
                    self._room.set()
                writer.write(memoryview(frame))  # a partial send keeps a view, not a copy
                await writer.drain()
        except (ConnectionError, OSError, RuntimeError, ssl.SSLError):
            writer.close()  # the reader side sees the end and tears the connection down
            self.clear()
            raise
        finally:
            self._writer = None


async def _first_of(*coroutines: Awaitable[None]) -> None:
    """Run ``coroutines`` until the first one ends; cancel the rest; re-raise its error."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@functools.cache
def _boot_id() -> str:
    """This kernel's boot id: which machine (and boot) a same-host socket belongs to."""
    if not sys.platform.startswith("linux"):
        return ""
    try:
        return _BOOT_ID_PATH.read_text().strip()
    except OSError:
        return ""


def local_sockets_enabled() -> bool:
    """Same-host links over Unix sockets: on Linux, unless the environment turns them off."""
    return os.environ.get(LOCAL_SOCKETS_ENV, "1") != "0" and bool(_boot_id())


def _widen_send_buffer(conn: WritableProtocol) -> None:
    """Let one send move a large frame: a Unix socket's default send buffer (about 200 KiB)
    cut each megabyte frame into several event-loop rounds; TCP on loopback grows its own."""
    sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):  # capped by net.core.wmem_max; best effort
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, LOCAL_SEND_BUFFER_BYTES)


def _same_user(conn: WritableProtocol) -> bool:
    """Whether the process at the other end of a Unix socket runs as this process's user (the
    kernel's word, ``SO_PEERCRED``)."""
    sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
    if sock is None:
        return False
    try:
        _, uid, _ = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
    except OSError:
        return False
    return uid == os.getuid()


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
        call: Callable[[str, msgspec.Raw], Awaitable[Any]] | None = None,
    ) -> None:
        self.name = name
        self._secret = secret
        self._deliver = deliver
        self._call = call
        self._calls: set[asyncio.Task[None]] = set()
        self.calls_in = 0
        self._server: asyncio.Server | None = None
        self._conns: set[_Connection] = set()
        self._serving: set[asyncio.Task[None]] = set()
        self.messages_in = 0
        self.rejected = 0
        self.tls = False
        self._local_server: asyncio.Server | None = None
        self.local_links = 0  # connections accepted on the same-host socket
        self.tcp_links = 0

    async def start(self, host: str, tls: ssl.SSLContext | None = None) -> ChannelAddress:
        """Listen on ``host`` (a free port); with ``tls``, mutual TLS before the handshake.
        Also on a same-host Unix socket when :func:`local_sockets_enabled` (see the module
        docstring); a failure there leaves TCP alone in service."""
        self.tls = tls is not None
        timeout = HANDSHAKE_TIMEOUT_S if tls is not None else None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self._accepted), host, 0, ssl=tls, ssl_handshake_timeout=timeout
        )
        port = self._server.sockets[0].getsockname()[1]
        local = ""
        if local_sockets_enabled():
            name = f"raylog-channel-{uuid.uuid4().hex}"
            try:
                self._local_server = await loop.create_unix_server(
                    lambda: _Connection(self._accepted_local), "\0" + name
                )
                local = f"{_boot_id()}/{name}"
            except OSError as exc:
                log.warning("channel %s: no same-host socket (%s); TCP only", self.name, exc)
        return host, port, local

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._local_server is not None:
            self._local_server.close()
        for conn in list(self._conns):
            conn.close()

    def _accepted_local(self, conn: _Connection) -> None:
        if not _same_user(conn):
            log.warning("channel %s: a process of another user connected locally", self.name)
            self.rejected += 1
            conn.close()
            return
        self.local_links += 1
        _widen_send_buffer(conn)
        self._start_serving(conn)

    def _accepted(self, conn: _Connection) -> None:
        self.tcp_links += 1
        self._start_serving(conn)

    def _start_serving(self, conn: _Connection) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(conn))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _serve(self, conn: _Connection) -> None:
        self._conns.add(conn)
        try:
            if not await self._handshake(conn):
                self.rejected += 1
                return
            conn.start_frames()
            outbox = _Outbox()
            pump = asyncio.ensure_future(outbox.pump(conn))
            try:
                while True:
                    # Replies piled up: read no more calls until the peer takes them.
                    await outbox.wait_room()
                    message = await conn.read_frame()
                    if message is None:
                        return
                    if isinstance(message, CallRequest):
                        self._start_call(message, outbox)
                    elif isinstance(message, CallReply):
                        raise FrameError("a call reply sent to a server")
                    else:
                        self.messages_in += 1
                        self._deliver(message)
            finally:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
        except (FrameError, ConnectionError, TimeoutError, ssl.SSLError) as exc:
            log.warning("replication channel to %s: closing a connection: %s", self.name, exc)
        finally:
            self._conns.discard(conn)
            conn.close()

    def _start_call(self, request: CallRequest, outbox: _Outbox) -> None:
        # Started in arrival order: each call runs synchronously up to its first await, so
        # calls on one connection reach the replica in the order they were sent.
        self.calls_in += 1
        task = asyncio.get_running_loop().create_task(self._answer(request, outbox))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _answer(self, request: CallRequest, outbox: _Outbox) -> None:
        if self._call is None:
            reply = CallReply(request.call_id, "this channel takes no calls")
        else:
            try:
                result = await self._call(request.method, request.args)
                reply = CallReply(request.call_id, "", msgspec.Raw(_ENCODER.encode(result)))
            except Exception as exc:  # the caller gets the error; the channel stays up
                reply = CallReply(request.call_id, f"{type(exc).__name__}: {exc}")
        outbox.put(encode_frame(reply))

    async def _handshake(self, conn: _Connection) -> bool:
        nonce = os.urandom(NONCE_BYTES)
        conn.write(nonce)
        await conn.drain()
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            (name_len,) = struct.unpack(">H", await conn.readexactly(2))
            if name_len > HANDSHAKE_NAME_BYTES_MAX:
                return False
            name = await conn.readexactly(name_len)
            mac = await conn.readexactly(hashlib.sha256().digest_size)
        if name != self.name.encode():
            log.warning("replication channel: a peer asked %s for %r", self.name, name[:80])
            return False
        if not hmac.compare_digest(mac, _mac(self._secret, nonce, name)):
            log.warning("replication channel to %s: a peer failed authentication", self.name)
            return False
        return True


async def _connect(
    resolve: Callable[[], Any], peer_name: str, secret: bytes, tls: ssl.SSLContext | None
) -> _Connection:
    """Open and authenticate a connection to replica ``peer_name`` at ``await resolve()``
    (a :data:`ChannelAddress`; a bare ``(host, port)`` also works): over its same-host Unix
    socket when it has one on this machine, else over TCP (with ``tls`` when given)."""
    host, port, *rest = await resolve()
    local = rest[0] if rest else ""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        conn = await _connect_local(local) if local else None
        if conn is None:
            _, conn = await loop.create_connection(_Connection, host, port, ssl=tls)
        try:
            nonce = await conn.readexactly(NONCE_BYTES)
            name = peer_name.encode()
            conn.write(struct.pack(">H", len(name)) + name + _mac(secret, nonce, name))
            await conn.drain()
            conn.start_frames()
        except BaseException:
            conn.close()
            raise
    return conn


async def _connect_local(local: str) -> _Connection | None:
    """A connection to the same-host socket ``local`` ("<boot id>/<name>"), or None when it is
    on another machine, turned off, gone, or served by another user (then TCP is used)."""
    boot_id, _, name = local.partition("/")
    if not name or boot_id != _boot_id() or not local_sockets_enabled():
        return None
    try:
        _, conn = await asyncio.get_running_loop().create_unix_connection(_Connection, "\0" + name)
    except OSError as exc:
        log.debug("same-host channel socket %s: %r; using TCP", name, exc)
        return None
    if not _same_user(conn):
        log.warning("same-host channel socket %s is served by another user; using TCP", name)
        conn.close()
        return None
    _widen_send_buffer(conn)
    conn.local = True
    return conn


class _Link:
    """What both outbound links share: one connection to replica ``peer_name``, made in the
    background by :meth:`ensure_connecting`, remade after a backoff once it breaks.
    Subclasses serve the open connection (:meth:`_serve`) and clean up after it (:meth:`_down`).
    """

    def __init__(self, peer_name: str, secret: bytes, tls: ssl.SSLContext | None = None) -> None:
        self.peer_name = peer_name
        self._secret = secret
        self._tls = tls
        self._writer: _Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._not_before = 0.0

    @property
    def connected(self) -> bool:
        return self._writer is not None

    @property
    def local(self) -> bool:
        """Connected over a same-host Unix socket to a peer running as this user."""
        return self._writer is not None and self._writer.local

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

    async def aclose(self) -> None:
        """:meth:`close`, then wait until the connection is torn down."""
        task = self._task
        self.close()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def _serve(self, conn: _Connection) -> None:
        raise NotImplementedError

    def _down(self) -> None:
        raise NotImplementedError

    async def _run(self, resolve: Callable[[], Any]) -> None:
        loop = asyncio.get_running_loop()  # (not callable in `finally` while a loop closes)
        conn = None
        try:
            conn = await _connect(resolve, self.peer_name, self._secret, self._tls)
            self._writer = conn
            await self._serve(conn)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # refused, reset, timed out, peer gone: retry after a backoff
            log.debug("channel to %s down: %r", self.peer_name, exc)
        finally:
            self._writer = None
            self._down()
            self._not_before = loop.time() + RECONNECT_BACKOFF_S
            self._task = None
            if conn is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closing
                    conn.close()


class PeerLink(_Link):
    """The outbound link to one peer replica: connect, authenticate, write queued frames.

    :meth:`send` returns False when the link cannot take the message now (not connected yet,
    or too much queued); the caller then uses its fallback path. Connecting happens in the
    background through :meth:`ensure_connecting` with the address ``resolve`` returns.
    """

    def __init__(self, peer_name: str, secret: bytes, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(peer_name, secret, tls)
        self._outbox = _Outbox()
        self.messages_out = 0
        self.dropped = 0

    def send(self, message: Any, frame: bytes | bytearray | None = None) -> bool:
        """Queue ``message`` (``frame``: its :func:`encode_frame`, when the caller has it)."""
        if self._writer is None:
            return False
        if frame is None:
            frame = encode_frame(message)
        if not self._outbox.has_room(len(frame)):
            self.dropped += 1
            return True  # taken and dropped: the state machine resends what mattered
        self._outbox.put(frame)
        self.messages_out += 1
        return True

    def _down(self) -> None:
        self.dropped += self._outbox.clear()

    async def _serve(self, conn: _Connection) -> None:
        async def closed() -> None:  # the server never writes after the nonce
            await conn.read_frame()
            raise ConnectionError("peer closed the channel")

        await _first_of(self._outbox.pump(conn), closed())


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

    def __init__(
        self,
        peer_name: str,
        secret: bytes,
        tls: ssl.SSLContext | None = None,
        queue_bytes_max: int = LINK_QUEUE_BYTES_MAX,
    ) -> None:
        super().__init__(peer_name, secret, tls)
        self._pending: dict[int, asyncio.Future[msgspec.Raw]] = {}
        # What a call handed to the peer by reference (a shared-memory block): released when
        # its reply arrives, even if nobody waits for it any more; lost with the link.
        self._holds: dict[int, Any] = {}
        self._outbox = _Outbox(queue_bytes_max)
        self._next_id = 1
        self.calls_out = 0

    @property
    def full(self) -> bool:
        """Too much is queued on the link: :meth:`wait_room` before the next call."""
        return not self._outbox.has_room()

    async def wait_room(self) -> None:
        await self._outbox.wait_room()

    def call(
        self, method: str, args: tuple[Any, ...], hold: Any = None
    ) -> asyncio.Future[msgspec.Raw] | None:
        """``hold``, if given, is what the peer reads by reference while it runs the call
        (``acquire()``; ``release()`` once the reply arrives; ``lose()`` if the link breaks
        first, as the peer may still read it)."""
        writer = self._writer
        if writer is None or writer.is_closing():
            return None
        call_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[msgspec.Raw] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        if hold is not None:
            hold.acquire()
            self._holds[call_id] = hold
        self._outbox.put(encode_frame(_CallRequestOut(call_id, method, args)))
        self.calls_out += 1
        return future

    def forget(self, future: asyncio.Future[msgspec.Raw]) -> None:
        """Drop a call the caller stopped waiting for (its reply, if any, is ignored)."""
        for call_id, pending in list(self._pending.items()):
            if pending is future:
                del self._pending[call_id]
                return

    async def _serve(self, conn: _Connection) -> None:
        await _first_of(self._outbox.pump(conn), self._read_replies(conn))

    async def _read_replies(self, conn: _Connection) -> None:
        while True:
            reply = await conn.read_frame()
            if reply is None:
                raise ConnectionError("peer closed the channel")
            if not isinstance(reply, CallReply):
                raise FrameError(f"{type(reply).__name__} on a call link")
            hold = self._holds.pop(reply.call_id, None)
            if hold is not None:
                hold.release()  # the peer is done with it
            future = self._pending.pop(reply.call_id, None)
            if future is None or future.done():
                continue
            if reply.error:
                future.set_exception(CallFailed(reply.error, lost=False))
            else:
                future.set_result(reply.result)

    def _down(self) -> None:
        self._outbox.clear()
        holds, self._holds = self._holds, {}
        for hold in holds.values():
            hold.lose()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(CallFailed(f"channel to {self.peer_name} lost", lost=True))
