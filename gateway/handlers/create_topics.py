"""CreateTopics (key 19), versions 2-4: new topics through the active controller.

Kafka's rules kept here (``ZkAdminManager`` / ``ReplicationControlManager``):

- ``num_partitions`` / ``replication_factor`` of -1 take the broker defaults ``num.partitions``
  / ``default.replication.factor`` (KIP-464; clients send -1 from v4).
- Manual ``assignments`` are taken as given, and then both counts must be -1; partitions must
  be numbered 0..n-1 (INVALID_REPLICA_ASSIGNMENT otherwise), and the controller checks the
  brokers (unregistered, repeated, unequal lengths: INVALID_REPLICA_ASSIGNMENT, 39).
- A name that appears twice in one request gets INVALID_REQUEST (42) and is not created.
- Config values may not be null (INVALID_CONFIG, 40); keys and values are checked by the
  controller against ``config_keys`` (INVALID_CONFIG with a message naming the key).
- Everything else is the controller's verdict: TOPIC_ALREADY_EXISTS (36), INVALID_PARTITIONS
  (37), INVALID_REPLICATION_FACTOR (38), INVALID_TOPIC_EXCEPTION (17), each with a message.
- ``validate_only`` runs every check and creates nothing. ``timeout_ms`` > 0: the answer waits
  until every partition has a leader that serves and the topic is in this broker's metadata
  (REQUEST_TIMED_OUT if not in time, though the topic was created and goes on being created);
  0 or less: it comes once the controller committed the topic.

Topics in one request are created concurrently; the controller serialises its writes.

Authorization: CREATE on the cluster or the topic, else TOPIC_AUTHORIZATION_FAILED (29).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, cast

from kafka.protocol.admin import CreateTopicsResponse

from raylog.actors.control import config_keys
from raylog.gateway.backend import AdminBackend, AdminResult, NewTopic
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import AUTHORIZATION_FAILED, RequestContext
from raylog.gateway.protocol import Request

API_KEY = 19

USE_DEFAULT = -1  # NumPartitions / ReplicationFactor: the broker's default (KIP-464)

_Result = CreateTopicsResponse.CreatableTopicResult


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    backend = cast(AdminBackend, context.backend)
    _, overrides = await backend.broker_configs()
    defaults = config_keys.broker_config(overrides)
    counts = Counter(topic.name for topic in body.topics)
    firsts = {topic.name: topic for topic in reversed(body.topics)}  # one entry per name

    async def create(topic: Any) -> AdminResult:
        if not context.authorized_create_topic(topic.name):
            return AdminResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED, AUTHORIZATION_FAILED)
        if counts[topic.name] > 1:
            return AdminResult(
                ErrorCode.INVALID_REQUEST,
                f"Topic {topic.name!r} appears {counts[topic.name]} times in the request",
            )
        return await _create(backend, defaults, topic, body.validate_only, body.timeout_ms)

    names = list(dict.fromkeys(topic.name for topic in body.topics))
    results = await asyncio.gather(*(create(firsts[name]) for name in names))
    return CreateTopicsResponse(
        throttle_time_ms=0,
        topics=[
            _Result(name=name, error_code=r.error_code, error_message=r.message or None)
            for name, r in zip(names, results, strict=True)
        ],
    )


async def _create(
    backend: AdminBackend,
    defaults: config_keys.BrokerConfig,
    topic: Any,
    validate_only: bool,
    timeout_ms: int,
) -> AdminResult:
    nulls = sorted(c.name for c in topic.configs if c.value is None)
    if nulls:
        return AdminResult(
            ErrorCode.INVALID_CONFIG, f"Null value not supported for topic configs: {nulls}"
        )
    configs = {c.name: c.value for c in topic.configs}
    num_partitions, replication_factor = topic.num_partitions, topic.replication_factor
    assignment = None
    if topic.assignments:
        if num_partitions != USE_DEFAULT or replication_factor != USE_DEFAULT:
            return AdminResult(
                ErrorCode.INVALID_REQUEST,
                "Both numPartitions or replicationFactor and replicasAssignments were set. "
                "Both cannot be used at the same time.",
            )
        ordered = sorted(topic.assignments, key=lambda a: a.partition_index)
        indexes = [a.partition_index for a in ordered]
        if indexes != list(range(len(ordered))):
            return AdminResult(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"Partitions of the replica assignment must be 0..n-1 once each, got {indexes}",
            )
        assignment = [list(a.broker_ids) for a in ordered]
        num_partitions, replication_factor = len(assignment), len(assignment[0])
    if num_partitions == USE_DEFAULT:
        num_partitions = defaults.num_partitions
    if replication_factor == USE_DEFAULT:
        replication_factor = defaults.default_replication_factor
    new = NewTopic(topic.name, num_partitions, replication_factor, assignment, configs)
    return await backend.create_topic(new, validate_only, timeout_ms)
