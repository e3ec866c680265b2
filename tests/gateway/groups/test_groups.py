"""The pure group state machine (``gateway/groups/group.py``), driven with a fake clock.

Proves: a member without an id gets MEMBER_ID_REQUIRED and a generated id (v4+); two members
join one generation whose leader alone sees the members' metadata, the leader's SyncGroup hands
each member its own assignment; a member leaving starts a rebalance that the other completes
alone; a member whose session expires is removed and the group rebalances; a member that does
not rejoin within the rebalance timeout is dropped; stale generations and unknown members get
ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID; heartbeats during a rebalance get
REBALANCE_IN_PROGRESS; protocols are chosen in common or refused with
INCONSISTENT_GROUP_PROTOCOL; session timeouts outside Kafka's bounds are refused (client
defaults fit); offset commits are checked against generation and member, with simple commits
allowed for a group without members; unloading answers waiting requests NOT_COORDINATOR;
group.initial.rebalance.delay.ms holds an Empty group's first rebalance, extended while members
arrive and bounded by the rebalance timeout, and never delays a Stable group's rebalance.
"""

from __future__ import annotations

import pytest
from support.group_state import REBALANCE_MS, SESSION_MS, Clock, join, joined, replies, sync

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.group import (
    GROUP_MAX_SESSION_TIMEOUT_MS,
    GROUP_MIN_SESSION_TIMEOUT_MS,
    CommittedOffset,
    Group,
    GroupState,
    JoinResult,
    SyncResult,
)


def stable_pair() -> tuple[Group, Clock]:
    """Group "g" Stable at generation 2 with members a (leader) and b."""
    group, clock = Group("g"), Clock()
    joined(group, clock, "a")
    assert replies(group)[("a", "join")].generation_id == 1
    joined(group, clock, "b")  # a rebalance: a must rejoin
    assert group.state is GroupState.PREPARING_REBALANCE
    assert group.heartbeat(member_id="a", generation_id=1, now_ms=clock.now_ms) == (
        ErrorCode.REBALANCE_IN_PROGRESS
    )
    assert join(group, clock, "a") is None
    answers = replies(group)
    assert answers[("a", "join")].generation_id == answers[("b", "join")].generation_id == 2
    assert sync(group, clock, "b", 2) is None  # waits for the leader
    assert sync(group, clock, "a", 2, a=b"A", b=b"B") is None
    answers = replies(group)
    assert answers[("a", "sync")].assignment == b"A"
    assert answers[("b", "sync")].assignment == b"B"
    assert group.state is GroupState.STABLE
    return group, clock


def test_member_id_required_then_a_generation_with_the_leader_seeing_members() -> None:
    group, clock = Group("g"), Clock()
    first = join(group, clock, new_id="client-1")
    assert first == JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id="client-1")
    assert group.state is GroupState.EMPTY
    assert join(group, clock, "client-1") is None
    result = replies(group)[("client-1", "join")]
    assert result.error_code == ErrorCode.NONE
    assert (result.generation_id, result.leader, result.protocol_name) == (1, "client-1", "range")
    assert result.members == [("client-1", None, b"sub")]
    assert group.state is GroupState.COMPLETING_REBALANCE
    assert group.needs_persist is False


def test_two_members_get_their_own_assignments_and_only_the_leader_sees_members() -> None:
    group, clock = Group("g"), Clock()
    joined(group, clock, "a")
    replies(group)
    joined(group, clock, "b")
    assert join(group, clock, "a") is None
    answers = replies(group)
    assert answers[("a", "join")].leader == "a"
    assert sorted(m.member_id for m in answers[("a", "join")].members) == ["a", "b"]
    assert answers[("b", "join")].members == []
    sync(group, clock, "b", 2)
    sync(group, clock, "a", 2, a=b"A", b=b"B")
    assert group.needs_persist
    assert replies(group)[("b", "sync")] == SyncResult(ErrorCode.NONE, "consumer", "range", b"B")
    # A SyncGroup again in Stable answers at once with the same assignment.
    assert sync(group, clock, "b", 2) == SyncResult(ErrorCode.NONE, "consumer", "range", b"B")


def test_one_leaves_and_the_other_rebalances_alone() -> None:
    group, clock = stable_pair()
    assert group.leave("b", clock.now_ms) == ErrorCode.NONE
    assert group.state is GroupState.PREPARING_REBALANCE
    assert group.heartbeat(member_id="a", generation_id=2, now_ms=clock.now_ms) == (
        ErrorCode.REBALANCE_IN_PROGRESS
    )
    assert join(group, clock, "a") is None
    result = replies(group)[("a", "join")]
    assert (result.generation_id, result.members) == (3, [("a", None, b"sub")])
    assert group.leave("b", clock.now_ms) == ErrorCode.UNKNOWN_MEMBER_ID


def test_session_expiry_removes_the_silent_member_and_rebalances() -> None:
    group, clock = stable_pair()
    clock.advance(SESSION_MS - 1)
    assert group.heartbeat(member_id="a", generation_id=2, now_ms=clock.now_ms) == 0
    group.tick(clock.now_ms)
    assert set(group.members) == {"a", "b"}
    assert group.next_deadline_ms() == 1_000 + SESSION_MS  # b's session
    clock.advance(1)
    group.tick(clock.now_ms)
    assert set(group.members) == {"a"}
    assert group.state is GroupState.PREPARING_REBALANCE
    assert join(group, clock, "a") is None
    assert replies(group)[("a", "join")].generation_id == 3


def test_a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_timeout() -> None:
    group, clock = stable_pair()
    joined(group, clock, "c")  # starts a rebalance; a rejoins, b stays silent
    assert join(group, clock, "a") is None
    # b keeps heartbeating (REBALANCE_IN_PROGRESS) but never rejoins.
    for _ in range(REBALANCE_MS // 5_000 - 1):
        clock.advance(5_000)
        assert group.heartbeat(member_id="b", generation_id=2, now_ms=clock.now_ms) == 27
        group.tick(clock.now_ms)
        assert replies(group) == {}
    clock.advance(5_000)
    group.tick(clock.now_ms)
    answers = replies(group)
    assert set(group.members) == {"a", "c"}
    assert answers[("a", "join")].generation_id == 3
    assert sorted(m.member_id for m in answers[("a", "join")].members) == ["a", "c"]
    assert group.heartbeat(member_id="b", generation_id=2, now_ms=clock.now_ms) == (
        ErrorCode.UNKNOWN_MEMBER_ID
    )


def test_stale_generation_and_unknown_member() -> None:
    group, clock = stable_pair()
    assert group.heartbeat(member_id="a", generation_id=1, now_ms=clock.now_ms) == (
        ErrorCode.ILLEGAL_GENERATION
    )
    assert sync(group, clock, "a", 1) == SyncResult(ErrorCode.ILLEGAL_GENERATION)
    assert group.validate_commit("a", 1) == ErrorCode.ILLEGAL_GENERATION
    assert group.heartbeat(member_id="zz", generation_id=2, now_ms=clock.now_ms) == (
        ErrorCode.UNKNOWN_MEMBER_ID
    )
    assert join(group, clock, "zz") == JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id="zz")
    assert group.validate_commit("zz", 2) == ErrorCode.UNKNOWN_MEMBER_ID
    assert group.validate_commit("a", 2) == ErrorCode.NONE


def test_a_follower_waiting_for_sync_learns_of_a_new_rebalance() -> None:
    group, clock = Group("g"), Clock()
    joined(group, clock, "a")
    replies(group)
    joined(group, clock, "b")
    join(group, clock, "a")
    replies(group)
    assert sync(group, clock, "b", 2) is None
    assert group.validate_commit("b", 2) == ErrorCode.REBALANCE_IN_PROGRESS
    assert group.leave("a", clock.now_ms) == 0  # the leader leaves before syncing
    assert replies(group)[("b", "sync")] == SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
    assert group.state is GroupState.PREPARING_REBALANCE


def test_protocols_in_common_are_chosen_else_inconsistent() -> None:
    group, clock = Group("g"), Clock()
    joined(group, clock, "a", protocols=(("roundrobin", b"1"), ("range", b"2")))
    replies(group)
    refused = join(group, clock, new_id="x", protocols=(("sticky", b""),))
    assert refused is not None and refused.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    wrong_type = join(group, clock, new_id="y", protocol_type="connect")
    assert wrong_type is not None
    assert wrong_type.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    joined(group, clock, "b", protocols=(("range", b"3"), ("roundrobin", b"4")))
    join(group, clock, "a", protocols=(("roundrobin", b"1"), ("range", b"2")))
    result = replies(group)[("a", "join")]
    # One vote each: the tie goes to the leader's preference.
    assert result.protocol_name == "roundrobin"
    assert {m.member_id: m.metadata for m in result.members} == {"a": b"1", "b": b"4"}


@pytest.mark.parametrize(
    ("session_ms", "ok"),
    [
        (GROUP_MIN_SESSION_TIMEOUT_MS - 1, False),
        (GROUP_MIN_SESSION_TIMEOUT_MS, True),
        (10_000, True),  # kafka-python's and aiokafka's default
        (45_000, True),  # librdkafka's default
        (GROUP_MAX_SESSION_TIMEOUT_MS, True),
        (GROUP_MAX_SESSION_TIMEOUT_MS + 1, False),
    ],
)
def test_session_timeout_bounds(session_ms: int, ok: bool) -> None:
    result = join(Group("g"), Clock(), session_ms=session_ms)
    assert result is not None
    expected = ErrorCode.MEMBER_ID_REQUIRED if ok else ErrorCode.INVALID_SESSION_TIMEOUT
    assert result.error_code == expected


def test_empty_group_id_is_invalid() -> None:
    result = join(Group(""), Clock())
    assert result is not None and result.error_code == ErrorCode.INVALID_GROUP_ID


def test_simple_commits_only_without_members() -> None:
    group = Group("g")
    assert group.validate_commit("", -1) == ErrorCode.NONE
    offsets = {("t", 0): CommittedOffset(5, -1, "", 0)}
    group.commit("", offsets, 0)
    assert group.fetch_offsets(None) == offsets
    assert group.fetch_offsets([("t", 0), ("t", 1)]) == {
        ("t", 0): offsets[("t", 0)],
        ("t", 1): None,
    }
    member_group, _ = stable_pair()
    assert member_group.validate_commit("", -1) == ErrorCode.UNKNOWN_MEMBER_ID


def test_last_member_leaving_empties_the_group_at_a_new_generation() -> None:
    group, clock = stable_pair()
    group.leave("a", clock.now_ms)
    group.leave("b", clock.now_ms)
    assert group.state is GroupState.EMPTY
    assert group.generation_id == 3
    assert group.needs_persist
    assert group.validate_commit("", -1) == ErrorCode.NONE


def test_unload_answers_waiting_requests_not_coordinator() -> None:
    group, clock = Group("g"), Clock()
    joined(group, clock, "a")
    replies(group)
    joined(group, clock, "b")  # b waits for a to rejoin
    group.unload()
    assert replies(group)[("b", "join")].error_code == ErrorCode.NOT_COORDINATOR
    assert group.state is GroupState.DEAD
    assert group.heartbeat(member_id="a", generation_id=1, now_ms=clock.now_ms) == (
        ErrorCode.COORDINATOR_NOT_AVAILABLE
    )


def test_pending_member_id_expires_after_the_session_timeout() -> None:
    group, clock = Group("g"), Clock()
    join(group, clock, new_id="p")
    assert group.pending_members == {"p": clock.now_ms + SESSION_MS}
    clock.advance(SESSION_MS)
    group.tick(clock.now_ms)
    assert group.pending_members == {}
    assert join(group, clock, "p") == JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id="p")


def test_persist_failure_turns_sync_answers_into_errors_and_rebalances() -> None:
    group, clock = Group("g"), Clock()
    joined(group, clock, "a")
    replies(group)
    sync(group, clock, "a", 1, a=b"A")
    failed = group.persist_failed(ErrorCode.COORDINATOR_NOT_AVAILABLE, clock.now_ms)
    assert [(r.member_id, r.kind, r.result.error_code) for r in failed] == [
        ("a", "sync", ErrorCode.COORDINATOR_NOT_AVAILABLE)
    ]
    assert group.state is GroupState.PREPARING_REBALANCE


# --- group.initial.rebalance.delay.ms -----------------------------------------------------------

DELAY_MS = 3_000


def test_the_initial_delay_gathers_members_arriving_together_into_one_generation() -> None:
    group, clock = Group("g"), Clock()
    start = clock.now_ms
    joined(group, clock, "a", delay_ms=DELAY_MS)
    assert group.state is GroupState.PREPARING_REBALANCE
    assert group.next_deadline_ms() == start + DELAY_MS
    group.tick(clock.advance(DELAY_MS - 1))
    assert replies(group) == {}  # every member has joined, yet the delay holds the rebalance
    joined(group, clock, "b", delay_ms=DELAY_MS)  # a new member: the delay is extended once
    group.tick(clock.advance(1))
    assert replies(group) == {} and group.state is GroupState.PREPARING_REBALANCE
    assert group.next_deadline_ms() == clock.now_ms + DELAY_MS
    group.tick(clock.advance(DELAY_MS - 1))
    assert replies(group) == {}
    group.tick(clock.advance(1))
    answers = replies(group)
    assert answers[("a", "join")].generation_id == answers[("b", "join")].generation_id == 1
    assert sorted(m.member_id for m in answers[("a", "join")].members) == ["a", "b"]
    assert group.state is GroupState.COMPLETING_REBALANCE


def test_without_new_members_the_initial_delay_ends_once() -> None:
    group, clock = Group("g"), Clock()
    joined(group, clock, "a", delay_ms=DELAY_MS)
    group.tick(clock.advance(DELAY_MS))
    assert replies(group)[("a", "join")].generation_id == 1


def test_the_initial_delay_stops_growing_at_the_rebalance_timeout() -> None:
    group, clock = Group("g"), Clock()
    start = clock.now_ms
    joined(group, clock, "m0", delay_ms=DELAY_MS)
    arrivals = 0
    while not replies(group):
        assert clock.now_ms - start <= REBALANCE_MS, "the delay outgrew the rebalance timeout"
        arrivals += 1
        joined(group, clock, f"m{arrivals}", delay_ms=DELAY_MS)  # a member per delay, forever
        group.tick(clock.advance(DELAY_MS))
    assert clock.now_ms - start == REBALANCE_MS
    assert group.generation_id == 1 and len(group.members) == arrivals + 1


def test_a_pending_member_at_the_end_of_the_delay_is_waited_for() -> None:
    group, clock = Group("g"), Clock()
    joined(group, clock, "a", delay_ms=DELAY_MS)
    first = join(group, clock, new_id="b", delay_ms=DELAY_MS)
    assert first is not None and first.error_code == ErrorCode.MEMBER_ID_REQUIRED
    group.tick(clock.advance(DELAY_MS))
    assert replies(group) == {}  # b holds an id it has not joined with yet
    assert join(group, clock, "b", delay_ms=DELAY_MS) is None
    answers = replies(group)
    assert answers[("a", "join")].generation_id == answers[("b", "join")].generation_id == 1


def test_the_initial_delay_never_holds_a_stable_groups_rebalance() -> None:
    group, clock = stable_pair()
    assert join(group, clock, "a", delay_ms=DELAY_MS) is None  # the leader rejoins
    assert join(group, clock, "b", delay_ms=DELAY_MS) is None
    answers = replies(group)
    assert answers[("a", "join")].generation_id == answers[("b", "join")].generation_id == 3


def test_members_leaving_during_the_delay_leave_the_group_empty_at_its_end() -> None:
    group, clock = Group("g"), Clock()
    joined(group, clock, "a", delay_ms=DELAY_MS)
    assert group.leave("a", clock.now_ms) == ErrorCode.NONE
    assert replies(group)[("a", "join")].error_code == ErrorCode.UNKNOWN_MEMBER_ID
    group.tick(clock.advance(DELAY_MS))
    assert group.state is GroupState.EMPTY and not group.members
