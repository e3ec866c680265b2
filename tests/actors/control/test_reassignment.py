"""Partition reassignment (KIP-455) transitions, one test per rule, plus random histories.

Proves: starting a reassignment makes the replicas target + original with the adding and
removing sets recorded and the ISR and leader untouched; it completes only once every adding
replica is in the ISR, then drops the removed replicas from replicas and ISR and moves
leadership to the target's first eligible ISR member if the leader was removed; a pure removal
completes at once; a cancel restores the original replicas and drops the adding ones; a new
target replaces a running reassignment; bad targets are refused per partition with Kafka's
codes; every replica-set change bumps the leader epoch; the state survives the JSON round trip a
controller failover goes through; progress reports the adding replicas' log ends against the
leader's; rebalance targets move replicas onto an added broker (none while one runs).
Hypothesis drives random start/ISR-join/complete/cancel/fence sequences and checks the metadata
invariants after each.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raylog.actors.control import election as e
from raylog.actors.control import metadata as m
from raylog.actors.control import reassignment as r
from raylog.actors.control.metadata import (
    NO_LEADER,
    ClusterMetadata,
    PartitionState,
    TopicPartition,
)
from raylog.storage.errors import (
    BrokerNotAvailableError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    NoReassignmentInProgressError,
    ReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)

T0 = TopicPartition("t", 0)


def cluster(n: int = 4, racks: str | None = None) -> ClusterMetadata:
    md = ClusterMetadata(cluster_id="c1")
    for b in range(1, n + 1):
        rack = racks[b - 1] if racks else None
        md = m.register_broker(md, b, f"inc{b}", rack, "127.0.0.1", 9091 + b)
    return md


def with_topic(
    md: ClusterMetadata, assignment: list[list[int]], name: str = "t"
) -> ClusterMetadata:
    return m.create_topic(md, name, f"id-{name}", assignment)


def part(md: ClusterMetadata, tp: TopicPartition = T0) -> PartitionState:
    return m.get_partition(md, tp.topic, tp.partition)


def join_isr(md: ClusterMetadata, broker: int, tp: TopicPartition = T0) -> ClusterMetadata:
    p = part(md, tp)
    isr = tuple(b for b in p.replicas if b in p.isr or b == broker)  # assignment order
    return m.apply_alter_partition(md, tp.topic, tp.partition, isr)


def test_start_adds_target_replicas_as_followers_and_keeps_leader_and_isr() -> None:
    md = with_topic(cluster(), [[1, 2]])
    before = part(md)
    out = r.start(md, {T0: [2, 3]})
    p = part(out.metadata)
    assert not out.errors
    assert p.replicas == (2, 3, 1)
    assert (p.adding_replicas, p.removing_replicas) == ((3,), (1,))
    assert p.leader == 1 and p.isr == (2, 1)  # re-ordered to the new assignment order
    assert p.target_replicas == (2, 3) and p.original_replicas == (2, 1)
    assert p.leader_epoch == before.leader_epoch + 1, "the leader must learn its new follower"


def test_completes_only_when_every_adding_replica_is_in_the_isr() -> None:
    md = with_topic(cluster(), [[1, 2]])
    md = r.start(md, {T0: [2, 3, 4]}).metadata
    assert r.complete_ready(md).metadata is md
    md = join_isr(md, 3)
    assert r.complete_ready(md).metadata is md, "4 has not caught up yet"
    md = join_isr(md, 4)
    out = r.complete_ready(md)
    p = part(out.metadata)
    assert p.replicas == (2, 3, 4) and not p.reassigning
    assert p.isr == (2, 3, 4)
    assert p.leader == 2, "the removed leader hands over to the target's first ISR member"
    assert p.preferred_leader == 2


def test_leader_kept_when_it_stays_in_the_target() -> None:
    md = with_topic(cluster(), [[1, 2]])
    md = join_isr(r.start(md, {T0: [1, 3]}).metadata, 3)
    p = part(r.complete_ready(md).metadata)
    assert (p.replicas, p.leader, p.isr) == ((1, 3), 1, (1, 3))


def test_completion_waits_while_no_target_member_can_lead() -> None:
    md = with_topic(cluster(), [[1, 2]])
    md = join_isr(r.start(md, {T0: [3]}).metadata, 3)
    md = e.fence_broker(md, 3).metadata  # 3 leaves the ISR again
    assert 3 not in part(md).isr
    assert r.complete_ready(md).metadata is md


def test_pure_removal_and_reorder_complete_at_once() -> None:
    md = with_topic(cluster(), [[1, 2, 3]])
    p = part(r.start(md, {T0: [3, 2]}).metadata)
    assert (p.replicas, p.isr, p.leader, p.reassigning) == ((3, 2), (3, 2), 3, False)
    p = part(r.start(md, {T0: [2, 1, 3]}).metadata)
    assert (p.replicas, p.leader, p.preferred_leader) == ((2, 1, 3), 1, 2)


def test_same_target_is_a_no_op() -> None:
    md = with_topic(cluster(), [[1, 2]])
    out = r.start(md, {T0: [1, 2]})
    assert out.metadata is md and not out.errors


def test_cancel_restores_the_original_replicas() -> None:
    md = with_topic(cluster(), [[1, 2]])
    md = join_isr(r.start(md, {T0: [3, 4]}).metadata, 3)
    out = r.cancel(md, [T0])
    p = part(out.metadata)
    assert set(p.replicas) == {1, 2} and not p.reassigning
    assert 3 not in p.isr and p.leader == 1


def test_cancel_without_reassignment_is_refused() -> None:
    md = with_topic(cluster(), [[1, 2]])
    out = r.cancel(md, [T0])
    assert isinstance(out.errors[T0], NoReassignmentInProgressError)
    assert r.cancel(md).metadata is md  # "cancel all" with none running changes nothing


def test_new_target_replaces_a_running_reassignment() -> None:
    md = with_topic(cluster(), [[1, 2]])
    md = r.start(md, {T0: [2, 3]}).metadata
    p = part(r.start(md, {T0: [2, 4]}).metadata)
    assert p.replicas == (2, 4, 1)
    assert (p.adding_replicas, p.removing_replicas) == ((4,), (1,))
    assert 3 not in p.replicas


def test_bad_targets_are_refused_per_partition() -> None:
    md = with_topic(cluster(), [[1, 2]])
    md = e.fence_broker(md, 4).metadata
    out = r.start(
        md,
        {
            T0: [1, 1],
            TopicPartition("t", 7): [1],
            TopicPartition("nope", 0): [1],
        },
    )
    assert out.metadata is md
    assert isinstance(out.errors[T0], InvalidReplicaAssignmentError)
    assert isinstance(out.errors[TopicPartition("t", 7)], UnknownTopicOrPartitionError)
    for target in ([], [9], [1, 4]):  # empty, unregistered, fenced broker added
        assert isinstance(r.start(md, {T0: target}).errors[T0], InvalidReplicaAssignmentError)


def test_reassignment_survives_the_metadata_round_trip() -> None:
    md = r.start(with_topic(cluster(), [[1, 2]]), {T0: [2, 3]}).metadata
    back = m.decode_json(m.encode_json(md))
    assert part(back) == part(md)
    assert part(r.complete_ready(join_isr(back, 3)).metadata).replicas == (2, 3)


def test_progress_reports_adding_log_ends_against_the_leader() -> None:
    md = r.start(with_topic(cluster(), [[1, 2]]), {T0: [2, 3]}).metadata
    [prog] = r.progress(md, {T0: {1: 100, 2: 100, 3: 40}})
    assert (prog.adding, prog.removing, prog.target) == ((3,), (1,), (2, 3))
    assert prog.leader_log_end_offset == 100
    assert prog.adding_log_end_offsets == {3: 40}
    assert r.progress(md, {})[0].adding_log_end_offsets == {3: -1}


def test_rebalance_targets_move_replicas_onto_an_added_broker_keeping_racks() -> None:
    md = cluster(3, racks="abc")
    md = with_topic(md, [[1, 2], [2, 3], [3, 1], [1, 2], [2, 3], [3, 1]])
    md = m.register_broker(md, 4, "inc4", "a", "127.0.0.1", 9096)
    targets, balanced = r.rebalance_targets(md)
    assert balanced
    moved_to_4 = sum(4 in t for t in targets.values())
    assert moved_to_4 == 3 and len(targets) == 3, "fewest moves: 12 replicas / 4 brokers"
    rack = {1: "a", 2: "b", 3: "c", 4: "a"}
    for tp, target in targets.items():
        assert len({rack[b] for b in target}) == len(part(md, tp).replicas)
    out = r.start(md, targets)
    assert not out.errors
    assert all(part(out.metadata, tp).reassigning for tp in targets)
    with pytest.raises(ReassignmentInProgressError):
        r.rebalance_targets(out.metadata)


def test_decommission_moves_every_replica_off_the_broker_keeping_racks() -> None:
    md = cluster(4, racks="abca")
    md = with_topic(md, [[1, 2], [2, 3], [3, 1], [1, 4], [4, 2]])
    targets = r.decommission_targets(md, 1)
    assert set(targets) == {TopicPartition("t", i) for i in (0, 2, 3)}  # the ones holding 1
    rack = {1: "a", 2: "b", 3: "c", 4: "a"}
    for tp, target in targets.items():
        assert 1 not in target and len(target) == len(part(md, tp).replicas)
        assert len({rack[b] for b in target}) >= len({rack[b] for b in part(md, tp).replicas}) - 1
    assert r.decommission_targets(with_topic(cluster(3), [[2, 3]]), 1) == {}  # holds none
    out = r.start(md, targets)
    assert not out.errors
    with pytest.raises(ReassignmentInProgressError):
        r.decommission_targets(out.metadata, 2)


def test_decommission_is_refused_where_the_replication_factor_needs_the_broker() -> None:
    md = with_topic(with_topic(cluster(3), [[1, 2]], "small"), [[1, 2, 3]], "wide")
    with pytest.raises(InvalidReplicationFactorError, match=r"wide-0.*factor is 3: 2 brokers"):
        r.decommission_targets(md, 3)
    with pytest.raises(BrokerNotAvailableError):
        r.decommission_targets(md, 9)


def test_auto_rebalance_returns_leadership_to_preferred_replicas() -> None:
    # After a restart the last broker to stop leads everything (the others went offline first).
    md = with_topic(cluster(3), [[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    for b in (1, 2):
        md = e.controlled_shutdown(md, b).metadata
    assert {part(md, TopicPartition("t", i)).leader for i in range(3)} == {3}
    for b in (1, 2):
        md = e.unfence_broker(e.fence_broker(md, b).metadata, b).metadata
        for i in range(3):
            md = join_isr(md, b, TopicPartition("t", i))
    out = e.auto_leader_rebalance(md, 10)
    assert [part(out.metadata, TopicPartition("t", i)).leader for i in range(3)] == [1, 2, 3]
    assert e.auto_leader_rebalance(out.metadata, 10).metadata is out.metadata


# --- random histories -------------------------------------------------------------------------

_step = st.one_of(
    st.tuples(st.just("start"), st.permutations([1, 2, 3, 4, 5]), st.integers(1, 4)),
    st.tuples(st.just("join"), st.integers(1, 5)),
    st.tuples(st.just("complete")),
    st.tuples(st.just("cancel")),
    st.tuples(st.just("fence"), st.integers(1, 5)),
    st.tuples(st.just("unfence"), st.integers(1, 5)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_step, max_size=25))
def test_random_histories_keep_the_invariants(steps: list[tuple]) -> None:
    md = with_topic(cluster(5), [[1, 2, 3]])
    for step in steps:
        p = part(md)
        if step[0] == "start":
            md = r.start(md, {T0: list(step[1][: step[2]])}).metadata
        elif step[0] == "join":
            b = step[1]
            reg = md.brokers[b]
            if (
                p.leader != NO_LEADER
                and b in p.replicas
                and b not in p.isr
                and reg.state == "registered"
            ):
                md = join_isr(md, b)
        elif step[0] == "complete":
            md = r.complete_ready(md).metadata
        elif step[0] == "cancel":
            md = r.cancel(md).metadata
        elif step[0] == "fence":
            md = e.fence_broker(md, step[1]).metadata
        else:
            md = e.unfence_broker(md, step[1]).metadata
        m.check(md)
        q = part(md)
        assert q.leader_epoch >= p.leader_epoch and q.partition_epoch >= p.partition_epoch
        if q.replicas != p.replicas:
            assert q.leader_epoch > p.leader_epoch
        if q.reassigning:
            assert set(q.target_replicas) | set(q.original_replicas) == set(q.replicas)


def test_throttle_holds_sends_to_the_configured_rate() -> None:
    t = r.ByteRateThrottle(1000, now_ms=0)
    assert t.read_limit() == 1000
    assert t.delay_ms(600, now_ms=0) == 0  # within the one-second bucket
    assert t.delay_ms(600, now_ms=0) == 201  # 200 bytes overdrawn at 1000 B/s
    assert t.delay_ms(0, now_ms=201) == 0  # refilled to zero by then
    # Sustained: 10 sends of 500 bytes, each after its delay, take about 5 s in all.
    now, sent = 1_000_000, 0
    t = r.ByteRateThrottle(1000, now_ms=now)
    t.delay_ms(1000, now)  # empty the bucket
    for _ in range(10):
        now += t.delay_ms(500, now)
        sent += 500
    assert 4_500 <= now - 1_000_000 <= 5_100
    assert r.ByteRateThrottle(10, 0).delay_ms(10**9, 0) == r.ByteRateThrottle.MAX_DELAY_MS
