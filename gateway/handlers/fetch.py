"""Fetch (key 1), versions 4-11: consumers read whole stored batches, with a long poll.

This module owns the request-level rules of Fetch: the long poll across partitions, the
request's byte budget, and fetch sessions; the backend owns each partition's read from its leader
replica (whole batches below the high watermark, OFFSET_OUT_OF_RANGE outside the log, leader
epoch checks). Records are never decoded: the budget is kept by walking batch lengths.

1. Long poll. A first pass reads every partition at once without waiting. If the bytes found
   reach ``min_bytes``, or any partition has an error (Kafka's DelayedFetch completes on
   errors too), the answer goes at once. Otherwise every partition is read again,
   concurrently, each replica call waiting until the deadline for more bytes than that
   partition has already found (the replica wakes its long polls on every high watermark move);
   a call that comes back with more is counted and re-issued, so the answer goes as soon as the
   bytes found across partitions reach ``min_bytes`` or a partition errs, and at ``max_wait_ms``
   at the latest (capped at ``MAX_WAIT_MS_MAX``) with the freshest answer of each partition.
   An idle partition costs one replica call per long poll.
2. Budget (KIP-74). Partitions are filled in request order, each up to its
   ``partition_max_bytes`` (the replica's read) and the request's ``max_bytes`` left. The first
   partition with data always keeps at least its first batch, however large, so that a consumer
   can always make progress; after that only whole batches that fit are kept.
3. Fetch sessions (KIP-227) are declined: the answer always has ``session_id`` 0 and holds
   exactly the partitions asked for. An incremental fetch (epoch > 0) gets
   FETCH_SESSION_ID_NOT_FOUND (70), or INVALID_FETCH_SESSION_EPOCH (71) with session id 0, as
   Kafka answers when it has no such session; full fetches (epoch 0 or -1) are always served.
4. Transactions: every answer carries the partition's ``last_stable_offset`` (the first offset
   of its oldest open transaction, else the high watermark). read_committed reads stop there
   and carry ``aborted_transactions``, (producer id, first offset) of each aborted transaction
   the records returned may hold, so the client drops those records; read_uncommitted answers
   null there (Kafka's choice). The replica decides both (``actors/replication/txn_state.py``).
5. Follower fetching (KIP-392). From v11 the request's ``rack_id`` goes to the backend as the
   client metadata (None before v11): a follower's gateway then serves the read from its own
   replica, and the leader's may answer a partition with ``preferred_read_replica`` and no
   records (rules in ``gateway/routing.py``). Such an answer completes the request at once, as
   Kafka's ReplicaManager does, so the client moves to that replica without a long poll.

Authorization: READ on the topic, else TOPIC_AUTHORIZATION_FAILED (29) on its partitions,
answered without a read (and without waiting for them).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, NamedTuple, cast

from kafka.protocol.consumer import FetchResponse

from raylog.actors.control.acls import AclOperation
from raylog.gateway.backend import READ_COMMITTED, DataBackend, FetchResult, PartitionFetch
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request
from raylog.gateway.quotas import CONSUMER_BYTE_RATE

API_KEY = 1

MAX_WAIT_MS_MAX = 30_000  # bound on a long poll, whatever the client asks (the replica's bound)

_Topic = FetchResponse.FetchableTopicResponse
_Partition = _Topic.PartitionData
_Aborted = _Partition.AbortedTransaction
_DENIED = FetchResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1, -1, -1, b"")
_BATCH_LENGTH = struct.Struct(">i")  # at byte 8 of a batch; the 12 bytes before it not counted
_LOG_OVERHEAD = 12


class _Wanted(NamedTuple):
    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int


async def handle(context: RequestContext, request: Request) -> Any:
    body = request.body
    session_error = _session_error(body.session_id, body.session_epoch)
    if session_error:
        return FetchResponse(
            throttle_time_ms=0, error_code=session_error, session_id=0, responses=[]
        )
    backend = cast(DataBackend, context.backend)
    # Kafka answers the partitions of topics the client may not READ at once, and fetches (and
    # waits for) the others only.
    denied = context.denied_topics(AclOperation.READ, (topic.topic for topic in body.topics))
    wanted = [
        _Wanted(
            topic.topic, p.partition, p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch
        )
        for topic in body.topics
        if topic.topic not in denied
        for p in topic.partitions
    ]
    isolation = body.isolation_level
    # KIP-392 client metadata exists from v11 on; an absent rack is the empty string.
    rack_id = (body.rack_id or "") if request.api_version >= 11 else None
    min_bytes = max(0, body.min_bytes)  # 0: answer at once, as Kafka does
    max_wait_ms = max(0, min(body.max_wait_ms, MAX_WAIT_MS_MAX))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_ms / 1000

    def read(w: _Wanted, wait_ms: int, wait_for_bytes: int) -> Any:
        return backend.fetch(
            w.topic,
            w.partition,
            PartitionFetch(
                w.fetch_offset,
                w.max_bytes,
                wait_ms,
                wait_for_bytes,
                isolation,
                w.current_leader_epoch,
                rack_id,
            ),
        )

    # 1. First pass: no waiting.
    results: list[FetchResult] = list(await asyncio.gather(*(read(w, 0, 1) for w in wanted)))
    if wanted and deadline > loop.time() and not _enough(results, min_bytes):
        await _long_poll(wanted, results, read, min_bytes, deadline)
    # 2. The budget, then the answer in the request's shape.
    records = _apply_budget([r.records for r in results], body.max_bytes)
    partitions = iter(zip(results, records, strict=True))
    responses = []
    for topic in body.topics:
        parts = []
        for p in topic.partitions:
            result, data = (_DENIED, b"") if topic.topic in denied else next(partitions)
            parts.append(
                _Partition(
                    partition_index=p.partition,
                    error_code=result.error_code,
                    high_watermark=result.high_watermark,
                    last_stable_offset=result.last_stable_offset,
                    log_start_offset=result.log_start_offset,
                    aborted_transactions=_aborted(result) if isolation == READ_COMMITTED else None,
                    preferred_read_replica=result.preferred_read_replica,
                    records=data,
                )
            )
        responses.append(_Topic(topic=topic.topic, partitions=parts))
    # consumer_byte_rate (KIP-13), as Kafka's KafkaApis.handleFetchRequest: the response's bytes
    # are recorded; a client over its quota gets its throttle time and no data (the bytes are
    # taken back), and fetches again once the throttle time has passed.
    fetched = sum(len(data) for data in records if data)
    throttle_ms = context.record_quota(CONSUMER_BYTE_RATE, request, fetched)
    if throttle_ms:
        context.unrecord_quota(CONSUMER_BYTE_RATE, request, fetched)
        responses = []
    return FetchResponse(
        throttle_time_ms=throttle_ms, error_code=ErrorCode.NONE, session_id=0, responses=responses
    )


def _session_error(session_id: int, session_epoch: int) -> int:
    # Kafka's FetchManager.newContext: epoch 0 (open a session) and -1 (FINAL_EPOCH: close one,
    # or none) make a full fetch, whatever the session id; we answer it without a session. An
    # incremental fetch (epoch > 0) names a session we never created.
    if session_epoch <= 0:
        return ErrorCode.NONE
    if session_id == 0:
        return ErrorCode.INVALID_FETCH_SESSION_EPOCH
    return ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def _enough(results: list[FetchResult], min_bytes: int) -> bool:
    if any(r.error_code or r.preferred_read_replica >= 0 for r in results):
        return True
    return sum(len(r.records) for r in results) >= min_bytes


async def _long_poll(
    wanted: list[_Wanted],
    results: list[FetchResult],
    read: Any,
    min_bytes: int,
    deadline: float,
) -> None:
    """Wait on every partition at once until ``deadline``; update ``results`` as answers come.

    Each partition's replica call waits until the deadline for more bytes than that partition
    has found so far (all of ``min_bytes`` when it is the only one), and is re-issued when it
    comes back with more while the request as a whole still has too little.
    """
    loop = asyncio.get_running_loop()
    tasks: dict[asyncio.Future[FetchResult], int] = {}
    single = len(wanted) == 1

    def issue(i: int) -> None:
        wait_ms = max(1, int((deadline - loop.time()) * 1000))
        have = len(results[i].records)
        wait_for = max(1, min_bytes) if single else have + 1
        tasks[asyncio.ensure_future(read(wanted[i], wait_ms, wait_for))] = i

    try:
        for i in range(len(wanted)):
            issue(i)
        # Bounded: the loop ends at the deadline; each call by its own wait plus the backend's
        # call margin, and calls still out then are cancelled below.
        while tasks:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            done, _ = await asyncio.wait(
                tasks, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            answered = [tasks.pop(task) for task in done]
            for task, i in zip(done, answered, strict=True):
                results[i] = task.result()
            if _enough(results, min_bytes):
                return
            if deadline - loop.time() > 0.001:
                for i in answered:
                    issue(i)
    finally:
        for task in tasks:
            task.cancel()  # the replica's own wait ends by itself at the deadline


def _apply_budget(records: list[bytes], max_bytes: int) -> list[bytes]:
    """Keep whole batches within ``max_bytes`` in order; the first data always keeps one batch."""
    total = sum(len(r) for r in records)
    if total <= max_bytes:
        return records
    kept: list[bytes] = []
    left = max(0, max_bytes)
    first = True
    for data in records:
        if not data:
            kept.append(data)
            continue
        size = _whole_batches_within(data, left, at_least_one=first)
        first = False
        kept.append(data if size == len(data) else data[:size])
        left = max(0, left - size)
    return kept


def _whole_batches_within(data: bytes, limit: int, *, at_least_one: bool) -> int:
    """Bytes of the longest run of whole batches at the start of ``data`` that fits ``limit``."""
    pos = 0
    while pos + _LOG_OVERHEAD <= len(data):
        (batch_length,) = _BATCH_LENGTH.unpack_from(data, pos + 8)
        end = pos + _LOG_OVERHEAD + batch_length
        if end > len(data) or (end > limit and not (at_least_one and pos == 0)):
            break
        pos = end
    return pos


def _aborted(result: FetchResult) -> list[Any]:
    return [_Aborted(producer_id=p, first_offset=o) for p, o in result.aborted_transactions]
