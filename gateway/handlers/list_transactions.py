"""ListTransactions (key 66), versions 0-1 (KIP-664, KIP-994): the transactional ids this
broker coordinates, filtered by state, producer id and (v1) how long they have been open.

Admin clients ask every broker and merge the answers. While a partition of
``__transaction_state`` still loads here, the answer is COORDINATOR_LOAD_IN_PROGRESS (14) with
the ids loaded so far. State filters that name no state come back in
``unknown_state_filters``, as Kafka answers them.

Authorization: the ids the client may not DESCRIBE are left out (Kafka's rule).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import ListTransactionsResponse

from raylog.actors.control.acls import AclOperation, ResourceType
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request

API_KEY = 66

_State = ListTransactionsResponse.TransactionState


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    coordinator = context.transactions
    if coordinator is None:
        return ListTransactionsResponse(
            throttle_time_ms=0,
            error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
            unknown_state_filters=[],
            transaction_states=[],
        )
    duration_ms = body.duration_filter if request.api_version >= 1 else -1
    error, listed = coordinator.list(body.state_filters, body.producer_id_filters, duration_ms)
    return ListTransactionsResponse(
        throttle_time_ms=0,
        error_code=error,
        unknown_state_filters=list(listed.unknown_state_filters),
        transaction_states=[
            _State(
                transactional_id=t.transactional_id,
                producer_id=t.producer_id,
                transaction_state=t.state,
            )
            for t in listed.transactions
            if context.authorized(
                AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, t.transactional_id
            )
        ],
    )
