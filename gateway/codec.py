"""Kafka message codec: request headers, request bodies and framed responses, from the JSON specs.

This module owns the translation between frame bytes and message objects. It does no I/O.

Schemas are data: every message body is decoded and encoded by kafka-python 3.0's codec, which
builds its classes at import time from the copy of Apache Kafka's JSON message specs
(``clients/src/main/resources/common/message/*.json``) shipped in its wheel, and compiles one
encoder and one decoder per (message, version). ``benchmarks/codec.py`` measures it on the broker
side (decode Produce v7 carrying 1 MiB, encode Fetch v11 carrying 1 MiB, encode Metadata v5 with
1000 partitions) and prints its figures.

Three things are done here rather than through kafka-python's ``ApiMessage.decode``:

1. The request header is parsed here (it is four fields). ``ApiMessage.decode(header=True)``
   copies the whole rest of the frame into a ``BytesIO`` to read it, which for a 1 MiB Produce
   request costs more than decoding the body.
2. Bodies are decoded through the compiled decoder directly so that its end position can be
   checked: kafka-python's ``bytes``/``string`` readers slice a ``memoryview`` and silently return
   fewer bytes than the length prefix claims when the frame is short. A body that ends before its
   fields do is client garbage, so it is rejected with :class:`CodecError`. Trailing bytes after a
   complete body are ignored, as Kafka's own request parser does.
3. Response frames are written in one buffer (size prefix, header, body) without a second copy of
   the body.

The header version of each request and response follows Kafka's rule, derived from the spec's
``flexibleVersions`` of that API: request header v2 and response header v1 for flexible versions,
else request header v1 and response header v0. Two exceptions, both Kafka's: ControlledShutdown v0
uses request header v0 (no client id), and an ApiVersions response always uses header v0, because
a client that sent a version the broker does not know must still be able to read the answer.

Items 2 and 3 use kafka-python internals (``_struct.compiled_decode_from``,
``compiled_encode_into``, ``EncodeBufferPool``); pyproject pins kafka-python to 3.0.x for that.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import kafka.protocol.admin
import kafka.protocol.consumer
import kafka.protocol.metadata
import kafka.protocol.producer
import kafka.protocol.sasl
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields.codecs import Bytes, UnsignedVarInt32
from kafka.protocol.schemas.fields.codecs.encode_buffer import EncodeBufferPool
from kafka.protocol.schemas.fields.simple import SimpleField

from raylog.storage.errors import CorruptRecordError
from raylog.storage.records import read_uvarint

__all__ = [
    "API_VERSIONS_KEY",
    "CodecError",
    "RequestHeader",
    "decode_request",
    "encode_response",
    "is_flexible",
    "known_api_keys",
    "max_version",
    "parse_request_header",
    "request_class",
    "request_header_version",
    "response_class",
    "response_header_version",
]

API_VERSIONS_KEY = 18
CONTROLLED_SHUTDOWN_KEY = 7

_INT16 = struct.Struct(">h")
_HEADER_FIXED = struct.Struct(">hhi")  # api key, api version, correlation id
_SIZE_AND_CORRELATION = struct.Struct(">ii")

# A request header's client id is a nullable string with an int16 length, so it is bounded by
# 32767 bytes; tagged fields in header v2 are bounded by the frame. No other limit is needed here.


class CodecError(ValueError):
    """Bytes that do not decode as the message they claim to be (the client's fault)."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """A parsed request header (``RequestHeader.json`` v0, v1 or v2)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int


def _collect_message_classes() -> tuple[dict[int, type[ApiMessage]], dict[int, type[ApiMessage]]]:
    """Index kafka-python's spec-built message classes by API key."""
    requests: dict[int, type[ApiMessage]] = {}
    responses: dict[int, type[ApiMessage]] = {}
    modules = (
        kafka.protocol.admin,
        kafka.protocol.consumer,
        kafka.protocol.metadata,
        kafka.protocol.producer,
        kafka.protocol.sasl,
    )
    for module in modules:
        for name in getattr(module, "__all__", ()):
            cls = getattr(module, name)
            if not (isinstance(cls, type) and issubclass(cls, ApiMessage)):
                continue
            if cls._class_version is not None:  # a versioned alias such as Foo_v3
                continue
            table = requests if cls.is_request() else responses
            table.setdefault(cls.API_KEY, cls)
    return requests, responses


_REQUESTS, _RESPONSES = _collect_message_classes()


class _RecordsView(Bytes):
    """A Produce request's ``records`` decoded as a view into the request frame: the batch is
    handed on (to the replica's channel, or by reference from shared memory) without the copy
    kafka-python's ``bytes`` decoder makes. Decoding only; encoding is ``Bytes``'."""

    @classmethod
    def emit_decode_from(cls, ctx: Any, var_name: str, indent: str, compact: bool = False) -> None:
        length = ctx.next_var("ln")
        if compact:
            UnsignedVarInt32.emit_decode_from(ctx, length, indent)
            ctx.emit(indent, f"{length} -= 1")
        else:
            ctx.emit(indent, f'{length} = unpack_from(">i", data, pos)[0]')
            ctx.emit(indent, "pos += 4")
        ctx.emit(indent, f"if {length} < 0:")
        ctx.emit(indent, f"    {var_name} = None")
        ctx.emit(indent, "else:")
        ctx.emit(indent, f"    {var_name} = data[pos:pos+{length}]")
        ctx.emit(indent, f"    pos += {length}")


def _decode_records_as_views(struct_field: Any) -> None:
    """Make every ``records`` field under ``struct_field`` decode as :class:`_RecordsView`
    (before its decoders are compiled: they are compiled on first use and cached)."""
    seen: set[int] = set()
    todo = [struct_field]
    while todo:
        field = todo.pop()
        if id(field) in seen:
            continue
        seen.add(id(field))
        if isinstance(field, SimpleField) and field._type_str == "records":
            field._type = _RecordsView
        todo.extend(getattr(field, "_fields", None) or ())
        inner = getattr(field, "array_of", None)
        if inner is not None:
            todo.append(inner)


_decode_records_as_views(kafka.protocol.producer.ProduceRequest._struct)


def known_api_keys() -> frozenset[int]:
    """API keys whose request and response specs this codec has."""
    return frozenset(_REQUESTS.keys() & _RESPONSES.keys())


def max_version(api_key: int) -> int:
    """The newest version both the request and response specs of ``api_key`` define (-1: none)."""
    if api_key not in _REQUESTS or api_key not in _RESPONSES:
        return -1
    return min(_REQUESTS[api_key].max_version, _RESPONSES[api_key].max_version)


def request_class(api_key: int) -> type[ApiMessage]:
    """The spec-built request class for ``api_key`` (KeyError if the codec has none)."""
    return _REQUESTS[api_key]


def response_class(api_key: int) -> type[ApiMessage]:
    """The spec-built response class for ``api_key`` (KeyError if the codec has none)."""
    return _RESPONSES[api_key]


def is_flexible(api_key: int, api_version: int) -> bool:
    """Whether ``api_version`` of ``api_key`` is a flexible version in the JSON spec."""
    return bool(_REQUESTS[api_key].flexible_version_q(api_version))


def request_header_version(api_key: int, api_version: int) -> int:
    """Request header version for a request: Kafka's ``ApiMessageType.requestHeaderVersion``."""
    if api_key == CONTROLLED_SHUTDOWN_KEY and api_version == 0:
        return 0
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """Response header version: v1 for flexible versions, except ApiVersions (always v0)."""
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if is_flexible(api_key, api_version) else 0


def _read_uvarint(data: memoryview, pos: int) -> tuple[int, int]:
    """An unsigned varint of flexible versions (Kafka's 32-bit ones: at most 5 bytes), read by
    the LEB128 core the records' zigzag varints share."""
    try:
        return read_uvarint(data, pos, len(data), max_bytes=5)
    except CorruptRecordError as exc:
        raise CodecError(f"request header: {exc}") from None


def _skip_tagged_fields(data: memoryview, pos: int) -> int:
    count, pos = _read_uvarint(data, pos)
    for _ in range(count):
        _tag, pos = _read_uvarint(data, pos)
        size, pos = _read_uvarint(data, pos)
        pos += size
        if pos > len(data):
            raise CodecError("tagged field runs past the end of the frame")
    return pos


def parse_request_header(
    frame: memoryview, header_version: int | None = None
) -> tuple[RequestHeader, int]:
    """Parse the request header at the start of ``frame``; return it and the body's offset.

    ``header_version`` defaults to the one the API key and version imply; a caller that does not
    know the API (an unknown key) passes 1, since every header from v1 on starts the same way.
    """
    if len(frame) < _HEADER_FIXED.size:
        raise CodecError(f"frame of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _HEADER_FIXED.unpack_from(frame, 0)
    if header_version is None:
        header_version = request_header_version(api_key, api_version)
    pos = _HEADER_FIXED.size
    client_id: str | None = None
    if header_version >= 1:
        if pos + 2 > len(frame):
            raise CodecError("request header ends inside the client id length")
        (length,) = _INT16.unpack_from(frame, pos)
        pos += 2
        if length >= 0:
            if pos + length > len(frame):
                raise CodecError("client id runs past the end of the frame")
            try:
                client_id = str(frame[pos : pos + length], "utf-8")
            except UnicodeDecodeError as exc:
                raise CodecError("client id is not UTF-8") from exc
            pos += length
        elif length != -1:
            raise CodecError(f"client id length {length}")
    if header_version >= 2:
        pos = _skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, header_version), pos


def decode_request(api_key: int, api_version: int, body: memoryview) -> Any:
    """Decode a request body with the spec-built decoder for that API version.

    Raises CodecError when the body is not a complete message of that version.
    """
    cls = _REQUESTS[api_key]
    flexible = bool(cls.flexible_version_q(api_version))
    decode = cls._struct.compiled_decode_from(
        api_version, compact=flexible, tagged=flexible, data_class=cls[None]
    )
    try:
        message, end = decode(body, 0)
    except CodecError:
        raise
    except Exception as exc:
        # The decoder is pure code over client bytes: any failure in it (struct.error,
        # IndexError, UnicodeDecodeError, ValueError...) means the bytes were garbage.
        raise CodecError(f"{cls.__name__} v{api_version}: {type(exc).__name__}: {exc}") from exc
    if end > len(body):
        raise CodecError(f"{cls.__name__} v{api_version} body is truncated")
    message._version = api_version
    return message


def encode_response(api_key: int, api_version: int, correlation_id: int, message: Any) -> bytearray:
    """Encode ``message`` as a whole response frame: size, response header, body."""
    cls = _RESPONSES[api_key]
    flexible = bool(cls.flexible_version_q(api_version))
    header_size = 4 if response_header_version(api_key, api_version) == 0 else 5
    encode = cls._struct.compiled_encode_into(api_version, compact=flexible, tagged=flexible)
    with EncodeBufferPool.acquire() as out:
        out.ensure(4 + header_size)
        start = out.pos
        out.pos += 4 + header_size
        encode(message, out)
        # Invariant: the size prefix counts every byte after itself.
        _SIZE_AND_CORRELATION.pack_into(out.buf, start, out.pos - start - 4, correlation_id)
        if header_size == 5:
            out.buf[start + 8] = 0  # response header v1: no tagged fields
        return out.result()
