"""EndTxn (key 26), versions 0-3: a producer commits or aborts its open transaction.

The transaction coordinator writes PrepareCommit or PrepareAbort, the markers to every
partition of the transaction and then the Complete state, and answers once complete (or once
the outcome is durable, if a partition holds the markers up; ``gateway/transactions``).

Authorization: WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 53).
PRODUCER_FENCED is INVALID_PRODUCER_EPOCH (47) below v2 (KIP-588).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import EndTxnResponse

from raylog.actors.control.acls import AclOperation, ResourceType
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request
from raylog.gateway.transactions.state import fencing_error

API_KEY = 26


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    if not context.authorized(
        AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id or ""
    ):
        return _response(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    coordinator = context.transactions
    if coordinator is None:
        return _response(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    error = await coordinator.end_txn(
        body.transactional_id, body.producer_id, body.producer_epoch, bool(body.committed)
    )
    return _response(fencing_error(API_KEY, request.api_version, error))


def _response(error: int) -> Any:
    return EndTxnResponse(throttle_time_ms=0, error_code=error)
