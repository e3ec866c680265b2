"""OffsetDelete (key 47), version 0: delete a group's committed offsets of some partitions.

Asked of the group's coordinator. A partition of a topic this cluster does not have gets
UNKNOWN_TOPIC_OR_PARTITION (3). An Empty group loses the offsets asked for; a "consumer" group
with members loses those of topics no member subscribes to, and the others get
GROUP_SUBSCRIBED_TO_TOPIC (86); any other group with members gets NON_EMPTY_GROUP (68), an
unknown one GROUP_ID_NOT_FOUND (69). A group-level error answers with no topics, as Kafka does.
Deleted offsets are tombstoned in ``__consumer_offsets``; an Empty group left without offsets is
deleted with them.

Authorization: DELETE on the group (else GROUP_AUTHORIZATION_FAILED, 30) and READ on each topic
(else TOPIC_AUTHORIZATION_FAILED, 29, on its partitions).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import OffsetDeleteResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 47

_Topic = OffsetDeleteResponse.OffsetDeleteResponseTopic
_Partition = _Topic.OffsetDeleteResponsePartition


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    asked = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
    # Kafka's rule: DELETE on the group, READ on each topic.
    if not context.authorized_group(AclOperation.DELETE, body.group_id):
        return _answer(ErrorCode.GROUP_AUTHORIZATION_FAILED, {})
    denied = context.denied_topics(AclOperation.READ, (topic for topic, _ in asked))
    if context.groups is None:
        return _answer(ErrorCode.COORDINATOR_NOT_AVAILABLE, {})
    known = await context.backend.topics(sorted({topic for topic, _ in asked}))
    errors: dict[tuple[str, int], int] = {}
    for topic, partition in asked:
        state = known.get(topic)
        if topic in denied:
            errors[(topic, partition)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif state is None or all(p.partition != partition for p in state.partitions):
            errors[(topic, partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    deletable = [tp for tp in asked if tp not in errors]
    error, deleted = await context.groups.delete_offsets(body.group_id, deletable)
    if error:
        return _answer(error, {})
    return _answer(ErrorCode.NONE, {**deleted, **errors})


def _answer(error: int, partitions: dict[tuple[str, int], int]) -> Any:
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), code in partitions.items():
        by_topic.setdefault(topic, []).append(
            _Partition(partition_index=partition, error_code=code)
        )
    return OffsetDeleteResponse(
        error_code=error,
        throttle_time_ms=0,
        topics=[_Topic(name=name, partitions=parts) for name, parts in by_topic.items()],
    )
