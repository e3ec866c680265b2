"""Metadata (key 3), versions 1-5: brokers, controller, cluster id, topics and partitions.

Kafka's rules kept here:

- A null topic list asks for every topic; an empty list for none (v1+).
- A topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION (3) with no partitions. raylog never
  creates topics from Metadata, whatever ``allow_auto_topic_creation`` says (v4+).
- A partition without a live leader is LEADER_NOT_AVAILABLE (5) with leader -1, never another
  code: kafkajs throws a whole Metadata refresh away for any other partition error. A leader that
  is not among the live brokers counts as none, since the client could not reach it anyway.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.metadata import MetadataResponse

from raylog.gateway.backend import TopicState
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 3

_Broker = MetadataResponse.MetadataResponseBroker
_Topic = MetadataResponse.MetadataResponseTopic
_Partition = _Topic.MetadataResponsePartition


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    requested: list[str] | None = None
    if body.topics is not None:
        # dict.fromkeys: drop repeated names but keep the client's order.
        requested = list(dict.fromkeys(topic.name for topic in body.topics))
    cluster = await context.backend.cluster()
    found = await context.backend.topics(requested) if requested != [] else {}
    live = {broker.node_id for broker in cluster.brokers}
    names = requested if requested is not None else sorted(found)
    topics = []
    for name in names:
        state = found.get(name)
        if state is None:
            topics.append(
                _Topic(
                    error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    name=name,
                    is_internal=False,
                    partitions=[],
                )
            )
        else:
            topics.append(_topic(state, live))
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[
            _Broker(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
            for b in cluster.brokers
        ],
        cluster_id=cluster.cluster_id,
        controller_id=cluster.controller_id,
        topics=topics,
    )


def _topic(state: TopicState, live: set[int]) -> Any:
    partitions = []
    for p in state.partitions:
        has_leader = p.leader >= 0 and p.leader in live
        partitions.append(
            _Partition(
                error_code=ErrorCode.NONE if has_leader else ErrorCode.LEADER_NOT_AVAILABLE,
                partition_index=p.partition,
                leader_id=p.leader if has_leader else -1,
                leader_epoch=p.leader_epoch,
                replica_nodes=list(p.replicas),
                isr_nodes=list(p.isr),
                offline_replicas=list(p.offline_replicas),
            )
        )
    return _Topic(
        error_code=ErrorCode.NONE,
        name=state.name,
        is_internal=state.internal,
        partitions=partitions,
    )
