"""kafkajs (Node.js) against a real embedded cluster, the way a Node service uses raylog.

Proves, through kafkajs 2.2.4 with no change: CreateTopics (RF=3, a config) and waiting for
leaders; produce with acks -1, 1 and 0, uncompressed and gzip; a consumer group subscribed from
the beginning receives every record produced with acks other than 0 (acks=0 records are expected
too: nothing here loses them); the group's committed offsets equal the log end offsets after the
consumer stops; offsets by timestamp; AlterConfigs then DescribeConfigs shows the new value.

kafkajs is installed by this test with npm from ``package-lock.json`` into this directory; the
test is skipped, saying so, only where Node.js or npm is missing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cluster import UpProcess

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent / "kafkajs"
RUN_TIMEOUT_S = 240


def test_kafkajs_admin_produce_group_offsets_configs(kafkajs: Path, shared_up: UpProcess) -> None:
    topic = "kafkajs-events"
    up = shared_up
    run = subprocess.run(
        [str(kafkajs), "compat.mjs", up.bootstrap, topic],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    described = up.raylog("topics", "describe", topic)

    assert out["created"] is True
    assert sorted(out["received"]) == sorted(out["sent"])
    assert len(out["received"]) == len(set(out["received"])), "a record came twice"
    latest = {p["partition"]: int(p["high"]) for p in out["latest"]}
    assert sum(latest.values()) == len(out["sent"])
    committed = {p["partition"]: int(p["offset"]) for p in out["committed"]}
    assert committed == latest
    # Send c stamps its records startedAt + c: from startedAt + 3 only the last send's 10 per
    # partition (one batch each) qualify.
    by_ts = {p["partition"]: int(p["offset"]) for p in out["byTimestamp"]}
    assert by_ts == {p: end - 10 for p, end in latest.items()}
    assert ["retention.ms", "3600000"] in out["retentionMs"]
    assert described.returncode == 0 and "Replicas: " in described.stdout
