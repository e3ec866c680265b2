"""Unit tests of a partition replica's transaction state (``txn_state.TxnTable``), pure.

What they prove: a transactional batch opens a transaction at its base offset and a marker
closes it, an ABORT joining the aborted list with [first offset, marker offset]; the LSO is
the first offset of the oldest open transaction or one whose marker the HW has not passed,
else the HW, never below the log start; collectAbortedTransactions' overlap rule; truncation
inside a transaction reopens it and across one removes it; a log start past an aborted
transaction drops it; the leader checks (47, 48, 52); the memory bound spares open
transactions; and, over seeded random logs, the live state always equals the state rebuilt
from the remaining log.
"""

from __future__ import annotations

import random

import pytest

from raylog.actors.replication.messages import BatchMeta
from raylog.actors.replication.txn_state import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    NOT_CONTROL,
    AbortedTxn,
    TxnTable,
)


def data(offset: int, pid: int, count: int = 1, epoch: int = 0, txn: bool = True) -> BatchMeta:
    return BatchMeta(offset, count, 100, 0, pid, epoch, 0, txn)


def marker(
    offset: int, pid: int, commit: bool, epoch: int = 0, coordinator_epoch: int = 0
) -> BatchMeta:
    control = CONTROL_COMMIT if commit else CONTROL_ABORT
    return BatchMeta(offset, 1, 70, 0, pid, epoch, -1, True, control, coordinator_epoch)


def feed(table: TxnTable, batches: list[BatchMeta], high_watermark: int = 0) -> TxnTable:
    for batch in batches:
        table.update(batch, high_watermark)
    return table


def test_a_transaction_opens_at_its_first_batch_and_a_commit_closes_it() -> None:
    table = feed(TxnTable(), [data(0, 7, count=3), data(3, 7), data(4, 8, txn=False)])
    assert table.open_spans() == {7: 0}
    assert table.last_stable_offset(0, 5) == 0
    feed(table, [marker(5, 7, commit=True)])
    assert table.open_spans() == {}
    # Closed, but the HW has not passed the marker: the outcome may still be truncated away.
    assert table.last_stable_offset(0, 5) == 0
    table.on_high_watermark(6)
    assert table.last_stable_offset(0, 6) == 6
    assert table.aborted == []


def test_an_abort_joins_the_aborted_list_with_its_span() -> None:
    table = feed(TxnTable(), [data(0, 1), data(1, 2), data(2, 1), marker(3, 1, commit=False)])
    assert table.aborted == [AbortedTxn(1, 0, 3, 1)]  # LSO 1: producer 2's is open
    assert table.open_spans() == {2: 1}
    table.on_high_watermark(4)
    assert table.last_stable_offset(0, 4) == 1  # producer 2's transaction is still open


def test_a_marker_without_an_open_transaction_spans_itself() -> None:
    table = feed(TxnTable(), [marker(0, 5, commit=False), marker(1, 5, commit=False)])
    assert table.aborted == [AbortedTxn(5, 0, 0, 1), AbortedTxn(5, 1, 1, 2)]
    assert table.open_spans() == {}


def test_the_lso_never_passes_the_hw_nor_falls_below_the_log_start() -> None:
    table = feed(TxnTable(), [data(0, 1), data(10, 2)])
    assert table.last_stable_offset(0, 0) == 0
    assert table.last_stable_offset(4, 12) == 4  # the open transaction starts below the start
    table = TxnTable()
    assert table.last_stable_offset(0, 9) == 9  # no transactions: the HW


def test_aborted_between_is_kafkas_overlap_rule() -> None:
    table = feed(
        TxnTable(),
        [data(0, 1), marker(2, 1, False), data(5, 2), marker(9, 2, False), marker(12, 3, False)],
    )
    assert table.aborted_between(0, 1) == [AbortedTxn(1, 0, 2, 3)]
    assert table.aborted_between(3, 5) == []  # (2, 5, 9) starts at the exclusive upper bound
    assert table.aborted_between(3, 6) == [AbortedTxn(2, 5, 9, 10)]
    assert table.aborted_between(9, 100) == [AbortedTxn(2, 5, 9, 10), AbortedTxn(3, 12, 12, 13)]


def test_truncation_inside_a_transaction_reopens_it_and_across_one_removes_it() -> None:
    table = feed(TxnTable(), [data(0, 1), data(1, 2), data(2, 1), marker(3, 1, False)])
    table.truncate(3)  # the ABORT goes: producer 1's transaction is open
    assert table.open_spans() == {1: 0, 2: 1}
    assert table.aborted == []
    table.truncate(1)  # producer 2's whole transaction goes
    assert table.open_spans() == {1: 0}
    assert table.entry(2) is None
    table.truncate(0)
    assert table.open_spans() == {} and table.entry(1) is None


def test_a_log_start_past_an_aborted_transaction_drops_it() -> None:
    table = feed(TxnTable(), [data(0, 1), marker(1, 1, False), data(2, 2), marker(5, 2, False)])
    table.remove_before(2)
    assert table.aborted == [AbortedTxn(2, 2, 5, 6)]
    table.remove_before(6)
    assert table.aborted == []


def test_markers_are_fenced_by_producer_epoch_and_coordinator_epoch() -> None:
    table = feed(
        TxnTable(), [data(0, 1, epoch=3), marker(1, 1, True, epoch=3, coordinator_epoch=4)]
    )
    assert table.check(1, 2, True, CONTROL_ABORT, 4, -1)[0] == 47
    assert table.check(1, 3, True, CONTROL_ABORT, 3, -1)[0] == 52
    assert table.check(1, 3, True, CONTROL_ABORT, 4, -1) == (0, "")  # a retry is safe
    assert table.check(1, 4, True, CONTROL_COMMIT, 5, -1) == (0, "")
    # The idempotent state's epoch counts for a producer the table has not seen.
    assert table.check(9, 1, True, CONTROL_ABORT, 0, idempotent_epoch=2)[0] == 47


def test_an_open_transaction_refuses_non_transactional_batches_and_zombies() -> None:
    table = feed(TxnTable(), [data(0, 1, epoch=2)])
    assert table.check(1, 2, False, NOT_CONTROL, -1, 2)[0] == 48
    assert table.check(1, 2, True, NOT_CONTROL, -1, 2) == (0, "")
    # An abort with a bumped epoch fences the old epoch's data (KIP-360).
    feed(table, [marker(1, 1, False, epoch=3)])
    assert table.check(1, 2, True, NOT_CONTROL, -1, 2)[0] == 47
    assert table.check(1, 3, False, NOT_CONTROL, -1, 2) == (0, "")


def test_the_memory_bound_never_forgets_an_open_transaction() -> None:
    table = TxnTable(max_producers=2)
    feed(table, [data(0, 1), data(1, 2), marker(2, 2, True), data(3, 3), data(4, 4)])
    assert table.open_spans() == {1: 0, 3: 3, 4: 4}  # over the bound: all three stay open
    assert table.entry(2) is None  # the closed one was forgotten


# --- live state equals the state rebuilt from the remaining log -------------------------------


def snapshot(table: TxnTable, log_start: int, hw: int) -> tuple[object, ...]:
    return (
        table.open_spans(),
        table.aborted,
        table.last_stable_offset(log_start, hw),
        table.aborted_between(log_start, hw + 1),
        {pid: table.entry(pid).coordinator_epoch for pid in (1, 2, 3) if table.entry(pid)},
    )


@pytest.mark.parametrize("seed", range(40))
def test_live_state_equals_the_state_rebuilt_from_the_remaining_log(seed: int) -> None:
    rng = random.Random(seed)
    live = TxnTable()
    log: list[BatchMeta] = []
    end = start = hw = 0
    coordinator_epoch = {pid: 0 for pid in (1, 2, 3)}
    for _ in range(150):
        roll = rng.random()
        pid = rng.choice((1, 2, 3, -1))
        batch = None
        if roll < 0.55 or pid < 0:
            count = rng.randint(1, 3)
            txn = rng.random() < 0.85
            batch = BatchMeta(end, count, 10, 0) if pid < 0 else data(end, pid, count, txn=txn)
        elif roll < 0.8:
            coordinator_epoch[pid] += rng.random() < 0.2
            batch = marker(end, pid, rng.random() < 0.5, coordinator_epoch=coordinator_epoch[pid])
        elif roll < 0.88 and log:
            # A follower's truncation above its HW (a clean one), within a few batches.
            cut = rng.choice([b.base_offset for b in log[-6:]])
            if cut >= hw and cut > start:
                log = [b for b in log if b.base_offset < cut]
                end = cut
                live.truncate(cut)
        elif roll < 0.95:
            hw = rng.randint(hw, end)
            live.on_high_watermark(hw)
        else:
            start = rng.randint(start, hw)
            live.remove_before(start)
        if batch is not None:
            log.append(batch)
            end = batch.next_offset
            live.update(batch, hw)
        rebuilt = TxnTable()
        rebuilt.rebuild(log, hw)
        rebuilt.remove_before(start)
        assert snapshot(live, start, hw) == snapshot(rebuilt, start, hw), (seed, end)
