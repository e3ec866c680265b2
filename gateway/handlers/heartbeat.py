"""Heartbeat (key 12), versions 0-3: a member says it is alive; a rebalance is announced here.

REBALANCE_IN_PROGRESS (27) tells the member to rejoin; see ``groups.Group.heartbeat``. v3
carries a static member's ``group_instance_id``: an old member id of a restarted instance gets
FENCED_INSTANCE_ID (82).

Authorization: READ on the group, else GROUP_AUTHORIZATION_FAILED (30).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import HeartbeatResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 12


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    groups = context.groups
    if not context.authorized_group(AclOperation.READ, body.group_id):
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    elif groups is None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
    else:
        error = await groups.heartbeat(
            body.group_id, body.member_id, body.generation_id, body.group_instance_id
        )
    return HeartbeatResponse(throttle_time_ms=0, error_code=error)
