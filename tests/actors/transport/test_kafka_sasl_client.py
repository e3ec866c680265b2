"""The pure client side of a link's security (actors/transport/kafka_sasl_client.py).

Proves: LinkSecurity reads Kafka's client config names (librdkafka's sasl.username/password and
ssl.ca.location, Java's sasl.jaas.config and ssl.truststore.location, the hostname check turned
off by "" or "none"), ignores unknown keys, and refuses bad values with a ValueError that names
the key and never shows the password (nor does its repr); the SCRAM client completes an
exchange with the gateway's SCRAM server for both mechanisms (and the RFC 7677 example byte for
byte), and refuses a server that does not extend its nonce, asks for iterations out of Kafka's
bounds, sends an error, or signs with a key that is not the credential's.
"""

from __future__ import annotations

import base64
import os

import pytest

from raylog.actors.transport.kafka_sasl_client import (
    LinkSecurity,
    ScramClient,
    ScramClientError,
    parse_jaas_config,
    plain_message,
)
from raylog.gateway import sasl

SECRET = "s3cret-Pa55"


def test_librdkafka_names() -> None:
    security = LinkSecurity.from_configs(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": SECRET,
            "ssl.ca.location": "/etc/ca.pem",
            "bootstrap.servers": "ignored:9092",
            "unknown.key": "ignored",
        }
    )
    assert security == LinkSecurity("SASL_SSL", "SCRAM-SHA-512", "alice", SECRET, "/etc/ca.pem")
    assert security.sasl and security.tls and security.ssl_check_hostname
    assert SECRET not in repr(security)


def test_java_names() -> None:
    security = LinkSecurity.from_configs(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
            'required username="bob" password="p\\"w d";',
            "ssl.truststore.location": "/etc/trust.pem",
            "ssl.truststore.type": "PEM",
            "ssl.endpoint.identification.algorithm": "",
        }
    )
    assert (security.username, security.password) == ("bob", 'p"w d')
    assert security.ssl_cafile == "/etc/trust.pem" and not security.ssl_check_hostname
    plain = LinkSecurity.from_configs(
        {
            "security.protocol": "SASL_SSL",
            "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
            "required username=carol password=x;",
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    assert plain.sasl_mechanism == "PLAIN" and plain.username == "carol"
    assert not plain.ssl_check_hostname
    assert LinkSecurity.from_configs({}) == LinkSecurity()


@pytest.mark.parametrize(
    ("configs", "names"),
    [
        ({"security.protocol": "SASL"}, "security.protocol"),
        ({"security.protocol": "SASL_SSL", "sasl.username": "a"}, "sasl.mechanism"),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI", "sasl.password": SECRET},
            "sasl.mechanism",
        ),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.password": SECRET},
            "user name",
        ),
        ({"ssl.endpoint.identification.algorithm": "dns"}, "identification"),
        ({"ssl.truststore.location": "/a", "ssl.truststore.type": "JKS"}, "PEM"),
        ({"ssl.ca.location": "/a", "ssl.truststore.location": "/b"}, "different"),
        (
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "PLAIN",
                "sasl.jaas.config": f"com.example.Login required password={SECRET};",
            },
            "not supported",
        ),
        (
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                f'required username="a" password="{SECRET}";',
            },
            "login module",
        ),
        (
            {
                "sasl.password": "other",
                "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                f'required username="a" password="{SECRET}";',
            },
            "differ",
        ),
        ({"sasl.jaas.config": f"garbage {SECRET}"}, "sasl.jaas.config"),
    ],
)
def test_bad_values_are_refused_without_the_password(configs: dict[str, str], names: str) -> None:
    with pytest.raises(ValueError, match=names) as refused:
        LinkSecurity.from_configs(configs)
    assert SECRET not in str(refused.value)


def test_jaas_options() -> None:
    module, options = parse_jaas_config(
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="a,b" '
        'password="x=y" tokenauth=false;'
    )
    assert module == "SCRAM" and options == {
        "username": "a,b",
        "password": "x=y",
        "tokenauth": "false",
    }
    assert plain_message("u", "p") == b"\0u\0p"


@pytest.mark.parametrize("mechanism", sorted(sasl.SCRAM_HASHES))
@pytest.mark.parametrize("user", ["alice", "we,ird=name"])
def test_scram_against_the_gateway_server(mechanism: str, user: str) -> None:
    credential = sasl.scram_credential(mechanism, SECRET, os.urandom(16), 4096)
    server = sasl.ScramServer(
        mechanism,
        lambda name, mech: credential if name == user else None,
        "serverNonce123",
        b"mask",
    )
    client = ScramClient(mechanism, user, SECRET, "clientNonce456")
    server_first = server.step(client.first())
    server_final = server.step(client.final(server_first))
    client.verify(server_final)
    assert server.done and server.principal == user
    assert SECRET not in repr(client)


def test_scram_wrong_password_is_refused_by_the_server() -> None:
    credential = sasl.scram_credential("SCRAM-SHA-256", SECRET, os.urandom(16), 4096)
    server = sasl.ScramServer("SCRAM-SHA-256", lambda *_: credential, "sn", b"mask")
    client = ScramClient("SCRAM-SHA-256", "alice", "wrong", "cn")
    server_first = server.step(client.first())
    with pytest.raises(Exception, match="invalid credentials"):
        server.step(client.final(server_first))


def test_scram_rfc7677_example() -> None:
    """RFC 7677 section 3: user "user", password "pencil", the RFC's nonces and salt."""
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", "rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert client.final(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    client.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(ScramClientError, match="signature does not match"):
        client.verify(b"v=" + base64.b64encode(b"\0" * 32))


@pytest.mark.parametrize(
    ("server_first", "reason"),
    [
        (b"r=other,s=AAAA,i=4096", "nonce"),
        (b"r=cn,s=AAAA,i=4096", "nonce"),  # not extended at all
        (b"r=cnX,s=AAAA,i=1000", "iterations"),
        (b"r=cnX,s=AAAA,i=10000000", "iterations"),
        (b"r=cnX,i=4096", "s= or i="),
        (b"r=cnX,s=!!,i=4096", "base64"),
        (b"e=unknown-user", "refused"),
        (b"\xff", "UTF-8"),
        (b"garbage", "malformed"),
    ],
)
def test_scram_bad_server_first(server_first: bytes, reason: str) -> None:
    client = ScramClient("SCRAM-SHA-512", "alice", SECRET, "cn")
    with pytest.raises(ScramClientError, match=reason) as refused:
        client.final(server_first)
    assert SECRET not in str(refused.value)


def test_scram_verify_before_final_and_server_error() -> None:
    client = ScramClient("SCRAM-SHA-256", "alice", SECRET, "cn")
    with pytest.raises(ScramClientError, match="before"):
        client.verify(b"v=AAAA")
    client.final(b"r=cnX,s=AAAA,i=4096")
    with pytest.raises(ScramClientError, match="refused"):
        client.verify(b"e=invalid-proof")
    with pytest.raises(ValueError, match="nonce"):
        ScramClient("SCRAM-SHA-256", "alice", SECRET, "has,comma")
    with pytest.raises(ValueError, match="SCRAM"):
        ScramClient("PLAIN", "alice", SECRET, "cn")
