"""Kafka's listener model as raylog parses and places it (actors/control/listeners.py).

Proves: ``listeners`` / ``advertised.listeners`` / ``listener.security.protocol.map`` parse with
Kafka's formats and refuse what Kafka refuses (unknown protocol, a name twice, a port twice, an
advertised listener that does not exist, an advertised every-interface address); each embedded
broker's ports move by its index and overlapping ranges are refused; a Ray node's listeners move
with its ``raylog.port`` label and an empty host becomes the node's address; a listener without
TLS beyond loopback is refused unless allowed; the broker configs refuse bad values at once.
"""

from __future__ import annotations

import pytest

from raylog.actors.control import config_keys
from raylog.actors.control import listeners as ls
from raylog.storage.errors import InvalidConfigError


def parse(listeners: str, advertised: str = "") -> tuple[ls.Listener, ...]:
    return ls.parse_listeners(listeners, advertised, ls.DEFAULT_PROTOCOL_MAP)


def test_listeners_parse_with_protocols_and_advertised_addresses() -> None:
    found = parse(
        "PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9192,ssl://:9292",
        "SASL_SSL://kafka.example.com:19192",
    )
    assert [(x.name, x.security_protocol, x.tls, x.sasl) for x in found[:2]] == [
        ("PLAINTEXT", "PLAINTEXT", False, False),
        ("SASL_SSL", "SASL_SSL", True, True),
    ]
    assert (found[1].host, found[1].advertised_host, found[1].advertised_port) == (
        "0.0.0.0",
        "kafka.example.com",
        19192,
    )
    mapped = ls.parse_listeners(
        "CLIENT://[::1]:9092,REPLICAS://:9093", "", "CLIENT:SASL_SSL,REPLICAS:SSL"
    )
    assert [(x.name, x.security_protocol, x.host) for x in mapped] == [
        ("CLIENT", "SASL_SSL", "::1"),
        ("REPLICAS", "SSL", ""),
    ]


@pytest.mark.parametrize(
    ("listeners", "advertised", "says"),
    [
        ("INTERNAL://127.0.0.1:9092", "", "no security protocol"),
        ("PLAINTEXT://a:1,PLAINTEXT://b:2", "", "named twice"),
        ("PLAINTEXT://a:1,SSL://b:1", "", "a port of its own"),
        ("PLAINTEXT:127.0.0.1:9092", "", "not NAME://HOST:PORT"),
        ("PLAINTEXT://h:70000", "", "not in 0-65535"),
        ("", "", "at least one listener"),
        ("PLAINTEXT://h:1", "SSL://h:2", "no such listener: SSL"),
        ("PLAINTEXT://h:1", "PLAINTEXT://0.0.0.0:1", "advertised as every interface"),
    ],
)
def test_bad_listeners_are_refused_naming_why(listeners: str, advertised: str, says: str) -> None:
    with pytest.raises(InvalidConfigError, match=says):
        parse(listeners, advertised)


def test_bad_protocol_maps_are_refused() -> None:
    with pytest.raises(InvalidConfigError, match="is not one of"):
        ls.parse_protocol_map("CLIENT:TLS")
    with pytest.raises(InvalidConfigError, match="mapped twice"):
        ls.parse_protocol_map("A:SSL,a:SSL")


def test_embedded_brokers_take_consecutive_ports_without_overlap() -> None:
    base = parse("PLAINTEXT://127.0.0.1:9092,SASL_SSL://:9192")
    brokers = ls.embedded_brokers(base, 3, "127.0.0.1")
    assert [[(x.host, x.port, x.advertised_port) for x in own] for own in brokers] == [
        [("127.0.0.1", 9092 + i, 9092 + i), ("127.0.0.1", 9192 + i, 9192 + i)] for i in range(3)
    ]
    with pytest.raises(InvalidConfigError, match="leave a gap"):
        ls.embedded_brokers(parse("PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093"), 3, "h")


def test_a_ray_node_moves_ports_with_its_label_and_fills_in_its_address() -> None:
    base = parse("SASL_SSL://:9093,PLAINTEXT://127.0.0.1:9092")
    own = ls.for_broker(base, 100, "10.1.2.3")  # its raylog.port label says 9193
    assert [(x.host, x.port, x.advertised_host, x.advertised_port) for x in own] == [
        ("10.1.2.3", 9193, "10.1.2.3", 9193),
        ("127.0.0.1", 9192, "127.0.0.1", 9192),
    ]
    every = ls.for_broker(parse("SSL://0.0.0.0:9093"), 0, "10.1.2.3")[0]
    assert (every.host, every.advertised_host) == ("0.0.0.0", "10.1.2.3")
    assert every.endpoint() == ls.Endpoint("SSL", "10.1.2.3", 9093, "SSL")


@pytest.mark.parametrize(
    ("listeners", "refused"),
    [
        ("PLAINTEXT://127.0.0.1:9092", False),
        ("PLAINTEXT://localhost:9092", False),
        ("PLAINTEXT://[::1]:9092", False),
        ("SASL_SSL://0.0.0.0:9092", False),
        ("SSL://:9092", False),
        ("PLAINTEXT://0.0.0.0:9092", True),
        ("PLAINTEXT://:9092", True),
        ("SASL_PLAINTEXT://10.0.0.5:9092", True),
        ("PLAINTEXT://kafka.internal:9092", True),
    ],
)
def test_unencrypted_listeners_beyond_loopback_need_saying_so(
    listeners: str, refused: bool
) -> None:
    found = parse(listeners)
    if refused:
        with pytest.raises(InvalidConfigError, match=r"allow\.insecure\.network\.listeners"):
            ls.check_exposure(found, allow_insecure=False)
    else:
        ls.check_exposure(found, allow_insecure=False)
    ls.check_exposure(found, allow_insecure=True)


def test_broker_configs_check_listeners_and_the_cluster_default() -> None:
    with pytest.raises(InvalidConfigError, match="listeners"):
        config_keys.broker_config({"listeners": "PLAINTEXT//x:1"})
    with pytest.raises(InvalidConfigError, match="needs listeners"):
        config_keys.broker_config({"advertised.listeners": "PLAINTEXT://x:1"})
    with pytest.raises(InvalidConfigError, match=r"ssl\.client\.auth"):
        config_keys.broker_config({"ssl.client.auth": "always"})
    default = config_keys.broker_config({})
    assert ls.configured(default, "PLAINTEXT://127.0.0.1:9092")[0].port == 9092
    on_ray = ls.configured(default, ls.RAY_CLUSTER_DEFAULT.format(port=9093))
    assert [(x.security_protocol, x.host, x.port) for x in on_ray] == [("SASL_SSL", "", 9093)]
    with pytest.raises(InvalidConfigError, match="unencrypted"):
        ls.configured(config_keys.broker_config({"listeners": "PLAINTEXT://:9092"}), "")
    secret = config_keys.BROKER_CONFIGS.describe({"ssl.key.password": "hunter2"})
    row = next(e for e in secret if e.name == "ssl.key.password")
    assert row.value is None and row.is_sensitive
