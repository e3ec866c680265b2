"""AddOffsetsToTxn (key 25), versions 0-3: a producer adds a consumer group's offsets to its
open transaction (``send_offsets_to_transaction``), before TxnOffsetCommit writes them.

The transaction coordinator adds the group's ``__consumer_offsets`` partition to the
transaction, so that the COMMIT or ABORT marker goes there too and the group coordinator makes
the offsets visible or drops them. The topic is set up first if it does not exist yet.

Authorization: WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 53), READ
on the group (GROUP_AUTHORIZATION_FAILED, 30). PRODUCER_FENCED is INVALID_PRODUCER_EPOCH (47)
below v2 (KIP-588).
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.producer import AddOffsetsToTxnResponse

from raylog.actors.control.acls import AclOperation, ResourceType
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.coordinator import OFFSETS_TOPIC
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.internal_topic import partition_for
from raylog.gateway.protocol import Request
from raylog.gateway.transactions.state import fencing_error

API_KEY = 25

log = logging.getLogger(__name__)


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    if not context.authorized(
        AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id or ""
    ):
        return _response(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not context.authorized_group(AclOperation.READ, body.group_id):
        return _response(ErrorCode.GROUP_AUTHORIZATION_FAILED)
    if not body.group_id:
        return _response(ErrorCode.INVALID_GROUP_ID)
    coordinator, groups = context.transactions, context.groups
    if coordinator is None or groups is None:
        return _response(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    offsets = (await context.backend.topics([OFFSETS_TOPIC])).get(OFFSETS_TOPIC)
    if offsets is None or not offsets.partitions:
        try:
            await groups.set_up_topic()
        except Exception as exc:  # no controller yet: the client retries
            log.info("setting up %s for AddOffsetsToTxn: %s", OFFSETS_TOPIC, exc)
        return _response(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    partition = partition_for(body.group_id, len(offsets.partitions))
    error = await coordinator.add_partitions(
        body.transactional_id,
        body.producer_id,
        body.producer_epoch,
        [(OFFSETS_TOPIC, partition)],
    )
    return _response(fencing_error(API_KEY, request.api_version, error))


def _response(error: int) -> Any:
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=error)
