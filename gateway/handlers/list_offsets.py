"""ListOffsets (key 2), versions 1-9: offsets by time, for seeks, consumer lag and tiering.

This module owns the request's shape; each partition is answered by its leader replica through
the backend, concurrently, with its own error code (3 unknown, 6 not the leader here, 56 storage,
74/79 a fenced or unknown ``current_leader_epoch``, ...). What each ``timestamp`` means is the
replica's (``actors/replica_offsets.py``): -2 earliest, -1 latest (the high watermark, or the
last stable offset for read_committed), -3 the record with the largest timestamp (v7+,
KIP-734), -4 the local log start (v8+, KIP-405), -5 the last offset in the object store (v9+,
KIP-1005), else the first record at or after that time. A special timestamp below the version
that introduced it gets UNSUPPORTED_VERSION (35), as Kafka refuses it (clients never send one).

Versions: v2 adds isolation_level, v4 the request's ``current_leader_epoch`` (fencing, KIP-320)
and the answer's ``leader_epoch`` (the epoch of the batch holding the offset: what a consumer
validates its position with), v6 is flexible. v10's ``timeout_ms`` (KIP-1075) is not
advertised.

Authorization: DESCRIBE on the topic, else TOPIC_AUTHORIZATION_FAILED (29) on its partitions.
"""

from __future__ import annotations

from typing import Any, cast

from kafka.protocol.consumer import ListOffsetsResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.backend import READ_UNCOMMITTED, DataBackend, ListOffsetsResult
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext, per_partition
from raylog.gateway.protocol import Request

API_KEY = 2

# The special timestamps with the version that introduced each (below it: UNSUPPORTED_VERSION).
SINCE_VERSION = {-3: 7, -4: 8, -5: 9}

_Topic = ListOffsetsResponse.ListOffsetsTopicResponse
_Partition = _Topic.ListOffsetsPartitionResponse


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    version = request.api_version
    backend = cast(DataBackend, context.backend)
    # isolation_level exists from v2; v1 reads as read_uncommitted.
    isolation = body.isolation_level if version >= 2 else READ_UNCOMMITTED

    async def one(name: str, p: Any) -> ListOffsetsResult:
        if version < SINCE_VERSION.get(p.timestamp, 0):
            return ListOffsetsResult(ErrorCode.UNSUPPORTED_VERSION, -1, -1)
        epoch = p.current_leader_epoch if version >= 4 else -1
        return await backend.list_offsets(name, p.partition_index, p.timestamp, isolation, epoch)

    answered = await per_partition(
        body.topics,
        one,
        context.denied_topics(AclOperation.DESCRIBE, (t.name for t in body.topics)),
        ListOffsetsResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1, -1),
    )
    topics = [
        _Topic(
            name=topic.name,
            partitions=[
                _Partition(
                    partition_index=p.partition_index,
                    error_code=result.error_code,
                    timestamp=result.timestamp,
                    offset=result.offset,
                    leader_epoch=result.leader_epoch,
                )
                for p, result in partitions
            ],
        )
        for topic, partitions in answered
    ]
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)
