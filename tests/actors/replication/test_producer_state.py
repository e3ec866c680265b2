"""Unit tests of the idempotent-producer state (raylog.actors.replication.producer_state).

Proves each of Kafka's rules the module claims: non-idempotent batches skip everything; an
unknown producer is accepted at any sequence (KIP-360); a retry of one of the last five batches is
a duplicate with the original offsets, an older one is out of order; sequences continue by one
and wrap from Int32.MaxValue to 0; an older epoch is fenced (47) and a newer one must start at 0
(45); truncation keeps exactly what the remaining log implies, falling back to "no state" only
when it cannot know; the bound on producers. Properties (hypothesis) compare the table against a
dumb model that keeps every batch of the log.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raylog.actors.replication.producer_state import (
    APPEND,
    DUPLICATE,
    ERROR,
    MAX_SEQUENCE,
    ProducerStateTable,
    in_sequence,
    increment_sequence,
)

PID = 7


def _append(
    table: ProducerStateTable, offset: int, seq: int, count: int = 1, epoch: int = 0
) -> int:
    """Check then update like a leader; returns the next offset."""
    assert table.check(PID, epoch, seq, count).kind == APPEND
    table.update(PID, epoch, seq, offset, count)
    return offset + count


def test_non_idempotent_batches_skip_every_check() -> None:
    table = ProducerStateTable()
    table.update(-1, -1, -1, 0, 3)
    assert len(table) == 0
    assert table.check(-1, -1, -1, 3).kind == APPEND


def test_unknown_producer_is_accepted_at_any_sequence() -> None:
    table = ProducerStateTable()
    assert table.check(PID, 0, 12345, 2).kind == APPEND
    assert table.check(PID, 3, 0, 1).kind == APPEND


def test_next_sequence_appends_and_a_gap_is_out_of_order() -> None:
    table = ProducerStateTable()
    end = _append(table, 0, 0, 3)  # sequences 0..2
    assert table.check(PID, 0, 3, 1).kind == APPEND
    verdict = table.check(PID, 0, 4, 1)
    assert (verdict.kind, verdict.error_code) == (ERROR, 45)
    assert end == 3


def test_retry_of_any_of_the_last_five_batches_is_a_duplicate_with_original_offsets() -> None:
    table = ProducerStateTable()
    offset, seq, originals = 100, 0, []
    for count in (1, 2, 3, 1, 2, 1):
        originals.append((seq, count, offset))
        offset = _append(table, offset, seq, count)
        seq += count
    for first, count, base in originals[1:]:  # the last five
        verdict = table.check(PID, 0, first, count)
        assert (verdict.kind, verdict.base_offset, verdict.next_offset) == (
            DUPLICATE,
            base,
            base + count,
        )
    oldest = originals[0]
    verdict = table.check(PID, 0, oldest[0], oldest[1])
    assert (verdict.kind, verdict.error_code) == (ERROR, 45)


def test_duplicate_needs_the_same_first_and_last_sequence() -> None:
    table = ProducerStateTable()
    _append(table, 0, 0, 3)
    assert table.check(PID, 0, 0, 2).error_code == 45  # same start, other length


def test_sequences_wrap_from_int32_max_to_zero() -> None:
    assert increment_sequence(MAX_SEQUENCE, 1) == 0
    assert increment_sequence(MAX_SEQUENCE - 1, 3) == 1
    assert in_sequence(MAX_SEQUENCE, 0) and not in_sequence(MAX_SEQUENCE, 1)
    table = ProducerStateTable()
    table.update(PID, 0, MAX_SEQUENCE - 1, 0, 3)  # MAX-1, MAX, 0
    assert table.entry(PID) is not None and table.entry(PID).last_sequence == 0  # type: ignore[union-attr]
    assert table.check(PID, 0, 1, 1).kind == APPEND
    assert table.check(PID, 0, MAX_SEQUENCE - 1, 3).kind == DUPLICATE


def test_older_epoch_is_fenced_and_a_new_epoch_starts_at_zero() -> None:
    table = ProducerStateTable()
    _append(table, 0, 0, 2, epoch=4)
    assert table.check(PID, 3, 2, 1).error_code == 47
    assert table.check(PID, 3, 0, 2).error_code == 47  # even a "duplicate" of another epoch
    assert table.check(PID, 5, 2, 1).error_code == 45
    assert table.check(PID, 5, 0, 1).kind == APPEND
    table.update(PID, 5, 0, 2, 1)
    # The bump cleared the window: the old epoch's batches are no longer duplicates.
    assert table.check(PID, 4, 0, 2).error_code == 47
    assert table.check(PID, 5, 1, 1).kind == APPEND


def test_truncation_keeps_the_batches_below_the_cut() -> None:
    table = ProducerStateTable()
    offset = 0
    for seq in range(4):
        offset = _append(table, offset, seq)
    table.truncate(2)  # removes sequences 2 and 3 at offsets 2 and 3
    assert table.check(PID, 0, 2, 1).kind == APPEND
    assert table.check(PID, 0, 1, 1).kind == DUPLICATE


def test_truncation_of_the_whole_window_restores_the_last_evicted_batch() -> None:
    table = ProducerStateTable()
    for seq in range(6):  # offsets 0..5; the window keeps 1..5, batch 0 was evicted
        _append(table, seq, seq)
    table.truncate(1)
    verdict = table.check(PID, 0, 0, 1)
    assert (verdict.kind, verdict.base_offset) == (DUPLICATE, 0)
    assert table.check(PID, 0, 1, 1).kind == APPEND


def test_truncation_below_everything_known_forgets_the_producer() -> None:
    table = ProducerStateTable()
    for seq in range(7):
        _append(table, seq, seq)
    table.truncate(1)  # batch 0 is below the cut but was never the last evicted one
    assert table.entry(PID) is None
    table2 = ProducerStateTable()
    _append(table2, 10, 0)
    table2.truncate(5)
    assert table2.entry(PID) is None  # no batch below the cut: no state, as on a fresh log


def test_retention_forgets_producers_whose_last_batch_is_below_the_log_start() -> None:
    table = ProducerStateTable()
    table.update(1, 0, 0, 0, 2)  # offsets 0-1
    table.update(2, 0, 0, 2, 1)  # offset 2
    table.update(1, 0, 2, 3, 1)  # offset 3: producer 1's last batch
    table.remove_before(3)
    assert table.entry(2) is None
    assert table.check(1, 0, 0, 2).kind == DUPLICATE  # kept whole while its last batch is retained


def test_producers_beyond_the_bound_are_forgotten_least_recent_first() -> None:
    table = ProducerStateTable(max_producers=2)
    table.update(1, 0, 0, 0, 1)
    table.update(2, 0, 0, 1, 1)
    table.update(1, 0, 1, 2, 1)  # producer 1 is now the most recent
    table.update(3, 0, 0, 3, 1)
    assert table.entry(2) is None
    assert table.entry(1) is not None and table.entry(3) is not None


# --- properties against a model that keeps the whole log ------------------------------------


def _model_state(
    log: list[tuple[int, int, int, int]],
) -> dict[int, tuple[int, list[tuple[int, int, int]]]]:
    """producer -> (epoch, last five (first seq, count, base offset) of that epoch)."""
    state: dict[int, tuple[int, list[tuple[int, int, int]]]] = {}
    for pid, epoch, seq, count, base in ((*b[:3], b[3], o) for o, b in _offsets(log)):
        cur = state.get(pid)
        batches = cur[1] if cur and cur[0] == epoch else []
        state[pid] = (epoch, [*batches, (seq, count, base)][-5:])
    return state


def _offsets(log: list[tuple[int, int, int, int]]) -> list[tuple[int, tuple[int, int, int, int]]]:
    out, offset = [], 0
    for batch in log:
        out.append((offset, batch))
        offset += batch[3]
    return out


_batches = st.lists(
    st.tuples(st.integers(1, 3), st.integers(0, 2), st.integers(0, 6), st.integers(1, 3)),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(log=_batches, cut=st.integers(0, 60))
def test_rebuild_after_truncation_matches_a_rebuild_of_the_remaining_log(
    log: list[tuple[int, int, int, int]], cut: int
) -> None:
    """Truncating the live table gives what rebuilding from the remaining log gives, or (when
    it cannot know) no state at all for that producer."""
    placed = _offsets(log)
    table = ProducerStateTable()
    table.rebuild((b[0], b[1], b[2], o, b[3]) for o, b in placed)
    boundary = max((o for o, _ in placed if o <= cut), default=0)
    table.truncate(boundary)
    remaining = [b for o, b in placed if o < boundary]
    expected = _model_state(remaining)
    for pid in {b[0] for b in log}:
        entry = table.entry(pid)
        if entry is None:
            continue  # forgotten: allowed (rule 2), never wrong
        epoch, batches = expected[pid]
        assert entry.producer_epoch == epoch
        kept = [
            (b.first_sequence, b.next_offset - b.base_offset, b.base_offset) for b in entry.batches
        ]
        assert kept == batches[-len(kept) :]
        assert kept[-1] == batches[-1]  # the newest batch below the cut is always known


@settings(max_examples=200, deadline=None)
@given(log=_batches)
def test_duplicates_are_exactly_the_last_five_of_the_current_epoch(
    log: list[tuple[int, int, int, int]],
) -> None:
    placed = _offsets(log)
    table = ProducerStateTable()
    table.rebuild((b[0], b[1], b[2], o, b[3]) for o, b in placed)
    for pid, (epoch, batches) in _model_state(log).items():
        for seq, count, base in batches:
            verdict = table.check(pid, epoch, seq, count)
            if verdict.kind == DUPLICATE:
                # The first matching batch of the window wins (equal sequences may repeat in
                # this unchecked log); its offsets are one of the matching originals.
                assert (verdict.base_offset, verdict.next_offset - verdict.base_offset) in {
                    (b, c) for s, c, b in batches if (s, c) == (seq, count)
                }
            else:
                raise AssertionError(f"{pid} {seq}+{count} at {base} not found: {verdict}")
