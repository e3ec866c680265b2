"""Static group membership (KIP-345) through the coordinator and the handlers, over an
in-memory ``__consumer_offsets`` log.

Proves: a restarted instance's takeover of a Stable group is written to the log before it is
answered, so a second coordinator reading the same log (failover) knows the new member id,
fences the old one and lets the instance take over again without a rebalance; a failed write
of the takeover answers COORDINATOR_NOT_AVAILABLE and keeps the old member. Through the real
codec and ``Connection``: JoinGroup v5 with a ``group_instance_id`` (no MEMBER_ID_REQUIRED; the
leader's member list carries instance ids), SyncGroup v3, Heartbeat v3 and OffsetCommit v7
(which also stores the v6 leader epoch) fenced for the old id, LeaveGroup v3's per-member
errors, v0's single error, and DescribeGroups v4's instance ids.

The backend is ``test_groups_coordinator``'s stand-in for the replica actors' log.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from support.group_coordinator import (
    GROUP,
    PARTITION,
    TOPIC,
    LogBackend,
    TopicsLogBackend,
    consumer_join,
    failover,
    loaded,
    roundtrip,
    subscription,
)

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.coordinator import GroupCoordinator
from raylog.gateway.groups.group import GroupState, JoinResult

FENCED = ErrorCode.FENCED_INSTANCE_ID


async def static_join(coordinator: GroupCoordinator, instance: str) -> JoinResult:
    return await consumer_join(coordinator, group_instance_id=instance)


async def stable_static_member(coordinator: GroupCoordinator, instance: str) -> tuple[str, int]:
    joined = await static_join(coordinator, instance)
    assert joined.error_code == 0 and joined.member_id.startswith(f"{instance}-")
    synced = await coordinator.sync_group(
        group_id=GROUP,
        member_id=joined.member_id,
        generation_id=joined.generation_id,
        assignments={joined.member_id: b"all"},
        group_instance_id=instance,
    )
    assert synced.error_code == 0 and synced.assignment == b"all"
    return joined.member_id, joined.generation_id


def test_a_takeover_is_written_and_a_new_coordinator_fences_the_old_id() -> None:
    async def run() -> None:
        backend = TopicsLogBackend()
        first = await loaded(backend)
        old, generation = await stable_static_member(first, "ia")
        records_before = len(backend.logs[PARTITION])
        restarted = await static_join(first, "ia")
        assert (restarted.error_code, restarted.generation_id) == (0, generation)
        assert restarted.leader == old  # the old leader id: the restarted leader must not assign
        new = restarted.member_id
        assert new != old and len(backend.logs[PARTITION]) == records_before + 1
        assert await first.heartbeat(GROUP, old, generation, "ia") == FENCED

        second = await failover(backend, first)
        group = second._owned[PARTITION].groups[GROUP]
        assert group.state is GroupState.STABLE and group.static_members == {"ia": new}
        assert await second.heartbeat(GROUP, new, generation, "ia") == ErrorCode.NONE
        assert await second.heartbeat(GROUP, old, generation, "ia") == FENCED
        synced = await second.sync_group(
            group_id=GROUP,
            member_id=new,
            generation_id=generation,
            assignments={},
            group_instance_id="ia",
        )
        assert synced.assignment == b"all"
        _, described = second.describe_group(GROUP)
        assert [(m.member_id, m.group_instance_id) for m in described.members] == [(new, "ia")]
        again = await static_join(second, "ia")  # restarted once more, on the new coordinator
        assert (again.error_code, again.generation_id, again.leader) == (0, generation, new)
        assert group.state is GroupState.STABLE

    asyncio.run(run())


def test_a_failed_takeover_write_keeps_the_old_member() -> None:
    async def run() -> None:
        backend = LogBackend()
        coordinator = await loaded(backend)
        old, generation = await stable_static_member(coordinator, "ia")
        backend.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS
        failed = await static_join(coordinator, "ia")
        assert (failed.error_code, failed.member_id) == (ErrorCode.COORDINATOR_NOT_AVAILABLE, "")
        backend.produce_error = 0
        assert await coordinator.heartbeat(GROUP, old, generation, "ia") == ErrorCode.NONE
        group = coordinator._owned[PARTITION].groups[GROUP]
        assert group.state is GroupState.STABLE and set(group.members) == {old}

    asyncio.run(run())


# --- through the codec and the handlers ---------------------------------------------------------


async def wire_join(coordinator: GroupCoordinator, instance: str, member_id: str = "") -> Any:
    request = JoinGroupRequest(
        group_id=GROUP,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id=member_id,
        group_instance_id=instance,
        protocol_type="consumer",
        protocols=[
            JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=subscription(TOPIC))
        ],
    )
    return await roundtrip(coordinator, request, 5, JoinGroupResponse)


def test_static_membership_over_the_wire() -> None:
    async def run() -> None:
        coordinator = await loaded(TopicsLogBackend())
        joined = await wire_join(coordinator, "ia")  # v5: an id at once, no error 79
        assert joined.error_code == 0 and joined.member_id.startswith("ia-")
        assert [(m.member_id, m.group_instance_id) for m in joined.members] == [
            (joined.member_id, "ia")
        ]
        old, generation = joined.member_id, joined.generation_id
        assignment = SyncGroupRequest.SyncGroupRequestAssignment(member_id=old, assignment=b"a")
        synced = await roundtrip(
            coordinator,
            SyncGroupRequest(
                group_id=GROUP,
                generation_id=generation,
                member_id=old,
                group_instance_id="ia",
                assignments=[assignment],
            ),
            3,
            SyncGroupResponse,
        )
        assert (synced.error_code, synced.assignment) == (0, b"a")
        new = (await wire_join(coordinator, "ia")).member_id

        def heartbeat(member: str) -> HeartbeatRequest:
            return HeartbeatRequest(
                group_id=GROUP, generation_id=generation, member_id=member, group_instance_id="ia"
            )

        for member, error in ((old, FENCED), (new, 0)):
            beat = await roundtrip(coordinator, heartbeat(member), 3, HeartbeatResponse)
            assert beat.error_code == error
            topic = OffsetCommitRequest.OffsetCommitRequestTopic
            commit = OffsetCommitRequest(
                group_id=GROUP,
                generation_id_or_member_epoch=generation,
                member_id=member,
                group_instance_id="ia",
                topics=[
                    topic(
                        name=TOPIC,
                        partitions=[
                            topic.OffsetCommitRequestPartition(
                                partition_index=0, committed_offset=7, committed_leader_epoch=3
                            )
                        ],
                    )
                ],
            )
            committed = await roundtrip(coordinator, commit, 7, OffsetCommitResponse)
            assert committed.topics[0].partitions[0].error_code == error
        stored = (await coordinator.fetch_offsets(GROUP, [(TOPIC, 0)])).offsets[(TOPIC, 0)]
        assert stored is not None and (stored.offset, stored.leader_epoch) == (7, 3)

        described = await roundtrip(
            coordinator, DescribeGroupsRequest(groups=[GROUP]), 4, DescribeGroupsResponse
        )
        [member] = described.groups[0].members
        assert (member.member_id, member.group_instance_id) == (new, "ia")

        identity = LeaveGroupRequest.MemberIdentity
        left = await roundtrip(
            coordinator,
            LeaveGroupRequest(
                group_id=GROUP,
                members=[
                    identity(member_id=old, group_instance_id="ia"),
                    identity(member_id="", group_instance_id="nobody"),
                    identity(member_id="", group_instance_id="ia"),
                ],
            ),
            3,
            LeaveGroupResponse,
        )
        assert left.error_code == 0
        assert [(m.member_id, m.group_instance_id, m.error_code) for m in left.members] == [
            (old, "ia", FENCED),
            ("", "nobody", ErrorCode.UNKNOWN_MEMBER_ID),
            ("", "ia", 0),
        ]
        gone = await roundtrip(
            coordinator, LeaveGroupRequest(group_id=GROUP, member_id=new), 0, LeaveGroupResponse
        )
        assert gone.error_code == ErrorCode.UNKNOWN_MEMBER_ID

    asyncio.run(run())
