"""read_committed decoding: the records of aborted transactions left out as Kafka's consumer
leaves them out, on batches built by ``storage.batch.build_batch`` with transaction markers.

Proves, with a fetch answer's aborted transactions given as (producer id, first offset):
- a producer's aborted transaction is dropped, its committed ones before and after it kept,
  non-transactional batches kept, and no transaction marker is ever a row (read_committed or
  read_uncommitted); the next fetch offset is past the markers and the skipped batches;
- transactions of several producers interleave: only the aborted producer's batches go, an
  idempotent (non-transactional) batch of that producer is kept; an aborted transaction that
  began before the answer (first offset below its first batch) is dropped until its marker,
  one the answer does not reach yet drops nothing;
- the filter's state carries across the slices of one answer (a short-circuit read decodes in
  slices): cut at every batch boundary, the rows are those of the whole answer;
- offset windows cut inside such answers; the fast decoder and the reference decoder skip
  the same batches, with and without headers;
- planning for read_committed names the last stable offset in its errors; isolation levels
  parse by Kafka's names and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

from raylog.pipelines import reading
from raylog.pipelines import records as R
from raylog.pipelines.catalog import PartitionInfo
from raylog.storage import batch as rb

TS = 1_700_000_000_000
END = (1 << 63) - 1
COMMIT, ABORT = True, False


@pytest.fixture(autouse=True)
def _fast_path_for_every_size() -> Iterator[None]:
    # decode_into leaves small answers to the reference decoder; here both must see them.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(R, "FAST_MIN_RECORDS", 0)
        yield


class Log:
    """An answer under construction: whole batches at consecutive offsets."""

    def __init__(self, base_offset: int = 0) -> None:
        self.offset = base_offset
        self.batches: list[bytes] = []
        self.sequences: dict[int, int] = {}

    def data(self, pid: int, n: int, *, transactional: bool = True, tag: str = "") -> list[int]:
        """``n`` records of producer ``pid`` (-1: none) in one batch; returns their offsets."""
        base = self.offset
        recs = [
            rb.Record(f"k{base + i}".encode(), f"{tag}{base + i}".encode(), TS + base + i)
            for i in range(n)
        ]
        sequence = self.sequences.get(pid, 0) if pid >= 0 else -1
        self.batches.append(
            rb.build_batch(
                recs,
                base_offset=base,
                producer_id=pid,
                producer_epoch=0 if pid >= 0 else -1,
                base_sequence=sequence,
                transactional=transactional,
            )
        )
        if pid >= 0:
            self.sequences[pid] = sequence + n
        self.offset += n
        return list(range(base, base + n))

    def marker(self, pid: int, commit: bool) -> int:
        at = self.offset
        self.batches.append(
            rb.build_batch(
                [rb.end_txn_marker_record(commit, 3, TS + at)],
                base_offset=at,
                producer_id=pid,
                producer_epoch=0,
                transactional=True,
                control=True,
            )
        )
        self.offset += 1
        return at

    @property
    def answer(self) -> bytes:
        return b"".join(self.batches)


def offsets(
    buf: bytes,
    aborted: tuple[tuple[int, int], ...] | None,
    start: int = 0,
    end: int = END,
    decode: object = R.decode_into,
) -> tuple[list[int], int]:
    """The row offsets one decode of ``buf`` gives, and the next fetch offset."""
    cols = R.new_columns()
    filt = None if aborted is None else R.AbortedTransactions(aborted)
    if decode is R.decode_into:
        next_offset = R.decode_into(buf, cols, start, end, aborted=filt)
    else:
        skip = filt.skipped(buf) if filt is not None else frozenset()
        next_offset = decode(buf, cols, start, end, skip=skip)  # type: ignore[operator]
    return R.to_arrow(cols, "t", 0, False).column("offset").to_pylist(), next_offset


def one_producer() -> tuple[Log, list[int], list[int], list[int]]:
    """Producer 7: committed, aborted, committed; then a non-transactional batch."""
    log = Log()
    first = log.data(7, 3) + log.data(7, 2)
    log.marker(7, COMMIT)
    aborted = log.data(7, 2)
    log.marker(7, ABORT)
    second = log.data(7, 2)
    log.marker(7, COMMIT)
    plain = log.data(-1, 2, transactional=False)
    return log, first + second + plain, aborted, [first[0], aborted[0]]


def test_an_aborted_transaction_is_dropped_and_markers_are_never_rows() -> None:
    log, committed, aborted, _ = one_producer()
    got, next_offset = offsets(log.answer, ((7, aborted[0]),))
    assert got == committed
    assert next_offset == log.offset  # past the last batch, markers and skipped ones included
    every = sorted(committed + aborted)
    assert offsets(log.answer, None) == (every, log.offset)  # read_uncommitted: no markers
    assert offsets(log.answer, ()) == (every, log.offset)  # read_committed, nothing aborted
    rows = R.decode_batches(
        log.answer, topic="t", partition=0, aborted_transactions=((7, aborted[0]),)
    )
    assert rows.column("offset").to_pylist() == committed


def test_interleaved_producers_and_an_idempotent_batch() -> None:
    log = Log()
    a1 = log.data(1, 2, tag="aborted")
    c1 = log.data(2, 2)
    a2 = log.data(1, 1, tag="aborted")
    c2 = log.data(2, 3)
    log.marker(1, ABORT)
    idempotent = log.data(1, 2, transactional=False)  # same producer, after its abort
    log.marker(2, COMMIT)
    other = log.data(3, 1, transactional=False)
    got, _ = offsets(log.answer, ((1, a1[0]),))
    assert got == c1 + c2 + idempotent + other
    assert not set(got) & set(a1 + a2)


def test_a_transaction_begun_before_the_answer_and_one_not_reached() -> None:
    log = Log(base_offset=100)  # the answer starts inside producer 5's transaction from 90
    inside = log.data(5, 2)
    kept = log.data(6, 2)
    log.marker(5, ABORT)
    after = log.data(5, 2)  # producer 5's next transaction: committed past the answer
    got, _ = offsets(log.answer, ((5, 90), (6, 10_000)))
    assert got == kept + after
    assert not set(got) & set(inside)


def test_state_carries_across_the_slices_of_one_answer() -> None:
    log, committed, aborted, _ = one_producer()
    filt = R.AbortedTransactions(((7, aborted[0]),))
    got: list[int] = []
    for batch in log.batches:  # one slice per batch: the abort marker and the next txn apart
        cols = R.new_columns()
        R.decode_into(batch, cols, 0, END, aborted=filt)
        got += R.to_arrow(cols, "t", 0, False).column("offset").to_pylist()
    assert got == committed
    assert not filt.active  # the marker cleared the producer; nothing more to reach


@pytest.mark.parametrize(("start", "end"), [(1, 12), (4, 9), (8, 20), (0, 3)])
def test_windows_cut_inside_and_both_decoders_agree(start: int, end: int) -> None:
    log, committed, aborted, _ = one_producer()
    wanted = [o for o in committed if start <= o < end]
    pairs = ((7, aborted[0]),)
    for decode in (R.decode_into, R.decode_into_fast, R.decode_into_reference):
        got, _ = offsets(log.answer, pairs, start, end, decode)
        assert got == wanted, decode


@pytest.mark.parametrize("headers", [False, True])
def test_fast_and_reference_rows_equal(headers: bool) -> None:
    log, _, aborted, _ = one_producer()
    tables = []
    for decode in (R.decode_into_fast, R.decode_into_reference):
        cols = R.new_columns(headers)
        skip = R.AbortedTransactions(((7, aborted[0]),)).skipped(log.answer)
        decode(log.answer, cols, 0, END, True, skip=skip)
        tables.append(R.to_arrow(cols, "t", 0, headers))
    assert tables[0].equals(tables[1])
    assert isinstance(tables[0], pa.RecordBatch) and tables[0].num_rows == 9


def test_planning_names_the_last_stable_offset_and_levels_parse() -> None:
    info = PartitionInfo("t", 0, 0, (0,), (0,))
    bounds = {("t", 0): reading.Bounds(0, 40, read_committed=True)}
    with pytest.raises(ValueError, match="beyond the last stable offset 40"):
        reading.plan([info], bounds, reading.EARLIEST, {"t": {0: 41}})
    [r] = reading.plan([info], bounds, reading.EARLIEST, reading.LATEST)
    assert (r.start, r.end) == (0, 40)
    assert reading.parse_isolation_level(" READ_COMMITTED ", "o") == reading.READ_COMMITTED
    assert reading.parse_isolation_level("read_uncommitted", "o") == reading.READ_UNCOMMITTED
    with pytest.raises(ValueError, match="o: expected read_uncommitted or read_committed"):
        reading.parse_isolation_level("committed", "o")
