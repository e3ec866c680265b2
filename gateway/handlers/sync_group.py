"""SyncGroup (key 14), versions 0-3: the leader hands out assignments; every member gets its own.

A member's answer waits (bounded by its rebalance timeout) until the leader's SyncGroup
arrives and the group's metadata, assignments included, is written to ``__consumer_offsets``
with acks=all. See ``groups.Group.sync`` for the errors; v3 carries a static member's
``group_instance_id``, and an id it no longer holds gets FENCED_INSTANCE_ID (82).

Authorization: READ on the group, else GROUP_AUTHORIZATION_FAILED (30).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import SyncGroupResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 14


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    groups = context.groups
    error = ErrorCode.COORDINATOR_NOT_AVAILABLE if groups is None else ErrorCode.NONE
    if not context.authorized_group(AclOperation.READ, body.group_id):
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    if error or groups is None:
        return SyncGroupResponse(throttle_time_ms=0, error_code=error, assignment=b"")
    result = await groups.sync_group(
        group_id=body.group_id,
        member_id=body.member_id,
        generation_id=body.generation_id,
        assignments={a.member_id: bytes(a.assignment) for a in body.assignments},
        group_instance_id=body.group_instance_id,
    )
    return SyncGroupResponse(
        throttle_time_ms=0, error_code=result.error_code, assignment=result.assignment
    )
