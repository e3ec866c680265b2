"""The Log's durability: appends never fsync (only a roll fsyncs the segment it closes); a
flush makes every earlier append durable with one fsync, none when nothing is new, and lets
appends and rolls go on while its fsync runs in another thread; a failed fsync makes the log
refuse all work."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from support.log_data import SMALL, batch, fill, last_segment

from raylog.storage import Log
from raylog.storage.errors import KafkaStorageError


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
        assert _durable_to_its_end(last_segment(log_dir), synced)


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
    first = str(last_segment(log_dir).resolve())
    flushed_size = last_segment(log_dir).stat().st_size
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
    assert _durable_to_its_end(last_segment(log_dir), synced)
    log.close()
