"""Metadata (key 3), versions 1-5: brokers, controller, cluster id, topics and partitions.

Kafka's rules kept here:

- A null topic list asks for every topic; an empty list for none (v1+).
- A topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION (3) with no partitions, unless
  auto-creation is allowed: by the broker config ``auto.create.topics.enable`` (raylog's
  default false, see ``config_keys``) AND by the request (``allow_auto_topic_creation``, v4+;
  before v4 Kafka always allows it). Then the topic is created with the broker defaults
  ``num.partitions`` and ``default.replication.factor`` and answered as Kafka answers it:
  LEADER_NOT_AVAILABLE (5) with no partitions, so the client asks again (the creation returns
  once the controller committed it; it does not wait for replicas). A name Kafka could never
  create is INVALID_TOPIC_EXCEPTION (17); another failure is its own code (e.g.
  INVALID_REPLICATION_FACTOR when fewer brokers are up than the default needs).
- A partition without a live leader is LEADER_NOT_AVAILABLE (5) with leader -1, never another
  code: kafkajs throws a whole Metadata refresh away for any other partition error. A leader that
  is not among the live brokers counts as none, since the client could not reach it anyway.

Authorization (Kafka's): topics without DESCRIBE are left out of an all-topics answer and
answered TOPIC_AUTHORIZATION_FAILED (29) when named, existing or not; auto-creation needs CREATE
on the cluster or the topic (29 otherwise).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from kafka.protocol.metadata import MetadataResponse

from raylog.actors.control import config_keys
from raylog.actors.control.acls import AclOperation
from raylog.gateway.backend import AdminBackend, NewTopic, TopicState
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 3

log = logging.getLogger(__name__)

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
    # Kafka's rule: a topic the client may not DESCRIBE is left out of an all-topics answer,
    # and answered TOPIC_AUTHORIZATION_FAILED (existing or not) when named.
    denied = context.denied_topics(AclOperation.DESCRIBE, requested or found)
    names = requested if requested is not None else sorted(set(found) - denied)
    missing = [name for name in names if name not in found and name not in denied]
    allowed = getattr(body, "allow_auto_topic_creation", True)  # v4+; always true before
    created = await _auto_create(context, missing) if missing and allowed else {}
    created.update(dict.fromkeys(denied, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
    topics = []
    for name in names:
        state = None if name in denied else found.get(name)
        if state is None:
            topics.append(
                _Topic(
                    error_code=created.get(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
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
            _Broker(node_id=b.node_id, host=address[0], port=address[1], rack=b.rack)
            for b in cluster.brokers
            if (address := b.address(context.listener)) is not None
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


async def _auto_create(context: RequestContext, names: Sequence[str]) -> dict[str, int]:
    """Create ``names`` if the broker allows it; the Metadata error code of each attempt. The
    client needs CREATE on the cluster or on the topic (TOPIC_AUTHORIZATION_FAILED)."""
    backend = context.backend
    if not isinstance(backend, AdminBackend):
        return {}
    _, overrides = await backend.broker_configs()
    defaults = config_keys.broker_config(overrides)
    if not defaults.auto_create_topics_enable:
        return {}

    async def create(name: str) -> int:
        if not context.authorized_create_topic(name):
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED
        result = await backend.create_topic(
            NewTopic(name, defaults.num_partitions, defaults.default_replication_factor),
            validate_only=False,
            timeout_ms=0,  # answer once committed: the client asks again on 5
        )
        if result.error_code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
            return ErrorCode.LEADER_NOT_AVAILABLE
        log.info("auto-creating topic %r failed: %d %s", name, result.error_code, result.message)
        return result.error_code

    codes = await asyncio.gather(*(create(name) for name in names))
    return dict(zip(names, codes, strict=True))
