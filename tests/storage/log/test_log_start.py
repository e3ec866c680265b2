"""The Log's log start offset (Kafka's DeleteRecords at the storage layer): it may lie inside
a segment, survives a reopen (its checkpoint, clamped into the log), never moves backwards or
above the high watermark, deletes the segments wholly below it (rolling a log it empties), hides
the offsets below it from reads and timestamp lookups, and keeps its meaning under retention,
truncation, compaction and a follower restarting inside a batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from raylog.storage import Log, LogConfig
from raylog.storage import batch as rb
from raylog.storage.batch import Record, build_batch
from raylog.storage.errors import OffsetOutOfRangeError
from raylog.storage.log import LOG_START_OFFSET_CHECKPOINT

SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=256)


def batch(n: int = 2, ts: int = 1_000, key: bytes = b"k", size: int = 40) -> bytes:
    return build_batch([Record(key, b"v" * size, ts + i) for i in range(n)])


def fill(log: Log, count: int, n: int = 2, epoch: int = 0, ts: int = 1_000) -> None:
    for i in range(count):
        log.append(batch(n, ts + i * 10, key=b"k%d" % i), epoch)


def offsets(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for _, h in rb.iter_batches(data)]


def bases(log: Log) -> list[int]:
    return sorted(int(p.stem) for p in log.directory.glob("*.log"))


def inside_a_segment(log: Log) -> tuple[int, int]:
    """An odd offset (inside a 2-record batch) of the third segment, and that segment's base."""
    third = bases(log)[2]
    return third + 3, third


def test_mid_segment_log_start_deletes_segments_below_and_persists(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL)
    fill(log, 60)
    before = bases(log)
    start, third = inside_a_segment(log)
    assert log.advance_log_start(start, high_watermark=log.log_end_offset) == start
    assert log.log_start_offset == start
    # Segments wholly below go; the one holding the new start stays, with its base below it.
    assert bases(log) == [b for b in before if b >= third]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(start - 1, 1 << 20)
    # The first batch served is the one holding the start (records below it are the client's
    # to skip, as in Kafka).
    assert offsets(log.read(start, 100))[0] == (start - 1, start)
    assert log.offset_for_timestamp(-2).offset == start
    log.close()
    assert (tmp_path / "t-0" / LOG_START_OFFSET_CHECKPOINT).read_text() == f"0\n{start}\n"
    with Log.open(tmp_path / "t-0", SMALL) as again:
        assert again.log_start_offset == start
        assert bases(again)[0] == third
        with pytest.raises(OffsetOutOfRangeError):
            again.read(start - 1, 1 << 20)


def test_never_backwards_never_above_the_high_watermark(small_log_dir: Path) -> None:
    with Log.open(small_log_dir, SMALL) as log:
        fill(log, 20)
        assert log.advance_log_start(10, high_watermark=30) == 10
        assert log.advance_log_start(4, high_watermark=30) == 10  # a no-op, not an error
        with pytest.raises(OffsetOutOfRangeError):
            log.advance_log_start(31, high_watermark=30)
        with pytest.raises(OffsetOutOfRangeError):
            log.advance_log_start(41, high_watermark=1 << 40)  # above the log end
        assert log.log_start_offset == 10
        assert log.high_watermark >= 10  # the HW is never below the log start


def test_a_log_emptied_by_its_start_rolls_and_keeps_appending(small_log_dir: Path) -> None:
    log = Log.open(small_log_dir, SMALL)
    fill(log, 3, epoch=2)  # one segment, [0, 6)
    assert log.advance_log_start(6, high_watermark=6) == 6
    assert bases(log) == [6]  # rolled: the old active segment went
    assert log.read(6, 100) == b""
    assert [tuple(e) for e in log.epoch_entries] == [(2, 6)]  # the epoch in force stays
    log.append(batch(), 2)
    assert offsets(log.read(6, 100)) == [(6, 7)]
    log.close()
    with Log.open(small_log_dir, SMALL) as again:
        assert (again.log_start_offset, again.log_end_offset) == (6, 8)


def test_recovery_clamps_the_checkpoint_and_finishes_an_interrupted_delete(
    small_log_dir: Path,
) -> None:
    with Log.open(small_log_dir, SMALL) as log:
        fill(log, 60)
        start, third = inside_a_segment(log)
        end = log.log_end_offset
    # A crash after the checkpoint, before the unlinks: the files are all still there.
    (small_log_dir / LOG_START_OFFSET_CHECKPOINT).write_text(f"0\n{start}\n")
    with Log.open(small_log_dir, SMALL) as log:
        assert log.log_start_offset == start
        assert bases(log)[0] == third
    # A checkpoint above the log end (a cut tail): clamped to the log end.
    (small_log_dir / LOG_START_OFFSET_CHECKPOINT).write_text(f"0\n{end + 1000}\n")
    with Log.open(small_log_dir, SMALL) as log:
        assert log.log_start_offset == end
    # Unreadable: the first segment's base offset.
    (small_log_dir / LOG_START_OFFSET_CHECKPOINT).write_text("garbage")
    with Log.open(small_log_dir, SMALL) as log:
        assert log.log_start_offset == bases(log)[0]


def test_retention_moves_past_a_mid_segment_start(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=1024, index_interval_bytes=256, retention_ms=1_000)
    with Log.open(tmp_path / "t-0", config) as log:
        for i in range(40):
            log.append(batch(ts=10_000 + i * 100), 0)
        start, _ = inside_a_segment(log)
        log.advance_log_start(start, high_watermark=log.log_end_offset)
        # Retention not due: the log start stays inside its segment.
        assert log.enforce_retention(now_ms=10_000) == 0
        assert log.log_start_offset == start
        # Due: whole segments go, and the start moves to the first remaining one's base.
        assert log.enforce_retention(now_ms=1 << 40) > 0
        assert log.log_start_offset == bases(log)[0] > start


def test_truncation_keeps_the_start_at_or_below_the_log_end(small_log_dir: Path) -> None:
    with Log.open(small_log_dir, SMALL) as log:
        fill(log, 20)  # batches [0,1], [2,3], ...
        log.advance_log_start(13, high_watermark=40)
        with pytest.raises(OffsetOutOfRangeError):
            log.truncate_to(12)
        # The batch [12, 13] holds the start: a cut inside it brings the start down with it.
        assert log.truncate_to(13) == 12
        assert log.log_start_offset == 12
    with Log.open(small_log_dir, SMALL) as again:
        assert (again.log_start_offset, again.log_end_offset) == (12, 12)
        again.truncate_fully_and_start_at(500)
    with Log.open(small_log_dir, SMALL) as again:
        assert again.log_start_offset == 500


def test_the_cleaner_compacts_around_a_mid_segment_start(tmp_path: Path) -> None:
    config = LogConfig(
        segment_bytes=1024, index_interval_bytes=256, cleanup_policy="compact,delete"
    )
    with Log.open(tmp_path / "t-0", config) as log:
        for i in range(60):
            log.append(batch(ts=1_000 + i, key=b"k%d" % (i % 3)), 0)
        start, _ = inside_a_segment(log)
        log.advance_log_start(start, high_watermark=log.log_end_offset)
        result = log.clean(now_ms=10_000, high_watermark=log.log_end_offset, force=True)
        assert result is not None and result.records_removed > 0
        assert log.log_start_offset == start
        assert log.first_dirty_offset >= start
        with pytest.raises(OffsetOutOfRangeError):
            log.read(start - 1, 1 << 20)
        assert all(last >= start for _, last in offsets(log.read(start, 1 << 20)))


def test_a_follower_restarts_inside_the_leaders_first_batch(tmp_path: Path) -> None:
    with Log.open(tmp_path / "leader", SMALL) as leader:
        fill(leader, 10, epoch=3)
        leader.advance_log_start(7, high_watermark=20)
        served = leader.read(7, 1 << 20)  # starts with the batch [6, 7]
    with Log.open(tmp_path / "follower", SMALL) as follower:
        follower.truncate_fully_and_start_at(7)
        follower.append_replicated(served)
        assert (follower.log_start_offset, follower.log_end_offset) == (7, 20)
        assert bases(follower)[0] == 6  # restarted at the batch's base offset
        assert [tuple(e) for e in follower.epoch_entries] == [(3, 7)]
        assert follower.read(7, 1 << 20) == served
        with pytest.raises(OffsetOutOfRangeError):
            follower.read(6, 100)


def test_a_full_truncation_may_start_below_the_log_start(small_log_dir: Path) -> None:
    """After an unclean election the new leader's log may end below a follower's log start:
    the follower starts over at the leader's end, below its old start (Kafka's truncateTo)."""
    with Log.open(small_log_dir, SMALL) as log:
        fill(log, 20)  # batches [0,1] ... [38,39]
        log.advance_log_start(30, high_watermark=40)
        log.truncate_fully_and_start_at(12)
        assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (12, 12, 12)
        fill(log, 2)
        assert [first for first, _ in offsets(log.read(12, 1 << 20))] == [12, 14]
    with Log.open(small_log_dir, SMALL) as again:
        assert (again.log_start_offset, again.log_end_offset) == (12, 16)
        assert bases(again) == [12]


@pytest.fixture
def small_log_dir(tmp_path: Path) -> Path:
    return tmp_path / "topic-0"


def test_delete_local_segments_moves_the_local_start_below_the_high_watermark_only(
    tmp_path: Path,
) -> None:
    """Tiered storage's local deletion: the oldest ``count`` segments go, never one holding
    offsets at or above the high watermark; reads below the new start are out of range, and
    a reopen finds the same start (the first segment's base)."""
    log = Log.open(tmp_path / "t-0", SMALL)
    fill(log, 60)
    before = bases(log)
    assert len(before) >= 5
    assert log.delete_local_segments(2, high_watermark=log.log_end_offset) == 2
    assert log.log_start_offset == before[2] and bases(log) == before[2:]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(before[2] - 1, 1 << 20)
    assert offsets(log.read(before[2], 100))[0][0] == before[2]
    # The high watermark inside the fourth segment: only the third may go.
    assert log.delete_local_segments(10, high_watermark=before[3] + 1) == 1
    assert log.log_start_offset == before[3]
    assert log.delete_local_segments(0, high_watermark=log.log_end_offset) == 0
    log.close()
    reopened = Log.open(tmp_path / "t-0", SMALL)
    assert reopened.log_start_offset == before[3]
    reopened.close()
