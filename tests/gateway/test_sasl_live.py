"""SASL on a live gateway listener, driven by real clients over loopback TCP.

Unit-level for the gateway layer (``InMemoryBackend``, no Ray); the server, connection, codec,
handlers and SASL code are the real ones. Proves: kafka-python (SCRAM-SHA-256, SCRAM-SHA-512,
PLAIN) and confluent-kafka (SCRAM-SHA-512, PLAIN) authenticate and read metadata over
SASL_PLAINTEXT; a wrong password or unknown user is refused with SASL_AUTHENTICATION_FAILED, the
connection closed, one log line naming the user and address and not the password, and the
listener keeps serving others; a request before authentication closes the connection unanswered;
malformed, truncated and oversized auth bytes (fuzzed) each get an answer and a closed connection,
never a crash; on a listener without SASL, SaslHandshake is ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from support.gateway import HOST, InMemoryBackend, LiveGateway, read_frame, sample_topics

from raylog.gateway import sasl
from raylog.gateway.authentication import Authenticator
from raylog.gateway.errors import ErrorCode
from raylog.gateway.server import ListenerSocket

PASSWORD = "alice-Pa55-word"
CLIENT_TIMEOUT_S = 20.0
CREDENTIALS = {
    ("alice", m): sasl.scram_credential(m, PASSWORD, os.urandom(16), 4096)
    for m in sasl.SCRAM_HASHES
}


def lookup(user: str, mechanism: str) -> sasl.ScramCredential | None:
    return CREDENTIALS.get((user, mechanism))


@pytest.fixture(scope="module")
def sasl_gateway() -> Iterator[LiveGateway]:
    gateway = LiveGateway(
        InMemoryBackend(topic_states=sample_topics()),
        ListenerSocket("SASL_PLAINTEXT", sasl=True),
        # No failure delay: the fuzz test fails hundreds of exchanges from one address (the
        # throttle has tests of its own).
        authenticator=Authenticator(lookup, os.urandom(32), failure_delay_ms=0),
    )
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


def kafka_python_topics(port: int, mechanism: str, user: str, password: str) -> set[str]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=f"{HOST}:{port}",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        sasl_plain_username=user,
        sasl_plain_password=password,
        request_timeout_ms=10_000,
    )
    try:
        return set(consumer.topics())
    finally:
        consumer.close()


def confluent_topics(
    port: int, mechanism: str, user: str, password: str, timeout_s: float = CLIENT_TIMEOUT_S
) -> set[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(
        {
            "bootstrap.servers": f"{HOST}:{port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": mechanism,
            "sasl.username": user,
            "sasl.password": password,
        }
    )
    return set(admin.list_topics(timeout=timeout_s).topics)


@pytest.mark.parametrize("mechanism", [sasl.SCRAM_SHA_256, sasl.SCRAM_SHA_512, sasl.PLAIN])
def test_kafka_python_authenticates(sasl_gateway: LiveGateway, mechanism: str) -> None:
    before = sasl_gateway.server.authentication_failures
    topics = kafka_python_topics(sasl_gateway.port, mechanism, "alice", PASSWORD)
    assert topics == {"orders", "events"}
    assert sasl_gateway.server.authentication_failures == before


@pytest.mark.parametrize("mechanism", [sasl.SCRAM_SHA_512, sasl.PLAIN])
def test_confluent_kafka_authenticates(sasl_gateway: LiveGateway, mechanism: str) -> None:
    assert confluent_topics(sasl_gateway.port, mechanism, "alice", PASSWORD) >= {
        "orders",
        "events",
    }


@pytest.mark.parametrize(("user", "password"), [("alice", "not-it"), ("mallory", PASSWORD)])
def test_wrong_credentials_are_refused_and_others_still_served(
    sasl_gateway: LiveGateway, caplog: pytest.LogCaptureFixture, user: str, password: str
) -> None:
    from confluent_kafka import KafkaException

    before = sasl_gateway.server.authentication_failures
    # librdkafka retries a failed authentication: the listing times out.
    with (
        caplog.at_level(logging.WARNING, logger="raylog.gateway.server"),
        pytest.raises(KafkaException),
    ):
        confluent_topics(sasl_gateway.port, sasl.SCRAM_SHA_512, user, password, timeout_s=3)
    assert sasl_gateway.server.authentication_failures > before
    lines = [r.getMessage() for r in caplog.records if "authentication of user" in r.getMessage()]
    assert lines and all(repr(user) in line and "127.0.0.1" in line for line in lines)
    assert not any(password in r.getMessage() for r in caplog.records)
    assert kafka_python_topics(sasl_gateway.port, sasl.SCRAM_SHA_256, "alice", PASSWORD) == {
        "orders",
        "events",
    }


def _send(sock: socket.socket, request: Any, version: int, correlation_id: int) -> None:
    request.with_header(correlation_id=correlation_id, client_id="raw")
    sock.sendall(bytes(request.encode(version=version, header=True, framed=True)))


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_request_before_authentication_closes_the_connection(
    sasl_gateway: LiveGateway,
) -> None:
    with socket.create_connection((HOST, sasl_gateway.port), timeout=10) as sock:
        _send(sock, MetadataRequest(topics=None), version=1, correlation_id=1)
        assert _closed(sock)
    # Also after a handshake, before SaslAuthenticate completes.
    with socket.create_connection((HOST, sasl_gateway.port), timeout=10) as sock:
        _send(sock, SaslHandshakeRequest(mechanism=sasl.PLAIN), version=1, correlation_id=1)
        answer = SaslHandshakeResponse.decode(read_frame(sock)[4:], version=1)
        assert answer.error_code == 0 and sasl.PLAIN in answer.mechanisms
        _send(sock, MetadataRequest(topics=None), version=1, correlation_id=2)
        assert _closed(sock)


def test_an_unknown_mechanism_is_refused_and_the_connection_stays(
    sasl_gateway: LiveGateway,
) -> None:
    with socket.create_connection((HOST, sasl_gateway.port), timeout=10) as sock:
        _send(sock, SaslHandshakeRequest(mechanism="GSSAPI"), version=1, correlation_id=1)
        answer = SaslHandshakeResponse.decode(read_frame(sock)[4:], version=1)
        assert answer.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert answer.mechanisms == list(sasl.MECHANISMS)
        _send(sock, SaslHandshakeRequest(mechanism=sasl.PLAIN), version=1, correlation_id=2)
        assert SaslHandshakeResponse.decode(read_frame(sock)[4:], version=1).error_code == 0


def _authenticate_raw(port: int, mechanism: str, messages: list[bytes]) -> list[int]:
    """Handshake, then ``messages`` as SaslAuthenticate v2 until one fails; their error codes.
    The connection must be closed after a failure."""
    codes = []
    with socket.create_connection((HOST, port), timeout=10) as sock:
        _send(sock, SaslHandshakeRequest(mechanism=mechanism), version=1, correlation_id=1)
        assert SaslHandshakeResponse.decode(read_frame(sock)[4:], version=1).error_code == 0
        for i, message in enumerate(messages):
            _send(sock, SaslAuthenticateRequest(auth_bytes=message), 2, correlation_id=2 + i)
            # Response header v1 for the flexible v2: correlation id, then tagged fields.
            answer = SaslAuthenticateResponse.decode(read_frame(sock)[5:], version=2)
            codes.append(answer.error_code)
            if answer.error_code:
                assert _closed(sock)
                break
    return codes


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    mechanism=st.sampled_from(sasl.MECHANISMS),
    messages=st.lists(
        st.one_of(
            st.binary(max_size=64),
            st.binary(min_size=sasl.AUTH_BYTES_MAX + 1, max_size=sasl.AUTH_BYTES_MAX + 8),
            st.sampled_from([b"n,,n=alice,r=abc", b"n,,n=alice", b"\0alice\0", b"p=x,,n=a,r=b"]),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_fuzzed_auth_bytes_get_an_answer_and_never_authenticate(
    sasl_gateway: LiveGateway, mechanism: str, messages: list[bytes]
) -> None:
    codes = _authenticate_raw(sasl_gateway.port, mechanism, messages)
    assert codes and set(codes) <= {ErrorCode.NONE, ErrorCode.SASL_AUTHENTICATION_FAILED}
    # Only a SCRAM client-first can succeed without a secret; nothing completes the exchange.
    assert ErrorCode.SASL_AUTHENTICATION_FAILED in codes or mechanism != sasl.PLAIN
    assert sasl_gateway.alive()


def test_sasl_on_a_listener_without_it_is_illegal_state() -> None:
    gateway = LiveGateway(InMemoryBackend(topic_states=sample_topics()))
    gateway.start()
    try:
        with socket.create_connection((HOST, gateway.port), timeout=10) as sock:
            _send(sock, SaslHandshakeRequest(mechanism=sasl.PLAIN), version=1, correlation_id=1)
            answer = SaslHandshakeResponse.decode(read_frame(sock)[4:], version=1)
            assert answer.error_code == ErrorCode.ILLEGAL_SASL_STATE
            _send(sock, MetadataRequest(topics=None), version=1, correlation_id=2)
            assert len(read_frame(sock)) > 4  # still served: the listener needs no SASL
    finally:
        gateway.stop()


def test_a_v0_handshake_is_refused_and_closed(sasl_gateway: LiveGateway) -> None:
    # v0 is advertised (librdkafka looks for it) but its raw-token exchange is not spoken.
    with socket.create_connection((HOST, sasl_gateway.port), timeout=10) as sock:
        _send(sock, SaslHandshakeRequest(mechanism=sasl.PLAIN), version=0, correlation_id=1)
        answer = SaslHandshakeResponse.decode(read_frame(sock)[4:], version=0)
        assert answer.error_code == ErrorCode.UNSUPPORTED_VERSION
        assert _closed(sock)
