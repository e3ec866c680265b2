"""CreatePartitions (key 37), versions 0-1: grow topics through the active controller.

Versions: librdkafka sends v0, kafka-python the highest both sides know; v2+ are flexible
versions, which the gateway does not speak outside ApiVersions, so 0-1.

- ``count`` is the new total; not more than today is INVALID_PARTITIONS (37), an unknown topic
  UNKNOWN_TOPIC_OR_PARTITION (3), a name given twice INVALID_REQUEST (42), as in Kafka.
- The controller places the new partitions (rack-aware, continuing the topic's placement).
  Manual ``assignments`` are refused with INVALID_REQUEST: the controller cannot take them yet.
- ``validate_only`` checks and changes nothing; ``timeout_ms`` > 0 waits until this broker's
  metadata shows the new partitions (REQUEST_TIMED_OUT otherwise), as CreateTopics does.

Authorization: ALTER on the topic, else TOPIC_AUTHORIZATION_FAILED (29).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, cast

from kafka.protocol.admin import CreatePartitionsResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.backend import AdminBackend, AdminResult
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import AUTHORIZATION_FAILED, RequestContext
from raylog.gateway.protocol import Request

API_KEY = 37

_Result = CreatePartitionsResponse.CreatePartitionsTopicResult


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    backend = cast(AdminBackend, context.backend)
    counts = Counter(topic.name for topic in body.topics)
    firsts = {topic.name: topic for topic in reversed(body.topics)}
    names = list(dict.fromkeys(topic.name for topic in body.topics))
    denied = context.denied_topics(AclOperation.ALTER, names)

    async def grow(topic: Any) -> AdminResult:
        if topic.name in denied:
            return AdminResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED, AUTHORIZATION_FAILED)
        if counts[topic.name] > 1:
            return AdminResult(ErrorCode.INVALID_REQUEST, f"Topic {topic.name!r} appears twice")
        if topic.assignments is not None:
            return AdminResult(
                ErrorCode.INVALID_REQUEST,
                "Manual assignments of new partitions are not supported by raylog yet; "
                "leave them out and the controller places the partitions",
            )
        return await backend.create_partitions(
            topic.name, topic.count, body.validate_only, body.timeout_ms
        )

    results = await asyncio.gather(*(grow(firsts[name]) for name in names))
    return CreatePartitionsResponse(
        throttle_time_ms=0,
        results=[
            _Result(name=name, error_code=r.error_code, error_message=r.message or None)
            for name, r in zip(names, results, strict=True)
        ],
    )
