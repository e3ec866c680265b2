"""`raylog up --address` on a Ray cluster whose autoscaler adds and removes nodes.

Ray's autoscaler runs on the head with its fake multi-node provider (the one Ray's own
autoscaler tests use: each "machine" is a raylet the autoscaler starts on this one, on
loopback): node types of one ``raylog`` node per rack, racks a and b kept up (``min_workers``
1), rack c started only on demand (``min_workers`` 0), idle nodes beyond the minimum given back
after a few seconds. Nothing else starts a node.

Proves (issue: capacity on demand, a decommissioned node released):
- `raylog topics create` of an RF=3 topic on the two brokers present does not fail: the
  controller asks the autoscaler for a third ``raylog`` node, the command says it is waiting,
  the autoscaler starts rack c's node, the node watcher gives it a broker, and the topic is
  created with a replica of every partition there, serving (exit 0);
- the request is cleared once met (`raylog status` shows none), so the autoscaler may give
  nodes back;
- continuous balancing moves replicas of a loaded RF=2 topic onto the new node's broker
  until balanced while an idempotent producer (confluent-kafka, acks=all) writes to it:
  every acknowledged record is read back once, none lost or duplicated;
- the RF=3 topic deleted, `raylog brokers decommission` of rack c's broker moves its replicas
  back and stops it, and the
  autoscaler then removes the idle node (Ray lists it dead);
- a Kafka client's CreateTopics (confluent-kafka) that does not fit brings rack c's node back
  within the request's timeout: its broker, known by the id on the node's disk, takes
  replicas again (its decommission is cancelled by the node watcher).

Where no autoscaler runs, the same creation is refused at once
(``tests/actors/test_controller_ray.py``).

How the nodes share one machine: ``tests/support/ray_nodes.py``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support.cluster import ClusterUp, free_port_block
from support.ray_nodes import RayCluster, ray_cluster
from support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOPIC = "wide"
IDLE_S = 6.0  # the autoscaler's idle timeout for nodes beyond the minimum
DEADLINE_S = 120.0
CALL_S = 60.0  # a consumer's watermark lookup
LOAD = "load"  # the topic an idempotent producer writes to while replicas move
LOAD_PARTITIONS = 4
LOAD_BURST = 20  # records, then a pause: a few hundred records a second
LOAD_PAUSE_S = 0.05
LOAD_MAX_S = 300.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RayCluster]:
    with ray_cluster(tmp_path) as c:
        yield c


def _json(done: Any) -> Any:
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _brokers(up: ClusterUp) -> dict[int, dict[str, Any]] | None:
    done = up.raylog("brokers", "list", "--json")
    return {row["id"]: row for row in json.loads(done.stdout)} if done.returncode == 0 else None


def _live_racks(up: ClusterUp) -> dict[str, int] | None:
    """Rack -> broker id of the alive brokers (None if the command failed)."""
    rows = _brokers(up)
    if rows is None:
        return None
    return {row["rack"]: b for b, row in rows.items() if row["state"] == "alive"}


def _raylog_nodes(cluster: RayCluster) -> int | None:
    """Alive Ray nodes with the ``raylog`` resource (None if Ray could not be asked)."""
    nodes = cluster.alive_nodes()
    return None if nodes is None else sum(1 for n in nodes if n["Resources"].get("raylog"))


class _Load:
    """An idempotent producer (confluent-kafka, acks=all) sending numbered records to LOAD,
    a few hundred a second, in a thread until :meth:`stop`."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
        )
        self.acked: list[bytes] = []
        self.errors: list[str] = []
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        sent = 0
        deadline = time.monotonic() + LOAD_MAX_S
        while not self.halt.is_set() and time.monotonic() < deadline:
            for _ in range(LOAD_BURST):
                value = str(sent).encode()
                self.producer.produce(LOAD, value, key=value, on_delivery=self._delivered)
                sent += 1
            self.producer.poll(LOAD_PAUSE_S)

    def _delivered(self, err: Any, message: Any) -> None:
        if err is None:
            self.acked.append(message.value())
        else:
            self.errors.append(str(err))

    def stop(self) -> list[bytes]:
        """Stop sending, wait for every answer; the values acknowledged."""
        self.halt.set()
        self.thread.join(timeout=LOAD_MAX_S)
        left = self.producer.flush(DEADLINE_S)
        assert left == 0 and not self.errors, (left, self.errors[:3])
        return self.acked


def _read_all(bootstrap: str) -> list[bytes]:
    """Every record of LOAD up to each partition's high watermark, from offset 0."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:  # assign() only: no group requests are sent
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(LOAD, p), timeout=CALL_S)[1]
            for p in range(LOAD_PARTITIONS)
        }
        consumer.assign([TopicPartition(LOAD, p, OFFSET_BEGINNING) for p in ends])
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(values) < sum(ends.values()) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        return values
    finally:
        consumer.close()


def _holds(up: ClusterUp, topic: str, broker_id: int) -> bool:
    (described,) = _json(up.raylog("topics", "describe", topic, "--json"))
    return any(broker_id in p["replicas"] for p in described["partitions"])


def _balanced(up: ClusterUp) -> bool:
    return _json(up.raylog("status", "--json"))["replica_balancer"] == "balanced"


def test_capacity_on_demand_and_release(cluster: RayCluster) -> None:
    started = time.monotonic()

    def progress(what: str) -> None:  # where the time goes, with -s
        print(f"{time.monotonic() - started:6.1f} s  {what}", flush=True)

    cluster.start_autoscaling_head({"a": 1, "b": 1, "c": 0}, IDLE_S)
    port = free_port_block(2)
    up = ClusterUp(
        cluster.root / "head-data",
        cluster.address,
        port,
        dict(cluster.env),
        *("--broker-config", f"listeners=PLAINTEXT://:{port}"),
        *("--broker-config", "allow.insecure.network.listeners=true"),
        *("--broker-config", "replica.balancer.check.interval.ms=1000"),
    )
    load: _Load | None = None
    try:
        up.start()
        progress("raylog up ready")
        racks = wait_until(
            lambda: (r := _live_racks(up)) and sorted(r) == ["a", "b"] and r,
            timeout_s=DEADLINE_S,
            message="brokers on the two nodes the autoscaler keeps",
        )
        done = up.raylog(
            "topics", "create", LOAD, "--partitions", str(LOAD_PARTITIONS),
            "--replication-factor", "2", "--config", "min.insync.replicas=2",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        # The reader's group lookup creates __consumer_offsets now, at RF 2: created once the
        # third broker is there, its RF of 3 would keep that broker from being decommissioned.
        assert _read_all(up.bootstrap) == []
        wait_until(
            lambda: "__consumer_offsets" in up.raylog("topics", "list").stdout.split(),
            timeout_s=DEADLINE_S,
            message="__consumer_offsets created on the two brokers",
        )
        load = _Load(up.bootstrap)
        progress("brokers a, b; load topic; producer started")

        # An RF=3 topic on two brokers: the third node is asked for, started, and used.
        done = up.raylog(
            "topics", "create", TOPIC, "--partitions", "3", "--replication-factor", "3",
            "--timeout", str(DEADLINE_S), timeout_s=DEADLINE_S + 30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert "asked Ray's autoscaler for 1 more raylog node(s)" in done.stderr, done.stderr
        assert "waiting for them" in done.stderr, done.stderr
        progress("RF=3 topic created on the node the autoscaler added")
        racks = _live_racks(up)
        assert racks is not None and sorted(racks) == ["a", "b", "c"], racks
        (described,) = _json(up.raylog("topics", "describe", TOPIC, "--json"))
        for p in described["partitions"]:
            assert racks["c"] in p["replicas"] and sorted(p["isr"]) == sorted(p["replicas"]), p
        wait_until(
            lambda: _json(up.raylog("status", "--json"))["autoscaler_request"] == "",
            timeout_s=DEADLINE_S,
            message="the request to the autoscaler cleared once met",
        )

        # The new node gets replicas of the loaded topic until balanced, the producer running.
        wait_until(
            lambda: _holds(up, LOAD, racks["c"]) and _balanced(up),
            timeout_s=DEADLINE_S,
            message=f"replicas of {LOAD} on the new node's broker, the cluster balanced",
        )
        progress("balanced")
        acked = load.stop()
        load = None
        assert len(acked) > 0
        assert sorted(_read_all(up.bootstrap)) == sorted(acked)  # nothing lost or duplicated

        progress("read back")
        # Given back: the topic deleted, rack c's broker decommissioned, its node released.
        assert up.raylog("topics", "delete", TOPIC).returncode == 0
        done = up.raylog("brokers", "decommission", str(racks["c"]), timeout_s=DEADLINE_S)
        assert done.returncode == 0, done.stderr[-2000:]
        progress("decommissioned")
        wait_until(
            lambda: _raylog_nodes(cluster) == 2,
            timeout_s=DEADLINE_S,
            message="the autoscaler removing the idle node of the decommissioned broker",
        )
        wait_until(
            lambda: (rows := _brokers(up)) is not None and rows[racks["c"]]["state"] != "alive",
            timeout_s=DEADLINE_S,
            message="the released node's broker no longer alive",
        )

        progress("node released")
        # A Kafka client's CreateTopics that does not fit brings rack c's node back: the same
        # broker (its id on the node's disk) takes replicas again.
        admin = AdminClient({"bootstrap.servers": up.bootstrap})
        futures = admin.create_topics(
            [NewTopic("again", 2, 3)], operation_timeout=DEADLINE_S, request_timeout=DEADLINE_S
        )
        futures["again"].result(timeout=DEADLINE_S + 30)
        progress("created through a Kafka client, the node back")
        (described,) = _json(up.raylog("topics", "describe", "again", "--json"))
        assert all(racks["c"] in p["replicas"] for p in described["partitions"]), described
        rows = _brokers(up)
        assert rows is not None and rows[racks["c"]]["state"] == "alive", rows
    finally:
        if load is not None:
            load.stop()
        up.kill()
