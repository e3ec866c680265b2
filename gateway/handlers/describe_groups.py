"""DescribeGroups (key 15), versions 0-6: state, protocol and members of consumer groups.

Asked of each group's coordinator; another broker answers NOT_COORDINATOR (16) and one still
loading the group's partition COORDINATOR_LOAD_IN_PROGRESS (14), with state "". The protocol and
each member's metadata and assignment are filled only while the group is Stable (Kafka's
``GroupMetadata.summary``). A group that does not exist is described as Dead with no error
before v6 and with GROUP_ID_NOT_FOUND (69) from v6 (KIP-1043). Each member's
``group_instance_id`` (v4+) is its static instance id, or null for a dynamic member.
``authorized_operations`` (v3+), when asked for, holds which of a group's operations (READ,
DELETE, DESCRIBE) the client may do: all of them without an authorizer; otherwise it is Kafka's
"not provided" value.

Authorization: DESCRIBE on the group, else GROUP_AUTHORIZATION_FAILED (30).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeGroupsResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.group_admin import GroupDescription
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 15
FIRST_VERSION_WITH_NOT_FOUND = 6  # KIP-1043: an unknown group gets GROUP_ID_NOT_FOUND

# The int32 bitfield as kafka-python's codec takes it: the set of bits. AclOperation codes
# READ (3), DELETE (6), DESCRIBE (8) are a group's operations (those the authorizer allows);
# None encodes the spec's default -2^31 (bit 31 alone), "not provided".
GROUP_OPERATIONS = frozenset({AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE})
OPERATIONS_NOT_PROVIDED = None

_Group = DescribeGroupsResponse.DescribedGroup
_Member = _Group.DescribedGroupMember


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    version = request.api_version
    with_operations = version >= 3 and bool(body.include_authorized_operations)
    described = []
    for group_id in body.groups:
        if not context.authorized_group(AclOperation.DESCRIBE, group_id):
            error, summary = ErrorCode.GROUP_AUTHORIZATION_FAILED, GroupDescription("", "", "")
        elif context.groups is None:
            error, summary = ErrorCode.COORDINATOR_NOT_AVAILABLE, GroupDescription("", "", "")
        else:
            error, summary = context.groups.describe_group(group_id)
        if error == ErrorCode.GROUP_ID_NOT_FOUND and version < FIRST_VERSION_WITH_NOT_FOUND:
            error = ErrorCode.NONE
        described.append(
            _Group(
                error_code=error,
                error_message=f"Group {group_id} not found."
                if error == ErrorCode.GROUP_ID_NOT_FOUND
                else None,
                group_id=group_id,
                group_state=summary.state,
                protocol_type=summary.protocol_type,
                protocol_data=summary.protocol,
                members=[
                    _Member(
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.metadata,
                        member_assignment=m.assignment,
                    )
                    for m in summary.members
                ],
                authorized_operations=frozenset(
                    op for op in GROUP_OPERATIONS if context.authorized_group(op, group_id)
                )
                if with_operations
                else OPERATIONS_NOT_PROVIDED,
            )
        )
    return DescribeGroupsResponse(throttle_time_ms=0, groups=described)
