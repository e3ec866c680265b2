"""OffsetCommit (key 8), versions 2-7: store a group's consumed positions in ``__consumer_offsets``.

The commit is checked against the group's generation and member (``groups.Group
.validate_commit``; generation -1 with no member is a "simple" commit, allowed only while the
group has no members), written with acks=all as OffsetCommit records, and applied once
acknowledged. One error applies to every partition of the request, as in Kafka.
``retention_time_ms`` (v2-4) is ignored: ``offsets.retention.minutes`` decides (v5 dropped the
field). v6 adds each partition's ``committed_leader_epoch``, stored with the offset; v7 a static
member's ``group_instance_id``, and an old member id of a restarted instance gets
FENCED_INSTANCE_ID (82). A partition's metadata string longer than ``offset.metadata.max.bytes``
(4096) gets OFFSET_METADATA_TOO_LARGE (12).

Authorization: READ on the group (else GROUP_AUTHORIZATION_FAILED, 30, on every partition) and on
each topic (else TOPIC_AUTHORIZATION_FAILED, 29, on its partitions; the others are committed).

Offsets an active cross-cluster link mirrors (``actors/control/link_groups.py``) are read-only:
their partitions get INVALID_REQUEST (42) and the others are committed; the broker logs why,
naming the link (the response has no message field). 42 because clients give up on it at once
and tell the application: kafka-python raises InvalidRequestError (not retriable) from a
synchronous commit, librdkafka treats a per-partition error it does not list as permanent
(confluent-kafka's commit() reports it), and Java's consumer raises "Unexpected error in
commit". It is also what a Produce to a mirror topic gets. The retriable codes
(COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR, UNKNOWN_TOPIC_OR_PARTITION ...) would be
retried to the application's deadline, and GROUP_AUTHORIZATION_FAILED or
TOPIC_AUTHORIZATION_FAILED would send the user looking at ACLs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from kafka.protocol.consumer import OffsetCommitResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 8
OFFSET_METADATA_MAX_BYTES = 4096  # offset.metadata.max.bytes

_Topic = OffsetCommitResponse.OffsetCommitResponseTopic
_Partition = _Topic.OffsetCommitResponsePartition


def requested_offsets(
    topics: Iterable[Any], skip: Collection[str] = ()
) -> tuple[dict[tuple[str, int], tuple[int, int, str | None]], set[tuple[str, int]]]:
    """A commit request's (OffsetCommit, TxnOffsetCommit) ``(topic, partition) -> (offset,
    leader_epoch, metadata)`` for the topics not in ``skip``, and the partitions left out
    because their metadata is longer than ``offset.metadata.max.bytes``."""
    too_large: set[tuple[str, int]] = set()
    offsets: dict[tuple[str, int], tuple[int, int, str | None]] = {}
    for topic in topics:
        if topic.name in skip:
            continue
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            metadata = p.committed_metadata
            if metadata is not None and len(metadata.encode("utf-8")) > OFFSET_METADATA_MAX_BYTES:
                too_large.add(tp)
            else:
                offsets[tp] = (p.committed_offset, p.committed_leader_epoch, metadata)
    return offsets, too_large


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    groups = context.groups
    # Kafka's rule: READ on the group, then READ on each topic; partitions of the topics
    # refused are answered TOPIC_AUTHORIZATION_FAILED and the others committed.
    group_denied = not context.authorized_group(AclOperation.READ, body.group_id)
    denied = context.denied_topics(AclOperation.READ, (t.name for t in body.topics))
    mirrored: set[str] = set()
    if groups is not None and not group_denied:
        mirrored = groups.refused_commits(body.group_id, (t.name for t in body.topics)) - denied
    offsets, too_large = requested_offsets(body.topics, denied | mirrored)
    if group_denied:
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    elif groups is None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
    elif not offsets:
        error = ErrorCode.NONE  # nothing left to commit
    else:
        error = await groups.commit_offsets(
            body.group_id,
            body.member_id,
            body.generation_id_or_member_epoch,
            offsets,
            body.group_instance_id,
        )
    return OffsetCommitResponse(
        throttle_time_ms=0,
        topics=[
            _Topic(
                name=topic.name,
                partitions=[
                    _Partition(
                        partition_index=p.partition_index,
                        error_code=error
                        if group_denied
                        else ErrorCode.TOPIC_AUTHORIZATION_FAILED
                        if topic.name in denied
                        else ErrorCode.INVALID_REQUEST
                        if topic.name in mirrored
                        else ErrorCode.OFFSET_METADATA_TOO_LARGE
                        if (topic.name, p.partition_index) in too_large
                        else error,
                    )
                    for p in topic.partitions
                ],
            )
            for topic in body.topics
        ],
    )
