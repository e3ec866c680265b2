"""LeaveGroup (key 13), versions 0-3: members leave; the others rebalance without them.

v0-2 carry one member id and answer with its error. v3 (KIP-345) carries a batch of members,
each a member id and a ``group_instance_id``, and answers each one's error beside a group-level
error that is set only when the group could not be asked at all (as Kafka): FENCED_INSTANCE_ID
(82) when the instance is held by another member id, UNKNOWN_MEMBER_ID (25) for an instance
or member the group does not know. An empty member id with an instance id removes that static
member whatever its id (an admin's removal). See ``groups.Group.leave``.

Authorization: READ on the group, else GROUP_AUTHORIZATION_FAILED (30).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import LeaveGroupResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.group import MemberIdentity
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 13
FIRST_BATCH_VERSION = 3

_Member = LeaveGroupResponse.MemberResponse


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    batch = request.api_version >= FIRST_BATCH_VERSION
    if batch:
        members = [MemberIdentity(m.member_id, m.group_instance_id) for m in body.members]
    else:
        members = [MemberIdentity(body.member_id)]
    if not context.authorized_group(AclOperation.READ, body.group_id):
        group_error, member_errors = ErrorCode.GROUP_AUTHORIZATION_FAILED, []
    elif context.groups is None:
        group_error, member_errors = ErrorCode.COORDINATOR_NOT_AVAILABLE, []
    else:
        group_error, member_errors = await context.groups.leave_group(body.group_id, members)
    if not batch:
        error = group_error or (member_errors[0] if member_errors else ErrorCode.NONE)
        return LeaveGroupResponse(throttle_time_ms=0, error_code=error)
    return LeaveGroupResponse(
        throttle_time_ms=0,
        error_code=group_error,
        members=[]
        if group_error
        else [
            _Member(member_id=m.member_id, group_instance_id=m.group_instance_id, error_code=e)
            for m, e in zip(members, member_errors, strict=True)
        ],
    )
