"""LeaveGroup (key 13), versions 0-1: a member leaves; the others rebalance without it.

v0-2 carry one member id (batch leave, v3+, is not advertised).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import LeaveGroupResponse

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups import MemberIdentity
from raylog.gateway.handlers import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 13


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    groups = context.groups
    if groups is None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
    else:
        group_error, member_errors = await groups.leave_group(
            body.group_id, [MemberIdentity(body.member_id)]
        )
        error = group_error or member_errors[0]
    return LeaveGroupResponse(throttle_time_ms=0, error_code=error)
