"""Fuzz of the sans-IO connection: client bytes can only ever raise RemoteProtocolError.

Proves that for arbitrary bytes, arbitrarily chunked, and for valid frames with mutated bytes,
sizes, API keys and versions, ``Connection.next_event`` returns requests or signals, or raises
``RemoteProtocolError`` (Tansu's "decode arbitrary bytes without crashing"), and that a
connection never buffers past one frame of ``max_frame_bytes`` plus what it was given.
"""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import MetadataRequest
from support.gateway import api_versions_v0_frame

from raylog.gateway import codec
from raylog.gateway.errors import RemoteProtocolError
from raylog.gateway.handlers import advertised_versions
from raylog.gateway.protocol import Connection, Request, Signal

# Every API and version the codec knows, so that the fuzzer reaches every decoder, not only the
# two APIs served today.
WIDE = {key: (0, codec.max_version(key)) for key in sorted(codec.known_api_keys())}
TABLES = [dict(advertised_versions()), WIDE]
MAX_FRAME_BYTES = 4096
MAX_EVENTS = 1000  # bound on the drain loop: each event consumes at least one 12-byte frame


def valid_frames() -> list[bytes]:
    frames = [api_versions_v0_frame(5)]
    for version in (1, 5, 9):
        request = MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name="orders")],
            allow_auto_topic_creation=False,
        )
        request.API_VERSION = version
        request.with_header(correlation_id=9, client_id="fuzz")
        frames.append(bytes(request.encode(version=version, header=True, framed=True)))
    return frames


VALID = valid_frames()


def drain(connection: Connection, chunks: list[bytes]) -> None:
    for chunk in chunks:
        if not chunk:
            continue
        connection.receive_data(chunk)
        for _ in range(MAX_EVENTS):
            try:
                event = connection.next_event()
            except RemoteProtocolError:
                return
            if isinstance(event, Request):
                # Answer nothing so that ordering state is exercised, but never exceed in-flight.
                connection.send_nothing(event)
                continue
            assert event is Signal.NEED_DATA
            break
        assert connection.buffered_bytes <= MAX_FRAME_BYTES + 4 + len(chunk)


@given(table=st.sampled_from(TABLES), chunks=st.lists(st.binary(max_size=300), max_size=8))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_arbitrary_bytes(table: dict[int, tuple[int, int]], chunks: list[bytes]) -> None:
    drain(Connection(table, max_frame_bytes=MAX_FRAME_BYTES), chunks)


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(VALID)))
    kind = draw(st.sampled_from(["flip", "truncate", "append", "key", "size"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif kind == "truncate":
        cut = draw(st.integers(4, len(data) - 1))
        data = bytearray(struct.pack(">i", cut - 4)) + data[4:cut]
    elif kind == "append":
        tail = draw(st.binary(min_size=1, max_size=64))
        data = bytearray(struct.pack(">i", len(data) - 4 + len(tail))) + data[4:] + tail
    elif kind == "key":
        struct.pack_into(
            ">hh", data, 4, draw(st.integers(-(2**15), 2**15 - 1)), draw(st.integers(-5, 20))
        )
    else:
        struct.pack_into(">i", data, 0, draw(st.integers(-(2**31), 2**31 - 1)))
    return bytes(data)


@given(
    table=st.sampled_from(TABLES),
    frames=st.lists(mutated_frames(), min_size=1, max_size=4),
    chunk=st.integers(1, 64),
)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_frames(table: dict[int, tuple[int, int]], frames: list[bytes], chunk: int) -> None:
    data = b"".join(frames)
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    drain(Connection(table, max_frame_bytes=MAX_FRAME_BYTES), chunks)
