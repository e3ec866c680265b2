"""The controller's reconciler (``raylog.actors.control.reconciler``): which broker is pushed
which specs in which phase, which leader phase waits for which step-down, resyncs, what a
failed push or a broker's confirmed death changes, the reconciled metadata epoch, and which
partitions serve (a leader and ISR that applied their commands: what topic creation waits for).

Pure and fast: calls are answered by hand, in the order each test needs. The same class runs
in ``ControllerActor`` (its Ray tests cover the Ray calls) and in the seeded simulator, whose
checkers 11 (one leader at a time) and 12 (what the controller counts applied was applied)
check it under faults."""

from __future__ import annotations

from raylog.actors.control import election, reassignment
from raylog.actors.control import metadata as md_
from raylog.actors.control.metadata import ClusterMetadata, TopicPartition
from raylog.actors.control.reconciler import (
    FOLLOWERS,
    LEADERS,
    Outcome,
    Push,
    Reconciler,
)
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader

TP = TopicPartition("t", 0)
RESYNC_MS = 1_000


def cluster(replicas: tuple[int, ...] = (1, 2, 3)) -> ClusterMetadata:
    """Brokers 1-3 and topic ``t`` with one partition on ``replicas`` (the first leads)."""
    md = ClusterMetadata(cluster_id="c", controller_epoch=1)
    for b in (1, 2, 3):
        md = md_.register_broker(md, b, f"inc-{b}", None, "127.0.0.1", 9092 + b)
    return md_.create_topic(md, "t", "0" * 32, [list(replicas)])


def linked(md: ClusterMetadata) -> Reconciler:
    rec = Reconciler(controller_epoch=1, resync_interval_ms=RESYNC_MS)
    for b, reg in md.brokers.items():
        rec.attach(b, reg.incarnation_id)
    return rec


def move_leader(md: ClusterMetadata, to: int) -> ClusterMetadata:
    """A re-ordering reassignment then a preferred election: the old leader stays up."""
    p = md_.get_partition(md, "t", 0)
    md = reassignment.start(md, {TP: [to, *(b for b in p.replicas if b != to)]}).metadata
    return election.elect_leaders(md, "preferred", [TP]).metadata


def answer_all(rec: Reconciler, md: ClusterMetadata, calls: list[Push]) -> list[Push]:
    """Answer every call (and every call that releases) as applied; the calls made, in order."""
    made, todo = [], list(calls)
    while todo:  # bounded: each push has two phases
        call = todo.pop(0)
        made.append(call)
        todo += rec.answered(call, Outcome.APPLIED, md).pushes
    return made


def settled(md: ClusterMetadata) -> Reconciler:
    """A reconciler whose first round was applied in full by every broker."""
    rec = linked(md)
    answer_all(rec, md, rec.round(md, 0))
    assert rec.reconciled_epoch == md.metadata_epoch and rec.pushing() == ()
    return rec


def by_broker(calls: list[Push]) -> dict[int, Push]:
    return {c.broker_id: c for c in calls}


def test_every_broker_gets_its_replicas_and_role_commands_in_two_phases() -> None:
    md = cluster()
    rec = linked(md)
    first = rec.round(md, 0)
    assert sorted(c.broker_id for c in first) == [1, 2, 3]
    assert {c.phase for c in first} == {FOLLOWERS}
    assert rec.reconciled_epoch == -1 and rec.pushing() == (1, 2, 3)
    commands = {c.broker_id: c.specs[0].command for c in first}
    assert isinstance(commands[1], BecomeLeader) and commands[1].leader_epoch == 0
    assert isinstance(commands[2], BecomeFollower) and commands[2].leader_id == 1
    # A broker that leads nothing goes on to its leader phase at once; a controller cannot
    # know what its predecessor told anyone, so broker 1's waits for every other phase 1.
    calls = by_broker(first)
    assert rec.answered(calls[1], Outcome.APPLIED, md).pushes == []
    released = rec.answered(calls[2], Outcome.APPLIED, md).pushes
    assert [(c.broker_id, c.phase) for c in released] == [(2, LEADERS)]
    released += rec.answered(calls[3], Outcome.APPLIED, md).pushes
    assert sorted((c.broker_id, c.phase) for c in released) == [
        (1, LEADERS),
        (2, LEADERS),
        (3, LEADERS),
    ]
    ended = [e for call in released for e in rec.answered(call, Outcome.APPLIED, md).ended]
    assert sorted((e.broker_id, e.applied) for e in ended) == [(1, True), (2, True), (3, True)]
    assert rec.reconciled_epoch == md.metadata_epoch
    assert rec.round(md, 10) == []  # nothing changed, no resync due


def test_a_new_leader_is_told_to_lead_only_after_the_old_one_stepped_down() -> None:
    md = cluster()
    rec = settled(md)
    md = move_leader(md, to=2)
    calls = by_broker(rec.round(md, 10))
    assert set(calls) == {1, 2, 3}  # 1 steps down, 2 leads, 3 follows 2
    assert isinstance(calls[1].specs[0].command, BecomeFollower)
    # Broker 2's own phase 1 and a bystander's do not release its leader phase...
    assert rec.answered(calls[2], Outcome.APPLIED, md).pushes == []
    released = rec.answered(calls[3], Outcome.APPLIED, md).pushes
    assert [(c.broker_id, c.phase) for c in released] == [(3, LEADERS)]
    # ...the old leader's step-down does.
    released = rec.answered(calls[1], Outcome.APPLIED, md).pushes
    assert sorted((c.broker_id, c.phase) for c in released) == [(1, LEADERS), (2, LEADERS)]
    leader_phase = next(c for c in released if c.broker_id == 2)
    assert isinstance(leader_phase.specs[0].command, BecomeLeader)


def test_a_step_down_that_fails_releases_the_new_leader_and_is_pushed_again() -> None:
    md = cluster()
    rec = settled(md)
    md = move_leader(md, to=2)
    calls = by_broker(rec.round(md, 10))
    for b in (2, 3):
        rec.answered(calls[b], Outcome.APPLIED, md)
    # Unreachable: the new leader goes ahead (the old one's acks=1 writes may overlap).
    released = by_broker(rec.answered(calls[1], Outcome.FAILED, md).pushes)
    assert set(released) == {1, 2}
    progress = rec.answered(released[1], Outcome.APPLIED, md)
    assert [(e.broker_id, e.applied) for e in progress.ended] == [(1, False)]
    for b in (2, 3):  # the other pushes were applied in full
        answer_all(rec, md, [released[2]] if b == 2 else [])
    assert rec.reconciled_epoch < md.metadata_epoch  # broker 1 did not apply it
    again = rec.round(md, 20)  # the next round, long before the resync
    assert [(c.broker_id, c.phase) for c in again] == [(1, FOLLOWERS)]


def test_a_leader_phase_waits_for_a_later_round_while_the_old_leader_is_busy() -> None:
    md = cluster()
    rec = settled(md)
    md2 = md_.alter_configs(md, "t", {"retention.ms": "1000"})  # broker 1 still leads
    calls = by_broker(rec.round(md2, 10))
    busy = calls.pop(1)  # its push stays unanswered for now
    answer_all(rec, md2, list(calls.values()))
    md3 = move_leader(md2, to=2)
    calls = by_broker(rec.round(md3, 20))
    assert set(calls) == {2, 3}  # broker 1 is busy: not pushed again
    # Broker 2 steps into phase 1 only: its push ends there, not applied.
    progress = rec.answered(calls[2], Outcome.APPLIED, md3)
    assert progress.pushes == [] and [e.applied for e in progress.ended] == [False]
    answer_all(rec, md3, [busy])  # the busy push ends (both phases of the older version)
    calls = by_broker(rec.round(md3, 30))
    assert set(calls) == {1, 2}
    assert rec.answered(calls[2], Outcome.APPLIED, md3).pushes == []
    released = rec.answered(calls[1], Outcome.APPLIED, md3).pushes
    assert (2, LEADERS) in [(c.broker_id, c.phase) for c in released]


def test_a_broker_a_push_in_flight_names_leader_is_waited_for_by_a_newer_leader() -> None:
    """Found by the simulator: a push naming broker 2 leader has its phase 1 answer lost; a
    newer version elects broker 3. Broker 2's leader phase may still start (after its phase 1
    times out), so broker 3 must not be told to lead before broker 2 was pushed the newer
    version."""
    md = cluster()
    rec = settled(md)
    md2 = move_leader(md, to=2)
    slow = by_broker(rec.round(md2, 10))
    for b in (1, 3):
        answer_all(rec, md2, [slow[b]])
    md3 = move_leader(md2, to=3)
    newer = by_broker(rec.round(md3, 20))
    assert 2 not in newer  # busy
    # Broker 3's push has no leader phase this round: broker 2 may lead.
    for call in newer.values():
        assert all(c.phase != LEADERS or c.broker_id != 3 for c in answer_all(rec, md3, [call]))
    # Broker 2's old push now goes on to its leader phase (it was told to lead, in md2)...
    assert [c.phase for c in answer_all(rec, md3, [slow[2]])] == [FOLLOWERS, LEADERS]
    # ...and the next round steps it down before broker 3 leads.
    calls = by_broker(rec.round(md3, 30))
    assert isinstance(calls[2].specs[0].command, BecomeFollower)
    assert rec.answered(calls[3], Outcome.APPLIED, md3).pushes == []
    released = rec.answered(calls[2], Outcome.APPLIED, md3).pushes
    assert (3, LEADERS) in [(c.broker_id, c.phase) for c in released]


def test_brokers_are_resynced_every_resync_interval() -> None:
    md = cluster()
    rec = settled(md)
    assert rec.round(md, RESYNC_MS - 1) == []
    calls = rec.round(md, RESYNC_MS)
    assert sorted(c.broker_id for c in calls) == [1, 2, 3]
    answer_all(rec, md, calls)
    assert rec.round(md, 2 * RESYNC_MS - 1) == []  # counted from the resync's round


def test_a_confirmed_death_fails_the_push_and_is_waited_for_no_more() -> None:
    md = cluster()
    rec = settled(md)
    md = move_leader(md, to=2)
    calls = by_broker(rec.round(md, 10))
    rec.gone(1, "inc-1")
    answer_all(rec, md, [calls[3]])
    assert rec.answered(calls[2], Outcome.APPLIED, md).pushes == []
    progress = rec.answered(calls[1], Outcome.GONE, md)  # its call gave up at once
    assert [(c.broker_id, c.phase) for c in progress.pushes] == [(2, LEADERS)]
    assert [(e.broker_id, e.applied) for e in progress.ended] == [(1, False)]
    assert not rec.linked(1, "inc-1")
    answer_all(rec, md, progress.pushes)
    assert rec.round(md, 20) == []  # never pushed again


def test_a_new_incarnation_ends_the_old_ones_push_without_effect() -> None:
    md = cluster()
    rec = settled(md)
    md2 = md_.alter_configs(md, "t", {"retention.ms": "1000"})
    calls = by_broker(rec.round(md2, 10))
    rec.attach(3, "inc-3b")  # it restarted (its registration is on its way)
    leaders = rec.answered(calls[3], Outcome.APPLIED, md2).pushes
    assert [c.broker_id for c in leaders] == [3]
    ended = rec.answered(leaders[0], Outcome.APPLIED, md2).ended
    assert [(e.broker_id, e.applied) for e in ended] == [(3, False)]
    assert rec.answered(leaders[0], Outcome.APPLIED, md2).ended == []  # answered already
    assert rec.pushing() == (1, 2)


def test_the_reconciled_epoch_skips_fenced_brokers() -> None:
    md = cluster()
    rec = settled(md)
    md = election.fence_broker(md, 3, {}).metadata
    rec.forget_pushed(3, "inc-3")
    calls = rec.round(md, 10)
    assert 3 not in by_broker(calls)
    answer_all(rec, md, calls)
    assert rec.reconciled_epoch == md.metadata_epoch


def test_only_the_leader_of_a_reassignment_gets_the_throttle() -> None:
    md = cluster((1, 2))
    md = reassignment.throttled(md, 4000)
    rec = linked(md)
    assert [s.throttle_bytes_per_sec for s in rec.desired(md, 1)] == [0]  # none running
    md = reassignment.start(md, {TP: [1, 2, 3]}).metadata
    assert [s.throttle_bytes_per_sec for s in rec.desired(md, 1)] == [4000]
    assert [s.throttle_bytes_per_sec for s in rec.desired(md, 3)] == [0]


def test_a_partition_serves_once_its_leader_and_isr_applied_their_commands() -> None:
    # Two partitions: p0 on 1,2,3 (1 leads), p1 on 2,3,1 (2 leads).
    md = ClusterMetadata(cluster_id="c", controller_epoch=1)
    for b in (1, 2, 3):
        md = md_.register_broker(md, b, f"inc-{b}", None, "127.0.0.1", 9092 + b)
    md = md_.create_topic(md, "w", "1" * 32, [[1, 2, 3], [2, 3, 1]])
    rec = linked(md)
    assert rec.readiness(md, "w").serving == ()
    calls = by_broker(rec.round(md, 0))
    # Every broker's push must end applied; broker 3's phase 1 fails: it is pushed again later.
    leaders = [p for b in (1, 2) for p in rec.answered(calls[b], Outcome.APPLIED, md).pushes]
    leaders += rec.answered(calls[3], Outcome.FAILED, md).pushes
    for call in leaders:
        rec.answered(call, Outcome.APPLIED, md)
    readiness = rec.readiness(md, "w")
    assert readiness.serving == () and not readiness.done
    assert readiness.pending == ((0, (3,)), (1, (3,)))  # waiting for broker 3, an ISR member
    answer_all(rec, md, rec.round(md, 1))
    readiness = rec.readiness(md, "w")
    assert readiness.done and readiness.serving == (0, 1)
    assert (readiness.partitions, readiness.replicas, readiness.replicas_started) == (2, 6, -1)
    # A new leader epoch: the partition waits for its brokers to apply the new commands.
    w0 = TopicPartition("w", 0)
    moved = reassignment.start(md, {w0: [2, 1, 3]}).metadata
    moved = election.elect_leaders(moved, "preferred", [w0]).metadata
    readiness = rec.readiness(moved, "w")
    assert [p for p, _ in readiness.pending] == [0] and readiness.serving == (1,)
