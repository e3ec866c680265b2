"""The cluster's certificate authority, kept in the object store, and the TLS contexts of its
replication channels and of the gateways' client listeners.

raylog's replication channels (``actors/transport/channel.py``) are mutually authenticated with TLS:
both ends present a certificate signed by the cluster's CA and refuse any other. The CA is generated
on the first start (P-256, ten years) and stored at :data:`CA_KEY` in the object store with a
conditional create, so that two controllers starting at once agree on one CA: the loser of the
race reads the winner's. Its private key lives in that object: whoever can read the store can
issue certificates, exactly as whoever can write it can take the controller lease — the object
store is the cluster's root of trust, as in klite. Restrict the bucket accordingly.

Leaf certificates (P-256, :data:`LEAF_DAYS`) carry both serverAuth and clientAuth, because each
channel end is a server for its peers and a client of them; their subject names the holder
(e.g. ``replica:events:0:2``) for log lines. Peers are not checked by host name (replicas move
between nodes; the channel handshake names the replica wanted), only by the CA.

The gateways' SSL listeners (the section "client listeners" below) present a leaf of this CA,
with the gateway's host names and addresses, or the operator's own certificate (a Kafka PEM
keystore); the CA also issues client-only leaves (clientAuth) for Kafka clients
(`raylog certs issue`).
"""

from __future__ import annotations

import datetime as dt
import hmac
import ipaddress
import json
import os
import re
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raylog.storage.errors import InvalidConfigError, PreconditionFailedError
from raylog.storage.objectstore import ObjectStore

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

# cryptography is imported by the CA's code only (the controller's): every replica and gateway
# process imports this module for its TLS contexts, which the ssl module builds alone, and
# cryptography costs about 50 ms of CPU at each process start.

__all__ = [
    "CA_KEY",
    "CLIENT_AUTH",
    "CLIENT_DAYS_DEFAULT",
    "CLIENT_NAME",
    "LISTENER_LEAF_DAYS",
    "CertificateAuthority",
    "LeafCertificate",
    "ListenerCertificate",
    "PemKeystore",
    "ReloadingContext",
    "check_client_certificate",
    "client_context",
    "ensure_cluster_ca",
    "listener_context",
    "load_keystore_pem",
    "load_truststore_pem",
    "server_context",
]

CA_KEY = "pki/ca.json"
CA_DAYS = 3650
LEAF_DAYS = 365
_BACKDATE = dt.timedelta(minutes=5)  # tolerate small clock differences between nodes


@dataclass(frozen=True)
class LeafCertificate:
    """A leaf certificate, its private key and the CA certificate, all PEM."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class CertificateAuthority:
    """The cluster CA: issues leaf certificates."""

    def __init__(self, cert_pem: bytes, key_pem: bytes) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        self.cert_pem = cert_pem
        self._cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the cluster CA key is not an EC key")
        self._key = key
        self._key_pem = key_pem

    @classmethod
    def generate(cls, cluster_id: str) -> CertificateAuthority:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"raylog CA {cluster_id}")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def derive_secret(self, label: bytes) -> bytes:
        """A 32-byte secret for ``label`` derived from the CA's private key: the same on every
        node that can read the CA, unknown to anyone who cannot (e.g. the key that masks
        unknown users' SCRAM salts on every gateway alike)."""
        return hmac.new(self._key_pem, b"raylog derived secret: " + label, "sha256").digest()

    def to_json(self) -> bytes:
        return json.dumps(
            {"cert_pem": self.cert_pem.decode(), "key_pem": self._key_pem.decode()}
        ).encode()

    @classmethod
    def from_json(cls, body: bytes) -> CertificateAuthority:
        doc = json.loads(body)
        return cls(doc["cert_pem"].encode(), doc["key_pem"].encode())

    def issue(
        self,
        subject: str,
        ips: tuple[str, ...] = ("127.0.0.1",),
        dns_names: tuple[str, ...] = (),
        days: int = LEAF_DAYS,
        server: bool = True,
        client: bool = True,
    ) -> LeafCertificate:
        """A leaf for ``subject`` (its CN) living ``days``: with ``server``, serverAuth and
        these IP and DNS SANs (and localhost); with ``client``, clientAuth. A client-only leaf
        (``server=False``) is a Kafka client's certificate: no SANs, clientAuth only."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        if not (server or client):
            raise ValueError("a leaf is a server's, a client's or both")
        if days < 1:
            raise ValueError(f"a leaf lives at least one day, not {days}")
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject[:64])]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if server:
            names = dict.fromkeys(["localhost", *dns_names])
            sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
            sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in dict.fromkeys(ips)]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return LeafCertificate(
            cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), self.cert_pem
        )


# A client certificate's name: its CN (the principal ``User:CN=NAME`` under the DEFAULT
# ssl.principal.mapping.rules) and the name of its files (`raylog certs issue`).
CLIENT_NAME = re.compile(r"[A-Za-z0-9_@-][A-Za-z0-9._@-]{0,63}")
CLIENT_DAYS_DEFAULT = 365


def check_client_certificate(name: str, days: int) -> None:
    """ValueError naming the problem unless ``name`` and ``days`` make a client certificate."""
    if CLIENT_NAME.fullmatch(name) is None:
        raise ValueError(
            f"a client certificate name is 1-64 letters, digits and . _ @ -, not starting "
            f"with '.': {name[:80]!r}"
        )
    if not 1 <= days <= CA_DAYS:
        raise ValueError(f"a client certificate lives 1 to {CA_DAYS} days, not {days}")


def ensure_cluster_ca(store: ObjectStore, cluster_id: str) -> CertificateAuthority:
    """The cluster's CA from the store, generated and stored (create-if-absent) on first use."""
    found = store.get(CA_KEY)
    if found is not None:
        return CertificateAuthority.from_json(found.body)
    ca = CertificateAuthority.generate(cluster_id)
    try:
        store.put_if_absent(CA_KEY, ca.to_json())
        return ca
    except PreconditionFailedError:  # another starter won the race: use its CA
        found = store.get(CA_KEY)
        if found is None:
            raise
        return CertificateAuthority.from_json(found.body)


def _context(purpose: ssl.Purpose, leaf: LeafCertificate) -> ssl.SSLContext:
    context = ssl.SSLContext(
        ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH else ssl.PROTOCOL_TLS_CLIENT
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = False  # peers are named by the channel handshake, not host names
    context.load_verify_locations(cadata=leaf.ca_pem.decode())
    _load_chain(context, leaf.cert_pem + leaf.key_pem, None)
    return context


def _load_chain(context: ssl.SSLContext, pem: bytes, password: str | None) -> None:
    """Loads a private key and certificate chain (PEM, in one) into ``context``."""
    # The ssl module loads a certificate chain from files only: a private temp file, removed
    # at once (the key stays in this process's memory).
    fd, path = tempfile.mkstemp(prefix="raylog-leaf-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        context.load_cert_chain(path, password=password)
    finally:
        os.unlink(path)


def server_context(leaf: LeafCertificate) -> ssl.SSLContext:
    """TLS 1.3, presents ``leaf``, requires a client certificate from the same CA."""
    return _context(ssl.Purpose.CLIENT_AUTH, leaf)


def client_context(leaf: LeafCertificate) -> ssl.SSLContext:
    """TLS 1.3, presents ``leaf``, requires the server's certificate from the same CA."""
    return _context(ssl.Purpose.SERVER_AUTH, leaf)


# --- client listeners ----------------------------------------------------------------------------
#
# A gateway's SSL and SASL_SSL listeners serve Kafka clients (librdkafka, kafkajs, Java), so they
# take TLS 1.2 and 1.3 with the ssl module's default ciphers, present either a leaf of the
# cluster CA (LISTENER_LEAF_DAYS, re-issued at RENEW_AT of its life) or the operator's own
# certificate (a Kafka PEM keystore), and check client certificates as Kafka's
# ``ssl.client.auth`` says. The certificate is replaced in place (ReloadingContext): the
# listener's socket server keeps its one SSLContext, the next handshake presents the new chain.

LISTENER_LEAF_DAYS = 90
RENEW_AT = 2 / 3  # of a cluster-CA leaf's life
PEM_FILE_BYTES_MAX = 1 << 20  # a keystore or truststore (a CA bundle is a few hundred KiB)
CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----.+?-----END \1-----", re.DOTALL)
_KEY_LABELS = (b"PRIVATE KEY", b"ENCRYPTED PRIVATE KEY", b"RSA PRIVATE KEY", b"EC PRIVATE KEY")


@dataclass(frozen=True)
class PemKeystore:
    """A Kafka PEM keystore (``ssl.keystore.type=PEM``), checked: one private key and its
    certificate chain (leaf first) in the file at ``ssl.keystore.location``, the key encrypted
    with ``ssl.key.password`` or not at all."""

    path: str
    pem: bytes = field(repr=False)  # the file as read (its key as stored, maybe encrypted)
    password: str | None = field(repr=False)
    subject: str  # the leaf's, RFC 4514
    not_before_s: float  # epoch seconds
    not_after_s: float
    stamp: tuple[int, int]  # the file's (st_mtime_ns, st_size) when read


def _read(path: str, key: str) -> tuple[bytes, tuple[int, int]]:
    """The file's bytes and (st_mtime_ns, st_size)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            body = f.read(PEM_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        raise InvalidConfigError(f"{key}: no such file {path}") from None
    except OSError as e:
        raise InvalidConfigError(f"{key}: cannot read {path}: {e.strerror}") from None
    if len(body) > PEM_FILE_BYTES_MAX:
        raise InvalidConfigError(f"{key}: {path} is over {PEM_FILE_BYTES_MAX >> 20} MiB")
    return body, (st.st_mtime_ns, st.st_size)


def _certificates(blocks: list[bytes], path: str, key: str) -> list[Any]:
    from cryptography import x509

    certs = []
    for i, block in enumerate(blocks):
        try:
            certs.append(x509.load_pem_x509_certificate(block))
        except ValueError as e:
            raise InvalidConfigError(f"{key}: certificate {i + 1} in {path} is bad: {e}") from None
    if not certs:
        raise InvalidConfigError(f"{key}: {path} holds no certificate (PEM 'CERTIFICATE')")
    return certs


def load_keystore_pem(
    path: str, password: str | None, *, now_s: float | None = None
) -> PemKeystore:
    """The PEM keystore at ``path`` (``ssl.keystore.location``), checked now (``now_s``, epoch
    seconds; default the clock): InvalidConfigError naming the problem when the file is missing,
    holds no key, several keys or no certificate, the password is wrong or missing, the key is
    not the first certificate's, or that certificate is expired or not yet valid."""
    from cryptography.hazmat.primitives import serialization

    key_name = "ssl.keystore.location"
    pem, stamp = _read(path, key_name)
    blocks = [(m.group(1), m.group(0)) for m in _PEM_BLOCK.finditer(pem)]
    keys = [b for label, b in blocks if label in _KEY_LABELS]
    if not keys:
        raise InvalidConfigError(f"{key_name}: {path} holds no private key (PEM 'PRIVATE KEY')")
    if len(keys) > 1:
        raise InvalidConfigError(f"{key_name}: {path} holds {len(keys)} private keys, not one")
    certs = _certificates([b for label, b in blocks if label == b"CERTIFICATE"], path, key_name)
    encrypted = b"ENCRYPTED" in keys[0]
    if encrypted and not password:
        raise InvalidConfigError(
            f"{key_name}: the private key in {path} is encrypted: set ssl.key.password"
        )
    try:
        private = serialization.load_pem_private_key(
            keys[0], password=password.encode() if encrypted and password else None
        )
    except (ValueError, TypeError):
        why = "wrong ssl.key.password for" if encrypted else "cannot read"
        raise InvalidConfigError(f"{key_name}: {why} the private key in {path}") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    leaf = certs[0]
    if private.public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
        raise InvalidConfigError(
            f"{key_name}: the private key in {path} is not the key of its first certificate "
            f"({leaf.subject.rfc4514_string()})"
        )
    not_before = leaf.not_valid_before_utc.timestamp()
    not_after = leaf.not_valid_after_utc.timestamp()
    now = dt.datetime.now(dt.UTC).timestamp() if now_s is None else now_s
    subject = leaf.subject.rfc4514_string()
    if now >= not_after:
        raise InvalidConfigError(
            f"{key_name}: the certificate in {path} ({subject}) expired at "
            f"{leaf.not_valid_after_utc.isoformat()}"
        )
    if now < not_before:
        raise InvalidConfigError(
            f"{key_name}: the certificate in {path} ({subject}) is valid from "
            f"{leaf.not_valid_before_utc.isoformat()} only"
        )
    kept_password = password if encrypted else None
    return PemKeystore(path, pem, kept_password, subject, not_before, not_after, stamp)


def load_truststore_pem(path: str) -> bytes:
    """The CA certificates (PEM) of the bundle at ``path`` (``ssl.truststore.location``,
    ``ssl.truststore.type=PEM``): InvalidConfigError when it is missing or holds none."""
    key_name = "ssl.truststore.location"
    pem, _ = _read(path, key_name)
    blocks = [m.group(0) for m in _PEM_BLOCK.finditer(pem) if m.group(1) == b"CERTIFICATE"]
    _certificates(blocks, path, key_name)
    return b"\n".join(blocks) + b"\n"


ListenerCertificate = LeafCertificate | PemKeystore


def _validity_s(source: ListenerCertificate) -> tuple[float, float]:
    if isinstance(source, PemKeystore):
        return source.not_before_s, source.not_after_s
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(source.cert_pem)
    return cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()


def _load_listener_chain(context: ssl.SSLContext, source: ListenerCertificate) -> None:
    if isinstance(source, PemKeystore):
        _load_chain(context, source.pem, source.password)
    else:
        _load_chain(context, source.cert_pem + source.key_pem, None)


def listener_context(
    leaf: ListenerCertificate, *, client_auth: str = "none", trusted_ca_pem: bytes | None = None
) -> ssl.SSLContext:
    """A server context for a listener's Kafka clients: TLS 1.2 or 1.3, the ssl module's
    default ciphers, presents ``leaf``; ``client_auth`` is Kafka's ``ssl.client.auth``
    (``none``, ``requested``, ``required``), client certificates checked against
    ``trusted_ca_pem`` (``ssl.truststore.location``'s; default the leaf's CA, which a PEM
    keystore does not name). Bad values raise InvalidConfigError."""
    mode = CLIENT_AUTH.get(client_auth)
    if mode is None:
        raise InvalidConfigError(
            f"ssl.client.auth must be one of {', '.join(CLIENT_AUTH)}, not {client_auth!r}"
        )
    trusted = trusted_ca_pem if trusted_ca_pem is not None else getattr(leaf, "ca_pem", b"")
    if mode != ssl.CERT_NONE and not trusted:
        raise InvalidConfigError(
            f"ssl.client.auth={client_auth} checks client certificates against "
            "ssl.truststore.location: set it"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = mode
    if mode != ssl.CERT_NONE:
        try:
            context.load_verify_locations(cadata=trusted.decode())
        except (ssl.SSLError, UnicodeDecodeError) as e:
            raise InvalidConfigError(f"ssl.truststore.location: bad CA certificates: {e}") from None
    try:
        _load_listener_chain(context, leaf)
    except ssl.SSLError as e:
        raise InvalidConfigError(f"the listener's certificate does not load: {e}") from None
    return context


class ReloadingContext:
    """A listener's :attr:`context`, whose certificate :meth:`refresh` replaces in place.

    A leaf of the cluster CA is re-issued (by the caller's ``reissue``) once it has lived
    :data:`RENEW_AT` of its life; a PEM keystore is read again when its file changes (mtime or
    size), checked (:func:`load_keystore_pem`) and loaded into a scratch context first, so a
    bad file raises InvalidConfigError and the listener keeps serving the chain it had (the
    same bad file is not read again). Connections open keep the certificate they shook hands
    with; the next handshake presents the new one. The trusted CAs and ``client_auth`` stay as
    built.
    """

    def __init__(
        self,
        source: ListenerCertificate,
        *,
        client_auth: str = "none",
        trusted_ca_pem: bytes | None = None,
    ) -> None:
        self.context = listener_context(
            source, client_auth=client_auth, trusted_ca_pem=trusted_ca_pem
        )
        self.source = source
        self._validity_s = _validity_s(source)
        self._stamp = source.stamp if isinstance(source, PemKeystore) else None

    @property
    def not_after_s(self) -> float:
        """When the certificate presented expires (epoch seconds)."""
        return self._validity_s[1]

    def renewal_due(self, now_s: float) -> bool:
        """The cluster-CA leaf has lived RENEW_AT of its life (never for a PEM keystore)."""
        if isinstance(self.source, PemKeystore):
            return False
        start, end = self._validity_s
        return now_s >= start + RENEW_AT * (end - start)

    def install(self, source: ListenerCertificate) -> None:
        """Present ``source`` from the next handshake on (checked on a scratch context first)."""
        scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            _load_listener_chain(scratch, source)
        except ssl.SSLError as e:
            raise InvalidConfigError(f"the listener's certificate does not load: {e}") from None
        _load_listener_chain(self.context, source)
        self.source = source
        self._validity_s = _validity_s(source)

    def _keystore_changed(self) -> tuple[int, int] | None:
        """The keystore file's new (mtime_ns, size), None when unchanged or unreadable."""
        assert isinstance(self.source, PemKeystore)
        try:
            st = os.stat(self.source.path)
        except OSError:
            return None  # being replaced, or gone: keep serving, look again next time
        stamp = (st.st_mtime_ns, st.st_size)
        return None if stamp == self._stamp else stamp

    async def refresh(
        self, now_s: float, reissue: Callable[[], Awaitable[LeafCertificate]] | None = None
    ) -> bool:
        """Replaces the certificate when it is due (see the class docstring); True when it did.
        ``reissue`` gives a new leaf of the cluster CA (the controller's issue_certificate)."""
        source = self.source
        if isinstance(source, PemKeystore):
            stamp = self._keystore_changed()
            if stamp is None:
                return False
            self._stamp = stamp  # a bad file is reported once, not at every refresh
            fresh = load_keystore_pem(source.path, source.password, now_s=now_s)
            self.install(fresh)
            self._stamp = fresh.stamp
            return True
        if reissue is None or not self.renewal_due(now_s):
            return False
        self.install(await reissue())
        return True
