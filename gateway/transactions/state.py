"""One transactional id's state machine, pure: Kafka 3.x's TransactionCoordinator decisions.

This module owns what the transaction coordinator decides for a transactional id: which
InitProducerId, AddPartitionsToTxn / AddOffsetsToTxn and EndTxn requests are answered with
which error, which state is appended to ``__transaction_state``, when markers go to the
partition leaders, which transactions time out and which ids expire, and what replaying the
log rebuilds. It does no I/O and reads no clock (time comes in as ``now_ms``, producer ids as
arguments); the coordinator (``coordinator.py``) carries out the :class:`Plan` each decision
returns. The rules are Kafka's (``TransactionCoordinator.scala``, ``TransactionMetadata.scala``,
``TransactionStateManager.scala``).

States (Kafka's TransactionState) and the states each may be entered from::

    state               id  entered from                      by
    Empty                0  Empty, CompleteCommit, CompleteAbort  InitProducerId
    Ongoing              1  Ongoing, Empty, CompleteCommit,    AddPartitionsToTxn, AddOffsetsToTxn
                            CompleteAbort
    PrepareCommit        2  Ongoing                           EndTxn(commit)
    PrepareAbort         3  Ongoing, PrepareEpochFence        EndTxn(abort), fencing, timeout
    CompleteCommit       4  PrepareCommit                     every COMMIT marker written
    CompleteAbort        5  PrepareAbort                      every ABORT marker written
    Dead                 6  Empty, CompleteCommit, CompleteAbort  expiration (a tombstone)
    PrepareEpochFence    7  Ongoing                           InitProducerId or a timeout on an
                                                              Ongoing transaction

PrepareEpochFence is a step Kafka never writes: fencing an Ongoing transaction appends
PrepareAbort with the producer epoch bumped (the fenced producer's requests then get
PRODUCER_FENCED), and InitProducerId answers CONCURRENT_TRANSACTIONS so the client retries
once the abort is complete, and gets the epoch bumped again. A value with status 7 read back
from a log is completed as an abort.

How the coordinator carries out a :class:`Plan`:

1. ``plan.write`` is None: answer ``plan.error`` now.
2. Else put ``plan.pending`` in the table in place of the current metadata (its pending
   transition makes every other request for the id wait: CONCURRENT_TRANSACTIONS), append
   ``to_record(plan.write)`` with acks=all, then

   - acknowledged: table[id] = ``complete_write(table[id], plan.write)`` (None: delete the id),
     answer ``plan.error`` (InitProducerId with ``plan.write``'s producer id and epoch), and
     send ``plan.markers`` if any;
   - failed: table[id] = ``fail_write(table[id], plan)``, answer ``append_error(code)``.

3. When a write leaves the id in PrepareCommit/PrepareAbort (``needs_markers``), carry out
   ``plan_complete(meta, now_ms)``: its markers go to every partition's leader (WriteTxnMarkers
   with the producer id and epoch), and once every marker is written its write (the Complete
   state, partitions emptied) is appended; after that append the id is usable again.
4. After loading a partition of ``__transaction_state`` with :func:`replay`, carry out
   :func:`recovery_plans`: the markers of every transaction left in a Prepare state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from raylog.gateway.errors import ErrorCode
from raylog.gateway.transactions.records import (
    RecordFormatError,
    TransactionLogKey,
    TransactionLogValue,
    TransactionStatus,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)

__all__ = [
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "TRANSACTIONAL_ID_EXPIRATION_MS",
    "TRANSACTION_MAX_TIMEOUT_MS",
    "Plan",
    "TopicPartition",
    "TransactionDescription",
    "TransactionListing",
    "TransactionMetadata",
    "TransactionState",
    "TransactionsList",
    "TxnMarkers",
    "append_error",
    "check_transactional_id",
    "complete_write",
    "describe_transaction",
    "fail_write",
    "fencing_error",
    "is_epoch_exhausted",
    "list_transactions",
    "plan_add_partitions",
    "plan_complete",
    "plan_end_txn",
    "plan_expiration",
    "plan_init_producer_id",
    "plan_timeouts",
    "recovery_plans",
    "replay",
    "to_record",
]

NO_PRODUCER_ID = -1  # RecordBatch.NO_PRODUCER_ID
NO_PRODUCER_EPOCH = -1  # RecordBatch.NO_PRODUCER_EPOCH
MAX_PRODUCER_EPOCH = 0x7FFF  # Short.MaxValue
TRANSACTION_MAX_TIMEOUT_MS = 900_000  # transaction.max.timeout.ms, Kafka's default
TRANSACTIONAL_ID_EXPIRATION_MS = 604_800_000  # transactional.id.expiration.ms, Kafka's default

TopicPartition = tuple[str, int]


class TransactionState(Enum):
    """Kafka's TransactionState: the value is the name DescribeTransactions and
    ListTransactions use; :attr:`status` the id written to the log."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"

    @property
    def status(self) -> TransactionStatus:
        return TransactionStatus[self.name]


_EMPTY = TransactionState.EMPTY
_ONGOING = TransactionState.ONGOING
_PREPARE_COMMIT = TransactionState.PREPARE_COMMIT
_PREPARE_ABORT = TransactionState.PREPARE_ABORT
_COMPLETE_COMMIT = TransactionState.COMPLETE_COMMIT
_COMPLETE_ABORT = TransactionState.COMPLETE_ABORT
_DEAD = TransactionState.DEAD
_PREPARE_EPOCH_FENCE = TransactionState.PREPARE_EPOCH_FENCE

_PREPARE = frozenset({_PREPARE_COMMIT, _PREPARE_ABORT, _PREPARE_EPOCH_FENCE})
_COMPLETE = frozenset({_COMPLETE_COMMIT, _COMPLETE_ABORT})
_EXPIRABLE = frozenset({_EMPTY, _COMPLETE_COMMIT, _COMPLETE_ABORT})  # isExpirationAllowed


@dataclass(frozen=True, slots=True)
class TransactionMetadata:
    """One transactional id's state, as Kafka's TransactionMetadata holds it.

    ``previous_producer_id`` is Kafka's lastProducerId (the producer id before the last
    transition) and ``last_producer_epoch`` the epoch a KIP-360 retry may name; neither is in
    a version 0 record, so both are -1 after :func:`replay`, as in Kafka 3.x. ``pending`` is
    the state a write in flight moves to; ``has_failed_epoch_fence`` marks an epoch bump whose
    write failed (the next fence does not bump again). Neither is written to the log.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    txn_last_update_ms: int
    previous_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    partitions: frozenset[TopicPartition] = frozenset()
    txn_start_ms: int = -1
    pending: TransactionState | None = None
    has_failed_epoch_fence: bool = False

    @property
    def needs_markers(self) -> bool:
        """In a Prepare state with nothing in flight: :func:`plan_complete` carries it on."""
        return self.state in _PREPARE and self.pending is None


class TxnMarkers(NamedTuple):
    """The markers to write: one COMMIT or ABORT control batch per partition, with the
    producer id and epoch (WriteTxnMarkers; its coordinator epoch is the shell's)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[TopicPartition]


class Plan(NamedTuple):
    """What one decision asks the coordinator to do (see the module docstring).

    ``need_producer_id``: nothing else is set; call again with ``new_producer_id``.
    ``fence``: the write bumps the epoch of an Ongoing transaction to abort it.
    """

    error: ErrorCode
    write: TransactionMetadata | None = None
    pending: TransactionMetadata | None = None
    markers: TxnMarkers | None = None
    need_producer_id: bool = False
    fence: bool = False


def _answer(error: ErrorCode) -> Plan:
    return Plan(error)


def _transit(
    meta: TransactionMetadata, error: ErrorCode, fence: bool = False, **changes: object
) -> Plan:
    """Kafka's prepareTransitionTo: ``meta`` moving to the state in ``changes``.

    The written metadata's previous producer id is ``meta``'s producer id, as in Kafka's
    TxnTransitMetadata; the pending metadata is ``meta`` marked with the target state (for a
    fence, with the bumped epoch already, as Kafka sets it before the append).
    """
    write = dataclasses.replace(
        meta,
        previous_producer_id=meta.producer_id,
        pending=None,
        has_failed_epoch_fence=False,
        **changes,
    )
    pending = dataclasses.replace(meta, pending=write.state)
    if fence:
        pending = dataclasses.replace(
            pending, producer_epoch=write.producer_epoch, last_producer_epoch=NO_PRODUCER_EPOCH
        )
    return Plan(error, write=write, pending=pending, fence=fence)


def is_epoch_exhausted(producer_epoch: int) -> bool:
    """Kafka's isEpochExhausted: Short.MaxValue stays free so a producer can always be fenced."""
    return producer_epoch >= MAX_PRODUCER_EPOCH - 1


def check_transactional_id(transactional_id: str | None) -> ErrorCode:
    """INVALID_REQUEST for a null or empty transactional id (Kafka's check on every
    transactional API), else NONE."""
    return ErrorCode.NONE if transactional_id else ErrorCode.INVALID_REQUEST


# --- InitProducerId ---------------------------------------------------------------------------


def plan_init_producer_id(
    meta: TransactionMetadata | None,
    transactional_id: str,
    txn_timeout_ms: int,
    expected_producer_id: int,
    expected_epoch: int,
    max_timeout_ms: int,
    now_ms: int,
    new_producer_id: int | None = None,
) -> Plan:
    """InitProducerId for ``transactional_id`` (Kafka's handleInitProducerId).

    ``expected_producer_id``/``expected_epoch`` are the request's (v3+, KIP-360; -1/-1 when
    absent). When the decision needs a fresh producer id (an unknown transactional id, or an
    exhausted epoch) and ``new_producer_id`` is None, the plan says ``need_producer_id``: the
    coordinator takes one from its block and calls again with the same arguments.
    """
    if (error := check_transactional_id(transactional_id)) != ErrorCode.NONE:
        return _answer(error)
    if not 0 < txn_timeout_ms <= max_timeout_ms:
        return _answer(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
    if (expected_producer_id == NO_PRODUCER_ID) != (expected_epoch == NO_PRODUCER_EPOCH):
        return _answer(ErrorCode.INVALID_REQUEST)  # one of the two given: KafkaApis refuses it
    expected = expected_producer_id != NO_PRODUCER_ID
    if meta is None:
        if new_producer_id is None:
            return Plan(ErrorCode.NONE, need_producer_id=True)
        meta = TransactionMetadata(
            transactional_id,
            producer_id=new_producer_id,
            producer_epoch=NO_PRODUCER_EPOCH,
            txn_timeout_ms=txn_timeout_ms,
            state=_EMPTY,
            txn_last_update_ms=now_ms,
        )
    if meta.pending is not None:
        return _answer(ErrorCode.CONCURRENT_TRANSACTIONS)
    if expected and not (
        # Kafka's isValidProducerId: a just-created id; the current id (its epoch is checked
        # below); or the previous id at an exhausted epoch (a retry of a producer id rotation).
        meta.producer_epoch == NO_PRODUCER_EPOCH
        or expected_producer_id == meta.producer_id
        or (
            expected_producer_id == meta.previous_producer_id and is_epoch_exhausted(expected_epoch)
        )
    ):
        return _answer(ErrorCode.PRODUCER_FENCED)
    if meta.state == _ONGOING:
        # Abort the Ongoing transaction under a bumped epoch and let the client retry; its
        # retry bumps the epoch again (or rotates the producer id if that exhausted it).
        return _fence(meta, now_ms, ErrorCode.CONCURRENT_TRANSACTIONS)
    if meta.state not in _EXPIRABLE:  # a Prepare state: markers are being written
        return _answer(ErrorCode.CONCURRENT_TRANSACTIONS)
    if is_epoch_exhausted(meta.producer_epoch) and (
        not expected or expected_epoch == meta.producer_epoch
    ):
        if new_producer_id is None:
            return Plan(ErrorCode.NONE, need_producer_id=True)
        return _init(
            meta,
            txn_timeout_ms,
            now_ms,
            producer_id=new_producer_id,
            producer_epoch=0,
            last_producer_epoch=meta.producer_epoch if expected else NO_PRODUCER_EPOCH,
        )
    # Kafka's prepareIncrementProducerEpoch.
    if not expected:
        epoch, last_epoch = meta.producer_epoch + 1, NO_PRODUCER_EPOCH
    elif meta.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == meta.producer_epoch:
        epoch, last_epoch = meta.producer_epoch + 1, meta.producer_epoch
    elif expected_epoch == meta.last_producer_epoch:
        # A retry of a bump whose answer was lost: the same epoch again, not bumped.
        epoch, last_epoch = meta.producer_epoch, meta.last_producer_epoch
    else:
        return _answer(ErrorCode.PRODUCER_FENCED)
    return _init(
        meta,
        txn_timeout_ms,
        now_ms,
        producer_id=meta.producer_id,
        producer_epoch=epoch,
        last_producer_epoch=last_epoch,
    )


def _init(meta: TransactionMetadata, txn_timeout_ms: int, now_ms: int, **ids: int) -> Plan:
    return _transit(
        meta,
        ErrorCode.NONE,
        state=_EMPTY,
        txn_timeout_ms=txn_timeout_ms,
        partitions=frozenset(),
        txn_start_ms=-1,
        txn_last_update_ms=now_ms,
        **ids,
    )


def _fence(meta: TransactionMetadata, now_ms: int, error: ErrorCode) -> Plan:
    """Kafka's prepareFenceProducerEpoch + endTransaction(ABORT, isFromClient = false):
    PrepareAbort under the bumped epoch (not bumped again after a fence whose write failed)."""
    bump = not meta.has_failed_epoch_fence and meta.producer_epoch < MAX_PRODUCER_EPOCH
    return _transit(
        meta,
        error,
        fence=True,
        state=_PREPARE_ABORT,
        producer_epoch=meta.producer_epoch + 1 if bump else meta.producer_epoch,
        last_producer_epoch=NO_PRODUCER_EPOCH,
        txn_last_update_ms=now_ms,
    )


# --- AddPartitionsToTxn, AddOffsetsToTxn, EndTxn ----------------------------------------------


def _check_producer(
    meta: TransactionMetadata | None, producer_id: int, producer_epoch: int
) -> ErrorCode:
    if meta is None or meta.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if meta.producer_epoch != producer_epoch:
        return ErrorCode.PRODUCER_FENCED
    if meta.pending is not None:
        return ErrorCode.CONCURRENT_TRANSACTIONS
    return ErrorCode.NONE


def plan_add_partitions(
    meta: TransactionMetadata | None,
    producer_id: int,
    producer_epoch: int,
    partitions: Iterable[TopicPartition],
    now_ms: int,
) -> Plan:
    """AddPartitionsToTxn (and AddOffsetsToTxn, with the group's ``__consumer_offsets``
    partition): Ongoing with the partitions added; the transaction starts now when it was not
    Ongoing. Partitions all in the Ongoing transaction already: NONE without a write."""
    if (error := _check_producer(meta, producer_id, producer_epoch)) != ErrorCode.NONE:
        return _answer(error)
    assert meta is not None  # _check_producer refuses None
    if meta.state in _PREPARE:
        return _answer(ErrorCode.CONCURRENT_TRANSACTIONS)
    added = frozenset(partitions)
    if meta.state == _ONGOING and added <= meta.partitions:
        return _answer(ErrorCode.NONE)
    return _transit(
        meta,
        ErrorCode.NONE,
        state=_ONGOING,
        partitions=meta.partitions | added,
        txn_start_ms=meta.txn_start_ms if meta.state == _ONGOING else now_ms,
        txn_last_update_ms=now_ms,
    )


def plan_end_txn(
    meta: TransactionMetadata | None,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    now_ms: int,
) -> Plan:
    """EndTxn: Ongoing -> PrepareCommit/PrepareAbort, answered NONE once written (the markers
    follow, :func:`plan_complete`). A retry of the same outcome gets CONCURRENT_TRANSACTIONS
    while the markers are being written and NONE once complete; the other outcome, or EndTxn
    on an Empty id, INVALID_TXN_STATE."""
    if (error := _check_producer(meta, producer_id, producer_epoch)) != ErrorCode.NONE:
        return _answer(error)
    assert meta is not None  # _check_producer refuses None
    state = meta.state
    if state == _ONGOING:
        target = _PREPARE_COMMIT if commit else _PREPARE_ABORT
        return _transit(meta, ErrorCode.NONE, state=target, txn_last_update_ms=now_ms)
    if state == _PREPARE_EPOCH_FENCE:
        same = not commit
    else:
        same = state in ((_PREPARE_COMMIT, _COMPLETE_COMMIT) if commit else _ABORTS)
    if not same:
        return _answer(ErrorCode.INVALID_TXN_STATE)
    if state in _COMPLETE:
        return _answer(ErrorCode.NONE)
    return _answer(ErrorCode.CONCURRENT_TRANSACTIONS)


_ABORTS = (_PREPARE_ABORT, _COMPLETE_ABORT)


# --- markers and completion -------------------------------------------------------------------


def plan_complete(meta: TransactionMetadata, now_ms: int) -> Plan:
    """The markers of a transaction in a Prepare state, and the Complete state to append once
    every one is written (Kafka's prepareComplete; the partitions are emptied)."""
    if meta.state not in _PREPARE:
        raise ValueError(f"{meta.transactional_id} is {meta.state.value}, not in a Prepare state")
    if meta.pending is not None:
        raise ValueError(f"{meta.transactional_id} has a write in flight")
    commit = meta.state == _PREPARE_COMMIT
    plan = _transit(
        meta,
        ErrorCode.NONE,
        state=_COMPLETE_COMMIT if commit else _COMPLETE_ABORT,
        partitions=frozenset(),
        txn_last_update_ms=now_ms,
    )
    markers = TxnMarkers(
        meta.transactional_id, meta.producer_id, meta.producer_epoch, commit, meta.partitions
    )
    return plan._replace(markers=markers)


def complete_write(
    current: TransactionMetadata, write: TransactionMetadata
) -> TransactionMetadata | None:
    """The metadata once ``write`` is acknowledged (Kafka's completeTransitionTo); None when the
    id is deleted (its tombstone was written). ValueError if ``current`` was not waiting for
    this write: the coordinator lost track of its own writes."""
    if current.pending != write.state or current.transactional_id != write.transactional_id:
        raise ValueError(
            f"{current.transactional_id}: a write of {write.state.value} completed while "
            f"{current.pending.value if current.pending else 'nothing'} was pending"
        )
    return None if write.state == _DEAD else write


def fail_write(current: TransactionMetadata, plan: Plan) -> TransactionMetadata:
    """The metadata once ``plan``'s write failed: nothing pending; a failed fence keeps its
    bumped epoch in memory, and the next fence does not bump again."""
    return dataclasses.replace(
        current,
        pending=None,
        has_failed_epoch_fence=current.has_failed_epoch_fence or plan.fence,
    )


def append_error(code: int) -> ErrorCode:
    """The error to answer when appending to ``__transaction_state`` failed with ``code``
    (Kafka's appendTransactionToLog): retriable ones the client knows how to wait out."""
    error = ErrorCode(code)
    if error in _APPEND_UNAVAILABLE:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if error in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    if error in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE):
        return ErrorCode.UNKNOWN_SERVER_ERROR
    return error


_APPEND_UNAVAILABLE = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)

# API keys whose versions below these answer INVALID_PRODUCER_EPOCH for PRODUCER_FENCED
# (KIP-588): InitProducerId 22 (v4), AddPartitionsToTxn 24, AddOffsetsToTxn 25, EndTxn 26
# (v2), TxnOffsetCommit 28 (v3).
_PRODUCER_FENCED_SINCE = {22: 4, 24: 2, 25: 2, 26: 2, 28: 3}


def fencing_error(api_key: int, api_version: int, error: ErrorCode) -> ErrorCode:
    """``error`` as a client of ``api_version`` knows it: PRODUCER_FENCED (90) becomes
    INVALID_PRODUCER_EPOCH (47) below the version that introduced it (KIP-588)."""
    since = _PRODUCER_FENCED_SINCE.get(api_key)
    if error == ErrorCode.PRODUCER_FENCED and since is not None and api_version < since:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return error


# --- timeouts and expiration ------------------------------------------------------------------


def plan_timeouts(metas: Iterable[TransactionMetadata], now_ms: int) -> list[Plan]:
    """Kafka's abortTimedOutTransactions: every Ongoing transaction open longer than its
    timeout is aborted under a bumped epoch, so its producer is fenced."""
    return [
        _fence(meta, now_ms, ErrorCode.NONE)
        for meta in metas
        if meta.state == _ONGOING
        and meta.pending is None
        and meta.txn_start_ms + meta.txn_timeout_ms < now_ms
    ]


def plan_expiration(
    metas: Iterable[TransactionMetadata], now_ms: int, expiration_ms: int
) -> list[Plan]:
    """Ids idle (Empty or Complete) for ``transactional.id.expiration.ms``: Dead, written as a
    tombstone (Kafka's prepareDead)."""
    return [
        _transit(meta, ErrorCode.NONE, state=_DEAD, partitions=frozenset())
        for meta in metas
        if meta.state in _EXPIRABLE
        and meta.pending is None
        and meta.txn_last_update_ms <= now_ms - expiration_ms
    ]


# --- the log ----------------------------------------------------------------------------------


def to_record(meta: TransactionMetadata) -> tuple[bytes, bytes | None]:
    """The key and value to append for ``meta`` (Kafka 3.x's version 0; Empty's partitions
    null); a Dead id's value is None, a tombstone."""
    key = encode_key(TransactionLogKey(meta.transactional_id))
    if meta.state == _DEAD:
        return key, None
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(meta.partitions):
        by_topic.setdefault(topic, []).append(partition)
    value = TransactionLogValue(
        producer_id=meta.producer_id,
        producer_epoch=meta.producer_epoch,
        transaction_timeout_ms=meta.txn_timeout_ms,
        transaction_status=meta.state.status,
        transaction_partitions=None
        if meta.state == _EMPTY
        else tuple((topic, tuple(ids)) for topic, ids in by_topic.items()),
        transaction_last_update_timestamp_ms=meta.txn_last_update_ms,
        transaction_start_timestamp_ms=meta.txn_start_ms,
        previous_producer_id=meta.previous_producer_id,
    )
    return key, encode_value(value)


def replay(
    records: Iterable[tuple[bytes, bytes | None]],
    on_error: Callable[[int, RecordFormatError], None] | None = None,
) -> dict[str, TransactionMetadata]:
    """Every transactional id's metadata from a partition's (key, value) records in offset
    order: the last value wins, a tombstone (or a Dead value) deletes. A record that does not
    decode raises RecordFormatError, or, given ``on_error``, is passed to it with its index in
    ``records`` and skipped."""
    metas: dict[str, TransactionMetadata] = {}
    for index, (key_bytes, value_bytes) in enumerate(records):
        try:
            key = decode_key(key_bytes)
            value = None if value_bytes is None else decode_value(value_bytes)
        except RecordFormatError as exc:
            if on_error is None:
                raise RecordFormatError(f"record {index}: {exc}") from None
            on_error(index, exc)
            continue
        if value is None or value.transaction_status == TransactionStatus.DEAD:
            metas.pop(key.transactional_id, None)
            continue
        state = TransactionState[TransactionStatus(value.transaction_status).name]
        partitions = frozenset(
            (topic, p) for topic, ids in value.transaction_partitions or () for p in ids
        )
        metas[key.transactional_id] = TransactionMetadata(
            key.transactional_id,
            producer_id=value.producer_id,
            producer_epoch=value.producer_epoch,
            txn_timeout_ms=value.transaction_timeout_ms,
            state=state,
            txn_last_update_ms=value.transaction_last_update_timestamp_ms,
            previous_producer_id=value.previous_producer_id,
            partitions=frozenset() if state == _EMPTY else partitions,
            txn_start_ms=value.transaction_start_timestamp_ms,
        )
    return metas


def recovery_plans(metas: Mapping[str, TransactionMetadata], now_ms: int) -> list[Plan]:
    """After :func:`replay`: the markers and completion of every transaction left in a Prepare
    state (Kafka's loadTransactionsForTxnTopicPartition)."""
    return [plan_complete(meta, now_ms) for meta in metas.values() if meta.needs_markers]


# --- DescribeTransactions, ListTransactions (KIP-664) -----------------------------------------


class TransactionDescription(NamedTuple):
    """One DescribeTransactions answer; ``topics`` is (topic, partitions) sorted."""

    error_code: int
    transactional_id: str
    state: str = ""
    txn_timeout_ms: int = 0
    txn_start_ms: int = -1
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    topics: tuple[tuple[str, tuple[int, ...]], ...] = ()


def describe_transaction(
    meta: TransactionMetadata | None, transactional_id: str
) -> TransactionDescription:
    """Kafka's handleDescribeTransactions for an id this coordinator owns."""
    if check_transactional_id(transactional_id) != ErrorCode.NONE:
        return TransactionDescription(ErrorCode.INVALID_REQUEST, transactional_id)
    if meta is None or meta.state == _DEAD:
        return TransactionDescription(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, transactional_id)
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(meta.partitions):
        by_topic.setdefault(topic, []).append(partition)
    return TransactionDescription(
        ErrorCode.NONE,
        transactional_id,
        state=meta.state.value,
        txn_timeout_ms=meta.txn_timeout_ms,
        txn_start_ms=meta.txn_start_ms,
        producer_id=meta.producer_id,
        producer_epoch=meta.producer_epoch,
        topics=tuple((topic, tuple(ids)) for topic, ids in by_topic.items()),
    )


class TransactionListing(NamedTuple):
    transactional_id: str
    producer_id: int
    state: str


class TransactionsList(NamedTuple):
    """ListTransactions' answer from one coordinator: the state filters it does not know
    (Kafka answers them, and ignores them) and the matching transactions, sorted by id."""

    unknown_state_filters: tuple[str, ...]
    transactions: tuple[TransactionListing, ...]


def list_transactions(
    metas: Iterable[TransactionMetadata],
    state_filters: Iterable[str] = (),
    producer_id_filters: Iterable[int] = (),
    duration_filter_ms: int = -1,
    now_ms: int = 0,
) -> TransactionsList:
    """Kafka's listTransactionStates: every id but the Dead, with a state among
    ``state_filters`` and a producer id among ``producer_id_filters`` (empty filters match
    all) and, with ``duration_filter_ms`` >= 0 (KIP-994), started more than that long ago."""
    by_name = {state.value: state for state in TransactionState}
    names = list(dict.fromkeys(state_filters))
    states = {by_name[name] for name in names if name in by_name}
    unknown = tuple(name for name in names if name not in by_name)
    producer_ids = set(producer_id_filters)
    listed = [
        TransactionListing(meta.transactional_id, meta.producer_id, meta.state.value)
        for meta in metas
        if meta.state != _DEAD
        and (not producer_ids or meta.producer_id in producer_ids)
        and (not names or meta.state in states)
        and (duration_filter_ms < 0 or now_ms - meta.txn_start_ms > duration_filter_ms)
    ]
    return TransactionsList(unknown, tuple(sorted(listed)))
