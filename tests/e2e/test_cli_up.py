"""`raylog up` run as a user runs it, refusing what it cannot use.

Proves: an unusable data dir, a bad broker config or an object store nothing answers at is
refused in one line before anything starts. (Starting, cluster.json, the cluster identity
across a restart, and SIGINT and SIGTERM are proven by tests/e2e/test_embedded_cluster.py, which
starts a cluster twice anyway.)
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from support.cluster import RAYLOG


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


def test_up_refuses_an_unreachable_object_store(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "raylog-test",
        "AWS_SECRET_ACCESS_KEY": "raylog-test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    proc = subprocess.run(
        [*RAYLOG, "up", "--data-dir", str(tmp_path / "data"),
         "--object-store", "s3://nowhere/raylog", "--s3-endpoint", f"http://127.0.0.1:{closed}"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith("raylog: object store s3://nowhere/raylog is not usable: ")
    assert "Could not connect to the endpoint URL" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "data" / "cluster.json").exists()
