"""Helpers of the group coordinator's tests: ``__consumer_offsets`` kept as in-memory byte logs
(:class:`LogBackend`, with two data topics in :class:`TopicsLogBackend`), a coordinator loaded
from them, JoinGroup requests, a failover to another broker, and a request answered through the
real handlers and wire codec (:func:`roundtrip`)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from kafka.protocol.consumer import OffsetCommitRequest
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from raylog.gateway.backend import (
    Broker,
    ClusterView,
    FetchResult,
    ListOffsetsResult,
    PartitionFetch,
    PartitionState,
    ProduceResult,
    TopicState,
)
from raylog.gateway.groups.coordinator import OFFSETS_TOPIC, GroupCoordinator
from raylog.gateway.groups.group import JoinResult
from raylog.gateway.internal_topic import partition_for
from raylog.storage import batch as rb
from support.admin_backend import answer

GROUP = "g"
PARTITION = partition_for(GROUP, 3)


class LogBackend:
    """Three ``__consumer_offsets`` partitions as byte logs; leaders set by the test."""

    def __init__(self, leader: int = 1) -> None:
        self.logs: dict[int, list[bytes]] = {p: [] for p in range(3)}
        self.leaders = dict.fromkeys(range(3), leader)
        self.epoch = 0
        self.exists = True
        self.produce_error = 0
        self.refused = 0  # produce calls answered with produce_error
        self.topic_reads = 0

    async def cluster(self) -> ClusterView:
        return ClusterView("c", 1, [Broker(b, "127.0.0.1", 9000 + b, None) for b in (1, 2)])

    async def topics(self, names: Sequence[str] | None) -> Mapping[str, TopicState]:
        self.topic_reads += 1
        if not self.exists:
            return {}
        parts = [
            PartitionState(p, self.leaders[p], self.epoch, [1, 2], [1, 2], []) for p in range(3)
        ]
        return {OFFSETS_TOPIC: TopicState(OFFSETS_TOPIC, parts, internal=True)}

    async def produce(
        self, topic: str, partition: int, records: bytes, acks: int, timeout_ms: int
    ) -> ProduceResult:
        assert topic == OFFSETS_TOPIC and acks == -1
        if self.produce_error:
            self.refused += 1
            return ProduceResult(self.produce_error, -1, -1, -1)
        log = self.logs[partition]
        stamped = bytearray(records)
        rb.set_base_offset(stamped, 0, len(log))
        log.append(bytes(stamped))  # one record per slot: batches here hold one record...
        count = rb.parse_header(records, 0).records_count
        log.extend([b""] * (count - 1))  # ...or pad so that offsets stay list indexes
        return ProduceResult(0, len(log) - count, -1, 0)

    async def fetch(self, topic: str, partition: int, read: PartitionFetch) -> FetchResult:
        log = self.logs[partition]
        data = b"".join(log[read.fetch_offset :])
        return FetchResult(0, len(log), len(log), 0, data)

    async def list_offsets(self, topic: str, partition: int, *args: Any) -> ListOffsetsResult:
        return ListOffsetsResult(0, -1, 0)


class Clock:
    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> int:
        return self.ms


async def loaded(
    backend: LogBackend,
    broker: int = 1,
    clock: Clock | None = None,
    delay_ms: int = 0,
    **options: Any,
) -> Any:
    """A coordinator of broker ``broker`` with every partition it leads loaded (``options``:
    more of GroupCoordinator's keyword arguments)."""
    coordinator = GroupCoordinator(
        backend,
        broker,
        monotonic_ms=clock or Clock(),
        initial_rebalance_delay_ms=delay_ms,
        **options,
    )
    await coordinator._tick()
    owned = list(coordinator._owned.values())
    await asyncio.gather(*(o.loader for o in owned if o.loader is not None))
    return coordinator


async def join(
    coordinator: GroupCoordinator,
    member_id: str = "",
    *,
    group_id: str = GROUP,
    metadata: bytes = b"sub",
    group_instance_id: str | None = None,
) -> JoinResult:
    """A JoinGroup of a "range" consumer (10 s session and rebalance timeouts)."""
    return await coordinator.join_group(
        group_id=group_id,
        member_id=member_id,
        client_id="c",
        client_host="/127.0.0.1",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        protocols=[("range", metadata)],
        require_known_member_id=True,
        group_instance_id=group_instance_id,
    )


TOPIC = "t"
OTHER = "u"
# A group whose __consumer_offsets partition differs from GROUP's.
ELSEWHERE = next(f"g{i}" for i in range(100) if partition_for(f"g{i}", 3) != PARTITION)


class TopicsLogBackend(LogBackend):
    """The in-memory ``__consumer_offsets`` plus two one-partition data topics; while ``gate``
    is set, writes wait for it to open, so that a test can queue requests behind one."""

    gate: asyncio.Event | None = None

    async def produce(self, *args: Any, **kwargs: Any) -> ProduceResult:
        if self.gate is not None:
            await asyncio.wait_for(self.gate.wait(), timeout=5)
        return await super().produce(*args, **kwargs)

    async def topics(self, names: Sequence[str] | None) -> Mapping[str, TopicState]:
        found = dict(await super().topics(names))
        for name in (TOPIC, OTHER):
            found[name] = TopicState(name, [PartitionState(0, 1, 0, [1], [1], [])])
        return {n: s for n, s in found.items() if names is None or n in names}


def offset_commit(
    offsets: Sequence[tuple[str, int]],
    *,
    group_id: str = GROUP,
    member_id: str = "",
    generation: int = -1,
) -> Any:
    """An OffsetCommitRequest of partition 0 of each ``(topic, offset)``."""
    topic = OffsetCommitRequest.OffsetCommitRequestTopic
    return OffsetCommitRequest(
        group_id=group_id,
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        group_instance_id=None,
        topics=[
            topic(
                name=name,
                partitions=[
                    topic.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=offset, committed_leader_epoch=-1
                    )
                ],
            )
            for name, offset in offsets
        ],
    )


def subscription(*topics: str) -> bytes:
    message = ConsumerProtocolSubscription(topics=list(topics), user_data=None)
    return bytes(message.encode(version=0))


async def consumer_join(
    coordinator: GroupCoordinator,
    member_id: str = "",
    *,
    group_id: str = GROUP,
    group_instance_id: str | None = None,
) -> JoinResult:
    """A JoinGroup of a consumer subscribed to TOPIC."""
    return await join(
        coordinator,
        member_id,
        group_id=group_id,
        metadata=subscription(TOPIC),
        group_instance_id=group_instance_id,
    )


async def failover(backend: LogBackend, old: GroupCoordinator) -> GroupCoordinator:
    """Broker 2 takes over every partition and reads the same log back."""
    backend.leaders = dict.fromkeys(backend.leaders, 2)
    backend.epoch += 1
    await old._tick()
    return await loaded(backend, broker=2)


async def roundtrip(
    coordinator: GroupCoordinator, request: Any, version: int, response_class: Any
) -> Any:
    """``request`` answered by the real handler with ``coordinator`` as the context's groups."""
    backend = coordinator._backend
    return await answer(backend, request, version, response_class, groups=coordinator)


def marker(producer_id: int, *, commit: bool, base: int = 0, epoch: int = 0) -> bytes:
    """A transaction's COMMIT or ABORT marker as a partition leader writes it: a control batch
    of the producer whose record's key is version 0 + type (1 COMMIT, 0 ABORT) and whose value
    is version 0 + the coordinator epoch."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    return rb.build_batch(
        [rb.Record(key, struct.pack(">hi", 0, 0), 0)],
        base_offset=base,
        producer_id=producer_id,
        producer_epoch=epoch,
        transactional=True,
        control=True,
    )


async def write_marker(
    backend: LogBackend, partition: int, producer_id: int, *, commit: bool
) -> None:
    """Append ``producer_id``'s marker to ``__consumer_offsets`` partition ``partition``."""
    produced = await backend.produce(
        OFFSETS_TOPIC, partition, marker(producer_id, commit=commit), -1, 0
    )
    assert produced.error_code == 0
