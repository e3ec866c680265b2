"""The Log's contract: offsets, reads at every boundary, segments and indexes, timestamps,
leader epochs (KIP-101/279), truncation, retention, recovery from torn or flipped bytes and
lost index files, a full disk, failed fsyncs, and flushes (appends never fsync; a flush makes
every earlier append durable, also while appends go on in another thread)."""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch
from support.waiting import wait_until

from raylog.storage import Log, LogConfig
from raylog.storage import batch as rb
from raylog.storage.batch import Record, build_batch
from raylog.storage.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidConfigError,
    InvalidRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from raylog.storage.log import HIGH_WATERMARK_CHECKPOINT, LEADER_EPOCH_CHECKPOINT

SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=256)


def batch(n: int = 2, ts: int = 1_000, size: int = 40, tag: int = 0) -> bytes:
    return build_batch([Record(b"k%d" % tag, bytes([tag % 256]) * size, ts + i) for i in range(n)])


def offsets(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for _, h in rb.iter_batches(data)]


def fill(log: Log, count: int, n: int = 2, epoch: int = 0, ts: int = 1_000) -> None:
    for i in range(count):
        log.append(batch(n, ts + i * 10, tag=i), epoch)


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    wait_until(condition, timeout_s=timeout_s, interval_s=0.001)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "topic-0"


@pytest.fixture
def small_log(log_dir: Path) -> Iterator[Log]:
    log = Log.open(log_dir, SMALL)
    yield log
    log.close()


# -- appends and reads -------------------------------------------------------------------------


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


def test_read_boundaries(small_log: Log) -> None:
    fill(small_log, 3, n=2)  # batches [0,1] [2,3] [4,5]
    leo = small_log.log_end_offset
    assert small_log.read(leo, 1000) == b""
    with pytest.raises(OffsetOutOfRangeError):
        small_log.read(leo + 1, 1000)
    with pytest.raises(OffsetOutOfRangeError):
        small_log.read(-1, 1000)
    # The batch holding the offset comes first, even when it starts before it.
    assert offsets(small_log.read(3, 1 << 20)) == [(2, 3), (4, 5)]
    # At least one batch, even when larger than max_bytes.
    assert offsets(small_log.read(0, 1)) == [(0, 1)]
    assert offsets(small_log.read(0, 0)) == [(0, 1)]
    one = len(small_log.read(0, 1))
    assert offsets(small_log.read(0, 2 * one)) == [(0, 1), (2, 3)]
    assert offsets(small_log.read(0, 2 * one - 1)) == [(0, 1)]
    # max_offset (the high watermark): never a batch whose last offset reaches it.
    assert offsets(small_log.read(0, 1 << 20, max_offset=4)) == [(0, 1), (2, 3)]
    assert offsets(small_log.read(0, 1 << 20, max_offset=5)) == [(0, 1), (2, 3)]
    assert small_log.read(4, 1 << 20, max_offset=4) == b""
    assert small_log.read(2, 1 << 20, max_offset=3) == b""
    assert offsets(small_log.read(0, 1 << 20, max_offset=100)) == [(0, 1), (2, 3), (4, 5)]


def test_multi_segment_reads_and_index_lookups(small_log: Log) -> None:
    fill(small_log, 60, n=3)
    assert small_log.segment_count > 10
    leo = small_log.log_end_offset
    everything = small_log.read(0, 1 << 30)
    assert offsets(everything) == [(i, i + 2) for i in range(0, leo, 3)]
    for offset in range(leo):
        got = offsets(small_log.read(offset, 1))
        first = offset - offset % 3
        assert got == [(first, first + 2)], offset
    # Index files of inactive segments use Kafka's entry sizes and point at batch starts.
    index_files = sorted(small_log.directory.glob("*.index"))
    assert index_files[0].name == "00000000000000000000.index"
    data = index_files[0].read_bytes()
    assert data and len(data) % 8 == 0
    assert len(sorted(small_log.directory.glob("*.timeindex"))[0].read_bytes()) % 12 == 0


def test_offset_for_timestamp(small_log: Log) -> None:
    for i in range(30):
        small_log.append(batch(2, ts=10_000 + 100 * i), 0)  # batch i: ts 10000+100i, +1
    assert small_log.offset_for_timestamp(0) == (10_001, 0)
    assert small_log.offset_for_timestamp(10_001) == (10_001, 0)
    assert small_log.offset_for_timestamp(10_002) == (10_101, 2)
    assert small_log.offset_for_timestamp(12_050) == (12_101, 42)
    assert small_log.offset_for_timestamp(12_901) == (12_901, 58)
    assert small_log.offset_for_timestamp(12_902) is None
    assert small_log.offset_for_timestamp(-1) == (-1, 60)
    assert small_log.offset_for_timestamp(-2) == (-1, 0)


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


# -- truncation, retention, checkpoints --------------------------------------------------------


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
    assert log.log_start_offset == int(_last_segment(log.directory).stem)
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


# -- recovery ------------------------------------------------------------------------------------


def _last_segment(directory: Path) -> Path:
    return sorted(directory.glob("*.log"))[-1]


def test_recovery_cuts_torn_tail(log_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Log.open(log_dir, SMALL) as log:
        fill(log, 12)
        leo = log.log_end_offset
    with open(_last_segment(log_dir), "ab") as f:
        f.write(batch()[:50])  # half a header: a torn write
    with caplog.at_level(logging.WARNING), Log.open(log_dir, SMALL) as log:
        assert log.log_end_offset == leo
        assert "cut 50 bytes" in caplog.text
        log.append(batch(), 0)
        assert offsets(log.read(leo, 1000)) == [(leo, leo + 1)]


def test_recovery_cuts_at_bit_flip_in_last_segment(
    log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = LogConfig(index_interval_bytes=256)  # one big segment
    with Log.open(log_dir, config) as log:
        fill(log, 40, epoch=1)
        fill(log, 10, epoch=2)
        whole = log.read(0, 1 << 20)
    spans = list(rb.iter_batches(whole))
    pos, header = spans[20]
    segment = _last_segment(log_dir)
    data = bytearray(segment.read_bytes())
    data[pos + 70] ^= 0x10
    segment.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING), Log.open(log_dir, config) as log:
        assert log.log_end_offset == header.base_offset
        assert log.read(0, 1 << 20) == whole[:pos]
        assert [tuple(e) for e in log.epoch_entries] == [(1, 0)]  # epoch 2 was cut
        assert "torn or corrupt" in caplog.text


def test_recovery_rebuilds_deleted_or_garbage_indexes(log_dir: Path) -> None:
    with Log.open(log_dir, SMALL) as log:
        fill(log, 50, n=3)
        expected = {o: log.read(o, 1) for o in range(0, 150, 7)}
        ts_answer = log.offset_for_timestamp(1_250)
    indexes = sorted(log_dir.glob("*.index"))
    indexes[1].unlink()
    sorted(log_dir.glob("*.timeindex"))[2].unlink()
    indexes[3].write_bytes(b"\x00\x00\x00\x09\x00\x00\x10\x00" * 3)  # not increasing
    indexes[4].write_bytes(b"\x01\x02\x03")  # not whole entries
    with Log.open(log_dir, SMALL) as log:
        assert log.log_end_offset == 150
        assert {o: log.read(o, 1) for o in range(0, 150, 7)} == expected
        assert log.offset_for_timestamp(1_250) == ts_answer
    assert all(p.with_suffix(".index").exists() for p in log_dir.glob("*.log"))
    assert len(indexes[4].read_bytes()) % 8 == 0


def _fill_and_flip_a_bit_in_the_first_segment(log_dir: Path) -> None:
    with Log.open(log_dir, SMALL) as log:
        fill(log, 30)
    first = sorted(log_dir.glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[len(data) - 3] ^= 0x01  # inside the last batch's records
    first.write_bytes(bytes(data))


def test_bit_flip_in_inactive_segment_is_never_served(log_dir: Path) -> None:
    _fill_and_flip_a_bit_in_the_first_segment(log_dir)
    with Log.open(log_dir, SMALL) as log:
        assert offsets(log.read(0, 1))  # earlier batches still serve
        with pytest.raises(KafkaStorageError, match="CRC"):
            log.read(0, 1 << 20)


# -- faults and durability -----------------------------------------------------------------------

_FULL_DISK_CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys
    from raylog.storage import Log, LogConfig
    from raylog.storage.batch import Record, build_batch
    from raylog.storage.errors import KafkaStorageError
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then writes past the limit fail: EFBIG
    log = Log.open(sys.argv[1], LogConfig())
    log.append(build_batch([Record(None, b"warm", 1)]), 0)  # checkpoint files written first
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, resource.RLIM_INFINITY))
    acked, error = [], None
    for i in range(100):
        try:
            acked.append(log.append(build_batch([Record(None, bytes(3000), i)]), 0).last_offset)
        except KafkaStorageError as exc:
            error = str(exc)
            break
    data = log.read(0, 1 << 30)
    try:
        log.append(build_batch([Record(None, bytes(3000), 0)]), 0)
        again = "appended"
    except KafkaStorageError:
        again = "refused"
    print(json.dumps({"acked": acked, "error": error, "leo": log.log_end_offset,
                      "read_bytes": len(data), "again": again}))
    """
)


def test_full_disk_raises_storage_error_and_keeps_log_readable(log_dir: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_CHILD, str(log_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["error"] and "File too large" in result["error"]
    assert result["again"] == "refused"
    acked = result["acked"]
    assert len(acked) > 5 and result["leo"] == acked[-1] + 1
    segment = _last_segment(log_dir)
    assert segment.stat().st_size == result["read_bytes"]  # the partial write was cut back
    with Log.open(log_dir) as log:
        assert log.log_end_offset == acked[-1] + 1
        assert offsets(log.read(0, 1 << 30))[-1][1] == acked[-1]


def test_failed_fsync_refuses_further_work(log_dir: Path) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    log = Log.open(log_dir, fsync=failing_fsync)
    log.append(batch(), 0)  # written, not durable yet
    with pytest.raises(KafkaStorageError, match="fsync"):
        log.flush()
    with pytest.raises(KafkaStorageError):
        log.read(0, 100)
    with pytest.raises(KafkaStorageError):
        log.append(batch(), 0)
    log.close()
    with Log.open(log_dir) as reopened:  # recovery decides what survived
        assert reopened.log_end_offset in (0, 2)


def _recording_fsync(synced: dict[str, int]) -> Callable[[int], None]:
    """An fsync that notes, per file, the size it made durable."""

    def fsync(fd: int) -> None:
        os.fdatasync(fd)
        synced[os.readlink(f"/proc/self/fd/{fd}")] = os.fstat(fd).st_size

    return fsync


def _durable_to_its_end(path: Path, synced: dict[str, int]) -> bool:
    return synced.get(str(path.resolve())) == path.stat().st_size


def test_appends_never_fsync_and_a_flush_makes_every_earlier_one_durable(log_dir: Path) -> None:
    synced: dict[str, int] = {}
    with Log.open(log_dir, SMALL, fsync=_recording_fsync(synced)) as log:
        fill(log, 30)
        rolls = log.stats.segments_rolled
        # Only rolls fsync, each the segment it closes.
        assert rolls >= 3 and log.stats.fsyncs == rolls and len(synced) == rolls
        log.flush()
        assert log.stats.fsyncs == rolls + 1
        on_disk = {str(p.resolve()): p.stat().st_size for p in log_dir.glob("*.log")}
        assert synced == on_disk  # every segment durable up to its end
        log.flush()  # nothing written since: no fsync
        assert log.stats.fsyncs == rolls + 1
        log.append(batch(), 0)
        log.flush()
        assert log.stats.fsyncs == log.stats.segments_rolled + 2
        assert _durable_to_its_end(_last_segment(log_dir), synced)


def test_appends_go_on_while_a_flush_fsyncs_in_another_thread(log_dir: Path) -> None:
    fsync_entered, release = threading.Event(), threading.Event()
    synced: dict[str, int] = {}
    record = _recording_fsync(synced)

    def gated_fsync(fd: int) -> None:
        if threading.current_thread() is flusher:
            fsync_entered.set()
            assert release.wait(10)
        record(fd)

    log = Log.open(log_dir, SMALL, fsync=gated_fsync)
    fill(log, 3)
    first = str(_last_segment(log_dir).resolve())
    flushed_size = _last_segment(log_dir).stat().st_size
    flusher = threading.Thread(target=log.flush)
    flusher.start()
    assert fsync_entered.wait(10)
    # The flush's fsync is in flight: appends and rolls do not wait for it.
    appender = threading.Thread(target=fill, args=(log, 30))
    appender.start()
    appender.join(10)
    assert not appender.is_alive(), "an append waited for the flush's fsync"
    assert log.stats.segments_rolled >= 3
    release.set()
    flusher.join(10)
    assert not flusher.is_alive()
    assert synced[first] >= flushed_size
    # The appends made during that fsync are covered by the next flush.
    fsyncs = log.stats.fsyncs
    log.flush()
    assert log.stats.fsyncs == fsyncs + 1
    assert _durable_to_its_end(_last_segment(log_dir), synced)
    log.close()


def test_a_crash_inside_a_truncation_leaves_a_prefix_of_the_old_log(
    log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Log.open(log_dir, SMALL) as log:
        fill(log, 30)
        files = sorted(log_dir.glob("*.log"))
        assert len(files) >= 3
        kept, later = files[-2], files[-1]
        whole = kept.read_bytes()
        old_end = int(later.stem)
        log.truncate_to(old_end - 3)
        assert not later.exists()
    # Truncation unlinks later segments first, then cuts: a crash between the two steps
    # leaves the kept segment uncut, the log a prefix of the old one, whole segments.
    kept.write_bytes(whole)
    with caplog.at_level(logging.WARNING), Log.open(log_dir, SMALL) as log:
        assert log.log_end_offset == old_end
        spans = offsets(log.read(0, 1 << 20))
        assert spans[0][0] == 0 and spans[-1][1] == old_end - 1
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(spans))
        assert "cut" not in caplog.text and "interrupted" not in caplog.text


def test_concurrent_reads_during_appends_and_rolls(small_log: Log) -> None:
    stop = threading.Event()
    failures: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                end = small_log.log_end_offset
                data = small_log.read(0, 1 << 20, max_offset=end)
                spans = offsets(data)
                expected = 0
                for base, last in spans:
                    assert base == expected
                    expected = last + 1
                assert expected <= end
        except BaseException as exc:
            failures.append(exc)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    fill(small_log, 150)
    stop.set()
    for t in readers:
        t.join(10)
    assert not failures
    assert small_log.segment_count > 10


def test_reads_match_a_reference_for_every_offset_and_budget(log_dir: Path) -> None:
    # Uneven batches and a small index interval: the index often points at batches before
    # the wanted one, which a read must skip without spending its byte budget on them.
    config = LogConfig(segment_bytes=700, index_interval_bytes=128)
    with Log.open(log_dir, config) as log:
        for i, n in enumerate([1, 1, 3, 2, 2, 5, 1, 4, 2, 3, 1, 1, 2, 6, 1]):
            log.append(batch(n=n, size=10 + 7 * i, tag=i), 0)
        everything = log.read(0, 1 << 20)
        spans = [(h, everything[p : p + h.size]) for p, h in rb.iter_batches(everything)]
        leo = log.log_end_offset
        runs_across_segments = 0
        for offset in range(leo + 1):
            for max_bytes in [*range(0, 400, 23), 1 << 20]:
                for max_offset in (None, offset, offset + 1, offset + 4, leo):
                    limit = leo if max_offset is None else min(max_offset, leo)
                    expected: list[bytes] = []
                    for h, data in spans:
                        if h.last_offset < offset:
                            continue
                        total = sum(len(d) for d in expected)
                        if h.last_offset >= limit or (expected and total + h.size > max_bytes):
                            break
                        expected.append(data)
                    got = log.read(offset, max_bytes, max_offset)
                    assert got == b"".join(expected), (offset, max_bytes, max_offset)
                    # The same batches one by one, as a replica's fetch answer takes them.
                    each = log.read_batches(offset, max_bytes, max_offset)
                    assert [bytes(b) for b in each] == expected, (offset, max_bytes, max_offset)
                    # The same batches where they lie on disk, in as few runs as they allow.
                    extents = log.read_extents(offset, max_bytes, max_offset)
                    assert b"".join(pread(*run) for run in extents.runs) == got
                    for (path, pos, size), (next_path, next_pos, _) in itertools.pairwise(
                        extents.runs
                    ):
                        assert (path, pos + size) != (next_path, next_pos)
                    spanned = offsets(got)
                    assert (extents.first_offset, extents.next_offset) == (
                        (spanned[0][0], spanned[-1][1] + 1) if spanned else (-1, -1)
                    )
                    runs_across_segments += len(extents.runs) > 1
        assert runs_across_segments


def test_extents_of_batches_larger_than_the_header_window_match_reads(log_dir: Path) -> None:
    # read_extents walks headers through a 16 KiB window: batches on both sides of its size,
    # so headers fall inside, at the edge of and beyond a window.
    config = LogConfig(segment_bytes=96 << 10, index_interval_bytes=4096)
    sizes = [100, 20_000, 5, 40_000, 16_300, 3, 9_000, 60_000, 1, 16_384, 200, 33_000]
    with Log.open(log_dir, config) as log:
        for i, size in enumerate(sizes * 2):
            log.append(batch(n=1 + i % 3, size=size, tag=i), 0)
        leo = log.log_end_offset
        for offset in range(leo + 1):
            for max_bytes in (0, 15_000, 70_000, 1 << 20):
                got = log.read(offset, max_bytes)
                extents = log.read_extents(offset, max_bytes)
                assert b"".join(pread(*run) for run in extents.runs) == got, (offset, max_bytes)
                spanned = offsets(got)
                assert (extents.first_offset, extents.next_offset) == (
                    (spanned[0][0], spanned[-1][1] + 1) if spanned else (-1, -1)
                )
        assert len({path for path, _, _ in log.read_extents(0, 1 << 30).runs}) > 2


def test_extents_leave_the_crc_to_the_reader(log_dir: Path) -> None:
    _fill_and_flip_a_bit_in_the_first_segment(log_dir)
    with Log.open(log_dir, SMALL) as log:
        with pytest.raises(KafkaStorageError, match="CRC"):
            log.read(0, 1 << 20)
        extents = log.read_extents(0, 1 << 20)  # headers only: located all the same
        located = b"".join(pread(*run) for run in extents.runs)
    with pytest.raises(CorruptRecordError, match="CRC"):
        list(rb.iter_batches(located))


def test_extents_name_files_by_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with Log.open(Path("relative") / "topic-0", SMALL) as log:
        fill(log, 3)
        extents = log.read_extents(0, 1 << 20)
    monkeypatch.chdir("/")  # a reader elsewhere
    assert extents.runs and all(os.path.isabs(path) for path, _, _ in extents.runs)
    assert offsets(b"".join(pread(*run) for run in extents.runs)) == [(0, 1), (2, 3), (4, 5)]


def pread(path: str, position: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(position)
        data = f.read(size)
    assert len(data) == size
    return data
