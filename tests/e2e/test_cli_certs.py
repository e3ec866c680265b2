"""`raylog certs` on a real `raylog up`: the cluster CA for clients, and a client certificate.

Proves, on the session's shared cluster: `certs ca` prints the CA certificate the cluster keeps
in its object store (a CA: basicConstraints ca=true), and ``--out`` writes the same; `certs
issue alice --out-dir certs` run in another directory than `raylog up` writes ``alice.pem``,
``alice.key`` (0600) and ``ca.pem`` there (so the command ran in the caller's process, not on
the cluster's command endpoint), prints no private key, and the certificate is CN=alice,
clientAuth only, signed by that CA, living ``--days``; with its key it completes a real TLS
handshake with a server that requires client certificates of that CA, which reads the
principal ``User:CN=alice`` from it.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from support.cluster import RAYLOG, UpProcess, cli_env

from raylog.actors.control.principal_mapping import PrincipalMapper, peer_principal
from raylog.storage import pki
from raylog.storage.localstore import LocalObjectStore

pytestmark = pytest.mark.slow

TIMEOUT_S = 120.0


def raylog_in(cwd: Path, up: UpProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """`raylog ARGS` run from ``cwd`` (not `raylog up`'s directory)."""
    return subprocess.run(
        [*RAYLOG, *args, "--data-dir", str(up.data_dir)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=cli_env(),
        cwd=cwd,
    )


def handshake_principal(ca_pem: bytes, cert_path: Path, key_path: Path) -> str:
    """A TLS handshake over a socket pair: a server requiring a client certificate of the CA
    ``ca_pem``, a client presenting ``cert_path``; the principal the server reads."""
    server = pki.listener_context(
        pki.CertificateAuthority.generate("server").issue("server"),
        client_auth="required",
        trusted_ca_pem=ca_pem,
    )
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE  # the server's certificate is not what this proves
    client.load_cert_chain(cert_path, key_path)
    left, right = socket.socketpair()
    left.settimeout(TIMEOUT_S)
    right.settimeout(TIMEOUT_S)
    seen: list[bytes | None] = []

    def serve() -> None:
        with server.wrap_socket(left, server_side=True) as tls:
            seen.append(tls.getpeercert(binary_form=True))
            tls.sendall(b"ok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with client.wrap_socket(right) as tls:
        assert tls.recv(2) == b"ok"
    thread.join(TIMEOUT_S)
    assert seen, "the server did not complete the handshake"
    return peer_principal(seen[0], PrincipalMapper.from_rules(None))


def test_ca_export_and_client_certificate(shared_up: UpProcess, tmp_path: Path) -> None:
    printed = raylog_in(tmp_path, shared_up, "certs", "ca")
    assert printed.returncode == 0, printed.stderr
    ca_pem = printed.stdout.encode()
    ca = x509.load_pem_x509_certificate(ca_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    stored = LocalObjectStore(shared_up.data_dir / "metadata").get(pki.CA_KEY)
    assert stored is not None
    assert pki.CertificateAuthority.from_json(stored.body).cert_pem == ca_pem

    written = raylog_in(tmp_path, shared_up, "certs", "ca", "--out", "exported-ca.pem")
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "exported-ca.pem").read_bytes() == ca_pem

    issued = raylog_in(tmp_path, shared_up, "certs", "issue", "alice", "--out-dir", "certs",
                       "--days", "30")  # fmt: skip
    assert issued.returncode == 0, issued.stderr
    assert "PRIVATE KEY" not in issued.stdout + issued.stderr
    out = tmp_path / "certs"
    cert_path, key_path = out / "alice.pem", out / "alice.key"
    assert (key_path.stat().st_mode & 0o777) == 0o600
    assert (out / "ca.pem").read_bytes() == ca_pem
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert cert.subject.rfc4514_string() == "CN=alice"
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(days=30) <= life <= dt.timedelta(days=30, minutes=10)
    key = serialization.load_pem_private_key(key_path.read_bytes(), None)
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    assert key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)

    assert handshake_principal(ca_pem, cert_path, key_path) == "User:CN=alice"
    # Issued again into the same place: refused, the files kept.
    again = raylog_in(tmp_path, shared_up, "certs", "issue", "alice", "--out-dir", "certs")
    assert again.returncode == 1 and "exists" in again.stderr
    assert x509.load_pem_x509_certificate(cert_path.read_bytes()) == cert
