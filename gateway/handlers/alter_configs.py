"""AlterConfigs (key 33), versions 0-1: replace a topic's whole set of config overrides.

Kafka's legacy AlterConfigs is not a patch: the configs in the request become the topic's
overrides, and every key left out goes back to its default. Keys and values are checked by the
controller against ``config_keys`` (INVALID_CONFIG, 40, with a message naming the key); an
unknown topic is UNKNOWN_TOPIC_OR_PARTITION (3); a null value is INVALID_REQUEST (42), as in
Kafka. ``validate_only`` checks and changes nothing.

Broker resources are refused with INVALID_REQUEST: raylog's broker configs are static (set when
the cluster starts). Other resource types, and a resource named twice, are INVALID_REQUEST too.

Authorization (both AlterConfigs APIs): ALTER_CONFIGS on the topic (TOPIC_AUTHORIZATION_FAILED,
29) or, for a broker, on the cluster (CLUSTER_AUTHORIZATION_FAILED, 31).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, cast

from kafka.protocol.admin import AlterConfigsResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.backend import AdminBackend, AdminResult
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import AUTHORIZATION_FAILED, RequestContext
from raylog.gateway.handlers.describe_configs import (
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    config_refusal,
)
from raylog.gateway.protocol import Request

API_KEY = 33

STATIC_BROKER_CONFIGS = (
    "raylog's broker configs are static: they are set when the cluster starts and cannot be altered"
)

# Alters one topic resource of a request: (backend, resource, validate_only) -> the result.
AlterTopic = Callable[[AdminBackend, Any, bool], Awaitable[AdminResult]]


async def handle(context: RequestContext, request: Request) -> Any:
    return await alter_each(context, request, AlterConfigsResponse, _alter)


async def alter_each(
    context: RequestContext, request: Request, response_class: Any, alter: AlterTopic
) -> Any:
    """What both AlterConfigs handlers do with a request: every resource answered, at once
    for one they cannot alter (:func:`_refusal`), else by ``alter`` (concurrently); the answer
    in ``response_class``'s shape (AlterConfigs and IncrementalAlterConfigs share it)."""
    body = request.body
    backend = cast(AdminBackend, context.backend)
    counts = Counter((r.resource_type, r.resource_name) for r in body.resources)
    repeated = {key for key, n in counts.items() if n > 1}

    async def one(resource: Any) -> AdminResult:
        denied = config_refusal(context, AclOperation.ALTER_CONFIGS, resource)
        if denied is not None:
            return AdminResult(denied, AUTHORIZATION_FAILED)
        refused = _refusal(resource, repeated)
        if refused is not None:
            return refused
        return await alter(backend, resource, body.validate_only)

    results = await asyncio.gather(*(one(r) for r in body.resources))
    return response_class(
        throttle_time_ms=0,
        responses=[
            response_class.AlterConfigsResourceResponse(
                error_code=result.error_code,
                error_message=result.message or None,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
            )
            for r, result in zip(body.resources, results, strict=True)
        ],
    )


def _refusal(resource: Any, repeated: set[tuple[int, str]]) -> AdminResult | None:
    """The answer for a resource the AlterConfigs handlers cannot alter (None: a topic)."""
    if (resource.resource_type, resource.resource_name) in repeated:
        return AdminResult(
            ErrorCode.INVALID_REQUEST, f"Resource {resource.resource_name!r} appears twice"
        )
    if resource.resource_type == RESOURCE_BROKER:
        return AdminResult(ErrorCode.INVALID_REQUEST, STATIC_BROKER_CONFIGS)
    if resource.resource_type != RESOURCE_TOPIC:
        return AdminResult(
            ErrorCode.INVALID_REQUEST,
            f"Resource type {resource.resource_type} is not supported: raylog alters topics (2)",
        )
    return None


async def _alter(backend: AdminBackend, resource: Any, validate_only: bool) -> AdminResult:
    nulls = sorted(c.name for c in resource.configs if c.value is None)
    if nulls:
        return AdminResult(ErrorCode.INVALID_REQUEST, f"Null value not supported for : {nulls}")
    overrides = {c.name: c.value for c in resource.configs}
    return await backend.alter_topic_configs(resource.resource_name, overrides, validate_only)
