"""One Kafka client connection as a state machine, with no I/O (h11's shape).

This module owns a connection's framing, request admission and response ordering. Bytes go in
through :meth:`Connection.receive_data`; decoded requests come out of
:meth:`Connection.next_event`; :meth:`Connection.send` turns a handler's response into the bytes
to write. It knows nothing of sockets, tasks or clocks, so the server, the tests and a fuzzer
drive the same object.

Rules it enforces, each from Kafka's broker:

1. Framing: a 4-byte big-endian size, then that many bytes. A size above ``max_frame_bytes``
   (Kafka's ``socket.request.max.bytes``, default 104857600) or below zero is a protocol error
   raised as soon as the 4 bytes arrive, before any of the frame is buffered.
2. Admission: a request for an API the gateway does not advertise, or for a version outside the
   advertised range, closes the connection, as Kafka does: ``SocketServer``'s
   ``Processor.processCompletedReceives`` parses the header and the request inside one ``try``
   whose handler, ``processChannelException``, logs "Closing socket for ... because of error"
   and closes that channel (an unknown key fails in ``RequestHeader.parse``, an unsupported
   version in ``RequestContext.parseRequest`` with ``InvalidRequestException``; newer brokers
   also check ``isApiEnabled`` first, "throw InvalidRequestException to close the connection").
   The one exception is ApiVersions: ``RequestContext.parseRequest`` admits any version of it
   without parsing the body, and ``RequestContext.apiVersion()`` makes the response version 0,
   so the handler can answer UNSUPPORTED_VERSION with the versions it does support. Pending
   responses of a closed connection are dropped, as Kafka's ``Processor.close`` drops them.
3. Ordering: responses leave in the order their requests arrived, whatever order the handlers
   finish in. Kafka clients match responses to requests by position as much as by correlation id.
4. Bounds: at most ``max_in_flight`` requests, and at most ``max_in_flight_bytes`` of request
   frames (the first request is always admitted, so one frame of ``max_frame_bytes`` fits), are
   handed out and not yet answered; past either, :meth:`next_event` returns
   :attr:`Signal.PAUSED` and the caller should stop reading. So one connection holds at most
   ``max_in_flight_bytes + max_frame_bytes`` of requests plus what it was given to buffer.

Errors are split by whose fault they are: :class:`RemoteProtocolError` when the client sent
garbage (the caller logs one line and closes this connection only), :class:`LocalProtocolError`
when the gateway misuses the connection (a bug).
"""

from __future__ import annotations

import collections
import enum
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from raylog.gateway import codec
from raylog.gateway.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_IN_FLIGHT",
    "Connection",
    "Event",
    "RemoteProtocolError",
    "Request",
    "Signal",
]

DEFAULT_MAX_FRAME_BYTES = 104_857_600  # Kafka's socket.request.max.bytes default
# librdkafka pipelines up to max.in.flight (1,000,000 by default, but it caps itself per
# connection in practice); Java defaults to 5 per connection. 64 leaves room and bounds memory.
DEFAULT_MAX_IN_FLIGHT = 64

_SIZE = struct.Struct(">i")
_HEADER_PREFIX = struct.Struct(">hhi")


class Signal(enum.Enum):
    """What :meth:`Connection.next_event` returns when it has no request to hand out."""

    NEED_DATA = "need_data"  # read more bytes, then call receive_data
    PAUSED = "paused"  # too many requests in flight: answer some before reading on
    CLOSED = "closed"  # the peer closed its side and no whole request is left


@dataclass(frozen=True, slots=True)
class Request:
    """A request admitted on a connection.

    ``body`` is the decoded message, or None for an ApiVersions request of a version the gateway
    does not support (its body is never parsed). ``response_version`` is the version the response
    is encoded in: the request's version, except 0 for that unsupported ApiVersions case.
    """

    sequence: int
    header: codec.RequestHeader
    body: Any | None
    response_version: int
    # The shared-memory block the request was received into (``raylog.actors.transport.arena``),
    # which its server releases once it is answered; None for a request received in private memory.
    hold: Any = None

    @property
    def api_key(self) -> int:
        return self.header.api_key

    @property
    def api_version(self) -> int:
        return self.header.api_version

    @property
    def correlation_id(self) -> int:
        return self.header.correlation_id


Event = Request | Signal


# Requests at least this large are received in place (get_buffer); smaller ones, several per
# read, go through the scratch.
RECEIVE_IN_PLACE_MIN = 64 << 10
RECEIVE_IN_PLACE_AMPLIFICATION_MAX = 8  # allocated in place <= 8 x the frame's bytes received
RECEIVE_SCRATCH_BYTES = 256 << 10


class Connection:
    """The protocol state of one client connection (no I/O)."""

    def __init__(
        self,
        api_versions: Mapping[int, tuple[int, int]],
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_in_flight_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        allocate: Callable[[int], Any] | None = None,
    ) -> None:
        """``allocate(n)``, if given, returns a block of shared memory (``.view``, writable,
        ``n`` bytes; ``.release()``) for a large request to be received in, or None."""
        if max_frame_bytes < 8 or max_in_flight < 1 or max_in_flight_bytes < 1:
            raise ValueError("max_frame_bytes must be >= 8, the in-flight limits >= 1")
        for api_key, (low, high) in api_versions.items():
            if not 0 <= low <= high <= codec.max_version(api_key):
                raise ValueError(f"API {api_key} v{low}-{high} is not in the codec's specs")
        self._api_versions = dict(api_versions)
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        self._in_flight_bytes = 0
        self._frame_bytes: dict[int, int] = {}  # sequence -> size of its request frame
        self._buffer = bytearray()
        self._scratch = bytearray(RECEIVE_SCRATCH_BYTES)
        self._large: bytearray | memoryview | None = None  # a large frame received in place
        self._large_pos = 0
        self._allocate = allocate
        self._large_block: Any = None  # the shared block _large is, if it is one
        # Large frames received whole into shared blocks, before whatever _buffer holds.
        self._blocks: collections.deque[tuple[memoryview, Any]] = collections.deque()
        self._eof = False
        self._error: RemoteProtocolError | None = None
        self._next_sequence = 0  # sequence of the next request handed out
        self._next_to_write = 0  # sequence of the next response to leave
        # Requests handed out and not answered, and answers waiting for an earlier one.
        # Invariant: len(_unanswered) + len(_answered) == in_flight <= max_in_flight.
        self._unanswered: dict[int, Request] = {}
        self._answered: dict[int, bytes | bytearray | None] = {}

    @property
    def in_flight(self) -> int:
        """Requests handed out whose responses have not left yet."""
        return self._next_sequence - self._next_to_write

    @property
    def paused(self) -> bool:
        """Whether the in-flight limits hold back the next request until some are answered."""
        return self.in_flight >= self.max_in_flight or (
            self.in_flight > 0 and self._in_flight_bytes >= self.max_in_flight_bytes
        )

    @property
    def at_eof(self) -> bool:
        """The peer closed its side (``receive_data(b"")``)."""
        return self._eof

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer) + self._large_pos + sum(len(v) for v, _ in self._blocks)

    def discard(self) -> None:
        """Release the shared blocks of frames never handed out (the connection is closed)."""
        blocks, self._blocks = self._blocks, collections.deque()
        for _, block in blocks:
            block.release()
        if self._large_block is not None:
            block, self._large_block, self._large = self._large_block, None, None
            block.release()

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes read from the peer; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise LocalProtocolError("receive_data after end of stream")
        if self._large is not None:
            raise LocalProtocolError("receive_data while a frame is received in place")
        self._buffer += data

    def get_buffer(self) -> memoryview:
        """Where the socket should put the next bytes (``asyncio.BufferedProtocol``); then
        :meth:`buffer_updated`. A large request whose size is known, with nothing before it,
        is received straight into a buffer of exactly its size, which ``next_event`` hands
        over whole: one copy from the kernel, where reading into a stream and then into this
        connection's buffer made four and cost about 1 ms of CPU per MiB. Only once an eighth
        of it has arrived: a size prefix alone must not make the gateway allocate (a client
        declaring 100 MiB frames on many connections), so what is allocated stays within
        eight times what clients actually sent."""
        if self._eof:
            raise LocalProtocolError("get_buffer after end of stream")
        if self._large is None and len(self._buffer) >= 4:
            (size,) = _SIZE.unpack_from(self._buffer, 0)
            have = len(self._buffer)
            if (
                RECEIVE_IN_PLACE_MIN <= size <= self.max_frame_bytes
                and have < 4 + size
                and have * RECEIVE_IN_PLACE_AMPLIFICATION_MAX >= 4 + size
            ):
                block = self._allocate(4 + size) if self._allocate is not None else None
                if block is not None:
                    self._large, self._large_block = block.view, block
                else:
                    self._large = bytearray(4 + size)
                self._large[:have] = self._buffer
                self._large_pos = have
                self._buffer = bytearray()
        if self._large is not None:
            return memoryview(self._large)[self._large_pos :]
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` arrived in the last :meth:`get_buffer`."""
        if self._large is None:
            self._buffer += memoryview(self._scratch)[:nbytes]
            return
        self._large_pos += nbytes
        if self._large_pos == len(self._large):
            if self._large_block is not None:
                # Whole, in shared memory: handed over as it is, before anything after it.
                self._blocks.append((memoryview(self._large), self._large_block))
                self._large, self._large_block, self._large_pos = None, None, 0
                return
            # Whole: it becomes the buffer, which _take_frame hands over without a copy.
            assert isinstance(self._large, bytearray)
            self._buffer, self._large, self._large_pos = self._large, None, 0

    def next_event(self) -> Event:
        """The next admitted request, or a :class:`Signal`.

        Raises RemoteProtocolError (every time, once raised) when the peer broke the protocol.
        """
        if self._error is not None:
            raise self._error
        if self.paused:
            return Signal.PAUSED
        block = None
        try:
            if self._blocks:
                frame, block = self._blocks.popleft()
                frame = frame[4:]
            else:
                frame = self._take_frame()
            if frame is None:
                return Signal.CLOSED if self._eof else Signal.NEED_DATA
            request = self._admit(frame, block)
        except RemoteProtocolError as exc:
            if block is not None:
                block.release()
            self._error = exc
            raise
        self._unanswered[request.sequence] = request
        self._frame_bytes[request.sequence] = len(frame)
        self._in_flight_bytes += len(frame)
        self._next_sequence += 1
        return request

    def _take_frame(self) -> memoryview | None:
        if len(self._buffer) < 4:
            return None
        (size,) = _SIZE.unpack_from(self._buffer, 0)
        if size < 0 or size > self.max_frame_bytes:
            # Checked before buffering the frame: a garbage prefix must not make us allocate.
            raise RemoteProtocolError(
                f"frame size {size} outside 0..{self.max_frame_bytes} (socket.request.max.bytes)"
            )
        end = 4 + size
        if len(self._buffer) < end:
            return None
        if len(self._buffer) == end:
            # The usual case for a large request: the buffer holds exactly this frame, so it is
            # handed over whole rather than copied (decoded fields may be views into it).
            whole, self._buffer = self._buffer, bytearray()
            return memoryview(whole)[4:]
        with memoryview(self._buffer) as view:
            frame = bytes(view[4:end])
        del self._buffer[:end]
        return memoryview(frame)

    def _admit(self, frame: memoryview, hold: Any = None) -> Request:
        if len(frame) < _HEADER_PREFIX.size:
            raise RemoteProtocolError(f"frame of {len(frame)} bytes has no request header")
        api_key, api_version, correlation_id = _HEADER_PREFIX.unpack_from(frame, 0)
        versions = self._api_versions.get(api_key)
        supported = versions is not None and versions[0] <= api_version <= versions[1]
        if api_key == codec.API_VERSIONS_KEY and not supported:
            # Only the first 8 bytes are needed to answer; the rest may be a header or body
            # layout from a future version, so the body is never parsed and the rest of the
            # header only on a best-effort basis (for the client id in log lines).
            try:
                header, _ = codec.parse_request_header(frame)
            except codec.CodecError:
                header = codec.RequestHeader(api_key, api_version, correlation_id, None, 1)
            return Request(self._next_sequence, header, None, response_version=0, hold=hold)
        if not supported:
            what = "API key" if versions is None else "version of API"
            raise RemoteProtocolError(
                f"unsupported {what} {api_key} v{api_version} (correlation id {correlation_id})"
            )
        try:
            header, offset = codec.parse_request_header(frame)
            body = codec.decode_request(api_key, api_version, frame[offset:])
        except codec.CodecError as exc:
            raise RemoteProtocolError(
                f"bad request {api_key} v{api_version} (correlation id {correlation_id}): {exc}"
            ) from exc
        return Request(self._next_sequence, header, body, response_version=api_version, hold=hold)

    def send(self, request: Request, response: Any) -> bytes | bytearray:
        """Record ``response`` to ``request``; return the bytes that may be written now.

        The result holds every response that is now next in request order (possibly none, if an
        earlier request is still unanswered).
        """
        self._take_unanswered(request)
        try:
            frame = codec.encode_response(
                request.api_key, request.response_version, request.correlation_id, response
            )
        except Exception as exc:
            raise LocalProtocolError(
                f"cannot encode response to API {request.api_key} v{request.response_version}"
            ) from exc
        self._answered[request.sequence] = frame
        return self._flush()

    def send_nothing(self, request: Request) -> bytes | bytearray:
        """Mark ``request`` as answered without a response (Produce with acks=0)."""
        self._take_unanswered(request)
        self._answered[request.sequence] = None
        return self._flush()

    def _take_unanswered(self, request: Request) -> None:
        if self._unanswered.get(request.sequence) is not request:
            raise LocalProtocolError(f"request {request.sequence} is not awaiting an answer here")
        del self._unanswered[request.sequence]

    def _flush(self) -> bytes | bytearray:
        frames: list[bytes | bytearray] = []
        while self._next_to_write in self._answered:
            frame = self._answered.pop(self._next_to_write)
            self._in_flight_bytes -= self._frame_bytes.pop(self._next_to_write)
            if frame is not None:
                frames.append(frame)
            self._next_to_write += 1
        if len(frames) == 1:
            return frames[0]
        return b"".join(frames)
