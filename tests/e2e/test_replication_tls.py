"""Replication channels of a real embedded cluster: mutual TLS with the cluster's own CA
between machines, Unix sockets within one.

Proves, on the session's shared `raylog up` with three brokers (all on this machine): the CA is
created in the object store on first use; records produced with acks=all by confluent-kafka to
an RF=3 topic come back; every replica's channel server is TLS, for peers on other machines;
the links between these same-host replicas and gateways went over Unix sockets (checked by the
peer's user, ``SO_PEERCRED``) and none over TCP; followers received replication messages over
their channels and each leader served the gateway's produce calls over its channel, so the data
path after start-up did not go through Ray calls. The TLS handshake itself (leaves of the
cluster CA in, others out) is tests/storage/test_pki.py's, on real sockets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support.cluster import UpProcess, cli_env

from raylog.storage import pki
from raylog.storage.localstore import LocalObjectStore

pytestmark = pytest.mark.slow

TOPIC = "secure"
RECORDS = 200
TIMEOUT_S = 60.0
PROBE = Path(__file__).resolve().parents[1] / "support" / "channel_probe.py"


def _read_all(bootstrap: str) -> set[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "tls-read", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in (0, 1)])
    got: set[bytes] = set()
    for _ in range(int(TIMEOUT_S * 2)):  # bounded: 0.5 s per poll
        for msg in consumer.consume(500, 0.5):
            if msg.error() is None:
                got.add(msg.value())
        if len(got) >= RECORDS:
            break
    consumer.close()
    return got


def test_replication_channels_use_mutual_tls_between_machines_and_unix_sockets_within_one(
    shared_up: UpProcess,
) -> None:
    up = shared_up
    data = up.data_dir
    created = up.raylog(
        "topics", "create", TOPIC, "--partitions", "2", "--replication-factor", "3",
        "--config", "min.insync.replicas=2",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    producer = Producer({"bootstrap.servers": up.bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"v%d" % i, partition=i % 2)
    assert producer.flush(TIMEOUT_S) == 0
    assert _read_all(up.bootstrap) == {b"v%d" % i for i in range(RECORDS)}

    probe = subprocess.run(
        [sys.executable, str(PROBE), str(data), TOPIC],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=cli_env(),
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    line = next(x for x in probe.stdout.splitlines() if x.startswith("channels: "))
    stats = json.loads(line.removeprefix("channels: "))

    assert LocalObjectStore(data / "metadata").get(pki.CA_KEY) is not None, "no CA stored"
    assert len(stats) == 6
    assert all(s["tls"] == 1 and s["rejected"] == 0 for s in stats.values()), stats
    assert all(s["tcp_links_in"] == 0 for s in stats.values()), stats  # one machine: no TCP
    followers = [s for s in stats.values() if not s["leader"]]
    leaders = [s for s in stats.values() if s["leader"]]
    assert all(s["messages_in"] > 0 for s in followers), stats
    assert all(s["calls_in"] > 0 for s in leaders), stats
    assert all(s["local_links_in"] > 0 for s in [*followers, *leaders]), stats
