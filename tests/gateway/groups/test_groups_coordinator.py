"""The asyncio group coordinator over an in-memory ``__consumer_offsets`` log.

Proves: FindCoordinator creates the topic once (RF capped by live brokers, compacted, Kafka's
segment size) and answers COORDINATOR_NOT_AVAILABLE until a leader exists, then the leader's
node; an existing topic is given cleanup.policy=compact once (retried while that fails); a
request for a partition another broker leads gets NOT_COORDINATOR at once; one for a partition
being loaded here waits for the load and is served (COORDINATOR_LOAD_IN_PROGRESS only past the
wait), and so does one that arrives before this broker's metadata shows the partition; JoinGroup
answers wait for the rebalance and SyncGroup for the leader; commits are written as
records and a second coordinator reading the same log (failover) rebuilds the group (Stable,
same generation, heartbeats accepted) and its offsets; losing leadership answers a waiting
JoinGroup NOT_COORDINATOR; a group's metadata write failing turns its SyncGroup answers into
COORDINATOR_NOT_AVAILABLE; committed offsets expire (KIP-211) once their group has been Empty
for the retention, counted across a coordinator failover from the group's metadata record, and
a group that only commits loses each offset a retention after its commit, then the group; a
group left Empty without offsets is tombstoned at the next expiry check, and stays gone after a
failover.

The backend here is a stand-in for the replica actors' log (the thing under test is the
coordinator); the live tests in ``tests/e2e/test_consumer_groups.py`` use the real one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from kafka.record.default_records import DefaultRecordBatch
from support.group_coordinator import GROUP, PARTITION, Clock, LogBackend, join, loaded

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups import records as gr
from raylog.gateway.groups.coordinator import OFFSETS_TOPIC, GroupCoordinator
from raylog.gateway.groups.group import GroupState, MemberIdentity
from raylog.gateway.internal_topic import CREATE_RETRY_MS
from raylog.storage.errors import RaylogError


async def stable_member(coordinator: GroupCoordinator) -> tuple[str, int]:
    first = await join(coordinator)
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
    result = await join(coordinator, first.member_id)
    assert result.error_code == 0 and result.leader == first.member_id
    synced = await coordinator.sync_group(
        group_id=GROUP,
        member_id=first.member_id,
        generation_id=result.generation_id,
        assignments={first.member_id: b"all"},
    )
    assert synced.error_code == 0 and synced.assignment == b"all"
    return first.member_id, result.generation_id


def test_find_coordinator_creates_the_topic_once() -> None:
    async def run() -> None:
        backend = LogBackend()
        backend.exists = False
        created: list[tuple[str, int, int, dict[str, str]]] = []

        async def create(name: str, partitions: int, rf: int, configs: dict[str, str]) -> None:
            created.append((name, partitions, rf, configs))

        coordinator = GroupCoordinator(backend, 1, create_topic=create)
        node = await coordinator.find_coordinator(GROUP)
        assert node.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        await coordinator.find_coordinator(GROUP)  # within the retry interval: no second try
        assert coordinator._topic._setting_up is not None
        await coordinator._topic._setting_up
        configs = {"cleanup.policy": "compact", "segment.bytes": "104857600"}
        assert created == [(OFFSETS_TOPIC, 3, 2, configs)]  # RF 3 capped at 2
        backend.exists = True
        backend.leaders[PARTITION] = -1
        assert (await coordinator.find_coordinator(GROUP)).error_code == 15
        backend.leaders[PARTITION] = 2
        node = await coordinator.find_coordinator(GROUP)
        assert (node.error_code, node.node_id, node.port) == (0, 2, 9002)

    asyncio.run(run())


def test_an_existing_topic_is_given_cleanup_policy_compact_once() -> None:
    async def run() -> None:
        backend, clock = LogBackend(), Clock()
        calls: list[tuple[str, Mapping[str, str]]] = []

        async def configure(name: str, configs: Mapping[str, str]) -> None:
            calls.append((name, configs))
            if len(calls) == 1:
                raise RaylogError("no active controller")

        coordinator = GroupCoordinator(backend, 1, monotonic_ms=clock, configure_topic=configure)

        async def tick() -> None:
            await coordinator._tick()
            if coordinator._topic._setting_up is not None:
                await coordinator._topic._setting_up

        await tick()  # fails: tried again only CREATE_RETRY_MS later
        await tick()
        assert calls == [(OFFSETS_TOPIC, {"cleanup.policy": "compact"})]
        clock.ms += CREATE_RETRY_MS
        await tick()
        clock.ms += CREATE_RETRY_MS
        await tick()  # done: not again
        assert calls == [(OFFSETS_TOPIC, {"cleanup.policy": "compact"})] * 2
        await coordinator.stop()

    asyncio.run(run())


def test_not_coordinator_at_once_and_load_in_progress_after_the_wait() -> None:
    async def run() -> None:
        backend = LogBackend(leader=2)
        patient = GroupCoordinator(backend, 1, load_wait_ms=60_000)
        await patient._tick()
        # Another broker leads the group's partition: no wait, whatever the bound.
        heartbeat = await asyncio.wait_for(patient.heartbeat(GROUP, "m", 1), timeout=5)
        assert heartbeat == ErrorCode.NOT_COORDINATOR

        backend.leaders[PARTITION] = 1
        backend.epoch = 1
        backend.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS  # the load barrier cannot land
        coordinator = GroupCoordinator(backend, 1, load_wait_ms=200)
        await coordinator._tick()
        assert (await join(coordinator)).error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        backend.produce_error = 0
        loader = coordinator._owned[PARTITION].loader
        assert loader is not None
        await asyncio.wait_for(loader, timeout=5)
        assert (await join(coordinator)).error_code == ErrorCode.MEMBER_ID_REQUIRED
        await coordinator.stop()

    asyncio.run(run())


def test_a_commit_waits_for_its_partition_to_load_and_is_served() -> None:
    """librdkafka fails an application's OffsetCommit after two quick retries of
    COORDINATOR_LOAD_IN_PROGRESS: a commit arriving during the load is answered after it."""

    async def run() -> None:
        backend = LogBackend()
        backend.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS  # the load barrier cannot land
        coordinator = GroupCoordinator(backend, 1, load_wait_ms=60_000)
        coordinator.start()
        commit = asyncio.ensure_future(
            coordinator.commit_offsets(GROUP, "", -1, {("t", 0): (7, -1, None)})
        )
        await wait_for(lambda: backend.refused >= 2, "two load attempts refused")
        assert not commit.done()
        backend.produce_error = 0
        assert await asyncio.wait_for(commit, timeout=5) == ErrorCode.NONE
        fetched = await coordinator.fetch_offsets(GROUP, [("t", 0)])
        assert fetched.offsets[("t", 0)].offset == 7
        await coordinator.stop()

    asyncio.run(run())


def test_a_request_waits_until_this_brokers_metadata_shows_who_leads() -> None:
    """A client learns the coordinator from any gateway; this one's metadata may lag: a group
    request waits until it shows the group's partition (led here, then loaded)."""

    async def run() -> None:
        backend = LogBackend()
        backend.exists = False
        coordinator = GroupCoordinator(backend, 1, load_wait_ms=60_000)
        coordinator.start()
        commit = asyncio.ensure_future(
            coordinator.commit_offsets(GROUP, "", -1, {("t", 0): (9, -1, None)})
        )
        await wait_for(lambda: backend.topic_reads >= 3, "ticks without the topic")
        assert not commit.done()
        backend.exists = True
        assert await asyncio.wait_for(commit, timeout=5) == ErrorCode.NONE
        await coordinator.stop()

    asyncio.run(run())


async def wait_for(condition: Any, message: str, timeout_s: float = 5.0) -> None:
    """Until ``condition()`` holds, yielding to the event loop; fails after ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            while not condition():  # bounded by the timeout
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"{message}: not within {timeout_s} s") from None


def test_a_group_this_coordinator_does_not_have_answers_as_kafka() -> None:
    # Kafka's GroupCoordinator, for a group it does not have: Heartbeat, SyncGroup and each
    # LeaveGroup member UNKNOWN_MEMBER_ID (the client rejoins), a generation's OffsetCommit
    # ILLEGAL_GENERATION; a commit without one (generation -1) creates the group.
    async def run() -> None:
        coordinator = await loaded(LogBackend())
        assert await coordinator.heartbeat("gone", "m", 3) == ErrorCode.UNKNOWN_MEMBER_ID
        synced = await coordinator.sync_group(
            group_id="gone", member_id="m", generation_id=3, assignments={}
        )
        assert synced.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        left = await coordinator.leave_group("gone", [MemberIdentity("m"), MemberIdentity("n")])
        assert left == (ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * 2)
        offsets = {("t", 0): (5, -1, None)}
        error = await coordinator.commit_offsets("gone", "m", 3, offsets)
        assert error == ErrorCode.ILLEGAL_GENERATION
        assert await coordinator.commit_offsets("standalone", "", -1, offsets) == ErrorCode.NONE
        await coordinator.stop()

    asyncio.run(run())


def test_commits_and_the_group_survive_a_coordinator_failover() -> None:
    async def run() -> None:
        backend = LogBackend()
        first = await loaded(backend)
        member, generation = await stable_member(first)
        error = await first.commit_offsets(
            GROUP, member, generation, {("t", 0): (10, 3, "m"), ("t", 1): (20, -1, None)}
        )
        assert error == 0
        assert await first.commit_offsets(GROUP, member, generation + 1, {("t", 0): (11, -1, "")})
        fetched = await first.fetch_offsets(GROUP, [("t", 0), ("t", 2)])
        assert fetched.offsets[("t", 0)].offset == 10 and fetched.offsets[("t", 2)] is None

        # Failover: broker 2 now leads and reads the same log back.
        backend.leaders[PARTITION] = 2
        backend.epoch += 1
        await first._tick()
        assert (await first.heartbeat(GROUP, member, generation)) == ErrorCode.NOT_COORDINATOR
        second = await loaded(backend, broker=2)
        everything = await second.fetch_offsets(GROUP, None)
        assert {
            tp: (c.offset, c.leader_epoch, c.metadata) for tp, c in everything.offsets.items()
        } == {
            ("t", 0): (10, 3, "m"),
            ("t", 1): (20, -1, ""),
        }
        group = second._owned[PARTITION].groups[GROUP]
        assert group.state is GroupState.STABLE and group.generation_id == generation
        assert (await second.heartbeat(GROUP, member, generation)) == 0
        synced = await second.sync_group(
            group_id=GROUP, member_id=member, generation_id=generation, assignments={}
        )
        assert synced.assignment == b"all"
        unknown = await second.fetch_offsets("never-seen", [("t", 0)])
        assert unknown.error_code == 0 and unknown.offsets == {("t", 0): None}

    asyncio.run(run())


def test_losing_leadership_answers_a_waiting_join() -> None:
    async def run() -> None:
        backend = LogBackend()
        coordinator = await loaded(backend)
        await stable_member(coordinator)
        newcomer = await join(coordinator)
        waiting = asyncio.ensure_future(join(coordinator, newcomer.member_id))
        await asyncio.sleep(0)
        assert not waiting.done()  # waits for the old member to rejoin
        backend.leaders[PARTITION] = 2
        await coordinator._tick()
        result = await asyncio.wait_for(waiting, timeout=5)
        assert result.error_code == ErrorCode.NOT_COORDINATOR

    asyncio.run(run())


def test_a_failed_group_write_fails_the_sync() -> None:
    async def run() -> None:
        backend = LogBackend()
        coordinator = await loaded(backend)
        first = await join(coordinator)
        result = await join(coordinator, first.member_id)
        backend.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS
        synced = await coordinator.sync_group(
            group_id=GROUP,
            member_id=first.member_id,
            generation_id=result.generation_id,
            assignments={first.member_id: b"x"},
        )
        assert synced.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        group = coordinator._owned[PARTITION].groups[GROUP]
        assert group.state is GroupState.PREPARING_REBALANCE

    asyncio.run(run())


def test_session_expiry_through_the_tick() -> None:
    async def run() -> None:
        backend, clock = LogBackend(), Clock()
        coordinator = await loaded(backend, clock=clock)
        member, generation = await stable_member(coordinator)
        clock.ms += 10_000
        await coordinator._tick()
        heartbeat = await coordinator.heartbeat(GROUP, member, generation)
        assert heartbeat == ErrorCode.UNKNOWN_MEMBER_ID
        group = coordinator._owned[PARTITION].groups[GROUP]
        assert group.state is GroupState.EMPTY and group.generation_id == generation + 1

    asyncio.run(run())


def test_the_initial_rebalance_delay_holds_the_first_join_until_the_tick_after_it() -> None:
    async def run() -> None:
        backend, clock = LogBackend(), Clock()
        coordinator = await loaded(backend, clock=clock, delay_ms=3_000)
        first = await join(coordinator)
        waiting = asyncio.ensure_future(join(coordinator, first.member_id))
        await asyncio.sleep(0)  # the join reaches the group at clock 0
        clock.ms += 2_999
        await coordinator._tick()
        await asyncio.sleep(0)
        assert not waiting.done()
        clock.ms += 1
        await coordinator._tick()
        result = await asyncio.wait_for(waiting, timeout=5)
        assert result.error_code == 0 and result.generation_id == 1

    asyncio.run(run())


RETENTION_MS = 60_000
CHECK_MS = 1_000


async def expiring(backend: LogBackend, clock: Clock, wall: Clock, broker: int = 1) -> Any:
    """A loaded coordinator with a short offset retention on the test's clocks."""
    coordinator = GroupCoordinator(
        backend,
        broker,
        monotonic_ms=clock,
        wall_ms=wall,
        offsets_retention_ms=RETENTION_MS,
        offsets_retention_check_interval_ms=CHECK_MS,
    )
    await coordinator._tick()
    await asyncio.gather(*(o.loader for o in coordinator._owned.values() if o.loader))
    return coordinator


async def expiring_on_new_clocks() -> tuple[LogBackend, Clock, Clock, Any]:
    """A new log, a monotonic clock at 0, a wall clock in 2023, and a coordinator on them."""
    backend, clock, wall = LogBackend(), Clock(), Clock()
    wall.ms = 1_700_000_000_000
    return backend, clock, wall, await expiring(backend, clock, wall)


async def after(coordinator: GroupCoordinator, clock: Clock, wall: Clock, ms: int) -> None:
    """The wall clock ``ms`` on (commit times and retention are wall-clock), the monotonic one
    a check interval (sessions of 10 s survive), then a tick and the expiry check it starts."""
    clock.ms += CHECK_MS
    wall.ms += ms
    await coordinator._tick()
    if coordinator._expiring is not None:
        await coordinator._expiring


def test_offsets_of_a_group_empty_past_the_retention_expire_with_it() -> None:
    async def run() -> None:
        backend, clock, wall, coordinator = await expiring_on_new_clocks()
        member, generation = await stable_member(coordinator)
        assert not await coordinator.commit_offsets(
            GROUP, member, generation, {("t", 0): (5, -1, "")}
        )
        await after(coordinator, clock, wall, RETENTION_MS)  # Stable: in use, whatever its age
        assert (await coordinator.fetch_offsets(GROUP, [("t", 0)])).offsets[("t", 0)] is not None

        assert (await coordinator.leave_group(GROUP, [MemberIdentity(member)]))[1] == [0]
        await after(coordinator, clock, wall, 0)  # the tick that sees it Empty (every 100 ms)
        assert coordinator._owned[PARTITION].groups[GROUP].state is GroupState.EMPTY
        await after(coordinator, clock, wall, RETENTION_MS - CHECK_MS)  # empty, not long enough
        assert (await coordinator.fetch_offsets(GROUP, [("t", 0)])).offsets[("t", 0)] is not None
        await after(coordinator, clock, wall, 2 * CHECK_MS)
        assert (await coordinator.fetch_offsets(GROUP, [("t", 0)])).offsets == {("t", 0): None}
        assert coordinator.describe_group(GROUP)[0] == ErrorCode.GROUP_ID_NOT_FOUND

        # The tombstones are in the log: a new coordinator reading it brings nothing back.
        backend.leaders[PARTITION] = 2
        backend.epoch += 1
        second = await expiring(backend, clock, wall, broker=2)
        assert (await second.fetch_offsets(GROUP, [("t", 0)])).offsets == {("t", 0): None}
        assert second.describe_group(GROUP)[0] == ErrorCode.GROUP_ID_NOT_FOUND

    asyncio.run(run())


def test_an_empty_group_without_offsets_is_tombstoned_at_the_next_check() -> None:
    async def run() -> None:
        backend, clock, wall, coordinator = await expiring_on_new_clocks()
        member, _ = await stable_member(coordinator)  # its metadata record is in the log
        assert (await coordinator.leave_group(GROUP, [MemberIdentity(member)]))[1] == [0]
        await after(coordinator, clock, wall, 0)  # the tick that sees it Empty: a check too
        assert coordinator.describe_group(GROUP)[0] == ErrorCode.GROUP_ID_NOT_FOUND
        (tombstone,) = DefaultRecordBatch(next(b for b in reversed(backend.logs[PARTITION]) if b))
        assert gr.decode_key(tombstone.key) == gr.GroupMetadataKey(GROUP)
        assert tombstone.value is None

        # A new coordinator reading the log finds the tombstone, not the group.
        backend.leaders[PARTITION] = 2
        backend.epoch += 1
        second = await expiring(backend, clock, wall, broker=2)
        assert second.describe_group(GROUP)[0] == ErrorCode.GROUP_ID_NOT_FOUND

    asyncio.run(run())


def test_standalone_commits_expire_one_by_one_from_their_commit_time() -> None:
    async def run() -> None:
        _, clock, wall, coordinator = await expiring_on_new_clocks()
        # A consumer that assigns partitions itself commits with generation -1, no member.
        assert not await coordinator.commit_offsets(GROUP, "", -1, {("t", 0): (1, -1, "")})
        await after(coordinator, clock, wall, RETENTION_MS // 2)
        assert not await coordinator.commit_offsets(GROUP, "", -1, {("t", 1): (2, -1, "")})
        await after(coordinator, clock, wall, RETENTION_MS // 2 + CHECK_MS)
        fetched = await coordinator.fetch_offsets(GROUP, [("t", 0), ("t", 1)])
        assert fetched.offsets[("t", 0)] is None  # committed a retention ago
        assert fetched.offsets[("t", 1)] is not None  # half a retention ago
        await after(coordinator, clock, wall, RETENTION_MS // 2)
        assert (await coordinator.fetch_offsets(GROUP, [("t", 1)])).offsets == {("t", 1): None}
        assert coordinator.describe_group(GROUP)[0] == ErrorCode.GROUP_ID_NOT_FOUND

    asyncio.run(run())


def test_a_new_coordinator_counts_the_retention_from_when_the_group_became_empty() -> None:
    async def run() -> None:
        backend, clock, wall, first = await expiring_on_new_clocks()
        member, generation = await stable_member(first)
        assert not await first.commit_offsets(GROUP, member, generation, {("t", 0): (5, -1, "")})
        assert (await first.leave_group(GROUP, [MemberIdentity(member)]))[1] == [0]
        await after(first, clock, wall, 0)
        await after(first, clock, wall, RETENTION_MS // 2)

        # Failover half a retention later: the group's metadata record says since when it is
        # Empty, so the new coordinator does not start counting again.
        backend.leaders[PARTITION] = 2
        backend.epoch += 1
        await first._tick()
        second = await expiring(backend, clock, wall, broker=2)
        await after(second, clock, wall, 0)
        assert (await second.fetch_offsets(GROUP, [("t", 0)])).offsets[("t", 0)] is not None
        await after(second, clock, wall, RETENTION_MS // 2 + CHECK_MS)
        assert (await second.fetch_offsets(GROUP, [("t", 0)])).offsets == {("t", 0): None}

    asyncio.run(run())
