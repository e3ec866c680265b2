"""The ``raylog`` Spark data source on real Spark (local[2]) and real Ray replica actors.

Proves, against a 2-partition RF=3 topic produced through its leaders with every codec:
- a batch read from earliest to latest returns exactly what was produced (keys, values,
  headers, timestamps, offsets), reading from followers as well as leaders;
- a JSON offset range returns exactly that range; minPartitions splits it into more input
  partitions with the same rows;
- bad or conflicting options fail when the DataFrame is defined, before any task runs;
- failOnDataLoss: offsets below a partition's log start fail naming topic, partition and
  offsets, or (false) are skipped with the rest read;
- the Ray Data reader returns the same rows as the Spark reader.

Spark's Python workers join Ray with the test session's environment (token, loopback) and the
GCS address of the ``ray_local`` cluster.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import ray
from pipeline_support import (
    EVENTS,
    EVENTS_PARTITIONS,
    ProducedTopic,
    catalog_json,
    kafka_batch,
    kafka_codecs,
    make_records,
    start_trimmed_partition,
    table_rows,
)

from raylog.pipelines import read_topic, register
from raylog.pipelines.catalog import StaticCatalog

pytestmark = pytest.mark.slow

TOPIC = EVENTS
TRIMMED = "spark-trimmed"
PARTITIONS = EVENTS_PARTITIONS


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    # Spark's Python workers are this venv's python, with this process's Ray environment
    # (set by pytest_configure before Ray was imported) inherited through the JVM.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only
    session = (
        SparkSession.builder.master("local[2]")
        .appName("raylog-pipelines-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def produced(events_topic: ProducedTopic) -> list[dict[str, Any]]:
    return events_topic.rows


@pytest.fixture(scope="module")
def cluster(ray_local: Path) -> str:
    return ray.get_runtime_context().gcs_address


def _read(spark: Any, cluster: str, **options: str) -> Any:
    reader = spark.read.format("raylog").option("cluster", cluster)
    reader = reader.option("catalog", json.dumps(catalog_json(TOPIC, PARTITIONS)))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _rows(df: Any) -> list[dict[str, Any]]:
    return table_rows(df.toArrow())


def test_earliest_to_latest_returns_exactly_what_was_produced(
    spark: Any, cluster: str, produced: list[dict[str, Any]]
) -> None:
    df = _read(spark, cluster, subscribe=TOPIC, includeHeaders="true")
    assert [f.name for f in df.schema.fields] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert str(df.schema["timestamp"].dataType) == "TimestampType()"
    rows = _rows(df)
    assert len(rows) == len(produced) == 2 * 5 * 40
    assert rows == produced


def test_json_offset_range_and_min_partitions(
    spark: Any, cluster: str, produced: list[dict[str, Any]]
) -> None:
    starting = json.dumps({TOPIC: {"0": 7, "1": -2}})
    ending = json.dumps({TOPIC: {"0": 123, "1": -1}})
    want = [
        {k: v for k, v in r.items() if k != "headers"}
        for r in produced
        if (r["partition"] == 0 and 7 <= r["offset"] < 123) or r["partition"] == 1
    ]
    df = _read(spark, cluster, subscribe=TOPIC, startingOffsets=starting, endingOffsets=ending)
    assert "headers" not in df.columns
    assert df.rdd.getNumPartitions() == PARTITIONS
    assert _rows(df) == want
    split = _read(
        spark,
        cluster,
        subscribe=TOPIC,
        startingOffsets=starting,
        endingOffsets=ending,
        minPartitions="7",
    )
    assert split.rdd.getNumPartitions() == 7
    assert _rows(split) == want


def test_empty_range_reads_no_rows(
    spark: Any, cluster: str, produced: list[dict[str, Any]]
) -> None:
    offsets = json.dumps({TOPIC: {"0": 20, "1": 0}})
    df = _read(spark, cluster, subscribe=TOPIC, startingOffsets=offsets, endingOffsets=offsets)
    assert df.count() == 0


def test_assign_and_pattern_select_partitions(
    spark: Any, cluster: str, produced: list[dict[str, Any]]
) -> None:
    assigned = _read(spark, cluster, assign=json.dumps({TOPIC: [1]}))
    assert {r["partition"] for r in _rows(assigned)} == {1}
    pattern = _read(spark, cluster, subscribePattern="ev.nts")
    assert len(_rows(pattern)) == len(produced)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": TOPIC, "bogus": "1"}, "unknown option"),
        ({"subscribe": TOPIC, "assign": json.dumps({TOPIC: [0]})}, "exactly one of"),
        ({}, "exactly one of"),
        ({"subscribe": "no-such-topic"}, "not in the catalog"),
        ({"subscribe": TOPIC, "startingOffsets": "latest"}, "streaming"),
        ({"subscribe": TOPIC, "endingOffsets": "{not json"}, "endingOffsets"),
        ({"subscribe": TOPIC, "failOnDataLoss": "maybe"}, "failondataloss"),
        ({"subscribe": TOPIC, "minPartitions": "x"}, "minPartitions"),
        ({"assign": "[0]"}, "assign"),
    ],
)
def test_bad_options_fail_before_any_task_runs(
    spark: Any, cluster: str, options: dict[str, str], message: str
) -> None:
    tracker = spark.sparkContext.statusTracker()
    jobs_before = len(tracker.getJobIdsForGroup())
    with pytest.raises(Exception, match=message):
        _read(spark, cluster, **options)
    assert len(tracker.getJobIdsForGroup()) == jobs_before, "no Spark job was started"


def test_out_of_range_end_fails_at_planning(
    spark: Any, cluster: str, produced: list[dict[str, Any]]
) -> None:
    ending = json.dumps({TOPIC: {"0": 10_000}})
    with pytest.raises(Exception, match="beyond the high watermark"):
        _read(spark, cluster, subscribe=TOPIC, endingOffsets=ending).collect()


def test_fail_on_data_loss_both_ways(
    spark: Any, cluster: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    recs = [make_records(20, seed=s) for s in range(12)]
    with kafka_codecs():
        batches = [kafka_batch(r, 0) for r in recs]
    actor, log_start = start_trimmed_partition(tmp_path_factory.mktemp("trimmed"), TRIMMED, batches)
    catalog = json.dumps({TRIMMED: [{"partition": 0, "leader": 0, "replicas": [0]}]})
    starting = json.dumps({TRIMMED: {"0": 0}})

    def read(fail: str) -> Any:
        return (
            spark.read.format("raylog")
            .option("cluster", cluster)
            .option("catalog", catalog)
            .option("subscribe", TRIMMED)
            .option("startingOffsets", starting)
            .option("failOnDataLoss", fail)
            .load()
        )

    with pytest.raises(Exception, match=rf"{TRIMMED}-0: offsets 0\.\.{log_start - 1}"):
        read("true").collect()
    offsets = [r["offset"] for r in _rows(read("false"))]
    assert offsets == list(range(log_start, 12 * 20))
    # Earliest is the log start, not a loss.
    earliest = _rows(
        read("true")
        .sparkSession.read.format("raylog")
        .option("cluster", cluster)
        .option("catalog", catalog)
        .option("subscribe", TRIMMED)
        .load()
    )
    assert [r["offset"] for r in earliest] == offsets
    ray.kill(actor)


def test_ray_data_returns_the_same_rows_as_spark(
    spark: Any, cluster: str, produced: list[dict[str, Any]]
) -> None:
    spark_rows = _rows(_read(spark, cluster, subscribe=TOPIC, includeHeaders="true"))
    ds = read_topic(
        TOPIC,
        catalog=StaticCatalog.from_json(catalog_json(TOPIC, PARTITIONS)),
        include_headers=True,
    )
    ray_rows = table_rows(pa.concat_tables(ray.get(ds.to_arrow_refs())))
    assert ray_rows == spark_rows
