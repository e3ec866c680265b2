"""Fuzz a live gateway over loopback: garbage never takes it down or affects other clients.

Proves that random bytes, truncated frames, oversized and negative size prefixes, random bytes
after a valid header, and unknown API keys and versions, each sent on its own TCP connection to a
running ``GatewayServer``, leave the server task alive and serving: afterwards a raw ApiVersions
request on a new connection and a kafka-python client both work, and a connection opened before
the garbage still works too. Unit-level for the gateway (in-memory backend); loopback only.
"""

from __future__ import annotations

import random
import socket
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.gateway import (
    HOST,
    LiveGateway,
    api_versions_v0_frame,
    raw_api_versions_roundtrip,
    read_frame,
    wait_for,
)

IO_TIMEOUT_S = 5.0
READ_LIMIT_BYTES = 1 << 20  # bound on what one garbage connection may read back


def header(api_key: int, version: int, correlation_id: int = 1) -> bytes:
    return struct.pack(">hhih", api_key, version, correlation_id, -1)


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


garbage = st.one_of(
    st.binary(max_size=512),  # anything at all
    st.binary(min_size=1, max_size=64).map(lambda b: api_versions_v0_frame(1)[: len(b) % 14]),
    st.integers(104_857_601, 2**31 - 1).map(lambda n: struct.pack(">i", n) + b"\x00" * 16),
    st.integers(-(2**31), -1).map(lambda n: struct.pack(">i", n)),
    st.tuples(st.sampled_from([(3, 1), (3, 5), (18, 0), (18, 2)]), st.binary(max_size=256)).map(
        lambda t: framed(header(*t[0]) + t[1])
    ),
    st.tuples(st.integers(-(2**15), 2**15 - 1), st.integers(-(2**15), 2**15 - 1)).map(
        lambda kv: framed(header(*kv))
    ),
    st.lists(st.binary(max_size=64).map(framed), max_size=5).map(b"".join),
    # Large frames (received in place once an eighth is in): cut short, whole, or followed by
    # more bytes; a valid header then noise, or noise throughout.
    st.tuples(st.integers(65_536, 400_000), st.floats(0.0, 1.3), st.booleans()).map(
        lambda t: _large_frame(*t)
    ),
)


def _large_frame(size: int, fraction: float, with_header: bool) -> bytes:
    noise = random.Random(size).randbytes(int(size * fraction))
    body = (header(18, 2) + noise)[:size] if with_header else noise[:size]
    return struct.pack(">i", size) + body + noise[size:]


def send_garbage(port: int, data: bytes) -> None:
    """Send ``data`` on a new connection, half-close, and read until the gateway closes it."""
    with socket.create_connection((HOST, port), timeout=IO_TIMEOUT_S) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            received = 0
            while received < READ_LIMIT_BYTES:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                received += len(chunk)
        except (ConnectionError, OSError):
            return  # reset by the gateway: it closed this connection, as it should


def test_garbage_never_takes_the_gateway_down(live_gateway: LiveGateway) -> None:
    with socket.create_connection((HOST, live_gateway.port), timeout=IO_TIMEOUT_S) as bystander:
        bystander.sendall(api_versions_v0_frame(1))
        read_frame(bystander)

        @given(data=garbage)
        @settings(
            max_examples=150,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )
        def throw(data: bytes) -> None:
            send_garbage(live_gateway.port, data)

        throw()

        # The connection opened before the garbage is untouched.
        bystander.sendall(api_versions_v0_frame(2))
        assert read_frame(bystander)[:4] == struct.pack(">i", 2)

    assert live_gateway.alive()
    assert raw_api_versions_roundtrip(live_gateway.port, correlation_id=3)[:4] == struct.pack(
        ">i", 3
    )
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=live_gateway.bootstrap, request_timeout_ms=10000)
    try:
        assert consumer.topics() == {"orders", "events"}
    finally:
        consumer.close()
    wait_for(
        lambda: live_gateway.server.open_connections == 0,
        IO_TIMEOUT_S,
        "every connection to be closed on the gateway's side",
    )
