"""`raylog up --address` on a real multi-node Ray cluster, run as a user runs it.

A head started with ``ray start --head`` (no ``raylog`` resource) and worker nodes started with
``ray start --address ... --resources '{"raylog": 1}' --labels raylog.rack=R,...``, each a
process group of its own on a loopback address of its own (127.0.0.2, .3, .4: one machine
standing in for several), then ``raylog up --address`` on the head.

Proves: every ``raylog`` node gets a broker, registered with its rack and its node's address and
``raylog.port``, and a gateway listening there; Kafka clients produce (acks=all) to an RF=2 topic
created with ``raylog topics create`` and read every record back; a node added later gets a
broker (``raylog up`` prints that it joined, ``raylog brokers list`` shows three) and
``raylog reassign --rebalance`` moves replicas onto it and ``raylog brokers decommission`` moves
them off again and stops its broker (nothing lost); a node killed hard (SIGKILL to all its
processes) has its broker fenced and loses leadership to a live replica, `raylog up` prints
that its broker left, `raylog brokers start` of that broker fails with a one-line reason, and
every record is still read back; SIGINT stops `raylog up` with exit 0. The commands name the
head's data dir (`raylog up` runs them) and one names the Ray address instead. (The node
watcher and supervisor behind `raylog up --address` are proven here, on real `ray start`
nodes.)

How the nodes share one machine: ``tests/support/ray_nodes.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from support.cluster import ClusterUp, free_port_block
from support.ray_nodes import RayCluster, ray_cluster
from support.waiting import wait_until

# About 110 s on a quiet 2-core machine; each `raylog` command and actor start is a process,
# so a machine shared with other test runs can take several times that.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOPIC = "events"
PARTITIONS = 3
RECORDS = 300
TIMEOUT_S = 60.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RayCluster]:
    with ray_cluster(tmp_path) as c:
        yield c


def _json(done: Any) -> Any:
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _brokers(up: ClusterUp) -> list[dict[str, Any]]:
    done = up.raylog("brokers", "list", "--json")
    return json.loads(done.stdout) if done.returncode == 0 else []


def _alive_when(up: ClusterUp, count: int) -> dict[str, dict[str, Any]] | None:
    """Rack -> row of every broker `raylog brokers list` shows, once it shows ``count`` brokers,
    all alive."""
    rows = _brokers(up)
    if len(rows) != count or any(r["state"] != "alive" for r in rows):
        return None
    return {r["rack"]: r for r in rows}


def _partitions(up: ClusterUp) -> list[dict[str, Any]]:
    [topic] = _json(up.raylog("topics", "describe", TOPIC, "--json"))
    return list(topic["partitions"])


def _produce(bootstrap: str) -> None:
    failures: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(
            TOPIC,
            key=str(i).encode(),
            value=f"record-{i}".encode(),
            on_delivery=lambda err, _msg: failures.append(str(err)) if err else None,
        )
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0, "records not delivered in time"
    assert failures == []


def _consume_all(bootstrap: str) -> set[bytes]:
    """Every record of every partition, from offset 0."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    values: set[bytes] = set()
    try:  # assign() only: no group requests are sent
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.add(message.value())
    finally:
        consumer.close()
    return values


def test_raylog_up_address_runs_a_broker_per_raylog_node(cluster: RayCluster) -> None:
    started = time.monotonic()

    def progress(what: str) -> None:  # where the time goes, with -s
        print(f"{time.monotonic() - started:6.1f} s  {what}", flush=True)

    cluster.start_head()
    progress("head started")
    for rack, ip in (("a", "127.0.0.2"), ("b", "127.0.0.3")):
        cluster.add_node(rack, ip)
        progress(f"node {rack} started")
    port = free_port_block(2)
    up = ClusterUp(
        cluster.root / "head-data",
        f"127.0.0.1:{cluster.gcs_port}",
        port,
        dict(cluster.env),
        # PLAINTEXT on each node's (loopback) address, which `raylog up --address` refuses
        # unless told: its default is SASL_SSL (tests/e2e/test_client_security.py).
        "--broker-config", f"listeners=PLAINTEXT://:{port}",
        "--broker-config", "allow.insecure.network.listeners=true",
    )  # fmt: skip
    try:
        first = up.start()
        assert first, "ready with at least one broker serving"
        progress(f"raylog ready: {first}")
        alive = wait_until(
            lambda: _alive_when(up, 2),
            timeout_s=TIMEOUT_S,
            message="a broker on each raylog node",
        )
        assert alive.keys() == {"a", "b"}
        for rack, row in alive.items():  # the node's address and its raylog.port label
            assert (row["host"], row["port"]) == (cluster.hosts[rack], cluster.ports[rack])
            joined = f"{row['host']}:{row['port']}"
            if joined not in first:
                line = up.wait_joined(row["id"], TIMEOUT_S)
                assert f"joined at {joined} (rack {rack})" in line, line
        progress("both brokers alive")
        # Commands reach the cluster through the head's data dir (`raylog up` runs them: its
        # cluster.json names the Ray cluster's own token, not one in the data dir), and by the
        # Ray address too, joining Ray themselves.
        by_address = up.raylog_by_address("brokers", "list", "--json", timeout_s=120)
        assert {row["id"] for row in _json(by_address)} == {row["id"] for row in alive.values()}
        bootstrap = ",".join(f"{r['host']}:{r['port']}" for r in alive.values())
        created = up.raylog(
            "topics", "create", TOPIC, "--partitions", str(PARTITIONS),
            "--replication-factor", "2",
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        progress("topic created")
        _produce(bootstrap)
        assert len(_consume_all(bootstrap)) == RECORDS
        progress("produced and consumed on 2 nodes")

        # Scale out: a third raylog node gets a broker, and the rebalance puts replicas on it.
        cluster.add_node("c", "127.0.0.4")
        progress("node c started")
        alive = wait_until(
            lambda: _alive_when(up, 3),
            timeout_s=TIMEOUT_S,
            message="a broker on the third node",
        )
        new_id = alive["c"]["id"]
        assert "(rack c)" in up.wait_joined(new_id, TIMEOUT_S)
        moved = _json(up.raylog("reassign", "--rebalance", "--json", timeout_s=120))
        assert moved["done"] and moved["partitions"], moved
        before = {p["partition"]: p for p in _partitions(up)}
        assert any(new_id in p["replicas"] for p in before.values())
        progress(f"rebalanced onto broker {new_id}")

        # Scale in: the new broker decommissioned, its replicas move back, it stops.
        out = up.raylog("brokers", "decommission", str(new_id), timeout_s=120)
        assert out.returncode == 0, out.stderr
        assert f"Broker {new_id} decommissioned" in out.stdout, out.stdout
        assert all(new_id not in p["replicas"] for p in _partitions(up))
        assert {r["id"]: r["state"] for r in _brokers(up)}[new_id] == "shutdown"
        assert len(_consume_all(bootstrap)) == RECORDS
        before = {p["partition"]: p for p in _partitions(up)}
        progress(f"broker {new_id} decommissioned")

        # A node crashes: its leaders move to the other replica, and nothing is lost.
        victim_id = before[0]["leader"]
        victim = next(rack for rack, row in alive.items() if row["id"] == victim_id)
        cluster.nodes[victim].kill()
        progress(f"node {victim} (broker {victim_id}) killed")

        def moved_off() -> list[dict[str, Any]] | None:
            done = up.raylog("topics", "describe", TOPIC, "--json")
            if done.returncode != 0:
                return None  # e.g. a call that timed out while the node's death is handled
            ps = json.loads(done.stdout)[0]["partitions"]
            return ps if all(p["leader"] not in (victim_id, -1) for p in ps) else None

        after = wait_until(
            moved_off,
            timeout_s=TIMEOUT_S,
            message=f"new leaders after node {victim} (broker {victim_id}) died",
        )
        assert after[0]["leader"] != before[0]["leader"]
        states = {row["id"]: row["state"] for row in _brokers(up)}
        assert states[victim_id] == "fenced", states  # by the controller, the node being gone
        assert up.lines is not None
        up.lines.wait_for(f"broker {victim_id} left", TIMEOUT_S)  # `raylog up` says so
        restart = up.raylog("brokers", "start", str(victim_id))
        assert restart.returncode != 0, restart.stdout
        assert f"the Ray node of broker {victim_id} is gone" in restart.stderr, restart.stderr
        live = ",".join(
            f"{row['host']}:{row['port']}" for rack, row in alive.items() if rack != victim
        )
        assert len(_consume_all(live)) == RECORDS
        progress("failed over; every record read back")
        assert up.stop() == 0
        progress("raylog up stopped")
    finally:
        up.kill()
