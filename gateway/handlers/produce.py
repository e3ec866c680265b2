"""Produce (key 0), versions 3-7: one record batch per partition, appended by its leader replica.

This module owns the Kafka rules of a Produce request; the backend owns getting each batch to the
partition's leader replica, which validates the v2 header and CRC and stamps offsets. Batches
stay opaque bytes: only the 61-byte header is read here, never the records.

Rules kept here, each Kafka's:

1. ``acks`` must be 0, 1 or -1, else every partition gets INVALID_REQUIRED_ACKS (21). This is
   the one place it is checked: the backend and the replicas take the value as valid.
2. acks=0 gets no response. If any partition failed, the connection is closed instead
   (:class:`CloseConnection`): the client has no other way to learn of it.
3. A request's partitions are appended concurrently (one replica call per partition, never one
   per record). Requests of one connection are applied in order per partition, as Kafka (which
   serves one request per connection at a time) applies them: a producer pipelining
   non-idempotent batches must not see them reordered. The server runs a connection's requests
   as concurrent tasks, so each partition's append waits here until the previous append of
   the same connection is on an ordered path: sent on the replica's channel (one TCP stream,
   calls started in arrival order), or else answered (a Ray call may be overtaken). On the
   channel, then, a connection keeps several acks=all batches in flight, as Kafka's purgatory
   does, and one batch's replication round trip does not hold back the next. Transactional
   batches are the exception: each is answered before the next of its connection and
   partition goes (rule 4 may send one back for verification, and the one sent again must not
   be overtaken). An idempotent batch refused with a retriable error and nothing appended
   (not the leader, no leader, ISR below min.insync.replicas, timed out) makes the later
   batches of its producer on the partition fail with the same error for up to
   ``GATEWAY_HOLD_MS`` (until the refused one is appended), instead of reaching the leader:
   there they would be answered OUT_OF_ORDER_SEQUENCE_NUMBER (or appended out of order, for a
   producer the leader has no state of), and librdkafka answers that 45 with an epoch bump
   that appends again the records whose answers were lost (the replica keeps the same rule
   for its own refusals: ``raylog.actors.replication.refused_batches``).
4. Transactional batches need the request's ``transactional_id``, else
   TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), Kafka's answer. The leader replica tracks the
   producer's open transaction from them, and the coordinator's markers end it. A batch that
   would open the producer's transaction on a partition is first verified with the transaction
   coordinator (KIP-890's defence): unless the producer's ongoing transaction holds the
   partition (AddPartitionsToTxn), it gets INVALID_TXN_STATE (48) and nothing is appended, so no
   transaction is left open that no marker would ever end. Later batches of the transaction go
   straight on.
5. Idempotent producers (producerId >= 0, from InitProducerId) are checked by the leader
   replica (``raylog.actors.replication.producer_state``): a retry of one of the producer's last
   five batches succeeds with the ORIGINAL batch's base offset (never DUPLICATE_SEQUENCE_NUMBER,
   which kafkajs cannot handle), a sequence that does not follow is OUT_OF_ORDER_SEQUENCE_NUMBER
   (45), an epoch older than the partition has seen INVALID_PRODUCER_EPOCH (47). A producer the
   partition holds no state for is accepted at any sequence (KIP-360), so UNKNOWN_PRODUCER_ID (59)
   is never answered. producerId -1 (aiokafka, librdkafka and kafkajs by default) is a plain
   producer.
6. Missing records (null) are INVALID_RECORD (87); anything else wrong with a batch is the
   replica's verdict (CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, INVALID_RECORD, ...).
7. A client cannot append to ``__consumer_offsets`` or ``__transaction_state``:
   INVALID_TOPIC_EXCEPTION (17), Kafka's "Cannot append to internal topic". Only their
   coordinators write them (through the backend, not through this handler), so a stray
   producer cannot corrupt group or transaction state.

Authorization: WRITE on the topic, else TOPIC_AUTHORIZATION_FAILED (29) on its partitions; with a
``transactional_id``, WRITE on it, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53) on every
partition.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from kafka.protocol.producer import ProduceResponse

from raylog.actors.control.acls import AclOperation, ResourceType
from raylog.actors.replication.refused_batches import RefusedBatches
from raylog.gateway.backend import DataBackend, ProduceResult
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.coordinator import OFFSETS_TOPIC
from raylog.gateway.handlers.context import CloseConnection, RequestContext
from raylog.gateway.protocol import Request
from raylog.gateway.quotas import PRODUCER_BYTE_RATE
from raylog.gateway.transactions.coordinator import TRANSACTION_STATE_TOPIC
from raylog.storage import batch as rb

API_KEY = 0
WRITE = AclOperation.WRITE

_Topic = ProduceResponse.TopicProduceResponse
_Partition = _Topic.PartitionProduceResponse

# (connection, topic, partition) -> the future the next append of that connection waits for. The
# connection is the id of its RequestContext (one per connection, alive as long as it is). An
# entry is removed when its last append finishes, so the table holds at most one entry per
# partition per connection with appends in flight (bounded by the connection's max_in_flight).
_OrderKey = tuple[int, str, int]
_tails: dict[_OrderKey, asyncio.Future[None]] = {}
# Rule 3's refused batches, by (topic, partition, producer id): the refusals answered here,
# which the replica never sees (it keeps its own).
GATEWAY_HOLD_MS = 10_000  # the batches pipelined behind a refused one arrive within it
_refusals: RefusedBatches[tuple[str, int, int]] = RefusedBatches(GATEWAY_HOLD_MS)


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    denied = context.denied_topics(WRITE, (topic.name for topic in body.topic_data))
    txn_denied = body.transactional_id is not None and not context.authorized(
        WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id
    )
    calls: list[tuple[str, int, Awaitable[ProduceResult]]] = []
    for topic in body.topic_data:
        for data in topic.partition_data:
            if txn_denied:
                call = _refused(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            elif topic.name in denied:
                call = _refused(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            else:
                call = _produce_one(context, body, topic.name, data.index, data.records)
            calls.append((topic.name, data.index, call))
    results = await asyncio.gather(*(call for _, _, call in calls))
    if body.acks == 0:
        failed = [
            f"{name}-{index}: error {result.error_code}"
            for (name, index, _), result in zip(calls, results, strict=True)
            if result.error_code
        ]
        if failed:
            raise CloseConnection(f"acks=0 produce failed ({', '.join(failed[:5])})")
        return None
    by_topic: dict[str, list[Any]] = {}
    for (name, index, _), result in zip(calls, results, strict=True):
        by_topic.setdefault(name, []).append(
            _Partition(
                index=index,
                error_code=result.error_code,
                base_offset=result.base_offset,
                log_append_time_ms=result.log_append_time,
                log_start_offset=result.log_start_offset,
            )
        )
    # Kafka records a Produce against producer_byte_rate once appended (KIP-13); the records
    # are the request's bulk.
    sent = sum(len(data.records or b"") for t in body.topic_data for data in t.partition_data)
    return ProduceResponse(
        responses=[
            _Topic(name=name, partition_responses=parts) for name, parts in by_topic.items()
        ],
        throttle_time_ms=context.record_quota(PRODUCER_BYTE_RATE, request, sent),
    )


async def _refused(error_code: int) -> ProduceResult:
    return ProduceResult(error_code, -1, -1, -1)


async def _produce_one(
    context: RequestContext, body: Any, topic: str, partition: int, records: Any
) -> ProduceResult:
    # Header fields only; a short or malformed batch is left to the replica's checks.
    header = None
    if records is not None and len(records) >= rb.HEADER_SIZE:
        header = rb.parse_header(records, 0)
    error = _refusal(body, topic, records, header)
    if error:
        return ProduceResult(error, -1, -1, -1)
    backend = cast(DataBackend, context.backend)

    async def append(sent: Callable[[], None]) -> ProduceResult:
        # A view into the request frame, which it keeps alive: the replica's channel copies it
        # into its own frame when the call is made, and only a Ray call takes a copy of it.
        if header is None or not header.is_transactional:
            return await backend.produce(
                topic, partition, records, body.acks, body.timeout_ms, on_sent=sent
            )
        # A transactional batch the replica may send back for verification holds the next
        # batch of this connection and partition until it is appended (no ``on_sent``), so
        # that a batch sent again after verification is never overtaken (rule 3's order).
        result = await backend.produce(
            topic, partition, records, body.acks, body.timeout_ms, verify_txn=True
        )
        if not result.needs_verification:
            return result
        error = await _verified(context, body.transactional_id, header, topic, partition)
        if error:
            return ProduceResult(error, -1, -1, result.log_start_offset)
        return await backend.produce(topic, partition, records, body.acks, body.timeout_ms)

    async def append_behind_refusals(sent: Callable[[], None]) -> ProduceResult:
        held = _held_back(topic, partition, header)
        if held:
            return ProduceResult(held, -1, -1, -1, "follows a batch refused with this error")
        result = await append(sent)
        _note_refusal(topic, partition, header, result)
        return result

    return await _in_order((id(context), topic, partition), append_behind_refusals)


def _held_back(topic: str, partition: int, header: rb.BatchHeader | None) -> int:
    """Rule 3: the error of the producer's refused batch this one follows, else 0."""
    if header is None or header.producer_id < 0:
        return ErrorCode.NONE
    refusal = _refusals.held_back(
        (topic, partition, header.producer_id),
        header.producer_epoch,
        header.base_sequence,
        None,
        int(time.monotonic() * 1000),
    )
    return refusal.error_code if refusal is not None else ErrorCode.NONE


def _note_refusal(
    topic: str, partition: int, header: rb.BatchHeader | None, result: ProduceResult
) -> None:
    """Rule 3: remember a batch refused with nothing appended; forget it once appended."""
    if header is None or header.producer_id < 0:
        return
    producer = (topic, partition, header.producer_id)
    if result.error_code == ErrorCode.NONE:
        _refusals.forget(producer, header.base_sequence)
    elif result.base_offset < 0:
        _refusals.record(
            producer,
            header.producer_epoch,
            header.base_sequence,
            result.error_code,
            int(time.monotonic() * 1000),
        )


async def _verified(
    context: RequestContext,
    transactional_id: str,
    header: rb.BatchHeader,
    topic: str,
    partition: int,
) -> int:
    """Rule 4's check with the transaction coordinator (KIP-890): 0 when the producer's
    ongoing transaction holds the partition; INVALID_TXN_STATE (48) when it does not (the
    batch would open a transaction nobody ends); NOT_ENOUGH_REPLICAS (19, retriable) when the
    coordinator cannot answer now, as Kafka answers producers that know no coordinator
    errors."""
    coordinator = context.transactions
    if coordinator is None:
        return ErrorCode.NOT_ENOUGH_REPLICAS
    error = await coordinator.verify(
        transactional_id, header.producer_id, header.producer_epoch, topic, partition
    )
    if error in (ErrorCode.NONE, ErrorCode.INVALID_TXN_STATE):
        return error
    return ErrorCode.NOT_ENOUGH_REPLICAS


def _refusal(body: Any, topic: str, records: Any, header: rb.BatchHeader | None) -> int:
    """The error for a request or batch refused before it reaches a replica, else 0."""
    if body.acks not in (0, 1, -1):
        return ErrorCode.INVALID_REQUIRED_ACKS
    if topic in (OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC):
        return ErrorCode.INVALID_TOPIC_EXCEPTION
    if records is None:
        return ErrorCode.INVALID_RECORD
    if header is not None and header.is_transactional and body.transactional_id is None:
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    return ErrorCode.NONE


async def _in_order(
    key: _OrderKey, call: Callable[[Callable[[], None]], Awaitable[ProduceResult]]
) -> ProduceResult:
    """Start ``call`` once the previous call with the same key is sent in order or finished
    (FIFO per key). ``call`` gets the function that releases the next one early."""
    previous = _tails.get(key)
    released: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    _tails[key] = released

    def release() -> None:
        if not released.done():
            released.set_result(None)

    try:
        if previous is not None:
            # shield: a cancelled waiter must not cancel the future the next one waits on.
            await asyncio.shield(previous)
        return await call(release)
    finally:
        release()
        if _tails.get(key) is released:
            del _tails[key]
