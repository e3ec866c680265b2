"""OffsetFetch (key 9), versions 1-3: a group's committed offsets.

``topics`` None (v2+) asks for every offset the group has. A partition without a committed
offset gets offset -1 and no error, as does every partition of a group never seen. A coordinator
error (14, 15, 16) is the top-level ``error_code`` from v2, and each partition's before.

Authorization (Kafka's): DESCRIBE on the group (else GROUP_AUTHORIZATION_FAILED, 30) and on each
topic: TOPIC_AUTHORIZATION_FAILED (29) on the partitions asked for, such topics left out of
every offset.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import OffsetFetchResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 9

_Topic = OffsetFetchResponse.OffsetFetchResponseTopic
_Partition = _Topic.OffsetFetchResponsePartition


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    groups = context.groups
    asked = (
        None
        if body.topics is None
        else [(t.name, index) for t in body.topics for index in t.partition_indexes]
    )
    # Kafka's rule: DESCRIBE on the group, then on each topic: the partitions asked for of a
    # topic refused are TOPIC_AUTHORIZATION_FAILED; such topics are left out of "every offset".
    denied = context.denied_topics(AclOperation.DESCRIBE, (tp[0] for tp in asked or ()))
    if not context.authorized_group(AclOperation.DESCRIBE, body.group_id):
        error, offsets = ErrorCode.GROUP_AUTHORIZATION_FAILED, {}
        denied = set()
    elif groups is None:
        error, offsets = ErrorCode.COORDINATOR_NOT_AVAILABLE, {}
    else:
        allowed = None if asked is None else [tp for tp in asked if tp[0] not in denied]
        result = await groups.fetch_offsets(body.group_id, allowed)
        error, offsets = result.error_code, result.offsets
        if asked is None:
            hidden = context.denied_topics(AclOperation.DESCRIBE, (tp[0] for tp in offsets))
            offsets = {tp: c for tp, c in offsets.items() if tp[0] not in hidden}
    if error:
        # The error goes on every partition asked for (v1 has no top-level error code).
        offsets = dict.fromkeys(asked or (), None)
    else:
        offsets = {tp: offsets.get(tp) for tp in asked} if asked is not None else offsets
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), committed in offsets.items():
        by_topic.setdefault(topic, []).append(
            _Partition(
                partition_index=partition,
                committed_offset=committed.offset if committed else -1,
                metadata=committed.metadata if committed else "",
                error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED if topic in denied else error,
            )
        )
    return OffsetFetchResponse(
        throttle_time_ms=0,
        topics=[_Topic(name=name, partitions=parts) for name, parts in by_topic.items()],
        error_code=error,
    )
