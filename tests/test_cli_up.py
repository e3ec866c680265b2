"""`raylog up` run as a user runs it: a subprocess that starts the cluster and stops cleanly.

Proves: the cluster starts with raylog's Ray settings (token auth, temp dir owned by the data
dir), records how to join it in cluster.json, keeps the same cluster identity across restarts,
exits 0 on SIGINT and SIGTERM removing its record, and refuses an unusable data dir in one line.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

RAYLOG = [sys.executable, "-m", "raylog.actors.cli"]
START_DEADLINE_S = 120.0
STOP_DEADLINE_S = 60.0


class _Lines:
    """Collects a process's stdout lines in a reader thread (select() on a buffered text pipe
    misses lines already in Python's buffer)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                self.queue.put(line)
            self.queue.put(None)

        self.thread = threading.Thread(target=pump, daemon=True)
        self.thread.start()

    def wait_for(self, needle: str, deadline_s: float) -> list[str]:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                line = self.queue.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                continue
            if line is None:
                break
            self.seen.append(line)
            if needle in line:
                return self.seen
        self.proc.kill()
        stderr = self.proc.stderr.read() if self.proc.stderr else ""
        raise AssertionError(f"no line with {needle!r}; got {self.seen!r}, stderr {stderr!r}")


def _free_port_block(count: int) -> int:
    """A first port with ``count`` consecutive free loopback ports after it."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        try:
            socks = []
            for port in range(first, first + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no block of free ports")


def _start(data_dir: Path) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    # One broker on a free port: this test is about Ray and the process, not the data path
    # (tests/test_embedded_cluster.py drives a 3-broker cluster with Kafka clients).
    port = _free_port_block(1)
    return subprocess.Popen(
        [*RAYLOG, "up", "--brokers", "1", "--port", str(port), "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
def test_up_starts_and_stops_on_signals(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    ids = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = _start(data_dir)
        try:
            lines = _Lines(proc)
            ids.append(lines.wait_for("raylog ready", START_DEADLINE_S)[0].split()[-1])
            info = json.loads((data_dir / "cluster.json").read_text())
            assert info["pid"] == proc.pid
            assert info["ray_address"].startswith("127.0.0.1:")
            assert (data_dir / "ray-token").stat().st_mode & 0o077 == 0
            proc.send_signal(sig)
            lines.wait_for("raylog stopped", STOP_DEADLINE_S)
            assert proc.wait(timeout=STOP_DEADLINE_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        assert not (data_dir / "cluster.json").exists()
    assert ids[0] == ids[1], "the cluster identity must survive a restart"


def test_up_refuses_unwritable_data_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = subprocess.run(
        [*RAYLOG, "up", "--data-dir", str(blocker / "data")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("raylog: data dir ")
    assert len(proc.stderr.strip().splitlines()) == 1
