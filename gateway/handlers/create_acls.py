"""CreateAcls (key 30), versions 0-1: create ACLs, each checked on its own.

As Kafka answers it: the client needs ALTER on the cluster (else every creation is
CLUSTER_AUTHORIZATION_FAILED, 31); a gateway without an authorizer answers SECURITY_DISABLED
(54), as a Kafka broker without ``authorizer.class.name`` does. Each creation gets its own result
from the controller (``acls.create_acls``): INVALID_REQUEST (42) with Kafka's message for a
filter-only code (ANY, MATCH), an UNKNOWN code, an empty name, a CLUSTER resource not named
``kafka-cluster`` or a principal without its type; an ACL that exists already is a success.
v0 has no pattern type: its ACLs are LITERAL.
"""

from __future__ import annotations

from typing import Any, cast

from kafka.protocol.admin import CreateAclsResponse

from raylog.actors.control import acls
from raylog.gateway.backend import AdminBackend
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 30

NO_AUTHORIZER = "No Authorizer is configured on the broker: set authorizer.class.name"
_Result = CreateAclsResponse.AclCreationResult


def refusal(context: RequestContext, operation: acls.AclOperation) -> tuple[int, str] | None:
    """Why an ACL API is refused before it reaches the controller (None: it is not): the three
    ACL APIs need an authorizer, and ``operation`` on the cluster."""
    if context.authorizer is None:
        return ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER
    if not context.authorized_cluster(operation):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"{operation.name} on the cluster needed"
    return None


async def handle(context: RequestContext, request: Request) -> Any:
    creations = [
        acls.binding(
            c.resource_type,
            c.resource_name,
            c.resource_pattern_type,
            c.principal,
            c.host,
            c.operation,
            c.permission_type,
        )
        for c in request.body.creations
    ]
    refused = refusal(context, acls.AclOperation.ALTER)
    if refused is not None:
        results = [refused] * len(creations)
    else:
        results = list(await cast(AdminBackend, context.backend).create_acls(creations))
    return CreateAclsResponse(
        throttle_time_ms=0,
        results=[_Result(error_code=code, error_message=msg or None) for code, msg in results],
    )
