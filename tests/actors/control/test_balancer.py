"""Continuous balancing's decisions (``raylog.actors.control.balancer``) and draining brokers,
without Ray.

Proves: a broker that joins is filled by steps in which no broker takes part in more than one
move, until every broker holds within one replica of the others, with every partition keeping
its racks; nothing moves while a partition is under-replicated or offline or a reassignment
runs; a draining broker (being decommissioned) is emptied and never filled, new topics and other
brokers' decommissions pass it over, and it stays draining across a restart until its drain is
cancelled; a lost broker's replicas (down past the heal threshold) are re-created on the others
from each partition's leader, restoring every replication factor, while a partition wholly on
lost brokers is left alone and holds nothing up; once counts are even, bytes are evened by
swaps that keep every broker's count and every partition's racks and narrow the gap between
the fullest and the emptiest broker (in random layouts too), and not at all within the
threshold, below the minimum gap or without sizes.
"""

from __future__ import annotations

import random
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


def held_bytes(md: ClusterMetadata, sizes: dict[TopicPartition, int]) -> Counter[int]:
    out: Counter[int] = Counter()
    for tp, p in m.partitions(md):
        for b in p.replicas:
            out[b] += sizes[tp]
    return out


def test_bytes_are_evened_by_swaps_once_counts_are() -> None:
    # Counts even (two replicas each), bytes not: broker 1 holds both big partitions.
    md = m.create_topic(cluster(3), "t", "id-t", [[1], [1], [2], [2], [3], [3]])
    size_list = [1000, 900, 100, 100, 50, 50]
    sizes = {TopicPartition("t", i): size for i, size in enumerate(size_list)}
    rule = balancer.ByteRule(sizes, threshold=1.1, min_gap=100)
    assert held_bytes(md, sizes) == {1: 1900, 2: 200, 3: 100}
    for _ in range(STEPS_MAX):
        step = balancer.next_step(md, by_bytes=rule)
        if not step.targets:
            break
        assert step.state == "moving 2 partitions (bytes)" and len(step.targets) == 2
        before = counts(md)
        md = finish(r.start(md, step.targets).metadata)
        assert counts(md) == before, "a swap keeps every broker's count"
    else:
        raise AssertionError("swaps did not end")
    assert step.state == balancer.BALANCED
    spread = held_bytes(md, sizes)
    # The best two-per-broker split: the big ones apart, each with a small one.
    assert sorted(spread.values()) == [200, 950, 1050], spread
    # Without sizes, or within the threshold or the minimum gap, counts alone decide.
    md0 = m.create_topic(cluster(3), "t", "id-t", [[1], [1], [2], [2], [3], [3]])
    assert balancer.next_step(md0).state == balancer.BALANCED
    loose = balancer.ByteRule(sizes, threshold=3.0, min_gap=100)
    assert balancer.next_step(md0, by_bytes=loose).state == balancer.BALANCED
    small = balancer.ByteRule(sizes, threshold=1.1, min_gap=2_000)
    assert balancer.next_step(md0, by_bytes=small).state == balancer.BALANCED


def test_every_swap_keeps_counts_and_racks_and_narrows_the_gap() -> None:
    rng = random.Random(7)
    brokers = [placement.BrokerSlot(b, RACK[b]) for b in (1, 2, 3, 4)]
    swaps = 0
    for _ in range(300):
        assignment = {TopicPartition("t", i): tuple(rng.sample([1, 2, 3, 4], 2)) for i in range(8)}
        sizes = {tp: rng.choice([1, 10, 100, 1000]) for tp in assignment}
        rule = balancer.ByteRule(sizes, threshold=1.0, min_gap=0)
        swap = balancer.byte_swap(assignment, brokers, rule)
        if not swap:
            continue
        swaps += 1
        after = {**assignment, **swap}

        def weigh(
            a: dict[TopicPartition, tuple[int, ...]], sizes: dict[TopicPartition, int] = sizes
        ) -> Counter[int]:
            return Counter({b: sum(sizes[tp] for tp, r in a.items() if b in r) for b in RACK})

        assert Counter(b for r in after.values() for b in r) == Counter(
            b for r in assignment.values() for b in r
        )
        for tp, target in swap.items():
            assert len({RACK[b] for b in target}) >= len({RACK[b] for b in assignment[tp]})
        before_w, after_w = weigh(assignment), weigh(after)
        heavy = max(before_w, key=lambda b: (before_w[b], -b))
        light = min(before_w, key=lambda b: (before_w[b], b))
        assert abs(after_w[heavy] - after_w[light]) < before_w[heavy] - before_w[light]
    assert swaps > 50, swaps
