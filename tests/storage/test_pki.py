"""The cluster CA in the object store, and mutual TLS on replication channels.

Proves: the first ``ensure_cluster_ca`` creates the CA in the store and every later call (also
one that lost the create race) returns that same CA; issued leaves chain to it and carry
serverAuth + clientAuth; two channel ends with leaves of one CA exchange messages over TLS 1.3;
a client with a leaf of another CA, or with no certificate, never gets a message in.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from raylog.actors.replication.messages import ReplicateAck
from raylog.actors.transport import channel as ch
from raylog.storage import pki
from raylog.storage.localstore import LocalObjectStore

HOST = "127.0.0.1"
DEADLINE_S = 10.0


def test_ca_is_created_once_and_shared(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    first = pki.ensure_cluster_ca(store, "c1")
    again = pki.ensure_cluster_ca(store, "c1")
    assert again.cert_pem == first.cert_pem
    # A starter that generated its own CA but lost the create race adopts the stored one.
    store2 = LocalObjectStore(tmp_path / "store2")
    loser = pki.CertificateAuthority.generate("c2")
    store2.put_if_absent(pki.CA_KEY, loser.to_json())
    assert pki.ensure_cluster_ca(store2, "c2").cert_pem == loser.cert_pem


def test_leaf_chains_to_the_ca_with_both_usages(tmp_path: Path) -> None:
    ca = pki.CertificateAuthority.generate("c")
    leaf = ca.issue("replica:t:0:1", ips=("127.0.0.1",))
    cert = x509.load_pem_x509_certificate(leaf.cert_pem)
    ca_cert = x509.load_pem_x509_certificate(leaf.ca_pem)
    cert.verify_directly_issued_by(ca_cert)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


async def _until(probe: Any) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while not probe():
            await asyncio.sleep(0.01)


def _exchange(server_tls: ssl.SSLContext, client_tls: ssl.SSLContext | None) -> list[Any]:
    """Start a TLS channel server, send one message from a link; what the server received."""

    async def run() -> list[Any]:
        got: list[Any] = []
        server = ch.ChannelServer("replica:t:0:2", b"s", got.append)
        address = await server.start(HOST, tls=server_tls)

        async def resolve() -> tuple[str, int]:
            return address

        link = ch.PeerLink("replica:t:0:2", b"s", client_tls)
        message = ReplicateAck(1, 1, 10)
        deadline = asyncio.get_running_loop().time() + 3.0
        # Keep trying: a refused link backs off and retries, and never gets a message in.
        while asyncio.get_running_loop().time() < deadline and not got:
            link.ensure_connecting(resolve)
            link.send(message)
            await asyncio.sleep(0.05)
        assert server.tls and server.local_links == 0
        link.close()
        server.close()
        return got

    return asyncio.run(run())


def test_mutual_tls_admits_only_leaves_of_the_cluster_ca(monkeypatch: Any) -> None:
    # TLS guards links between machines; on one machine links go over a Unix socket (see
    # actors/transport/channel.py), so TCP is pinned here.
    monkeypatch.setenv(ch.LOCAL_SOCKETS_ENV, "0")
    ca = pki.CertificateAuthority.generate("c")
    server_tls = pki.server_context(ca.issue("replica:t:0:2"))
    assert _exchange(server_tls, pki.client_context(ca.issue("replica:t:0:1"))) == [
        ReplicateAck(1, 1, 10)
    ]

    stranger = pki.CertificateAuthority.generate("other").issue("replica:t:0:1")
    other = pki.client_context(stranger)
    other.load_verify_locations(cadata=ca.cert_pem.decode())  # it trusts us; we do not trust it
    assert _exchange(server_tls, other) == []

    anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anonymous.check_hostname = False
    anonymous.load_verify_locations(cadata=ca.cert_pem.decode())
    assert _exchange(server_tls, anonymous) == []
