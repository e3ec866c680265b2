"""InitProducerId (key 22), versions 0-4: a producer id for an idempotent or transactional
producer.

This module owns the request's rules; the backend owns where ids come from (blocks the active
controller allocates, see ``gateway/producer_ids.py``). Kafka's rules that apply without
transactions:

1. ``transactional_id`` null: a fresh producer id at epoch 0. Any broker answers (there is no
   coordinator for an idempotent producer), which is how every client sends it.
2. ``transactional_id`` set: the id's transaction coordinator answers
   (``gateway/transactions``): a new producer id at epoch 0, or the id's producer id with its
   epoch bumped, fencing the previous producer (an Ongoing transaction of it is aborted first:
   CONCURRENT_TRANSACTIONS, which the client retries). ``transaction_timeout_ms`` above
   ``transaction.max.timeout.ms`` gets INVALID_TRANSACTION_TIMEOUT (50). From v3 the request
   may name the producer id and epoch the client holds (KIP-360): the coordinator then bumps
   that epoch (a retry of a bump whose answer was lost gets the same epoch again) or answers
   PRODUCER_FENCED when a newer producer took the id. Without a transactional id those fields
   change nothing: a fresh producer id at epoch 0, as Kafka answers an idempotent producer's
   epoch bump.
3. When no id can be had now (no active controller reachable, a CAS lost to a failover): the
   retriable COORDINATOR_LOAD_IN_PROGRESS (14), Kafka's answer while a broker waits for its next
   producer-id block; clients retry InitProducerId.

v2 is flexible, v4 answers PRODUCER_FENCED where v0-3 answer INVALID_PRODUCER_EPOCH (KIP-588).
v5-6 (KIP-939's two-phase commit) are not advertised.

Authorization (Kafka 3.x): IDEMPOTENT_WRITE on the cluster or WRITE on some topic, else
CLUSTER_AUTHORIZATION_FAILED (31); a transactional id needs WRITE on it
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 53).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import InitProducerIdResponse

from raylog.actors.control.acls import AclOperation, ResourceType
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.producer_ids import IdempotenceBackend
from raylog.gateway.protocol import Request
from raylog.gateway.transactions.state import fencing_error

API_KEY = 22


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    if body.transactional_id is not None:
        if not context.authorized(
            AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id
        ):
            return _response(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        coordinator = context.transactions
        if coordinator is None:
            return _response(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        expected = (body.producer_id, body.producer_epoch) if request.api_version >= 3 else ()
        result = await coordinator.init_producer_id(
            body.transactional_id, body.transaction_timeout_ms, *expected
        )
        error = fencing_error(API_KEY, request.api_version, result.error_code)
        return _response(error, result.producer_id, result.producer_epoch)
    # Kafka 3.x's rule for an idempotent producer: IDEMPOTENT_WRITE on the cluster, or WRITE
    # on some topic (KIP-679).
    if not context.authorized_cluster(AclOperation.IDEMPOTENT_WRITE) and not (
        context.authorized_by_resource_type(AclOperation.WRITE, ResourceType.TOPIC)
    ):
        return _response(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    backend = context.backend
    if not isinstance(backend, IdempotenceBackend):
        return _response(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    result = await backend.init_producer_id()
    if result.error_code:
        return _response(result.error_code)
    return _response(ErrorCode.NONE, result.producer_id, result.producer_epoch)


def _response(error_code: int, producer_id: int = -1, producer_epoch: int = -1) -> Any:
    return InitProducerIdResponse(
        throttle_time_ms=0,
        error_code=error_code,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
    )
