"""Kafka's authorization of the group APIs, through the real handlers and a loaded coordinator.

Proves, for alice on a gateway with an authorizer: FindCoordinator needs DESCRIBE on the group;
JoinGroup, SyncGroup, Heartbeat and LeaveGroup READ on it (GROUP_AUTHORIZATION_FAILED, 30, and no
group is created); OffsetCommit READ on the group (30 on every partition, nothing committed) and
READ on each topic (29 for those partitions, the others committed); OffsetFetch DESCRIBE on the
group and on each topic (29 per partition asked; topics left out of "every offset"); ListGroups
lists the groups alice may DESCRIBE (all of them with DESCRIBE on the cluster); DescribeGroups
answers 30 per group refused and the operations alice may do when asked; DeleteGroups needs
DELETE on the group (the group stays); OffsetDelete DELETE on the group (30) and READ on each
topic (29, that offset stays).
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafka.protocol.admin import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse
from support.admin_backend import answer
from support.authorization import allow, as_alice
from support.group_coordinator import (
    ELSEWHERE,
    GROUP,
    OTHER,
    TOPIC,
    TopicsLogBackend,
    consumer_join,
    loaded,
    offset_commit,
    subscription,
)

from raylog.actors.control import acls
from raylog.actors.control.acls import AclOperation as Op
from raylog.actors.control.acls import ResourceType
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.coordinator import GroupCoordinator

GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED
TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
G, T, CLUSTER = ResourceType.GROUP, ResourceType.TOPIC, ResourceType.CLUSTER


async def ask(
    coordinator: GroupCoordinator, request: Any, version: int, response: Any, ctx: dict[str, Any]
) -> Any:
    return await answer(coordinator._backend, request, version, response, groups=coordinator, **ctx)


async def member_of(coordinator: GroupCoordinator, group_id: str) -> tuple[str, int]:
    """A stable member of ``group_id`` (joined through the coordinator, not the handlers)."""
    member = (await consumer_join(coordinator, group_id=group_id)).member_id
    joined = await consumer_join(coordinator, member, group_id=group_id)
    synced = await coordinator.sync_group(
        group_id=group_id,
        member_id=member,
        generation_id=joined.generation_id,
        assignments={member: b"a"},
    )
    assert synced.error_code == 0
    return member, joined.generation_id


def test_member_apis_need_read_on_the_group() -> None:
    async def run() -> None:
        coordinator = await loaded(TopicsLogBackend())
        member, generation = await member_of(coordinator, GROUP)
        nothing = as_alice(allow(G, "other", Op.ALL), allow(T, "*", Op.ALL))
        reader = as_alice(allow(G, GROUP, Op.READ))
        find = FindCoordinatorRequest(key=GROUP, key_type=0)
        found = await ask(coordinator, find, 2, FindCoordinatorResponse, nothing)
        assert found.error_code == GROUP_DENIED
        found = await ask(coordinator, find, 2, FindCoordinatorResponse, reader)
        assert found.error_code == 0  # READ implies DESCRIBE

        protocol = JoinGroupRequest.JoinGroupRequestProtocol(
            name="range", metadata=subscription(TOPIC)
        )

        def join(group_id: str) -> Any:
            return JoinGroupRequest(
                group_id=group_id,
                session_timeout_ms=10_000,
                rebalance_timeout_ms=10_000,
                member_id="",
                group_instance_id=None,
                protocol_type="consumer",
                protocols=[protocol],
            )

        joined = await ask(coordinator, join("fresh"), 5, JoinGroupResponse, nothing)
        assert joined.error_code == GROUP_DENIED
        assert coordinator.describe_group("fresh")[0] == ErrorCode.GROUP_ID_NOT_FOUND
        joined = await ask(coordinator, join(GROUP), 5, JoinGroupResponse, reader)
        assert joined.error_code == ErrorCode.MEMBER_ID_REQUIRED  # authorized: the join goes on

        beat = HeartbeatRequest(
            group_id=GROUP, generation_id=generation, member_id=member, group_instance_id=None
        )
        sync = SyncGroupRequest(
            group_id=GROUP,
            generation_id=generation,
            member_id=member,
            group_instance_id=None,
            assignments=[],
        )
        leave = LeaveGroupRequest(
            group_id=GROUP,
            members=[LeaveGroupRequest.MemberIdentity(member_id=member, group_instance_id=None)],
        )
        for request, response in (
            (beat, HeartbeatResponse),
            (sync, SyncGroupResponse),
            (leave, LeaveGroupResponse),
        ):
            refused = await ask(coordinator, request, 3, response, nothing)
            assert refused.error_code == GROUP_DENIED, request
        assert [m.member_id for m in coordinator.describe_group(GROUP)[1].members] == [member]
        beat_ok = await ask(coordinator, beat, 3, HeartbeatResponse, reader)
        assert beat_ok.error_code == 0

    asyncio.run(run())


def commit(member: str, generation: int) -> Any:
    return offset_commit([(TOPIC, 7), (OTHER, 9)], member_id=member, generation=generation)


def codes(response: Any) -> dict[str, int]:
    return {t.name: p.error_code for t in response.topics for p in t.partitions}


def test_offset_commit_and_fetch_need_the_group_and_each_topic() -> None:
    async def run() -> None:
        coordinator = await loaded(TopicsLogBackend())
        member, generation = await member_of(coordinator, GROUP)
        topic_only = as_alice(allow(T, "*", Op.READ))
        refused = await ask(
            coordinator, commit(member, generation), 7, OffsetCommitResponse, topic_only
        )
        assert codes(refused) == {TOPIC: GROUP_DENIED, OTHER: GROUP_DENIED}
        assert (await coordinator.fetch_offsets(GROUP, None)).offsets == {}

        reader = as_alice(allow(G, GROUP, Op.READ), allow(T, TOPIC, Op.READ))
        committed = await ask(
            coordinator, commit(member, generation), 7, OffsetCommitResponse, reader
        )
        assert codes(committed) == {TOPIC: 0, OTHER: TOPIC_DENIED}
        stored = (await coordinator.fetch_offsets(GROUP, None)).offsets
        assert {tp: c.offset for tp, c in stored.items()} == {(TOPIC, 0): 7}
        # OTHER's offset, committed past the handler, is hidden from alice's fetches.
        await coordinator.commit_offsets(GROUP, member, generation, {(OTHER, 0): (9, -1, None)})

        topic = OffsetFetchRequest.OffsetFetchRequestTopic
        asked = OffsetFetchRequest(
            group_id=GROUP,
            topics=[topic(name=n, partition_indexes=[0]) for n in (TOPIC, OTHER)],
        )
        fetched = await ask(coordinator, asked, 3, OffsetFetchResponse, reader)
        assert codes(fetched) == {TOPIC: 0, OTHER: TOPIC_DENIED}
        assert [p.committed_offset for t in fetched.topics for p in t.partitions] == [7, -1]
        every = OffsetFetchRequest(group_id=GROUP, topics=None)
        fetched = await ask(coordinator, every, 3, OffsetFetchResponse, reader)
        assert codes(fetched) == {TOPIC: 0}
        refused = await ask(coordinator, every, 3, OffsetFetchResponse, topic_only)
        assert (refused.error_code, refused.topics) == (GROUP_DENIED, [])

    asyncio.run(run())


def test_group_admin_apis_filter_and_refuse_by_group() -> None:
    async def run() -> None:
        coordinator = await loaded(TopicsLogBackend())
        member, generation = await member_of(coordinator, GROUP)
        await member_of(coordinator, ELSEWHERE)
        offsets = {(TOPIC, 0): (1, -1, None), (OTHER, 0): (2, -1, None)}
        assert await coordinator.commit_offsets(GROUP, member, generation, offsets) == 0

        reader = as_alice(allow(G, GROUP, Op.READ))
        listed = await ask(coordinator, ListGroupsRequest(), 4, ListGroupsResponse, reader)
        assert [g.group_id for g in listed.groups] == [GROUP]
        operator = as_alice(allow(CLUSTER, acls.CLUSTER_NAME, Op.DESCRIBE))
        listed = await ask(coordinator, ListGroupsRequest(), 4, ListGroupsResponse, operator)
        assert sorted(g.group_id for g in listed.groups) == sorted([GROUP, ELSEWHERE])

        described = await ask(
            coordinator,
            DescribeGroupsRequest(groups=[GROUP, ELSEWHERE], include_authorized_operations=True),
            5,
            DescribeGroupsResponse,
            reader,
        )
        mine, other = described.groups
        assert (mine.error_code, other.error_code) == (0, GROUP_DENIED)
        assert mine.authorized_operations == {Op.READ, Op.DESCRIBE}
        assert other.members == []

        deleting = DeleteGroupsRequest(groups_names=[ELSEWHERE])
        deleted = await ask(coordinator, deleting, 2, DeleteGroupsResponse, reader)
        assert [r.error_code for r in deleted.results] == [GROUP_DENIED]
        assert coordinator.describe_group(ELSEWHERE)[0] == 0

        topic = OffsetDeleteRequest.OffsetDeleteRequestTopic
        request = OffsetDeleteRequest(
            group_id=GROUP,
            topics=[
                topic(name=n, partitions=[topic.OffsetDeleteRequestPartition(partition_index=0)])
                for n in (TOPIC, OTHER)
            ],
        )
        refused = await ask(coordinator, request, 0, OffsetDeleteResponse, reader)
        assert (refused.error_code, refused.topics) == (GROUP_DENIED, [])
        deleter = as_alice(allow(G, GROUP, Op.DELETE), allow(T, TOPIC, Op.READ))
        response = await ask(coordinator, request, 0, OffsetDeleteResponse, deleter)
        # The group has a member subscribed to TOPIC: Kafka keeps a subscribed topic's offsets.
        assert codes(response)[OTHER] == TOPIC_DENIED
        left = (await coordinator.fetch_offsets(GROUP, None)).offsets
        assert (OTHER, 0) in left

    asyncio.run(run())
