"""The ``raylog`` Spark data source (batch) on real Spark (local[2]) and a whole embedded cluster.

Proves, against a 2-partition RF=3 topic created with `raylog topics create` and produced by
confluent-kafka through the gateway with every codec (none, gzip, snappy, lz4, zstd):
- a batch read through the controller's metadata (``cluster`` = the data dir) from earliest to
  latest returns exactly what was produced (keys, values, headers, timestamps, offsets);
- a JSON offset range returns exactly that range; minPartitions splits it into more input
  partitions with the same rows; assign and subscribePattern select partitions;
- a topic with more partitions than Spark's task slots is read in that many input partitions,
  each reading whole ranges in order, with the same rows; minPartitions keeps one per range;
- startingTimestamp / startingOffsetsByTimestamp / endingOffsetsByTimestamp start and end each
  partition at its first record at least that late (a record inside a batch, not the batch's
  start); with no record that late the default strategy fails naming the partition, "latest"
  reads nothing, and an ending timestamp ends at the high watermark; Ray Data's
  ``read_topic(start_timestamp=...)`` starts at the same records;
- bad or conflicting options, and unknown topics, fail before any task runs;
- the Ray Data reader (``read_topic``, in a process that joined the cluster) returns the same
  rows as the Spark reader.

Spark's Python workers join the cluster's Ray from its ``cluster.json`` and token.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from support.embedded import BASE_TS, CODECS, cluster_action, create_topic, produce, record
from support.pipelines import table_rows

# Slow: a whole embedded cluster and Spark; the budget covers starting them on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOPIC = "codecs"
PARTITIONS = 2
PER_BATCH = 40


@pytest.fixture(scope="module")
def produced(embedded: Any) -> Iterator[list[dict[str, Any]]]:
    create_topic(embedded, TOPIC, PARTITIONS)
    rows: list[dict[str, Any]] = []
    for i, codec in enumerate(CODECS):
        by_partition = {
            p: [record(n, seed=10 * p + i) for n in range(PER_BATCH)] for p in range(PARTITIONS)
        }
        rows += produce(embedded.bootstrap, TOPIC, by_partition, compression=codec)
    yield sorted(rows, key=lambda r: (r["partition"], r["offset"]))


@pytest.fixture(scope="module")
def ray_data_reads(
    embedded: Any, produced: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[int], Path, Path]:
    """Ray Data's reads of the topic, whole and from MID_BATCH_TS, in one process that joined
    the cluster: (rows of each, the whole read's Parquet file, the other's)."""
    out = tmp_path_factory.mktemp("ray-data")
    whole, from_ts = out / "whole.parquet", out / "from-ts.parquet"
    result = cluster_action(
        embedded.data_dir, "read-topic", TOPIC, str(whole), f"{from_ts}@{MID_BATCH_TS}"
    )
    return result["rows"], whole, from_ts


def _read(spark: Any, up: Any, **options: str) -> Any:
    reader = spark.read.format("raylog").option("cluster", str(up.data_dir))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _rows(df: Any) -> list[dict[str, Any]]:
    return table_rows(df.toArrow())


def test_earliest_to_latest_returns_exactly_what_was_produced(
    spark: Any, embedded: Any, produced: list[dict[str, Any]]
) -> None:
    df = _read(spark, embedded, subscribe=TOPIC, includeHeaders="true")
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
    assert len(rows) == len(produced) == PARTITIONS * len(CODECS) * PER_BATCH
    assert rows == produced


def test_json_offset_range_and_min_partitions(
    spark: Any, embedded: Any, produced: list[dict[str, Any]]
) -> None:
    starting = json.dumps({TOPIC: {"0": 7, "1": -2}})
    ending = json.dumps({TOPIC: {"0": 123, "1": -1}})
    want = [
        {k: v for k, v in r.items() if k != "headers"}
        for r in produced
        if (r["partition"] == 0 and 7 <= r["offset"] < 123) or r["partition"] == 1
    ]
    df = _read(spark, embedded, subscribe=TOPIC, startingOffsets=starting, endingOffsets=ending)
    assert "headers" not in df.columns
    assert df.rdd.getNumPartitions() == PARTITIONS
    assert _rows(df) == want
    split = _read(
        spark,
        embedded,
        subscribe=TOPIC,
        startingOffsets=starting,
        endingOffsets=ending,
        minPartitions="7",
    )
    assert split.rdd.getNumPartitions() == 7
    assert _rows(split) == want


def test_empty_range_reads_no_rows(
    spark: Any, embedded: Any, produced: list[dict[str, Any]]
) -> None:
    offsets = json.dumps({TOPIC: {"0": 20, "1": 0}})
    df = _read(spark, embedded, subscribe=TOPIC, startingOffsets=offsets, endingOffsets=offsets)
    assert df.count() == 0


def test_assign_and_pattern_select_partitions(
    spark: Any, embedded: Any, produced: list[dict[str, Any]]
) -> None:
    assigned = _read(spark, embedded, assign=json.dumps({TOPIC: [1]}))
    assert {r["partition"] for r in _rows(assigned)} == {1}
    pattern = _read(spark, embedded, subscribePattern="co.ecs")
    assert len(_rows(pattern)) == len(produced)


def test_more_ranges_than_task_slots_are_packed(spark: Any, embedded: Any) -> None:
    topic, partitions = "packed", 5
    create_topic(embedded, topic, partitions, replication_factor=1)
    by_partition = {p: [record(n, seed=100 + p) for n in range(30 + 10 * p)] for p in range(5)}
    produced = sorted(
        produce(embedded.bootstrap, topic, by_partition),
        key=lambda r: (r["partition"], r["offset"]),
    )
    produced = [{k: v for k, v in r.items() if k != "headers"} for r in produced]
    slots = spark.sparkContext.defaultParallelism
    assert slots < partitions
    df = _read(spark, embedded, subscribe=topic)
    assert df.rdd.getNumPartitions() == slots
    assert _rows(df) == produced
    # Each task reads its ranges whole, one after the other, each in offset order.
    tagged = df.select("partition", "offset", F.spark_partition_id().alias("task")).collect()
    read_by_task: dict[int, list[tuple[int, int]]] = {}
    for row in tagged:
        read_by_task.setdefault(row["task"], []).append((row["partition"], row["offset"]))
    assert len(read_by_task) == slots
    for read in read_by_task.values():
        assert read == sorted(read)
    split = _read(spark, embedded, subscribe=topic, minPartitions=str(partitions))
    assert split.rdd.getNumPartitions() == partitions
    assert _rows(split) == produced


def _first_at_or_after(rows: list[dict[str, Any]], partition: int, timestamp: int) -> int:
    """Kafka's offsetsForTimes over the produced rows: the first offset that late."""
    return min(
        r["offset"] for r in rows if r["partition"] == partition and r["timestamp"] >= timestamp
    )


# Inside partition 0's third batch (codec seed 2: timestamps BASE_TS + 2000 + 17 i, a few
# 5 ms early), so that a batch-precision answer would also return earlier records.
MID_BATCH_TS = BASE_TS + 2000 + 17 * 20 - 2
LATE_TS = BASE_TS + 1_000_000  # after every record


def test_starting_and_ending_timestamps(
    spark: Any, embedded: Any, produced: list[dict[str, Any]]
) -> None:
    start0 = _first_at_or_after(produced, 0, MID_BATCH_TS)
    batch_start = min(
        r["offset"]
        for r in produced
        if r["partition"] == 0 and r["timestamp"] >= BASE_TS + 2000 - 5
    )
    assert start0 > batch_start, "the timestamp falls after the first record of a produce call"
    no_headers = [{k: v for k, v in r.items() if k != "headers"} for r in produced]
    every = _read(spark, embedded, subscribe=TOPIC, startingTimestamp=str(MID_BATCH_TS))
    # Partition 1's records are all later (seeds 10..14): it is read from its start.
    assert _rows(every) == [r for r in no_headers if r["partition"] == 1 or r["offset"] >= start0]

    end_ts = MID_BATCH_TS + 1500
    end0 = _first_at_or_after(produced, 0, end_ts)
    by_json = _read(
        spark,
        embedded,
        subscribe=TOPIC,
        startingOffsetsByTimestamp=json.dumps({TOPIC: {"0": MID_BATCH_TS}}),
        endingOffsetsByTimestamp=json.dumps({TOPIC: {"0": end_ts, "1": LATE_TS}}),
    )
    want = [
        r for r in no_headers if r["partition"] == 1 or start0 <= r["offset"] < end0
    ]  # partition 1: startingOffsets' earliest, and no record as late as LATE_TS: to the end
    assert _rows(by_json) == want

    with pytest.raises(Exception, match=f"{TOPIC}-0 has no committed record at or after"):
        _read(spark, embedded, subscribe=TOPIC, startingTimestamp=str(LATE_TS)).collect()
    skipped = _read(
        spark,
        embedded,
        subscribe=TOPIC,
        startingTimestamp=str(LATE_TS),
        startingOffsetsByTimestampStrategy="latest",
    )
    assert skipped.count() == 0


def test_ray_data_start_timestamp(
    produced: list[dict[str, Any]], ray_data_reads: tuple[list[int], Path, Path]
) -> None:
    start0 = _first_at_or_after(produced, 0, MID_BATCH_TS)
    want = [r for r in produced if r["partition"] == 1 or r["offset"] >= start0]
    rows, _, from_ts = ray_data_reads
    assert rows[1] == len(want)
    assert table_rows(pq.read_table(from_ts)) == want


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": TOPIC, "bogus": "1"}, "unknown option"),
        ({"subscribe": TOPIC, "catalog": "{}"}, "unknown option"),
        ({"subscribe": TOPIC, "assign": json.dumps({TOPIC: [0]})}, "exactly one of"),
        ({}, "exactly one of"),
        ({"subscribe": "no-such-topic"}, "not in the catalog"),
        ({"subscribe": TOPIC, "startingOffsets": "latest"}, "streaming"),
        ({"subscribe": TOPIC, "endingOffsets": "{not json"}, "endingOffsets"),
        ({"subscribe": TOPIC, "failOnDataLoss": "maybe"}, "failondataloss"),
        ({"subscribe": TOPIC, "minPartitions": "x"}, "minPartitions"),
        ({"subscribe": TOPIC, "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"assign": "[0]"}, "assign"),
    ],
)
def test_bad_options_fail_before_any_task_runs(
    spark: Any, embedded: Any, produced: list[dict[str, Any]], options: dict[str, str], message: str
) -> None:
    tracker = spark.sparkContext.statusTracker()
    jobs_before = len(tracker.getJobIdsForGroup())
    with pytest.raises(Exception, match=message):
        _read(spark, embedded, **options).collect()
    assert len(tracker.getJobIdsForGroup()) == jobs_before, "no Spark job was started"


def test_out_of_range_end_fails_at_planning(
    spark: Any, embedded: Any, produced: list[dict[str, Any]]
) -> None:
    ending = json.dumps({TOPIC: {"0": 10_000}})
    with pytest.raises(Exception, match="beyond the high watermark"):
        _read(spark, embedded, subscribe=TOPIC, endingOffsets=ending).collect()


def test_ray_data_returns_the_same_rows_as_spark(
    spark: Any,
    embedded: Any,
    produced: list[dict[str, Any]],
    ray_data_reads: tuple[list[int], Path, Path],
) -> None:
    spark_rows = _rows(_read(spark, embedded, subscribe=TOPIC, includeHeaders="true"))
    rows, whole, _ = ray_data_reads
    assert rows[0] == len(produced)
    assert table_rows(pq.read_table(whole)) == spark_rows == produced
