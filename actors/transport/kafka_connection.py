"""One client connection to a Kafka-compatible broker, for :mod:`kafka_client`: the framing,
the correlation ids, pipelining and the version negotiation of ApiVersions.

Requests are encoded and responses decoded by kafka-python 3.0's spec-built message classes
(the JSON specs of Apache Kafka). Several requests may be in flight at once: each waits for
the response carrying its correlation id, and a response with an id never sent (or sent on
another connection) is a protocol error that closes the connection. Any trouble on the
connection (a reset, a frame over ``max_response_bytes``, bytes that do not decode) fails
every request in flight with :class:`KafkaClientError` and closes it: the client opens a new
one on the next call, and callers retry.

Bodies are decoded through kafka-python's compiled decoder directly (as gateway/codec.py does
on the server side) so that a body shorter than its fields is an error rather than a short
value; pyproject pins kafka-python to 3.0.x for these internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import struct
from typing import Any

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from raylog.actors.transport.kafka_sasl_client import (
    PLAIN,
    LinkSecurity,
    ScramClient,
    ScramClientError,
    plain_message,
)
from raylog.storage.errors import CorruptRecordError
from raylog.storage.records import read_uvarint

log = logging.getLogger(__name__)

UNSUPPORTED_VERSION = 35  # Kafka's error code
API_VERSIONS_KEY = 18
IN_FLIGHT_MAX = 64  # requests waiting on one connection; more wait for room
CLOSE_TIMEOUT_S = 1.0  # waiting for the socket to close after the client closed it
ABANDONED_MAX = 1024  # answers still owed to cancelled callers before the connection is dropped
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_CLIENT_SOFTWARE = ("raylog", "0.1.0")
# SaslHandshake v0 is Kafka 0.10.0's unframed exchange; v1 wraps it in SaslAuthenticate.
SASL_HANDSHAKE_VERSIONS = (1, 1)
SASL_AUTHENTICATE_VERSIONS = (0, SaslAuthenticateRequest.max_version)
SCRAM_NONCE_BYTES = 24
SASL_STEPS_MAX = 2  # SaslAuthenticate round trips: SCRAM needs two, PLAIN one


class KafkaClientError(Exception):
    """Trouble reaching or talking to a source broker; the message names the broker.
    ``error_code`` is the Kafka error code the broker answered, 0 when the trouble is the
    connection or the protocol."""

    def __init__(self, message: str, error_code: int = 0) -> None:
        super().__init__(message)
        self.error_code = error_code


def _skip_tagged_fields(frame: bytes, pos: int) -> int:
    count, pos = read_uvarint(frame, pos, len(frame), max_bytes=5)
    for _ in range(count):  # bounded: each field consumes bytes of the frame
        _tag, pos = read_uvarint(frame, pos, len(frame), max_bytes=5)
        size, pos = read_uvarint(frame, pos, len(frame), max_bytes=5)
        pos += size
        if pos > len(frame):
            raise CorruptRecordError("tagged field runs past the end of the frame")
    return pos


def decode_response(cls: type[ApiMessage], version: int, frame: bytes) -> Any:
    """Decode a response frame (without its size prefix) of ``cls`` at ``version``.

    Raises ValueError when the header or the body is not a whole message of that version."""
    flexible = bool(cls.flexible_version_q(version))
    pos = 4  # correlation id
    try:
        if flexible and cls.API_KEY != API_VERSIONS_KEY:  # ApiVersions answers header v0
            pos = _skip_tagged_fields(frame, pos)
        decode = cls._struct.compiled_decode_from(
            version, compact=flexible, tagged=flexible, data_class=cls[None]
        )
        message, end = decode(memoryview(frame), pos)
    except Exception as exc:  # the decoder over the broker's bytes: any failure is garbage
        raise ValueError(f"{cls.__name__} v{version}: {type(exc).__name__}: {exc}") from None
    if end > len(frame):
        raise ValueError(f"{cls.__name__} v{version} is truncated")
    message._version = version
    return message


def negotiate(
    name: str, api_key: int, ours: tuple[int, int], theirs: tuple[int, int] | None
) -> int:
    """The highest version of ``api_key`` both sides speak, else KafkaClientError."""
    if theirs is None:
        raise KafkaClientError(f"{name} does not support API {api_key}")
    low, high = max(ours[0], theirs[0]), min(ours[1], theirs[1])
    if high < low:
        raise KafkaClientError(
            f"{name} supports API {api_key} v{theirs[0]}-{theirs[1]}; "
            f"this client speaks v{ours[0]}-{ours[1]}"
        )
    return high


class BrokerConnection:
    """One open connection: :meth:`call` sends a request and waits for its response."""

    def __init__(
        self,
        name: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        client_id: str,
        max_response_bytes: int,
    ) -> None:
        self.name = name  # "broker 2 at host:port": every error says which broker
        self._reader = reader
        self._writer = writer
        self._client_id = client_id
        self._max_response_bytes = max_response_bytes
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._abandoned: set[int] = set()
        self._room = asyncio.Semaphore(IN_FLIGHT_MAX)
        self.versions: dict[int, tuple[int, int]] = {}  # api key -> the broker's range
        self.error: KafkaClientError | None = None
        self._read_task = asyncio.get_running_loop().create_task(self._read_frames())

    @property
    def alive(self) -> bool:
        return self.error is None

    def version(self, api_key: int, ours: tuple[int, int]) -> int:
        return negotiate(self.name, api_key, ours, self.versions.get(api_key))

    async def call(self, request: ApiMessage, response_cls: type[ApiMessage]) -> Any:
        """Send ``request`` (its version set) and decode the response to it."""
        version = request.API_VERSION
        frame = await self.send(request)
        try:
            return decode_response(response_cls, version, frame)
        except ValueError as exc:
            self.fail(f"undecodable response: {exc}")
            raise KafkaClientError(f"{self.name}: undecodable response: {exc}") from None

    async def send(self, request: ApiMessage) -> bytes:
        """Send ``request`` and return its response frame (without the size prefix)."""
        async with self._room:
            if self.error is not None:
                raise self.error
            correlation_id = self._next_id
            self._next_id = (self._next_id + 1) & 0x7FFFFFFF
            request.with_header(correlation_id=correlation_id, client_id=self._client_id)
            frame = request.encode(header=True, framed=True)
            future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            self._pending[correlation_id] = future
            try:
                self._writer.write(frame)
                await self._writer.drain()
                return await future
            except (OSError, RuntimeError) as exc:  # RuntimeError: the transport is closed
                self.fail(f"write failed: {exc}")
                raise self.error or KafkaClientError(f"{self.name}: {exc}") from None
            finally:
                if not future.done():  # the caller gave up: its answer may still arrive
                    future.cancel()
                    self._pending.pop(correlation_id, None)
                    self._abandoned.add(correlation_id)
                    if len(self._abandoned) > ABANDONED_MAX:
                        self.fail("too many requests abandoned")

    async def handshake(self) -> None:
        """ApiVersions: learn the broker's version ranges (a broker that does not know our
        version answers UNSUPPORTED_VERSION with its own range of ApiVersions, in v0)."""
        version = min(3, ApiVersionsRequest.max_version)
        for _ in range(2):  # the second attempt uses a version the broker named
            request = ApiVersionsRequest(
                version=version,
                client_software_name=_CLIENT_SOFTWARE[0],
                client_software_version=_CLIENT_SOFTWARE[1],
            )
            frame = await self.send(request)
            if len(frame) >= 6 and _INT16.unpack_from(frame, 4)[0] == UNSUPPORTED_VERSION:
                answer = self._decode_versions(frame, 0)
                theirs = {a.api_key: a.max_version for a in answer.api_keys}.get(API_VERSIONS_KEY)
                if theirs is None or theirs >= version:
                    break
                version = theirs
                continue
            answer = self._decode_versions(frame, version)
            if answer.error_code:
                break
            self.versions = {a.api_key: (a.min_version, a.max_version) for a in answer.api_keys}
            return
        raise KafkaClientError(f"{self.name}: ApiVersions refused", UNSUPPORTED_VERSION)

    async def authenticate(self, security: LinkSecurity) -> None:
        """SaslHandshake and SaslAuthenticate for ``security`` (a SASL protocol)."""
        name = self.name
        mechanism = security.sasl_mechanism
        version = self.version(SaslHandshakeRequest.API_KEY, SASL_HANDSHAKE_VERSIONS)
        answer = await self.call(
            SaslHandshakeRequest(version=version, mechanism=mechanism), SaslHandshakeResponse
        )
        if answer.error_code:
            raise KafkaClientError(
                f"{name}: SASL mechanism {mechanism} refused (error {answer.error_code}); "
                f"the broker enables {', '.join(answer.mechanisms) or 'none'}",
                answer.error_code,
            )
        version = self.version(SaslAuthenticateRequest.API_KEY, SASL_AUTHENTICATE_VERSIONS)
        scram: ScramClient | None = None
        if mechanism == PLAIN:
            message = plain_message(security.username, security.password)
        else:
            nonce = secrets.token_urlsafe(SCRAM_NONCE_BYTES)
            scram = ScramClient(mechanism, security.username, security.password, nonce)
            message = scram.first()
        for step in range(SASL_STEPS_MAX):
            answer = await self.call(
                SaslAuthenticateRequest(version=version, auth_bytes=message),
                SaslAuthenticateResponse,
            )
            if answer.error_code:
                raise KafkaClientError(
                    f"{name}: SASL {mechanism} authentication of {security.username!r} "
                    f"failed (error {answer.error_code}): {answer.error_message or ''}",
                    answer.error_code,
                )
            try:
                if scram is None:
                    return
                if step == 0:
                    message = scram.final(bytes(answer.auth_bytes))
                    continue
                scram.verify(bytes(answer.auth_bytes))
                return
            except ScramClientError as exc:
                raise KafkaClientError(f"{name}: SASL {mechanism}: {exc}") from None
        raise KafkaClientError(f"{name}: SASL {mechanism} did not finish")

    def _decode_versions(self, frame: bytes, version: int) -> Any:
        try:
            return decode_response(ApiVersionsResponse, version, frame)
        except ValueError as exc:
            self.fail(f"undecodable ApiVersions: {exc}")
            raise KafkaClientError(f"{self.name}: undecodable ApiVersions: {exc}") from None

    async def _read_frames(self) -> None:
        try:
            while True:  # bounded by the connection: it ends when the broker closes it
                (size,) = _INT32.unpack(await self._reader.readexactly(4))
                if not 4 <= size <= self._max_response_bytes:
                    self.fail(
                        f"response frame of {size} bytes (at most {self._max_response_bytes})"
                    )
                    return
                frame = await self._reader.readexactly(size)
                (correlation_id,) = _INT32.unpack_from(frame, 0)
                future = self._pending.pop(correlation_id, None)
                if future is not None:
                    if not future.done():
                        future.set_result(frame)
                elif correlation_id in self._abandoned:
                    self._abandoned.discard(correlation_id)
                else:
                    self.fail(f"response to correlation id {correlation_id}, never sent")
                    return
        except asyncio.IncompleteReadError:
            self.fail("closed by the broker")
        except (OSError, asyncio.LimitOverrunError) as exc:
            self.fail(f"read failed: {exc}")

    def fail(self, reason: str) -> None:
        """Close the connection; every request in flight fails with ``reason``."""
        if self.error is not None:
            return
        self.error = KafkaClientError(f"{self.name}: connection dropped: {reason}")
        log.info("%s", self.error)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self.error)
        self._pending.clear()
        self._abandoned.clear()
        if asyncio.current_task() is not self._read_task:
            self._read_task.cancel()
        self._writer.close()

    async def close(self) -> None:
        self.fail("closed by the client")
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await self._read_task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), CLOSE_TIMEOUT_S)
