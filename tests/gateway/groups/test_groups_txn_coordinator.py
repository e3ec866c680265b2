"""Transactional offset commits through the group coordinator over in-memory
``__consumer_offsets`` logs, and TxnOffsetCommit through the real handler and wire codec.

Proves: commit_transactional_offsets appends one transactional batch of the producer (its id
and epoch, no sequence) and creates an unknown group; its offsets stay invisible to OffsetFetch
until complete_transaction reports the COMMIT marker, and an ABORT drops them; a plain commit
appended after a pending one survives the transaction's commit; a failover replays committed,
aborted and still-open transactions (which a later complete_transaction finishes); a stale
generation writes nothing; a refused write leaves nothing pending, and a fenced producer's
error reaches it as the replica gave it; the handler (v0 and v3) answers unknown partitions
UNKNOWN_TOPIC_OR_PARTITION and over-long metadata OFFSET_METADATA_TOO_LARGE and commits the
rest; its refusals are Kafka's: TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53) without WRITE on the
transactional id, GROUP_AUTHORIZATION_FAILED (30) without READ on the group, both on every
partition and writing nothing, TOPIC_AUTHORIZATION_FAILED (29) for a topic without READ.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafka.protocol.producer import TxnOffsetCommitRequest, TxnOffsetCommitResponse
from support.admin_backend import answer
from support.authorization import allow, as_alice
from support.group_coordinator import (
    GROUP,
    OTHER,
    PARTITION,
    TOPIC,
    LogBackend,
    TopicsLogBackend,
    consumer_join,
    failover,
    loaded,
    roundtrip,
    write_marker,
)

from raylog.actors.control.acls import AclOperation as Op
from raylog.actors.control.acls import ResourceType
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.coordinator import GroupCoordinator
from raylog.storage import batch as rb

T0, T1 = (TOPIC, 0), (TOPIC, 1)


async def txn_commit(
    coordinator: GroupCoordinator,
    producer_id: int,
    offsets: dict[tuple[str, int], int],
    *,
    member_id: str = "",
    generation_id: int = -1,
) -> tuple[int, Any]:
    return await coordinator.commit_transactional_offsets(
        group_id=GROUP,
        producer_id=producer_id,
        producer_epoch=3,
        member_id=member_id,
        generation_id=generation_id,
        group_instance_id=None,
        offsets={tp: (offset, -1, "m") for tp, offset in offsets.items()},
    )


async def committed(coordinator: GroupCoordinator) -> dict[tuple[str, int], int]:
    fetched = await coordinator.fetch_offsets(GROUP, None)
    return {tp: c.offset for tp, c in fetched.offsets.items() if c is not None}


def test_pending_until_the_commit_marker_and_dropped_at_an_abort() -> None:
    async def run() -> None:
        backend = LogBackend()
        coordinator = await loaded(backend)
        assert await txn_commit(coordinator, 7, {T0: 5, T1: 6}) == (0, {T0: 0, T1: 0})
        batch = next(b for b in reversed(backend.logs[PARTITION]) if b)
        header = rb.parse_header(batch)
        assert header.is_transactional and not header.is_control
        assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 3, -1)
        assert await committed(coordinator) == {}
        assert coordinator.has_pending(GROUP, *T0) and not coordinator.has_pending("x", *T0)
        assert coordinator.describe_group(GROUP)[0] == ErrorCode.NONE  # the group exists
        coordinator.complete_transaction(PARTITION, 8, True)  # another producer: nothing
        assert await committed(coordinator) == {}
        coordinator.complete_transaction(PARTITION, 7, True)
        assert await committed(coordinator) == {T0: 5, T1: 6}
        assert not coordinator.has_pending(GROUP, *T0)

        assert (await txn_commit(coordinator, 7, {T0: 50}))[0] == 0
        coordinator.complete_transaction(PARTITION, 7, False)
        assert await committed(coordinator) == {T0: 5, T1: 6}

    asyncio.run(run())


def test_a_plain_commit_after_a_pending_one_survives_the_transaction() -> None:
    async def run() -> None:
        coordinator = await loaded(LogBackend())
        assert (await txn_commit(coordinator, 7, {T0: 5, T1: 6}))[0] == 0
        assert await coordinator.commit_offsets(GROUP, "", -1, {T0: (99, -1, None)}) == 0
        coordinator.complete_transaction(PARTITION, 7, True)
        assert await committed(coordinator) == {T0: 99, T1: 6}

    asyncio.run(run())


def test_a_failover_replays_transactions_and_finishes_open_ones_later() -> None:
    async def run() -> None:
        backend = LogBackend()
        first = await loaded(backend)
        assert (await txn_commit(first, 7, {T0: 5}))[0] == 0
        assert (await txn_commit(first, 8, {T1: 6}))[0] == 0
        assert (await txn_commit(first, 9, {(OTHER, 0): 7}))[0] == 0
        await write_marker(backend, PARTITION, 7, commit=True)
        await write_marker(backend, PARTITION, 8, commit=False)
        second = await failover(backend, first)
        assert await committed(second) == {T0: 5}
        assert second.has_pending(GROUP, OTHER, 0) and not second.has_pending(GROUP, *T1)
        second.complete_transaction(PARTITION, 9, True)
        assert await committed(second) == {T0: 5, (OTHER, 0): 7}

    asyncio.run(run())


def test_member_checks_and_refused_writes_leave_nothing_pending() -> None:
    async def run() -> None:
        backend = LogBackend()
        coordinator = await loaded(backend)
        member = (await consumer_join(coordinator)).member_id
        joined = await consumer_join(coordinator, member)
        sizes = [len(log) for log in backend.logs.values()]
        stale = await txn_commit(coordinator, 7, {T0: 5}, member_id=member, generation_id=0)
        assert stale == (ErrorCode.ILLEGAL_GENERATION, {})
        unknown = await txn_commit(coordinator, 7, {T0: 5}, member_id="x", generation_id=1)
        assert unknown == (ErrorCode.UNKNOWN_MEMBER_ID, {})
        assert [len(log) for log in backend.logs.values()] == sizes
        # CompletingRebalance: the member of the current generation commits.
        ok = await txn_commit(coordinator, 7, {T0: 5}, member_id=member, generation_id=1)
        assert joined.generation_id == 1 and ok[0] == 0

        backend.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS
        refused = await txn_commit(coordinator, 8, {T1: 6})
        assert refused == (ErrorCode.COORDINATOR_NOT_AVAILABLE, {})
        backend.produce_error = ErrorCode.PRODUCER_FENCED
        assert await txn_commit(coordinator, 8, {T1: 6}) == (ErrorCode.PRODUCER_FENCED, {})
        assert not coordinator.has_pending(GROUP, *T1)

    asyncio.run(run())


def request(
    *topics: tuple[str, list[int]], version: int, txn_id: str = "tx", metadata: str = "m"
) -> Any:
    topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    part = topic.TxnOffsetCommitRequestPartition
    return TxnOffsetCommitRequest(
        transactional_id=txn_id,
        group_id=GROUP,
        producer_id=7,
        producer_epoch=0,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        topics=[
            topic(
                name=name,
                partitions=[
                    part(partition_index=p, committed_offset=10 + p, committed_metadata=metadata)
                    for p in partitions
                ],
            )
            for name, partitions in topics
        ],
    )


def codes(response: Any) -> dict[tuple[str, int], int]:
    return {
        (t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions
    }


def test_the_handler_commits_known_partitions_and_refuses_the_others() -> None:
    async def run() -> None:
        coordinator = await loaded(TopicsLogBackend())
        for version in (0, 3):
            asked = request((TOPIC, [0, 5]), ("nope", [0]), version=version)
            answered = await roundtrip(coordinator, asked, version, TxnOffsetCommitResponse)
            assert codes(answered) == {
                (TOPIC, 0): 0,
                (TOPIC, 5): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            }
        too_large = request((TOPIC, [0]), version=3, metadata="x" * 4097)
        answered = await roundtrip(coordinator, too_large, 3, TxnOffsetCommitResponse)
        assert codes(answered) == {(TOPIC, 0): ErrorCode.OFFSET_METADATA_TOO_LARGE}
        assert coordinator.has_pending(GROUP, TOPIC, 0)
        coordinator.complete_transaction(PARTITION, 7, True)
        assert await committed(coordinator) == {(TOPIC, 0): 10}

    asyncio.run(run())


def test_the_handler_refuses_as_kafka_does() -> None:
    async def run() -> None:
        backend = TopicsLogBackend()
        coordinator = await loaded(backend)
        asked = request((TOPIC, [0]), (OTHER, [0]), version=3)
        G, T, X = ResourceType.GROUP, ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID
        everything_but_txn = as_alice(allow(G, GROUP, Op.READ), allow(T, "*", Op.READ))
        everything_but_group = as_alice(allow(X, "tx", Op.WRITE), allow(T, "*", Op.READ))
        one_topic = as_alice(
            allow(X, "tx", Op.WRITE), allow(G, GROUP, Op.READ), allow(T, TOPIC, Op.READ)
        )
        sizes = [len(log) for log in backend.logs.values()]
        for ctx, code in (
            (everything_but_txn, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
            (everything_but_group, ErrorCode.GROUP_AUTHORIZATION_FAILED),
        ):
            refused = await answer_as(coordinator, asked, ctx)
            assert codes(refused) == {(TOPIC, 0): code, (OTHER, 0): code}
        assert [len(log) for log in backend.logs.values()] == sizes
        partly = await answer_as(coordinator, asked, one_topic)
        assert codes(partly) == {(TOPIC, 0): 0, (OTHER, 0): ErrorCode.TOPIC_AUTHORIZATION_FAILED}
        assert coordinator.has_pending(GROUP, TOPIC, 0)
        assert not coordinator.has_pending(GROUP, OTHER, 0)

    asyncio.run(run())


async def answer_as(coordinator: GroupCoordinator, asked: Any, ctx: dict[str, Any]) -> Any:
    return await answer(
        coordinator._backend, asked, 3, TxnOffsetCommitResponse, groups=coordinator, **ctx
    )
