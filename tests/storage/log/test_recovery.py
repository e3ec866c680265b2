"""Recovery of the Log after a crash or damage: a torn tail and a flipped bit cut (epochs
trimmed with them), lost or garbage index files rebuilt, a flipped bit in an inactive segment
never served, a full disk leaving a readable log, and a crash inside a truncation leaving a
prefix of the old log."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.log_data import (
    SMALL,
    batch,
    fill,
    fill_and_flip_a_bit_in_the_first_segment,
    last_segment,
    offsets,
)

from raylog.storage import Log, LogConfig
from raylog.storage import batch as rb
from raylog.storage.errors import KafkaStorageError


def test_recovery_cuts_torn_tail(log_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Log.open(log_dir, SMALL) as log:
        fill(log, 12)
        leo = log.log_end_offset
    with open(last_segment(log_dir), "ab") as f:
        f.write(batch()[:50])  # half a header: a torn write
    with caplog.at_level(logging.WARNING), Log.open(log_dir, SMALL) as log:
        assert log.log_end_offset == leo
        assert "cut 50 bytes" in caplog.text
        log.append(batch(), 0)
        assert offsets(log.read(leo, 1000)) == [(leo, leo + 1)]


def test_recovery_cuts_at_bit_flip_inlast_segment(
    log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = LogConfig(index_interval_bytes=256)  # one big segment
    with Log.open(log_dir, config) as log:
        fill(log, 40, epoch=1)
        fill(log, 10, epoch=2)
        whole = log.read(0, 1 << 20)
    spans = list(rb.iter_batches(whole))
    pos, header = spans[20]
    segment = last_segment(log_dir)
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


def test_bit_flip_in_inactive_segment_is_never_served(log_dir: Path) -> None:
    fill_and_flip_a_bit_in_the_first_segment(log_dir)
    with Log.open(log_dir, SMALL) as log:
        assert offsets(log.read(0, 1))  # earlier batches still serve
        with pytest.raises(KafkaStorageError, match="CRC"):
            log.read(0, 1 << 20)


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
    segment = last_segment(log_dir)
    assert segment.stat().st_size == result["read_bytes"]  # the partial write was cut back
    with Log.open(log_dir) as log:
        assert log.log_end_offset == acked[-1] + 1
        assert offsets(log.read(0, 1 << 30))[-1][1] == acked[-1]


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
