"""The receiving end of a replica's channel: :class:`ChannelServer` accepts authenticated
connections on TCP (mutual TLS when the cluster has certificates) and on a same-host Unix
socket, hands each one-way message to the replica, and answers calls.

A server with too many replies queued on a connection stops reading calls from it until its
peer takes them. Bad frames or a failed handshake close that connection only.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from raylog.actors.transport.auth import (
    HANDSHAKE_TIMEOUT_S,
    ChannelAddress,
    boot_id,
    local_sockets_enabled,
    same_user,
    server_handshake,
    widen_send_buffer,
)
from raylog.actors.transport.connection import FRAME_STALL_S, Connection, Outbox
from raylog.actors.transport.frames import (
    CallReply,
    CallRequest,
    FrameError,
    encode_frame,
    reply_result,
)

log = logging.getLogger(__name__)


class ChannelServer:
    """Accepts authenticated links addressed to replica ``name``; hands each message to
    ``deliver``. Bad frames or a failed handshake close that connection only."""

    def __init__(
        self,
        name: str,
        secret: bytes,
        deliver: Callable[[Any], None],
        call: Callable[[str, msgspec.Raw], Awaitable[Any]] | None = None,
        frame_stall_s: float = FRAME_STALL_S,
    ) -> None:
        self.name = name
        self._frame_stall_s = frame_stall_s
        self._secret = secret
        self._deliver = deliver
        self._call = call
        self._calls: set[asyncio.Task[None]] = set()
        self.calls_in = 0
        self._server: asyncio.Server | None = None
        self._conns: set[Connection] = set()
        self._serving: set[asyncio.Task[None]] = set()
        self.messages_in = 0
        self.rejected = 0
        self.tls = False
        self._local_server: asyncio.Server | None = None
        self.local_links = 0  # connections accepted on the same-host socket
        self.tcp_links = 0

    async def start(self, host: str, tls: ssl.SSLContext | None = None) -> ChannelAddress:
        """Listen on ``host`` (a free port); with ``tls``, mutual TLS before the handshake.
        Also on a same-host Unix socket when :func:`local_sockets_enabled` (see
        ``raylog.actors.transport.auth``); a failure there leaves TCP alone in service."""
        self.tls = tls is not None
        timeout = HANDSHAKE_TIMEOUT_S if tls is not None else None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self._accepted, self._frame_stall_s),
            host,
            0,
            ssl=tls,
            ssl_handshake_timeout=timeout,
        )
        port = self._server.sockets[0].getsockname()[1]
        local = ""
        if local_sockets_enabled():
            name = f"raylog-channel-{uuid.uuid4().hex}"
            try:
                self._local_server = await loop.create_unix_server(
                    lambda: Connection(self._accepted_local, self._frame_stall_s), "\0" + name
                )
                local = f"{boot_id()}/{name}"
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

    def _accepted_local(self, conn: Connection) -> None:
        if not same_user(conn):
            log.warning("channel %s: a process of another user connected locally", self.name)
            self.rejected += 1
            conn.close()
            return
        self.local_links += 1
        widen_send_buffer(conn)
        self._start_serving(conn)

    def _accepted(self, conn: Connection) -> None:
        self.tcp_links += 1
        self._start_serving(conn)

    def _start_serving(self, conn: Connection) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(conn))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _serve(self, conn: Connection) -> None:
        self._conns.add(conn)
        try:
            if not await server_handshake(conn, self.name, self._secret):
                self.rejected += 1
                return
            conn.start_frames()
            outbox = Outbox()
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

    def _start_call(self, request: CallRequest, outbox: Outbox) -> None:
        # Started in arrival order: each call runs synchronously up to its first await, so
        # calls on one connection reach the replica in the order they were sent.
        self.calls_in += 1
        task = asyncio.get_running_loop().create_task(self._answer(request, outbox))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _answer(self, request: CallRequest, outbox: Outbox) -> None:
        if self._call is None:
            reply = CallReply(request.call_id, "this channel takes no calls")
        else:
            try:
                result = await self._call(request.method, request.args)
                reply = CallReply(request.call_id, "", reply_result(result))
            except Exception as exc:  # the caller gets the error; the channel stays up
                reply = CallReply(request.call_id, f"{type(exc).__name__}: {exc}")
        outbox.put(encode_frame(reply))
