"""One channel connection and its outgoing queue: the asyncio protocol a link or a server
reads frames from and writes frames to.

- :class:`WritableProtocol`: a buffered protocol that writes as a StreamWriter does (``write``,
  ``drain`` while the transport is over its high mark) and pauses its own reading;
- :class:`Connection`: the socket fills the frame parser's buffers in place; the handshake's
  bytes are read before frames start;
- :class:`Outbox`: the bounded queue of frames waiting for one connection, written in order by
  one task that lets the socket drain between frames.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from raylog.actors.transport.frames import Buffer, FrameError, FrameParser

LINK_QUEUE_BYTES_MAX = 64 << 20  # queued on one connection: messages dropped, calls wait
WRITE_BUFFER_HIGH = 256 << 10  # a transport holding more is drained before the next frame
READ_QUEUE_BYTES_MAX = 8 << 20  # decoded frames waiting on a connection before it stops reading
HANDSHAKE_READ_BYTES = 4096
# A peer that started a frame and sent no byte of it for this long is gone or stuck: the
# connection is closed rather than holding the frame's buffer (up to the frame limit) forever.
FRAME_STALL_S = 30.0


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


class Connection(WritableProtocol):
    """One channel connection: the socket fills the frame parser's buffers in place
    (:class:`FrameParser`); reads wait in :meth:`readexactly` (the handshake, before frames)
    and :meth:`read_frame`; writes go to the transport, :meth:`drain` waiting while it is
    paused. Reading stops while more than ``READ_QUEUE_BYTES_MAX`` of decoded frames wait.
    """

    def __init__(
        self,
        on_connect: Callable[[Connection], None] | None = None,
        frame_stall_s: float = FRAME_STALL_S,
    ) -> None:
        super().__init__()
        self._on_connect = on_connect
        self._frame_stall_s = frame_stall_s
        self._parser: FrameParser | None = None  # set by start_frames(), after the handshake
        self._raw = bytearray()  # bytes before start_frames()
        self._raw_buffer = bytearray(HANDSHAKE_READ_BYTES)
        self._eof = False
        self._error: BaseException | None = None
        self._read_waiter: asyncio.Future[None] | None = None
        self.local = False  # a same-host Unix socket to a peer of this user (auth.connect_local)

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
        FrameError for bytes that are not a frame or a frame the peer stopped sending (no
        byte of it for ``frame_stall_s``), ConnectionError for a broken link."""
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
            if not parser.inside_frame:
                await self._wait_readable()  # between frames a link may idle at will
                continue
            try:
                async with asyncio.timeout(self._frame_stall_s):
                    await self._wait_readable()
            except TimeoutError:
                raise FrameError(
                    f"no byte of a started frame for {self._frame_stall_s} s"
                ) from None
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


class Outbox:
    """The frames waiting for one connection, written in order by one task (:meth:`pump`).

    The pump hands the transport one frame at a time and waits for it to drain before the
    next, so frames are never joined nor piled up in the transport's buffer: on Python 3.11
    that buffer is a bytearray copied whole as it grows, which would have a gateway pipelining
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
        self._writer: Connection | None = None

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

    async def pump(self, writer: Connection) -> None:
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


async def first_of(*coroutines: Awaitable[None]) -> None:
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
