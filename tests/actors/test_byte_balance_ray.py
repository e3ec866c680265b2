"""Continuous balancing by bytes on real Ray: the controller weighs what the replicas hold.

One node, three brokers (racks a, b, c), the balancer on with a small byte gap. A topic of six
RF=1 partitions, two on each broker (counts even), of which the two on broker 1 are written
full and the rest barely: proves that the controller learns the partitions' sizes from the
brokers' replicas and swaps a big partition of broker 1 for a small one of the lightest broker
(counts stay even), and that every acknowledged record is still there afterwards.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.controller_cluster import CALL_TIMEOUT_S, ControllerCluster, cluster_fixture, get
from support.waiting import wait_until

from raylog.storage import batch as rb

pytestmark = pytest.mark.slow

TOPIC = "weights"
BIG = 80  # batches into each of broker 1's partitions
VALUE = b"x" * 4000
BROKER_CONFIGS = {
    "replica.balancer.enable": "true",
    "replica.balancer.check.interval.ms": "500",
    "replica.balancer.bytes.min.gap": "65536",
}


@pytest.fixture(scope="module")
def cluster(
    ray_local: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerCluster]:
    root = tmp_path_factory.mktemp("bytebalance")
    yield from cluster_fixture(ControllerCluster(root, "bytebalance-test", BROKER_CONFIGS))


def _append(cluster: ControllerCluster, partition: int, i: int) -> int:
    data = rb.build_batch([rb.Record(key=str(i).encode(), value=VALUE, timestamp_ms=1)])
    outcome = get(cluster.leader_replica(TOPIC, partition).produce.remote(data, -1, 5_000))
    assert outcome.error_code == 0, outcome
    return int(outcome.base_offset)


def _records(cluster: ControllerCluster, partition: int) -> int:
    broker = cluster.leader(TOPIC, partition)
    fetched = get(cluster.replica(broker, TOPIC, partition).fetch.remote(0, 64 << 20))
    return sum(h.records_count for _, h in rb.iter_batches(fetched.records))


def test_a_broker_holding_the_big_partitions_gives_one_away(cluster: ControllerCluster) -> None:
    assignment = [[1], [1], [2], [2], [3], [3]]
    cluster.call("create_topic", TOPIC, len(assignment), 1, {}, assignment)
    cluster.reconciled()
    written = Counter[int]()
    for p in (0, 1):
        for i in range(BIG):
            _append(cluster, p, i)
            written[p] += 1
    for p in (2, 3, 4, 5):
        _append(cluster, p, 0)
        written[p] += 1

    def on_broker_1() -> list[int]:
        md = cluster.call("metadata")
        return [p.partition for p in md.topics[TOPIC].partitions if 1 in p.replicas]

    wait_until(
        lambda: sorted(on_broker_1()) != [0, 1] and not cluster.call("list_reassignments"),
        timeout_s=4 * CALL_TIMEOUT_S,
        message="a big partition swapped off broker 1",
    )
    md = cluster.call("metadata")
    held = Counter(b for p in md.topics[TOPIC].partitions for b in p.replicas)
    assert held == {1: 2, 2: 2, 3: 2}, held  # a swap keeps the counts even
    assert len([p for p in on_broker_1() if p in (0, 1)]) == 1
    cluster.reconciled()
    for p, count in written.items():
        assert _records(cluster, p) == count, p
