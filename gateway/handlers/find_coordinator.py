"""FindCoordinator (key 10), versions 0-2: which broker coordinates a consumer group (key
type 0) or a transactional id (key type 1).

Any broker answers, with the leader of the key's partition of ``__consumer_offsets`` or
``__transaction_state`` (``gateway/internal_topic.py``). The first request creates the topic
through the controller, as Kafka does; until it exists and the partition has a leader the
answer is COORDINATOR_NOT_AVAILABLE (15), which every client retries. Other key types get
INVALID_REQUEST (42).

Authorization: DESCRIBE on the group, else GROUP_AUTHORIZATION_FAILED (30); DESCRIBE on the
transactional id, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.metadata import FindCoordinatorResponse

from raylog.actors.control.acls import AclOperation, ResourceType
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.coordinator import GroupCoordinator
from raylog.gateway.handlers.context import AUTHORIZATION_FAILED, RequestContext
from raylog.gateway.protocol import Request
from raylog.gateway.transactions.coordinator import TransactionCoordinator

API_KEY = 10
KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    key_type = body.key_type if request.api_version >= 1 else KEY_TYPE_GROUP
    coordinator: GroupCoordinator | TransactionCoordinator | None
    if key_type == KEY_TYPE_GROUP:
        if not body.key:
            return _answer(ErrorCode.INVALID_GROUP_ID, "empty group id")
        if not context.authorized_group(AclOperation.DESCRIBE, body.key):
            return _answer(ErrorCode.GROUP_AUTHORIZATION_FAILED, AUTHORIZATION_FAILED)
        coordinator = context.groups
    elif key_type == KEY_TYPE_TRANSACTION:
        if not body.key:
            return _answer(ErrorCode.INVALID_REQUEST, "empty transactional id")
        if not context.authorized(AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, body.key):
            return _answer(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, AUTHORIZATION_FAILED)
        coordinator = context.transactions
    else:
        return _answer(ErrorCode.INVALID_REQUEST, f"unknown key type {key_type}")
    if coordinator is None:
        return _answer(ErrorCode.COORDINATOR_NOT_AVAILABLE, "no coordinator for this key type")
    node = await coordinator.find_coordinator(body.key)
    if node.error_code != ErrorCode.NONE:
        return _answer(node.error_code, "coordinator not available yet")
    # The coordinator's address on the listener the client came in on.
    cluster = await context.backend.cluster()
    broker = next((b for b in cluster.brokers if b.node_id == node.node_id), None)
    address = broker.address(context.listener) if broker is not None else (node.host, node.port)
    if address is None:
        return _answer(ErrorCode.COORDINATOR_NOT_AVAILABLE, "coordinator has no such listener")
    return _answer(ErrorCode.NONE, None, node.node_id, *address)


def _answer(
    error_code: int, message: str | None, node_id: int = -1, host: str = "", port: int = -1
) -> Any:
    return FindCoordinatorResponse(
        throttle_time_ms=0,
        error_code=error_code,
        error_message=message,
        node_id=node_id,
        host=host,
        port=port,
    )
