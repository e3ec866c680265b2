"""What tests of the link fetchers (``gateway/links/mirrors.py``) share: a source cluster that
is a live gateway over ``InMemoryLogBackend``, the destination metadata naming a link to it,
and the comparison of the source's batches with the mirror's.

- ``source_topics(epoch)``: topic ``orders`` (``PARTITIONS`` partitions, led by brokers 1..3
  at leader epoch ``epoch``).
- ``mirror_metadata(bootstrap, epochs, configs)``: the destination's ``ClusterMetadata``: link
  ``LINK`` to ``bootstrap`` with ``configs``, and ``orders`` mirroring it, every partition
  led by broker 1 at its epoch in ``epochs`` (default ``DEST_EPOCH``).
- ``on_source(gateway, fn, *args)``: run ``fn`` on the source gateway's event loop (its
  backend is not thread-safe) from another loop.
- ``source_batch(tag, n)``: one record batch of ``n`` records as kafka-python builds them.
- ``mirror_matches(backend, leaders, partition)``: whether the mirror holds exactly the
  source's batches, byte for byte at their offsets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kafka.record import default_records as kdr

from raylog.actors.control.links import ClusterLink, MirrorInfo
from raylog.actors.control.metadata import ClusterMetadata, PartitionState, TopicMetadata
from raylog.gateway.backend import PartitionState as SourcePartition
from raylog.gateway.backend import TopicState
from support.gateway import InMemoryLogBackend, LiveGateway
from support.kafka_batches import kafka_batch
from support.mirror_replica import MirrorLeaders, unstamped

T = TypeVar("T")
LINK = "east"
TOPIC = "orders"
PARTITIONS = 3
DEST_EPOCH = 3
BROKER = 1  # the destination broker whose gateway runs the fetchers


def source_topics(epoch: int = 4, leader: int | None = None) -> dict[str, TopicState]:
    return {
        TOPIC: TopicState(
            TOPIC,
            [
                SourcePartition(
                    p,
                    leader=leader if leader is not None else 1 + p % 3,
                    leader_epoch=epoch,
                    replicas=[1, 2, 3],
                    isr=[1, 2, 3],
                    offline_replicas=[],
                )
                for p in range(PARTITIONS)
            ],
        )
    }


def mirror_metadata(
    bootstrap: str,
    epochs: Mapping[int, int] | None = None,
    configs: Mapping[str, str] | None = None,
) -> ClusterMetadata:
    link = ClusterLink(
        name=LINK,
        link_id="id-east",
        bootstrap=(bootstrap,),
        topics_regex="orders.*",
        configs=dict(configs or {}),
    )
    partitions = tuple(
        PartitionState(
            partition=p,
            replicas=(BROKER,),
            isr=(BROKER,),
            leader=BROKER,
            leader_epoch=(epochs or {}).get(p, DEST_EPOCH),
        )
        for p in range(PARTITIONS)
    )
    topic = TopicMetadata(
        name=TOPIC, topic_id="id-orders", partitions=partitions, mirror=MirrorInfo(link=LINK)
    )
    return ClusterMetadata(cluster_id="dest", topics={TOPIC: topic}, links={LINK: link})


async def on_source(gateway: LiveGateway, fn: Callable[..., T], *args: Any) -> T:
    async def call() -> T:
        return fn(*args)

    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), gateway.loop))


def source_batch(tag: str, n: int = 4, size: int = 40) -> bytes:
    records = [
        {
            "key": f"{tag}-k{i}".encode(),
            "value": f"{tag}-v{i}|".encode() * size,
            "timestamp": 1_700_000_000_000 + i,
            "headers": [("seq", str(i).encode())],
        }
        for i in range(n)
    ]
    return kafka_batch(records, kdr.DefaultRecordBatch.CODEC_NONE)


def source_log(backend: InMemoryLogBackend, partition: int) -> list[tuple[int, bytes]]:
    return [(base, unstamped(b)) for base, b in backend.logs.get((TOPIC, partition), [])]


def mirror_matches(backend: InMemoryLogBackend, leaders: MirrorLeaders, partition: int) -> bool:
    """The mirror's batches are the source's, byte for byte at the same offsets (the
    partition-leader-epoch field aside: the mirror restamps it)."""
    mirrored = leaders.records(TOPIC, partition)
    source = source_log(backend, partition)
    return bool(source) and mirrored == source
