"""DescribeAcls (key 29), versions 0-1: the ACLs a filter matches, grouped by resource pattern.

As Kafka answers it: the client needs DESCRIBE on the cluster (else CLUSTER_AUTHORIZATION_FAILED,
31); a gateway without an authorizer answers SECURITY_DISABLED (54); a filter with an UNKNOWN
code is INVALID_REQUEST (42). The filter's pattern type MATCH finds the ACLs that apply to a
name (LITERAL equal or ``*``, PREFIXED prefixes of it), ANY those naming it exactly whatever the
pattern; v0 has no pattern type: LITERAL.
"""

from __future__ import annotations

from typing import Any, cast

from kafka.protocol.admin import DescribeAclsResponse

from raylog.actors.control import acls
from raylog.gateway.backend import AdminBackend
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.handlers.create_acls import refusal
from raylog.gateway.protocol import Request

API_KEY = 29

_Resource = DescribeAclsResponse.DescribeAclsResource
_Acl = _Resource.AclDescription


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    refused = refusal(context, acls.AclOperation.DESCRIBE)
    if refused is not None:
        return _answer(*refused)
    error, found = await cast(AdminBackend, context.backend).describe_acls(wire_filter(body))
    if error.error_code:
        return _answer(error.error_code, error.message)
    resources: dict[tuple[int, str, int], list[Any]] = {}
    for acl in found:
        key = (acl.resource_type, acl.resource_name, acl.pattern_type)
        resources.setdefault(key, []).append(
            _Acl(
                principal=acl.principal,
                host=acl.host,
                operation=acl.operation,
                permission_type=acl.permission_type,
            )
        )
    return _answer(
        0,
        "",
        [
            _Resource(resource_type=t, resource_name=n, pattern_type=p, acls=described)
            for (t, n, p), described in resources.items()
        ],
    )


def wire_filter(f: Any) -> acls.AclBindingFilter:
    """A DescribeAcls request's filter, or one of a DeleteAcls request's (the same fields)."""
    return acls.binding_filter(
        f.resource_type_filter,
        f.resource_name_filter,
        f.pattern_type_filter,
        f.principal_filter,
        f.host_filter,
        f.operation,
        f.permission_type,
    )


def _answer(error_code: int, message: str, resources: list[Any] | None = None) -> Any:
    return DescribeAclsResponse(
        throttle_time_ms=0,
        error_code=error_code,
        error_message=message or None,
        resources=resources or [],
    )
