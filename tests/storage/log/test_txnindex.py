"""The aborted-transaction index (``.txnindex``): Kafka's 34-byte entries per segment, written
as ABORT markers are indexed, read back by a read_committed search across segments (stopping
where an entry's LSO reaches the bound), surviving a reopen, a torn tail and a bad file,
following truncation, retention and recovery's cut of a torn log tail, and restored to what
the log says by :meth:`Log.restore_aborted_txns`."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from support.log_data import SMALL, batch

from raylog.storage.errors import OffsetOutOfRangeError
from raylog.storage.log import AbortedTxn, Log
from raylog.storage.log import txnindex as ti


def _fill(log: Log, count: int) -> None:
    """``count`` one-offset batches of about 100 bytes: ~9 per SMALL segment."""
    for i in range(count):
        log.append(batch(1, 1_000 + i, size=40, tag=i), 0)


def _txnindexes(directory: Path) -> dict[int, bytes]:
    return {int(p.stem): p.read_bytes() for p in sorted(directory.glob("*.txnindex"))}


def _segment_bases(log: Log) -> list[int]:
    return sorted(int(p.stem) for p in log.directory.glob("*.log"))


def test_entries_use_kafkas_layout_in_the_markers_segment(small_log: Log) -> None:
    _fill(small_log, 30)
    bases = _segment_bases(small_log)
    assert len(bases) >= 3
    marker = bases[1] + 1
    entry = AbortedTxn(7, bases[0] + 2, marker, marker + 1)
    small_log.append_aborted_txn(entry)
    files = _txnindexes(small_log.directory)
    assert list(files) == [bases[1]]
    assert files[bases[1]] == struct.pack(">hqqqq", 0, 7, bases[0] + 2, marker, marker + 1)
    assert ti.ENTRY_BYTES == 34


def test_search_spans_segments_and_stops_at_a_complete_entry(small_log: Log) -> None:
    _fill(small_log, 40)
    b = _segment_bases(small_log)
    # A: [1, b1+1], its marker in segment 1, while B (from 3) was open: LSO 3.
    a = AbortedTxn(1, 1, b[1] + 1, 3)
    # B: [3, b2+1], nothing open after it.
    b_txn = AbortedTxn(2, 3, b[2] + 1, b[2] + 2)
    # C: an abort much later.
    c = AbortedTxn(3, b[3], b[3] + 2, b[3] + 3)
    for entry in (a, b_txn, c):
        small_log.append_aborted_txn(entry)
    assert small_log.aborted_txns(0, 5) == [a, b_txn]  # B's LSO reaches 5: complete
    assert small_log.aborted_txns(b[1] + 2, b[2]) == [b_txn]
    assert small_log.aborted_txns(b[3], small_log.log_end_offset) == [c]
    assert small_log.aborted_txns(b[3] + 3, small_log.log_end_offset) == []


def test_reopen_keeps_entries_and_a_torn_tail_is_overwritten(log_dir: Path) -> None:
    with Log.open(log_dir, SMALL) as log:
        _fill(log, 5)
        first = AbortedTxn(1, 0, 2, 3)
        log.append_aborted_txn(first)
    path = next(log_dir.glob("*.txnindex"))
    with path.open("ab") as f:
        f.write(b"\x00\x00\x00\x00\x00")  # a torn second entry
    with Log.open(log_dir, SMALL) as log:
        assert log.aborted_txns(0, log.log_end_offset) == [first]
        second = AbortedTxn(2, 3, 4, 5)
        log.append_aborted_txn(second)
        assert log.aborted_txns(0, log.log_end_offset) == [first, second]
    assert path.stat().st_size == 2 * ti.ENTRY_BYTES


def test_a_bad_file_is_ignored_and_restored_from_what_the_log_says(log_dir: Path) -> None:
    with Log.open(log_dir, SMALL) as log:
        _fill(log, 5)
    path = log_dir / f"{0:020d}.txnindex"
    # Out of order: the later marker first.
    path.write_bytes(ti.encode([AbortedTxn(1, 0, 3, 4), AbortedTxn(2, 0, 1, 2)]))
    with Log.open(log_dir, SMALL) as log:
        assert log.aborted_txns(0, 5) == []
        truth = [AbortedTxn(2, 0, 1, 2), AbortedTxn(1, 0, 3, 4)]
        assert log.restore_aborted_txns(0, truth) == 1
        assert log.aborted_txns(0, 5) == truth
        assert log.restore_aborted_txns(0, truth) == 0  # nothing differs: nothing written
        # From offset 2 on: the entry below stays, the one above goes.
        assert log.restore_aborted_txns(2, []) == 1
        assert log.aborted_txns(0, 5) == truth[:1]


def test_restore_writes_each_entry_to_its_markers_segment(small_log: Log) -> None:
    _fill(small_log, 30)
    b = _segment_bases(small_log)
    entries = [AbortedTxn(1, 0, b[0] + 1, b[0] + 2), AbortedTxn(1, b[2], b[2] + 1, b[2] + 2)]
    small_log.restore_aborted_txns(0, entries)
    assert sorted(_txnindexes(small_log.directory)) == [b[0], b[2]]
    assert small_log.aborted_txns(0, small_log.log_end_offset) == entries


def test_truncation_drops_entries_of_cut_markers(small_log: Log) -> None:
    _fill(small_log, 30)
    b = _segment_bases(small_log)
    keep = AbortedTxn(1, 0, b[1] + 1, b[1] + 2)
    cut = AbortedTxn(2, b[1] + 3, b[1] + 5, b[1] + 6)
    later = AbortedTxn(3, b[2], b[2] + 1, b[2] + 2)
    for entry in (keep, cut, later):
        small_log.append_aborted_txn(entry)
    small_log.truncate_to(b[1] + 4)
    assert small_log.aborted_txns(0, small_log.log_end_offset) == [keep]
    assert sorted(_txnindexes(small_log.directory)) == [b[1]]
    # A new marker at a lower offset than the cut ones follows the kept entry.
    _fill(small_log, 3)
    again = AbortedTxn(4, b[1] + 4, b[1] + 5, b[1] + 6)
    small_log.append_aborted_txn(again)
    assert small_log.aborted_txns(0, small_log.log_end_offset) == [keep, again]


def test_the_index_goes_with_its_segment(small_log: Log) -> None:
    _fill(small_log, 30)
    b = _segment_bases(small_log)
    small_log.append_aborted_txn(AbortedTxn(1, 0, 1, 2))
    small_log.append_aborted_txn(AbortedTxn(1, b[2], b[2] + 1, b[2] + 2))
    small_log.advance_log_start(b[1], high_watermark=small_log.log_end_offset)
    assert sorted(_txnindexes(small_log.directory)) == [b[2]]
    small_log.truncate_fully_and_start_at(small_log.log_end_offset)
    assert _txnindexes(small_log.directory) == {}


def test_recovery_cuts_entries_past_a_torn_log_tail(log_dir: Path) -> None:
    with Log.open(log_dir, SMALL) as log:
        _fill(log, 5)
        kept, lost = AbortedTxn(1, 0, 1, 2), AbortedTxn(2, 3, 4, 5)
        log.append_aborted_txn(kept)
        log.append_aborted_txn(lost)
    segment = log_dir / f"{0:020d}.log"
    data = segment.read_bytes()
    segment.write_bytes(data[:-10])  # tear the last batch (offset 4)
    (log_dir / f"{99:020d}.txnindex").write_bytes(ti.encode([kept]))  # no .log: an orphan
    with Log.open(log_dir, SMALL) as log:
        assert log.log_end_offset == 4
        assert log.aborted_txns(0, 4) == [kept]
    assert sorted(_txnindexes(log_dir)) == [0]
    assert len(_txnindexes(log_dir)[0]) == ti.ENTRY_BYTES


def test_a_marker_outside_the_log_is_refused(small_log: Log) -> None:
    _fill(small_log, 2)
    with pytest.raises(OffsetOutOfRangeError, match="outside the log"):
        small_log.append_aborted_txn(AbortedTxn(1, 0, 2, 3))
