"""Election and ISR decisions follow Kafka's rules, one test per rule, plus random histories.

Proves: clean election picks the first eligible ISR replica in assignment order and never an
observer; unclean election happens only when allowed, picks the longest live log and is counted;
otherwise the partition goes offline keeping its last ISR member, which is elected when it
returns; fencing, controlled shutdown and re-registration move leaders and shrink ISRs as KRaft
does; preferred and auto-rebalance elections go only to an eligible ISR member, and the partitions
still off their preferred replica are told apart by whether it can lead now, is catching up or
cannot come back; AlterPartition is
refused with the Kafka error each broken rule calls for; a replica whose log failed (offline) is
handled as its broker's fencing is, for its partition alone, and is eligible again once its
broker stops reporting it. Hypothesis drives random sequences of broker failures, returns,
shutdowns, failed and recovered logs, ISR proposals and elections and checks after every step
that no non-ISR replica is elected cleanly, no observer or offline replica ever leads, and epochs
never go down.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raylog.actors.control import election as e
from raylog.actors.control import metadata as m
from raylog.actors.control.metadata import (
    NO_LEADER,
    ClusterMetadata,
    PartitionState,
    TopicPartition,
)
from raylog.storage.errors import (
    DuplicateBrokerRegistrationError,
    ElectionNotNeededError,
    EligibleLeadersNotAvailableError,
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidRequestError,
    InvalidUpdateVersionError,
    NotControllerError,
    PreferredLeaderNotAvailableError,
    RaylogError,
    StaleBrokerEpochError,
    UnknownTopicOrPartitionError,
)

T0 = TopicPartition("t", 0)


def cluster(n: int = 4) -> ClusterMetadata:
    md = ClusterMetadata(cluster_id="c1")
    for b in range(1, n + 1):
        md = m.register_broker(md, b, f"inc{b}", None, "127.0.0.1", 9091 + b)
    return md


def topic(
    md: ClusterMetadata,
    assignment: list[list[int]],
    *,
    unclean: bool = False,
    observers: list[list[int]] | None = None,
    name: str = "t",
) -> ClusterMetadata:
    configs = {"unclean.leader.election.enable": "true"} if unclean else {}
    return m.create_topic(md, name, f"id-{name}", assignment, configs, observers)


def part(md: ClusterMetadata, tp: TopicPartition = T0) -> PartitionState:
    return m.get_partition(md, tp.topic, tp.partition)


def shrink(md: ClusterMetadata, isr: tuple[int, ...], tp: TopicPartition = T0) -> ClusterMetadata:
    return m.apply_alter_partition(md, tp.topic, tp.partition, isr)


# --- partition-level rules --------------------------------------------------------------------


def test_clean_leader_is_first_eligible_isr_member_in_assignment_order() -> None:
    p = PartitionState(partition=0, replicas=(3, 1, 2), isr=(1, 2), leader=1)
    assert e.clean_leader(p, {1, 2, 3}) == 1  # 3 is preferred but not in the ISR
    assert e.clean_leader(p, {2, 3}) == 2
    assert e.clean_leader(p, {3}) == NO_LEADER


def test_observer_is_never_elected() -> None:
    p = PartitionState(partition=0, replicas=(1, 2, 3), isr=(2,), observers=(1,), leader=2)
    assert e.clean_leader(p, {1, 3}) == NO_LEADER
    assert e.unclean_leader(p, {1, 3}, {1: 100, 3: 5}) == 3


def test_unclean_leader_is_the_longest_live_log_ties_by_assignment() -> None:
    p = PartitionState(partition=0, replicas=(1, 2, 3), isr=(1,), leader=1)
    assert e.unclean_leader(p, {2, 3}, {2: 10, 3: 20}) == 3
    assert e.unclean_leader(p, {2, 3}, {2: 20, 3: 20}) == 2
    assert e.unclean_leader(p, {2, 3}, {}) == 2
    assert e.unclean_leader(p, set(), {2: 1}) == NO_LEADER


# --- fencing ----------------------------------------------------------------------------------


def test_fencing_the_leader_elects_next_isr_member_and_shrinks_isr() -> None:
    md = topic(cluster(), [[1, 2, 3]])
    out = e.fence_broker(md, 1)
    p = part(out.metadata)
    assert (p.leader, p.isr) == (2, (2, 3))
    assert (p.leader_epoch, p.partition_epoch) == (1, 1)
    assert out.metadata.brokers[1].state == "fenced"
    assert out.unclean_elections == 0 and out.offline == []


def test_fencing_a_follower_removes_it_from_the_isr_only() -> None:
    md = topic(cluster(), [[1, 2, 3]])
    out = e.fence_broker(md, 3)
    p = part(out.metadata)
    assert (p.leader, p.isr, p.leader_epoch, p.partition_epoch) == (1, (1, 2), 0, 1)


def test_last_isr_member_fenced_goes_offline_and_returns_clean() -> None:
    md = shrink(topic(cluster(), [[1, 2, 3]]), (1,))
    out = e.fence_broker(md, 1)
    p = part(out.metadata)
    assert (p.leader, p.isr) == (NO_LEADER, (1,))  # the ISR keeps its last member
    assert out.offline == [T0]
    # Brokers 2 and 3 are alive but not in the ISR: without unclean election nothing happens.
    assert e.elect_offline(out.metadata).changes == []
    back = e.unfence_broker(out.metadata, 1)
    p = part(back.metadata)
    assert (p.leader, p.isr, p.leader_epoch) == (1, (1,), 2)
    assert back.unclean_elections == 0


def test_unclean_election_only_when_the_topic_allows_it() -> None:
    md = shrink(topic(cluster(), [[1, 2, 3]], unclean=True), (1,))
    leos = {T0: {2: 40, 3: 50}}
    out = e.fence_broker(md, 1, leos)
    p = part(out.metadata)
    assert (p.leader, p.isr) == (3, (3,))
    assert out.unclean_elections == 1
    assert out.changes[0].unclean


def test_enabling_unclean_later_elects_offline_partitions() -> None:
    md = shrink(topic(cluster(), [[1, 2, 3]]), (1,))
    md = e.fence_broker(md, 1).metadata
    md = m.alter_configs(md, "t", {"unclean.leader.election.enable": "true"})
    out = e.elect_offline(md, {T0: {2: 7, 3: 3}})
    assert part(out.metadata).leader == 2 and out.unclean_elections == 1


def test_fencing_is_idempotent() -> None:
    md = e.fence_broker(topic(cluster(), [[1, 2, 3]]), 1).metadata
    again = e.fence_broker(md, 1)
    assert again.metadata is md and again.changes == []


# --- controlled shutdown ----------------------------------------------------------------------


def test_controlled_shutdown_moves_leadership_and_leaves_isrs() -> None:
    md = topic(cluster(), [[1, 2, 3], [2, 1, 3], [2, 3, 4]])
    out = e.controlled_shutdown(md, 1)
    t = out.metadata.topics["t"].partitions
    assert (t[0].leader, t[0].isr) == (2, (2, 3))  # led by 1: moved to 2
    assert (t[1].leader, t[1].isr) == (2, (2, 3))  # followed by 1: left the ISR
    assert t[2] == md.topics["t"].partitions[2]  # not on broker 1: untouched
    assert out.metadata.brokers[1].state == "controlled_shutdown"
    assert not m.is_active(out.metadata, 1)


def test_controlled_shutdown_of_the_sole_isr_member_goes_offline_never_unclean() -> None:
    md = shrink(topic(cluster(), [[1, 2, 3]], unclean=True), (1,))
    out = e.controlled_shutdown(md, 1)
    p = part(out.metadata)
    assert (p.leader, p.isr) == (NO_LEADER, (1,))
    assert out.offline == [T0] and out.unclean_elections == 0


# --- registration -----------------------------------------------------------------------------


def test_new_incarnation_while_old_session_live_is_refused() -> None:
    md = topic(cluster(), [[1, 2, 3]])
    with pytest.raises(DuplicateBrokerRegistrationError) as err:
        e.register_broker(md, 1, "new", None, "h", 1, old_session_live=True)
    assert err.value.error_code == 101
    assert e.register_broker(md, 1, "inc1", None, "h", 1, old_session_live=True).metadata is md


def test_new_incarnation_fences_the_old_then_registers() -> None:
    md = topic(cluster(), [[1, 2, 3]])
    out = e.register_broker(md, 1, "new", None, "h", 1, old_session_live=False)
    reg = out.metadata.brokers[1]
    assert reg.incarnation_id == "new" and reg.state == "registered"
    assert reg.broker_epoch > md.brokers[1].broker_epoch
    p = part(out.metadata)
    assert (p.leader, p.isr) == (2, (2, 3))  # it must catch up and be added back by its leader


def test_broker_back_from_controlled_shutdown_may_register_a_new_incarnation() -> None:
    md = e.controlled_shutdown(topic(cluster(), [[1, 2, 3]]), 1).metadata
    out = e.register_broker(md, 1, "new", None, "h", 1, old_session_live=True)
    assert out.metadata.brokers[1].state == "registered"
    assert out.metadata.brokers[1].incarnation_id == "new"


def test_restarted_last_isr_member_is_elected_on_registration() -> None:
    md = shrink(topic(cluster(), [[1, 2, 3]]), (1,))
    md = e.fence_broker(md, 1).metadata
    out = e.register_broker(md, 1, "new", None, "h", 1, old_session_live=False)
    assert part(out.metadata).leader == 1


# --- ElectLeaders and auto rebalance ----------------------------------------------------------


def test_preferred_election_only_to_an_eligible_isr_preferred_replica() -> None:
    md = topic(cluster(), [[1, 2, 3]])
    md = e.fence_broker(md, 1).metadata
    out = e.elect_leaders(md, "preferred", [T0])
    assert isinstance(out.errors[T0], PreferredLeaderNotAvailableError)
    md = e.unfence_broker(md, 1).metadata
    out = e.elect_leaders(md, "preferred", [T0])  # 1 is alive but not back in the ISR
    assert isinstance(out.errors[T0], PreferredLeaderNotAvailableError)
    md = e.alter_partition(md, 2, md.brokers[2].broker_epoch, T0, 1, 1, (1, 2, 3)).metadata
    out = e.elect_leaders(md, "preferred", [T0])
    p = part(out.metadata)
    assert (p.leader, p.isr, p.leader_epoch) == (1, (1, 2, 3), 2)
    again = e.elect_leaders(out.metadata, "preferred", [T0, TopicPartition("nope", 0)])
    assert isinstance(again.errors[T0], ElectionNotNeededError)
    assert isinstance(again.errors[TopicPartition("nope", 0)], UnknownTopicOrPartitionError)
    assert again.metadata is out.metadata


def test_preferred_leaders_sorts_partitions_off_their_preferred_replica() -> None:
    """What `raylog up` waits for after a restart: from one metadata version, the partitions
    whose preferred replica can lead now, those whose preferred replica is still catching up,
    and none whose preferred replica cannot come back (broker fenced, log offline, observer)."""
    t = [TopicPartition("t", p) for p in range(4)]
    md = topic(cluster(), [[1, 2, 3], [2, 1, 3], [4, 1, 2], [1, 2, 4]])
    md = topic(md, [[1, 2]], observers=[[1]], name="o")  # 1 observes: 2 leads, never 1
    md = e.fence_broker(md, 1).metadata  # 1's leaderships move, 1 leaves every ISR
    md = e.fence_broker(md, 4).metadata  # and 4's; 4 stays fenced
    md = e.unfence_broker(md, 1).metadata  # 1 is back, out of the ISRs until it catches up
    assert e.preferred_leaders(md) == e.PreferredLeaders(electable=[], catching_up=[t[0], t[3]])
    p0 = part(md, t[0])
    md = e.alter_partition(
        md, p0.leader, md.brokers[p0.leader].broker_epoch, t[0], p0.leader_epoch,
        p0.partition_epoch, (*p0.isr, 1),
    ).metadata  # fmt: skip
    md = e.set_offline_replicas(md, 1, {t[3]}).metadata  # 1's log of t-3 failed
    assert e.preferred_leaders(md) == e.PreferredLeaders(electable=[t[0]], catching_up=[])
    md = e.elect_leaders(md, "preferred", [t[0]]).metadata
    assert part(md, t[0]).leader == 1
    assert e.preferred_leaders(md) == e.PreferredLeaders(electable=[], catching_up=[])


def test_unclean_elect_leaders_ignores_the_topic_setting() -> None:
    md = shrink(topic(cluster(), [[1, 2, 3]]), (1,))
    md = e.fence_broker(md, 1).metadata
    out = e.elect_leaders(md, "unclean", [T0], {T0: {2: 1, 3: 9}})
    assert part(out.metadata).leader == 3 and out.unclean_elections == 1
    assert isinstance(
        e.elect_leaders(out.metadata, "unclean", [T0]).errors[T0], ElectionNotNeededError
    )
    dead = e.fence_broker(e.fence_broker(md, 2).metadata, 3).metadata
    err = e.elect_leaders(dead, "unclean", [T0]).errors[T0]
    assert isinstance(err, EligibleLeadersNotAvailableError) and err.error_code == 83


def test_auto_rebalance_moves_leaders_back_above_the_threshold() -> None:
    md = topic(cluster(), [[1, 2, 3], [1, 3, 2], [2, 3, 1], [3, 1, 2]])
    md = e.fence_broker(md, 1).metadata
    md = e.unfence_broker(md, 1).metadata
    for i in (0, 1):  # the leaders add broker 1 back to the ISR once it has caught up
        tp = TopicPartition("t", i)
        p = part(md, tp)
        reg = md.brokers[p.leader]
        md = e.alter_partition(
            md,
            p.leader,
            reg.broker_epoch,
            tp,
            p.leader_epoch,
            p.partition_epoch,
            (1, *p.isr),
        ).metadata
    assert e.leader_imbalance(md)[1] == 1.0
    out = e.auto_leader_rebalance(md, 10)
    assert {c.partition for c in out.changes} == {0, 1}
    assert all(part(out.metadata, TopicPartition("t", i)).leader == 1 for i in (0, 1))
    assert e.leader_imbalance(out.metadata) == {1: 0.0, 2: 0.0, 3: 0.0}
    assert e.auto_leader_rebalance(out.metadata, 10).changes == []


def test_auto_rebalance_respects_the_percentage() -> None:
    assign = [[1, 2]] * 10 + [[2, 1]]
    md = topic(cluster(2), assign)
    tp = TopicPartition("t", 0)
    md = m.apply_election(md, [m.PartitionChange(topic="t", partition=0, leader=2)])
    assert e.leader_imbalance(md)[1] == pytest.approx(0.1)
    assert e.auto_leader_rebalance(md, 10).changes == []  # 10% is not above 10%
    assert [c.partition for c in e.auto_leader_rebalance(md, 9).changes] == [tp.partition]


# --- offline replicas (a failed log) --------------------------------------------------------

T1 = TopicPartition("t", 1)


def offline_replicas_of(md: ClusterMetadata, broker_id: int) -> set[TopicPartition]:
    return {tp for tp, p in m.partitions(md) if broker_id in p.offline_replicas}


def test_an_offline_leader_replica_is_replaced_for_its_partition_only() -> None:
    md = topic(cluster(), [[1, 2, 3], [1, 2, 3]])
    out = e.set_offline_replicas(md, 1, {T0})
    p, other = part(out.metadata), part(out.metadata, T1)
    assert (p.leader, p.isr, p.offline_replicas) == (2, (2, 3), (1,))
    assert (p.leader_epoch, p.partition_epoch) == (1, 1)
    assert (other.leader, other.isr, other.offline_replicas) == (1, (1, 2, 3), ())
    assert out.metadata.brokers[1].state == "registered"  # the broker itself stays up
    assert [c.topic_partition for c in out.changes] == [T0]
    assert offline_replicas_of(out.metadata, 1) == {T0}
    # The same report again changes nothing (every heartbeat carries the whole set).
    assert e.set_offline_replicas(out.metadata, 1, {T0}).metadata is out.metadata


def test_an_offline_follower_leaves_the_isr_and_may_not_rejoin_until_online() -> None:
    md = topic(cluster(), [[1, 2, 3]])
    md = e.set_offline_replicas(md, 3, {T0}).metadata
    p = part(md)
    assert (p.leader, p.isr, p.offline_replicas, p.leader_epoch) == (1, (1, 2), (3,), 0)
    with pytest.raises(IneligibleReplicaError, match="offline"):
        alter(md, (1, 2, 3))
    md = e.set_offline_replicas(md, 3, set()).metadata
    p = part(md)
    assert (p.isr, p.offline_replicas) == ((1, 2), ())  # back by the leader's AlterPartition
    assert part(alter(md, (1, 2, 3)).metadata).isr == (1, 2, 3)


def test_the_last_isr_member_offline_goes_leaderless_then_returns_when_online() -> None:
    md = shrink(topic(cluster(), [[1, 2, 3]]), (1,))
    out = e.set_offline_replicas(md, 1, {T0})
    p = part(out.metadata)
    assert (p.leader, p.isr, p.offline_replicas) == (NO_LEADER, (1,), (1,))
    assert out.offline == [T0]
    # Its broker is registered and eligible, yet an offline replica is never elected.
    assert e.elect_offline(out.metadata).changes == []
    # An operator's unclean election passes over it too, longest log or not.
    leos = {T0: {1: 50, 2: 10, 3: 20}}
    unclean = e.elect_leaders(out.metadata, "unclean", [T0], leos)
    assert (part(unclean.metadata).leader, unclean.unclean_elections) == (3, 1)
    back = e.set_offline_replicas(out.metadata, 1, set())
    p = part(back.metadata)
    assert (p.leader, p.isr, p.offline_replicas, p.leader_epoch) == (1, (1,), (), 2)
    assert back.unclean_elections == 0


def test_unclean_topic_elects_the_longest_log_that_is_not_offline() -> None:
    md = shrink(topic(cluster(), [[1, 2, 3]], unclean=True), (1,))
    md = e.set_offline_replicas(md, 2, {T0}).metadata
    out = e.set_offline_replicas(md, 1, {T0}, {T0: {1: 50, 2: 40, 3: 10}})
    p = part(out.metadata)
    assert (p.leader, p.isr, p.offline_replicas) == (3, (3,), (1, 2))
    assert out.unclean_elections == 1


def test_offline_preferred_replica_is_not_elected_preferred_or_by_rebalance() -> None:
    md = topic(cluster(), [[1, 2, 3]])
    md = e.set_offline_replicas(md, 1, {T0}).metadata
    out = e.elect_leaders(md, "preferred", [T0])
    assert isinstance(out.errors[T0], PreferredLeaderNotAvailableError)
    assert e.auto_leader_rebalance(md, 0).changes == []


def test_a_new_incarnation_of_the_broker_brings_its_replicas_back_online() -> None:
    md = shrink(topic(cluster(), [[1, 2, 3]]), (1,))
    md = e.set_offline_replicas(md, 1, {T0}).metadata
    md = e.fence_broker(md, 1).metadata
    out = e.register_broker(md, 1, "inc1-b", None, "127.0.0.1", 9092, old_session_live=False)
    p = part(out.metadata)
    assert (p.leader, p.offline_replicas) == (1, ())


def test_reports_for_partitions_the_broker_does_not_host_are_ignored() -> None:
    md = topic(cluster(), [[1, 2, 3]])
    assert e.set_offline_replicas(md, 4, {T0}).metadata is md
    assert not e.offline_report_differs(md, 4, {T0})
    assert e.offline_report_differs(md, 3, {T0})
    md = e.set_offline_replicas(md, 3, {T0}).metadata
    assert not e.offline_report_differs(md, 3, {T0})
    assert e.offline_report_differs(md, 3, set())


def test_the_heartbeat_check_answers_as_the_scan_and_skips_it_for_a_known_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    md = topic(cluster(), [[1, 2, 3]])
    check = e.OfflineReportCheck()
    scans: list[int] = []
    scan = e.offline_report_differs

    def counted(*args: object) -> bool:
        scans.append(1)
        return scan(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(e, "offline_report_differs", counted)
    assert not check.differs(md, 3, set())
    assert not check.differs(md, 3, set())  # the same report, the same version: no pass
    assert len(scans) == 1
    assert check.differs(md, 3, {T0})  # a new report is scanned, and differs every time
    assert check.differs(md, 3, {T0})
    assert len(scans) == 3
    md = e.set_offline_replicas(md, 3, {T0}).metadata  # a new version: scanned once more
    assert not check.differs(md, 3, {T0})
    assert not check.differs(md, 3, {T0})
    assert len(scans) == 4
    assert check.differs(md, 3, set())  # back online: differs from this version
    assert not check.differs(md, 2, set())  # per broker
    assert len(scans) == 6


def test_metadata_refuses_an_offline_leader() -> None:
    with pytest.raises(AssertionError, match="the leader is offline"):
        m.check_partition(
            PartitionState(
                partition=0, replicas=(1, 2), isr=(1, 2), leader=1, offline_replicas=(1,)
            )
        )
    with pytest.raises(AssertionError, match="offline replicas"):
        m.check_partition(
            PartitionState(
                partition=0, replicas=(1, 2), isr=(1, 2), leader=1, offline_replicas=(3,)
            )
        )


# --- AlterPartition ---------------------------------------------------------------------------


def alter(md: ClusterMetadata, isr: tuple[int, ...], **kw: int) -> e.Outcome:
    p = part(md)
    args = {
        "broker_id": p.leader,
        "broker_epoch": md.brokers[p.leader].broker_epoch,
        "leader_epoch": p.leader_epoch,
        "partition_epoch": p.partition_epoch,
    } | kw
    return e.alter_partition(
        md,
        args["broker_id"],
        args["broker_epoch"],
        T0,
        args["leader_epoch"],
        args["partition_epoch"],
        isr,
    )


def test_alter_partition_accepted_bumps_partition_epoch_only() -> None:
    md = topic(cluster(), [[1, 2, 3]])
    out = alter(md, (1, 3))
    p = part(out.metadata)
    assert (p.isr, p.leader, p.leader_epoch, p.partition_epoch) == ((1, 3), 1, 0, 1)
    out2 = alter(out.metadata, (3, 2, 1))  # any order; stored in assignment order
    assert part(out2.metadata).isr == (1, 2, 3)
    assert alter(out2.metadata, (1, 2, 3)).metadata is out2.metadata  # a retry: no change


def test_a_fencing_alter_partition_bumps_the_partition_epoch_of_an_unchanged_isr() -> None:
    md = topic(cluster(), [[1, 2, 3]])
    p = part(md)
    args = (md.brokers[1].broker_epoch, T0, p.leader_epoch, p.partition_epoch, (1, 2, 3))
    fenced = e.alter_partition(md, 1, *args, fence=True).metadata
    assert (part(fenced).isr, part(fenced).partition_epoch) == ((1, 2, 3), p.partition_epoch + 1)
    assert part(fenced).leader_epoch == p.leader_epoch
    # A proposal made at the old partition epoch (the predecessor's) is refused now.
    with pytest.raises(InvalidUpdateVersionError):
        e.alter_partition(fenced, 1, *args[:4], (1, 2))


@pytest.mark.parametrize(
    ("kw", "isr", "error", "code"),
    [
        ({"leader_epoch": -1}, (1, 2), FencedLeaderEpochError, 74),
        ({"leader_epoch": 5}, (1, 2), NotControllerError, 41),
        ({"partition_epoch": 5}, (1, 2), NotControllerError, 41),
        ({"partition_epoch": -1}, (1, 2), InvalidUpdateVersionError, 108),
        ({"broker_id": 2, "broker_epoch": 2}, (1, 2), InvalidRequestError, 42),
        ({"broker_epoch": 99}, (1, 2), StaleBrokerEpochError, 77),
        ({}, (2, 3), InvalidRequestError, 42),  # leader missing
        ({}, (1, 4), InvalidRequestError, 42),  # 4 is not a replica
        ({}, (1, 1), InvalidRequestError, 42),
        ({}, (1, 3), IneligibleReplicaError, 107),  # 3 is an observer
        ({}, (1, 2), IneligibleReplicaError, 107),  # 2 is fenced (set up below)
    ],
)
def test_alter_partition_refusals(
    kw: dict[str, int], isr: tuple[int, ...], error: type[RaylogError], code: int
) -> None:
    md = topic(cluster(), [[1, 2, 3]], observers=[[3]])
    # Partition epoch 1 (so -1 is stale and 5 is ahead), ISR (1,), broker 2 fenced unless the
    # case needs it as a sender.
    md = shrink(md, (1,))
    if kw.get("broker_id") != 2:
        md = e.fence_broker(md, 2).metadata
    with pytest.raises(error) as err:
        alter(md, isr, **kw)
    assert err.value.error_code == code


def test_deposed_leader_is_fenced_by_its_epoch() -> None:
    md = topic(cluster(), [[1, 2, 3]])
    old = part(md)
    md = e.fence_broker(md, 1).metadata
    md = e.unfence_broker(md, 1).metadata
    with pytest.raises(FencedLeaderEpochError):
        e.alter_partition(
            md, 1, md.brokers[1].broker_epoch, T0, old.leader_epoch, old.partition_epoch, (1, 2)
        )


# --- properties over random histories ---------------------------------------------------------

N_BROKERS = 5
ASSIGNMENT = [[1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 1], [5, 1, 2], [1, 3, 5]]
OBSERVERS = [[3], [], [], [1], [], [5]]

step = st.one_of(
    st.tuples(st.just("fence"), st.integers(1, N_BROKERS)),
    st.tuples(st.just("unfence"), st.integers(1, N_BROKERS)),
    st.tuples(st.just("shutdown"), st.integers(1, N_BROKERS)),
    st.tuples(st.just("restart"), st.integers(1, N_BROKERS)),
    st.tuples(st.just("grow_isr"), st.integers(0, len(ASSIGNMENT) - 1)),
    st.tuples(st.just("shrink_isr"), st.integers(0, len(ASSIGNMENT) - 1)),
    st.tuples(st.just("preferred"), st.integers(0, 0)),
    st.tuples(st.just("rebalance"), st.integers(0, 0)),
    st.tuples(st.just("unclean"), st.integers(0, 0)),
    st.tuples(st.just("log_failed"), st.integers(0, len(ASSIGNMENT) * N_BROKERS - 1)),
    st.tuples(st.just("logs_back"), st.integers(1, N_BROKERS)),
)


def _step(md: ClusterMetadata, action: str, arg: int, leos: dict) -> e.Outcome:
    if action == "fence":
        return e.fence_broker(md, arg, leos)
    if action == "unfence":
        return e.unfence_broker(md, arg, leos)
    if action == "shutdown":
        return e.controlled_shutdown(md, arg)
    if action == "restart":
        return e.register_broker(
            md,
            arg,
            f"r{md.metadata_epoch}",
            None,
            "h",
            1,
            old_session_live=False,
            log_end_offsets=leos,
        )
    if action == "preferred":
        return e.elect_leaders(md, "preferred")
    if action == "rebalance":
        return e.auto_leader_rebalance(md, 10)
    if action == "unclean":
        return e.elect_leaders(md, "unclean", log_end_offsets=leos)
    if action == "log_failed":  # one more replica of broker b reported offline
        tp, b = TopicPartition("t", arg // N_BROKERS), arg % N_BROKERS + 1
        return e.set_offline_replicas(md, b, offline_replicas_of(md, b) | {tp}, leos)
    if action == "logs_back":
        return e.set_offline_replicas(md, arg, set(), leos)
    tp = TopicPartition("t", arg)
    p = part(md, tp)
    if p.leader == NO_LEADER:
        return e.Outcome(md)
    live = {
        b
        for b in p.replicas
        if m.is_active(md, b) and b not in p.observers and b not in p.offline_replicas
    }
    isr = tuple(live) if action == "grow_isr" else (p.leader,)
    reg = md.brokers[p.leader]
    return e.alter_partition(
        md, p.leader, reg.broker_epoch, tp, p.leader_epoch, p.partition_epoch, isr
    )


@settings(max_examples=150, deadline=None)
@given(
    st.booleans(),
    st.lists(step, max_size=25),
    st.dictionaries(st.integers(1, N_BROKERS), st.integers(0, 100)),
)
def test_random_histories_keep_election_invariants(
    unclean: bool, steps: list[tuple[str, int]], leo_by_broker: dict[int, int]
) -> None:
    md = topic(cluster(N_BROKERS), ASSIGNMENT, unclean=unclean, observers=OBSERVERS)
    leos = {TopicPartition("t", i): leo_by_broker for i in range(len(ASSIGNMENT))}
    for action, arg in steps:
        before = md
        out = _step(md, action, arg, leos)
        md = out.metadata
        m.check(md)
        assert md.metadata_epoch >= before.metadata_epoch
        unclean_tps = {c.topic_partition for c in out.changes if c.unclean}
        for tp, p in m.partitions(md):
            old = part(before, tp)
            assert p.leader_epoch >= old.leader_epoch
            assert p.partition_epoch >= old.partition_epoch
            if p != old:
                assert p.partition_epoch > old.partition_epoch
            if p.leader != old.leader:
                assert p.leader_epoch > old.leader_epoch
            if p.leader == NO_LEADER:
                continue
            assert p.leader not in p.observers
            assert m.is_active(md, p.leader)
            if p.leader != old.leader:
                if tp in unclean_tps:
                    # Unclean: allowed only by the topic or an explicit unclean ElectLeaders,
                    # and only when no old ISR member could lead.
                    assert unclean or action == "unclean"
                    # (A restarted broker was fenced when the election ran.)
                    restarted = arg if action == "restart" else None
                    could_lead = [
                        b
                        for b in old.isr
                        if m.is_active(md, b) and b not in p.offline_replicas and b != restarted
                    ]
                    assert not could_lead
                else:
                    assert p.leader in old.isr  # clean: never a non-ISR replica
