"""TLS for the gateways' client listeners: real handshakes over loopback sockets.

Proves: ``listener_context`` takes TLS 1.2 and 1.3 clients and refuses TLS 1.0 and 1.1 (which
the same client speaks to a server that allows them); a listener leaf names the gateway's host
names and addresses, so a client checking host names accepts it; ``ssl.client.auth=required``
refuses a client without a certificate and one whose certificate is of another CA, and admits a
client-only leaf of the cluster CA; ``requested`` admits both; bad ``ssl.client.auth`` values
and a missing truststore are InvalidConfigError. A Kafka PEM keystore (encrypted key and
chain) serves handshakes, and each bad keystore (missing file, no key, no certificate, no or a
wrong password, a key of another certificate, an expired certificate, an oversized file) and
truststore is one clear InvalidConfigError without the password in it. ``ReloadingContext``
re-issues a cluster-CA leaf at 2/3 of its life (by a given clock) and reloads a keystore whose
file changed: the next connection gets the new certificate; a bad new file is reported once and
the old certificate stays.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from raylog.storage import pki
from raylog.storage.errors import InvalidConfigError

HOST = "127.0.0.1"
TIMEOUT_S = 10.0
PASSWORD = "s3cret-pw"
DAY_S = 86400.0


class Refused(Exception):
    """The handshake (or the first read after it) failed."""


def talk(
    server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str | None = None
) -> tuple[str, bytes]:
    """One connection: the TLS version and the certificate (DER) the server presented; Refused
    when either end refuses."""
    with socket.create_server((HOST, 0)) as listener:
        listener.settimeout(TIMEOUT_S)
        failures: list[BaseException] = []

        def serve() -> None:
            conn, _ = listener.accept()
            conn.settimeout(TIMEOUT_S)
            try:
                with server.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"hello")
                    tls.recv(1)  # until the client closes
            except (ssl.SSLError, OSError) as e:
                failures.append(e)
                conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            raw = socket.create_connection(listener.getsockname(), timeout=TIMEOUT_S)
            with raw, client.wrap_socket(raw, server_hostname=server_hostname) as tls:
                # TLS 1.3: the server checks the client's certificate after the client
                # finished its handshake; its refusal arrives at the first read.
                if tls.recv(5) != b"hello":
                    raise Refused("closed")
                version, der = tls.version(), tls.getpeercert(binary_form=True)
        except (ssl.SSLError, OSError) as e:
            raise Refused(str(e)) from e
        finally:
            thread.join(TIMEOUT_S)
        assert version is not None and der is not None
        if failures:
            raise Refused(str(failures[0]))
        return version, der


def client_context(
    ca_pem: bytes, leaf: pki.LeafCertificate | None = None, *, check_hostname: bool = False
) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = check_hostname
    context.load_verify_locations(cadata=ca_pem.decode())
    if leaf is not None:
        pki._load_chain(context, leaf.cert_pem + leaf.key_pem, None)
    return context


def serial(der: bytes) -> int:
    return x509.load_der_x509_certificate(der).serial_number


@pytest.fixture(scope="module")
def ca() -> pki.CertificateAuthority:
    return pki.CertificateAuthority.generate("c")


@pytest.fixture(scope="module")
def leaf(ca: pki.CertificateAuthority) -> pki.LeafCertificate:
    return ca.issue("gateway:1", ips=(HOST,), dns_names=("broker1.example",), client=False)


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_tls_1_2_and_1_3_are_taken_and_1_0_1_1_refused(leaf: pki.LeafCertificate) -> None:
    server = pki.listener_context(leaf)
    assert talk(server, client_context(leaf.ca_pem))[0] == "TLSv1.3"
    tls12 = client_context(leaf.ca_pem)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    assert talk(server, tls12)[0] == "TLSv1.2"

    old = client_context(leaf.ca_pem)
    old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with pytest.raises(Refused):
        talk(server, old)
    # The same client speaks TLS 1.1 to a server that allows it: the listener refused it.
    lax = pki.listener_context(leaf)
    lax.minimum_version = ssl.TLSVersion.TLSv1
    lax.set_ciphers("DEFAULT:@SECLEVEL=0")
    assert talk(lax, old)[0] == "TLSv1.1"


def test_listener_leaf_names_the_gateway_hosts(
    ca: pki.CertificateAuthority, leaf: pki.LeafCertificate
) -> None:
    server = pki.listener_context(leaf)
    checking = client_context(leaf.ca_pem, check_hostname=True)
    for name in ("broker1.example", "localhost", HOST):
        talk(server, checking, server_hostname=name)
    with pytest.raises(Refused, match=r"match|mismatch"):
        talk(server, checking, server_hostname="broker2.example")
    cert = x509.load_pem_x509_certificate(leaf.cert_pem)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    # The replication channels' leaves keep both usages.
    both = x509.load_pem_x509_certificate(ca.issue("replica:t:0:1").cert_pem)
    assert len(both.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == 2


def test_client_leaf_is_client_auth_only(ca: pki.CertificateAuthority) -> None:
    alice = ca.issue("alice", days=7, server=False)
    cert = x509.load_pem_x509_certificate(alice.cert_pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.subject.rfc4514_string() == "CN=alice"
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(days=7) <= life <= dt.timedelta(days=7, minutes=10)
    with pytest.raises(ValueError):
        ca.issue("nobody", server=False, client=False)


def test_client_auth_required_admits_only_leaves_of_the_trusted_ca(
    ca: pki.CertificateAuthority, leaf: pki.LeafCertificate
) -> None:
    server = pki.listener_context(leaf, client_auth="required")
    alice = ca.issue("alice", server=False)
    talk(server, client_context(ca.cert_pem, alice))
    with pytest.raises(Refused):
        talk(server, client_context(ca.cert_pem))  # no certificate
    stranger = pki.CertificateAuthority.generate("other").issue("alice", server=False)
    with pytest.raises(Refused):
        talk(server, client_context(ca.cert_pem, stranger))
    # TLS 1.2 clients too (the refusal comes in the handshake itself).
    tls12 = client_context(ca.cert_pem)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(Refused):
        talk(server, tls12)

    requested = pki.listener_context(leaf, client_auth="requested")
    talk(requested, client_context(ca.cert_pem, alice))
    talk(requested, client_context(ca.cert_pem))
    with pytest.raises(Refused):  # a certificate offered is checked
        talk(requested, client_context(ca.cert_pem, stranger))

    # Another trusted CA (ssl.truststore.location) instead of the leaf's.
    other_ca = pki.CertificateAuthority.generate("other")
    trusting = pki.listener_context(leaf, client_auth="required", trusted_ca_pem=other_ca.cert_pem)
    talk(trusting, client_context(ca.cert_pem, other_ca.issue("bob", server=False)))
    with pytest.raises(Refused):
        talk(trusting, client_context(ca.cert_pem, alice))


def test_bad_client_auth_values(leaf: pki.LeafCertificate, tmp_path: Path) -> None:
    with pytest.raises(
        InvalidConfigError, match=r"ssl\.client\.auth must be one of none, requested"
    ):
        pki.listener_context(leaf, client_auth="REQUIRED")
    keystore = pki.load_keystore_pem(write_keystore(tmp_path / "k.pem", leaf), None)
    with pytest.raises(InvalidConfigError, match=r"ssl\.truststore\.location"):
        pki.listener_context(keystore, client_auth="required")


def write_keystore(
    path: Path,
    leaf: pki.LeafCertificate,
    password: str | None = None,
    *,
    key: bool = True,
    cert: bool = True,
) -> str:
    """A Kafka PEM keystore file: the private key (PKCS#8, encrypted with ``password``) and
    the chain (leaf, CA)."""
    body = b""
    if key:
        private = serialization.load_pem_private_key(leaf.key_pem, None)
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(password.encode())
            if password
            else serialization.NoEncryption()
        )
        body += private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )
    if cert:
        body += leaf.cert_pem + leaf.ca_pem
    path.write_bytes(body)
    return str(path)


def test_pem_keystore_serves_with_its_chain(
    ca: pki.CertificateAuthority, leaf: pki.LeafCertificate, tmp_path: Path
) -> None:
    path = write_keystore(tmp_path / "keystore.pem", leaf, PASSWORD)
    keystore = pki.load_keystore_pem(path, PASSWORD)
    assert keystore.subject == "CN=gateway:1"
    assert PASSWORD not in repr(keystore)
    truststore = tmp_path / "truststore.pem"
    truststore.write_bytes(b"# the cluster CA\n" + ca.cert_pem)
    trusted = pki.load_truststore_pem(str(truststore))
    server = pki.listener_context(keystore, client_auth="required", trusted_ca_pem=trusted)
    _, der = talk(server, client_context(ca.cert_pem, ca.issue("alice", server=False)))
    assert der == x509.load_pem_x509_certificate(leaf.cert_pem).public_bytes(
        serialization.Encoding.DER
    )
    # A key stored unencrypted needs no password (and one given is not kept).
    plain = pki.load_keystore_pem(write_keystore(tmp_path / "plain.pem", leaf), PASSWORD)
    assert plain.password is None
    talk(pki.listener_context(plain), client_context(ca.cert_pem))


def test_each_bad_keystore_is_one_clear_error(
    ca: pki.CertificateAuthority, leaf: pki.LeafCertificate, tmp_path: Path
) -> None:
    def error(path: str | Path, password: str | None = PASSWORD, **kwargs: float) -> str:
        with pytest.raises(InvalidConfigError) as raised:
            pki.load_keystore_pem(str(path), password, **kwargs)
        message = str(raised.value)
        assert PASSWORD not in message and "wrong-pw" not in message
        assert message.startswith("ssl.keystore.location: ")
        return message

    assert "no such file" in error(tmp_path / "missing.pem")
    only_cert = write_keystore(tmp_path / "cert.pem", leaf, key=False)
    assert "holds no private key" in error(only_cert)
    only_key = write_keystore(tmp_path / "key.pem", leaf, PASSWORD, cert=False)
    assert "holds no certificate" in error(only_key)
    encrypted = write_keystore(tmp_path / "enc.pem", leaf, PASSWORD)
    assert "wrong ssl.key.password" in error(encrypted, "wrong-pw")
    assert "encrypted: set ssl.key.password" in error(encrypted, None)
    other = ca.issue("gateway:2")
    mismatched = tmp_path / "mismatch.pem"
    mismatched.write_bytes(Path(encrypted).read_bytes().split(b"-----BEGIN CERTIFICATE")[0])
    mismatched.write_bytes(mismatched.read_bytes() + other.cert_pem)
    assert "not the key of its first certificate (CN=gateway:2)" in error(mismatched)
    expired = error(encrypted, now_s=dt.datetime.now(dt.UTC).timestamp() + 400 * DAY_S)
    assert "(CN=gateway:1) expired at" in expired
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(
        Path(encrypted).read_bytes().split(b"-----BEGIN CERTIFICATE")[0]
        + b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    )
    assert "certificate 1 in" in error(garbage)
    huge = tmp_path / "huge.pem"
    huge.write_bytes(Path(encrypted).read_bytes() + b"#" * pki.PEM_FILE_BYTES_MAX)
    assert "is over 1 MiB" in error(huge)


def test_bad_truststores(leaf: pki.LeafCertificate, tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match=r"ssl\.truststore\.location: no such file"):
        pki.load_truststore_pem(str(tmp_path / "missing.pem"))
    only_key = write_keystore(tmp_path / "key.pem", leaf, cert=False)
    with pytest.raises(InvalidConfigError, match=r"ssl\.truststore\.location: .* no certificate"):
        pki.load_truststore_pem(only_key)


def test_cluster_leaf_is_reissued_at_two_thirds_of_its_life(
    ca: pki.CertificateAuthority,
) -> None:
    first = ca.issue("gateway:1", days=pki.LISTENER_LEAF_DAYS)
    reloading = pki.ReloadingContext(first)
    start = x509.load_pem_x509_certificate(first.cert_pem).not_valid_before_utc.timestamp()
    life_s = reloading.not_after_s - start
    issued: list[pki.LeafCertificate] = []

    async def reissue() -> pki.LeafCertificate:
        issued.append(ca.issue("gateway:1", days=pki.LISTENER_LEAF_DAYS))
        return issued[-1]

    client = client_context(ca.cert_pem)
    before = serial(talk(reloading.context, client)[1])
    assert not asyncio.run(reloading.refresh(start + 0.66 * life_s, reissue))
    assert issued == [] and serial(talk(reloading.context, client)[1]) == before
    assert asyncio.run(reloading.refresh(start + 0.67 * life_s, reissue))
    after = serial(talk(reloading.context, client)[1])
    assert after == x509.load_pem_x509_certificate(issued[0].cert_pem).serial_number != before


def test_keystore_file_change_is_reloaded_and_a_bad_one_reported_once(
    ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    path = tmp_path / "keystore.pem"
    first, second = ca.issue("gateway:1"), ca.issue("gateway:1")
    write_keystore(path, first, PASSWORD)
    reloading = pki.ReloadingContext(pki.load_keystore_pem(str(path), PASSWORD))
    now_s = dt.datetime.now(dt.UTC).timestamp()
    client = client_context(ca.cert_pem)
    assert not asyncio.run(reloading.refresh(now_s))  # unchanged
    assert not reloading.renewal_due(now_s + 1000 * DAY_S)  # the operator renews it

    write_keystore(path, second, PASSWORD)
    os.utime(path, ns=(0, 1))  # a new mtime even on a coarse clock
    assert asyncio.run(reloading.refresh(now_s))
    second_serial = x509.load_pem_x509_certificate(second.cert_pem).serial_number
    assert serial(talk(reloading.context, client)[1]) == second_serial

    path.write_bytes(b"not a keystore")
    with pytest.raises(InvalidConfigError, match="holds no private key"):
        asyncio.run(reloading.refresh(now_s))
    assert not asyncio.run(reloading.refresh(now_s))  # the same bad file: not again
    assert serial(talk(reloading.context, client)[1]) == second_serial
