"""Deleting a replica's data on its broker, without Ray.

Proves: the log directory and its topic id file are gone once ``delete_replica_data`` returns,
even while a process that has not died yet keeps creating files in that directory (the dying
replica of a reassignment), and nothing outside the partition's directory is touched.
"""

from __future__ import annotations

import threading
from pathlib import Path

from raylog.actors.broker import TOPIC_ID_SUFFIX, delete_replica_data

WRITES_MAX = 100_000


def _keep_writing(log_dir: Path, stop: threading.Event, created: list[int]) -> None:
    """A replica that was not told to stop: it writes a checkpoint file after another."""
    for i in range(WRITES_MAX):
        if stop.is_set():
            return
        try:
            (log_dir / f"{i:08d}.checkpoint.tmp").write_bytes(b"x")
            created.append(i)
        except FileNotFoundError:
            pass  # the directory is gone: what a dying replica's write meets


def test_data_is_gone_although_a_writer_is_still_running(tmp_path: Path) -> None:
    log_dir = tmp_path / "moving-0"
    log_dir.mkdir()
    for i in range(200):
        (log_dir / f"{i:020d}.log").write_bytes(b"r" * 100)
    id_file = tmp_path / f"moving-0{TOPIC_ID_SUFFIX}"
    id_file.write_text("topic-id")
    neighbour = tmp_path / "moving-1"
    neighbour.mkdir()
    (neighbour / "00000000000000000000.log").write_bytes(b"kept")

    stop, created = threading.Event(), []
    writer = threading.Thread(target=_keep_writing, args=(log_dir, stop, created))
    writer.start()
    try:
        while len(created) < 50:  # bounded: the writer stops after WRITES_MAX files
            assert writer.is_alive(), "the writer stopped before the deletion started"
        delete_replica_data(log_dir)
        assert not log_dir.exists() and not id_file.exists()
    finally:
        stop.set()
        writer.join(timeout=10)
    assert not log_dir.exists(), "a write after the deletion brought the directory back"
    assert (neighbour / "00000000000000000000.log").read_bytes() == b"kept"


def test_deleting_what_does_not_exist_is_quiet(tmp_path: Path) -> None:
    (tmp_path / f"gone-0{TOPIC_ID_SUFFIX}").write_text("id")
    delete_replica_data(tmp_path / "gone-0")
    assert list(tmp_path.iterdir()) == []
