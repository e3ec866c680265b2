"""The log cleaner on transactional data, Kafka's rules (storage/log/cleaner.py):

- records of aborted transactions (the ``.txnindex`` entries) are removed and never shadow an
  older value of their key; committed transactional records are compacted as others;
- a COMMIT or ABORT marker stays while a pass still meets a batch of its transaction, then gets
  a delete horizon, and a pass after delete.retention.ms removes it (an ABORT marker's
  ``.txnindex`` entry with it); a marker that is its producer's last batch stays, emptied, and
  a replica reading the log back takes it for no marker;
- a pass bounded by the last stable offset leaves an open transaction's batches alone.

Real files; the markers and ``.txnindex`` entries are written as a replica writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from raylog.actors.replica_port import batch_meta
from raylog.actors.replication.txn_state import CONTROL_NONE, TxnTable
from raylog.pipelines import records as R
from raylog.storage.batch import Record, build_batch, end_txn_marker_record
from raylog.storage.log import AbortedTxn, Log, LogConfig

RETENTION_MS = 1_000
CONFIG = LogConfig(
    segment_bytes=1024,
    index_interval_bytes=256,
    cleanup_policy="compact",
    delete_retention_ms=RETENTION_MS,
)
P1, P2, P3 = 101, 102, 103


def _data(log: Log, records: list[tuple[bytes, bytes]], pid: int = -1) -> int:
    batch = build_batch(
        [Record(k, v, 1_000) for k, v in records],
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=0 if pid >= 0 else -1,
        transactional=pid >= 0,
    )
    return log.append(batch, 0).base_offset


def _marker(log: Log, pid: int, commit: bool) -> int:
    batch = build_batch(
        [end_txn_marker_record(commit, 0, 1_000)],
        producer_id=pid,
        producer_epoch=0,
        transactional=True,
        control=True,
    )
    return log.append(batch, 0, validated=True).base_offset


def _fill(log: Log, batches: int) -> None:
    for i in range(batches):
        _data(log, [(b"fill-%d" % i, b"f" * 60)])


def _consumed(log: Log) -> dict[int, tuple[Any, Any]]:
    start = log.log_start_offset
    table = R.decode_batches(log.read(start, 1 << 30), topic="t", partition=0, start_offset=start)
    return {r["offset"]: (r["key"], r["value"]) for r in table.to_pylist()}


def _controls(log: Log) -> dict[int, tuple[int, Any]]:
    """Offset -> (records in the batch, its marker) of every control batch."""
    return {
        h.base_offset: (h.records_count, m) for h, m in log.producer_batch_headers() if h.is_control
    }


def _clean(log: Log, now_ms: int, upper: int | None = None) -> None:
    bound = log.log_end_offset if upper is None else upper
    assert log.clean(now_ms, bound, force=True) is not None


def _transactions(log: Log) -> tuple[int, int, AbortedTxn]:
    """k1=a plain; P1 aborts k1=b, k2=x; P2 commits k2=y, which k2=z supersedes; fillers close
    those segments; then
    P1 and P2 write again (their markers above are not their last batches). Returns the
    ABORT and COMMIT offsets and the ABORT's index entry."""
    _data(log, [(b"k1", b"a")])
    first = _data(log, [(b"k1", b"b"), (b"k2", b"x")], pid=P1)
    abort = _marker(log, P1, commit=False)
    entry = AbortedTxn(P1, first, abort, abort + 1)
    log.append_aborted_txn(entry)
    _data(log, [(b"k2", b"y")], pid=P2)
    commit = _marker(log, P2, commit=True)
    _data(log, [(b"k2", b"z")])  # supersedes the committed k2=y
    _fill(log, 30)
    for pid in (P1, P2):
        _data(log, [(b"later", b"%d" % pid)], pid=pid)
        _marker(log, pid, commit=True)
    return abort, commit, entry


def test_aborted_records_go_committed_ones_compact_and_markers_outlive_their_data(
    tmp_path: Path,
) -> None:
    with Log.open(tmp_path, CONFIG) as log:
        abort, commit, entry = _transactions(log)
        before = _consumed(log)
        assert before[1] == (b"k1", b"b")  # read_uncommitted sees the aborted records

        _clean(log, 10_000)
        after = _consumed(log)
        assert after[0] == (b"k1", b"a")  # the aborted k1=b did not shadow it
        assert after[commit + 1] == (b"k2", b"z")
        assert not {1, 2, abort + 1} & set(after)  # aborted, and the committed k2=y superseded
        # The pass met each marker's transaction: both stay, with no horizon yet.
        assert set(_controls(log)) >= {abort, commit}
        assert log.aborted_txns(0, abort + 1) == [entry]

        _clean(log, 20_000)  # no batch of theirs left: the horizon starts
        assert set(_controls(log)) >= {abort, commit}
        _clean(log, 20_000 + RETENTION_MS // 2)  # not yet past it
        assert set(_controls(log)) >= {abort, commit}

        _clean(log, 20_000 + RETENTION_MS + 1)
        controls = _controls(log)
        assert abort not in controls and commit not in controls
        assert log.aborted_txns(0, log.log_end_offset) == []
        assert _consumed(log)[0] == (b"k1", b"a")


def test_committed_records_shadow_older_values_and_keep_their_marker(tmp_path: Path) -> None:
    with Log.open(tmp_path, CONFIG) as log:
        _data(log, [(b"k", b"old")])
        new = _data(log, [(b"k", b"new")], pid=P2)
        commit = _marker(log, P2, commit=True)
        _fill(log, 30)
        for now in (10_000, 20_000, 20_000 + RETENTION_MS + 1):
            _clean(log, now)
        consumed = _consumed(log)
        assert consumed[new] == (b"k", b"new") and 0 not in consumed
        assert _controls(log)[commit][0] == 1  # its transaction's record is still there


def test_a_marker_that_is_its_producers_last_batch_stays_empty(tmp_path: Path) -> None:
    with Log.open(tmp_path, CONFIG) as log:
        first = _data(log, [(b"k", b"aborted")], pid=P3)
        abort = _marker(log, P3, commit=False)
        log.append_aborted_txn(AbortedTxn(P3, first, abort, abort + 1))
        _fill(log, 30)
        for now in (10_000, 20_000, 20_000 + RETENTION_MS + 1):
            _clean(log, now)
        assert _controls(log)[abort] == (0, None)  # kept for P3's sequence, emptied
        assert first not in _consumed(log)
    with Log.open(tmp_path, CONFIG) as log:  # a replica rebuilding from the log
        metas = [batch_meta(h, m) for h, m in log.producer_batch_headers()]
        emptied = next(m for m in metas if m.base_offset == abort)
        assert emptied.control_type == CONTROL_NONE
        table = TxnTable()
        table.rebuild(metas, log.log_end_offset)
        assert table.open_spans() == {}  # the emptied marker opens nothing
        _clean(log, 40_000)  # a later pass keeps it as it is
        assert _controls(log)[abort] == (0, None)


def test_the_cleaner_bounded_by_the_lso_leaves_an_open_transaction_alone(
    tmp_path: Path,
) -> None:
    with Log.open(tmp_path, CONFIG) as log:
        _data(log, [(b"k", b"old")])
        _fill(log, 10)
        open_first = _data(log, [(b"k", b"open")], pid=P1)  # no marker: open
        _fill(log, 20)
        _data(log, [(b"k", b"newest")])
        _fill(log, 10)
        _clean(log, 10_000, upper=open_first)  # the LSO: the open transaction's first offset
        kept = _consumed(log)
        assert kept[open_first] == (b"k", b"open")
        assert log.first_dirty_offset <= open_first


def test_a_cleaning_job_carries_the_aborted_transactions_of_its_segments(
    tmp_path: Path,
) -> None:
    with Log.open(tmp_path, CONFIG) as log:
        _abort, _commit, entry = _transactions(log)
        jobs: list[Any] = []

        def runner(job: Any) -> Any:
            jobs.append(msgspec.json.decode(msgspec.json.encode(job.aborted)))
            from raylog.storage.log import rewrite_segments

            return rewrite_segments(job)

        assert log.clean(10_000, log.log_end_offset, force=True, runner=runner) is not None
        assert jobs == [[list(entry)]]
