"""Continuous balancing's decisions (``raylog.actors.control.balancer``) and draining brokers,
without Ray.

Proves: a broker that joins is filled by steps in which no broker takes part in more than one
move, until every broker holds within one replica of the others, with every partition keeping
its racks; nothing moves while a partition is under-replicated or offline or a reassignment
runs; a draining broker (being decommissioned) is emptied and never filled, new topics and other
brokers' decommissions pass it over, and it stays draining across a restart until its drain is
cancelled; a lost broker's replicas (down past the heal threshold) are re-created on the others
from each partition's leader, restoring every replication factor, while a partition wholly on
lost brokers is left alone and holds nothing up.
"""

from __future__ import annotations

from collections import Counter

from raylog.actors.control import balancer, placement
from raylog.actors.control import election as e
from raylog.actors.control import metadata as m
from raylog.actors.control import reassignment as r
from raylog.actors.control.metadata import ClusterMetadata, TopicPartition

RACK = {1: "a", 2: "b", 3: "c", 4: "a"}
STEPS_MAX = 30


def cluster(n: int) -> ClusterMetadata:
    md = ClusterMetadata(cluster_id="c1")
    for b in range(1, n + 1):
        md = m.register_broker(md, b, f"inc{b}", RACK[b], "127.0.0.1", 9091 + b)
    return md


def finish(md: ClusterMetadata) -> ClusterMetadata:
    """Every running reassignment's adding replicas catch up and join the ISR; complete."""
    for tp, p in m.partitions(md):
        for b in p.adding_replicas:
            isr = tuple(x for x in p.replicas if x in p.isr or x == b)
            md = m.apply_alter_partition(md, tp.topic, tp.partition, isr)
            p = m.get_partition(md, tp.topic, tp.partition)
    return r.complete_round(md).metadata


def run_until_balanced(
    md: ClusterMetadata, lost: frozenset[int] = frozenset()
) -> tuple[ClusterMetadata, int]:
    """Apply the balancer's steps as the controller does; returns the metadata and the steps."""
    for step_count in range(1, STEPS_MAX + 1):
        step = balancer.next_step(md, lost)
        if not step.targets:
            assert step.state == balancer.BALANCED, step.state
            return md, step_count
        assert step.state == f"moving {len(step.targets)} partitions"
        touched: Counter[int] = Counter()
        for tp, target in step.targets.items():
            before = m.get_partition(md, tp.topic, tp.partition).replicas
            touched.update((set(before) ^ set(target)) - lost)  # live brokers a move touches
        assert max(touched.values()) == 1, f"a broker in two moves at once: {touched}"
        out = r.start(md, step.targets)
        assert not out.errors
        assert balancer.next_step(out.metadata, lost).state.startswith("waiting: ")
        md = finish(out.metadata)
    raise AssertionError(f"not balanced after {STEPS_MAX} steps")


def counts(md: ClusterMetadata) -> Counter[int]:
    return Counter(b for _, p in m.partitions(md) for b in p.replicas)


def test_a_broker_that_joins_is_filled_one_move_at_a_time() -> None:
    md = m.create_topic(cluster(3), "t", "id-t", [[1, 2], [2, 3], [3, 1]] * 4)
    md = m.register_broker(md, 4, "inc4", RACK[4], "127.0.0.1", 9096)
    assert balancer.next_step(md).targets, "broker 4 holds nothing: moves are due"
    md, steps = run_until_balanced(md)
    assert counts(md) == {1: 6, 2: 6, 3: 6, 4: 6}
    assert steps > 2, "one move per broker per step: the 6 moves onto broker 4 take 6 steps"
    for _, p in m.partitions(md):
        assert len({RACK[b] for b in p.replicas}) == 2  # no partition lost a rack


def test_nothing_moves_while_a_partition_is_short_or_a_reassignment_runs() -> None:
    md = m.create_topic(cluster(3), "t", "id-t", [[1, 2], [1, 2], [1, 2]])
    assert balancer.next_step(md).targets
    fenced = e.fence_broker(md, 2).metadata  # broker 2 down: every ISR is short
    step = balancer.next_step(fenced)
    assert step.targets == {} and step.state == "paused: 3 partitions under-replicated or offline"
    moving = r.start(md, {TopicPartition("t", 0): (3, 2)}).metadata
    step = balancer.next_step(moving)
    assert step.targets == {} and step.state == "waiting: 1 partitions being reassigned"


def test_a_draining_broker_is_emptied_and_passed_over() -> None:
    md = m.create_topic(cluster(4), "t", "id-t", [[1, 2], [2, 3], [3, 4], [4, 1]])
    md = m.set_draining(md, 1, True)
    assert [b.broker_id for b in m.active_brokers(md)] == [2, 3, 4]
    chosen = placement.place_replicas(m.active_brokers(md), 6, 2)
    assert all(1 not in replicas for replicas in chosen), "new replicas skip broker 1"
    assert all(1 not in t for t in r.decommission_targets(md, 2).values())
    md, _ = run_until_balanced(md)
    assert counts(md)[1] == 0 and sorted(counts(md).values()) == [2, 3, 3]
    # A restart (a new incarnation) keeps it draining; cancelling ends it.
    md = e.fence_broker(md, 1).metadata
    md = e.register_broker(md, 1, "inc1b", "a", "127.0.0.1", 9092, old_session_live=False).metadata
    assert md.brokers[1].draining
    md = m.set_draining(md, 1, False)
    assert [b.broker_id for b in m.active_brokers(md)] == [1, 2, 3, 4]
    assert balancer.next_step(md).targets, "broker 1 takes replicas again"


def test_a_lost_brokers_replicas_are_recreated_on_the_others() -> None:
    md = m.create_topic(cluster(4), "t", "id-t", [[1, 2], [2, 3], [3, 4], [4, 1], [1, 3], [2, 4]])
    md = m.create_topic(md, "solo", "id-solo", [[4]])  # RF=1: gone with its broker
    md = e.fence_broker(md, 4).metadata
    step = balancer.next_step(md)  # down, not yet lost: expected back
    assert step.targets == {} and step.state == "paused: 4 partitions under-replicated or offline"
    lost = frozenset({4})
    md, _ = run_until_balanced(md, lost)
    for tp, p in m.partitions(md):
        if tp.topic == "solo":
            assert p.replicas == (4,), "nothing to copy from: left alone"
        else:
            assert 4 not in p.replicas and len(p.replicas) == 2 and set(p.isr) == set(p.replicas)
    assert sorted(counts(md).values()) == [1, 4, 4, 4]  # broker 4 keeps only the offline one
