"""AlterClientQuotas (key 49), versions 0-1 (KIP-546): set and remove client quota values.

Each entry names an entity (``user`` and/or ``client-id``, a null name being the default entity)
and its ops (key, value, remove). Entries are checked one by one as Kafka's controller does
(``actors/control/client_quotas.alter_client_quotas``): an empty entity, a repeated type, an
empty name, an unknown key or a value not above 0 (or fractional for a byte rate) is
INVALID_REQUEST (42) for that entry, another entity type UNSUPPORTED_VERSION (35); the valid
entries are applied, none with ``validate_only``. The gateways enforce the values within one
metadata poll (``gateway/quotas.py``).

Authorization: ALTER_CONFIGS on the cluster, else CLUSTER_AUTHORIZATION_FAILED (31) for every
entry.
"""

from __future__ import annotations

from typing import Any, cast

from kafka.protocol.admin import AlterClientQuotasResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.backend import AdminBackend, ClientQuotaEntry, EntityResult
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import AUTHORIZATION_FAILED, RequestContext
from raylog.gateway.protocol import Request

API_KEY = 49

_Entry = AlterClientQuotasResponse.EntryData


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    backend = cast(AdminBackend, context.backend)
    entries = [
        ClientQuotaEntry(
            [(e.entity_type, e.entity_name) for e in entry.entity],
            [(op.key, op.value, op.remove) for op in entry.ops],
        )
        for entry in body.entries
    ]
    if context.authorized_cluster(AclOperation.ALTER_CONFIGS):
        results = await backend.alter_client_quotas(entries, body.validate_only)
    else:  # Kafka's answer: every entry gets the code
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        results = [EntityResult(e.entity, code, AUTHORIZATION_FAILED) for e in entries]
    return AlterClientQuotasResponse(
        throttle_time_ms=0,
        entries=[
            _Entry(
                error_code=code,
                error_message=message or None,
                entity=[_Entry.EntityData(entity_type=t, entity_name=n) for t, n in entity],
            )
            for entity, code, message in results
        ],
    )
