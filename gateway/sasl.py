"""Pure SASL mechanisms for a gateway's SaslAuthenticate exchange, sans-IO: client bytes in,
server bytes out. PLAIN (RFC 4616) and SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677), as
Kafka's brokers speak them (KIP-84). Randomness is the caller's: a server takes its nonce, a
credential its salt, so tests replay the RFCs' exchanges byte for byte.

Decisions:
- Credentials are stored as SCRAM keys only (salt, iterations, StoredKey, ServerKey: RFC 5802
  section 3), never a password. PLAIN checks a password against the same keys (it derives the
  StoredKey with the credential's salt and iterations), so a user created once authenticates
  with PLAIN or SCRAM, and nothing stored lets anyone log in.
- An unknown user gets a normal server-first message, with a salt derived from the user name and
  the caller's ``mask_key`` (stable across attempts), and fails at the proof exactly as a wrong
  password does: the exchange does not tell which users exist.
- Every malformed, oversized or out-of-order message raises SaslAuthenticationFailedError (the
  gateway answers SASL_AUTHENTICATION_FAILED and closes the connection); the messages name what
  was wrong, never a secret. Proofs are compared in constant time.
- No channel binding (Kafka's brokers have none): a client that requires it (``p=``) is refused;
  an authorization identity (``a=``) must name the authenticated user, as Kafka requires.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from raylog.actors.control.scram import (
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    SCRAM_HASHES,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    salted_password,
    scram_keys,
    valid_user_name,
)
from raylog.storage.errors import (
    InvalidConfigError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)

# SCRAM_SHA_256, SCRAM_SHA_512, SCRAM_HASHES, ITERATIONS_MIN/MAX and the key math are
# actors/control/scram.py's (the controller and the CLI use them too), and public names here.
PLAIN = "PLAIN"
MECHANISMS = (SCRAM_SHA_512, SCRAM_SHA_256, PLAIN)  # SaslHandshake's answer, strongest first
SALT_BYTES_MIN = 16
AUTH_BYTES_MAX = 4096  # one SaslAuthenticate message; real ones are under 300 bytes

FAILED = "authentication failed: invalid credentials"  # the one answer to a wrong secret


@dataclass(frozen=True)
class ScramCredential:
    """What is stored for one user and mechanism (RFC 5802 section 3; Kafka's
    ScramCredential): enough to verify a proof and to prove the server knows the user, not
    enough to log in."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def _hash_name(mechanism: str) -> str:
    name = SCRAM_HASHES.get(mechanism)
    if name is None:
        raise UnsupportedSaslMechanismError(f"unsupported SCRAM mechanism {mechanism!r}")
    return name


def _hmac(hash_name: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hash_name).digest()


def _keys(mechanism: str, password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) of ``password`` (RFC 5802 section 3; scram.py's math)."""
    return scram_keys(mechanism, salted_password(mechanism, password, salt, iterations))


def scram_credential(
    mechanism: str, password: str, salt: bytes, iterations: int = ITERATIONS_MIN
) -> ScramCredential:
    """The credential to store for ``password`` (``salt``: fresh random bytes per credential,
    at least SALT_BYTES_MIN)."""
    _hash_name(mechanism)  # refuses a mechanism that is not a SCRAM one
    if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise InvalidConfigError(
            f"SCRAM iterations must be in [{ITERATIONS_MIN}, {ITERATIONS_MAX}], got {iterations}"
        )
    if len(salt) < SALT_BYTES_MIN:
        raise InvalidConfigError(f"a SCRAM salt needs at least {SALT_BYTES_MIN} bytes")
    if not password:
        raise InvalidConfigError("a SCRAM password may not be empty")
    stored_key, server_key = _keys(mechanism, password, salt, iterations)
    return ScramCredential(mechanism, salt, iterations, stored_key, server_key)


def password_matches(credential: ScramCredential, password: str) -> bool:
    """Whether ``password`` is the one ``credential`` was made from (constant-time compare)."""
    _hash_name(credential.mechanism)  # refuses a mechanism that is not a SCRAM one
    stored_key, _ = _keys(credential.mechanism, password, credential.salt, credential.iterations)
    return hmac.compare_digest(stored_key, credential.stored_key)


# A user's credentials by mechanism; None (or no entry) for an unknown user.
CredentialLookup = Callable[[str, str], ScramCredential | None]


def _text(message: bytes) -> str:
    if len(message) > AUTH_BYTES_MAX:
        raise SaslAuthenticationFailedError(
            f"SASL message of {len(message)} bytes exceeds {AUTH_BYTES_MAX}"
        )
    try:
        return message.decode()
    except UnicodeDecodeError:
        raise SaslAuthenticationFailedError("SASL message is not UTF-8") from None


def _checked_name(name: str) -> str:
    if not valid_user_name(name):
        raise SaslAuthenticationFailedError("invalid user name")
    return name


class PlainServer:
    """PLAIN (RFC 4616): one client message ``authzid NUL authcid NUL password``."""

    mechanism = PLAIN

    def __init__(self, lookup: CredentialLookup) -> None:
        self._lookup = lookup
        self._used = False
        self.user = ""  # the user named, once a message named one (for log lines)
        self.principal: str | None = None
        self.done = False  # authenticated

    def step(self, message: bytes) -> bytes:
        if self._used:
            raise SaslAuthenticationFailedError("PLAIN takes one message")
        self._used = True
        parts = _text(message).split("\0")
        if len(parts) != 3:
            raise SaslAuthenticationFailedError("PLAIN message is not authzid NUL user NUL pass")
        authzid, user, password = parts
        user = self.user = _checked_name(user)
        if authzid and authzid != user:
            raise SaslAuthenticationFailedError("authorization id must be the user's own")
        if not password:
            raise SaslAuthenticationFailedError("empty password")
        # Every mechanism's credential is tried, so a user made for one authenticates.
        found = [c for m in SCRAM_HASHES if (c := self._lookup(user, m)) is not None]
        if not any(password_matches(c, password) for c in found):
            raise SaslAuthenticationFailedError(FAILED)
        self.principal = user
        self.done = True
        return b""


def _attributes(text: str, what: str) -> list[tuple[str, str]]:
    """``k=v,k=v`` into pairs (values may contain '='); each key one letter."""
    pairs = []
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if len(key) != 1 or not eq:
            raise SaslAuthenticationFailedError(f"malformed SCRAM {what}")
        pairs.append((key, value))
    return pairs


def _unescape_name(value: str) -> str:
    """RFC 5802 saslname: '=2C' is ',', '=3D' is '='; any other '=' is invalid."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "=":
            code = value[i + 1 : i + 3]
            if code not in ("2C", "3D"):
                raise SaslAuthenticationFailedError("invalid escape in SCRAM user name")
            out.append("," if code == "2C" else "=")
            i += 3
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _b64(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise SaslAuthenticationFailedError(f"SCRAM {what} is not base64") from None


def _printable_nonce(nonce: str) -> bool:
    # RFC 5802: printable ASCII except ','.
    return bool(nonce) and all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


class ScramServer:
    """The server side of one SCRAM exchange: ``step(client-first)`` answers the server-first
    message, ``step(client-final)`` the server-final one; then ``done`` (authenticated) and
    ``principal``. A message that fails ends the exchange: every later one fails too.

    ``nonce``: the server's part of the nonce, fresh random printable characters per exchange.
    ``mask_key``: a secret of the server's, for the salts shown for unknown users."""

    def __init__(self, mechanism: str, lookup: CredentialLookup, nonce: str, mask_key: bytes):
        self.mechanism = mechanism
        self._hash = _hash_name(mechanism)
        if not _printable_nonce(nonce):
            raise ValueError("a server nonce is printable ASCII without ','")
        self._lookup = lookup
        self._server_nonce = nonce
        self._mask_key = mask_key
        self._state = "first"
        self._credential: ScramCredential | None = None
        self.user = ""  # the user named, once the client-first named one (for log lines)
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self.principal: str | None = None
        self.done = False

    def step(self, message: bytes) -> bytes:
        state, self._state = self._state, "ended"  # until a handler accepts the message
        if state == "first":
            return self._on_client_first(_text(message))
        if state == "final":
            return self._on_client_final(_text(message))
        raise SaslAuthenticationFailedError("SCRAM exchange already ended")

    def _on_client_first(self, text: str) -> bytes:
        # gs2-header: "n," or "y," (no channel binding here), then "a=authzid" or nothing, ",".
        cbind, _, rest = text.partition(",")
        authzid_field, _, bare = rest.partition(",")
        if cbind.startswith("p="):
            raise SaslAuthenticationFailedError("SCRAM channel binding is not supported")
        if cbind not in ("n", "y") or not bare:
            raise SaslAuthenticationFailedError("malformed SCRAM client-first message")
        attrs = _attributes(bare, "client-first message")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
            raise SaslAuthenticationFailedError("SCRAM client-first must start n=user,r=nonce")
        if any(k == "m" for k, _ in attrs):
            raise SaslAuthenticationFailedError("SCRAM mandatory extensions are not supported")
        user = _checked_name(_unescape_name(attrs[0][1]))
        if authzid_field and (
            not authzid_field.startswith("a=") or _unescape_name(authzid_field[2:]) != user
        ):
            raise SaslAuthenticationFailedError("authorization id must be the user's own")
        client_nonce = attrs[1][1]
        if not _printable_nonce(client_nonce):
            raise SaslAuthenticationFailedError("invalid SCRAM client nonce")
        credential = self._lookup(user, self.mechanism)
        if credential is not None and credential.mechanism != self.mechanism:
            credential = None
        self._credential = credential
        if credential is None:  # answered as for a user, failed at the proof
            salt = _hmac(self._hash, self._mask_key, user.encode())[:SALT_BYTES_MIN]
            iterations = ITERATIONS_MIN
        else:
            salt, iterations = credential.salt, credential.iterations
        self.user = user
        self._gs2_header = f"{cbind},{authzid_field},"
        self._client_first_bare = bare
        self._nonce = client_nonce + self._server_nonce
        salt_b64 = base64.b64encode(salt).decode()
        self._server_first = f"r={self._nonce},s={salt_b64},i={iterations}"
        self._state = "final"
        return self._server_first.encode()

    def _on_client_final(self, text: str) -> bytes:
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise SaslAuthenticationFailedError("SCRAM client-final message has no proof")
        attrs = _attributes(without_proof, "client-final message")
        if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise SaslAuthenticationFailedError("SCRAM client-final message must start c=...,r=...")
        if _b64(attrs[0][1], "channel binding") != self._gs2_header.encode():
            raise SaslAuthenticationFailedError(
                "SCRAM channel binding differs from the client-first"
            )
        # Kafka's check (ScramSaslServer): the nonce ends with the server-first's. librdkafka
        # before 2.1 sends its own nonce again in front of it, and Kafka's brokers accept that;
        # the fresh server part is there either way, so a replayed exchange still fails.
        if not attrs[1][1].endswith(self._nonce):
            raise SaslAuthenticationFailedError("SCRAM nonce does not match")
        proof = _b64(proof_b64, "proof")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        credential = self._credential
        if credential is None:
            raise SaslAuthenticationFailedError(FAILED)
        signature = _hmac(self._hash, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise SaslAuthenticationFailedError(FAILED)
        client_key = bytes(p ^ s for p, s in zip(proof, signature, strict=True))
        if not hmac.compare_digest(
            hashlib.new(self._hash, client_key).digest(), credential.stored_key
        ):
            raise SaslAuthenticationFailedError(FAILED)
        server_signature = _hmac(self._hash, credential.server_key, auth_message)
        self.done = True
        self.principal = self.user
        return b"v=" + base64.b64encode(server_signature)


def new_server(
    mechanism: str, lookup: CredentialLookup, nonce: str, mask_key: bytes
) -> PlainServer | ScramServer:
    """The server for a mechanism a client chose in SaslHandshake."""
    if mechanism == PLAIN:
        return PlainServer(lookup)
    if mechanism in SCRAM_HASHES:
        return ScramServer(mechanism, lookup, nonce, mask_key)
    raise UnsupportedSaslMechanismError(
        f"unsupported SASL mechanism {mechanism!r}; enabled: {', '.join(MECHANISMS)}"
    )
