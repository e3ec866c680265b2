"""ListOffsets (key 2), versions 1-3: offsets by time, for seeks and consumer lag.

This module owns the request's shape; each partition is answered by its leader replica through
the backend, concurrently, with its own error code (3 unknown, 6 not the leader here, 56 storage,
...). Kafka's meanings of ``timestamp``:

- -2 (earliest): the log start offset;
- -1 (latest): the last fetchable offset, the high watermark for read_uncommitted and the last
  stable offset for read_committed (v2+; equal while raylog has no transactions);
- otherwise: the offset of the first record whose timestamp is >= ``timestamp``, with that
  record's timestamp, or (-1, -1) when no committed record is that late. As in Kafka, the leader
  finds the first batch whose maxTimestamp is late enough, then reads its records.

The answer's timestamp is -1 for -1 and -2, as Kafka's is.

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

_Topic = ListOffsetsResponse.ListOffsetsTopicResponse
_Partition = _Topic.ListOffsetsPartitionResponse


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    backend = cast(DataBackend, context.backend)
    # isolation_level exists from v2; v1 reads as read_uncommitted.
    isolation = body.isolation_level if request.api_version >= 2 else READ_UNCOMMITTED
    answered = await per_partition(
        body.topics,
        lambda name, p: backend.list_offsets(name, p.partition_index, p.timestamp, isolation, -1),
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
                )
                for p, result in partitions
            ],
        )
        for topic, partitions in answered
    ]
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)
