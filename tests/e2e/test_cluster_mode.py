"""`raylog up --address` on a real multi-node Ray cluster, run as a user runs it.

A head started with ``ray start --head`` (no ``raylog`` resource) and worker nodes started with
``ray start --address ... --resources '{"raylog": 1}' --labels raylog.rack=R,...``, each a
process group of its own on a loopback address of its own (127.0.0.2, .3, .4: one machine
standing in for several), then ``raylog up --address`` on the head.

Proves: every ``raylog`` node gets a broker, registered with its rack and its node's address and
``raylog.port``, and a gateway listening there; Kafka clients produce (acks=all) to an RF=2 topic
created with ``raylog topics create`` and read every record back; a node added later gets a
broker (``raylog up`` prints that it joined, ``raylog brokers list`` shows three) and
continuous balancing moves replicas onto it until every broker holds as many, within one
(``raylog status`` says balanced); ``raylog brokers decommission`` moves them off again and
stops its broker (nothing lost), and started again it is filled again; with the metadata in S3
(moto's server) the two controllers run on the two first raylog nodes, and the node of the
active one killed hard (SIGKILL to all its processes) hands the controller to the standby,
`raylog up` starts the lost controller again on another node, the node's broker is fenced and
loses its leaderships to live replicas, `raylog up` prints that its broker left, `raylog
brokers start` of that broker fails with a one-line reason, every record is still read back,
and once the broker counts as lost its replicas are re-created on the brokers left; a fourth
node is filled, then drained by Ray (``ray drain-node``, as for a preemption notice), and its
broker is decommissioned without anyone asking, every replica moved off; SIGINT stops `raylog
up` with exit 0. The commands name the head's data dir (`raylog up` runs them)
and one names the Ray address instead. (The node watcher and supervisor behind `raylog up
--address` are proven here, on real `ray start` nodes.)

How the nodes share one machine: ``tests/support/ray_nodes.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
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
def cluster(tmp_path: Path, s3_client_kwargs: dict[str, Any]) -> Iterator[RayCluster]:
    aws = {  # every node's processes reach the S3 store (moto's server on loopback)
        "AWS_ACCESS_KEY_ID": s3_client_kwargs["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": s3_client_kwargs["aws_secret_access_key"],
        "AWS_DEFAULT_REGION": s3_client_kwargs["region_name"],
    }
    with ray_cluster(tmp_path, env=aws) as c:
        yield c


def _controllers(up: ClusterUp) -> dict[str, str] | None:
    """Role -> node address of the two controllers, once one is active and one standby."""
    done = up.raylog("status", "--json")
    if done.returncode != 0:
        return None  # no active controller (yet)
    rows = json.loads(done.stdout)["controllers"]
    roles = {row["role"]: row["node"] for row in rows}
    return roles if sorted(roles) == ["active", "standby"] and len(rows) == 2 else None


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


def _balanced(up: ClusterUp, broker_id: int) -> bool:
    """Whether the balancer says so and ``broker_id`` holds as many replicas as the others,
    within one (every topic's partitions, the internal ones too)."""
    status = up.raylog("status", "--json")
    if status.returncode != 0 or json.loads(status.stdout)["replica_balancer"] != "balanced":
        return False
    described = _json(up.raylog("topics", "describe", "--json"))
    held: dict[int, int] = {}
    for topic in described:
        for p in topic["partitions"]:
            for b in p["replicas"]:
                held[b] = held.get(b, 0) + 1
    return broker_id in held and max(held.values()) - min(held.values()) <= 1


def _drain(cluster: RayCluster, ip: str) -> None:
    """Have Ray drain the node at ``ip`` as a spot instance's preemption notice does (the
    command Ray's autoscaler runs for it), with a deadline far ahead."""
    nodes = cluster.alive_nodes()
    assert nodes is not None, "Ray could not be asked for its nodes"
    node_id = next(n["NodeID"] for n in nodes if n["NodeManagerAddress"] == ip)
    subprocess.run(
        [
            str(Path(sys.executable).parent / "ray"), "drain-node", "--address", cluster.address,
            "--node-id", node_id, "--reason", "DRAIN_NODE_REASON_PREEMPTION",
            "--reason-message", "preempted (test)", "--deadline-remaining-seconds", "600",
        ],
        env=cluster.env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip


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


def test_raylog_up_address_runs_a_broker_per_raylog_node(
    cluster: RayCluster, s3_client_kwargs: dict[str, Any], create_bucket: Any
) -> None:
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
        "--broker-config", "replica.balancer.check.interval.ms=1000",
        "--broker-config", "replica.balancer.heal.broker.failure.threshold.ms=3000",
        "--object-store", f"s3://{create_bucket()}/cluster",
        "--s3-endpoint", s3_client_kwargs["endpoint_url"],
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
        # With S3, the two controllers run on different nodes: the two raylog nodes.
        placed = wait_until(lambda: _controllers(up), timeout_s=TIMEOUT_S, message="controllers")
        assert sorted(placed.values()) == sorted(cluster.hosts[r] for r in ("a", "b")), placed
        assert up.lines is not None
        [line] = [x for x in up.lines.seen if "controllers:" in x]  # `raylog up` says where
        assert all(host in line for host in placed.values()), line
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

        # Scale out: a third raylog node gets a broker, and continuous balancing (on by default
        # on a Ray cluster) moves replicas onto it, nobody asking.
        cluster.add_node("c", "127.0.0.4")
        progress("node c started")
        alive = wait_until(
            lambda: _alive_when(up, 3),
            timeout_s=TIMEOUT_S,
            message="a broker on the third node",
        )
        new_id = alive["c"]["id"]
        assert "(rack c)" in up.wait_joined(new_id, TIMEOUT_S)
        wait_until(
            lambda: _balanced(up, new_id),
            timeout_s=TIMEOUT_S,
            message=f"replicas balanced onto broker {new_id}",
        )
        assert any(new_id in p["replicas"] for p in _partitions(up))
        progress(f"balanced onto broker {new_id}")

        # Scale in: the new broker decommissioned, its replicas move back, it stops.
        out = up.raylog("brokers", "decommission", str(new_id), timeout_s=120)
        assert out.returncode == 0, out.stderr
        assert f"Broker {new_id} decommissioned" in out.stdout, out.stdout
        assert all(new_id not in p["replicas"] for p in _partitions(up))
        assert {r["id"]: r["state"] for r in _brokers(up)}[new_id] == "shutdown"
        assert len(_consume_all(bootstrap)) == RECORDS
        progress(f"broker {new_id} decommissioned")
        # Started again on purpose, it is no longer draining: the balancer fills it again.
        out = up.raylog("brokers", "start", str(new_id), timeout_s=120)
        assert out.returncode == 0, out.stderr
        assert "no longer draining" in out.stdout, out.stdout
        wait_until(
            lambda: _balanced(up, new_id),
            timeout_s=TIMEOUT_S,
            message=f"replicas balanced onto broker {new_id} again",
        )
        progress(f"broker {new_id} started again and filled")

        # The node of the active controller crashes: the standby takes over, its broker's
        # leaders move to the other replicas, `raylog up` starts the lost controller again on a
        # node that is left, and nothing is lost.
        active = _controllers(up) or placed
        victim = next(rack for rack, host in cluster.hosts.items() if host == active["active"])
        victim_id = alive[victim]["id"]
        assert up.lines is not None
        mark = len(up.lines.seen)  # `raylog up`'s lines about the loss come in either order
        cluster.nodes[victim].kill()
        progress(f"node {victim} (broker {victim_id}, the active controller) killed")
        took_over = wait_until(
            lambda: (c := _controllers(up)) is not None and c["active"] != active["active"] and c,
            timeout_s=TIMEOUT_S,
            message="the standby controller active, the lost one started again",
        )
        assert active["active"] not in took_over.values(), took_over
        up.lines.wait_for("started again on", TIMEOUT_S, since=mark)  # `raylog up` says so
        progress(f"controller active on {took_over['active']}")

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
        assert all(p["leader"] != victim_id for p in after), after
        states = {row["id"]: row["state"] for row in _brokers(up)}
        assert states[victim_id] == "fenced", states  # by the controller, the node being gone
        assert up.lines is not None
        up.lines.wait_for(f"broker {victim_id} left", TIMEOUT_S, since=mark)
        restart = up.raylog("brokers", "start", str(victim_id))
        assert restart.returncode != 0, restart.stdout
        assert f"the Ray node of broker {victim_id} is gone" in restart.stderr, restart.stderr
        live = ",".join(
            f"{row['host']}:{row['port']}" for rack, row in alive.items() if rack != victim
        )
        assert len(_consume_all(live)) == RECORDS
        progress("failed over; every record read back")

        # Lost for good (fenced past replica.balancer.heal.broker.failure.threshold.ms): its
        # replicas are re-created on the brokers left, every partition whole and in sync again.
        def healed() -> bool:
            done = up.raylog("topics", "describe", "--json")
            if done.returncode != 0:
                return False
            ps = [p for topic in json.loads(done.stdout) for p in topic["partitions"]]
            return all(
                victim_id not in p["replicas"] and sorted(p["isr"]) == sorted(p["replicas"])
                for p in ps
            )

        wait_until(healed, timeout_s=TIMEOUT_S, message=f"broker {victim_id}'s replicas re-created")
        assert len(_consume_all(live)) == RECORDS
        progress(f"broker {victim_id}'s replicas re-created on the brokers left")

        # A fourth node joins and is filled; then Ray drains it (a preemption notice): its
        # broker is decommissioned by itself, every replica moving to the brokers left.
        cluster.add_node("d", "127.0.0.5")
        fourth = wait_until(
            lambda: next(
                (r for r in _brokers(up) if r["rack"] == "d" and r["state"] == "alive"), None
            ),
            timeout_s=TIMEOUT_S,
            message="a broker on the fourth node",
        )["id"]
        wait_until(
            lambda: _balanced(up, fourth),
            timeout_s=TIMEOUT_S,
            message=f"replicas balanced onto broker {fourth}",
        )
        progress(f"node d joined, broker {fourth} filled")
        _drain(cluster, "127.0.0.5")

        def drained() -> bool:
            described = up.raylog("topics", "describe", "--json")
            if described.returncode != 0:
                return False
            ps = [p for topic in json.loads(described.stdout) for p in topic["partitions"]]
            state = {r["id"]: r["state"] for r in _brokers(up)}.get(fourth)
            return state == "draining" and all(
                fourth not in p["replicas"] and sorted(p["isr"]) == sorted(p["replicas"])
                for p in ps
            )

        wait_until(drained, timeout_s=TIMEOUT_S, message=f"broker {fourth} drained")
        assert len(_consume_all(live)) == RECORDS
        progress(f"Ray drained node d: broker {fourth} decommissioned, its replicas moved")
        assert up.stop() == 0
        progress("raylog up stopped")
    finally:
        up.kill()
