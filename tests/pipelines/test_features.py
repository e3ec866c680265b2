"""The example feature pipeline (raylog.pipelines.features) on Spark local[2] and `raylog up`.

Proves:
- over a fixed set of generated events, the 1-minute and 1-hour per-user window features
  (count, sum, mean of amount, exact and approximate distinct items) are exactly what plain
  Python computes from the same events, each window written once, although the job was
  stopped half-way and restarted from its checkpoints (events produced while it was down);
- `raylog pipeline generate` produces the requested number of well-formed JSON events, keyed by
  user, through the gateway.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from support.cluster import RAYLOG, cli_env
from support.embedded import CLIENT_TIMEOUT_S, committed_files, create_topic
from support.waiting import wait_until

from raylog.pipelines import features

# Slow: a whole embedded cluster and Spark; the budget covers starting them on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HOUR_MS = 3_600_000
START_MS = 1_700_000_000_000 - 1_700_000_000_000 % HOUR_MS  # on an hour boundary
STEP_MS = 7_000
EVENTS = 1_200  # 2 h 20 min of event time
WINDOW_MS = {"1m": 60_000, "1h": HOUR_MS}
FLUSH_AFTER_MS = 5 * HOUR_MS  # an event this late moves the watermark past every window
OUTPUT_WAIT_S = 240.0


def _events() -> list[features.Event]:
    return list(itertools.islice(features.events(7, START_MS, STEP_MS, users=6, items=9), EVENTS))


def _expected(events: list[features.Event], window_ms: int) -> dict[tuple[str, int], dict]:
    groups: dict[tuple[str, int], list[features.Event]] = defaultdict(list)
    for e in events:
        groups[(e.user, e.ts - e.ts % window_ms)].append(e)
    return {
        key: {
            "events": len(es),
            "amount_sum": sum(e.amount for e in es),
            "amount_mean": sum(e.amount for e in es) / len(es),
            "distinct_items": len({e.item for e in es}),
        }
        for key, es in groups.items()
    }


def _produce(bootstrap: str, topic: str, events: list[features.Event]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    failed: list[str] = []
    for e in events:
        producer.produce(
            topic,
            key=e.user.encode(),
            value=e.to_json(),
            on_delivery=lambda err, _m: failed.append(str(err)) if err else None,
        )
        producer.poll(0)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0 and not failed, failed[:3]


def _output(spark: Any, out: Path, label: str) -> list[Any]:
    path = out / f"window={label}"
    if not (path / "_spark_metadata").exists():
        return []
    try:
        return spark.read.parquet(str(path)).collect()
    except Exception as exc:  # nothing committed yet
        if "UNABLE_TO_INFER_SCHEMA" in str(exc):
            return []
        raise


def _committed_rows(out: Path, label: str) -> int:
    """Rows the ``label`` query's sink has committed, from its log (no Spark job per poll)."""
    files = committed_files(out / f"window={label}")
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def _start(spark: Any, up: Any, topic: str, out: Path) -> list[Any]:
    return features.start_queries(
        spark,
        cluster=str(up.data_dir),
        topic=topic,
        out=out,
        checkpoint=out / "_checkpoints",
        trigger_seconds=0.5,
    )


def _stop(queries: list[Any]) -> None:
    for q in queries:
        q.stop()
    for q in queries:
        assert q.exception() is None, q.exception()


def test_window_features_exactly_once_across_a_restart(
    spark: Any, embedded: Any, tmp_path: Path
) -> None:
    topic = "feature-events"
    create_topic(embedded, topic, 2, replication_factor=1)
    events = _events()
    half = EVENTS // 2
    out = tmp_path / "features"

    _produce(embedded.bootstrap, topic, events[:half])
    queries = _start(spark, embedded, topic, out)
    try:
        wait_until(
            lambda: _committed_rows(out, "1m") > 0,
            timeout_s=OUTPUT_WAIT_S,
            interval_s=0.5,
            message="first minute windows",
        )
    finally:
        _stop(queries)

    flush = features.Event("flush", "none", 0.0, events[-1].ts + FLUSH_AFTER_MS)
    _produce(embedded.bootstrap, topic, [*events[half:], flush])  # while the job is down
    expected = {label: _expected(events, ms) for label, ms in WINDOW_MS.items()}
    queries = _start(spark, embedded, topic, out)
    try:
        for label, want in expected.items():
            wait_until(
                lambda label=label, want=want: _committed_rows(out, label) >= len(want),
                timeout_s=OUTPUT_WAIT_S,
                interval_s=0.5,
                message=f"all {label} windows",
            )
    finally:
        _stop(queries)

    for label, want in expected.items():
        rows = _output(spark, out, label)
        keys = [(r["user"], int(r["window_start"].timestamp() * 1000)) for r in rows]
        assert len(keys) == len(set(keys)), f"{label}: a window was written twice"
        assert set(keys) == set(want), f"{label}: windows differ"
        for r, key in zip(rows, keys, strict=True):
            w = want[key]
            assert int(r["window_end"].timestamp() * 1000) - key[1] == WINDOW_MS[label]
            assert r["events"] == w["events"], key
            assert r["amount_sum"] == pytest.approx(w["amount_sum"], abs=1e-6), key
            assert r["amount_mean"] == pytest.approx(w["amount_mean"], abs=1e-6), key
            assert r["distinct_items"] == w["distinct_items"], key
            assert abs(r["distinct_items_approx"] - w["distinct_items"]) <= 1, key


def test_generate_produces_json_events(spark: Any, embedded: Any) -> None:
    topic = "generated"
    create_topic(embedded, topic, 2, replication_factor=1)
    done = subprocess.run(
        [
            *RAYLOG, "pipeline", "generate", "--topic", topic, "--rate", "400",
            "--seconds", "0.5", "--bootstrap-servers", embedded.bootstrap,
        ],
        capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, env=cli_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "generated 200 events" in done.stdout
    rows = (
        spark.read.format("raylog")
        .option("cluster", str(embedded.data_dir))
        .option("subscribe", topic)
        .load()
        .collect()
    )
    assert len(rows) == 200
    for r in rows:
        event = json.loads(r["value"])
        assert set(event) == {"user", "item", "amount", "ts"}
        assert r["key"].decode() == event["user"]
