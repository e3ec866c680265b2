"""DeleteAcls (key 31), versions 0-1: delete the ACLs each filter matches.

As Kafka answers it: the client needs ALTER on the cluster (else every filter is
CLUSTER_AUTHORIZATION_FAILED, 31); a gateway without an authorizer answers SECURITY_DISABLED
(54). Per filter (``acls.delete_acls``): INVALID_REQUEST (42) for one with an UNKNOWN code, else
the ACLs it matched, deleted; an ACL two filters match is listed under the first. Filters match
as DescribeAcls' do; v0 has no pattern type: LITERAL.
"""

from __future__ import annotations

from typing import Any, cast

from kafka.protocol.admin import DeleteAclsResponse

from raylog.actors.control import acls
from raylog.gateway.backend import AdminBackend
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.handlers.create_acls import refusal
from raylog.gateway.handlers.describe_acls import wire_filter
from raylog.gateway.protocol import Request

API_KEY = 31

_Result = DeleteAclsResponse.DeleteAclsFilterResult
_Matching = _Result.DeleteAclsMatchingAcl


async def handle(context: RequestContext, request: Request) -> Any:
    filters = [wire_filter(f) for f in request.body.filters]
    refused = refusal(context, acls.AclOperation.ALTER)
    if refused is not None:
        results = [acls.DeletionResult(*refused, ())] * len(filters)
    else:
        results = list(await cast(AdminBackend, context.backend).delete_acls(filters))
    return DeleteAclsResponse(
        throttle_time_ms=0,
        filter_results=[
            _Result(
                error_code=r.error_code,
                error_message=r.message or None,
                matching_acls=[
                    _Matching(
                        error_code=0,
                        error_message=None,
                        resource_type=a.resource_type,
                        resource_name=a.resource_name,
                        pattern_type=a.pattern_type,
                        principal=a.principal,
                        host=a.host,
                        operation=a.operation,
                        permission_type=a.permission_type,
                    )
                    for a in r.deleted
                ],
            )
            for r in results
        ],
    )
