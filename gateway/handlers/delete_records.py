"""DeleteRecords (key 21), versions 0-2: move partitions' log start offsets up
(``AdminClient.delete_records``, ``kafka-delete-records.sh``).

Versions: v1 is v0 with throttling after the answer; v2, Kafka's newest, is v1 in the flexible
encoding (compact strings and arrays, tagged fields), which the codec derives from the spec.
kafka-python's ``delete_records`` sends v2; tests/test_delete_records_live.py drives it and
confluent-kafka's.

Each partition is answered by its leader replica through the backend, concurrently, with its own
error code, as Kafka's ReplicaManager.deleteRecords does: UNKNOWN_TOPIC_OR_PARTITION (3) for a
partition the metadata does not hold, NOT_LEADER_OR_FOLLOWER (6) when this broker does not lead
it, POLICY_VIOLATION (44) when the topic's cleanup.policy lacks delete, OFFSET_OUT_OF_RANGE (1)
for an offset above the high watermark or negative other than -1 (the high watermark), and
REQUEST_TIMED_OUT (7) when the in-sync replicas did not all move their log start within
``timeout_ms``. On success ``low_watermark`` is the partition's new low watermark.

Authorization: DELETE on the topic, else TOPIC_AUTHORIZATION_FAILED (29) on its partitions.
"""

from __future__ import annotations

from typing import Any, cast

from kafka.protocol.admin import DeleteRecordsResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.backend import DataBackend, DeleteRecordsResult
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext, per_partition
from raylog.gateway.protocol import Request

API_KEY = 21

_Topic = DeleteRecordsResponse.DeleteRecordsTopicResult
_Partition = _Topic.DeleteRecordsPartitionResult


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    backend = cast(DataBackend, context.backend)
    answered = await per_partition(
        body.topics,
        lambda name, p: backend.delete_records(name, p.partition_index, p.offset, body.timeout_ms),
        context.denied_topics(AclOperation.DELETE, (t.name for t in body.topics)),
        DeleteRecordsResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1),
    )
    topics = [
        _Topic(
            name=topic.name,
            partitions=[
                _Partition(
                    partition_index=p.partition_index,
                    low_watermark=result.low_watermark,
                    error_code=result.error_code,
                )
                for p, result in partitions
            ],
        )
        for topic, partitions in answered
    ]
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)
