"""Pure client side of reaching a Kafka-compatible cluster: how a link says to reach its source
(:class:`LinkSecurity`, from Kafka client config names) and the client steps of SASL PLAIN
(RFC 4616) and SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677), sans-IO: server bytes in,
client bytes out. Randomness is the caller's (the SCRAM client nonce is an argument), so tests
run the exchange against the gateway's server byte for byte.

Secrets: the password is never in a repr, an error message or a log line.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from raylog.actors.control.scram import (
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    SCRAM_HASHES,
    salted_password,
    scram_keys,
)

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
PLAIN = "PLAIN"
MECHANISMS = (PLAIN, *SCRAM_HASHES)
# ssl.endpoint.identification.algorithm: Kafka's default "https" checks the host name; "" (and
# librdkafka's "none") turn the check off.
_HOSTNAME_CHECK = {"https": True, "": False, "none": False}
# Java's sasl.jaas.config: `<LoginModule class> required key="value" ...;`
_JAAS = re.compile(r"^\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s+(.*?)\s*;?\s*$")
_JAAS_OPTION = re.compile(r'\s*(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s"]+))')
_JAAS_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": PLAIN,
    "org.apache.kafka.common.security.scram.ScramLoginModule": "SCRAM",
}


class ScramClientError(ValueError):
    """The server's SCRAM messages are malformed, refuse the exchange or fail its proof."""


@dataclass(frozen=True)
class LinkSecurity:
    """How to reach a link's source cluster: Kafka's security.protocol, the SASL mechanism and
    credentials, and the TLS trust. Checked on construction (ValueError naming the problem)."""

    protocol: str = PLAINTEXT  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: str = ""  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    username: str = ""
    password: str = field(default="", repr=False)
    ssl_cafile: str = ""  # PEM file; "" = the system's default trust
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(
                f"security.protocol must be one of {', '.join(PROTOCOLS)}, not {self.protocol!r}"
            )
        if not self.sasl:
            return
        if self.sasl_mechanism not in MECHANISMS:
            raise ValueError(
                f"security.protocol={self.protocol} needs sasl.mechanism, one of "
                f"{', '.join(MECHANISMS)}; got {self.sasl_mechanism!r}"
            )
        if not self.username or not self.password:
            raise ValueError(
                f"sasl.mechanism={self.sasl_mechanism} needs a user name and a password "
                "(sasl.username / sasl.password, or sasl.jaas.config)"
            )

    @property
    def sasl(self) -> bool:
        return self.protocol in (SASL_PLAINTEXT, SASL_SSL)

    @property
    def tls(self) -> bool:
        return self.protocol in (SSL, SASL_SSL)

    @classmethod
    def from_configs(cls, configs: Mapping[str, str]) -> LinkSecurity:
        """From Kafka client configs: security.protocol, sasl.mechanism, sasl.username and
        sasl.password (librdkafka's) or sasl.jaas.config (Java's PLAIN / SCRAM LoginModule),
        ssl.ca.location or ssl.truststore.location (PEM), ssl.endpoint.identification.algorithm.
        Other keys are ignored."""
        protocol = configs.get("security.protocol", PLAINTEXT).strip().upper()
        mechanism = configs.get("sasl.mechanism", "").strip().upper()
        username = configs.get("sasl.username", "")
        password = configs.get("sasl.password", "")
        jaas = configs.get("sasl.jaas.config", "")
        if jaas.strip():
            module, options = parse_jaas_config(jaas)
            if mechanism and (module == PLAIN) != (mechanism == PLAIN):
                raise ValueError(
                    f"sasl.jaas.config names a {module} login module but sasl.mechanism "
                    f"is {mechanism}"
                )
            if not mechanism and module == PLAIN:
                mechanism = PLAIN
            for key, given in (("username", username), ("password", password)):
                value = options.get(key, "")
                if given and value and given != value:
                    raise ValueError(f"sasl.{key} and sasl.jaas.config's {key} differ")
            username = username or options.get("username", "")
            password = password or options.get("password", "")
        cafile = configs.get("ssl.ca.location", "")
        truststore = configs.get("ssl.truststore.location", "")
        if cafile and truststore and cafile != truststore:
            raise ValueError("ssl.ca.location and ssl.truststore.location name different files")
        store_type = configs.get("ssl.truststore.type", "PEM").strip().upper()
        if truststore and store_type != "PEM":
            raise ValueError(f"ssl.truststore.type must be PEM, not {store_type!r}")
        algorithm = configs.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
        if algorithm not in _HOSTNAME_CHECK:
            raise ValueError(
                "ssl.endpoint.identification.algorithm must be https, none or empty, "
                f"not {algorithm!r}"
            )
        return cls(
            protocol=protocol,
            sasl_mechanism=mechanism,
            username=username,
            password=password,
            ssl_cafile=cafile or truststore,
            ssl_check_hostname=_HOSTNAME_CHECK[algorithm],
        )


def parse_jaas_config(text: str) -> tuple[str, dict[str, str]]:
    """(PLAIN or SCRAM, options) of a Kafka sasl.jaas.config naming PlainLoginModule or
    ScramLoginModule; ValueError (without the option values) for anything else."""
    match = _JAAS.match(text)
    if match is None:
        raise ValueError('sasl.jaas.config is not `<LoginModule> required key="value" ...;`')
    module = _JAAS_MODULES.get(match.group(1))
    if module is None:
        raise ValueError(
            f"sasl.jaas.config: login module {match.group(1)!r} is not supported "
            "(PlainLoginModule or ScramLoginModule)"
        )
    options: dict[str, str] = {}
    rest = match.group(3)
    pos = 0
    while pos < len(rest):  # bounded: each option consumes characters
        option = _JAAS_OPTION.match(rest, pos)
        if option is None:
            if rest[pos:].strip():
                raise ValueError('sasl.jaas.config: options must be key="value" pairs')
            break
        quoted, bare = option.group(2), option.group(3)
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        options[option.group(1)] = value
        pos = option.end()
    return module, options


def plain_message(username: str, password: str) -> bytes:
    """PLAIN's one message: empty authzid NUL user NUL password (RFC 4616)."""
    return f"\0{username}\0{password}".encode()


def _saslname(name: str) -> str:
    """RFC 5802's saslname: ',' as '=2C' and '=' as '=3D'."""
    return name.replace("=", "=3D").replace(",", "=2C")


def _attributes(text: str, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if len(key) != 1 or not eq:
            raise ScramClientError(f"malformed SCRAM {what}")
        out.setdefault(key, value)
    return out


class ScramClient:
    """The client side of one SCRAM exchange (RFC 5802 section 3, no channel binding, as Kafka
    speaks it): :meth:`first` is the client-first message, :meth:`final` answers the server's
    first message with the proof, :meth:`verify` checks the server's signature (the server
    proves it knows the credential too). ``nonce``: fresh printable characters per exchange."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str) -> None:
        if mechanism not in SCRAM_HASHES:
            raise ValueError(f"not a SCRAM mechanism: {mechanism!r}")
        if not nonce or any(not 0x21 <= ord(c) <= 0x7E or c == "," for c in nonce):
            raise ValueError("a SCRAM nonce is printable ASCII without ','")
        self.mechanism = mechanism
        self._hash = SCRAM_HASHES[mechanism]
        self._password = password
        self._nonce = nonce
        self._first_bare = f"n={_saslname(username)},r={nonce}"
        self._server_signature = b""

    def __repr__(self) -> str:
        return f"ScramClient({self.mechanism})"

    def first(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        try:
            text = server_first.decode()
        except UnicodeDecodeError:
            raise ScramClientError("SCRAM server-first message is not UTF-8") from None
        attrs = _attributes(text, "server-first message")
        if "e" in attrs:
            raise ScramClientError(f"SCRAM server refused: {attrs['e']}")
        nonce, salt_b64, iterations_text = attrs.get("r", ""), attrs.get("s"), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise ScramClientError("SCRAM server nonce does not extend the client's")
        if salt_b64 is None or not iterations_text.isdigit():
            raise ScramClientError("SCRAM server-first message lacks s= or i=")
        iterations = int(iterations_text)
        # Kafka's bounds (ScramMechanism's minimum; the most a Kafka broker stores): a server
        # asking for more would make the client burn CPU on its behalf.
        if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
            raise ScramClientError(
                f"SCRAM iterations {iterations} outside [{ITERATIONS_MIN}, {ITERATIONS_MAX}]"
            )
        try:
            salt = base64.b64decode(salt_b64, validate=True)
        except (binascii.Error, ValueError):
            raise ScramClientError("SCRAM salt is not base64") from None
        salted = salted_password(self.mechanism, self._password, salt, iterations)
        stored_key, server_key = scram_keys(self.mechanism, salted)
        client_key = hmac.new(salted, b"Client Key", self._hash).digest()
        without_proof = f"c=biws,r={nonce}"  # biws: base64 of the gs2 header "n,,"
        auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        signature = hmac.new(stored_key, auth_message, self._hash).digest()
        proof = bytes(k ^ s for k, s in zip(client_key, signature, strict=True))
        self._server_signature = hmac.new(server_key, auth_message, self._hash).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """ScramClientError unless ``server_final`` carries the server's signature."""
        if not self._server_signature:
            raise ScramClientError("SCRAM server-final message before the client-final one")
        try:
            attrs = _attributes(server_final.decode(), "server-final message")
        except UnicodeDecodeError:
            raise ScramClientError("SCRAM server-final message is not UTF-8") from None
        if "e" in attrs:
            raise ScramClientError(f"SCRAM server refused: {attrs['e']}")
        try:
            signature = base64.b64decode(attrs.get("v", ""), validate=True)
        except (binascii.Error, ValueError):
            raise ScramClientError("SCRAM server signature is not base64") from None
        if not hmac.compare_digest(signature, self._server_signature):
            raise ScramClientError("SCRAM server signature does not match: not the server")
