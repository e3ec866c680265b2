"""TxnOffsetCommit (key 28), versions 0-3: a transactional producer's consumed offsets, committed
with its transaction (KIP-98; KIP-447 for v3).

The offsets go to the group's coordinator (``groups.GroupCoordinator
.commit_transactional_offsets``), which writes them as one transactional batch of the producer
and keeps them pending until the transaction's COMMIT or ABORT marker. v0-2 name no member: the
group is not checked (an unknown one is created Empty); v3 names the member, its generation and
a static member's ``group_instance_id``, checked as OffsetCommit's are but also during a
rebalance (ILLEGAL_GENERATION 22, UNKNOWN_MEMBER_ID 25, FENCED_INSTANCE_ID 82). v2 adds each
partition's ``committed_leader_epoch``. Every error is per partition (the response has no
other): a partition of a topic the cluster does not have gets UNKNOWN_TOPIC_OR_PARTITION (3),
a metadata string over ``offset.metadata.max.bytes`` OFFSET_METADATA_TOO_LARGE (12).
Whether the transaction coordinator added the group to the transaction (AddOffsetsToTxn) is not
checked here.

Authorization, as Kafka's KafkaApis.handleTxnOffsetCommit: WRITE on the transactional id (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 53, on every partition), READ on the group (else
GROUP_AUTHORIZATION_FAILED, 30, on every partition), READ on each topic (else
TOPIC_AUTHORIZATION_FAILED, 29, on its partitions; the others are committed).

Offsets an active cross-cluster link mirrors get INVALID_REQUEST (42) on their partitions, as
in OffsetCommit (whose docstring says why that code); the others are committed.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import TxnOffsetCommitResponse

from raylog.actors.control.acls import AclOperation, ResourceType
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.handlers.offset_commit import requested_offsets
from raylog.gateway.protocol import Request

API_KEY = 28

_Topic = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
_Partition = _Topic.TxnOffsetCommitResponsePartition


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    asked = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
    txn_id = body.transactional_id
    if not context.authorized(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id):
        return _answer(body, {}, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not context.authorized_group(AclOperation.READ, body.group_id):
        return _answer(body, {}, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    groups = context.groups
    if groups is None:
        return _answer(body, {}, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    denied = context.denied_topics(AclOperation.READ, (topic for topic, _ in asked))
    known = await context.backend.topics(sorted({topic for topic, _ in asked} - denied))
    exists = {(name, p.partition) for name, state in known.items() for p in state.partitions}
    errors = {tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED for tp in asked if tp[0] in denied}
    errors |= {
        tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        for tp in asked
        if tp not in exists and tp not in errors
    }
    mirrored = groups.refused_commits(body.group_id, (topic for topic, _ in asked)) - denied
    errors |= {
        tp: ErrorCode.INVALID_REQUEST for tp in asked if tp[0] in mirrored and tp not in errors
    }
    offsets, too_large = requested_offsets(body.topics, denied | mirrored)
    errors |= dict.fromkeys(too_large - errors.keys(), ErrorCode.OFFSET_METADATA_TOO_LARGE)
    offsets = {tp: offset for tp, offset in offsets.items() if tp not in errors}
    if not offsets:
        return _answer(body, errors, ErrorCode.NONE)
    error, committed = await groups.commit_transactional_offsets(
        group_id=body.group_id,
        producer_id=body.producer_id,
        producer_epoch=body.producer_epoch,
        member_id=body.member_id,
        generation_id=body.generation_id,
        group_instance_id=body.group_instance_id,
        offsets=offsets,
    )
    return _answer(body, {**committed, **errors}, error)


def _answer(body: Any, errors: dict[tuple[str, int], int], default: int) -> Any:
    """Each partition of the request with its error in ``errors``, else ``default``."""
    return TxnOffsetCommitResponse(
        throttle_time_ms=0,
        topics=[
            _Topic(
                name=topic.name,
                partitions=[
                    _Partition(
                        partition_index=p.partition_index,
                        error_code=errors.get((topic.name, p.partition_index), default),
                    )
                    for p in topic.partitions
                ],
            )
            for topic in body.topics
        ],
    )
