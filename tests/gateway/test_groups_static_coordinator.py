"""Static group membership (KIP-345) through the coordinator, over an in-memory
``__consumer_offsets`` log.

Proves: a restarted instance's takeover of a Stable group is written to the log before it is
answered, so a second coordinator reading the same log (failover) knows the new member id,
fences the old one and lets the instance take over again without a rebalance; a failed write
of the takeover answers COORDINATOR_NOT_AVAILABLE and keeps the old member.

The backend is ``test_groups_coordinator``'s stand-in for the replica actors' log.
"""

from __future__ import annotations

import asyncio

from test_groups_admin_coordinator import TopicsLogBackend, consumer_join, failover
from test_groups_coordinator import GROUP, PARTITION, LogBackend, loaded

from raylog.gateway.errors import ErrorCode
from raylog.gateway.group_coordinator import GroupCoordinator
from raylog.gateway.groups import GroupState, JoinResult

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
