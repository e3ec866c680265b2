"""The per-connection authentication state machine and the failure throttle, alone.

Proves: a SASL listener admits only ApiVersions / SaslHandshake / SaslAuthenticate until the
exchange succeeds, and nothing once it failed; the handshake refuses mechanisms that are not
enabled (and keeps the connection usable for another try); a second handshake, or SASL on a
listener without it, is ILLEGAL_SASL_STATE; a successful SCRAM and PLAIN exchange names the
principal; a failure says nothing about the secret; failures from one address slow down and are
forgotten after the window or a success; the throttle remembers a bounded number of addresses.
"""

from __future__ import annotations

import pytest
from kafka.net.sasl.scram import ScramClient

from raylog.gateway import authentication as auth
from raylog.gateway import sasl
from raylog.gateway.errors import ErrorCode

SALT = b"s" * 16
CREDENTIALS = {
    ("alice", m): sasl.scram_credential(m, "alice-secret", SALT, 4096) for m in sasl.SCRAM_HASHES
}


def lookup(user: str, mechanism: str) -> sasl.ScramCredential | None:
    return CREDENTIALS.get((user, mechanism))


def authenticator(mechanisms: tuple[str, ...] = sasl.MECHANISMS) -> auth.Authenticator:
    return auth.Authenticator(lookup, b"mask" * 8, mechanisms, failure_delay_ms=100)


def scram(session: auth.ClientSession, user: str, password: str, mechanism: str) -> auth.Outcome:
    assert session.handshake(mechanism, authenticator(), "servernonce").error_code == 0
    client = ScramClient(user, password, mechanism)
    first = session.authenticate(client.first_message())
    if first.error_code:
        return first
    client.process_server_first_message(first.auth_bytes)
    final = session.authenticate(client.final_message())
    if final.error_code == 0:
        client.process_server_final_message(final.auth_bytes)
    return final


def test_a_sasl_listener_admits_only_the_exchange_until_it_succeeds() -> None:
    session = auth.ClientSession("10.0.0.9", sasl_listener=True)
    assert not session.authenticated
    assert [session.admits(k) for k in (18, 17, 36)] == [True, True, True]
    assert not session.admits(3) and not session.admits(0)
    outcome = scram(session, "alice", "alice-secret", sasl.SCRAM_SHA_512)
    assert outcome.error_code == 0
    assert session.authenticated and session.principal == "User:alice"
    assert session.admits(3) and session.admits(0)


@pytest.mark.parametrize("mechanism", sorted(sasl.SCRAM_HASHES))
def test_wrong_password_and_unknown_user_fail_alike(mechanism: str) -> None:
    answers = []
    for user, password in (("alice", "wrong"), ("mallory", "alice-secret")):
        session = auth.ClientSession("10.0.0.9", sasl_listener=True)
        outcome = scram(session, user, password, mechanism)
        assert outcome.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert session.state is auth.SessionState.FAILED and session.user == user
        assert not session.admits(18) and not session.admits(36)
        assert "secret" not in (outcome.message or "") and password not in (outcome.message or "")
        answers.append(outcome.message)
    assert answers[0] == answers[1]


def test_plain_checks_the_password_against_the_scram_keys() -> None:
    session = auth.ClientSession("h", sasl_listener=True)
    assert session.handshake(sasl.PLAIN, authenticator(), "n").error_code == 0
    assert session.authenticate(b"\0alice\0alice-secret").error_code == 0
    assert session.principal == "User:alice"
    bad = auth.ClientSession("h", sasl_listener=True)
    bad.handshake(sasl.PLAIN, authenticator(), "n")
    assert bad.authenticate(b"\0alice\0nope").error_code == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_a_mechanism_not_enabled_is_refused_and_another_may_follow() -> None:
    session = auth.ClientSession("h", sasl_listener=True)
    only_scram = authenticator((sasl.SCRAM_SHA_256,))
    refused = session.handshake(sasl.PLAIN, only_scram, "n")
    assert refused.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert "SCRAM-SHA-256" in (refused.message or "")
    assert session.handshake(sasl.SCRAM_SHA_256, only_scram, "n").error_code == 0


def test_out_of_order_and_listener_without_sasl_are_illegal_state() -> None:
    plain = auth.ClientSession("h", sasl_listener=False)
    assert plain.authenticated and plain.principal == auth.ANONYMOUS
    assert plain.handshake(sasl.PLAIN, authenticator(), "n").error_code == (
        ErrorCode.ILLEGAL_SASL_STATE
    )
    assert plain.authenticate(b"x").error_code == ErrorCode.ILLEGAL_SASL_STATE
    early = auth.ClientSession("h", sasl_listener=True)
    assert early.authenticate(b"\0alice\0alice-secret").error_code == (ErrorCode.ILLEGAL_SASL_STATE)
    done = auth.ClientSession("h", sasl_listener=True)
    assert scram(done, "alice", "alice-secret", sasl.SCRAM_SHA_256).error_code == 0
    assert done.handshake(sasl.SCRAM_SHA_256, authenticator(), "n").error_code == (
        ErrorCode.ILLEGAL_SASL_STATE
    )


def test_failures_from_one_address_slow_down_and_are_forgotten() -> None:
    throttle = auth.FailureThrottle(100)
    delays = [throttle.failed("10.0.0.1", now_ms=1_000 * i) for i in range(8)]
    assert delays == [100, 200, 400, 800, 1600, 3200, 5000, 5000]
    assert throttle.failed("10.0.0.2", now_ms=8_000) == 100  # another address is not slowed
    later = 7_000 + auth.FAILURE_WINDOW_MS + 1
    assert throttle.failed("10.0.0.1", now_ms=later) == 100  # the window passed
    throttle.failed("10.0.0.1", now_ms=later + 1)
    throttle.succeeded("10.0.0.1")
    assert throttle.failed("10.0.0.1", now_ms=later + 2) == 100
    assert auth.FailureThrottle(0).failed("a", 0) == 0


def test_the_throttle_remembers_a_bounded_number_of_addresses() -> None:
    throttle = auth.FailureThrottle(10)
    for i in range(auth.FAILURE_ADDRESSES_MAX + 50):
        throttle.failed(f"a{i}", now_ms=0)
    assert len(throttle._failures) == auth.FAILURE_ADDRESSES_MAX
    assert throttle.failed("a0", now_ms=1) == 10  # forgotten first: counts from one again
