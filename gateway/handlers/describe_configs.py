"""DescribeConfigs (key 32), versions 0-2: topic and broker configs, as Kafka reports them.

This module also owns the config-resource rules the AlterConfigs handlers share
(:data:`RESOURCE_TOPIC`, :data:`RESOURCE_BROKER`, :func:`broker_resource_error`).

- A topic resource (type 2) lists every key of ``config_keys.TOPIC_CONFIGS`` (null or empty
  ``configuration_keys``) or the keys asked for (keys raylog does not know are left out, as
  Kafka leaves out unknown names): an override has source DYNAMIC_TOPIC_CONFIG (1) and
  ``is_default`` false, anything else the registry default with source DEFAULT_CONFIG (5) and
  ``is_default`` true. Topic configs are never read-only (AlterConfigs changes them). An
  unknown topic is UNKNOWN_TOPIC_OR_PARTITION (3).
- A broker resource (type 4) is answered only by that broker (clients send it there): its
  ``BROKER_CONFIGS``, source STATIC_BROKER_CONFIG (4) when set at start-up, else DEFAULT_CONFIG,
  all read-only because raylog has no dynamic broker configs. The empty name asks for the
  cluster-wide dynamic defaults, of which raylog has none: an empty list. Another broker's id is
  INVALID_REQUEST (42), with Kafka's message.
- Other resource types are INVALID_REQUEST.
- ``include_synonyms`` (v1+): each entry's synonym list holds the entry itself (name, value,
  source); raylog has no broker-level synonyms of topic keys (Kafka's ``log.retention.ms``...).
- No config is sensitive.

Authorization: DESCRIBE_CONFIGS on the topic (TOPIC_AUTHORIZATION_FAILED, 29) or, for a broker,
on the cluster (CLUSTER_AUTHORIZATION_FAILED, 31).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any, cast

from kafka.protocol.admin import DescribeConfigsResponse

from raylog.actors.control import config_keys, config_registry
from raylog.actors.control.acls import AclOperation, ResourceType
from raylog.gateway.backend import AdminBackend
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import AUTHORIZATION_FAILED, RequestContext
from raylog.gateway.protocol import Request

API_KEY = 32

RESOURCE_TOPIC = 2  # Kafka's ConfigResource.Type codes
RESOURCE_BROKER = 4

_Result = DescribeConfigsResponse.DescribeConfigsResult
_Entry = _Result.DescribeConfigsResourceResult
_Synonym = _Entry.DescribeConfigsSynonym


def broker_resource_error(name: str, this_broker_id: int) -> str:
    """Why a broker resource named ``name`` cannot be answered here ("" when it can)."""
    if name in ("", str(this_broker_id)):
        return ""
    return f"Unexpected broker id, expected {this_broker_id} or empty string, but received {name}"


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    backend = cast(AdminBackend, context.backend)
    synonyms = bool(getattr(body, "include_synonyms", False))

    async def one(r: Any) -> Any:
        refused = config_refusal(context, AclOperation.DESCRIBE_CONFIGS, r)
        if refused is not None:
            return _Result(
                error_code=refused,
                error_message=AUTHORIZATION_FAILED,
                resource_type=r.resource_type,
                resource_name=r.resource_name,
                configs=[],
            )
        return await _describe(
            backend, r.resource_type, r.resource_name, r.configuration_keys, synonyms
        )

    results = await asyncio.gather(*(one(r) for r in body.resources))
    return DescribeConfigsResponse(throttle_time_ms=0, results=list(results))


def config_refusal(context: RequestContext, operation: AclOperation, resource: Any) -> int | None:
    """None when the client may do ``operation`` on a config resource (a topic: on the topic;
    a broker: on the cluster), else Kafka's error code for it (an unknown type is None: the
    handler refuses it on its own)."""
    if resource.resource_type == RESOURCE_TOPIC:
        if context.authorized(operation, ResourceType.TOPIC, resource.resource_name):
            return None
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    if resource.resource_type == RESOURCE_BROKER and not context.authorized_cluster(operation):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    return None


async def _describe(
    backend: AdminBackend,
    resource_type: int,
    name: str,
    keys: Sequence[str] | None,
    synonyms: bool,
) -> Any:
    def answer(error: int, message: str, entries: Iterable[Any] = ()) -> Any:
        return _Result(
            error_code=error,
            error_message=message or None,
            resource_type=resource_type,
            resource_name=name,
            configs=list(entries),
        )

    if resource_type == RESOURCE_TOPIC:
        result = await backend.topic_configs(name)
        if result.error_code:
            return answer(result.error_code, result.message)
        rows = config_keys.TOPIC_CONFIGS.describe(
            result.overrides, _known(config_keys.TOPIC_CONFIGS, keys)
        )
        return answer(ErrorCode.NONE, "", (_entry(row, False, synonyms) for row in rows))
    if resource_type == RESOURCE_BROKER:
        broker_id, overrides = await backend.broker_configs()
        why = broker_resource_error(name, broker_id)
        if why:
            return answer(ErrorCode.INVALID_REQUEST, why)
        if name == "":
            return answer(ErrorCode.NONE, "")  # no cluster-wide dynamic defaults in raylog
        rows = config_keys.BROKER_CONFIGS.describe(
            overrides,
            _known(config_keys.BROKER_CONFIGS, keys),
            override_source=config_registry.SOURCE_STATIC_BROKER_CONFIG,
        )
        return answer(ErrorCode.NONE, "", (_entry(row, True, synonyms) for row in rows))
    return answer(
        ErrorCode.INVALID_REQUEST,
        f"Resource type {resource_type} is not supported: raylog describes topics (2) and "
        f"brokers (4)",
    )


def _known(
    registry: config_registry.ConfigRegistry, keys: Sequence[str] | None
) -> list[str] | None:
    if not keys:  # null or empty: every key (Kafka's ConfigHelper)
        return None
    return [k for k in dict.fromkeys(keys) if k in registry.defs]


def _entry(row: config_registry.ConfigEntry, read_only: bool, synonyms: bool) -> Any:
    return _Entry(
        name=row.name,
        value=row.value,
        read_only=read_only,
        is_default=row.is_default,
        config_source=row.source,
        is_sensitive=row.is_sensitive,
        synonyms=[_Synonym(name=row.name, value=row.value, source=row.source)] if synonyms else [],
    )
