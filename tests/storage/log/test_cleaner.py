"""Log compaction: Log.clean with the per-batch rules of raylog.storage.log.cleaner.

Real files in a temporary directory; batches built by raylog's builder or by kafka-python's
producer code (compressed). Each test compares what a consumer reading the log gets after
cleaning (decoded by the connector's record decoder) with the latest record per key,
computed independently from what was appended.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kafka.record import default_records as kdr
from support.kafka_batches import kafka_batch
from support.pipelines import kafka_codecs
from support.waiting import wait_until

from raylog.pipelines import records as R
from raylog.storage import batch as rb
from raylog.storage.batch import Record, build_batch
from raylog.storage.cleaner_process import run_in_child
from raylog.storage.errors import CorruptRecordError
from raylog.storage.log import CLEANED_SUFFIX, Log, LogConfig
from raylog.storage.log.cleaner import DELETE_HORIZON_FLAG
from raylog.storage.records import iter_records

COMPACT = LogConfig(segment_bytes=2048, index_interval_bytes=256, cleanup_policy="compact")


def compact(**overrides: Any) -> LogConfig:
    return msgspec.structs.replace(COMPACT, **overrides)


DAY = 86_400_000

Appended = list[tuple[int, bytes | None, bytes | None]]


def consumed(log: Log, start: int | None = None) -> list[tuple[int, Any, Any]]:
    """(offset, key, value) of every record a consumer reading from ``start`` gets."""
    offset = log.log_start_offset if start is None else start
    data = log.read(offset, 1 << 30)
    table = R.decode_batches(data, topic="t", partition=0, start_offset=offset)
    return [(r["offset"], r["key"], r["value"]) for r in table.to_pylist()]


def compacted(appended: Appended, below: int, horizon_passed: bool = False) -> Appended:
    """What compaction of offsets below ``below`` keeps: the latest record of each key below
    it (a tombstone only while its horizon has not passed), and everything from ``below`` on.
    """
    latest: dict[bytes, int] = {}
    for offset, key, _ in appended:
        if key is not None and offset < below:
            latest[key] = offset
    kept = []
    for offset, key, value in appended:
        newest = key is not None and offset < below and latest[key] == offset
        if offset >= below or (newest and not (value is None and horizon_passed)):
            kept.append((offset, key, value))
    return kept


def append(log: Log, records: list[tuple[bytes | None, bytes | None]], ts: int = 1_000) -> Appended:
    batch = build_batch([Record(k, v, ts + i) for i, (k, v) in enumerate(records)])
    info = log.append(batch, 0)
    return [(info.base_offset + i, k, v) for i, (k, v) in enumerate(records)]


def fill(
    log: Log, batches: int, keys: int, per_batch: int = 3, value: bytes = b"v" * 40
) -> Appended:
    out: Appended = []
    n = 0
    for _ in range(batches):
        recs = []
        for _ in range(per_batch):
            recs.append((b"key-%d" % (n % keys), value + b"%d" % n))
            n += 1
        out += append(log, recs)
    return out


def cleanable_end(log: Log) -> int:
    """The base offset of the active segment: everything below can be cleaned."""
    return int(sorted(log.directory.glob("*.log"))[-1].stem)


def test_keeps_the_latest_record_of_each_key_and_every_offset(tmp_path: Path) -> None:
    with Log.open(tmp_path, COMPACT) as log:
        appended = fill(log, 60, keys=7)
        start, end = log.log_start_offset, log.log_end_offset
        segments = log.segment_count
        assert segments > 4
        result = log.clean(now_ms=10_000, high_watermark=end)
        assert result is not None
        below = cleanable_end(log)
        assert result.end_offset == below and log.first_dirty_offset == below
        assert result.records_removed > 0 and result.bytes_after < result.bytes_before
        assert consumed(log) == compacted(appended, below)
        # Offsets and bounds never move. Segments merge by their size before cleaning (as
        # Kafka groups them), so full ones merge on the next pass.
        assert (log.log_start_offset, log.log_end_offset) == (start, end)
        assert log.segment_count == segments
        again = log.clean(now_ms=10_000, high_watermark=end, force=True)
        assert again is not None and again.records_removed == 0
        assert log.segment_count < segments
        # A consumer may start anywhere, also inside a removed range.
        for offset in range(start, end, 5):
            assert consumed(log, offset) == [
                r for r in compacted(appended, below) if r[0] >= offset
            ]
        # New appends continue at the log end.
        more = append(log, [(b"key-1", b"new")])
        assert more[0][0] == end
    with Log.open(tmp_path, COMPACT) as log:  # recovery trusts and keeps the gaps
        assert consumed(log) == compacted(appended + more, below)
        assert log.first_dirty_offset == below


def test_a_second_pass_compacts_across_the_old_clean_part(tmp_path: Path) -> None:
    with Log.open(tmp_path, COMPACT) as log:
        appended = fill(log, 40, keys=5)
        log.clean(now_ms=10_000, high_watermark=log.log_end_offset)
        appended += fill(log, 40, keys=5)
        assert not log.cleaning_due(10_000, high_watermark=log.first_dirty_offset)
        result = log.clean(now_ms=10_000, high_watermark=log.log_end_offset)
        assert result is not None
        below = cleanable_end(log)
        assert consumed(log) == compacted(appended, below)
        # Only the newest value of each key is left below the cut: 5 keys.
        assert len([r for r in consumed(log) if r[0] < below]) <= 5


def test_only_below_the_high_watermark_and_only_when_dirty_enough(tmp_path: Path) -> None:
    config = LogConfig(
        segment_bytes=2048,
        index_interval_bytes=256,
        cleanup_policy="compact",
        min_cleanable_dirty_ratio=0.9,
    )
    with Log.open(tmp_path, config) as log:
        appended = fill(log, 40, keys=3)
        second = log._state.segments[2].base_offset
        # The high watermark allows only the first two segments.
        result = log.clean(now_ms=10_000, high_watermark=second + 1)
        assert result is not None and result.end_offset == second
        assert consumed(log) == compacted(appended, second)
        # Dirty part below 90% of the cleanable bytes: not due, nothing done.
        log.clean(now_ms=10_000, high_watermark=log.log_end_offset, force=True)
        appended += fill(log, 2, keys=3)
        assert not log.cleaning_due(10_000, log.log_end_offset)
        assert log.clean(now_ms=10_000, high_watermark=log.log_end_offset) is None


def test_min_compaction_lag_leaves_young_segments(tmp_path: Path) -> None:
    config = compact(min_compaction_lag_ms=5_000)
    with Log.open(tmp_path, config) as log:
        fill(log, 30, keys=3)  # timestamps around 1_000
        assert log.clean(now_ms=3_000, high_watermark=log.log_end_offset) is None
        assert log.clean(now_ms=60_000, high_watermark=log.log_end_offset) is not None


def test_tombstones_stay_for_delete_retention_then_go(tmp_path: Path) -> None:
    config = compact(delete_retention_ms=DAY)
    with Log.open(tmp_path, config) as log:
        appended = fill(log, 10, keys=4)
        appended += append(log, [(b"key-2", None)], ts=5_000)  # delete key-2
        appended += fill(log, 30, keys=1)  # push the tombstone out of the active segment
        below = cleanable_end(log)
        now = 100_000
        log.clean(now_ms=now, high_watermark=log.log_end_offset)
        after_first = consumed(log)
        assert after_first == compacted(appended, below)
        tombstone = [r for r in after_first if r[1] == b"key-2"]
        assert len(tombstone) == 1 and tombstone[0][2] is None
        # The pass set the batch's delete horizon and kept every record's timestamp.
        data = log.read(tombstone[0][0], 1 << 20)
        header = rb.parse_header(data)
        assert header.attributes & DELETE_HORIZON_FLAG
        assert header.base_timestamp == now + DAY
        table = R.decode_batches(data, topic="t", partition=0).to_pylist()
        assert table[0]["timestamp"].timestamp() * 1000 == pytest.approx(5_000)
        # Before the horizon: still there; after it: gone (the pass is due by itself).
        assert not log.cleaning_due(now + DAY - 1, log.log_end_offset)
        assert log.cleaning_due(now + DAY, log.log_end_offset)
        log.clean(now_ms=now + DAY, high_watermark=log.log_end_offset)
        assert [r for r in consumed(log) if r[1] == b"key-2"] == []
        assert consumed(log) == compacted(appended, below, horizon_passed=True)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_are_recompressed_with_their_codec(tmp_path: Path, codec: str) -> None:
    codes = {
        "gzip": kdr.DefaultRecordBatch.CODEC_GZIP,
        "snappy": kdr.DefaultRecordBatch.CODEC_SNAPPY,
        "lz4": kdr.DefaultRecordBatch.CODEC_LZ4,
        "zstd": kdr.DefaultRecordBatch.CODEC_ZSTD,
    }
    appended: Appended = []
    with kafka_codecs(), Log.open(tmp_path, COMPACT) as log:
        n = 0
        for _ in range(40):
            recs = [
                {
                    "key": b"k%d" % ((n + i) % 6),
                    "value": b"value %d " % (n + i) * 4,
                    "timestamp": 1_000 + n + i,
                    "headers": [("h", b"x")],
                }
                for i in range(5)
            ]
            info = log.append(kafka_batch(recs, codes[codec]), 0)
            appended += [(info.base_offset + i, r["key"], r["value"]) for i, r in enumerate(recs)]
            n += 5
        log.clean(now_ms=10_000, high_watermark=log.log_end_offset)
        below = cleanable_end(log)
        assert consumed(log) == compacted(appended, below)
        for _, header in rb.iter_batches(log.read(0, 1 << 30)):
            assert header.compression == codes[codec]


def test_the_last_batch_of_a_producer_stays_even_when_empty(tmp_path: Path) -> None:
    with Log.open(tmp_path, COMPACT) as log:
        idem = build_batch(
            [Record(b"a", b"1", 1_000), Record(b"b", b"2", 1_001)],
            producer_id=42,
            producer_epoch=3,
            base_sequence=17,
        )
        first = log.append(idem, 0)
        fill(log, 40, keys=2, value=b"x" * 40)  # key-0/key-1: not a, b
        append(log, [(b"a", b"3"), (b"b", b"4")])
        fill(log, 30, keys=2)
        log.clean(now_ms=10_000, high_watermark=log.log_end_offset)
        data = log.read(first.base_offset, 1 << 20)
        header = rb.parse_header(data)
        assert header.base_offset == first.base_offset
        assert header.records_count == 0 and header.last_offset_delta == 1
        assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 17)
        assert rb.crc_ok(data, 0, header)
        # Replica start-up rebuilds producer state from headers: the batch is there.
        assert [h.base_sequence for h in log.batch_headers() if h.producer_id == 42] == [17]


def test_records_without_a_key_are_removed(tmp_path: Path) -> None:
    with Log.open(tmp_path, LogConfig(segment_bytes=2048, index_interval_bytes=256)) as log:
        appended = append(log, [(None, b"no key"), (b"k", b"keyed")])
        appended += fill(log, 30, keys=3)
        log.reconfigure(COMPACT)  # delete -> compact: old unkeyed records go
        log.clean(now_ms=10_000, high_watermark=log.log_end_offset)
        assert (0, None, b"no key") not in consumed(log)
        assert consumed(log) == compacted(appended, cleanable_end(log))


def test_a_crash_between_the_swap_steps_recovers_the_cleaned_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log_dir = tmp_path / "log"
    with Log.open(log_dir, COMPACT) as log:
        appended = fill(log, 60, keys=7)
        log.clean(now_ms=10_000, high_watermark=log.log_end_offset)
        before = {p.name: p.read_bytes() for p in log_dir.glob("*.log")}
        result = log.clean(now_ms=10_000, high_watermark=log.log_end_offset, force=True)
        assert result is not None and result.segments_after < result.segments_before
        below = cleanable_end(log)
        expected = consumed(log)
    # Put back the merged segments the swap unlinked (step 3 not reached), drop the cleaned
    # segments' index files (step 4 not reached), and leave a stray .cleaned file.
    cleaned = {p.name for p in log_dir.glob("*.log")}
    for name, data in before.items():
        if name not in cleaned:
            (log_dir / name).write_bytes(data)
    for name in cleaned:
        (log_dir / name).with_suffix(".index").unlink(missing_ok=True)
    stray = log_dir / ("00000000000000000000.log" + CLEANED_SUFFIX)
    stray.write_bytes(b"partial")
    with caplog.at_level(logging.WARNING), Log.open(log_dir, COMPACT) as log:
        assert consumed(log) == expected == compacted(appended, below)
        assert "interrupted cleaning" in caplog.text
    assert not stray.exists()
    assert {p.name for p in log_dir.glob("*.log")} == cleaned


def test_a_pass_gives_up_when_the_log_is_truncated_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raylog.storage.log import cleaner

    with Log.open(tmp_path, COMPACT) as log:
        appended = fill(log, 40, keys=5)
        cut = log._state.segments[2].base_offset + 1
        real = cleaner.clean_batch
        calls = []

        def truncating(*args: Any, **kwargs: Any) -> Any:
            if not calls:
                log.truncate_to(cut)  # as an unclean election would, during the rewrite
            calls.append(1)
            return real(*args, **kwargs)

        monkeypatch.setattr(cleaner, "clean_batch", truncating)
        assert log.clean(now_ms=10_000, high_watermark=log.log_end_offset, force=True) is None
        assert not list(tmp_path.glob("*" + CLEANED_SUFFIX))
        kept = [r for r in appended if r[0] < log.log_end_offset]
        assert consumed(log) == kept


def test_a_follower_copies_a_compacted_log_with_its_gaps(tmp_path: Path) -> None:
    with Log.open(tmp_path / "leader", COMPACT) as leader:
        appended = fill(leader, 50, keys=4)
        leader.clean(now_ms=10_000, high_watermark=leader.log_end_offset)
        data = leader.read(0, 1 << 30)
        with Log.open(tmp_path / "follower", COMPACT) as follower:
            follower.append_replicated(data)
            assert follower.read(0, 1 << 30) == data
            assert follower.log_end_offset == leader.log_end_offset
        with Log.open(tmp_path / "follower", COMPACT) as follower:
            assert follower.read(0, 1 << 30) == data
        assert consumed(leader) == compacted(appended, cleanable_end(leader))


def test_delete_policy_logs_are_never_cleaned_and_compact_ones_never_expire(
    tmp_path: Path,
) -> None:
    with Log.open(tmp_path / "d", LogConfig(segment_bytes=2048)) as log:
        fill(log, 30, keys=2)
        assert log.clean(now_ms=10_000, high_watermark=log.log_end_offset, force=True) is None
    config = LogConfig(segment_bytes=2048, cleanup_policy="compact", retention_ms=1)
    with Log.open(tmp_path / "c", config) as log:
        fill(log, 30, keys=2)
        assert log.enforce_retention(now_ms=10**12) == 0
    both = LogConfig(segment_bytes=2048, cleanup_policy="compact,delete", retention_ms=1)
    with Log.open(tmp_path / "b", both) as log:
        fill(log, 30, keys=2)
        assert log.enforce_retention(now_ms=10**12) > 0


def test_record_walker_rejects_corrupt_records() -> None:
    batch = build_batch([Record(b"k", b"v", 1), Record(None, b"w", 2)])
    header = rb.parse_header(batch)
    assert rb.check_client_records(batch, header, keys_required=True) == 1
    assert rb.check_client_records(batch, header) is None
    section = bytearray(batch[rb.HEADER_SIZE :])
    with pytest.raises(CorruptRecordError):
        list(iter_records(section, header.records_count + 1))
    section[0] = 0x7E  # a record length far past the section
    with pytest.raises(CorruptRecordError):
        list(iter_records(section, header.records_count))


def test_bad_cleaner_checkpoint_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Log.open(tmp_path, COMPACT) as log:
        fill(log, 30, keys=3)
        log.clean(now_ms=10_000, high_watermark=log.log_end_offset)
    (tmp_path / "cleaner-offset-checkpoint").write_text("garbage")
    with caplog.at_level(logging.WARNING), Log.open(tmp_path, COMPACT) as log:
        assert log.first_dirty_offset == log.log_start_offset
        assert "cleaner-offset-checkpoint" in caplog.text
    shutil.rmtree(tmp_path)


def test_long_keys_are_mapped_by_digest(tmp_path: Path) -> None:
    long_keys = [b"long-key-%d-" % k + b"x" * 60 for k in range(4)]
    with Log.open(tmp_path, COMPACT) as log:
        appended: Appended = []
        for i in range(40):
            appended += append(log, [(long_keys[(3 * i + j) % 4], b"v%d" % i) for j in range(3)])
            appended += append(log, [(long_keys[i % 4][:20], b"short %d" % i)])  # a prefix
        log.clean(now_ms=10_000, high_watermark=log.log_end_offset)
        assert consumed(log) == compacted(appended, cleanable_end(log))


def test_max_compaction_lag_rolls_the_active_segment(tmp_path: Path) -> None:
    # segment.ms is a week; max.compaction.lag.ms of 5 s rolls at the first append 5 s later.
    with Log.open(tmp_path, compact(max_compaction_lag_ms=5_000)) as log:
        appended = append(log, [(b"a", b"1"), (b"a", b"2")], ts=1_000)
        appended += append(log, [(b"a", b"3")], ts=3_000)
        assert log.segment_count == 1
        appended += append(log, [(b"b", b"4")], ts=7_000)
        assert log.segment_count == 2
        assert log.cleaning_due(now_ms=60_000, high_watermark=log.log_end_offset)
        log.clean(now_ms=60_000, high_watermark=log.log_end_offset)
        assert consumed(log) == [(2, b"a", b"3"), (3, b"b", b"4")]
    with Log.open(tmp_path / "delete", LogConfig(max_compaction_lag_ms=5_000)) as log:
        append(log, [(b"a", b"1")], ts=1_000)
        append(log, [(b"a", b"2")], ts=7_000)
        assert log.segment_count == 1  # only compacted logs roll for it


def test_a_full_offset_map_cleans_up_to_where_it_filled(tmp_path: Path) -> None:
    with Log.open(tmp_path, COMPACT) as log:
        appended: Appended = []
        for i in range(60):  # fresh keys in every batch: the map fills quickly
            appended += append(log, [(b"k%d-%d" % (i // 4, j), b"v%d" % i) for j in range(3)])
        end = cleanable_end(log)
        first = log.clean(now_ms=10_000, high_watermark=log.log_end_offset, max_map_entries=10)
        assert first is not None and 0 < first.end_offset < end
        assert log.first_dirty_offset == first.end_offset
        assert consumed(log) == compacted(appended, first.end_offset)
        while log.first_dirty_offset < end:  # each pass moves on (bounded: a segment or more)
            before = log.first_dirty_offset
            log.clean(now_ms=10_000, high_watermark=log.log_end_offset, max_map_entries=10)
            assert log.first_dirty_offset > before
        assert consumed(log) == compacted(appended, end)


def test_a_full_disk_during_the_rewrite_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    failing = [False]

    def fsync(fd: int) -> None:
        if failing[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        os.fdatasync(fd)

    with Log.open(tmp_path, COMPACT, fsync=fsync) as log:
        appended = fill(log, 40, keys=5)
        before = log.read(0, 1 << 30)
        failing[0] = True
        with caplog.at_level(logging.WARNING):
            assert log.clean(now_ms=10_000, high_watermark=log.log_end_offset) is None
        assert "No space left" in caplog.text
        failing[0] = False
        assert not list(tmp_path.glob("*" + CLEANED_SUFFIX))
        assert log.read(0, 1 << 30) == before  # untouched, and still serving
        appended += append(log, [(b"key-1", b"after")])
        assert log.clean(now_ms=10_000, high_watermark=log.log_end_offset) is not None
        assert consumed(log) == compacted(appended, cleanable_end(log))


def test_corrupt_bytes_make_the_log_uncleanable_not_offline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Log.open(tmp_path, COMPACT) as log:
        fill(log, 40, keys=5)
        first = sorted(tmp_path.glob("*.log"))[0]
        data = bytearray(first.read_bytes())
        data[200] ^= 0xFF  # inside the first batch's records: under its CRC
        first.write_bytes(data)
        with caplog.at_level(logging.ERROR):
            assert log.clean(now_ms=10_000, high_watermark=log.log_end_offset) is None
        assert log.uncleanable and "CRC" in log.uncleanable
        assert "uncleanable" in caplog.text
        assert log.holds_damage and log.damage is not None  # cut and fetched again once reopened
        assert log.damage.cut_offset == 0
        assert not log.cleaning_due(10_000, log.log_end_offset)
        # Still serving: appends, and reads of intact batches.
        end = log.log_end_offset
        append(log, [(b"k", b"v")])
        assert consumed(log, end) == [(end, b"k", b"v")]


def test_a_pass_rewrites_in_a_child_process_exactly_as_inline(tmp_path: Path) -> None:
    with Log.open(tmp_path / "a", COMPACT) as log:
        appended = fill(log, 50, keys=6)
        appended += append(log, [(b"key-2", None)], ts=5_000)
        appended += fill(log, 20, keys=1)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    results = {}
    for name, runner in (("a", None), ("b", run_in_child)):
        with Log.open(tmp_path / name, COMPACT) as log:
            results[name] = log.clean(100_000, log.log_end_offset, runner=runner)
            assert results[name] is not None
            assert consumed(log) == compacted(appended, cleanable_end(log))
    assert results["a"] == results["b"]
    for path in sorted((tmp_path / "a").glob("*.log")):
        assert (tmp_path / "b" / path.name).read_bytes() == path.read_bytes()


def test_a_child_that_fails_or_dies_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Log.open(tmp_path, COMPACT) as log:
        fill(log, 40, keys=5)
        before = log.read(0, 1 << 30)
        first = sorted(tmp_path.glob("*.log"))[0]
        with monkeypatch.context() as mp:
            mp.setattr(sys, "executable", "/bin/false")  # exits 1, answers nothing
            assert log.clean(10_000, log.log_end_offset, runner=run_in_child) is None
        assert log.read(0, 1 << 30) == before and log.uncleanable is None
        # Corrupt bytes: the child's error reaches the parent, which stops cleaning this log.
        data = bytearray(first.read_bytes())
        data[200] ^= 0xFF
        first.write_bytes(data)
        assert log.clean(10_000, log.log_end_offset, runner=run_in_child) is None
        assert log.uncleanable and "CRC" in log.uncleanable


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_cleaning_child_dies_with_its_parent(tmp_path: Path) -> None:
    """A replica killed mid-pass leaves no child rewriting its segments."""
    parent_code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; "
        "import raylog.storage.cleaner_process as c; c._die_with_parent(); time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())

        def child_state() -> str:
            try:
                return Path(f"/proc/{child}/status").read_text().split("\n")[2]
            except (FileNotFoundError, ProcessLookupError):  # reaped before or while read
                return "gone"

        wait_until(lambda: "S (sleeping)" in child_state(), timeout_s=30)  # prctl done, asleep
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
    # Dead: gone, or a zombie its new parent has not reaped yet.
    wait_until(lambda: child_state() in ("gone",) or "zombie" in child_state(), timeout_s=30)


def test_dirty_ratio_is_the_share_of_closed_bytes_not_cleaned(tmp_path: Path) -> None:
    with Log.open(tmp_path, COMPACT) as log:
        assert log.dirty_ratio() == 0.0  # no closed segment yet
        fill(log, 40, keys=5)
        assert log.dirty_ratio() == 1.0
        log.clean(now_ms=10_000, high_watermark=log.log_end_offset)
        assert log.dirty_ratio() == 0.0
        fill(log, 40, keys=5)
        ratio = log.dirty_ratio()
        assert 0.5 < ratio < 1.0  # the new closed segments outweigh the compacted ones
    with Log.open(tmp_path / "d", LogConfig(segment_bytes=2048)) as log:
        fill(log, 40, keys=5)
        assert log.dirty_ratio() == 0.0  # not compacted
