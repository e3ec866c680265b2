"""ListGroups (key 16), versions 0-5: the consumer groups this broker coordinates.

Each broker lists only the groups of the ``__consumer_offsets`` partitions it leads; admin
clients (kafka-python ``KafkaAdminClient.list_groups``, librdkafka ``ListConsumerGroups``) ask
every broker and merge the answers. v4 adds ``group_state`` and the ``states_filter`` (KIP-518),
v5 ``group_type`` and the ``types_filter`` (KIP-848): every group here is a "classic" one. While
one of this broker's partitions is still loading, the answer is COORDINATOR_LOAD_IN_PROGRESS (14)
with the groups loaded so far, as Kafka answers.

Authorization: every group for DESCRIBE on the cluster, else the groups with DESCRIBE.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import ListGroupsResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.group_admin import GroupListing, filter_listings
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 16

_Group = ListGroupsResponse.ListedGroup


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    version = request.api_version
    listings: list[GroupListing] = []
    if context.groups is None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
    else:
        error, listings = context.groups.list_groups()
        states = (body.states_filter or []) if version >= 4 else []
        types = (body.types_filter or []) if version >= 5 else []
        listings = filter_listings(listings, states, types)
        # Kafka's rule: every group for DESCRIBE on the cluster, else those the client may
        # DESCRIBE.
        if not context.authorized_cluster(AclOperation.DESCRIBE):
            listings = [
                g for g in listings if context.authorized_group(AclOperation.DESCRIBE, g.group_id)
            ]
    return ListGroupsResponse(
        throttle_time_ms=0,
        error_code=error,
        groups=[
            _Group(
                group_id=g.group_id,
                protocol_type=g.protocol_type,
                group_state=g.state,
                group_type=g.group_type,
            )
            for g in listings
        ],
    )
