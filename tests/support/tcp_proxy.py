"""A fault-injecting TCP proxy on loopback, for tests of clients under a slow or cut network.

``TcpProxy(target_port)`` listens on 127.0.0.1 (port 0: a free one) and relays every
connection to ``127.0.0.1:target_port``, in its own thread and event loop, so that blocking
clients (confluent-kafka) and asyncio code alike can sit behind it. The test starts and stops
it; every method is called from any thread and returns once the change holds.

- ``delay(upstream_s, downstream_s)``: each chunk is forwarded that long after it arrived
  (latency per direction; chunks keep their order and are not spaced out).
- ``cut()``: every connection is reset (RST) and new ones are reset as they arrive, until
  ``restore()``.
- ``stall()``: nothing is forwarded either way (connections stay open; what arrives is held,
  within the bounded buffers, then the reading stops) until ``restore()``.
- ``reset_mid_response(count, min_bytes)``: the next ``count`` chunks of at least
  ``min_bytes`` going back to the client are forwarded short of their last byte, then the
  connection is reset: the client holds part of a response.

Bounds: ``CHUNK_BYTES`` per read, ``QUEUE_CHUNKS`` chunks held per direction and connection
(the reading waits for room), ``CONNECTIONS_MAX`` open connections (more are reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from typing import Any

HOST = "127.0.0.1"
CHUNK_BYTES = 64 << 10
QUEUE_CHUNKS = 64
CONNECTIONS_MAX = 256
CALL_TIMEOUT_S = 10.0
_LINGER_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    writer.transport.abort()


class _Relay:
    """One client connection and its connection to the target."""

    def __init__(self, proxy: TcpProxy, client: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

    def reset(self) -> None:
        for writer in (self.client, self.server):
            if writer is not None:
                _reset(writer)
        for task in self.tasks:
            task.cancel()

    async def run(self, reader: asyncio.StreamReader) -> None:
        try:
            up_reader, self.server = await asyncio.open_connection(HOST, self.proxy.target_port)
        except OSError:
            self.reset()
            return
        self.tasks = [
            asyncio.create_task(self._pump(reader, self.server, upstream=True)),
            asyncio.create_task(self._pump(up_reader, self.client, upstream=False)),
        ]
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.reset()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)
        sender = asyncio.create_task(self._send(queue, writer, upstream=upstream))
        try:
            while True:  # bounded by the connection: ends at EOF or a reset
                chunk = await reader.read(CHUNK_BYTES)
                if not chunk:
                    break
                await queue.put((time.monotonic(), chunk))  # waits for room: bounded
            await queue.join()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sender.cancel()
            # Either side closing ends the relay: the other side is reset with it.
            for task in self.tasks:
                task.cancel()

    async def _send(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        *,
        upstream: bool,
    ) -> None:
        proxy = self.proxy
        try:
            while True:  # ends when its pump is cancelled, or at a reset
                arrived, chunk = await queue.get()
                delay = proxy.upstream_s if upstream else proxy.downstream_s
                wait = arrived + delay - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await proxy.flowing.wait()
                if not upstream and proxy.take_reset(len(chunk)):
                    writer.write(chunk[:-1])
                    await writer.drain()
                    break
                writer.write(chunk)
                await writer.drain()
                queue.task_done()
        except (OSError, RuntimeError):  # RuntimeError: the transport is closed
            pass
        self.reset()


class TcpProxy:
    """See the module docstring."""

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        self.upstream_s = 0.0
        self.downstream_s = 0.0
        self.connections = 0  # accepted, over the proxy's life
        self.resets = 0  # connections reset mid-response
        self._port = port
        self._cut = False
        self._resets_left = 0
        self._reset_min_bytes = 0
        self._relays: set[_Relay] = set()
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tcp-proxy", daemon=True
        )
        self.flowing = asyncio.Event()  # set on the proxy's loop: forwarding (not stalled)

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"{HOST}:{self._port}"

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(CALL_TIMEOUT_S)

    def start(self) -> TcpProxy:
        self._thread.start()

        async def start() -> None:
            self.flowing.set()
            self._server = await asyncio.start_server(self._accept, HOST, self._port)
            self._port = self._server.sockets[0].getsockname()[1]

        self._call(start())
        return self

    def stop(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for relay in list(self._relays):
                relay.reset()
            self.flowing.set()

        self._call(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CALL_TIMEOUT_S)
        self._loop.close()

    def delay(self, upstream_s: float, downstream_s: float) -> None:
        async def set_delay() -> None:
            self.upstream_s, self.downstream_s = upstream_s, downstream_s

        self._call(set_delay())

    def cut(self) -> None:
        async def cut() -> None:
            self._cut = True
            for relay in list(self._relays):
                relay.reset()

        self._call(cut())

    def stall(self) -> None:
        async def stall() -> None:
            self.flowing.clear()

        self._call(stall())

    def restore(self) -> None:
        async def restore() -> None:
            self._cut = False
            self.flowing.set()

        self._call(restore())

    def reset_mid_response(self, count: int, min_bytes: int = 1) -> None:
        async def arm() -> None:
            self._resets_left, self._reset_min_bytes = count, min_bytes

        self._call(arm())

    def resets_left(self) -> int:
        return self._resets_left

    def take_reset(self, size: int) -> bool:
        """Whether a chunk of ``size`` bytes going to the client is cut short (on the loop)."""
        if self._resets_left <= 0 or size < max(2, self._reset_min_bytes):
            return False
        self._resets_left -= 1
        self.resets += 1
        return True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self._cut or len(self._relays) >= CONNECTIONS_MAX:
            _reset(writer)
            return
        relay = _Relay(self, writer)
        self._relays.add(relay)
        try:
            await relay.run(reader)
        finally:
            self._relays.discard(relay)
