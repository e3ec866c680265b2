"""DescribeClientQuotas (key 48), version 1 (KIP-546): the client quota entities matching a
filter, with their values.

Each filter component names an entity type (``user``, ``client-id``) and matches an exact name
(0), the default entity (1) or any name (2); a strict filter leaves out entities with types it
does not name. A bad filter is the response's error: INVALID_REQUEST (42) for an empty or
repeated type or a match string that contradicts its match type, UNSUPPORTED_VERSION (35) for
another type (``actors/control/client_quotas.describe_client_quotas``, run by the controller).
A default entity's name is null on the wire.

Authorization: DESCRIBE_CONFIGS on the cluster, else CLUSTER_AUTHORIZATION_FAILED (31).
"""

from __future__ import annotations

from typing import Any, cast

from kafka.protocol.admin import DescribeClientQuotasResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.backend import AdminBackend, DescribeResult
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import AUTHORIZATION_FAILED, RequestContext
from raylog.gateway.protocol import Request

API_KEY = 48

_Entry = DescribeClientQuotasResponse.EntryData


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    backend = cast(AdminBackend, context.backend)
    components = [(c.entity_type, c.match_type, c.match) for c in body.components]
    if context.authorized_cluster(AclOperation.DESCRIBE_CONFIGS):
        found = await backend.describe_client_quotas(components, body.strict)
    else:
        found = DescribeResult(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, AUTHORIZATION_FAILED, [])
    return DescribeClientQuotasResponse(
        throttle_time_ms=0,
        error_code=found.error_code,
        error_message=found.message or None,
        entries=None
        if found.error_code
        else [
            _Entry(
                entity=[_Entry.EntityData(entity_type=t, entity_name=name) for t, name in entity],
                values=[_Entry.ValueData(key=k, value=v) for k, v in values.items()],
            )
            for entity, values in found.entries
        ],
    )
