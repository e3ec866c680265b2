"""Static group membership (KIP-345) in the pure group state machine (``groups/group.py`` rule 8).

Proves: a member with a ``group_instance_id`` joins without the MEMBER_ID_REQUIRED round trip and
the leader sees every member's instance id; a restarted instance (no member id) takes over its
member in a Stable group under a new id without a rebalance: it is answered with the current
generation and gets its assignment from SyncGroup, the other member is undisturbed, and the old
id is fenced (FENCED_INSTANCE_ID on Heartbeat, SyncGroup, OffsetCommit, LeaveGroup and
JoinGroup); a restarted leader is told the old leader id, so it does not assign; a takeover
rebalances when the member's subscribed topics or the group's protocol would change, but not for
the generation and owned partitions a restart always changes in a subscription; a takeover
during a rebalance fences the old id's waiting JoinGroup or SyncGroup; a failed write of the
takeover's record undoes it; a static member that stops without LeaveGroup stays until its
session timeout, then the group rebalances without it; a static member that does not rejoin a
rebalance is kept in the next generation and a leader that did not rejoin is replaced; a
rebalance no member rejoined waits; LeaveGroup by instance id, with per-member
UNKNOWN_MEMBER_ID and FENCED_INSTANCE_ID; unknown instances get UNKNOWN_MEMBER_ID; restoring a
group record rebuilds the instance ids; DescribeGroups reports them.
"""

from __future__ import annotations

from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription
from support.group_state import REBALANCE_MS, SESSION_MS, Clock, join, replies

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.group import (
    Group,
    GroupState,
    JoinMember,
    JoinResult,
    Member,
    SyncResult,
)
from raylog.gateway.groups.group_admin import describe

FENCED = ErrorCode.FENCED_INSTANCE_ID


def subscription(*topics: str, owned: tuple[int, ...] = (), generation: int = -1) -> bytes:
    """A consumer's ConsumerProtocolSubscription v2: topics, then what it owns and its
    generation (which change whenever a consumer restarts)."""
    message = ConsumerProtocolSubscription(
        topics=list(topics),
        user_data=None,
        owned_partitions=[ConsumerProtocolSubscription.TopicPartition(topics[0], list(owned))]
        if owned
        else [],
        generation_id=generation,
    )
    return bytes(message.encode(version=2))


SUB = subscription("t")


def static_join(
    group: Group,
    clock: Clock,
    instance: str,
    member_id: str = "",
    *,
    new_id: str,
    protocols: tuple[tuple[str, bytes], ...] = (("range", SUB),),
    session_ms: int = SESSION_MS,
) -> JoinResult | None:
    return join(
        group, clock, member_id, new_id=new_id, protocols=protocols, session_ms=session_ms,
        instance=instance,
    )  # fmt: skip


def sync(
    group: Group,
    clock: Clock,
    member: str,
    generation: int,
    instance: str | None = None,
    **assign: bytes,
) -> SyncResult | None:
    return group.sync(
        member_id=member, generation_id=generation, assignments=assign, now_ms=clock.now_ms,
        group_instance_id=instance,
    )  # fmt: skip


def heartbeat(group: Group, clock: Clock, member: str, instance: str | None = None) -> int:
    return group.heartbeat(
        member_id=member, generation_id=group.generation_id, now_ms=clock.now_ms,
        group_instance_id=instance,
    )  # fmt: skip


def static_pair(session_ms: int = SESSION_MS) -> tuple[Group, Clock]:
    """Group "g" Stable at generation 2: a (instance "ia", leader) assigned A, b ("ib") B."""
    group, clock = Group("g"), Clock()
    assert static_join(group, clock, "ia", new_id="a", session_ms=session_ms) is None
    assert replies(group)[("a", "join")].generation_id == 1
    assert static_join(group, clock, "ib", new_id="b", session_ms=session_ms) is None
    assert static_join(group, clock, "ia", "a", new_id="unused", session_ms=session_ms) is None
    answers = replies(group)
    assert answers[("a", "join")].generation_id == answers[("b", "join")].generation_id == 2
    assert sync(group, clock, "b", 2) is None
    assert sync(group, clock, "a", 2, a=b"A", b=b"B") is None
    replies(group)
    group.needs_persist = False  # the coordinator wrote the record
    assert group.state is GroupState.STABLE
    return group, clock


def test_a_static_member_gets_its_id_at_once_and_the_leader_sees_instance_ids() -> None:
    group, clock = Group("g"), Clock()
    assert static_join(group, clock, "ia", new_id="ia-1") is None  # no MEMBER_ID_REQUIRED
    assert group.pending_members == {}
    result = replies(group)[("ia-1", "join")]
    assert (result.error_code, result.member_id, result.leader) == (0, "ia-1", "ia-1")
    assert result.members == [JoinMember("ia-1", "ia", SUB)]
    assert group.static_members == {"ia": "ia-1"}


def test_a_restarted_follower_takes_over_without_a_rebalance_and_the_old_id_is_fenced() -> None:
    group, clock = static_pair()
    # b restarts: a new consumer process with the same instance id and no member id. What it
    # sends differs (it owns nothing yet, has no generation), its topics do not.
    restarted = (("range", subscription("t", generation=-1)),)
    group.members["b"].protocols = (("range", subscription("t", owned=(1,), generation=2)),)
    assert static_join(group, clock, "ib", new_id="b2", protocols=restarted) is None
    answer = replies(group)
    assert answer == {
        ("b2", "join"): JoinResult(0, 2, "consumer", "range", "a", "b2", ()),
    }
    assert group.needs_persist  # the record must name b2 before b2 is answered
    assert group.state is GroupState.STABLE and group.generation_id == 2
    assert group.static_members == {"ia": "a", "ib": "b2"}
    assert sync(group, clock, "b2", 2, "ib") == SyncResult(0, "consumer", "range", b"B")
    # a is not disturbed.
    assert heartbeat(group, clock, "a", "ia") == ErrorCode.NONE
    # The old id is fenced wherever it names its instance, unknown where it does not.
    assert heartbeat(group, clock, "b", "ib") == FENCED
    assert heartbeat(group, clock, "b") == ErrorCode.UNKNOWN_MEMBER_ID
    assert sync(group, clock, "b", 2, "ib") == SyncResult(FENCED)
    assert group.validate_commit("b", 2, "ib") == FENCED
    assert group.validate_commit("b2", 2, "ib") == ErrorCode.NONE
    assert static_join(group, clock, "ib", "b", new_id="x") == JoinResult(FENCED, member_id="b")
    assert group.leave("b", clock.now_ms, "ib") == FENCED
    assert group.state is GroupState.STABLE and set(group.members) == {"a", "b2"}


def test_a_restarted_leader_is_told_the_old_leader_id_so_that_it_does_not_assign() -> None:
    group, clock = static_pair()
    assert static_join(group, clock, "ia", new_id="a2") is None
    result = replies(group)[("a2", "join")]
    # KIP-345 before JoinGroup v9: the answer names the old leader, not a2, and no members.
    assert (result.error_code, result.leader, result.member_id, result.members) == (
        0,
        "a",
        "a2",
        (),
    )
    assert group.leader_id == "a2" and group.state is GroupState.STABLE
    # Its SyncGroup (as a follower, no assignments) gets its own assignment.
    assert sync(group, clock, "a2", 2) == SyncResult(0, "consumer", "range", b"A")
    assert heartbeat(group, clock, "b", "ib") == ErrorCode.NONE


def test_a_takeover_with_new_topics_rebalances() -> None:
    group, clock = static_pair()
    new_topics = (("range", subscription("u")),)
    assert static_join(group, clock, "ib", new_id="b2", protocols=new_topics) is None
    assert replies(group) == {}
    assert group.state is GroupState.PREPARING_REBALANCE
    assert heartbeat(group, clock, "a", "ia") == ErrorCode.REBALANCE_IN_PROGRESS
    assert static_join(group, clock, "ia", "a", new_id="unused") is None
    answers = replies(group)
    assert answers[("b2", "join")].generation_id == 3
    assert {m.member_id: m.metadata for m in answers[("a", "join")].members} == {
        "a": SUB,
        "b2": subscription("u"),
    }


def test_a_takeover_that_changes_the_groups_protocol_rebalances() -> None:
    group, clock = Group("g"), Clock()
    both = (("range", SUB), ("roundrobin", SUB))
    static_join(group, clock, "ia", new_id="a", protocols=both)
    sync(group, clock, "a", 1, a=b"A")
    replies(group)
    assert group.protocol_name == "range" and group.state is GroupState.STABLE
    assert static_join(group, clock, "ia", new_id="a2", protocols=both[::-1]) is None
    result = replies(group)[("a2", "join")]  # a rebalance, which a2 alone completes
    assert (result.generation_id, result.protocol_name, result.leader) == (2, "roundrobin", "a2")


def test_a_takeover_during_a_rebalance_fences_the_old_ids_waiting_requests() -> None:
    group, clock = static_pair()
    # PreparingRebalance: a joined and waits; its restarted process joins the same rebalance.
    new_topics = (("range", subscription("u")),)
    assert static_join(group, clock, "ia", "a", new_id="unused", protocols=new_topics) is None
    assert group.state is GroupState.PREPARING_REBALANCE
    assert static_join(group, clock, "ia", new_id="a2") is None
    assert replies(group) == {("a", "join"): JoinResult(FENCED, member_id="a")}
    assert static_join(group, clock, "ib", "b", new_id="unused") is None
    answers = replies(group)
    assert answers[("a2", "join")].generation_id == answers[("b", "join")].generation_id == 3
    assert answers[("a2", "join")].leader == "a2"
    # CompletingRebalance: b waits for the leader's assignment; b restarts.
    assert sync(group, clock, "b", 3) is None
    assert static_join(group, clock, "ib", new_id="b2") is None
    assert replies(group) == {("b", "sync"): SyncResult(FENCED)}
    assert group.state is GroupState.PREPARING_REBALANCE  # the leader may assign to b
    assert sync(group, clock, "a2", 3, "ia") == SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)


def test_a_failed_write_undoes_the_takeover() -> None:
    group, clock = static_pair()
    static_join(group, clock, "ib", new_id="b2", session_ms=SESSION_MS * 2)
    failed = group.persist_failed(ErrorCode.COORDINATOR_NOT_AVAILABLE, clock.now_ms)
    assert [(r.member_id, r.kind, r.result) for r in failed] == [
        (
            "b2",
            "join",
            JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, 2, "consumer", "range", "a", ""),
        )
    ]
    assert group.static_members == {"ia": "a", "ib": "b"}
    assert group.members["b"].session_timeout_ms == SESSION_MS
    assert group.state is GroupState.STABLE
    assert heartbeat(group, clock, "b", "ib") == ErrorCode.NONE
    assert heartbeat(group, clock, "b2", "ib") == FENCED
    assert heartbeat(group, clock, "b2") == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_static_member_that_stops_stays_until_its_session_expires() -> None:
    group, clock = static_pair()
    # b's process ends without LeaveGroup (static members do not send it); a keeps heartbeating.
    for _ in range(SESSION_MS // 1_000 - 1):
        clock.advance(1_000)
        assert heartbeat(group, clock, "a", "ia") == ErrorCode.NONE
        group.tick(clock.now_ms)
    assert group.state is GroupState.STABLE and "b" in group.members
    clock.advance(1_000)
    group.tick(clock.now_ms)
    assert set(group.members) == {"a"} and group.static_members == {"ia": "a"}
    assert group.state is GroupState.PREPARING_REBALANCE
    assert static_join(group, clock, "ia", "a", new_id="unused") is None
    result = replies(group)[("a", "join")]
    assert (result.generation_id, result.members) == (3, [JoinMember("a", "ia", SUB)])
    # ib comes back later: it is a new member again, and the group rebalances for it.
    sync(group, clock, "a", 3, a=b"AB")
    assert static_join(group, clock, "ib", new_id="b3") is None
    assert group.state is GroupState.PREPARING_REBALANCE
    assert group.static_members == {"ia": "a", "ib": "b3"}


def test_a_static_member_that_does_not_rejoin_stays_in_the_generation_but_not_the_lead() -> None:
    long_session_ms = REBALANCE_MS * 2  # static members are run with long sessions
    group, clock = static_pair(session_ms=long_session_ms)
    # A dynamic member d joins; b rejoins; a (the leader) sends nothing.
    first = group.join(
        member_id="", client_id="c", client_host="/h", session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=REBALANCE_MS, protocol_type="consumer", protocols=(("range", SUB),),
        require_known_member_id=False, new_member_id="d", now_ms=clock.now_ms,
    )  # fmt: skip
    assert first is None and group.state is GroupState.PREPARING_REBALANCE
    assert static_join(group, clock, "ib", "b", new_id="unused", session_ms=long_session_ms) is None
    clock.advance(REBALANCE_MS)
    group.tick(clock.now_ms)
    answers = replies(group)
    assert group.state is GroupState.COMPLETING_REBALANCE and group.generation_id == 3
    assert set(group.members) == {"a", "b", "d"}  # a kept, with its last metadata
    assert ("a", "join") not in answers  # nothing of a's waits
    assert group.leader_id == "b"  # the first member that rejoined
    leader_view = answers[("b", "join")].members
    assert {m.member_id: m.group_instance_id for m in leader_view} == {
        "a": "ia",
        "b": "ib",
        "d": None,
    }
    sync(group, clock, "b", 3, a=b"A", b=b"B", d=b"D")
    assert group.state is GroupState.STABLE
    # a's session runs out (it began again with the generation): the group rebalances.
    clock.advance(long_session_ms)
    assert heartbeat(group, clock, "b", "ib") == heartbeat(group, clock, "d") == ErrorCode.NONE
    group.tick(clock.now_ms)
    assert "a" not in group.members and group.static_members == {"ib": "b"}
    assert group.state is GroupState.PREPARING_REBALANCE


def test_a_rebalance_that_no_static_member_rejoined_waits_another_timeout() -> None:
    group, clock = static_pair(session_ms=REBALANCE_MS * 3)
    assert group.leave("", clock.now_ms, "ib") == ErrorCode.NONE  # an admin removes b
    assert group.state is GroupState.PREPARING_REBALANCE
    clock.advance(REBALANCE_MS)
    group.tick(clock.now_ms)
    assert group.state is GroupState.PREPARING_REBALANCE and group.generation_id == 2
    assert group.next_deadline_ms() == clock.now_ms + REBALANCE_MS
    assert static_join(group, clock, "ia", "a", new_id="unused") is None
    assert replies(group)[("a", "join")].generation_id == 3


def test_leave_group_by_instance_and_per_member_errors() -> None:
    group, clock = static_pair()
    assert group.leave("", clock.now_ms, "nobody") == ErrorCode.UNKNOWN_MEMBER_ID
    assert group.leave("", clock.now_ms) == ErrorCode.UNKNOWN_MEMBER_ID
    assert group.leave("zz", clock.now_ms, "ia") == FENCED
    assert group.leave("b", clock.now_ms, "ia") == FENCED
    assert group.state is GroupState.STABLE
    assert group.leave("", clock.now_ms, "ib") == ErrorCode.NONE
    assert group.leave("a", clock.now_ms, "ia") == ErrorCode.NONE
    assert group.members == {} and group.static_members == {}
    assert group.state is GroupState.EMPTY


def test_an_unknown_instance_is_an_unknown_member() -> None:
    group, clock = static_pair()
    assert heartbeat(group, clock, "a", "nobody") == ErrorCode.UNKNOWN_MEMBER_ID
    assert static_join(group, clock, "nobody", "a", new_id="x") == JoinResult(
        ErrorCode.UNKNOWN_MEMBER_ID, member_id="a"
    )
    assert group.validate_commit("a", 2, "nobody") == ErrorCode.UNKNOWN_MEMBER_ID


def test_restore_rebuilds_the_instance_ids_and_describe_reports_them() -> None:
    group, clock = Group("g"), Clock()
    group.restore(
        protocol_type="consumer",
        generation_id=4,
        protocol_name="range",
        leader_id="a",
        members=[
            Member(
                "a",
                "c",
                "/h",
                SESSION_MS,
                REBALANCE_MS,
                (("range", SUB),),
                b"A",
                group_instance_id="ia",
            ),
            Member("d", "c", "/h", SESSION_MS, REBALANCE_MS, (("range", SUB),), b"D"),
        ],
        now_ms=clock.now_ms,
    )
    assert group.static_members == {"ia": "a"}
    assert heartbeat(group, clock, "zz", "ia") == FENCED
    described = {m.member_id: m.group_instance_id for m in describe(group).members}
    assert described == {"a": "ia", "d": None}
    assert static_join(group, clock, "ia", new_id="a2") is None
    assert replies(group)[("a2", "join")].generation_id == 4
