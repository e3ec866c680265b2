"""The Log's contract for appends, epochs, truncation, retention and checkpoints: offsets
assigned and stamped, a follower's batches checked to follow the log, leader epochs
(KIP-101/279) and their checkpoint, truncation at and inside segments, retention by time and
bytes, the high watermark's checkpoint, and the config invariants."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch
from support.log_data import SMALL, batch, fill, last_segment, offsets

from raylog.storage import Log, LogConfig
from raylog.storage import batch as rb
from raylog.storage.batch import Record, build_batch
from raylog.storage.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidConfigError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from raylog.storage.log import HIGH_WATERMARK_CHECKPOINT, LEADER_EPOCH_CHECKPOINT


def test_append_assigns_offsets_and_stamps_epoch(small_log: Log) -> None:
    original = batch(3)
    info = small_log.append(original, leader_epoch=5)
    assert (info.base_offset, info.last_offset, info.records_count) == (0, 2, 3)
    info = small_log.append(batch(2), leader_epoch=5)
    assert (info.base_offset, info.last_offset) == (3, 4)
    assert small_log.log_end_offset == 5
    data = small_log.read(0, 1 << 20)
    first = DefaultRecordBatch(data[: len(original)])
    assert first.validate_crc() and first.base_offset == 0 and first.leader_epoch == 5
    # Stored exactly as received apart from the two stamped fields.
    assert data[rb.MAGIC_POS : len(original)] == original[rb.MAGIC_POS :]
    assert [r.offset for r in DefaultRecordBatch(data[len(original) :])] == [3, 4]
    assert small_log.stats.fsyncs == 0  # appends never fsync: flush() does


def test_end_offset_for_epoch(small_log: Log) -> None:
    assert small_log.end_offset_for_epoch(0) == (-1, -1)  # empty cache
    fill(small_log, 2, epoch=2)  # offsets 0..3
    fill(small_log, 2, epoch=4)  # 4..7
    fill(small_log, 1, epoch=7)  # 8..9
    assert small_log.latest_epoch == 7
    assert [tuple(e) for e in small_log.epoch_entries] == [(2, 0), (4, 4), (7, 8)]
    assert small_log.end_offset_for_epoch(7) == (7, 10)  # latest: log end offset
    assert small_log.end_offset_for_epoch(4) == (4, 8)
    assert small_log.end_offset_for_epoch(5) == (4, 8)  # unknown, between: floor epoch
    assert small_log.end_offset_for_epoch(1) == (1, 0)  # below all known (Kafka since KIP-279)
    assert small_log.end_offset_for_epoch(8) == (-1, -1)
    assert small_log.end_offset_for_epoch(-1) == (-1, -1)
    with pytest.raises(FencedLeaderEpochError):
        small_log.append(batch(), 6)
    text = (small_log.directory / LEADER_EPOCH_CHECKPOINT).read_text()
    assert text == "0\n3\n2 0\n4 4\n7 8\n"


def test_append_replicated(small_log: Log, tmp_path: Path) -> None:
    with Log.open(tmp_path / "leader", SMALL) as leader:
        fill(leader, 5, epoch=1)
        fill(leader, 5, epoch=3)
        data = leader.read(0, 1 << 20)
    assert small_log.append_replicated(b"") is None
    info = small_log.append_replicated(data[: len(data) // 2])
    assert info is not None and info.base_offset == 0
    rest = data[len(data) // 2 :]
    rest_offsets = offsets(rest)
    small_log.append_replicated(rest)
    assert small_log.read(0, 1 << 20) == data
    assert [tuple(e) for e in small_log.epoch_entries] == [(1, 0), (3, 10)]
    assert rest_offsets[-1][1] == small_log.log_end_offset - 1
    with pytest.raises(InvalidRecordError):  # not contiguous
        small_log.append_replicated(data[: len(data) // 2])
    one = build_batch([Record(None, b"x", 1)], base_offset=20, partition_leader_epoch=2)
    with pytest.raises(InvalidRecordError):  # epoch going backwards
        small_log.append_replicated(one)
    flipped = bytearray(build_batch([Record(None, b"xyz", 1)], base_offset=20))
    flipped[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        small_log.append_replicated(bytes(flipped))
    assert small_log.log_end_offset == 20


def test_leader_append_rejects_bad_batches(small_log: Log) -> None:
    with pytest.raises(RecordTooLargeError):
        Log.open(small_log.directory / "x", LogConfig(max_message_bytes=100)).append(
            batch(size=200), 0
        )
    bad = bytearray(batch())
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        small_log.append(bytes(bad), 0)
    with pytest.raises(InvalidRecordError):
        small_log.append(build_batch([Record(None, b"c", 1)], control=True), 0)
    assert small_log.log_end_offset == 0


def test_log_append_time(log_dir: Path) -> None:
    config = LogConfig(message_timestamp_type="LogAppendTime")
    with Log.open(log_dir, config, clock_ms=lambda: 1_234_567) as log:
        info = log.append(batch(ts=5), 0)
        assert info.log_append_time == 1_234_567
        stored = DefaultRecordBatch(log.read(0, 1 << 20))
        assert stored.validate_crc()
        assert stored.timestamp_type == 1 and stored.max_timestamp == 1_234_567


def test_config_invariants() -> None:
    # Kafka keys are parsed by the config registry (tests/actors/control/test_config_keys.py);
    # a LogConfig built with values out of the log's ranges is refused all the same.
    with pytest.raises(InvalidConfigError, match=r"segment\.bytes"):
        LogConfig(segment_bytes=1)
    with pytest.raises(InvalidConfigError, match=r"message\.timestamp\.type"):
        LogConfig(message_timestamp_type="Now")
    with pytest.raises(InvalidConfigError, match=r"max\.message\.bytes"):
        LogConfig(max_message_bytes=1 << 30)


def test_truncate_to(log_dir: Path) -> None:
    log = Log.open(log_dir, SMALL)
    fill(log, 20, n=2, epoch=1)
    fill(log, 20, n=2, epoch=2)  # epoch 2 starts at 40
    segments = log.segment_count
    assert log.truncate_to(100) == 80  # no-op at/after the end
    assert log.truncate_to(51) == 50  # inside batch [50, 51]: the whole batch goes
    assert log.segment_count < segments
    assert offsets(log.read(44, 1 << 20))[-1] == (48, 49)
    assert [tuple(e) for e in log.epoch_entries] == [(1, 0), (2, 40)]
    assert log.truncate_to(40) == 40
    assert [tuple(e) for e in log.epoch_entries] == [(1, 0)]
    log.append(batch(), 3)
    assert log.end_offset_for_epoch(1) == (1, 40)
    log.close()
    with Log.open(log_dir, SMALL) as again:
        assert again.log_end_offset == 42
        assert [tuple(e) for e in again.epoch_entries] == [(1, 0), (3, 40)]
        assert again.truncate_to(0) == 0
        assert again.read(0, 100) == b""
        with pytest.raises(OffsetOutOfRangeError):
            again.read(1, 100)


def test_truncate_at_segment_boundary(small_log: Log) -> None:
    fill(small_log, 30)
    bases = sorted(int(p.stem) for p in small_log.directory.glob("*.log"))
    boundary = bases[3]
    assert small_log.truncate_to(boundary) == boundary
    assert sorted(int(p.stem) for p in small_log.directory.glob("*.log")) == bases[:3]
    small_log.append(batch(), 0)  # the last remaining segment is active again
    assert offsets(small_log.read(boundary, 100)) == [(boundary, boundary + 1)]


def test_truncate_fully_and_start_at(small_log: Log) -> None:
    fill(small_log, 5)
    small_log.truncate_fully_and_start_at(1000)
    assert (small_log.log_start_offset, small_log.log_end_offset) == (1000, 1000)
    small_log.append(batch(), 4)
    assert offsets(small_log.read(1000, 100)) == [(1000, 1001)]
    assert (small_log.directory / "00000000000000001000.log").exists()


def test_retention_by_time_and_bytes(log_dir: Path) -> None:
    config = LogConfig(segment_bytes=1024, retention_ms=1_000, index_interval_bytes=256)
    log = Log.open(log_dir, config)
    for i in range(40):
        log.append(batch(ts=10_000 + i * 100), 0)
    segments = log.segment_count
    assert log.enforce_retention(now_ms=10_000) == 0
    # Only segments wholly below the high watermark may go.
    assert log.enforce_retention(now_ms=1 << 40, high_watermark=0) == 0
    deleted = log.enforce_retention(now_ms=12_000)
    assert deleted > 0 and log.segment_count == segments - deleted
    start = log.log_start_offset
    assert start > 0 and log.read(start, 10)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(start - 1, 10)
    # Never the active segment, however old.
    log.enforce_retention(now_ms=1 << 40)
    assert log.segment_count == 1
    assert log.log_start_offset == int(last_segment(log.directory).stem)
    log.close()
    config = LogConfig(segment_bytes=1024, retention_bytes=3000, retention_ms=-1)
    with Log.open(log_dir / "bytes", config) as by_size:
        fill(by_size, 60)
        by_size.enforce_retention(now_ms=0)
        assert 3000 - 1024 <= by_size.size_bytes <= 3000 + 1024
        assert by_size.log_start_offset > 0


def test_high_watermark_checkpoint(log_dir: Path) -> None:
    with Log.open(log_dir, SMALL) as log:
        fill(log, 5)
        log.checkpoint_high_watermark(6)
        assert log.high_watermark == 6
        log.checkpoint_high_watermark(1_000)  # clamped to the log end
        assert log.high_watermark == 10
    assert (log_dir / HIGH_WATERMARK_CHECKPOINT).read_text() == "0\n10\n"
    with Log.open(log_dir, SMALL) as log:
        assert log.high_watermark == 10
        log.truncate_to(4)
        assert log.high_watermark == 4
