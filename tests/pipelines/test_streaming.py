"""``spark.readStream.format("raylog")`` on real Spark (local[2]) and a whole embedded cluster.

Proves:
- a streaming query (processingTime trigger, maxOffsetsPerTrigger) reads what confluent-kafka
  produces while it runs, over several micro-batches, into a Parquet sink with a checkpoint:
  every record exactly once;
- stopped and restarted from its checkpoint (records produced while it was down and after),
  the query loses and repeats nothing;
- a leader failover in the middle of a query (the leader broker's actors hard-killed through
  Ray) loses and duplicates nothing: the sink holds exactly the log's records, one row per
  offset, and every acknowledged value.

Runs last among the modules sharing the embedded cluster: it kills a broker (Ray restarts it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from support.embedded import cluster_action, committed_files, create_topic, produce_values
from support.pipelines import stream_to_parquet
from support.waiting import wait_until

# Slow: a whole embedded cluster and Spark; the budget covers starting them on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PARTITIONS = 2
CHUNK = 100  # records per produce round, spread over the partitions
MAX_PER_TRIGGER = 60  # so that a round takes at least two micro-batches
OUTPUT_WAIT_S = 180.0


def _start(spark: Any, up: Any, topic: str, out: Path, checkpoint: Path) -> Any:
    columns = ("partition", "offset", "CAST(value AS STRING) AS value")
    return stream_to_parquet(
        spark,
        up,
        topic,
        out,
        checkpoint,
        MAX_PER_TRIGGER,
        columns,
        processingTime="500 milliseconds",
    )


def _output(spark: Any, out: Path) -> list[tuple[int, int, str]]:
    """The sink's committed rows (Spark's file sink log decides what is committed)."""
    if not (out / "_spark_metadata").exists():
        return []
    try:
        rows = spark.read.parquet(str(out)).collect()
    except Exception as exc:  # no batch committed yet
        if "UNABLE_TO_INFER_SCHEMA" in str(exc) or "PATH_NOT_FOUND" in str(exc):
            return []
        raise
    return sorted((r["partition"], r["offset"], r["value"]) for r in rows)


def _round(up: Any, topic: str, tag: str) -> list[str]:
    values = [f"{tag}-{i}" for i in range(CHUNK)]
    produce_values(
        up.bootstrap, topic, [(i % PARTITIONS, v.encode()) for i, v in enumerate(values)]
    )
    return values


def _wait_for(spark: Any, out: Path, query: Any, values: list[str]) -> list[tuple[int, int, str]]:
    """The sink's rows (read by Spark) once every value is in a committed file."""

    def done() -> bool:
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        written = set()
        for f in committed_files(out):
            written.update(pq.read_table(f, columns=["value"]).column("value").to_pylist())
        return set(values) <= written

    wait_until(done, timeout_s=OUTPUT_WAIT_S, interval_s=0.5, message="sink rows")
    return _output(spark, out)


def _assert_exactly_once(rows: list[tuple[int, int, str]], values: list[str]) -> None:
    keys = [(p, o) for p, o, _ in rows]
    assert len(keys) == len(set(keys)), "an offset was written twice"
    assert sorted(v for _, _, v in rows) == sorted(values)
    for p in range(PARTITIONS):
        offsets = sorted(o for q, o, _ in rows if q == p)
        assert offsets == list(range(len(offsets))), f"partition {p} has a gap"


def test_micro_batches_while_producing_then_restart_from_checkpoint(
    spark: Any, embedded: Any, tmp_path: Path
) -> None:
    topic = "stream"
    create_topic(embedded, topic, PARTITIONS)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = _start(spark, embedded, topic, out, checkpoint)
    values: list[str] = []
    try:
        for r in range(3):
            values += _round(embedded, topic, f"a{r}")
            _wait_for(spark, out, query, values)
        with_data = [p for p in query.recentProgress if p["numInputRows"] > 0]
        assert len(with_data) >= 3, with_data
        assert max(p["numInputRows"] for p in with_data) <= MAX_PER_TRIGGER
    finally:
        query.stop()
    assert query.exception() is None
    _assert_exactly_once(_output(spark, out), values)

    values += _round(embedded, topic, "down")  # produced while the query is stopped
    query = _start(spark, embedded, topic, out, checkpoint)
    try:
        values += _round(embedded, topic, "b")
        rows = _wait_for(spark, out, query, values)
    finally:
        query.stop()
    assert query.exception() is None
    _assert_exactly_once(rows, values)


def test_leader_failover_during_a_query_loses_and_duplicates_nothing(
    spark: Any, embedded: Any, tmp_path: Path
) -> None:
    topic = "failover"
    create_topic(embedded, topic, PARTITIONS)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = _start(spark, embedded, topic, out, checkpoint)
    try:
        values = _round(embedded, topic, "before")
        _wait_for(spark, out, query, values)
        [described] = embedded.document("topics", "describe", topic)
        leader = described["partitions"][0]["leader"]
        killed = cluster_action(embedded.data_dir, "kill-broker", str(leader))["killed"]
        assert f"replica:{topic}:0:{leader}" in killed
        for r in range(2):
            values += _round(embedded, topic, f"after{r}")
        rows = _wait_for(spark, out, query, values)
    finally:
        query.stop()
    assert query.exception() is None
    # A producer retry across the failover may have written a value twice to the log (no
    # idempotence): the sink must then hold both log records, each once.
    log_rows = sorted(
        (r["partition"], r["offset"], r["value"])
        for r in spark.read.format("raylog")
        .option("cluster", str(embedded.data_dir))
        .option("subscribe", topic)
        .load()
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
        .collect()
    )
    rows = _output(spark, out)
    assert rows == log_rows
    assert set(values) <= {v for _, _, v in rows}
    keys = [(p, o) for p, o, _ in rows]
    assert len(keys) == len(set(keys))
