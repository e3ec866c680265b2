"""`raylog up` run as a user runs it: a subprocess that starts the cluster and stops cleanly.

Proves: the cluster starts with raylog's Ray settings (token auth, temp dir owned by the data
dir), records how to join it in cluster.json, keeps the same cluster identity across restarts,
exits 0 on SIGINT and SIGTERM removing its record, and refuses an unusable data dir in one line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from cluster_support import RAYLOG, START_DEADLINE_S, STOP_DEADLINE_S
from cluster_support import Lines as _Lines
from cluster_support import free_port_block as _free_port_block


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


@pytest.mark.parametrize(
    ("pair", "reason"),
    [
        ("no.such.key=1", "Unknown configuration no.such.key"),
        ("broker.session.timeout.ms=abc", "Invalid value 'abc'"),
        ("novalue", "--broker-config wants key=value"),
    ],
)
def test_up_refuses_bad_broker_config(tmp_path: Path, pair: str, reason: str) -> None:
    proc = subprocess.run(
        [*RAYLOG, "up", "--data-dir", str(tmp_path / "data"), "--broker-config", pair],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert reason in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "data" / "cluster.json").exists()
