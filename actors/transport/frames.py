"""Channel frames: the message kinds on the wire, how one is encoded, and the sans-IO parser
that decodes a stream of them into buffers it owns.

Wire format (:func:`encode_frame` / :class:`FrameParser`): ``u32 length, u8 kind, msgpack
body`` with ``length`` counting kind and body, at most ``FRAME_BYTES_MAX``. The kind byte
indexes :data:`CHANNEL_KINDS`: the four one-way replication messages and the call frames
(:class:`CallRequest`, :class:`CallReply`).
"""

from __future__ import annotations

import collections
import struct
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


class CallRequestOut(msgspec.Struct, frozen=True):
    """How a caller encodes a :class:`CallRequest`: the same bytes on the wire, with the
    arguments encoded straight into the frame instead of first into a Raw of their own."""

    call_id: int
    method: str
    args: tuple[Any, ...]


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
_KIND_OF[CallRequestOut] = _KIND_OF[CallRequest]
_DECODERS = tuple(msgspec.msgpack.Decoder(t) for t in CHANNEL_KINDS)
_ENCODER = msgspec.msgpack.Encoder()

_HEADER = struct.Struct(">IB")  # length (kind + body), kind
FRAME_BYTES_MAX = 128 << 20  # above any fetch/push (replica.fetch.max.bytes is at most 64 MiB)
SCRATCH_BYTES = 256 << 10  # receive buffer of small frames; larger ones get their own


class FrameError(Exception):
    """The peer sent bytes that are not a channel frame; the connection is closed."""


def is_channel_message(message: object) -> bool:
    """A one-way replication message the channel carries (not a call frame)."""
    kind = type(message)
    return kind in _KIND_OF and kind not in (CallRequest, CallReply, CallRequestOut)


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


def reply_result(value: Any) -> msgspec.Raw:
    """A call's return value as the ``result`` of its :class:`CallReply`."""
    return msgspec.Raw(_ENCODER.encode(value))


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
    ``asyncio.StreamReader`` makes four (chunks, its growing buffer, ``readexactly``, decode).
    Decoded messages wait in
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
