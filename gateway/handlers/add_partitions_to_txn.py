"""AddPartitionsToTxn (key 24), versions 0-3: a producer names the partitions its open
transaction writes to, before it writes to them.

The transaction coordinator of the transactional id answers (``gateway/transactions``);
one error applies to every partition, as Kafka's coordinator answers. Versions 4+ (KIP-890's
batched form that brokers send one another) are not offered: kafka-python reads a table
offering v4 as a Kafka 3.6 broker.

Authorization: WRITE on the transactional id, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53)
on every partition; WRITE on each topic, else TOPIC_AUTHORIZATION_FAILED (29) on its
partitions. A partition of an unknown topic gets UNKNOWN_TOPIC_OR_PARTITION (3). When any
partition is refused, the others get OPERATION_NOT_ATTEMPTED (55) and nothing is added.
PRODUCER_FENCED is INVALID_PRODUCER_EPOCH (47) below v2 (KIP-588).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import AddPartitionsToTxnResponse

from raylog.actors.control.acls import AclOperation, ResourceType
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request
from raylog.gateway.transactions.state import fencing_error

API_KEY = 24

_Topic = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
_Partition = _Topic.AddPartitionsToTxnPartitionResult


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    transactional_id = body.v3_and_below_transactional_id
    wanted = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
    errors: dict[tuple[str, int], int] = {}
    if not context.authorized(
        AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id or ""
    ):
        return _response(wanted, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, {})
    denied = context.denied_topics(AclOperation.WRITE, (t for t, _ in wanted))
    known = await context.backend.topics(sorted({t for t, _ in wanted} - denied))
    for topic, partition in wanted:
        if topic in denied:
            errors[(topic, partition)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif topic not in known or not 0 <= partition < len(known[topic].partitions):
            errors[(topic, partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if errors:
        return _response(wanted, ErrorCode.OPERATION_NOT_ATTEMPTED, errors)
    coordinator = context.transactions
    if coordinator is None:
        return _response(wanted, ErrorCode.COORDINATOR_NOT_AVAILABLE, {})
    error = await coordinator.add_partitions(
        transactional_id, body.v3_and_below_producer_id, body.v3_and_below_producer_epoch, wanted
    )
    return _response(wanted, fencing_error(API_KEY, request.api_version, error), {})


def _response(wanted: list[tuple[str, int]], error: int, errors: dict[tuple[str, int], int]) -> Any:
    by_topic: dict[str, list[Any]] = {}
    for topic, partition in wanted:
        code = errors.get((topic, partition), error)
        by_topic.setdefault(topic, []).append(
            _Partition(partition_index=partition, partition_error_code=code)
        )
    return AddPartitionsToTxnResponse(
        throttle_time_ms=0,
        results_by_topic_v3_and_below=[
            _Topic(name=topic, results_by_partition=parts) for topic, parts in by_topic.items()
        ],
    )
