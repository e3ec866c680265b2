"""DeleteTopics (key 20), versions 1-3: topics removed through the active controller.

A topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION (3); a name given twice in one request
is INVALID_REQUEST (42) and is not deleted (Kafka's rule). With ``timeout_ms`` > 0 the answer
waits until this broker's metadata no longer lists the topic (REQUEST_TIMED_OUT if it still
does in time, though deletion goes on); with 0 it comes once the controller committed it. The
brokers stop the topic's replicas and remove their data on the controller's next round. These
versions carry no error message; the backend's message is logged instead.

Authorization: DELETE on the topic, else TOPIC_AUTHORIZATION_FAILED (29).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, cast

from kafka.protocol.admin import DeleteTopicsResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.backend import AdminBackend, AdminResult
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import AUTHORIZATION_FAILED, RequestContext
from raylog.gateway.protocol import Request

API_KEY = 20

log = logging.getLogger(__name__)

_Result = DeleteTopicsResponse.DeletableTopicResult


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    backend = cast(AdminBackend, context.backend)
    counts = Counter(body.topic_names)
    names = list(dict.fromkeys(body.topic_names))
    denied = context.denied_topics(AclOperation.DELETE, names)

    async def delete(name: str) -> AdminResult:
        if name in denied:
            return AdminResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED, AUTHORIZATION_FAILED)
        if counts[name] > 1:
            return AdminResult(ErrorCode.INVALID_REQUEST, f"Topic {name!r} appears twice")
        return await backend.delete_topic(name, body.timeout_ms)

    results = await asyncio.gather(*(delete(name) for name in names))
    for name, r in zip(names, results, strict=True):
        if r.error_code:
            log.info("DeleteTopics %s from %s: %d %s", name, context.peer, r.error_code, r.message)
    return DeleteTopicsResponse(
        throttle_time_ms=0,
        responses=[
            _Result(name=name, error_code=r.error_code, error_message=r.message or None)
            for name, r in zip(names, results, strict=True)
        ],
    )
