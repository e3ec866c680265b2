"""Pure: Kafka's listener model for the gateways' client listeners.

A broker listens on one or more listeners, each ``NAME://HOST:PORT`` with a security protocol
(``listener.security.protocol.map``; a listener named after a protocol has that protocol):

- ``PLAINTEXT``: no TLS, no authentication (principal ``User:ANONYMOUS``);
- ``SSL``: TLS; with ``ssl.client.auth=required`` the client's certificate names the principal;
- ``SASL_PLAINTEXT``: SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) without TLS;
- ``SASL_SSL``: SASL inside TLS.

A listener's host is an address of its broker's node, ``0.0.0.0`` / ``::`` for every interface,
or empty for the node's own address (Kafka's "default interface": the address Ray knows the node
by). ``advertised.listeners`` says how clients reach each listener (default: as it listens; a
listener bound to every interface is advertised as the node's address). Metadata and
FindCoordinator answer with the addresses of the listener the client came in on, so a client
that connected to ``SASL_SSL`` is never sent to the ``PLAINTEXT`` port.

raylog's brokers share one configuration, so the ports of ``listeners`` are the first broker's:
the embedded cluster's broker *i* (0-based) listens on each port + *i*, as ``--port`` gives
consecutive ports; on a Ray cluster every node's broker uses the ports as given, on its node
(moved by as much as its ``raylog.port`` label moves the first). Without ``listeners``, the
embedded cluster listens ``PLAINTEXT://127.0.0.1:<--port>`` and `raylog up --address`
:data:`RAY_CLUSTER_DEFAULT` (SASL_SSL on each node's address).

A listener without TLS on an address other than loopback sends every record, and with
``SASL_PLAINTEXT`` PLAIN's passwords, in clear text across the network: :func:`check_exposure`
refuses it unless ``allow.insecure.network.listeners`` says the user wants it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import msgspec

from raylog.storage.errors import InvalidConfigError

if TYPE_CHECKING:
    from raylog.actors.control.config_keys import BrokerConfig

__all__ = [
    "SECURITY_PROTOCOLS",
    "Endpoint",
    "Listener",
    "check_exposure",
    "for_broker",
    "parse_listeners",
    "parse_protocol_map",
]

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
DEFAULT_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in SECURITY_PROTOCOLS)
# `raylog up --address`'s listener when none is configured: SASL over TLS on every node's address.
RAY_CLUSTER_DEFAULT = "SASL_SSL://:{port}"
LISTENERS_MAX = 16  # per broker

_NAME = re.compile(r"[A-Za-z0-9_]+")
_ENTRY = re.compile(r"(?P<name>[^:/]+)://(?P<host>\[[^\]]*\]|[^:]*):(?P<port>-?[0-9]+)")


class Endpoint(msgspec.Struct, frozen=True):
    """How clients reach one listener of one broker (what the broker registers; stored in the
    cluster metadata)."""

    name: str
    host: str
    port: int
    security_protocol: str


@dataclass(frozen=True, slots=True)
class Listener:
    """One listener: where it binds, how it is advertised, and its security protocol."""

    name: str
    security_protocol: str
    host: str  # "": the node's address (for_broker fills it in); 0.0.0.0 / :: every interface
    port: int  # 0 = any free port (tests)
    advertised_host: str
    advertised_port: int

    @property
    def tls(self) -> bool:
        return self.security_protocol in (SSL, SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self.security_protocol in (SASL_PLAINTEXT, SASL_SSL)

    def endpoint(self) -> Endpoint:
        return Endpoint(
            self.name, self.advertised_host, self.advertised_port, self.security_protocol
        )

    @property
    def address(self) -> str:
        """``host:port`` as clients reach it."""
        return f"{self.advertised_host}:{self.advertised_port}"

    def describe(self) -> str:
        return f"{self.name}://{self.address}"


def _fail(key: str, value: str, why: str) -> InvalidConfigError:
    return InvalidConfigError(f"Invalid value {value!r} for configuration {key}: {why}")


def parse_protocol_map(text: str) -> dict[str, str]:
    """``listener.security.protocol.map``: ``NAME:PROTOCOL,...``."""
    key = "listener.security.protocol.map"
    found: dict[str, str] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not _NAME.fullmatch(name):
            raise _fail(key, text, f"{item!r} is not NAME:PROTOCOL")
        if protocol not in SECURITY_PROTOCOLS:
            raise _fail(key, text, f"{protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}")
        if name in found:
            raise _fail(key, text, f"listener {name} is mapped twice")
        found[name] = protocol
    return found


def _entries(key: str, text: str) -> list[tuple[str, str, int]]:
    entries: list[tuple[str, str, int]] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        m = _ENTRY.fullmatch(item)
        if m is None:
            raise _fail(key, text, f"{item!r} is not NAME://HOST:PORT")
        name, host, port = m["name"].strip().upper(), m["host"].strip("[]"), int(m["port"])
        if not _NAME.fullmatch(name):
            raise _fail(key, text, f"listener name {name!r} may hold letters, digits and _ only")
        if not 0 <= port <= 65535:
            raise _fail(key, text, f"port {port} is not in 0-65535")
        if any(e[0] == name for e in entries):
            raise _fail(key, text, f"listener {name} is named twice")
        entries.append((name, host, port))
    if not entries:
        raise _fail(key, text, "at least one listener is needed")
    if len(entries) > LISTENERS_MAX:
        raise _fail(key, text, f"at most {LISTENERS_MAX} listeners")
    return entries


EVERY_INTERFACE = ("0.0.0.0", "::")


def _every_interface(host: str) -> bool:
    """Bound to every interface, or (empty) to be advertised as the node's address."""
    return host in ("", *EVERY_INTERFACE)


def parse_listeners(
    listeners: str, advertised: str = "", protocol_map: str = DEFAULT_PROTOCOL_MAP
) -> tuple[Listener, ...]:
    """The listeners of ``listeners`` / ``advertised.listeners`` (Kafka's formats and rules:
    unique names and ports, every name mapped to a protocol, an advertised entry for a listener
    that exists). A listener bound to every interface and not advertised is advertised as its
    broker's node address (:func:`for_broker`)."""
    protocols = parse_protocol_map(protocol_map)
    bound = _entries("listeners", listeners)
    ads: dict[str, tuple[str, int]] = {}
    if advertised.strip():
        ads = {name: (h, p) for name, h, p in _entries("advertised.listeners", advertised)}
    ports = [port for _, _, port in bound if port]
    if len(set(ports)) != len(ports):
        raise _fail("listeners", listeners, "each listener needs a port of its own")
    result = []
    for name, host, port in bound:
        protocol = protocols.get(name)
        if protocol is None:
            raise _fail(
                "listeners",
                listeners,
                f"listener {name} has no security protocol in listener.security.protocol.map",
            )
        if name in ads:
            ad_host, ad_port = ads.pop(name)
            if _every_interface(ad_host):
                raise _fail(
                    "advertised.listeners",
                    advertised,
                    f"listener {name} is advertised as every interface: name the address "
                    "clients use",
                )
        else:  # as it listens; every interface: as its node's address (for_broker)
            ad_host, ad_port = ("" if _every_interface(host) else host), port
        result.append(Listener(name, protocol, host, port, ad_host, ad_port))
    if ads:
        raise _fail(
            "advertised.listeners", advertised, f"no such listener: {', '.join(sorted(ads))}"
        )
    return tuple(result)


def for_broker(
    listeners: Iterable[Listener], port_offset: int, node_address: str
) -> tuple[Listener, ...]:
    """The listeners of one broker on the node at ``node_address``: each port + ``port_offset``
    (the embedded cluster's broker index; on a Ray cluster, the node's ``raylog.port`` label
    minus the first listener's port), an empty host the node's address, and a listener bound
    to every interface and not advertised advertised as the node's address."""

    def shifted(port: int) -> int:
        return port + port_offset if port else 0

    return tuple(
        replace(
            listener,
            host=listener.host or node_address,
            port=shifted(listener.port),
            advertised_host=listener.advertised_host or node_address,
            advertised_port=shifted(listener.advertised_port),
        )
        for listener in listeners
    )


def configured(config: BrokerConfig, default: str) -> tuple[Listener, ...]:
    """The cluster's listeners from its broker configs (refused where :func:`check_exposure`
    refuses them); ``default`` (e.g. ``PLAINTEXT://127.0.0.1:9092``) when ``listeners`` is
    empty."""
    listeners = parse_listeners(
        config.listeners or default,
        config.advertised_listeners if config.listeners else "",
        config.listener_security_protocol_map,
    )
    check_exposure(listeners, config.allow_insecure_network_listeners)
    return listeners


def embedded_brokers(
    listeners: tuple[Listener, ...], brokers: int, node_address: str
) -> list[tuple[Listener, ...]]:
    """Each embedded broker's listeners (broker i: every port + i), refusing port ranges that
    overlap (``PLAINTEXT`` at 9092 and ``SASL_SSL`` at 9093 with three brokers)."""
    per_broker = [for_broker(listeners, i, node_address) for i in range(brokers)]
    seen: dict[int, str] = {}
    for i, own in enumerate(per_broker):
        for listener in own:
            if not listener.port:
                continue
            owner = f"{listener.name} of broker {i + 1}"
            other = seen.setdefault(listener.port, owner)
            if other != owner:
                raise InvalidConfigError(
                    f"port {listener.port} is both {other}'s and {listener.name}'s of broker "
                    f"{i + 1}: the embedded cluster's broker i listens on each listener's port "
                    "+ i, so leave a gap of at least the broker count between listener ports"
                )
    return per_broker


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def check_exposure(listeners: Iterable[Listener], allow_insecure: bool) -> None:
    """Refuse a listener without TLS bound beyond loopback, unless ``allow_insecure``
    (``allow.insecure.network.listeners``). A listener on its node's address (empty host)
    counts as on the network: a Ray node's address is."""
    if allow_insecure:
        return
    for listener in listeners:
        if not listener.tls and not _loopback(listener.host):
            where = (
                "every interface"
                if listener.host in EVERY_INTERFACE
                else listener.host or "its node's address"
            )
            raise InvalidConfigError(
                f"listener {listener.name} ({listener.security_protocol}) on {where} would "
                "carry records (and PLAIN passwords) unencrypted over the network: use SSL or "
                "SASL_SSL, bind it to 127.0.0.1, or set allow.insecure.network.listeners=true"
            )
