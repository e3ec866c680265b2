"""Replica placement spreads racks first, balances preferred leaders, and refuses what cannot fit.

Proves, by example and by hypothesis over random clusters: every replica list has distinct
brokers and spans min(RF, racks) racks; preferred leaders differ by at most one per broker;
placement is deterministic in its start index; CreatePartitions continues the rotation; the
memory check gives the numbers; a rebalance plan reaches counts within one with the fewest moves,
never doubling a broker in a partition nor losing a rack.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raylog.actors.control.placement import (
    BrokerSlot,
    check_memory_fit,
    place_new_partitions,
    place_replicas,
    plan_rebalance,
    rack_alternating,
    replicas_fit,
)
from raylog.storage.errors import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    PolicyViolationError,
)


def brokers(racks: dict[int, str | None]) -> list[BrokerSlot]:
    return [BrokerSlot(b, r) for b, r in racks.items()]


def test_rack_alternating_order() -> None:
    bs = brokers({1: "a", 2: "a", 3: "b", 4: "c", 5: "c"})
    assert rack_alternating(bs) == [1, 3, 4, 2, 5]
    assert rack_alternating(brokers({3: None, 1: None, 2: None})) == [1, 2, 3]


def test_three_racks_rf3_uses_every_rack_and_rotates_leaders() -> None:
    bs = brokers({1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"})
    placed = place_replicas(bs, 6, 3)
    rack = {b.broker_id: b.rack for b in bs}
    for replicas in placed:
        assert {rack[b] for b in replicas} == {"a", "b", "c"}
    assert sorted(r[0] for r in placed) == [1, 2, 3, 4, 5, 6]
    replica_counts = Counter(b for r in placed for b in r)
    assert set(replica_counts.values()) == {3}


def test_start_index_is_the_only_source_of_variation() -> None:
    bs = brokers({1: None, 2: None, 3: None, 4: None})
    assert place_replicas(bs, 5, 2, start_index=7) == place_replicas(bs, 5, 2, start_index=7)
    assert place_replicas(bs, 4, 2, start_index=1)[0][0] == 2
    assert place_replicas(bs, 4, 2, start_index=0) != place_replicas(bs, 4, 2, start_index=1)


def test_errors_carry_kafka_codes() -> None:
    bs = brokers({1: None, 2: None})
    with pytest.raises(InvalidReplicationFactorError) as e:
        place_replicas(bs, 1, 3)
    assert e.value.error_code == 38
    assert "3" in str(e.value) and "2 available" in str(e.value)
    with pytest.raises(InvalidReplicationFactorError):
        place_replicas(bs, 1, 0)
    with pytest.raises(InvalidPartitionsError) as e2:
        place_replicas(bs, 0, 1)
    assert e2.value.error_code == 37


def test_add_partitions_continues_the_rotation() -> None:
    bs = brokers({1: "a", 2: "b", 3: "c", 4: "a", 5: "b", 6: "c"})
    whole = place_replicas(bs, 9, 3, start_index=2, replica_shift=0)
    first = whole[:4]
    assert place_new_partitions(bs, first, 5) == whole[4:]
    with pytest.raises(InvalidPartitionsError):
        place_new_partitions(bs, first, 0)


def test_memory_fit_is_checked_per_node_counting_existing_replicas() -> None:
    node_of = {1: "n1", 2: "n1", 3: "n2", 4: "n9"}  # brokers 1 and 2 share a node
    memory = {"n1": 57 * 10, "n2": 57 * 100}
    check_memory_fit([(1, 3)] * 10, [], node_of, memory, 57)
    check_memory_fit([(4,)] * 1000, [], node_of, memory, 57)  # unknown node: not checked
    with pytest.raises(PolicyViolationError):
        check_memory_fit([(1, 2)] * 6, [], node_of, memory, 57)  # 12 replicas on n1
    with pytest.raises(PolicyViolationError) as e:
        check_memory_fit([(1, 3)] * 2, [(2, 3)] * 9, node_of, memory, 57)  # 9 already there
    assert "2 new replicas" in str(e.value) and "57 MiB free" in str(e.value)
    # The figure the brokers measured, not a constant: at 114 MiB a replica, 5 fill n1.
    check_memory_fit([(1, 2)] * 2, [(1,)], node_of, memory, 114)
    with pytest.raises(PolicyViolationError) as e:
        check_memory_fit([(1, 2)] * 3, [], node_of, memory, 114)
    assert "6 x 114 MiB" in str(e.value)


def test_replicas_fit_gives_the_numbers() -> None:
    replicas_fit(10, 57, 570)
    with pytest.raises(PolicyViolationError) as e:
        replicas_fit(90, 57, 3000)
    msg = str(e.value)
    assert "90" in msg and "5130 MiB" in msg and "3000 MiB" in msg
    assert e.value.error_code == 44


clusters = st.dictionaries(
    st.integers(0, 40), st.sampled_from(["a", "b", "c", "d", None]), min_size=1, max_size=12
)


@settings(max_examples=150, deadline=None)
@given(
    clusters,
    st.integers(1, 30),
    st.integers(1, 5),
    st.integers(0, 100),
    st.integers(0, 100),
)
def test_placement_properties(
    racks: dict[int, str | None], n_parts: int, rf: int, start: int, shift: int
) -> None:
    bs = brokers(racks)
    if rf > len(bs):
        with pytest.raises(InvalidReplicationFactorError):
            place_replicas(bs, n_parts, rf, start_index=start, replica_shift=shift)
        return
    placed = place_replicas(bs, n_parts, rf, start_index=start, replica_shift=shift)
    assert len(placed) == n_parts
    n_racks = len(set(racks.values()))
    for replicas in placed:
        assert len(replicas) == rf
        assert len(set(replicas)) == rf
        assert set(replicas) <= set(racks)
        assert len({racks[b] for b in replicas}) == min(rf, n_racks)
    # Preferred leaders go round-robin over all brokers, so counts differ by at most one.
    leaders = Counter(r[0] for r in placed)
    counts = [leaders.get(b, 0) for b in racks]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 9), st.integers(1, 4), st.integers(1, 6), st.integers(0, 50))
def test_uniform_brokers_balance_replicas_per_round(
    n: int, rf: int, rounds: int, start: int
) -> None:
    # With one broker per rack (or no racks), whole rounds of n partitions put exactly rf
    # replicas on every broker.
    if rf > n:
        return
    bs = brokers({b: None for b in range(n)})
    placed = place_replicas(bs, n * rounds, rf, start_index=start)
    counts = Counter(b for r in placed for b in r)
    assert set(counts.values()) == {rf * rounds}


def excess(assignment: dict, racks: dict[int, str | None]) -> int:
    counts = Counter({b: 0 for b in racks})
    for replicas in assignment.values():
        counts.update(replicas)
    total = sum(counts.values())
    low, extra = divmod(total, len(racks))
    by_load = sorted(racks, key=lambda b: (-counts[b], b))
    target = {b: low + (1 if i < extra else 0) for i, b in enumerate(by_load)}
    return sum(max(0, c - target.get(b, 0)) for b, c in counts.items())


def test_rebalance_moves_followers_to_a_new_broker() -> None:
    racks = {1: None, 2: None, 3: None, 4: None}
    assignment = {f"t-{i}": (1 + i % 3, 1 + (i + 1) % 3) for i in range(6)}  # broker 4 is new
    plan = plan_rebalance(assignment, brokers(racks))
    assert plan.balanced
    counts = Counter(b for r in plan.assignment.values() for b in r)
    assert sorted(counts.values()) == [3, 3, 3, 3]
    assert len(plan.moves) == 3  # 12 replicas, 4 each: three brokers shed one each
    # Preferred leaders stay put: only followers moved.
    assert all(plan.assignment[k][0] == assignment[k][0] for k in assignment)


def test_rebalance_drains_a_broker_not_in_the_list() -> None:
    racks = {1: "a", 2: "b", 3: "a", 4: "b"}
    assignment = {"p0": (1, 2), "p1": (5, 4), "p2": (3, 5)}
    plan = plan_rebalance(assignment, brokers(racks))
    assert all(5 not in r for r in plan.assignment.values())
    assert {m.from_broker for m in plan.moves} == {5}
    assert plan.balanced


def test_rebalance_of_a_balanced_cluster_moves_nothing() -> None:
    racks = {1: None, 2: None, 3: None}
    assignment = dict(enumerate(place_replicas(brokers(racks), 7, 2)))
    plan = plan_rebalance(assignment, brokers(racks))
    assert plan.moves == [] and plan.balanced


@settings(max_examples=100, deadline=None)
@given(
    clusters,
    st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=3, unique=True), max_size=20),
)
def test_rebalance_properties(racks: dict[int, str | None], raw: list[list[int]]) -> None:
    assignment = {i: tuple(r) for i, r in enumerate(raw)}
    plan = plan_rebalance(assignment, brokers(racks))
    # Fewest moves: each move lowers the excess by exactly one.
    assert len(plan.moves) <= excess(assignment, racks)
    if plan.balanced:
        assert len(plan.moves) == excess(assignment, racks)
        counts = Counter({b: 0 for b in racks})
        for r in plan.assignment.values():
            counts.update(r)
        live = [counts[b] for b in racks]
        assert max(live) - min(live) <= 1
        assert all(b in racks for r in plan.assignment.values() for b in r)
    for k, before in assignment.items():
        after = plan.assignment[k]
        assert len(after) == len(before) and len(set(after)) == len(after)
        kept = [b for b in before if b in racks]
        assert len({racks[b] for b in after if b in racks}) >= len({racks[b] for b in kept})
