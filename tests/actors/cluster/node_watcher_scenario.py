"""A multi-node Ray cluster on this machine driven through the node watcher (run as a script).

Run by ``test_node_watcher_ray.py`` in its own process, because ``ray.cluster_utils.Cluster``
needs a driver of its own and the test session's driver is already attached to ``ray_local``.

Steps: a head node without the ``raylog`` resource runs the controller, the supervisor and the
watcher; two nodes with the resource, racks a and b and gateway ports (``raylog.port``) are added
→ each gets a broker that registers with its rack and that port, and a gateway on its node that
listens there; an RF=2 topic is created; the node of its leader is removed hard → the other
broker leads, and the supervisor no longer counts the dead node's broker as running.
Prints one line, ``RESULT`` and JSON, with what it measured; any failed expectation exits non-zero.
"""

from __future__ import annotations

import json
import random
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster

from raylog.actors import raycluster
from raylog.actors.calls import NAMESPACE, SUPERVISOR_ACTOR_NAME, controller_actor_name
from raylog.actors.cluster.node_watcher import NodeWatcherActor
from raylog.actors.cluster.supervisor import SupervisorActor
from raylog.actors.controller import ControllerActor

DEADLINE_S = 60.0
RESULT_PREFIX = "RESULT "  # Ray's own log lines share stdout
BROKER_CONFIGS = {"broker.heartbeat.interval.ms": "200", "broker.session.timeout.ms": "3000"}


def wait_for(probe: Any, what: str, timeout_s: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # bounded
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def free_port() -> int:
    """A free loopback port below the ephemeral range (Ray's processes bind ephemeral ones)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit("no free port")


def listens(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def add_node(cluster: Cluster, **kwargs: Any) -> Any:
    """``cluster.add_node``, once more when Ray gives up on it: Ray allows a node 30 s to
    register (hard-coded), too little now and then on a 2-core machine shared with other runs."""
    for attempt in range(2):
        try:
            return cluster.add_node(**kwargs)
        except Exception as exc:
            if attempt == 1 or "timed out during startup" not in str(exc):
                raise
            print(f"node did not start, again: {exc}", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def active_metadata(controller: Any) -> Any:
    try:
        return ray.get(controller.metadata.remote(), timeout=10)
    except Exception:
        return None


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="raylog-nodes-"))
    cluster = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,  # not needed, and heavy on a loaded machine
            "object_store_memory": 100 * 1024 * 1024,
            "_system_config": raycluster.FAST_DEATH_SYSTEM_CONFIG,
        },
    )
    try:
        name = controller_actor_name(0)
        controller = ControllerActor.options(name=name, namespace=NAMESPACE).remote(  # type: ignore[attr-defined]
            str(root / "store"),
            name,
            broker_configs=BROKER_CONFIGS,
            reconcile_interval_ms=100,
            lease_ms=3_000,
            renew_ms=1_000,
            poll_ms=100,
        )
        wait_for(lambda: active_metadata(controller) is not None, "an active controller")
        supervisor = SupervisorActor.options(  # type: ignore[attr-defined]
            name=SUPERVISOR_ACTOR_NAME, namespace=NAMESPACE
        ).remote([])
        watcher = NodeWatcherActor.options(namespace=NAMESPACE).remote(  # type: ignore[attr-defined]
            str(root / "data"),
            controller_names=(name,),
            broker_configs=BROKER_CONFIGS,
            poll_ms=200,
        )
        ray.get(watcher.start.remote(), timeout=30)
        nodes = {}
        ports = {"a": free_port(), "b": free_port()}
        for rack in ("a", "b"):
            nodes[rack] = add_node(
                cluster,
                num_cpus=0,
                resources={"raylog": 1},
                labels={
                    "raylog.rack": rack,
                    "raylog.data-dir": str(root / f"node-{rack}"),
                    "raylog.port": str(ports[rack]),
                },
                object_store_memory=100 * 1024 * 1024,
            )
        started = time.monotonic()
        md = wait_for(
            lambda: (
                (m := active_metadata(controller))
                and sum(r.state == "registered" for r in m.brokers.values()) == 2
                and m
            ),
            "two brokers registered",
        )
        registered_s = time.monotonic() - started
        racks = sorted(r.rack for r in md.brokers.values())
        if racks != ["a", "b"]:
            raise SystemExit(f"racks {racks}")
        advertised = sorted(r.port for r in md.brokers.values())
        if advertised != sorted(ports.values()):
            raise SystemExit(f"advertised ports {advertised}, labels {ports}")
        wait_for(lambda: all(listens(p) for p in ports.values()), "both gateways listening")
        ray.get(controller.create_topic.remote("spread", 1, 2, {}), timeout=30)
        ray.get(controller.wait_reconciled.remote(30_000), timeout=40)
        p = ray.get(controller.metadata.remote(), timeout=10).topics["spread"].partitions[0]
        leader = p.leader
        by_broker = ray.get(watcher.brokers.remote(), timeout=10)
        node_of_leader = next(n for n, b in by_broker.items() if b == leader)
        victim = next(n for n in nodes.values() if n.node_id == node_of_leader)
        killed = time.monotonic()
        cluster.remove_node(victim, allow_graceful=False)

        def new_leader() -> int:
            m = active_metadata(controller)
            if m is None:
                return 0
            q = m.topics["spread"].partitions[0]
            return q.leader if q.leader not in (leader, -1) else 0

        moved_to = wait_for(new_leader, "a new leader after the node died", timeout_s=20)
        failover_s = time.monotonic() - killed
        state = ray.get(controller.metadata.remote(), timeout=10).brokers[leader].state
        if state != "fenced":
            raise SystemExit(f"broker {leader} of the dead node is {state}, not fenced")
        wait_for(
            lambda: ray.get(supervisor.running.remote(), timeout=10) == [moved_to],
            "the supervisor to drop the dead node's broker",
        )
        print(
            RESULT_PREFIX
            + json.dumps(
                {
                    "racks": racks,
                    "registered_s": round(registered_s, 2),
                    "old_leader": leader,
                    "new_leader": moved_to,
                    "failover_s": round(failover_s, 2),
                }
            ),
            flush=True,
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
    sys.exit(0)
