"""DescribeTransactions (key 65), version 0 (KIP-664): the state of transactional ids, asked of
their coordinator (admin clients find it with FindCoordinator, key type 1).

Each id is answered by this broker's transaction coordinator: NOT_COORDINATOR (16) for an id
another broker coordinates, COORDINATOR_LOAD_IN_PROGRESS (14) while its partition loads,
TRANSACTIONAL_ID_NOT_FOUND (105) for an unknown one.

Authorization: DESCRIBE on each transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 53);
the topics of a transaction the client may not DESCRIBE are left out, as Kafka does.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeTransactionsResponse

from raylog.actors.control.acls import AclOperation, ResourceType
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request
from raylog.gateway.transactions.state import TransactionDescription

API_KEY = 65

_State = DescribeTransactionsResponse.TransactionState
_Topic = _State.TopicData


async def handle(context: RequestContext, request: Request) -> Any:
    states = []
    for transactional_id in request.body.transactional_ids:
        if not context.authorized(
            AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id
        ):
            found = TransactionDescription(
                ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, transactional_id
            )
        elif context.transactions is None:
            found = TransactionDescription(ErrorCode.COORDINATOR_NOT_AVAILABLE, transactional_id)
        else:
            found = context.transactions.describe(transactional_id)
        denied = context.denied_topics(AclOperation.DESCRIBE, (t for t, _ in found.topics))
        states.append(
            _State(
                error_code=found.error_code,
                transactional_id=transactional_id,
                transaction_state=found.state,
                transaction_timeout_ms=found.txn_timeout_ms,
                transaction_start_time_ms=found.txn_start_ms,
                producer_id=found.producer_id,
                producer_epoch=found.producer_epoch,
                topics=[
                    _Topic(topic=topic, partitions=list(partitions))
                    for topic, partitions in found.topics
                    if topic not in denied
                ],
            )
        )
    return DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=states)
