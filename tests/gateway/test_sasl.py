"""The SASL mechanisms (gateway/sasl.py): SCRAM replays RFC 7677's exchange byte for byte and
authenticates kafka-python's own SCRAM client (SHA-256 and SHA-512), which checks our server
signature; wrong passwords and unknown users fail alike, with the same salt shown for a user
every time; PLAIN checks passwords against the stored SCRAM keys; every malformed, oversized or
out-of-order message is refused with SASL_AUTHENTICATION_FAILED and nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.net.sasl.scram import ScramClient

from raylog.gateway import sasl
from raylog.gateway.sasl import (
    PLAIN,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    PlainServer,
    ScramCredential,
    ScramServer,
    new_server,
    scram_credential,
)
from raylog.storage.errors import (
    InvalidConfigError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)

MASK_KEY = b"m" * 32
SERVER_NONCE = "3rfcNHYJY1ZVvWVs7j"


def lookup_of(*credentials: tuple[str, ScramCredential]):  # type: ignore[no-untyped-def]
    table = {(user, c.mechanism): c for user, c in credentials}
    return lambda user, mechanism: table.get((user, mechanism))


def credential(mechanism: str, password: str) -> ScramCredential:
    return scram_credential(mechanism, password, os.urandom(16))


def exchange(server: ScramServer, client: ScramClient) -> None:
    """kafka-python's client against our server; raises what either side raises."""
    client.process_server_first_message(server.step(client.first_message()))
    client.process_server_final_message(server.step(client.final_message()))


def test_scram_sha_256_replays_rfc_7677() -> None:
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    stored = scram_credential(SCRAM_SHA_256, "pencil", salt, 4096)
    server = ScramServer(
        SCRAM_SHA_256, lookup_of(("user", stored)), "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0", MASK_KEY
    )
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    assert server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == (
        f"r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".encode()
    )
    proof = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    final = server.step(f"c=biws,r={nonce},p={proof}".encode())
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.done and server.principal == "user"


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
def test_kafka_pythons_scram_client_authenticates_and_accepts_our_signature(
    mechanism: str,
) -> None:
    lookup = lookup_of(("alice", credential(mechanism, "correct horse")))
    server = ScramServer(mechanism, lookup, SERVER_NONCE, MASK_KEY)
    exchange(server, ScramClient("alice", "correct horse", mechanism))
    assert server.done and server.principal == "alice"


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
def test_a_wrong_password_and_an_unknown_user_fail_alike(mechanism: str) -> None:
    lookup = lookup_of(("alice", credential(mechanism, "correct horse")))
    failures = []
    for user, password in (("alice", "wrong"), ("mallory", "correct horse")):
        server = ScramServer(mechanism, lookup, SERVER_NONCE, MASK_KEY)
        with pytest.raises(SaslAuthenticationFailedError) as failed:
            exchange(server, ScramClient(user, password, mechanism))
        assert not server.done and server.principal is None
        assert "horse" not in str(failed.value)
        failures.append(str(failed.value))
    assert failures[0] == failures[1] == sasl.FAILED


def test_an_unknown_user_is_shown_the_same_salt_every_time() -> None:
    def salt_shown(user: str, mask_key: bytes) -> str:
        server = ScramServer(SCRAM_SHA_512, lookup_of(), SERVER_NONCE, mask_key)
        first = server.step(f"n,,n={user},r=clientnonce".encode()).decode()
        return dict(item.split("=", 1) for item in first.split(","))["s"]

    assert salt_shown("mallory", MASK_KEY) == salt_shown("mallory", MASK_KEY)
    assert salt_shown("mallory", MASK_KEY) != salt_shown("trudy", MASK_KEY)
    assert salt_shown("mallory", MASK_KEY) != salt_shown("mallory", b"other key")


def test_a_credential_of_another_mechanism_does_not_answer() -> None:
    lookup = lookup_of(("alice", credential(SCRAM_SHA_256, "pw")))
    server = ScramServer(SCRAM_SHA_512, lookup, SERVER_NONCE, MASK_KEY)
    with pytest.raises(SaslAuthenticationFailedError):
        exchange(server, ScramClient("alice", "pw", SCRAM_SHA_512))


def rfc_5802_proof(hash_name: str, password: str, server_first: str, auth_message: str) -> bytes:
    """A client's proof, computed here from RFC 5802's formulas (independent of sasl.py)."""
    fields = dict(item.split("=", 1) for item in server_first.split(","))
    salt, iterations = base64.b64decode(fields["s"]), int(fields["i"])
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hash_name).digest()
    stored_key = hashlib.new(hash_name, client_key).digest()
    signature = hmac.new(stored_key, auth_message.encode(), hash_name).digest()
    return bytes(a ^ b for a, b in zip(client_key, signature, strict=True))


def test_escaped_user_names_and_an_authzid_naming_the_user() -> None:
    # User "a,b=c" is written a=2Cb=3Dc (RFC 5802); kafka-python's client does not escape.
    lookup = lookup_of(("a,b=c", credential(SCRAM_SHA_256, "pw")))
    server = ScramServer(SCRAM_SHA_256, lookup, SERVER_NONCE, MASK_KEY)
    gs2_header, bare = "n,a=a=2Cb=3Dc,", "n=a=2Cb=3Dc,r=abc"
    server_first = server.step(f"{gs2_header}{bare}".encode()).decode()
    binding = base64.b64encode(gs2_header.encode()).decode()
    without_proof = f"c={binding},r=abc{SERVER_NONCE}"
    proof = rfc_5802_proof("sha256", "pw", server_first, f"{bare},{server_first},{without_proof}")
    answer = server.step(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
    assert answer.startswith(b"v=") and server.principal == "a,b=c"


@pytest.mark.parametrize(
    "first",
    [
        b"",
        b"\xff\xfe",
        b"n,,",
        b"p=tls-unique,,n=alice,r=abc",  # channel binding required
        b"x,,n=alice,r=abc",
        b"n,,r=abc,n=alice",  # order
        b"n,,n=alice",  # no nonce
        b"n,,n=alice,r=",  # empty nonce
        b"n,,n=alice,r=a,b",  # malformed attribute
        b"n,,n=al=2Xice,r=abc",  # bad escape
        b"n,,n=,r=abc",  # empty user
        b"n,a=bob,n=alice,r=abc",  # acting as someone else
        b"n,,n=alice,r=abc,m=ext",  # mandatory extension
        b"n,,n=alice,r=abc" + b"x" * sasl.AUTH_BYTES_MAX,  # oversized
    ],
)
def test_malformed_client_first_messages_are_refused(first: bytes) -> None:
    lookup = lookup_of(("alice", credential(SCRAM_SHA_256, "pw")))
    server = ScramServer(SCRAM_SHA_256, lookup, SERVER_NONCE, MASK_KEY)
    with pytest.raises(SaslAuthenticationFailedError):
        server.step(first)
    with pytest.raises(SaslAuthenticationFailedError):  # and the exchange is over
        server.step(b"n,,n=alice,r=abc")


def _final_variants(nonce: str) -> list[bytes]:
    return [
        b"",
        f"c=biws,r={nonce}".encode(),  # no proof
        f"c=biws,r={nonce}x,p=AAAA".encode(),  # another nonce
        f"c=eSws,r={nonce},p=AAAA".encode(),  # another channel binding ("y,,")
        f"c=biws,r={nonce},p=***".encode(),  # not base64
        f"c=biws,r={nonce},p=AAAA".encode(),  # a proof of the wrong length
        f"r={nonce},c=biws,p=AAAA".encode(),  # order
    ]


@pytest.mark.parametrize("index", range(7))
def test_malformed_client_final_messages_are_refused(index: int) -> None:
    lookup = lookup_of(("alice", credential(SCRAM_SHA_256, "pw")))
    server = ScramServer(SCRAM_SHA_256, lookup, SERVER_NONCE, MASK_KEY)
    server.step(b"n,,n=alice,r=abc")
    with pytest.raises(SaslAuthenticationFailedError):
        server.step(_final_variants("abc" + SERVER_NONCE)[index])
    assert not server.done and server.principal is None


def test_a_finished_exchange_takes_no_more_messages() -> None:
    lookup = lookup_of(("alice", credential(SCRAM_SHA_256, "pw")))
    server = ScramServer(SCRAM_SHA_256, lookup, SERVER_NONCE, MASK_KEY)
    exchange(server, ScramClient("alice", "pw", SCRAM_SHA_256))
    with pytest.raises(SaslAuthenticationFailedError):
        server.step(b"n,,n=alice,r=abc")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_arbitrary_bytes_only_ever_fail_as_authentication_failures(
    first: bytes, final: bytes
) -> None:
    lookup = lookup_of(("alice", scram_credential(SCRAM_SHA_256, "pw", b"s" * 16)))
    for server in (
        ScramServer(SCRAM_SHA_256, lookup, SERVER_NONCE, MASK_KEY),
        PlainServer(lookup),
    ):
        try:
            server.step(first)
            server.step(final)
        except SaslAuthenticationFailedError:
            pass
        assert not server.done or server.principal == "alice"


def test_plain_checks_the_password_against_the_stored_scram_keys() -> None:
    lookup = lookup_of(("alice", credential(SCRAM_SHA_512, "pw")))
    server = PlainServer(lookup)
    assert server.step(b"\0alice\0pw") == b"" and server.principal == "alice"
    assert PlainServer(lookup).step(b"alice\0alice\0pw") == b""
    for message in (
        b"\0alice\0wrong",
        b"\0mallory\0pw",
        b"bob\0alice\0pw",  # acting as someone else
        b"\0alice\0",
        b"alice\0pw",
        b"\0\0pw",
        b"\0alice\0pw\0",
    ):
        with pytest.raises(SaslAuthenticationFailedError):
            PlainServer(lookup).step(message)
    with pytest.raises(SaslAuthenticationFailedError):  # one message only
        server.step(b"\0alice\0pw")


def test_credentials_are_checked_and_hold_no_password() -> None:
    stored = scram_credential(SCRAM_SHA_256, "hunter22", os.urandom(16))
    assert b"hunter22" not in repr(stored).encode()
    assert sasl.password_matches(stored, "hunter22")
    assert not sasl.password_matches(stored, "hunter23")
    with pytest.raises(InvalidConfigError):
        scram_credential(SCRAM_SHA_256, "pw", os.urandom(16), iterations=1000)
    with pytest.raises(InvalidConfigError):
        scram_credential(SCRAM_SHA_256, "pw", os.urandom(16), iterations=100_000)
    with pytest.raises(InvalidConfigError):
        scram_credential(SCRAM_SHA_256, "pw", b"short")
    with pytest.raises(InvalidConfigError):
        scram_credential(SCRAM_SHA_256, "", os.urandom(16))
    with pytest.raises(UnsupportedSaslMechanismError):
        scram_credential("SCRAM-SHA-1", "pw", os.urandom(16))


def test_new_server_by_mechanism() -> None:
    lookup = lookup_of()
    assert isinstance(new_server(PLAIN, lookup, SERVER_NONCE, MASK_KEY), PlainServer)
    assert isinstance(new_server(SCRAM_SHA_512, lookup, SERVER_NONCE, MASK_KEY), ScramServer)
    with pytest.raises(UnsupportedSaslMechanismError) as refused:
        new_server("GSSAPI", lookup, SERVER_NONCE, MASK_KEY)
    assert "SCRAM-SHA-512" in str(refused.value)
    with pytest.raises(ValueError):
        ScramServer(SCRAM_SHA_256, lookup, "bad,nonce", MASK_KEY)


def _client_final(
    mechanism: str, password: str, client_nonce: str, server_first: str, nonce: str
) -> str:
    """A client-final message proving ``password`` for the given server-first, with ``nonce`` as
    its ``r=`` (RFC 5802's computation, as any client does)."""
    attrs = dict(item.split("=", 1) for item in server_first.split(","))
    name = sasl.SCRAM_HASHES[mechanism]
    salted = hashlib.pbkdf2_hmac(
        name, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    without_proof = f"c=biws,r={nonce}"
    auth_message = f"n=alice,r={client_nonce},{server_first},{without_proof}".encode()
    signature = hmac.new(stored_key, auth_message, name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}"


@pytest.mark.parametrize(
    ("nonce_of", "accepted"),
    [
        (lambda client, combined: combined, True),
        # librdkafka before 2.1: its own nonce again in front (Kafka's brokers accept it).
        (lambda client, combined: client + combined, True),
        (lambda client, combined: combined[:-1], False),  # the server part cut short
        (lambda client, combined: client, False),  # no server part at all
    ],
)
def test_the_final_nonce_must_end_with_the_server_first_nonce(nonce_of, accepted) -> None:  # type: ignore[no-untyped-def]
    credential = scram_credential(SCRAM_SHA_256, "pw", os.urandom(16))
    server = ScramServer(SCRAM_SHA_256, lookup_of(("alice", credential)), "srv0nce", MASK_KEY)
    server_first = server.step(b"n,,n=alice,r=cl1ent").decode()
    combined = server_first.split(",")[0][2:]
    final = _client_final(SCRAM_SHA_256, "pw", "cl1ent", server_first, nonce_of("cl1ent", combined))
    if accepted:
        assert server.step(final.encode()).startswith(b"v=") and server.done
    else:
        with pytest.raises(SaslAuthenticationFailedError, match="nonce"):
            server.step(final.encode())
        assert not server.done
