"""DeleteGroups (key 42), versions 0-2: delete consumer groups and all their committed offsets.

Asked of each group's coordinator. Only an Empty group can be deleted: one with members gets
NON_EMPTY_GROUP (68), one that does not exist GROUP_ID_NOT_FOUND (69); another broker answers
NOT_COORDINATOR (16). Deletion writes tombstones to ``__consumer_offsets`` (see
``group_coordinator``) and succeeds once they are acknowledged. A group named twice is deleted
once and answered once (the response is keyed by group id).

Authorization: DELETE on the group, else GROUP_AUTHORIZATION_FAILED (30).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DeleteGroupsResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 42

_Result = DeleteGroupsResponse.DeletableGroupResult


async def handle(context: RequestContext, request: Request) -> Any:
    results = []
    for group_id in dict.fromkeys(request.body.groups_names):
        if not context.authorized_group(AclOperation.DELETE, group_id):
            error = ErrorCode.GROUP_AUTHORIZATION_FAILED
        elif context.groups is None:
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        else:
            error = await context.groups.delete_group(group_id)
        results.append(_Result(group_id=group_id, error_code=error))
    return DeleteGroupsResponse(throttle_time_ms=0, results=results)
