"""The client listeners' and client security's broker config keys (Kafka's names): listeners,
SASL, TLS, authorization and client quotas. Part of the broker registry in ``config_keys.py``;
what each key means at run time is in ``listeners.py``, ``gateway/authentication.py``,
``storage/pki.py``, ``acls.py`` and ``gateway/quotas.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

from raylog.actors.control import acls as acls_
from raylog.actors.control import listeners as listeners_
from raylog.actors.control.acls import STANDARD_AUTHORIZER
from raylog.actors.control.config_registry import ConfigDef, ConfigRegistry, invalid
from raylog.actors.control.principal_mapping import PrincipalMapper
from raylog.storage.errors import InvalidRequestError

SECURITY_CONFIG_DEFS: tuple[ConfigDef, ...] = (
    ConfigDef(
        name="listeners",
        type="string",
        default="",
        doc="The gateways' client listeners, NAME://HOST:PORT,... with the first broker's "
        "ports (the embedded cluster's broker i listens on each port + i). Empty: "
        "PLAINTEXT://127.0.0.1:<raylog up --port>.",
    ),
    ConfigDef(
        name="advertised.listeners",
        type="string",
        default="",
        doc="How clients reach each listener, NAME://HOST:PORT,...; a listener missing here is "
        "advertised as it listens (bound to every interface: as its node's address).",
    ),
    ConfigDef(
        name="listener.security.protocol.map",
        type="string",
        default=listeners_.DEFAULT_PROTOCOL_MAP,
        doc="The security protocol of each listener name, NAME:PROTOCOL,... (PLAINTEXT, SSL, "
        "SASL_PLAINTEXT, SASL_SSL).",
    ),
    ConfigDef(
        name="allow.insecure.network.listeners",
        type="boolean",
        default="false",
        doc="Allow a PLAINTEXT or SASL_PLAINTEXT listener on an address other than loopback.",
        note="Kafka has no such setting and allows it. raylog refuses to send records and PLAIN "
        "passwords unencrypted across a network unless told so.",
    ),
    ConfigDef(
        name="sasl.enabled.mechanisms",
        type="list",
        default="PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
        doc="The SASL mechanisms SASL listeners offer; credentials are SCRAM's for all three "
        "(`raylog users`).",
        note="Kafka's default is GSSAPI (Kerberos), which raylog does not implement.",
    ),
    ConfigDef(
        name="connection.failed.authentication.delay.ms",
        type="int",
        default="100",
        minimum=0,
        doc="How long a failed authentication's answer is held before the connection closes; "
        "doubled for each further failure from the same address within a minute (up to 5 s).",
        note="Kafka delays every failure by the same time.",
    ),
    ConfigDef(
        name="ssl.keystore.type",
        type="string",
        default="PEM",
        choices=("PEM",),
        doc="The format of ssl.keystore.location.",
        note="Kafka's default is JKS; raylog reads PEM only.",
    ),
    ConfigDef(
        name="ssl.keystore.location",
        type="string",
        default="",
        doc="SSL and SASL_SSL listeners' certificate: one PEM file with the private key and the "
        "certificate chain, read again when it changes. Empty: a certificate of the cluster CA "
        "(90 days, renewed at two thirds of its life; `raylog certs ca` exports the CA).",
    ),
    ConfigDef(
        name="ssl.key.password",
        type="string",
        default="",
        sensitive=True,
        doc="The password of ssl.keystore.location's private key, if it is encrypted.",
    ),
    ConfigDef(
        name="ssl.truststore.type",
        type="string",
        default="PEM",
        choices=("PEM",),
        doc="The format of ssl.truststore.location.",
        note="Kafka's default is JKS; raylog reads PEM only.",
    ),
    ConfigDef(
        name="ssl.truststore.location",
        type="string",
        default="",
        doc="The CA certificates (PEM) client certificates are checked against. Empty: the "
        "cluster CA (`raylog certs issue` issues client certificates from it).",
    ),
    ConfigDef(
        name="ssl.client.auth",
        type="string",
        default="none",
        choices=("none", "requested", "required"),
        doc="Whether SSL listeners ask clients for a certificate; its subject, mapped by "
        "ssl.principal.mapping.rules, is then the client's principal.",
    ),
    ConfigDef(
        name="ssl.principal.mapping.rules",
        type="string",
        default="DEFAULT",
        doc="Kafka's rules from a client certificate's subject to its principal's name, e.g. "
        "RULE:^CN=(.*?),.*$/$1/,DEFAULT.",
    ),
    # Authorization (raylog.actors.control.acls).
    ConfigDef(
        name="authorizer.class.name",
        type="string",
        default="",
        doc=f"Empty: no authorization. {STANDARD_AUTHORIZER}: Kafka's ACLs (`raylog acls`) "
        "decide every request.",
    ),
    ConfigDef(
        name="super.users",
        type="string",
        default="",
        doc="Principals allowed everything, separated by semicolons: User:admin;User:ops.",
    ),
    ConfigDef(
        name="allow.everyone.if.no.acl.found",
        type="boolean",
        default="false",
        doc="Allow every principal on a resource no ACL names.",
    ),
    ConfigDef(
        name="quota.window.num",
        type="int",
        default="11",
        minimum=1,
        doc="The number of samples a client's rate is measured over, for its quotas.",
    ),
    ConfigDef(
        name="quota.window.size.seconds",
        type="int",
        default="1",
        minimum=1,
        doc="The time span of each sample of a client's rate; also the longest throttle time.",
    ),
)


def check_listeners(reg: ConfigRegistry, given: Mapping[str, str]) -> None:
    # The formats only; their ports and addresses are checked where the brokers start.
    if given.get("listeners"):
        listeners_.parse_listeners(
            given["listeners"],
            given.get("advertised.listeners", ""),
            given.get("listener.security.protocol.map", listeners_.DEFAULT_PROTOCOL_MAP),
        )
    elif given.get("advertised.listeners"):
        raise invalid("advertised.listeners", given["advertised.listeners"], "needs listeners")
    if "ssl.principal.mapping.rules" in given:
        PrincipalMapper.from_rules(given["ssl.principal.mapping.rules"])


def check_authorizer(reg: ConfigRegistry, given: Mapping[str, str]) -> None:
    name = given.get("authorizer.class.name", "")
    if name not in ("", STANDARD_AUTHORIZER):
        raise invalid(
            "authorizer.class.name",
            name,
            f"raylog implements Kafka's {STANDARD_AUTHORIZER} only (or empty: no authorization)",
        )
    try:
        acls_.parse_super_users(given.get("super.users", ""))
    except InvalidRequestError as exc:
        raise invalid("super.users", given["super.users"], str(exc)) from None
