"""Reassignment, rebalance, auto leader rebalance and the memory check on real Ray.

One node, three brokers (racks a, b, c), active + standby controller. Proves:
- an RF=2 partition reassigned from brokers {1, 2} to {2, 3} while acks=all produce goes on
  loses no acknowledged record, leadership leaves broker 1, and broker 1's replica stops and its
  data directory is deleted;
- a throttled reassignment reports its progress (the adding replica's log end against the
  leader's), and when the active controller is killed in the middle the standby resumes it from
  the metadata and completes it, then drops the throttle;
- a cancel puts the original replicas back and stops the adding one;
- ``rebalance`` moves replicas of a topic placed on two brokers onto the third;
- after the brokers stop one by one (so the last one leads everything, as after restarting
  ``raylog up``) and come back, the automatic preferred-leader rebalance hands every partition
  back to its preferred leader without anyone asking;
- a topic whose replicas would not fit the node's declared memory is refused with
  POLICY_VIOLATION and nothing is created;
- decommissioning a broker is refused, naming the topic, while a partition's replication factor
  needs it (and then it is not marked draining); otherwise every replica moves off it, nothing
  acknowledged is lost, and its replica actors stop; it stays draining, so new topics are placed
  on the other brokers only, until its decommission is cancelled.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from support.controller_cluster import (
    BROKERS,
    CALL_TIMEOUT_S,
    ControllerCluster,
    cluster_fixture,
    get,
)
from support.waiting import wait_until

from raylog.storage import batch as rb
from raylog.storage.errors import (
    InvalidReplicationFactorError,
    NoReassignmentInProgressError,
    PolicyViolationError,
)

pytestmark = pytest.mark.slow

PREFIX = "reassign-test"
BROKER_CONFIGS = {
    "broker.heartbeat.interval.ms": "100",
    "broker.session.timeout.ms": "3000",
    "leader.imbalance.check.interval.seconds": "1",
    # Followers leave the ISR fast once their broker stops, so leadership can come back.
    "replica.lag.time.max.ms": "3000",
}


@pytest.fixture(scope="module")
def cluster(
    ray_local: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerCluster]:
    root = tmp_path_factory.mktemp("reassign")
    yield from cluster_fixture(ControllerCluster(root, PREFIX, BROKER_CONFIGS))


def _produce_acked(cluster: ControllerCluster, topic: str, i: int, timeout_s: float = 20) -> int:
    """Produce record ``i`` with acks=all, retrying retriable errors (leadership moves) like a
    Kafka client; returns the acknowledged offset."""
    acked: list[int] = []

    def attempt() -> bool:
        try:
            outcome = cluster.produce(topic, i)
        except (ray.exceptions.RayActorError, AttributeError, KeyError):
            return False  # the leader's replica is being replaced; look it up again
        if outcome.error_code == 0:
            acked.append(outcome.base_offset)
            return True
        return False

    wait_until(attempt, timeout_s=timeout_s, interval_s=0.01, message=f"acks=all produce {i}")
    return acked[0]


def _offsets(cluster: ControllerCluster, topic: str, broker: int) -> set[int]:
    fetched = get(cluster.replica(broker, topic).fetch.remote(0, 8 << 20))
    return {h.base_offset for _, h in rb.iter_batches(fetched.records)}


def _create_on(cluster: ControllerCluster, topic: str, assignment: list[list[int]]) -> None:
    cluster.call("create_topic", topic, len(assignment), len(assignment[0]), {}, assignment)
    cluster.reconciled()


def test_auto_leader_rebalance_after_brokers_stopped_one_by_one(cluster: ControllerCluster) -> None:
    cluster.call("create_topic", "skewed", 3, 3, {})
    cluster.reconciled()
    preferred = [p.replicas[0] for p in cluster.call("metadata").topics["skewed"].partitions]
    assert sorted(preferred) == [1, 2, 3]
    last = preferred[2]
    for b in preferred[:2]:  # a rolling controlled shutdown: the broker left keeps every leader
        assert get(cluster.brokers[b].shutdown.remote()) is True
    leaders = [p.leader for p in cluster.call("metadata").topics["skewed"].partitions]
    assert leaders == [last, last, last]
    for b in preferred[:2]:
        ray.kill(cluster.brokers[b], no_restart=False)  # Ray restarts it: registers anew
    wait_until(
        lambda: (
            [p.leader for p in cluster.call("metadata").topics["skewed"].partitions] == preferred
        ),
        timeout_s=4 * CALL_TIMEOUT_S,  # two broker restarts on a loaded machine
        message="every partition led by its preferred replica again",
    )


def test_reassign_rf2_from_1_2_to_2_3_while_producing_loses_nothing(
    cluster: ControllerCluster,
) -> None:
    _create_on(cluster, "moving", [[1, 2]])
    acked = {i: _produce_acked(cluster, "moving", i) for i in range(50)}
    codes = cluster.call("reassign_partitions", {("moving", 0): [2, 3]})
    assert codes == {("moving", 0): (0, "")}
    p = cluster.partition("moving")
    assert p.replicas == (2, 3, 1) and p.adding_replicas == (3,) and p.removing_replicas == (1,)
    i = 50
    while cluster.partition("moving").reassigning:  # bounded by the produce timeouts below
        acked[i] = _produce_acked(cluster, "moving", i)
        i += 1
        assert i < 5_000, "the reassignment never completed"
    assert i > 50, "no record was produced while the reassignment ran"
    for j in range(i, i + 10):
        acked[j] = _produce_acked(cluster, "moving", j)
    p = cluster.partition("moving")
    assert p.replicas == (2, 3) and set(p.isr) == {2, 3} and p.leader == 2
    assert not cluster.call("list_reassignments")
    for b in (2, 3):
        wait_until(
            lambda b=b: set(acked.values()) <= _offsets(cluster, "moving", b),
            timeout_s=CALL_TIMEOUT_S,
            message=f"every acknowledged record on broker {b}",
        )
    cluster.reconciled()
    assert cluster.replica(1, "moving") is None
    assert not (cluster.root / "data" / "broker-1" / "moving-0").exists()


def test_controller_failover_in_the_middle_resumes_a_throttled_reassignment(
    cluster: ControllerCluster,
) -> None:
    _create_on(cluster, "slow-move", [[1, 2]])
    for i in range(300):
        _produce_acked(cluster, "slow-move", i)
    # ~30 kB to copy at 4 kB/s: several seconds, long enough to kill the controller in between.
    codes = cluster.call("reassign_partitions", {("slow-move", 0): [3, 2]}, 4_000)
    assert codes[("slow-move", 0)][0] == 0
    progress = wait_until(
        lambda: [
            r for r in cluster.call("list_reassignments") if r.adding_log_end_offsets.get(3, -1) > 0
        ],
        timeout_s=CALL_TIMEOUT_S,
        message="the adding replica copying",
    )
    [row] = progress
    assert row.target == (3, 2) and row.removing == (1,)
    assert 0 < row.adding_log_end_offsets[3] < row.leader_log_end_offset == 300
    assert cluster.call("metadata").dynamic_broker_configs == {
        "leader.replication.throttled.rate": "4000"
    }
    old = cluster.active()
    ray.kill(old, no_restart=False)  # comes back as the standby
    wait_until(
        lambda: not cluster.partition("slow-move").reassigning,
        timeout_s=2 * CALL_TIMEOUT_S,
        message="the new controller completes the reassignment",
    )
    p = cluster.partition("slow-move")
    assert p.replicas == (3, 2) and set(p.isr) == {2, 3}
    assert cluster.call("metadata").dynamic_broker_configs == {}, "throttle not lifted"
    assert _produce_acked(cluster, "slow-move", 300) == 300
    cluster.reconciled()
    assert cluster.replica(1, "slow-move") is None


def test_cancel_restores_the_original_replicas(cluster: ControllerCluster) -> None:
    _create_on(cluster, "undo", [[1, 2]])
    for i in range(100):
        _produce_acked(cluster, "undo", i)
    cluster.call("reassign_partitions", {("undo", 0): [3, 2]}, 500)  # crawls: cancel in time
    codes = cluster.call("cancel_reassignments", [("undo", 0)])
    assert codes == {("undo", 0): (0, "")}
    p = cluster.partition("undo")
    assert set(p.replicas) == {1, 2} and not p.reassigning and 3 not in p.isr
    again = cluster.call("cancel_reassignments", [("undo", 0)])
    assert again[("undo", 0)][0] == NoReassignmentInProgressError.error_code
    cluster.reconciled()
    assert cluster.replica(3, "undo") is None


def test_rebalance_moves_replicas_onto_the_unused_broker(cluster: ControllerCluster) -> None:
    _create_on(cluster, "lopsided", [[1, 2], [2, 1], [1, 2]])
    started = cluster.call("rebalance", ["lopsided"])
    assert sum(3 in target for target in started.values()) == 2
    wait_until(
        lambda: not cluster.call("list_reassignments"),
        timeout_s=2 * CALL_TIMEOUT_S,  # replica starts and push rounds are slow under load
        message="rebalance reassignments complete",
    )
    md = cluster.call("metadata")
    counts = {b: 0 for b in BROKERS}
    for p in md.topics["lopsided"].partitions:
        for b in p.replicas:
            counts[b] += 1
    assert sorted(counts.values()) == [2, 2, 2]
    assert cluster.call("rebalance", ["lopsided"]) == {}


def test_topic_that_would_not_fit_in_memory_is_refused(cluster: ControllerCluster) -> None:
    with pytest.raises(PolicyViolationError) as e:
        cluster.call("create_topic", "enormous", 50_000, 3, {})
    assert "MiB" in str(e.value)
    assert "enormous" not in cluster.call("metadata").topics


def test_decommission_moves_every_replica_off_a_broker(cluster: ControllerCluster) -> None:
    _create_on(cluster, "wide3", [[1, 2, 3]])
    with pytest.raises(InvalidReplicationFactorError, match="replication factor is 3"):
        cluster.call("decommission", 3)
    assert not cluster.call("metadata").brokers[3].draining, "a refused decommission marks none"
    for name, t in cluster.call("metadata").topics.items():
        if len(t.partitions[0].replicas) == 3:  # they need every broker
            cluster.call("delete_topic", name)
    _create_on(cluster, "held", [[3, 1], [2, 3]])
    for i in range(20):
        _produce_acked(cluster, "held", i)
    started = cluster.call("decommission", 3)
    assert started and all(3 not in target for target in started.values())
    wait_until(
        lambda: not cluster.call("list_reassignments"),
        timeout_s=2 * CALL_TIMEOUT_S,
        message="the replicas moved off broker 3",
    )
    md = cluster.call("metadata")
    assert all(3 not in p.replicas for t in md.topics.values() for p in t.partitions)
    assert cluster.call("decommission", 3) == {}  # nothing left to move
    cluster.reconciled()
    assert cluster.replica(3, "held") is None and cluster.replica(3, "held", 1) is None
    assert _offsets(cluster, "held", cluster.leader("held")) == set(range(20))
    # Draining until cancelled: new topics are placed on the other brokers only.
    assert cluster.call("metadata").brokers[3].draining
    placed = cluster.call("create_topic", "after", 4, 2, {})
    assert all(3 not in p.replicas for p in placed.partitions)
    with pytest.raises(InvalidReplicationFactorError):
        cluster.call("create_topic", "too-wide", 1, 3, {})
    assert cluster.call("cancel_decommission", 3) is True
    assert cluster.call("cancel_decommission", 3) is False  # no longer draining
    assert not cluster.call("metadata").brokers[3].draining
