"""The Log's producer-state snapshot files (``snapshots.py``), bytes opaque.

What they prove: a snapshot is stored durably under its offset and read back, at most
``keep`` are kept (the newest), none outside [log start, log end] is accepted; a truncation
deletes those above the new log end and a full truncation all of them; a log start move
(DeleteRecords or retention) deletes those below it; recovery deletes those a cut tail left
above the log end; a too-large file is not read; and ``producer_batch_headers(from_offset)``
gives exactly the producer batches from that offset on, from a later segment or mid-segment.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.log_data import SMALL, fill, last_segment

from raylog.storage.batch import Record, build_batch
from raylog.storage.errors import OffsetOutOfRangeError
from raylog.storage.log import Log, snapshots


def _idempotent(log: Log, count: int) -> None:
    for seq in range(count):
        data = build_batch(
            [Record(None, b"v" * 60, 1_000)], producer_id=7, producer_epoch=0, base_sequence=seq
        )
        log.append(data, 0)


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.snapshot"))


def test_snapshots_are_stored_by_offset_and_only_the_newest_are_kept(small_log: Log) -> None:
    fill(small_log, 10)
    for offset in (2, 4, 6, 8):
        small_log.write_producer_snapshot(offset, b"state at %d" % offset, keep=3)
    assert small_log.producer_snapshot_offsets() == [8, 6, 4]
    assert _names(small_log.directory)[0] == "00000000000000000004.snapshot"
    assert small_log.read_producer_snapshot(6) == b"state at 6"
    assert small_log.read_producer_snapshot(2) is None
    with pytest.raises(OffsetOutOfRangeError):
        small_log.write_producer_snapshot(small_log.log_end_offset + 1, b"x")
    small_log.delete_producer_snapshot(8)
    assert small_log.producer_snapshot_offsets() == [6, 4]


def test_a_truncation_deletes_the_snapshots_above_the_new_end(small_log: Log) -> None:
    fill(small_log, 10)  # 2 records a batch
    for offset in (4, 10, 16):
        small_log.write_producer_snapshot(offset, b"s")
    small_log.truncate_to(10)
    assert small_log.producer_snapshot_offsets() == [10, 4]  # the state at 10 is still true
    small_log.truncate_fully_and_start_at(30)
    assert small_log.producer_snapshot_offsets() == []


def test_a_log_start_move_deletes_the_snapshots_below_it(small_log: Log) -> None:
    fill(small_log, 40)
    for offset in (10, 20, 60):
        small_log.write_producer_snapshot(offset, b"s")
    small_log.advance_log_start(12, high_watermark=80)  # inside a segment
    assert small_log.producer_snapshot_offsets() == [60, 20]
    segments = small_log.segment_count
    small_log.advance_log_start(60, high_watermark=80)  # whole segments go
    assert small_log.segment_count < segments
    assert small_log.producer_snapshot_offsets() == [60]
    small_log.advance_log_start(62, high_watermark=80)
    assert small_log.producer_snapshot_offsets() == []


def test_recovery_deletes_the_snapshots_above_a_cut_tail(log_dir: Path) -> None:
    with Log.open(log_dir, SMALL) as log:
        fill(log, 10)
        end = log.log_end_offset
        log.write_producer_snapshot(end, b"s")
        log.write_producer_snapshot(end - 4, b"s")
    segment = last_segment(log_dir)
    with segment.open("r+b") as f:  # a torn last batch
        f.truncate(segment.stat().st_size - 10)
    with Log.open(log_dir, SMALL) as log:
        assert log.log_end_offset < end
        assert log.producer_snapshot_offsets() == [end - 4]


def test_a_snapshot_too_large_to_read_is_not_read(
    small_log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(small_log, 4)
    small_log.write_producer_snapshot(4, b"s" * 100)
    monkeypatch.setattr(snapshots, "MAX_SNAPSHOT_BYTES", 99)
    assert small_log.read_producer_snapshot(4) is None


@pytest.mark.parametrize("from_offset", [0, 1, 9, 10, 23, 39, 40])
def test_producer_batch_headers_from_an_offset(small_log: Log, from_offset: int) -> None:
    _idempotent(small_log, 40)  # one record a batch, several segments
    fill(small_log, 1)  # no producer: never listed
    assert small_log.segment_count > 3
    got = [h.base_offset for h, _ in small_log.producer_batch_headers(from_offset)]
    assert got == list(range(from_offset, 40))
