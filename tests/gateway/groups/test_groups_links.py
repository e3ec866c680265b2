"""Mirrored consumer-group offsets at the group coordinator and its commit handlers.

Proves: a link's sync writes offsets into a new group as committed offsets with leader epoch
-1, writes again only those that changed, and a coordinator reading the log back after a
failover has them; a group with members is skipped (nothing written) and synced once it is
Empty again; ``coordinates`` is true only for groups whose partition is led and loaded here;
OffsetCommit and TxnOffsetCommit of a group whose offsets of a topic a link mirrors answer
INVALID_REQUEST (42) for that topic's partitions and commit the others, and the broker logs the
refusal, naming the link, once per interval; a coordinator without the rule refuses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from kafka.protocol.consumer import OffsetCommitResponse
from kafka.protocol.producer import TxnOffsetCommitRequest, TxnOffsetCommitResponse
from support.group_coordinator import (
    ELSEWHERE,
    GROUP,
    OTHER,
    TOPIC,
    Clock,
    LogBackend,
    TopicsLogBackend,
    consumer_join,
    failover,
    loaded,
    offset_commit,
    roundtrip,
)

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.coordinator import REFUSAL_LOG_INTERVAL_MS, GroupCoordinator
from raylog.gateway.groups.group import MemberIdentity

MESSAGE = "offsets mirrored by link 'east'"


def refusals(group_id: str, topics: Sequence[str]) -> Mapping[str, str]:
    """The rule as the gateway's links answer it: GROUP's offsets of TOPIC are the link's."""
    return {t: MESSAGE for t in topics if t == TOPIC and group_id == GROUP}


async def committed(coordinator: GroupCoordinator, group: str = GROUP) -> dict[Any, Any]:
    fetched = await coordinator.fetch_offsets(group, None)
    assert fetched.error_code == 0
    return {tp: (c.offset, c.leader_epoch) for tp, c in fetched.offsets.items() if c is not None}


def test_sync_writes_changed_offsets_into_a_group_without_members() -> None:
    async def run() -> None:
        backend = LogBackend()
        coordinator = await loaded(backend)
        assert coordinator.coordinates(GROUP)
        done = await coordinator.sync_mirrored_offsets(GROUP, {("t", 0): 5, ("t", 1): 9})
        assert (done.error_code, done.active, done.written) == (0, False, 2)
        assert await committed(coordinator) == {("t", 0): (5, -1), ("t", 1): (9, -1)}
        written = sum(len(log) for log in backend.logs.values())
        again = await coordinator.sync_mirrored_offsets(GROUP, {("t", 0): 5, ("t", 1): 9})
        assert again.written == 0 and sum(len(log) for log in backend.logs.values()) == written
        moved = await coordinator.sync_mirrored_offsets(GROUP, {("t", 0): 5, ("t", 1): 12})
        assert moved.written == 1
        successor = await failover(backend, coordinator)
        assert not coordinator.coordinates(GROUP) and successor.coordinates(GROUP)
        assert await committed(successor) == {("t", 0): (5, -1), ("t", 1): (12, -1)}

    asyncio.run(run())


def test_a_group_with_members_is_skipped_until_it_is_empty() -> None:
    async def run() -> None:
        coordinator = await loaded(TopicsLogBackend())
        member = (await consumer_join(coordinator)).member_id
        joined = await consumer_join(coordinator, member)
        assert joined.error_code == 0
        skipped = await coordinator.sync_mirrored_offsets(GROUP, {(TOPIC, 0): 3})
        assert skipped.active and skipped.written == 0
        assert await committed(coordinator) == {}
        left, _ = await coordinator.leave_group(GROUP, [MemberIdentity(member)])
        assert left == 0
        synced = await coordinator.sync_mirrored_offsets(GROUP, {(TOPIC, 0): 3})
        assert not synced.active and synced.written == 1

    asyncio.run(run())


def commit(group: str) -> Any:
    return offset_commit([(TOPIC, 7), (OTHER, 9)], group_id=group)


def txn_offset_commit(group: str) -> Any:
    topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    part = topic.TxnOffsetCommitRequestPartition
    return TxnOffsetCommitRequest(
        transactional_id="tx",
        group_id=group,
        producer_id=7,
        producer_epoch=0,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        topics=[
            topic(name=name, partitions=[part(partition_index=0, committed_offset=11)])
            for name in (TOPIC, OTHER)
        ],
    )


def codes(response: Any) -> dict[str, int]:
    return {t.name: p.error_code for t in response.topics for p in t.partitions}


def test_commits_of_mirrored_offsets_are_refused_and_the_others_committed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def run() -> None:
        clock = Clock()
        coordinator = await loaded(TopicsLogBackend(), clock=clock, commit_refusals=refusals)
        caplog.set_level(logging.WARNING, logger="raylog.gateway.groups.coordinator")
        answered = await roundtrip(coordinator, commit(GROUP), 7, OffsetCommitResponse)
        assert codes(answered) == {TOPIC: ErrorCode.INVALID_REQUEST, OTHER: 0}
        assert await committed(coordinator) == {(OTHER, 0): (9, -1)}
        refused = [r.getMessage() for r in caplog.records if MESSAGE in r.getMessage()]
        assert len(refused) == 1
        # Auto-commits every few seconds log the refusal once per interval.
        await roundtrip(coordinator, commit(GROUP), 2, OffsetCommitResponse)
        assert sum(MESSAGE in r.getMessage() for r in caplog.records) == 1
        clock.ms += REFUSAL_LOG_INTERVAL_MS
        await roundtrip(coordinator, commit(GROUP), 2, OffsetCommitResponse)
        assert sum(MESSAGE in r.getMessage() for r in caplog.records) == 2

        txn = await roundtrip(coordinator, txn_offset_commit(GROUP), 3, TxnOffsetCommitResponse)
        assert codes(txn) == {TOPIC: ErrorCode.INVALID_REQUEST, OTHER: 0}
        assert coordinator.has_pending(GROUP, OTHER, 0)
        assert not coordinator.has_pending(GROUP, TOPIC, 0)

        # Another group (here on another partition of __consumer_offsets) is not mirrored.
        free = await roundtrip(coordinator, commit(ELSEWHERE), 7, OffsetCommitResponse)
        assert codes(free) == {TOPIC: 0, OTHER: 0}

    asyncio.run(run())


def test_without_the_rule_nothing_is_refused() -> None:
    async def run() -> None:
        coordinator = await loaded(TopicsLogBackend())
        assert coordinator.refused_commits(GROUP, [TOPIC, OTHER]) == set()
        answered = await roundtrip(coordinator, commit(GROUP), 7, OffsetCommitResponse)
        assert codes(answered) == {TOPIC: 0, OTHER: 0}

    asyncio.run(run())
