"""The sending end of a channel: one outbound connection to a peer replica, made in the
background and remade after a backoff once it breaks.

- :class:`PeerLink`: one-way replication messages to a peer replica. A message to a peer
  without a connection yet goes by the caller's fallback (a Ray call) while the connection is
  made; a message finding the queue full is dropped (the state machine resends what matters
  after timeouts), and a broken connection drops what was queued on it.
- :class:`CallLink`: request/response calls to a replica (the gateway's data path); a call
  waits for room (``full``/``wait_room``) instead of being dropped.

TCP keeps each link's messages in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

import msgspec

from raylog.actors.transport.auth import client_handshake, connect_local
from raylog.actors.transport.connection import LINK_QUEUE_BYTES_MAX, Connection, Outbox, first_of
from raylog.actors.transport.frames import CallReply, CallRequestOut, FrameError, encode_frame

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
RECONNECT_BACKOFF_S = 0.2


async def _connect(
    resolve: Callable[[], Any], peer_name: str, secret: bytes, tls: ssl.SSLContext | None
) -> Connection:
    """Open and authenticate a connection to replica ``peer_name`` at ``await resolve()``
    (a :data:`ChannelAddress`; a bare ``(host, port)`` also works): over its same-host Unix
    socket when it has one on this machine, else over TCP (with ``tls`` when given)."""
    host, port, *rest = await resolve()
    local = rest[0] if rest else ""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        conn = await connect_local(local) if local else None
        if conn is None:
            _, conn = await loop.create_connection(Connection, host, port, ssl=tls)
        try:
            await client_handshake(conn, peer_name, secret)
            conn.start_frames()
        except BaseException:
            conn.close()
            raise
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
        self._writer: Connection | None = None
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

    async def _serve(self, conn: Connection) -> None:
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
        self._outbox = Outbox()
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

    async def _serve(self, conn: Connection) -> None:
        async def closed() -> None:  # the server never writes after the nonce
            await conn.read_frame()
            raise ConnectionError("peer closed the channel")

        await first_of(self._outbox.pump(conn), closed())


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
        self._outbox = Outbox(queue_bytes_max)
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
        self._outbox.put(encode_frame(CallRequestOut(call_id, method, args)))
        self.calls_out += 1
        return future

    def forget(self, future: asyncio.Future[msgspec.Raw]) -> None:
        """Drop a call the caller stopped waiting for (its reply, if any, is ignored)."""
        for call_id, pending in list(self._pending.items()):
            if pending is future:
                del self._pending[call_id]
                return

    async def _serve(self, conn: Connection) -> None:
        await first_of(self._outbox.pump(conn), self._read_replies(conn))

    async def _read_replies(self, conn: Connection) -> None:
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
