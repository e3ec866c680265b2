"""The group admin APIs through the coordinator and the handlers, over an in-memory log.

Proves: ListGroups lists the groups of the partitions this broker leads (loaded ones, with
COORDINATOR_LOAD_IN_PROGRESS while one is loading) and nothing for the others; DeleteGroups
writes tombstones for the group and every offset, so a second coordinator reading the same log
(failover) knows neither, while a Stable group is refused (68), an unknown or empty id is 69 and
a group on another broker 16; a failed tombstone write keeps the group; after deletion the same
id forms a new group from generation 1; requests queued behind a deletion find the group gone
(69, or COORDINATOR_NOT_AVAILABLE for a commit, which the client retries into a new group);
OffsetDelete tombstones only the offsets it may delete, and a failover does not bring them back.
Through the real codec and ``Connection``: ListGroups v0-v5 (v3+ flexible) with the state and
type filters; DescribeGroups v0, v5 and v6 (an unknown group is Dead with 0 before v6,
GROUP_ID_NOT_FOUND from v6), authorized operations when asked; DeleteGroups v2; OffsetDelete v0
with UNKNOWN_TOPIC_OR_PARTITION for a topic the cluster lacks.

The backend is ``test_groups_coordinator``'s stand-in for the replica actors' log.
"""

from __future__ import annotations

import asyncio

from kafka.protocol.admin import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import OffsetDeleteRequest, OffsetDeleteResponse
from support.group_coordinator import (
    ELSEWHERE,
    GROUP,
    OTHER,
    PARTITION,
    TOPIC,
    TopicsLogBackend,
    consumer_join,
    failover,
    loaded,
    roundtrip,
    subscription,
)

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.coordinator import GroupCoordinator
from raylog.gateway.groups.group import GroupState, MemberIdentity
from raylog.gateway.groups.group_admin import GroupListing
from raylog.gateway.internal_topic import partition_for


async def stable_member(coordinator: GroupCoordinator, group_id: str = GROUP) -> tuple[str, int]:
    member_id = (await consumer_join(coordinator, group_id=group_id)).member_id
    joined = await consumer_join(coordinator, member_id, group_id=group_id)
    assert joined.error_code == 0
    synced = await coordinator.sync_group(
        group_id=group_id,
        member_id=member_id,
        generation_id=joined.generation_id,
        assignments={member_id: b"assigned"},
    )
    assert synced.error_code == 0
    return member_id, joined.generation_id


async def empty_group_with_offsets(coordinator: GroupCoordinator, group_id: str = GROUP) -> None:
    member, generation = await stable_member(coordinator, group_id)
    offsets = {(TOPIC, 0): (10, -1, None), (OTHER, 0): (20, -1, None)}
    assert await coordinator.commit_offsets(group_id, member, generation, offsets) == 0
    _, errors = await coordinator.leave_group(group_id, [MemberIdentity(member)])
    assert errors == [0]


def test_list_groups_lists_loaded_groups_of_this_broker() -> None:
    async def run() -> None:
        backend = TopicsLogBackend()
        coordinator = await loaded(backend)
        assert coordinator.list_groups() == (0, [])
        await stable_member(coordinator)
        await empty_group_with_offsets(coordinator, ELSEWHERE)
        assert coordinator.list_groups() == (
            0,
            [
                GroupListing(GROUP, "consumer", "Stable"),
                GroupListing(ELSEWHERE, "consumer", "Empty"),
            ],
        )
        # ELSEWHERE's partition moves to broker 2; GROUP's gets a new epoch and reloads.
        backend.leaders[partition_for(ELSEWHERE, 3)] = 2
        backend.epoch += 1
        backend.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS  # the load barrier cannot land
        await coordinator._tick()
        assert coordinator.list_groups() == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, [])
        backend.produce_error = 0
        loader = coordinator._owned[PARTITION].loader
        assert loader is not None
        await asyncio.wait_for(loader, timeout=5)
        assert coordinator.list_groups() == (0, [GroupListing(GROUP, "consumer", "Stable")])
        await coordinator.stop()

    asyncio.run(run())


def test_delete_group_writes_tombstones_that_survive_a_failover() -> None:
    async def run() -> None:
        backend = TopicsLogBackend()
        first = await loaded(backend)
        await empty_group_with_offsets(first)
        await stable_member(first, ELSEWHERE)
        assert await first.delete_group(ELSEWHERE) == ErrorCode.NON_EMPTY_GROUP
        assert await first.delete_group("never") == ErrorCode.GROUP_ID_NOT_FOUND
        assert await first.delete_group("") == ErrorCode.GROUP_ID_NOT_FOUND

        backend.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS
        assert await first.delete_group(GROUP) == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert first.describe_group(GROUP)[1].state == "Empty"  # still there
        backend.produce_error = 0
        assert await first.delete_group(GROUP) == ErrorCode.NONE
        assert first.describe_group(GROUP) == (ErrorCode.GROUP_ID_NOT_FOUND, ("Dead", "", "", ()))
        assert (await first.fetch_offsets(GROUP, None)).offsets == {}
        assert await first.delete_group(GROUP) == ErrorCode.GROUP_ID_NOT_FOUND

        second = await failover(backend, first)
        assert await first.delete_group(ELSEWHERE) == ErrorCode.NOT_COORDINATOR
        assert [g.group_id for g in second.list_groups()[1]] == [ELSEWHERE]
        assert (await second.fetch_offsets(GROUP, None)).offsets == {}
        # The id is free: a new group forms from generation 1.
        _, generation = await stable_member(second)
        assert generation == 1

    asyncio.run(run())


def test_requests_queued_behind_a_deletion_find_the_group_gone() -> None:
    async def run() -> None:
        backend = TopicsLogBackend()
        coordinator = await loaded(backend)
        await empty_group_with_offsets(coordinator)
        backend.gate = asyncio.Event()
        deleting = asyncio.create_task(coordinator.delete_group(GROUP))
        await asyncio.sleep(0)  # it holds the group's lock, its tombstones being written
        queued = asyncio.gather(
            coordinator.delete_group(GROUP),
            coordinator.delete_offsets(GROUP, [(TOPIC, 0)]),
            coordinator.commit_offsets(GROUP, "", -1, {(TOPIC, 0): (1, -1, None)}),
        )
        await asyncio.sleep(0)  # each has found the group and waits for its lock
        assert not deleting.done() and not queued.done()
        backend.gate.set()
        assert await deleting == ErrorCode.NONE
        assert await queued == [
            ErrorCode.GROUP_ID_NOT_FOUND,
            (ErrorCode.GROUP_ID_NOT_FOUND, {}),
            ErrorCode.COORDINATOR_NOT_AVAILABLE,  # the client retries and meets a new group
        ]
        assert await coordinator.commit_offsets(GROUP, "", -1, {(TOPIC, 0): (1, -1, None)}) == 0
        fetched = await coordinator.fetch_offsets(GROUP, None)
        assert {tp: c.offset for tp, c in fetched.offsets.items() if c} == {(TOPIC, 0): 1}

    asyncio.run(run())


def test_offset_delete_tombstones_only_what_it_may_delete() -> None:
    async def run() -> None:
        backend = TopicsLogBackend()
        first = await loaded(backend)
        member, generation = await stable_member(first)
        offsets = {(TOPIC, 0): (10, -1, None), (OTHER, 0): (20, -1, None)}
        assert await first.commit_offsets(GROUP, member, generation, offsets) == 0
        error, errors = await first.delete_offsets(GROUP, [(TOPIC, 0), (OTHER, 0)])
        assert error == 0
        assert errors == {(TOPIC, 0): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC, (OTHER, 0): 0}
        assert await first.delete_offsets("never", [(TOPIC, 0)]) == (
            ErrorCode.GROUP_ID_NOT_FOUND,
            {},
        )

        second = await failover(backend, first)
        left = await second.fetch_offsets(GROUP, None)
        assert {tp: c.offset for tp, c in left.offsets.items() if c} == {(TOPIC, 0): 10}
        group = second._owned[PARTITION].groups[GROUP]
        assert group.state is GroupState.STABLE

    asyncio.run(run())


# --- through the codec and the handlers ---------------------------------------------------------


def test_list_groups_over_the_wire_all_versions_and_the_state_filter() -> None:
    async def run() -> None:
        coordinator = await loaded(TopicsLogBackend())
        await stable_member(coordinator)
        await empty_group_with_offsets(coordinator, ELSEWHERE)
        for version in range(6):
            response = await roundtrip(
                coordinator, ListGroupsRequest(), version, ListGroupsResponse
            )
            assert response.error_code == 0
            got = {g.group_id: g.protocol_type for g in response.groups}
            assert got == {GROUP: "consumer", ELSEWHERE: "consumer"}
            if version >= 4:
                states = {g.group_id: g.group_state for g in response.groups}
                assert states == {GROUP: "Stable", ELSEWHERE: "Empty"}
        filtered = await roundtrip(
            coordinator, ListGroupsRequest(states_filter=["Empty"]), 4, ListGroupsResponse
        )
        assert [(g.group_id, g.group_state) for g in filtered.groups] == [(ELSEWHERE, "Empty")]
        typed = await roundtrip(
            coordinator, ListGroupsRequest(types_filter=["classic"]), 5, ListGroupsResponse
        )
        assert {g.group_type for g in typed.groups} == {"classic"} and len(typed.groups) == 2

    asyncio.run(run())


def test_describe_groups_over_the_wire() -> None:
    async def run() -> None:
        backend = TopicsLogBackend()
        coordinator = await loaded(backend)
        member, _ = await stable_member(coordinator)
        asked = DescribeGroupsRequest(groups=[GROUP, "never"], include_authorized_operations=True)
        for version in (0, 5, 6):
            response = await roundtrip(coordinator, asked, version, DescribeGroupsResponse)
            stable, unknown = response.groups
            assert (stable.error_code, stable.group_state, stable.protocol_type) == (
                0,
                "Stable",
                "consumer",
            )
            assert stable.protocol_data == "range"
            [m] = stable.members
            assert (m.member_id, m.client_id, m.client_host) == (member, "c", "/127.0.0.1")
            assert (m.member_metadata, m.member_assignment) == (subscription(TOPIC), b"assigned")
            assert (unknown.group_state, unknown.members) == ("Dead", [])
            assert unknown.error_code == (ErrorCode.GROUP_ID_NOT_FOUND if version >= 6 else 0)
            if version >= 3:
                assert stable.authorized_operations == {3, 6, 8}  # READ, DELETE, DESCRIBE
        not_asked = await roundtrip(
            coordinator, DescribeGroupsRequest(groups=[GROUP]), 5, DescribeGroupsResponse
        )
        assert not_asked.groups[0].authorized_operations is None  # -2^31 on the wire
        backend.leaders[PARTITION] = 2
        await coordinator._tick()
        moved = await roundtrip(
            coordinator, DescribeGroupsRequest(groups=[GROUP]), 5, DescribeGroupsResponse
        )
        assert (moved.groups[0].error_code, moved.groups[0].group_state) == (
            ErrorCode.NOT_COORDINATOR,
            "",
        )

    asyncio.run(run())


def test_delete_groups_and_offset_delete_over_the_wire() -> None:
    async def run() -> None:
        coordinator = await loaded(TopicsLogBackend())
        await empty_group_with_offsets(coordinator)
        await stable_member(coordinator, ELSEWHERE)
        _Topic = OffsetDeleteRequest.OffsetDeleteRequestTopic
        _Partition = _Topic.OffsetDeleteRequestPartition
        asked = OffsetDeleteRequest(
            group_id=GROUP,
            topics=[
                _Topic(name=TOPIC, partitions=[_Partition(partition_index=0)]),
                _Topic(name="missing", partitions=[_Partition(partition_index=0)]),
            ],
        )
        deleted = await roundtrip(coordinator, asked, 0, OffsetDeleteResponse)
        assert deleted.error_code == 0
        assert {
            (t.name, p.partition_index): p.error_code for t in deleted.topics for p in t.partitions
        } == {(TOPIC, 0): 0, ("missing", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        left = await coordinator.fetch_offsets(GROUP, None)
        assert set(left.offsets) == {(OTHER, 0)}
        unknown = OffsetDeleteRequest(group_id="never", topics=asked.topics)
        refused = await roundtrip(coordinator, unknown, 0, OffsetDeleteResponse)
        assert (refused.error_code, refused.topics) == (ErrorCode.GROUP_ID_NOT_FOUND, [])

        names = [GROUP, ELSEWHERE, "never", GROUP]
        response = await roundtrip(
            coordinator, DeleteGroupsRequest(groups_names=names), 2, DeleteGroupsResponse
        )
        assert [(r.group_id, r.error_code) for r in response.results] == [
            (GROUP, 0),
            (ELSEWHERE, ErrorCode.NON_EMPTY_GROUP),
            ("never", ErrorCode.GROUP_ID_NOT_FOUND),
        ]

    asyncio.run(run())
