"""A TLS client's principal: its certificate's subject as Kafka reads it, mapped by
``ssl.principal.mapping.rules``.

Proves: the rules are split and parsed as Kafka does (Kafka's SslPrincipalMapperTest's valid,
invalid and splitting cases, its rule list shown the way Kafka shows it) and map Kafka's own
examples to Kafka's answers (case folding, ``DEFAULT``, a comma inside a value); replacements
follow Java's (``$n``, ``${name}``, ``\\$``, a group beyond the pattern's is literal) and bad
ones are InvalidConfigError; no rule applying is SslAuthenticationFailedError. ``subject_dn``
writes a certificate's subject as Java's ``X500Principal.getName()``: RDNs last-first, the RFC
2253 keywords, other types as OID and hex DER, multi-valued RDNs, escapes of special
characters, NUL and edge spaces; it agrees with cryptography's RFC 4514 writer on plain names.
``peer_principal`` is ``User:`` + the mapped name, ``User:ANONYMOUS`` without a certificate,
and refuses bytes that are not a certificate (fuzzed: no other exception escapes).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import string

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from raylog.actors.control.principal_mapping import (
    ANONYMOUS,
    PrincipalMapper,
    peer_principal,
    subject_dn,
)
from raylog.storage import pki
from raylog.storage.errors import InvalidConfigError, SslAuthenticationFailedError

# Kafka's own examples (SslPrincipalMapperTest.testSslPrincipalMapper).
KAFKA_RULES = ", ".join(
    [
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT",
    ]
)


@pytest.mark.parametrize(
    ("dn", "name"),
    [
        ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
        ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
        ("cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"),
        ("cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
        ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
    ],
)
def test_kafka_examples(dn: str, name: str) -> None:
    assert PrincipalMapper.from_rules(KAFKA_RULES).name(dn) == name


def test_comma_inside_a_value() -> None:
    mapper = PrincipalMapper.from_rules(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"


@pytest.mark.parametrize(
    "rules",
    [
        "DEFAULT",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
        "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
        "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
        "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
    ],
)
def test_kafka_valid_rules(rules: str) -> None:
    assert PrincipalMapper.from_rules(rules).rules


@pytest.mark.parametrize(
    "rules",
    [
        "default",
        "DEFAUL",
        "DEFAULT/L",
        "DEFAULT/U",
        "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
        "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
    ],
)
def test_kafka_invalid_rules(rules: str) -> None:
    with pytest.raises(InvalidConfigError, match=r"^ssl\.principal\.mapping\.rules: invalid rule"):
        PrincipalMapper.from_rules(rules)


@pytest.mark.parametrize(
    ("rules", "shown"),
    [
        ("", "[]"),
        ("DEFAULT", "[DEFAULT]"),
        ("RULE://", "[RULE:/]"),
        ("RULE:/.*/", "[RULE:/.*]"),
        ("RULE:/.*/L", "[RULE:/.*/L]"),
        ("RULE://,DEFAULT", "[RULE:/, DEFAULT]"),
        ("  RULE:// ,  DEFAULT  ", "[RULE:/, DEFAULT]"),
        ("  RULE:   /     / ,  DEFAULT  ", "[RULE:   /     , DEFAULT]"),
        ("  RULE:  /     /U   ,DEFAULT  ", "[RULE:  /     /U, DEFAULT]"),
        (
            "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ",
            "[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]",
        ),
        (",   , , ,      , , ,   ", "[]"),
        (",,RULE://,,,DEFAULT,,", "[RULE:/, DEFAULT]"),
        (",  , RULE: /   /    ,,,   DEFAULT, ,   ", "[RULE: /   , DEFAULT]"),
        ("     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,", "[RULE:   /  /U, DEFAULT]"),
        (r"RULE:\/\\\(\)\n\t/\/\//", r"[RULE:\/\\\(\)\n\t/\/\/]"),
        (r"RULE:\**\/+/*/L,RULE:\/*\**/**/", r"[RULE:\**\/+/*/L, RULE:\/*\**/**]"),
        (
            r"RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, "
            r"/DEFAULT/,DEFAULT",
            r"[RULE:,RULE:,/,RULE:,\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, "
            r"/DEFAULT, DEFAULT]",
        ),
    ],
)
def test_kafka_rule_splitting(rules: str, shown: str) -> None:
    assert str(PrincipalMapper.from_rules(rules)) == shown


def test_none_is_the_default_rule() -> None:
    assert str(PrincipalMapper.from_rules(None)) == "[DEFAULT]"
    assert PrincipalMapper.from_rules(None).name("CN=a,O=b") == "CN=a,O=b"


@pytest.mark.parametrize(
    ("rule", "dn", "name"),
    [
        ("RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$4/", "CN=a,OU=b,O=c", "a@$4"),  # no group 4
        ("RULE:^CN=(.*?),OU=(.*?)$/$12/", "CN=a,OU=b", "a2"),  # $1 then the digit 2
        (r"RULE:^CN=(.*?)$/\$1-$1/", "CN=a", "$1-a"),  # a quoted $
        ("RULE:^CN=(?<user>[a-z]+)(,.*|$)/${user}/U", "CN=bob,O=x", "BOB"),  # Java's named group
        ("RULE:^CN=([^,]+)(,O=(x))?$/$1$3/", "CN=bob", "bob"),  # an unmatched group is empty
        ("RULE:^CN=([^,]+).*$/$0/", "CN=bob,O=x", "CN=bob,O=x"),  # group 0, the whole match
        ("RULE:.*/x/", "CN=bob", "xx"),  # Java's replaceAll: the empty match at the end too
    ],
)
def test_replacements_are_java_s(rule: str, dn: str, name: str) -> None:
    assert PrincipalMapper.from_rules(rule).name(dn) == name


@pytest.mark.parametrize(
    ("rules", "says"),
    [
        ("RULE:^CN=.*$/$1/", "the pattern has no groups"),
        ("RULE:^CN=(.*)$/$x/", "'$' names no group"),
        ("RULE:^CN=(.*)$/${nobody}/", "no group ${nobody}"),
        ("RULE:^CN=((.*)$/$1/", "bad pattern"),
    ],
)
def test_bad_replacements_and_patterns(rules: str, says: str) -> None:
    with pytest.raises(InvalidConfigError) as raised:
        PrincipalMapper.from_rules(rules)
    assert says in str(raised.value)


def test_no_rule_applying_fails_authentication() -> None:
    mapper = PrincipalMapper.from_rules("RULE:^CN=(.*?),OU=ServiceUsers$/$1/")
    assert mapper.name("CN=svc,OU=ServiceUsers") == "svc"
    with pytest.raises(SslAuthenticationFailedError, match=r"no ssl\.principal\.mapping\.rules"):
        mapper.name("CN=alice,OU=People")
    with pytest.raises(SslAuthenticationFailedError):
        PrincipalMapper.from_rules("").name("CN=alice")


def certificate(*rdns: x509.RelativeDistinguishedName) -> bytes:
    """A self-signed certificate (DER) with this subject, RDNs in encoding order."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(list(rdns))
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer")]))
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        .not_valid_after(dt.datetime(2040, 1, 1, tzinfo=dt.UTC))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


def rdn(*pairs: tuple[x509.ObjectIdentifier, str]) -> x509.RelativeDistinguishedName:
    return x509.RelativeDistinguishedName([x509.NameAttribute(o, v) for o, v in pairs])


def test_subject_is_written_as_java_writes_it() -> None:
    duke = certificate(
        rdn((NameOID.COUNTRY_NAME, "US")),
        rdn((NameOID.ORGANIZATION_NAME, "Sun Microsystems")),
        rdn((NameOID.ORGANIZATIONAL_UNIT_NAME, "JavaSoft")),
        rdn((NameOID.COMMON_NAME, "Duke")),
    )
    assert subject_dn(duke) == "CN=Duke,OU=JavaSoft,O=Sun Microsystems,C=US"
    every_keyword = certificate(
        rdn((NameOID.DOMAIN_COMPONENT, "com")),
        rdn((NameOID.DOMAIN_COMPONENT, "acme")),
        rdn((NameOID.STATE_OR_PROVINCE_NAME, "MD")),
        rdn((NameOID.LOCALITY_NAME, "Fulton")),
        rdn((NameOID.STREET_ADDRESS, "1 Main St")),
        rdn((NameOID.USER_ID, "u1")),
        rdn((NameOID.COMMON_NAME, "alice")),
    )
    assert (
        subject_dn(every_keyword)
        == "CN=alice,UID=u1,STREET=1 Main St,L=Fulton,ST=MD,DC=acme,DC=com"
    )
    # Other types: the dotted OID and the DER of the value in hex (IA5String, PrintableString).
    email = certificate(
        rdn((NameOID.EMAIL_ADDRESS, "a@b.c")),
        rdn((NameOID.SERIAL_NUMBER, "42")),
        rdn((NameOID.COMMON_NAME, "alice")),
    )
    hex_email = (b"\x16\x05" + b"a@b.c").hex()
    assert subject_dn(email) == f"CN=alice,2.5.4.5=#13023432,1.2.840.113549.1.9.1=#{hex_email}"
    multi = certificate(rdn((NameOID.COMMON_NAME, "a"), (NameOID.USER_ID, "b")))
    assert subject_dn(multi) == "CN=a+UID=b"


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("Tkac, Adam", r"Tkac\, Adam"),
        ('a=b#c+d<e>f;g"h\\i', r"a\=b\#c\+d\<e\>f\;g\"h\\i"),
        ("#lead", r"\#lead"),
        (" both ends ", r"\ both ends\ "),
        ("  ", r"\ \ "),
        ("nul\0here", r"nul\00here"),
        ("Zoë_@*", "Zoë_@*"),  # not escaped: as it is
    ],
)
def test_values_are_escaped_as_java_escapes_them(value: str, written: str) -> None:
    assert subject_dn(certificate(rdn((NameOID.COMMON_NAME, value)))) == f"CN={written}"


def test_agrees_with_rfc4514_on_plain_names() -> None:
    rng = random.Random(7)
    oids = [NameOID.COMMON_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME, NameOID.ORGANIZATION_NAME]
    for _ in range(20):
        rdns = [
            rdn((rng.choice(oids), "".join(rng.choices(string.ascii_letters + " .-", k=8)).strip()
                 or "x"))
            for _ in range(rng.randint(1, 4))
        ]  # fmt: skip
        der = certificate(*rdns)
        assert subject_dn(der) == x509.load_der_x509_certificate(der).subject.rfc4514_string()


def test_peer_principal() -> None:
    alice = pki.CertificateAuthority.generate("c").issue("alice", server=False)
    der = x509.load_pem_x509_certificate(alice.cert_pem).public_bytes(serialization.Encoding.DER)
    assert peer_principal(der, PrincipalMapper.from_rules(None)) == "User:CN=alice"
    mapped = PrincipalMapper.from_rules("RULE:^CN=(.*)$/$1/")
    assert peer_principal(der, mapped) == "User:alice"
    assert peer_principal(None, mapped) == ANONYMOUS == "User:ANONYMOUS"
    with pytest.raises(SslAuthenticationFailedError, match="does not parse"):
        peer_principal(b"\x30\x03\x02\x01\x01", mapped)


def test_fuzzed_bytes_only_fail_authentication() -> None:
    rng = random.Random(11)
    good = certificate(rdn((NameOID.COMMON_NAME, "alice")))
    mapper = PrincipalMapper.from_rules(None)
    for _ in range(2000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = data[: rng.randint(0, len(data))] if rng.random() < 0.3 else data
        with contextlib.suppress(SslAuthenticationFailedError):
            assert peer_principal(bytes(data), mapper).startswith("User:")
