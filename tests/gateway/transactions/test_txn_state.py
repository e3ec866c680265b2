"""The transaction coordinator's pure state machine: Kafka 3.x's decisions for one
transactional id.

Proves, driving plans the way the coordinator carries them out (every write also read back
through ``__transaction_state``'s records): InitProducerId's timeouts, new ids, epoch bumps,
KIP-360 retries and fencing, epoch exhaustion and producer id rotation, fencing an Ongoing
transaction (and not bumping twice after a failed fence); AddPartitionsToTxn's refusals and
unions; EndTxn's transitions, retries and refusals; markers and completion; the timeout abort;
expiration as a tombstone; replay and recovery; DescribeTransactions and ListTransactions; the
append and fencing error mappings; and every write's transition being one Kafka allows.
"""

from __future__ import annotations

import dataclasses

import pytest

from raylog.gateway.errors import ErrorCode
from raylog.gateway.transactions import state as ts
from raylog.gateway.transactions.records import (
    RecordFormatError,
    TransactionLogKey,
    TransactionLogValue,
    TransactionStatus,
    encode_key,
    encode_value,
)
from raylog.gateway.transactions.state import Plan, TransactionMetadata, TransactionState

S = TransactionState
MAX = ts.TRANSACTION_MAX_TIMEOUT_MS
TID = "payments"
T0 = 1_000_000

# Kafka's validPreviousStates: the only transitions a write may make.
VALID_PREVIOUS = {
    S.EMPTY: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.ONGOING: {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.PREPARE_COMMIT: {S.ONGOING},
    S.PREPARE_ABORT: {S.ONGOING, S.PREPARE_EPOCH_FENCE},
    S.COMPLETE_COMMIT: {S.PREPARE_COMMIT},
    S.COMPLETE_ABORT: {S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE},
    S.DEAD: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
}


class Coordinator:
    """Carries out plans as coordinator.py does, with appends that succeed unless told."""

    def __init__(self) -> None:
        self.table: dict[str, TransactionMetadata] = {}
        self.log: list[tuple[bytes, bytes | None]] = []
        self.markers: list[ts.TxnMarkers] = []

    def start(self, plan: Plan) -> TransactionMetadata:
        """The pending half: the plan's write is in flight."""
        assert plan.write is not None and plan.pending is not None
        before = self.table.get(plan.write.transactional_id)
        if before is not None:
            assert before.state in VALID_PREVIOUS[plan.write.state], (before.state, plan.write)
        self.table[plan.write.transactional_id] = plan.pending
        return plan.write

    def finish(self, plan: Plan, ok: bool = True) -> None:
        write = plan.write
        assert write is not None
        current = self.table[write.transactional_id]
        if not ok:
            self.table[write.transactional_id] = ts.fail_write(current, plan)
            return
        self.log.append(ts.to_record(write))
        done = ts.complete_write(current, write)
        if done is None:
            del self.table[write.transactional_id]
        else:
            self.table[write.transactional_id] = done
            # what the log holds is what the table holds, but for the fields v0 cannot carry
            replayed = ts.replay([self.log[-1]])[write.transactional_id]
            assert replayed == dataclasses.replace(
                done, previous_producer_id=-1, last_producer_epoch=-1
            )
        if plan.markers:
            self.markers.append(plan.markers)

    def run(self, plan: Plan, now_ms: int = T0) -> ErrorCode:
        """A plan carried out to its end: its write, then markers and completion if due."""
        if plan.write is None:
            return plan.error
        self.start(plan)
        self.finish(plan)
        meta = self.table.get(plan.write.transactional_id)
        if meta is not None and meta.needs_markers:
            self.run(ts.plan_complete(meta, now_ms), now_ms)
        return plan.error

    def meta(self, tid: str = TID) -> TransactionMetadata:
        return self.table[tid]

    def init(
        self, tid: str = TID, expected: tuple[int, int] = (-1, -1), new_id: int = 100, **kw: int
    ) -> Plan:
        args = dict(txn_timeout_ms=60_000, max_timeout_ms=MAX, now_ms=T0)
        args.update(kw)

        def plan(new_producer_id: int | None = None) -> Plan:
            return ts.plan_init_producer_id(
                self.table.get(tid),
                tid,
                args["txn_timeout_ms"],
                *expected,
                args["max_timeout_ms"],
                args["now_ms"],
                new_producer_id,
            )

        first = plan()
        if not first.need_producer_id:
            return first
        assert first.write is None
        return plan(new_id)

    def add(self, partitions: list[tuple[str, int]], now_ms: int = T0, tid: str = TID) -> Plan:
        meta = self.table[tid]
        return ts.plan_add_partitions(
            meta, meta.producer_id, meta.producer_epoch, partitions, now_ms
        )

    def end(self, commit: bool, tid: str = TID) -> Plan:
        meta = self.table[tid]
        return ts.plan_end_txn(meta, meta.producer_id, meta.producer_epoch, commit, T0 + 5)


@pytest.fixture
def c() -> Coordinator:
    coordinator = Coordinator()
    assert coordinator.run(coordinator.init()) == ErrorCode.NONE
    return coordinator


def ongoing(c: Coordinator, *partitions: tuple[str, int]) -> None:
    assert c.run(c.add(list(partitions or [("orders", 0)]))) == ErrorCode.NONE
    assert c.meta().state == S.ONGOING


# --- InitProducerId ---------------------------------------------------------------------------


def test_a_new_transactional_id_gets_a_fresh_producer_id_at_epoch_0() -> None:
    c = Coordinator()
    first = ts.plan_init_producer_id(None, TID, 60_000, -1, -1, MAX, T0)
    assert first.need_producer_id and first.write is None
    plan = c.init(new_id=42)
    assert plan.error == ErrorCode.NONE and plan.pending is not None
    assert (plan.pending.producer_epoch, plan.pending.pending) == (-1, S.EMPTY)
    c.run(plan)
    meta = c.meta()
    assert (meta.producer_id, meta.producer_epoch, meta.state) == (42, 0, S.EMPTY)
    assert (meta.txn_timeout_ms, meta.txn_start_ms, meta.txn_last_update_ms) == (60_000, -1, T0)


@pytest.mark.parametrize("timeout_ms", [0, -1, MAX + 1])
def test_a_timeout_out_of_range_is_invalid_transaction_timeout(timeout_ms: int) -> None:
    assert Coordinator().init(txn_timeout_ms=timeout_ms).error == 50
    assert Coordinator().init(txn_timeout_ms=MAX).error == ErrorCode.NONE


def test_an_empty_id_or_half_an_expected_producer_is_an_invalid_request() -> None:
    assert Coordinator().init(tid="").error == ErrorCode.INVALID_REQUEST
    assert Coordinator().init(expected=(5, -1)).error == ErrorCode.INVALID_REQUEST
    assert Coordinator().init(expected=(-1, 0)).error == ErrorCode.INVALID_REQUEST
    assert ts.check_transactional_id(None) == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("end", [None, True, False])
def test_init_on_an_empty_or_complete_id_bumps_the_epoch(c: Coordinator, end: bool | None) -> None:
    if end is not None:
        ongoing(c)
        c.run(c.end(commit=end))
        assert c.meta().state == (S.COMPLETE_COMMIT if end else S.COMPLETE_ABORT)
    plan = c.init(txn_timeout_ms=30_000, now_ms=T0 + 9)
    c.run(plan)
    meta = c.meta()
    assert (meta.producer_id, meta.producer_epoch, meta.last_producer_epoch) == (100, 1, -1)
    assert (meta.state, meta.partitions, meta.txn_start_ms) == (S.EMPTY, frozenset(), -1)
    assert (meta.txn_timeout_ms, meta.txn_last_update_ms) == (30_000, T0 + 9)


def test_init_while_markers_are_written_or_a_write_is_in_flight_is_concurrent(
    c: Coordinator,
) -> None:
    ongoing(c)
    prepare = c.end(commit=True)
    c.start(prepare)
    assert c.init().error == ErrorCode.CONCURRENT_TRANSACTIONS  # the write in flight
    c.finish(prepare)
    assert c.meta().state == S.PREPARE_COMMIT
    assert c.init().error == ErrorCode.CONCURRENT_TRANSACTIONS  # before the markers
    complete = ts.plan_complete(c.meta(), T0)
    c.start(complete)
    assert c.init().error == ErrorCode.CONCURRENT_TRANSACTIONS  # markers being written
    c.finish(complete)
    assert c.init().error == ErrorCode.NONE


def test_init_on_an_ongoing_transaction_fences_it_and_answers_concurrent(c: Coordinator) -> None:
    ongoing(c, ("orders", 0), ("orders", 1))
    plan = c.init()
    assert plan.error == ErrorCode.CONCURRENT_TRANSACTIONS and plan.fence
    assert plan.write is not None and plan.pending is not None
    assert (plan.write.state, plan.write.producer_epoch) == (S.PREPARE_ABORT, 1)
    assert plan.write.partitions == {("orders", 0), ("orders", 1)}
    c.start(plan)
    # the fenced producer (epoch 0) is told so while the abort is written
    assert ts.plan_add_partitions(c.meta(), 100, 0, [("x", 0)], T0).error == 90
    assert ts.plan_end_txn(c.meta(), 100, 0, True, T0).error == 90
    c.finish(plan)
    complete = ts.plan_complete(c.meta(), T0)
    assert complete.markers == ts.TxnMarkers(
        TID, 100, 1, False, frozenset({("orders", 0), ("orders", 1)})
    )
    c.run(complete)
    assert (c.meta().state, c.meta().partitions) == (S.COMPLETE_ABORT, frozenset())
    c.run(c.init())  # the client's retry bumps once more
    assert (c.meta().state, c.meta().producer_epoch) == (S.EMPTY, 2)


def test_a_failed_fence_keeps_its_epoch_and_is_not_bumped_again(c: Coordinator) -> None:
    ongoing(c)
    plan = c.init()
    c.start(plan)
    c.finish(plan, ok=False)
    meta = c.meta()
    assert (meta.state, meta.producer_epoch, meta.pending) == (S.ONGOING, 1, None)
    assert meta.has_failed_epoch_fence
    again = c.init()
    assert again.write is not None and again.write.producer_epoch == 1
    c.run(again)
    assert (c.meta().state, c.meta().producer_epoch) == (S.COMPLETE_ABORT, 1)
    assert not c.meta().has_failed_epoch_fence


def test_a_failed_write_leaves_the_id_usable(c: Coordinator) -> None:
    plan = c.init()
    c.start(plan)
    assert c.init().error == ErrorCode.CONCURRENT_TRANSACTIONS
    c.finish(plan, ok=False)
    assert (c.meta().producer_epoch, c.meta().pending) == (0, None)
    c.run(c.init())
    assert c.meta().producer_epoch == 1


# --- KIP-360 ----------------------------------------------------------------------------------


def test_kip360_a_producer_naming_its_current_epoch_is_bumped_and_may_retry(
    c: Coordinator,
) -> None:
    c.run(c.init(expected=(100, 0)))
    assert (c.meta().producer_epoch, c.meta().last_producer_epoch) == (1, 0)
    retry = c.init(expected=(100, 0))  # the answer was lost: the same epoch again
    assert retry.write is not None and retry.write.producer_epoch == 1
    c.run(retry)
    assert (c.meta().producer_epoch, c.meta().last_producer_epoch) == (1, 0)


def test_kip360_other_producers_are_fenced(c: Coordinator) -> None:
    c.run(c.init())  # epoch 1; a plain InitProducerId forgets the last epoch
    assert c.init(expected=(100, 0)).error == ErrorCode.PRODUCER_FENCED
    assert c.init(expected=(100, 5)).error == ErrorCode.PRODUCER_FENCED
    assert c.init(expected=(7, 1)).error == ErrorCode.PRODUCER_FENCED


def test_kip360_a_new_id_accepts_any_expected_producer() -> None:
    c = Coordinator()
    c.run(c.init(expected=(7, 3)))
    assert (c.meta().producer_id, c.meta().producer_epoch) == (100, 0)


# --- epoch exhaustion -------------------------------------------------------------------------


def exhausted(c: Coordinator, epoch: int = 32766) -> None:
    c.table[TID] = dataclasses.replace(c.meta(), producer_epoch=epoch)


def test_an_exhausted_epoch_rotates_the_producer_id(c: Coordinator) -> None:
    assert not ts.is_epoch_exhausted(32765) and ts.is_epoch_exhausted(32766)
    exhausted(c)
    first = ts.plan_init_producer_id(c.meta(), TID, 60_000, -1, -1, MAX, T0)
    assert first.need_producer_id
    c.run(c.init(new_id=200))
    meta = c.meta()
    assert (meta.producer_id, meta.producer_epoch, meta.last_producer_epoch) == (200, 0, -1)
    assert meta.previous_producer_id == 100


def test_kip360_a_rotation_records_the_last_epoch_and_its_retry_succeeds(c: Coordinator) -> None:
    exhausted(c)
    c.run(c.init(expected=(100, 32766), new_id=200))
    meta = c.meta()
    assert (meta.producer_id, meta.producer_epoch, meta.last_producer_epoch) == (200, 0, 32766)
    retry = c.init(expected=(100, 32766), new_id=300)  # the rotation's answer was lost
    assert retry.write is not None
    assert (retry.write.producer_id, retry.write.producer_epoch) == (200, 0)
    # the previous producer id at an epoch that is not exhausted is an old producer
    assert c.init(expected=(100, 0)).error == ErrorCode.PRODUCER_FENCED


def test_an_exhausted_epoch_named_by_another_producer_is_fenced(c: Coordinator) -> None:
    exhausted(c)
    assert c.init(expected=(100, 12)).error == ErrorCode.PRODUCER_FENCED


def test_fencing_at_the_last_epoch_does_not_overflow(c: Coordinator) -> None:
    ongoing(c)
    exhausted(c, epoch=32766)
    plan = c.init()
    assert plan.write is not None and plan.write.producer_epoch == 32767
    c.run(plan)
    c.run(c.init(new_id=201))  # 32767 is exhausted: the retry rotates
    assert (c.meta().producer_id, c.meta().producer_epoch) == (201, 0)


# --- AddPartitionsToTxn -----------------------------------------------------------------------


def test_add_partitions_refusals(c: Coordinator) -> None:
    assert ts.plan_add_partitions(None, 100, 0, [("t", 0)], T0).error == 49
    assert ts.plan_add_partitions(c.meta(), 101, 0, [("t", 0)], T0).error == 49
    assert ts.plan_add_partitions(c.meta(), 100, 1, [("t", 0)], T0).error == 90
    ongoing(c)
    prepare = c.end(commit=False)
    c.start(prepare)
    assert c.add([("t", 0)]).error == ErrorCode.CONCURRENT_TRANSACTIONS
    c.finish(prepare)
    assert c.add([("t", 0)]).error == ErrorCode.CONCURRENT_TRANSACTIONS  # PrepareAbort


def test_add_partitions_starts_a_transaction_and_adds_to_it(c: Coordinator) -> None:
    c.run(c.add([("a", 0)], now_ms=T0 + 10))
    meta = c.meta()
    assert (meta.state, meta.partitions, meta.txn_start_ms) == (S.ONGOING, {("a", 0)}, T0 + 10)
    again = c.add([("a", 0)], now_ms=T0 + 20)
    assert again == Plan(ErrorCode.NONE)  # nothing new: no write
    c.run(c.add([("a", 0), ("b", 3)], now_ms=T0 + 30))
    meta = c.meta()
    assert meta.partitions == {("a", 0), ("b", 3)}
    assert (meta.txn_start_ms, meta.txn_last_update_ms) == (T0 + 10, T0 + 30)


def test_a_transaction_after_a_complete_one_starts_anew(c: Coordinator) -> None:
    ongoing(c)
    c.run(c.end(commit=True))
    c.run(c.add([("b", 1)], now_ms=T0 + 50))
    assert (c.meta().partitions, c.meta().txn_start_ms) == ({("b", 1)}, T0 + 50)


# --- EndTxn -----------------------------------------------------------------------------------


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_prepares_sends_markers_and_completes(c: Coordinator, commit: bool) -> None:
    ongoing(c, ("orders", 0), ("audit", 2))
    plan = c.end(commit)
    assert plan.error == ErrorCode.NONE and plan.markers is None and not plan.fence
    c.start(plan)
    c.finish(plan)
    meta = c.meta()
    assert meta.state == (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT) and meta.needs_markers
    assert ts.recovery_plans(c.table, T0) == [ts.plan_complete(meta, T0)]
    complete = ts.plan_complete(meta, T0 + 7)
    assert complete.markers == ts.TxnMarkers(
        TID, 100, 0, commit, frozenset({("orders", 0), ("audit", 2)})
    )
    c.run(complete)
    meta = c.meta()
    assert meta.state == (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
    assert (meta.partitions, meta.txn_last_update_ms, meta.producer_epoch) == (
        frozenset(),
        T0 + 7,
        0,
    )
    assert not meta.needs_markers and ts.recovery_plans(c.table, T0) == []


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_retries_and_the_other_outcome(c: Coordinator, commit: bool) -> None:
    ongoing(c)
    prepare = c.end(commit)
    c.start(prepare)
    c.finish(prepare)
    assert c.end(commit).error == ErrorCode.CONCURRENT_TRANSACTIONS  # Prepare: retry later
    assert c.end(not commit).error == ErrorCode.INVALID_TXN_STATE
    c.run(ts.plan_complete(c.meta(), T0))
    assert c.end(commit) == Plan(ErrorCode.NONE)  # Complete: the retry succeeds, no write
    assert c.end(not commit).error == ErrorCode.INVALID_TXN_STATE


def test_end_txn_refusals(c: Coordinator) -> None:
    assert c.end(commit=True).error == ErrorCode.INVALID_TXN_STATE  # Empty
    assert ts.plan_end_txn(None, 100, 0, True, T0).error == 49
    assert ts.plan_end_txn(c.meta(), 5, 0, True, T0).error == 49
    assert ts.plan_end_txn(c.meta(), 100, 1, True, T0).error == 90  # a newer epoch: fenced too


# --- timeouts and expiration ------------------------------------------------------------------


def test_timed_out_transactions_are_aborted_under_a_bumped_epoch(c: Coordinator) -> None:
    ongoing(c)  # starts at T0 with a 60 s timeout
    c.run(Coordinator.init(c, tid="idle"))
    assert ts.plan_timeouts(c.table.values(), T0 + 60_000) == []
    (plan,) = ts.plan_timeouts(c.table.values(), T0 + 60_001)
    assert plan.fence and plan.error == ErrorCode.NONE and plan.write is not None
    assert (plan.write.transactional_id, plan.write.state) == (TID, S.PREPARE_ABORT)
    c.start(plan)
    assert ts.plan_timeouts(c.table.values(), T0 + 90_000) == []  # one abort at a time
    c.finish(plan)
    c.run(ts.plan_complete(c.meta(), T0))
    assert (c.meta().state, c.meta().producer_epoch) == (S.COMPLETE_ABORT, 1)
    assert c.add([("x", 0)]).error == ErrorCode.NONE  # the new epoch's producer goes on
    assert ts.plan_add_partitions(c.meta(), 100, 0, [("x", 0)], T0).error == 90


def test_idle_ids_expire_as_tombstones(c: Coordinator) -> None:
    c.run(c.init(tid="busy"))
    c.run(c.add([("t", 0)], tid="busy"))
    expiration_ms = ts.TRANSACTIONAL_ID_EXPIRATION_MS
    assert ts.plan_expiration(c.table.values(), T0 + expiration_ms - 1, expiration_ms) == []
    (plan,) = ts.plan_expiration(c.table.values(), T0 + expiration_ms, expiration_ms)
    assert plan.write is not None and plan.write.state == S.DEAD
    assert ts.to_record(plan.write) == (encode_key(TransactionLogKey(TID)), None)
    c.run(plan)
    assert TID not in c.table and "busy" in c.table  # Ongoing ids never expire
    busy = dataclasses.replace(c.table["busy"], previous_producer_id=-1)  # not in v0
    assert ts.replay(c.log) == {"busy": busy}


def test_complete_write_refuses_a_write_nobody_was_waiting_for(c: Coordinator) -> None:
    plan = c.init()
    assert plan.write is not None
    with pytest.raises(ValueError, match="nothing was pending"):
        ts.complete_write(c.meta(), plan.write)
    with pytest.raises(ValueError, match="not in a Prepare state"):
        ts.plan_complete(c.meta(), T0)


# --- replay and recovery ----------------------------------------------------------------------


def value(status: TransactionStatus, **kw: object) -> bytes:
    fields = dict(
        producer_id=9,
        producer_epoch=4,
        transaction_timeout_ms=1000,
        transaction_status=status,
        transaction_partitions=(("t", (0, 1)),),
        transaction_last_update_timestamp_ms=T0,
        transaction_start_timestamp_ms=T0 - 5,
    )
    fields.update(kw)
    return encode_value(TransactionLogValue(**fields))


def key(tid: str) -> bytes:
    return encode_key(TransactionLogKey(tid))


def test_replay_keeps_the_last_value_and_honours_tombstones() -> None:
    metas = ts.replay(
        [
            (key("a"), value(TransactionStatus.ONGOING)),
            (key("b"), value(TransactionStatus.ONGOING)),
            (key("a"), value(TransactionStatus.PREPARE_COMMIT, producer_epoch=5)),
            (key("b"), None),
            (key("c"), value(TransactionStatus.EMPTY, transaction_partitions=None)),
            (key("d"), value(TransactionStatus.ONGOING)),
            (key("d"), value(TransactionStatus.DEAD)),
        ]
    )
    assert sorted(metas) == ["a", "c"]
    a = metas["a"]
    assert (a.state, a.producer_epoch, a.partitions) == (
        S.PREPARE_COMMIT,
        5,
        {("t", 0), ("t", 1)},
    )
    assert (a.txn_start_ms, a.txn_last_update_ms, a.last_producer_epoch) == (T0 - 5, T0, -1)
    assert metas["c"].partitions == frozenset()
    (plan,) = ts.recovery_plans(metas, T0 + 1)
    assert plan.markers == ts.TxnMarkers("a", 9, 5, True, frozenset({("t", 0), ("t", 1)}))


def test_a_recovered_epoch_fence_completes_as_an_abort() -> None:
    metas = ts.replay([(key("f"), value(TransactionStatus.PREPARE_EPOCH_FENCE))])
    (plan,) = ts.recovery_plans(metas, T0)
    assert plan.markers is not None and not plan.markers.commit
    assert plan.write is not None and plan.write.state == S.COMPLETE_ABORT
    assert ts.plan_end_txn(metas["f"], 9, 4, False, T0).error == 51
    assert ts.plan_end_txn(metas["f"], 9, 4, True, T0).error == 48


def test_replay_reports_a_bad_record_or_skips_it_when_asked() -> None:
    records = [(key("a"), value(TransactionStatus.ONGOING)), (b"\x00\x07", b""), (key("z"), None)]
    with pytest.raises(RecordFormatError, match="record 1: unknown __transaction_state key"):
        ts.replay(records)
    seen: list[int] = []
    assert sorted(ts.replay(records, on_error=lambda i, _: seen.append(i))) == ["a"]
    assert seen == [1]


# --- DescribeTransactions, ListTransactions ---------------------------------------------------


def test_describe_transactions(c: Coordinator) -> None:
    ongoing(c, ("b", 1), ("a", 2), ("a", 0))
    described = ts.describe_transaction(c.meta(), TID)
    assert described == ts.TransactionDescription(
        0, TID, "Ongoing", 60_000, T0, 100, 0, (("a", (0, 2)), ("b", (1,)))
    )
    assert (
        ts.describe_transaction(None, "x").error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND == 105
    )
    assert ts.describe_transaction(None, "").error_code == ErrorCode.INVALID_REQUEST


def test_list_transactions_filters(c: Coordinator) -> None:
    ongoing(c)
    c.run(c.init(tid="quiet", new_id=7))
    metas = list(c.table.values())
    everything = ts.list_transactions(metas)
    assert everything == ts.TransactionsList(
        (), (ts.TransactionListing(TID, 100, "Ongoing"), ts.TransactionListing("quiet", 7, "Empty"))
    )
    by_state = ts.list_transactions(metas, state_filters=["Empty", "Bogus"])
    assert by_state.unknown_state_filters == ("Bogus",)
    assert [t.transactional_id for t in by_state.transactions] == ["quiet"]
    assert ts.list_transactions(metas, state_filters=["Bogus"]).transactions == ()
    assert [
        t.producer_id for t in ts.list_transactions(metas, producer_id_filters=[100]).transactions
    ] == [100]
    # KIP-994: started more than the duration ago (an Empty id's start is -1: Kafka lists it)
    recent = ts.list_transactions(metas, duration_filter_ms=1000, now_ms=T0 + 1000)
    assert [t.transactional_id for t in recent.transactions] == ["quiet"]
    old = ts.list_transactions(metas, duration_filter_ms=1000, now_ms=T0 + 1001)
    assert len(old.transactions) == 2


# --- error mappings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("appended", "answered"),
    [
        (ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ErrorCode.REQUEST_TIMED_OUT, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_COORDINATOR),
        (ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.NOT_COORDINATOR),
        (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.UNKNOWN_SERVER_ERROR),
        (ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_REQUEST),
    ],
)
def test_append_errors_are_answered_as_kafka_answers_them(
    appended: ErrorCode, answered: ErrorCode
) -> None:
    assert ts.append_error(appended) == answered


@pytest.mark.parametrize(
    ("api_key", "old", "new"), [(22, 3, 4), (24, 1, 2), (25, 1, 2), (26, 1, 2), (28, 2, 3)]
)
def test_old_clients_are_told_invalid_producer_epoch(api_key: int, old: int, new: int) -> None:
    fenced = ErrorCode.PRODUCER_FENCED
    assert ts.fencing_error(api_key, old, fenced) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert ts.fencing_error(api_key, new, fenced) == fenced
    assert ts.fencing_error(api_key, old, ErrorCode.NONE) == ErrorCode.NONE
    assert ts.fencing_error(0, 0, fenced) == fenced  # Produce keeps its own codes
