"""Failover times on a three-node Ray cluster (ray.cluster_utils), one broker per node.

Prints one JSON document with, per scenario, every trial and the worst:

- ``node_kill``: the leader broker's node removed with ``allow_graceful=False`` (a machine
  crash). Time from the kill to the first successful acks=all produce on the new leader, split
  into the time until Ray's GCS lists the node dead (its health checks, about 2 s with
  ``raycluster.FAST_DEATH_SYSTEM_CONFIG``) and the time after that. The node is added back
  (same rack label) and the broker returns by itself before the next trial.
- ``actor_kill``: the leader broker's actor killed (its replicas die with it; Ray restarts it).
  Same measure.
- ``failed_log``: the leader replica's log fails (its process may no longer grow a file past
  the segment's end: RLIMIT_FSIZE set with prlimit, so the next append fails with EFBIG as a
  write to a full disk fails with ENOSPC). Time from the failing write to the first successful
  acks=all produce on the new leader: the replica tells its broker, whose heartbeat goes at
  once, and the controller moves the leadership. ``replica.offline.retry.backoff.ms`` (2 s
  here) later the broker re-creates the replica, which rejoins the ISR before the next trial.
- ``controlled_shutdown``: ``broker.shutdown()`` of the leader's broker while a producer sends
  acks=all requests back to back; the unavailability window is the longest gap between two
  successful produces around the shutdown.

Goals: <= 1 s once Ray confirms a death (for a node kill: counted from the confirmation),
<= 0.5 s for a controlled shutdown; a failed log is known at once, so it has the 1 s goal from
the failing write. The cluster runs with short heartbeats, sessions and controller leases
(``BROKER_CONFIGS``, ``LEASE`` below) so that trials are quick.

    .venv/bin/python benchmarks/failover.py [--trials 3] [--scenarios node_kill,failed_log,...]

JSON fields, per scenario: ``seconds`` (every trial), ``worst_s``, ``produce_failures`` (the
errors the producer met, by kind); for ``node_kill`` also ``ray_confirmed_dead_s`` (kill to
Ray's GCS listing the node dead), ``after_confirmation_s`` and
``worst_after_confirmation_s``. Then ``goals_s`` and ``machine``.

The JSON document is the last thing on stdout (Ray's raylets print notices of the removed nodes
there too). Progress goes to stderr; RAYLOG_BENCH_KEEP=1 keeps the data dir and Ray's worker
logs (the controller logs each fencing and slow push with monotonic timestamps).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RACKS = ("a", "b", "c")
BROKER_CONFIGS = {
    "broker.heartbeat.interval.ms": "250",
    "broker.session.timeout.ms": "3000",
    "replica.offline.retry.backoff.ms": "2000",
}
SCENARIOS = ("node_kill", "actor_kill", "failed_log", "controlled_shutdown")
LEASE = {"lease_ms": 2_000, "renew_ms": 500, "poll_ms": 200}
TOPIC = "failover"
WAIT_S = 60.0
PRODUCE_TIMEOUT_MS = 2_000
POLL_S = 0.005


def _batch(i: int) -> bytes:
    from raylog.storage import batch as rb

    return rb.build_batch(
        [rb.Record(key=str(i).encode(), value=b"x" * 100, timestamp_ms=1_700_000_000_000 + i)]
    )


class Bench:
    def __init__(self, root: Path) -> None:
        import ray
        from ray.cluster_utils import Cluster

        from raylog.actors import raycluster

        self.root = root
        self._active: Any = None
        self.failures: dict[str, int] = {}  # produce failures seen, by error
        self.confirmed_s: float | None = None  # the last node kill: kill -> Ray's GCS saw it dead
        self.confirmations: list[float] = []  # every node kill's confirmed_s
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 2,
                "object_store_memory": 256 * 1024 * 1024,
                "_system_config": raycluster.FAST_DEATH_SYSTEM_CONFIG,
            },
        )
        self.nodes = {rack: self._add_node(rack) for rack in RACKS}
        ray.init(
            address=self.cluster.address,
            namespace="raylog",
            logging_level="WARNING",
            log_to_driver=False,
        )
        self.cluster.wait_for_nodes()

    def _add_node(self, rack: str) -> Any:
        return self.cluster.add_node(
            num_cpus=0,
            resources={"raylog": 1},
            labels={"raylog.rack": rack},
            object_store_memory=256 * 1024 * 1024,
        )

    def start(self) -> None:
        import ray

        from raylog.actors.broker import BrokerActor
        from raylog.actors.calls import NAMESPACE, broker_actor_name, controller_actor_name
        from raylog.actors.controller import ControllerActor

        self.controllers = [
            ControllerActor.options(  # type: ignore[attr-defined]
                name=controller_actor_name(i), namespace=NAMESPACE
            ).remote(
                str(self.root / "store"),
                controller_actor_name(i),
                broker_configs=BROKER_CONFIGS,
                reconcile_interval_ms=200,
                **LEASE,
            )
            for i in range(2)
        ]
        self.brokers = {
            b: BrokerActor.options(  # type: ignore[attr-defined]
                name=broker_actor_name(b),
                namespace=NAMESPACE,
                resources={"raylog": 1},
                label_selector={"raylog.rack": rack},
            ).remote(
                b, str(self.root / "data"), rack=rack, port=9090 + b, broker_configs=BROKER_CONFIGS
            )
            for b, rack in enumerate(RACKS, start=1)
        }
        self._until(lambda: self.active() is not None, "an active controller")
        self._until(
            lambda: all(
                ray.get(b.status.remote(), timeout=10)["broker_epoch"] > 0
                for b in self.brokers.values()
            ),
            "brokers registered",
        )
        ray.get(self.active().create_topic.remote(TOPIC, 1, 3, {"min.insync.replicas": "2"}))
        self._until(lambda: self.produce(0) is not None, "first produce")

    def _until(self, probe: Any, what: str, timeout_s: float = WAIT_S) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # bounded
            value = probe()
            if value:
                return value
            time.sleep(0.01)
        raise RuntimeError(f"timed out waiting for {what}")

    def active(self) -> Any:
        import ray

        if self._active is not None:
            with contextlib.suppress(Exception):
                if ray.get(self._active.status.remote(), timeout=2).active:
                    return self._active
        self._active = None
        for c in self.controllers:
            with contextlib.suppress(Exception):
                if ray.get(c.status.remote(), timeout=2).active:
                    self._active = c
                    return c
        return None

    def leader(self) -> int:
        import ray

        active = self.active()
        if active is None:
            return -1
        try:
            return int(ray.get(active.leader_of.remote(TOPIC, 0), timeout=2))
        except Exception:
            return -1

    def produce(self, i: int, leader: int | None = None) -> float | None:
        """One acks=all produce on the current leader; its completion time, or None."""
        import ray

        b = self.leader() if leader is None else leader
        if b < 0:
            return None
        try:
            replica = ray.get(self.brokers[b].replica.remote(TOPIC, 0), timeout=2)
            if replica is None:
                return None
            outcome = ray.get(replica.produce.remote(_batch(i), -1, PRODUCE_TIMEOUT_MS), timeout=5)
        except Exception as exc:
            self.failures[type(exc).__name__] = self.failures.get(type(exc).__name__, 0) + 1
            return None
        if outcome.error_code:
            key = f"{outcome.error_code}:{outcome.message[:40]}"
            self.failures[key] = self.failures.get(key, 0) + 1
            return None
        return time.monotonic()

    def wait_healthy(self) -> None:
        """Every broker registered and in the ISR again."""
        import ray

        def healthy() -> bool:
            active = self.active()
            if active is None:
                return False
            md = ray.get(active.metadata.remote(), timeout=5)
            p = md.topics[TOPIC].partitions[0]
            regs = md.brokers.values()
            return len(p.isr) == 3 and all(r.state == "registered" for r in regs)

        self._until(healthy, "all three brokers back in the ISR", timeout_s=120)
        self._until(lambda: self.produce(0) is not None, "produce")

    def node_of(self, broker_id: int) -> tuple[str, Any]:
        import ray

        node_id = ray.get(self.brokers[broker_id].status.remote(), timeout=10)["node_id"]
        for rack, node in self.nodes.items():
            if node.node_id == node_id:
                return rack, node
        raise RuntimeError(f"broker {broker_id} runs on no known node")

    def after_kill(self, old: int, kill: Any, node_id: str | None = None) -> float:
        """Seconds from the kill to the first acks=all produce on a new leader.

        With ``node_id``, also records in ``self.confirmed_s`` when Ray's GCS first lists that
        node as dead (its health checks: ``raycluster.FAST_DEATH_SYSTEM_CONFIG``), the moment
        from which the controller may elect (the controller issue's "when Ray confirms").
        """
        import ray

        start = time.monotonic()
        kill()
        print(f"killed broker {old} at {int(start * 1000)}", file=sys.stderr)
        self.confirmed_s = None if node_id is not None else 0.0
        i = 0
        while time.monotonic() - start < WAIT_S:  # bounded
            i += 1
            if self.confirmed_s is None and not any(
                n["Alive"] for n in ray.nodes() if n["NodeID"] == node_id
            ):
                self.confirmed_s = time.monotonic() - start
            b = self.leader()
            if b not in (old, -1):
                done = self.produce(i, b)
                if done is not None:
                    print(f"new leader {b} took a write at {int(done * 1000)}", file=sys.stderr)
                    return done - start
            time.sleep(POLL_S)  # leave the 2 cores to the cluster
        raise RuntimeError("no new leader took a write")

    def node_kill(self) -> float:
        old = self.leader()
        rack, node = self.node_of(old)
        took = self.after_kill(
            old, lambda: self.cluster.remove_node(node, allow_graceful=False), node.node_id
        )
        if self.confirmed_s is None:
            raise RuntimeError("a new leader took a write before Ray saw the node dead")
        self.confirmations.append(round(self.confirmed_s, 4))
        self.nodes[rack] = self._add_node(rack)
        self.wait_healthy()
        return took

    def actor_kill(self) -> float:
        import ray

        old = self.leader()
        took = self.after_kill(old, lambda: ray.kill(self.brokers[old], no_restart=False))
        self.wait_healthy()
        return took

    def failed_log(self) -> float:
        import resource

        import ray

        old = self.leader()
        replica = ray.get(self.brokers[old].replica.remote(TOPIC, 0), timeout=10)
        pid = ray.get(replica.pid.remote(), timeout=10)
        log_dir = self.root / "data" / f"broker-{old}" / f"{TOPIC}-0"

        def fail() -> None:
            segment = max(log_dir.glob("*.log"))
            _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (segment.stat().st_size + 64, hard))
            if self.produce(-1, old) is not None:
                raise RuntimeError("a write past the lowered file size limit succeeded")

        took = self.after_kill(old, fail)
        self.wait_healthy()  # re-created after the backoff, caught up, in the ISR again
        return took

    def controlled_shutdown(self) -> float:
        import ray

        old = self.leader()
        ref = None
        successes: list[float] = []
        start = time.monotonic()
        i = 0
        moved_at = None
        while time.monotonic() - start < WAIT_S:  # bounded
            i += 1
            done = self.produce(i)
            if done is not None:
                successes.append(done)
            if ref is None and len(successes) >= 20:
                ref = self.brokers[old].shutdown.remote()
                shutdown_at = time.monotonic()
            if ref is not None and moved_at is None:
                ready, _ = ray.wait([ref], timeout=0)
                if ready:
                    moved_at = time.monotonic()
            if moved_at is not None and successes[-1] > moved_at and len(successes) > 5:
                break
        around = [t for t in successes if t >= shutdown_at - 1.0]
        window = max(b - a for a, b in itertools.pairwise(around))
        ray.kill(self.brokers[old], no_restart=False)  # back with a new incarnation
        self.wait_healthy()
        return window

    def close(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3, help="per scenario (default 3)")
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="comma-separated (default: all)"
    )
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    if unknown := sorted(set(scenarios) - set(SCENARIOS)):
        parser.error(f"unknown scenarios {unknown}; choose from {list(SCENARIOS)}")
    root = Path(tempfile.mkdtemp(prefix="raylog-failover-"))
    print(f"data in {root}", file=sys.stderr)
    from raylog.actors import raycluster

    raycluster.apply_ray_env(root)
    bench = Bench(root)
    results: dict[str, Any] = {}
    try:
        bench.start()
        for name in scenarios:
            bench.failures = {}
            trials = [round(getattr(bench, name)(), 4) for _ in range(args.trials)]
            results[name] = {
                "seconds": trials,
                "worst_s": max(trials),
                "produce_failures": bench.failures,
            }
            if name == "node_kill":
                # Ray's health checks take most of it; the goal counts from Ray's confirmation
                after = [round(t - c, 4) for t, c in zip(trials, bench.confirmations, strict=True)]
                results[name]["ray_confirmed_dead_s"] = bench.confirmations
                results[name]["after_confirmation_s"] = after
                results[name]["worst_after_confirmation_s"] = max(after)
    finally:
        bench.close()
        if not os.environ.get("RAYLOG_BENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
    results["goals_s"] = {
        "node_kill_after_confirmation": 1.0,
        "actor_kill": 1.0,
        "failed_log": 1.0,
        "controlled_shutdown": 0.5,
    }
    results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
