"""Pure: how a client connection authenticates, sans-IO (SaslHandshake, SaslAuthenticate).

One :class:`ClientSession` per connection, one :class:`Authenticator` per gateway. A connection on
a SASL listener starts unauthenticated and, as Kafka's SaslServerAuthenticator, admits only
ApiVersions, SaslHandshake (v1: the mechanism) and SaslAuthenticate (the mechanism's messages)
until the exchange succeeds; any other request closes the connection. A connection on a
listener without SASL is authenticated from the start, as ``User:ANONYMOUS`` (or, on SSL with a
client certificate, the certificate's principal), and SaslHandshake / SaslAuthenticate are
ILLEGAL_SASL_STATE there, and after a completed exchange, as in Kafka.

A failed exchange is answered SASL_AUTHENTICATION_FAILED with a message that names no secret;
the server then closes the connection after ``delay_ms`` (:class:`FailureThrottle`): Kafka's
``connection.failed.authentication.delay.ms``, doubled for each further failure from the same
address within :data:`FAILURE_WINDOW_MS`, so a password guesser from one address slows down.

Time, nonces and credentials are the caller's: this module decides, the server does the I/O.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from raylog.gateway import sasl
from raylog.gateway.errors import ErrorCode
from raylog.storage.errors import RaylogError

__all__ = [
    "ANONYMOUS",
    "Authenticator",
    "ClientSession",
    "FailureThrottle",
    "Outcome",
    "SessionState",
]

ANONYMOUS = "User:ANONYMOUS"
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
PRE_AUTHENTICATION_APIS = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})
FAILURE_WINDOW_MS = 60_000  # failures further apart than this do not add up
FAILURE_DELAY_MAX_MS = 5_000
FAILURE_ADDRESSES_MAX = 10_000  # addresses remembered; the oldest are forgotten first


class SessionState(enum.Enum):
    HANDSHAKE = "handshake"  # SASL listener: waiting for SaslHandshake
    AUTHENTICATE = "authenticate"  # mechanism chosen: SaslAuthenticate messages
    AUTHENTICATED = "authenticated"
    FAILED = "failed"  # answered SASL_AUTHENTICATION_FAILED: close once it is sent


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to answer a SaslHandshake or SaslAuthenticate with."""

    error_code: int = ErrorCode.NONE
    message: str | None = None
    auth_bytes: bytes = b""


class FailureThrottle:
    """How long to hold a failed authentication's answer, per client address."""

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self._failures: OrderedDict[str, tuple[int, int]] = OrderedDict()  # address: n, last

    def failed(self, address: str, now_ms: int) -> int:
        """Record a failure from ``address``; the delay before answering it."""
        count, last_ms = self._failures.pop(address, (0, now_ms))
        count = count + 1 if now_ms - last_ms <= FAILURE_WINDOW_MS else 1
        self._failures[address] = (count, now_ms)
        while len(self._failures) > FAILURE_ADDRESSES_MAX:
            self._failures.popitem(last=False)
        if self.delay_ms <= 0:
            return 0
        return min(self.delay_ms << min(count - 1, 16), max(FAILURE_DELAY_MAX_MS, self.delay_ms))

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)


class Authenticator:
    """A gateway's SASL settings: its enabled mechanisms, where credentials come from, the key
    that masks unknown users' salts (the same on every gateway of the cluster, so that comparing
    brokers' answers does not tell which users exist), and the failure throttle."""

    def __init__(
        self,
        lookup: sasl.CredentialLookup,
        mask_key: bytes,
        mechanisms: Iterable[str] = sasl.MECHANISMS,
        failure_delay_ms: int = 100,
    ) -> None:
        self.lookup = lookup
        self.mask_key = mask_key
        enabled = set(mechanisms)
        self.mechanisms = tuple(m for m in sasl.MECHANISMS if m in enabled)  # strongest first
        self.throttle = FailureThrottle(failure_delay_ms)


class ClientSession:
    """One connection's authentication state."""

    def __init__(self, peer_host: str, sasl_listener: bool, principal: str = ANONYMOUS) -> None:
        self.peer_host = peer_host
        self.sasl_listener = sasl_listener
        self.state = SessionState.HANDSHAKE if sasl_listener else SessionState.AUTHENTICATED
        self.principal = principal if not sasl_listener else ""
        self.mechanism = ""
        self.user = ""  # the user an exchange named, for log lines (authenticated or not)
        self.failure = ""  # why the exchange failed (what the client was told: no secret)
        self._server: sasl.PlainServer | sasl.ScramServer | None = None

    @property
    def authenticated(self) -> bool:
        return self.state is SessionState.AUTHENTICATED

    def admits(self, api_key: int) -> bool:
        """Whether a request may be served in this state (else: close the connection)."""
        return self.authenticated or (
            self.state is not SessionState.FAILED and api_key in PRE_AUTHENTICATION_APIS
        )

    def handshake(self, mechanism: str, authenticator: Authenticator, nonce: str) -> Outcome:
        """SaslHandshake: choose ``mechanism``. ``nonce``: fresh random printable characters
        (SCRAM's server nonce)."""
        if self.state is not SessionState.HANDSHAKE:
            return Outcome(ErrorCode.ILLEGAL_SASL_STATE, self._illegal("SaslHandshake"))
        if mechanism not in authenticator.mechanisms:
            # Kafka answers with the enabled mechanisms and leaves the connection open for a
            # second handshake.
            return Outcome(
                ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                f"unsupported SASL mechanism {mechanism!r}; enabled: "
                f"{', '.join(authenticator.mechanisms)}",
            )
        self._server = sasl.new_server(
            mechanism, authenticator.lookup, nonce, authenticator.mask_key
        )
        self.mechanism = mechanism
        self.state = SessionState.AUTHENTICATE
        return Outcome()

    def refuse(self, why: str) -> None:
        """End the exchange as failed (the server closes once the answer is sent)."""
        self.state = SessionState.FAILED
        self._server = None
        self.failure = why

    def authenticate(self, auth_bytes: bytes) -> Outcome:
        """SaslAuthenticate: one message of the exchange. The mechanisms are CPU-bound for
        at most a few PBKDF2 rounds (PLAIN): callers may run this in a thread."""
        server = self._server
        if self.state is not SessionState.AUTHENTICATE or server is None:
            return Outcome(ErrorCode.ILLEGAL_SASL_STATE, self._illegal("SaslAuthenticate"))
        try:
            answer = server.step(auth_bytes)
        except RaylogError as exc:  # SaslAuthenticationFailedError: the message names no secret
            self.user = server.user
            self.refuse(str(exc))
            return Outcome(ErrorCode.SASL_AUTHENTICATION_FAILED, self.failure)
        self.user = server.user
        if server.done:
            self.state = SessionState.AUTHENTICATED
            self.principal = f"User:{server.principal}"
            self._server = None
        return Outcome(auth_bytes=answer)

    def _illegal(self, api: str) -> str:
        if not self.sasl_listener:
            return f"{api} on a listener without SASL"
        return f"unexpected {api} in state {self.state.value}"
