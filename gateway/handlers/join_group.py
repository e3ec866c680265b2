"""JoinGroup (key 11), versions 0-5: join a consumer group and wait for its rebalance.

The answer waits (bounded by the member's rebalance timeout) until every member has rejoined
or that timeout passed; see ``groups.Group.join`` for the rules. v0 has no rebalance timeout:
the session timeout stands in for it, as in Kafka. From v4 a dynamic member without an id is
given one with MEMBER_ID_REQUIRED (79) and joins again with it (KIP-394). From v5 a member may
send a ``group_instance_id`` (static membership, KIP-345): it gets its id at once, and a
restarted instance takes its old member's place, fencing the old id (rule 8 of
``groups.py``). The leader's member list carries each member's instance id, which assignors use
to keep a static member's partitions across restarts.

Authorization: READ on the group, else GROUP_AUTHORIZATION_FAILED (30).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import JoinGroupResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.group import JoinResult
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 11

_Member = JoinGroupResponse.JoinGroupResponseMember


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    version = request.api_version
    groups = context.groups
    if not context.authorized_group(AclOperation.READ, body.group_id):
        return _answer(JoinResult(ErrorCode.GROUP_AUTHORIZATION_FAILED, member_id=body.member_id))
    if groups is None:
        return _answer(JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=body.member_id))
    session_timeout_ms = body.session_timeout_ms
    rebalance_timeout_ms = body.rebalance_timeout_ms if version >= 1 else session_timeout_ms
    client_id = request.header.client_id or ""
    result = await groups.join_group(
        group_id=body.group_id,
        member_id=body.member_id,
        client_id=client_id,
        client_host="/" + context.peer.rsplit(":", 1)[0],
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        protocol_type=body.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in body.protocols],
        require_known_member_id=version >= 4,
        group_instance_id=body.group_instance_id if version >= 5 else None,
    )
    return _answer(result)


def _answer(result: JoinResult) -> Any:
    return JoinGroupResponse(
        throttle_time_ms=0,
        error_code=result.error_code,
        generation_id=result.generation_id,
        protocol_name=result.protocol_name or "",
        leader=result.leader,
        member_id=result.member_id,
        members=[
            _Member(
                member_id=m.member_id, group_instance_id=m.group_instance_id, metadata=m.metadata
            )
            for m in result.members
        ],
    )
