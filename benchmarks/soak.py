"""Soak: mixed load on a three-node Ray cluster for many minutes, with a fault every minute.

Three ``ray start`` nodes with the ``raylog`` resource, each in a Linux network namespace of its
own (``tests/support/netns.py``; needs root), the head in the root namespace, `raylog up
--address` on it, every replication link over TCP. A topic of 3 partitions, RF=3,
min.insync.replicas=2; an idempotent confluent-kafka producer (acks=all) and a consumer group
member that commits every second run throughout. Each minute after the first, one fault from
the list below, in turn, on a partition picked by the seed, held ``--fault-s`` then undone:

- ``follower_cut``: a follower and its leader cut off from each other, both directions;
- ``slow_link``: the same two joined by a link of a few KB/s;
- ``leader_one_way``: what the leader sends its followers dropped (their requests reach it);
- ``broker_kill``: the leader's broker killed (`raylog brokers kill`), started again when the
  fault ends (`raylog brokers start`).

A Ray node cut off from the head is declared dead by Ray and never taken back, so whole-node
isolation (tests/e2e/test_network_partition_live.py) is not among them: the soak keeps its
three nodes.

Prints one JSON document: per minute the fault, the records sent and acknowledged, the
acknowledgement latency percentiles (produce() to delivery report) and the longest gap between two
acknowledgements, whether every partition was fully in sync again before the next fault and
how long that took, and each kind of process's private memory (USS; count, total and largest);
then the checker's verdict: every acknowledged record read back once, in send order, at the
offset acknowledged; every replica's files byte-identical below the high watermark and one
writer per leader epoch; the group's committed offsets never moved back.

    sudo .venv/bin/python benchmarks/soak.py [--minutes 30] [--fault-s 15] [--seed 1]

Not part of `make test` (30 minutes). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import netns
from support.cluster import ClusterUp, create_durable_topic, process_tree
from support.consuming import Consuming, committed_offsets
from support.netns import NetSandbox
from support.producing import Producing
from support.ray_nodes import RayCluster, ray_cluster, raylog_on
from support.read_back import (
    check_exactly_once,
    node_replica_dirs,
    read_back,
    replicas_agree,
    sent_ends,
)
from support.waiting import wait_until

from raylog.actors.process_memory import private_mib

TOPIC = "soak"
GROUP = "soak-group"
PARTITIONS = 3
RACKS = ("a", "b", "c")
LAG_TIME_MS = 5000  # replica.lag.time.max.ms: a fault of 15 s takes a follower out of the ISR
PACE_S = 0.004  # the producer's poll between records: about 200 records/s
MESSAGE_TIMEOUT_S = 600.0
COMMIT_EVERY_S = 1.0
SLOW_RATE = "16kbit"
IN_SYNC_DEADLINE_S = 40.0
STEP_DEADLINE_S = 180.0
CLI_TIMEOUT_S = 60.0
FAULTS = ("follower_cut", "slow_link", "leader_one_way", "broker_kill")


def log(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


class Soak:
    def __init__(
        self,
        sandbox: NetSandbox,
        cluster: RayCluster,
        up: ClusterUp,
        racks: dict[int, str],
        seed: int,
    ) -> None:
        self.sandbox, self.cluster, self.up = sandbox, cluster, up
        self.racks = racks  # broker id -> rack
        self.rng = random.Random(seed)

    def describe(self) -> list[dict[str, Any]] | None:
        done = self.up.raylog("topics", "describe", TOPIC, "--json", timeout_s=CLI_TIMEOUT_S)
        return json.loads(done.stdout)[0]["partitions"] if done.returncode == 0 else None

    def in_sync(self) -> bool:
        ps = self.describe()
        return ps is not None and all(len(p["isr"]) == len(RACKS) for p in ps)

    def fault(self, kind: str) -> tuple[str, Callable[[], None]]:
        """Start a fault of ``kind``; returns what it is and how to end it."""
        ps = self.describe()
        assert ps is not None, "topics describe failed"
        p = self.rng.choice(ps)
        leader = p["leader"]
        followers = [b for b in p["replicas"] if b != leader]
        lr = self.racks[leader]
        fr = self.racks[self.rng.choice(followers)]
        box = self.sandbox
        if kind == "follower_cut":
            box.cut(fr, lr)
            box.cut(lr, fr)

            def mend_both() -> None:
                box.mend(fr, lr)
                box.mend(lr, fr)

            return f"p{p['partition']}: {fr} <-> {lr} cut", mend_both
        if kind == "slow_link":
            box.slow(fr, lr, SLOW_RATE)
            return f"p{p['partition']}: {fr} <-> {lr} at {SLOW_RATE}", lambda: box.unslow(fr, lr)
        if kind == "leader_one_way":
            racks = [self.racks[b] for b in followers]
            for r in racks:
                box.cut(lr, r)

            def mend_all() -> None:
                for r in racks:
                    box.mend(lr, r)

            return f"p{p['partition']}: {lr} -> {racks} dropped", mend_all
        assert kind == "broker_kill", kind
        done = self.up.raylog("brokers", "kill", str(leader), timeout_s=CLI_TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        return f"p{p['partition']}: broker {leader} killed", lambda: self._start_broker(leader)

    def _start_broker(self, broker: int) -> None:
        done = self.up.raylog("brokers", "start", str(broker), timeout_s=CLI_TIMEOUT_S * 2)
        if done.returncode != 0:
            log(f"brokers start {broker}: {done.stderr.strip()[-300:]}")

    def memory(self) -> dict[str, dict[str, float]]:
        """Private memory (USS, MiB) by kind of process, over every process of the cluster."""
        pids = {pid for node in self.cluster.nodes.values() if node.proc for pid in
                process_tree(node.proc.pid)}  # fmt: skip
        if self.up.proc is not None:
            pids.update(process_tree(self.up.proc.pid))
        kinds: dict[str, list[float]] = {}
        for pid in pids:
            kind, mib = _kind(pid), private_mib(pid)
            if kind and mib is not None:
                kinds.setdefault(kind, []).append(mib)
        return {
            k: {"count": len(v), "total_mib": round(sum(v), 1), "max_mib": round(max(v), 1)}
            for k, v in sorted(kinds.items())
        }


def _kind(pid: int) -> str | None:
    """``ray::ReplicaActor`` for an actor's worker, else the program's name."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    first = argv[0].decode(errors="replace")
    if first.startswith("ray::"):  # "ray::ReplicaActor.append" while in a call
        return first.split(".")[0].split()[0]
    name = os.path.basename(first.split()[0]) if first else "?"
    if name.startswith("python") and len(argv) > 1:
        script = next((a.decode() for a in argv[1:] if a and not a.startswith(b"-")), "")
        return f"python {os.path.basename(script)}"
    return name


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if len(values) < 2:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    q = statistics.quantiles(values, n=100)
    return {
        "p50_ms": round(q[49] * 1000, 1),
        "p99_ms": round(q[98] * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


def _longest_gap(times: list[float], since: float, until: float) -> float:
    inside = [since, *[t for t in times if since <= t < until], until]
    return round(max(b - a for a, b in itertools.pairwise(inside)), 2)


def _minute(
    soak: Soak,
    minute: int,
    start: float,
    fault_s: float,
    producing: Producing,
    consuming: Consuming,
) -> dict[str, Any]:
    """Minute ``minute`` (from 0) starting at ``start``: its fault (none in the first), then
    the load's figures over the whole minute."""
    row: dict[str, Any] = {"minute": minute + 1, "fault": None}
    sent_before = producing.sent
    if minute > 0:
        kind = FAULTS[(minute - 1) % len(FAULTS)]
        what, end = soak.fault(kind)
        row["fault"] = f"{kind}: {what}"
        log(f"minute {minute + 1}: {row['fault']}")
        time.sleep(fault_s)  # the fault's length: a fixed span, by design
        end()
        healed = time.monotonic()
        try:
            wait_until(soak.in_sync, timeout_s=IN_SYNC_DEADLINE_S, interval_s=0.5)
            row["in_sync_after_s"] = round(time.monotonic() - healed, 1)
        except AssertionError:
            row["in_sync_after_s"] = None  # not within IN_SYNC_DEADLINE_S
    time.sleep(max(0.0, start + 60 - time.monotonic()))  # the minute's end
    until = time.monotonic()
    latencies = producing.ack_latencies(start, until)
    row.update(
        sent=producing.sent - sent_before,
        acked=len(latencies),
        **_percentiles(latencies),
        longest_ack_gap_s=_longest_gap(producing.ack_times(), start, until),
        produce_errors=len(producing.errors),
        commit_errors=len(consuming.commit_errors),
        memory=soak.memory(),
    )
    log(f"minute {minute + 1}: {row['acked']} acked, p99 {row['p99_ms']} ms")
    return row


def _verdict(soak: Soak, producing: Producing, consuming: Consuming, bootstrap: str) -> str:
    """The checker's, once the load has stopped (see the module docstring)."""
    try:
        sent = producing.finish(MESSAGE_TIMEOUT_S)
        consuming.stop()
        assert not consuming.went_back, consuming.went_back
        records = read_back(bootstrap, TOPIC, sent_ends(sent, PARTITIONS), STEP_DEADLINE_S)
        check_exactly_once(records, sent, producing.acked)
        for p, got in records.items():
            dirs = node_replica_dirs(soak.cluster.root / "head-data", TOPIC, p)
            assert len(dirs) == len(RACKS), sorted(dirs)
            replicas_agree(dirs, len(got), set(dirs), timeout_s=STEP_DEADLINE_S)
        after = committed_offsets(bootstrap, TOPIC, GROUP, PARTITIONS, STEP_DEADLINE_S)
        assert all(after[p] >= o for p, o in consuming.committed.items()), after
    except AssertionError as exc:
        return f"FAILED: {exc}"
    return "ok"


def run(args: argparse.Namespace, sandbox: NetSandbox, cluster: RayCluster) -> dict[str, Any]:
    addresses = {rack: sandbox.address(rack) for rack in RACKS}
    lag = f"replica.lag.time.max.ms={LAG_TIME_MS}"
    with raylog_on(cluster, addresses, lag) as (up, racks):
        soak = Soak(sandbox, cluster, up, racks, args.seed)
        create_durable_topic(up, TOPIC, PARTITIONS)
        bootstrap = ",".join(f"{cluster.hosts[r]}:{cluster.ports[r]}" for r in RACKS)
        settings = {"socket.timeout.ms": 10_000}
        producing = Producing(bootstrap, TOPIC, PARTITIONS, MESSAGE_TIMEOUT_S, PACE_S, settings)
        consuming = Consuming(bootstrap, TOPIC, GROUP, COMMIT_EVERY_S)
        producing.start()
        consuming.start()
        try:
            t0 = time.monotonic()
            minutes = [
                _minute(soak, m, t0 + 60 * m, args.fault_s, producing, consuming)
                for m in range(args.minutes)
            ]
            verdict = _verdict(soak, producing, consuming, bootstrap)
        finally:
            producing.abandon()
            consuming.halt.set()
        return {
            "minutes": minutes,
            "records_sent": producing.sent,
            "records_consumed": consuming.consumed,
            "verdict": verdict,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--fault-s", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", help="keep the data here (default: a temp dir, removed)")
    args = parser.parse_args()
    if not 1 <= args.minutes <= 24 * 60 or not 1 <= args.fault_s <= 40:
        parser.error("--minutes in 1..1440, --fault-s in 1..40")
    reason = netns.unavailable()
    if reason is not None:
        print(f"soak: needs network namespaces: {reason}", file=sys.stderr)
        return 2
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rlsoak-"))
    root.mkdir(parents=True, exist_ok=True)
    sandbox = NetSandbox(list(RACKS))
    try:  # a create() that fails half-way is torn down too
        sandbox.create()
        env = {"RAYLOG_CHANNEL_LOCAL_SOCKETS": "0"}
        with ray_cluster(root, sandbox.host, sandbox.command, env) as cluster:
            result = run(args, sandbox, cluster)
    finally:
        sandbox.teardown()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    result.update(minutes_asked=args.minutes, fault_s=args.fault_s, seed=args.seed)
    print(json.dumps(result, indent=1))
    return 0 if result["verdict"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
