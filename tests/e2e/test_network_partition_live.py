"""Network faults between the machines of a real Ray cluster, while a producer keeps producing.

Three ``ray start`` nodes with the ``raylog`` resource, each in a Linux network namespace of
its own (``support/netns.py``), the head in the root namespace on the sandbox's bridge; `raylog
up --address` on the head; every replication link is TCP (``RAYLOG_CHANNEL_LOCAL_SOCKETS=0``:
the nodes share a kernel, and a Unix socket would go around the network). A topic of 2
partitions, RF=3, min.insync.replicas=2, and an idempotent confluent-kafka producer (acks=all,
a message timeout longer than any fault) producing to both throughout, while:

1. a follower of partition 0 is cut off from its leader, both directions (each still reaches
   the head and the third node): the leader takes it out of the ISR after
   ``replica.lag.time.max.ms``, acks=all continues with the two left, and once the link is
   mended the follower catches up and is back in the ISR;
2. the same follower's link to its leader is slow (500 B/s, alive): it falls behind, leaves
   the ISR, acks=all continues, and it rejoins once the link is fast again;
3. what partition 0's leader sends its followers is dropped (one direction; their requests
   reach it): no follower can catch up, the leader shrinks the ISR to itself, acks=all waits
   (below min.insync.replicas the client retries), and once mended the followers return to the
   ISR and acknowledgements resume, the leadership unmoved: the controller still sees the leader;
4. partition 1's leader is isolated from every other machine (its veth down): Ray declares its
   node dead, the controller moves the leadership to an ISR member, and the producer continues
   there (the client gives up on requests in flight to the isolated node after its
   ``socket.timeout.ms``, here 10 s, and sends them again to the new leader).

Then every record is acknowledged, read back exactly once and in send order with dense offsets
(each acknowledgement's offset where the record is); the replicas on the live nodes hold
byte-identical batches below the high watermark; and where any two replicas (the isolated one
included, read from its files) hold a batch of the same leader epoch at the same offset, the
batches are the same bytes: one writer per epoch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import netns
from support.cluster import ClusterUp, create_durable_topic
from support.netns import NetSandbox
from support.producing import Producing
from support.ray_nodes import RayCluster, ray_cluster, raylog_on
from support.read_back import (
    batch_headers,
    check_exactly_once,
    node_replica_dirs,
    read_back,
    replicas_agree,
    sent_ends,
)
from support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOPIC = "partitioned"
PARTITIONS = 2
RACKS = ("a", "b", "c")
LAG_TIME_MS = 3000  # replica.lag.time.max.ms: the ISR shrinks in seconds (Kafka's default: 30)
MESSAGE_TIMEOUT_S = 300.0  # longer than any fault: the client keeps every record queued
PACE_S = 0.005
ACKED_STEP = 200  # records acknowledged before each fault, during it and after it
STEP_DEADLINE_S = 120.0
ISR_DEADLINE_S = 90.0
# 500 B/s, a third of what the producer offers partition 0 (100 records/s of about 15 bytes).
# It must be that slow: acks=all paces the producer to the slow follower until it leaves the
# ISR, and at 2 KB/s the follower can keep pace and stay in sync.
SLOW_RATE = "4kbit"
READ_DEADLINE_S = 120.0


@pytest.fixture
def sandbox() -> Iterator[NetSandbox]:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"no network namespaces here: {reason}")
    box = NetSandbox(list(RACKS))
    try:
        yield box.create()
    finally:
        box.teardown()


@pytest.fixture
def cluster(tmp_path: Path, sandbox: NetSandbox) -> Iterator[RayCluster]:
    env = {"RAYLOG_CHANNEL_LOCAL_SOCKETS": "0"}
    with ray_cluster(tmp_path, sandbox.host, sandbox.command, env) as c:
        yield c


def _partition(up: ClusterUp, partition: int) -> dict[str, Any] | None:
    done = up.raylog("topics", "describe", TOPIC, "--json")
    if done.returncode != 0:
        return None  # e.g. a call that timed out while a node's death is handled
    [topic] = json.loads(done.stdout)
    return next(p for p in topic["partitions"] if p["partition"] == partition)


def _wait_partition(
    up: ClusterUp,
    partition: int,
    holds: Callable[[dict[str, Any]], bool],
    what: str,
    timeout_s: float = ISR_DEADLINE_S,
) -> dict[str, Any]:
    """The partition (as `topics describe --json` shows it) once ``holds`` is true of it."""
    return wait_until(
        lambda: (p := _partition(up, partition)) is not None and holds(p) and p,
        timeout_s=timeout_s,
        interval_s=0.5,
        message=what,
    )


def _in_sync(up: ClusterUp, partition: int) -> dict[str, Any]:
    """The partition once every replica is in its ISR (a follower may lag behind for a moment
    on a busy machine: the ISR's lag time is short here)."""
    return _wait_partition(
        up,
        partition,
        lambda p: len(p["isr"]) == len(RACKS),
        f"every replica of partition {partition} in its ISR",
    )


def _wait_isr(up: ClusterUp, broker: int, inside: bool, what: str) -> list[int]:
    """Partition 0's ISR once ``broker`` is in it (``inside``) or out of it."""
    return _wait_partition(up, 0, lambda p: (broker in p["isr"]) == inside, what)["isr"]


def _acked_of(producing: Producing, partition: int) -> int:
    acked = list(producing.acked)  # a copy: the client's thread adds to it
    return sum(1 for value in acked if int(value) % PARTITIONS == partition)


def _acked_more(producing: Producing, count: int, what: str, partition: int = 0) -> None:
    """``count`` more records of ``partition`` acknowledged."""
    target = _acked_of(producing, partition) + count

    def enough() -> bool:
        assert not producing.errors, producing.errors[:3]
        return _acked_of(producing, partition) >= target

    wait_until(enough, timeout_s=STEP_DEADLINE_S, interval_s=0.1, message=what)


def test_partitions_and_a_slow_link_lose_nothing(sandbox: NetSandbox, cluster: RayCluster) -> None:
    started = time.monotonic()

    def progress(what: str) -> None:  # where the time goes, with -s
        print(f"{time.monotonic() - started:6.1f} s  {what}", flush=True)

    producing: Producing | None = None
    addresses = {rack: sandbox.address(rack) for rack in RACKS}
    lag = f"replica.lag.time.max.ms={LAG_TIME_MS}"
    with raylog_on(cluster, addresses, lag) as (up, racks):
        progress("raylog up on the Ray nodes")
        try:
            create_durable_topic(up, TOPIC, PARTITIONS)
            bootstrap = ",".join(f"{cluster.hosts[r]}:{cluster.ports[r]}" for r in RACKS)
            progress(f"topic created; bootstrap {bootstrap}")
            settings = {"socket.timeout.ms": 10_000}
            producing = Producing(bootstrap, TOPIC, PARTITIONS, MESSAGE_TIMEOUT_S, PACE_S, settings)
            producing.start()
            _acked_more(producing, ACKED_STEP, "records acknowledged before any fault")

            # 1. A follower cut off from its leader, both ways.
            p0 = _in_sync(up, 0)
            leader = p0["leader"]
            follower = next(b for b in p0["replicas"] if b != leader)
            lr, fr = racks[leader], racks[follower]
            sandbox.cut(fr, lr)
            sandbox.cut(lr, fr)
            progress(f"follower {follower} ({fr}) cut off from leader {leader} ({lr})")
            isr = _wait_isr(up, follower, False, f"follower {follower} out of the ISR")
            assert leader in isr, isr
            _acked_more(producing, ACKED_STEP, "acks=all continuing with the ISR left")
            sandbox.mend(fr, lr)
            sandbox.mend(lr, fr)
            _wait_isr(up, follower, True, f"follower {follower} back in the ISR once mended")
            progress("the cut follower rejoined the ISR")

            # 2. The same follower's link to its leader slow, not cut.
            sandbox.slow(fr, lr, SLOW_RATE)
            progress(f"link {fr}-{lr} slowed to {SLOW_RATE}")
            _wait_isr(up, follower, False, f"slow follower {follower} out of the ISR")
            _acked_more(producing, ACKED_STEP, "acks=all continuing past the slow follower")
            sandbox.unslow(fr, lr)
            _wait_isr(up, follower, True, f"follower {follower} back in the ISR once fast")
            progress("the slow follower rejoined the ISR")

            # 3. What partition 0's leader sends its followers dropped: one direction.
            followers = [racks[b] for b in p0["replicas"] if b != leader]
            for rack in followers:
                sandbox.cut(lr, rack)
            progress(f"leader {leader} ({lr}) cannot send to {followers}")
            _wait_partition(
                up, 0, lambda p: p["isr"] == [leader], f"the ISR of partition 0 shrunk to {leader}"
            )
            for rack in followers:
                sandbox.mend(lr, rack)
            back = _in_sync(up, 0)
            assert back["leader"] == leader and back["leader_epoch"] == p0["leader_epoch"], back
            _acked_more(producing, ACKED_STEP, "acks=all resumed on partition 0's leader")
            progress("the followers rejoined the ISR")

            # 4. Partition 1's leader isolated from every other machine.
            p1 = _in_sync(up, 1)
            gone = p1["leader"]
            gone_rack = racks[gone]
            sandbox.isolate(gone_rack)
            progress(f"node {gone_rack} (broker {gone}, leader of partition 1) isolated")
            moved = _wait_partition(
                up,
                1,
                lambda p: p["leader"] not in (gone, -1),
                f"a new leader of partition 1 after isolating broker {gone}",
                STEP_DEADLINE_S,
            )
            assert moved["leader_epoch"] > p1["leader_epoch"], (p1, moved)
            _acked_more(producing, ACKED_STEP, "records acknowledged by the new leader", 1)
            progress(f"partition 1 led by broker {moved['leader']}")

            sent = producing.finish(MESSAGE_TIMEOUT_S)
            alive = [f"{cluster.hosts[r]}:{cluster.ports[r]}" for r in RACKS if r != gone_rack]
            log = read_back(",".join(alive), TOPIC, sent_ends(sent, PARTITIONS), READ_DEADLINE_S)
            progress("read back")
        finally:
            if producing is not None:
                producing.abandon()
    check_exactly_once(log, sent, producing.acked)
    for p, records in log.items():
        dirs = node_replica_dirs(cluster.root / "head-data", TOPIC, p)
        live = {name for name in dirs if not name.startswith(f"{gone_rack}/")}
        assert len(dirs) == len(RACKS) and len(live) == len(RACKS) - 1, sorted(dirs)
        try:
            replicas_agree(dirs, len(records), live)
        except AssertionError:
            print("\n".join(batch_headers(cluster.root / "head-data" / "node-a", TOPIC, p)))
            raise
