"""The cluster's certificate authority, kept in the object store, and the TLS contexts of its
replication channels.

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
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import ssl
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raylog.storage.errors import PreconditionFailedError
from raylog.storage.objectstore import ObjectStore

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

# cryptography is imported by the CA's code only (the controller's): every replica and gateway
# process imports this module for its TLS contexts, which the ssl module builds alone, and
# cryptography costs about 50 ms of CPU at each process start.

__all__ = [
    "CA_KEY",
    "CertificateAuthority",
    "LeafCertificate",
    "client_context",
    "ensure_cluster_ca",
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

    def to_json(self) -> bytes:
        return json.dumps(
            {"cert_pem": self.cert_pem.decode(), "key_pem": self._key_pem.decode()}
        ).encode()

    @classmethod
    def from_json(cls, body: bytes) -> CertificateAuthority:
        doc = json.loads(body)
        return cls(doc["cert_pem"].encode(), doc["key_pem"].encode())

    def issue(self, subject: str, ips: tuple[str, ...] = ("127.0.0.1",)) -> LeafCertificate:
        """A serverAuth + clientAuth leaf for ``subject`` with these IP SANs (and localhost)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        sans: list[x509.GeneralName] = [x509.DNSName("localhost")]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in dict.fromkeys(ips)]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject[:64])]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        return LeafCertificate(
            cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), self.cert_pem
        )


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
    # The ssl module loads a certificate chain from files only: a private temp file, removed
    # at once (the key stays in this process's memory).
    fd, path = tempfile.mkstemp(prefix="raylog-leaf-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(leaf.cert_pem + leaf.key_pem)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)
    return context


def server_context(leaf: LeafCertificate) -> ssl.SSLContext:
    """TLS 1.3, presents ``leaf``, requires a client certificate from the same CA."""
    return _context(ssl.Purpose.CLIENT_AUTH, leaf)


def client_context(leaf: LeafCertificate) -> ssl.SSLContext:
    """TLS 1.3, presents ``leaf``, requires the server's certificate from the same CA."""
    return _context(ssl.Purpose.SERVER_AUTH, leaf)
