"""Spark and Ray Data reading a tiered topic whose history is mostly remote, on the session's
shared `raylog up` (its object store a directory in the data dir).

Proves, with two RF=1 topics holding the same records (produced through the gateway with
confluent-kafka), one with remote.storage.enable, small segments and a small
local.retention.bytes, the other all local: once the tiered topic's older segments are copied
and deleted locally (most of each partition only in the object store),
- Spark reads from earliest to latest exactly the rows it reads from the all-local topic, and
  exactly what was produced, headers included;
- the plan reads the remote part straight from the object store (remote ranges, no replica);
- a JSON offset range starting inside the remote tier and ending in the local one, split by
  minPartitions and read with read_committed, returns exactly that range;
- a streaming query from earliest (Trigger.AvailableNow, several micro-batches) starts at the
  remote log's start and writes every record once;
- Ray Data's ``read_topic`` returns the same rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from support.embedded import cluster_action, committed_files, create_topic, produce, record
from support.pipelines import stream_to_parquet, table_rows
from support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TIERED, LOCAL = "tiered-history", "local-history"
PARTITIONS = 2
RECORDS = 600  # per partition: about 100 KiB, 6 segments
SEGMENT_BYTES = 16384
# The records' timestamps are from 2023: past the default retention.ms, which remote
# retention (by segment max timestamp) would apply as soon as they are copied.
KEEP = "retention.ms=-1"
TIERED_CONFIGS = (
    "remote.storage.enable=true",
    f"segment.bytes={SEGMENT_BYTES}",
    f"local.retention.bytes={SEGMENT_BYTES}",
    KEEP,
)
# remote.log.manager.task.interval.ms is 1 s on the shared cluster (tests/conftest.py).
TIERED_WAIT_S = 240.0
MAX_PER_TRIGGER = 250  # a streaming micro-batch's records: several per query
STREAM_WAIT_S = 300.0


def _oldest_local_offsets(data_dir: Path) -> list[int]:
    """The base offset of each tiered partition's oldest local segment (its local log start)."""
    out = []
    for p in range(PARTITIONS):
        logs = sorted(data_dir.glob(f"broker-*/{TIERED}-{p}/*.log"))
        out.append(int(logs[0].stem) if logs else 0)
    return out


@pytest.fixture(scope="module")
def produced(embedded: Any) -> list[dict[str, Any]]:
    """The records produced to both topics (rows without ``topic``, by partition and offset),
    once the tiered topic's history is mostly remote."""
    create_topic(embedded, TIERED, PARTITIONS, *TIERED_CONFIGS, replication_factor=1)
    create_topic(embedded, LOCAL, PARTITIONS, KEEP, replication_factor=1)
    by_partition = {p: [record(n, seed=p) for n in range(RECORDS)] for p in range(PARTITIONS)}
    # Small batches: a segment rolls between batches, never inside one.
    rows = [produce(embedded.bootstrap, t, by_partition, batch_records=20) for t in (TIERED, LOCAL)]
    tiered, local = ([_untopic(r) for r in topic_rows] for topic_rows in rows)
    assert local == tiered  # the same records at the same offsets
    wait_until(
        lambda: min(_oldest_local_offsets(embedded.data_dir)) > RECORDS // 2,
        timeout_s=TIERED_WAIT_S,
        message="most of every tiered partition copied and deleted locally",
    )
    return tiered


def _untopic(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "topic"}


def _read(spark: Any, up: Any, topic: str, **options: str) -> list[dict[str, Any]]:
    reader = spark.read.format("raylog").option("cluster", str(up.data_dir))
    for k, v in {"subscribe": topic, **options}.items():
        reader = reader.option(k, v)
    return [_untopic(r) for r in table_rows(reader.load().toArrow())]


def test_spark_reads_the_same_rows_as_from_an_all_local_topic(
    spark: Any, embedded: Any, produced: list[dict[str, Any]]
) -> None:
    tiered = _read(spark, embedded, TIERED, includeHeaders="true")
    assert len(tiered) == PARTITIONS * RECORDS
    assert tiered == _read(spark, embedded, LOCAL, includeHeaders="true")
    assert tiered == produced


def test_a_range_across_both_tiers_with_read_committed(
    spark: Any, embedded: Any, produced: list[dict[str, Any]]
) -> None:
    local_starts = _oldest_local_offsets(embedded.data_dir)
    # From inside the remote tier to inside the local one (partition 0), everything of 1.
    start, end = 37, local_starts[0] + 5
    starting = json.dumps({TIERED: {"0": start, "1": -2}})
    ending = json.dumps({TIERED: {"0": end, "1": -1}})
    got = _read(
        spark,
        embedded,
        TIERED,
        startingOffsets=starting,
        endingOffsets=ending,
        minPartitions="7",
        **{"kafka.isolation.level": "read_committed"},
    )
    want = [
        {k: v for k, v in r.items() if k != "headers"}
        for r in produced
        if r["partition"] == 1 or start <= r["offset"] < end
    ]
    assert got == want


def test_a_streaming_query_from_earliest_reads_both_tiers(
    spark: Any, embedded: Any, produced: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Structured Streaming from earliest, Trigger.AvailableNow in micro-batches of at most
    MAX_PER_TRIGGER records: it starts at the remote log's start and its sink holds every
    record once, in order, the older ones read from the object store."""
    out = tmp_path / "out"
    query = stream_to_parquet(
        spark, embedded, TIERED, out, tmp_path / "checkpoint", MAX_PER_TRIGGER, availableNow=True
    )
    assert query.awaitTermination(STREAM_WAIT_S), "the available-now query did not finish"
    assert query.exception() is None, query.exception()
    assert len(query.recentProgress) > 1  # several micro-batches, across the tiers
    rows = sorted(
        (r["partition"], r["offset"], r["key"], r["value"])
        for f in committed_files(out)
        for r in pq.read_table(f).to_pylist()
    )
    assert rows == [(r["partition"], r["offset"], r["key"], r["value"]) for r in produced]


def test_ray_data_reads_the_same_rows_from_the_object_store(
    embedded: Any, produced: list[dict[str, Any]], tmp_path: Path
) -> None:
    out = tmp_path / "tiered.parquet"
    result = cluster_action(embedded.data_dir, "read-topic", TIERED, str(out))
    assert result["remote_ranges"] >= PARTITIONS  # the history is read from the store
    assert [_untopic(r) for r in table_rows(pq.read_table(out))] == produced
