"""The session's security cluster: one `raylog up` for the modules that need listeners with TLS
and SASL and the StandardAuthorizer (tests/e2e/test_client_security.py and
tests/e2e/test_acls_matrix_live.py; the ``secure_cluster`` fixture in tests/conftest.py).

Two brokers on loopback, four listeners each: PLAINTEXT (raylog's own tools), SASL_SSL, SSL with
``ssl.client.auth=required`` and SASL_PLAINTEXT; ``super.users=User:admin``, ``admin`` a SCRAM
and PLAIN user; Metadata auto-creation on with ``num.partitions=2`` and
``default.replication.factor=2`` (not Kafka's defaults, so that a test sees them applied); a
group's first rebalance without Kafka's 3 s wait for more members (the groups here have one
member each, of confluent-kafka or kafkajs). Each module adds its own users, ACLs, certificates
and topics, and names them apart from the other's.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from raylog.actors.control.acls import STANDARD_AUTHORIZER
from support.cluster import RAYLOG, UpProcess, cli_env, free_port_block, started_up

BROKERS = 2
SUPER_USER = "admin"
SUPER_PASSWORD = "s3cure-e2e-Passw0rd"
USERS_TIMEOUT_S = 60.0
# The port block: each listener's first broker, the next port its second broker's; the metrics
# endpoint on `raylog up`'s default, the port after the first listener's last.
PLAINTEXT_AT, SASL_SSL_AT, SSL_AT, SASL_PLAINTEXT_AT = 0, 3, 5, 7
PORTS = 9


@dataclass
class SecureCluster:
    up: UpProcess
    plaintext: str  # the bootstrap servers of each listener
    sasl_ssl: str
    ssl: str
    sasl_plaintext: str


def _servers(port: int) -> str:
    return ",".join(f"127.0.0.1:{port + i}" for i in range(BROKERS))


def create_user(up: UpProcess, name: str, password: str, *mechanisms: str) -> None:
    """`raylog users create NAME --password-stdin` (with ``--mechanism`` each of ``mechanisms``;
    none: the command's default ones)."""
    flags = [a for m in mechanisms for a in ("--mechanism", m)]
    done = subprocess.run(
        [*RAYLOG, "users", "create", name, *flags, "--password-stdin",
         "--data-dir", str(up.data_dir)],
        input=password, capture_output=True, text=True, timeout=USERS_TIMEOUT_S, env=cli_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def start_secure_cluster(make_data_dir: Callable[[], Path]) -> SecureCluster:
    """Start it and create the super user (the caller stops ``up``)."""
    port = free_port_block(PORTS)
    listeners = ",".join(
        f"{protocol}://127.0.0.1:{port + at}"
        for protocol, at in (
            ("PLAINTEXT", PLAINTEXT_AT),
            ("SASL_SSL", SASL_SSL_AT),
            ("SSL", SSL_AT),
            ("SASL_PLAINTEXT", SASL_PLAINTEXT_AT),
        )
    )
    up = started_up(
        make_data_dir,
        "--broker-config", f"listeners={listeners}",
        "--broker-config", "ssl.client.auth=required",
        "--broker-config", f"authorizer.class.name={STANDARD_AUTHORIZER}",
        "--broker-config", f"super.users=User:{SUPER_USER}",
        "--broker-config", "auto.create.topics.enable=true",
        "--broker-config", "num.partitions=2",
        "--broker-config", f"default.replication.factor={BROKERS}",
        "--broker-config", "group.initial.rebalance.delay.ms=0",
        brokers=BROKERS,
        port=port,
    )  # fmt: skip
    try:
        create_user(up, SUPER_USER, SUPER_PASSWORD)
    except BaseException:
        up.__exit__(None, None, None)
        raise
    return SecureCluster(
        up,
        plaintext=_servers(port + PLAINTEXT_AT),
        sasl_ssl=_servers(port + SASL_SSL_AT),
        ssl=_servers(port + SSL_AT),
        sasl_plaintext=_servers(port + SASL_PLAINTEXT_AT),
    )
