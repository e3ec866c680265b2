"""The Spark source's option checks, without a cluster or a Spark session.

Proves: batch and stream defaults (earliest / latest), the checks that differ between batch and
streaming (startingOffsets=latest, endingOffsets), maxOffsetsPerTrigger validation, and that
the removed temporary ``catalog`` option is now an unknown option. ``kafka.isolation.level``
(Spark's name for Kafka's setting) defaults to read_uncommitted and takes Kafka's two values.
The timestamp options: startingTimestamp takes precedence over startingOffsetsByTimestamp;
bad timestamps, JSON and strategies are refused; resolving applies the found offsets,
startingOffsets to partitions the JSON does not name, and Spark's two strategies to a
partition with no record that late.
Packing: ranges beyond the session's task slots go into that many partitions of about equal
record counts, each range whole and read in order; minPartitions, or no more ranges than
slots, keeps one range per partition. A Spark worker's first join to the cluster freezes its
heap (gc.freeze), and its second join once more.
"""

from __future__ import annotations

import gc

import pytest

from raylog.pipelines import reading, spark_source
from raylog.pipelines.catalog import PartitionInfo
from raylog.pipelines.reading import (
    EARLIEST,
    LATEST,
    Bounds,
    ByTimestamp,
    ClusterTarget,
    OffsetRange,
    resolve_by_timestamp,
)
from raylog.pipelines.spark_source import ReadOptions, _range_partitions, pack
from raylog.storage.short_circuit import SHORT_CIRCUIT_ENV

BASE = {"cluster": "/data", "subscribe": "t"}


def test_defaults_differ_between_batch_and_stream() -> None:
    assert ReadOptions(BASE).starting == EARLIEST
    stream = ReadOptions(BASE, streaming=True)
    assert stream.starting == LATEST and stream.max_offsets_per_trigger is None


def test_mode_specific_checks() -> None:
    latest = {**BASE, "startingOffsets": "latest"}
    assert ReadOptions(latest, streaming=True).starting == LATEST
    assert ReadOptions(latest, streaming=None).starting == LATEST  # schema(): either mode
    with pytest.raises(ValueError, match="streaming"):
        ReadOptions(latest)
    ending = {**BASE, "endingOffsets": "latest"}
    with pytest.raises(ValueError, match="endingOffsets is for batch"):
        ReadOptions(ending, streaming=True)
    assert ReadOptions(ending).ending == LATEST


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be positive"),
        ({"maxOffsetsPerTrigger": "ten"}, "maxOffsetsPerTrigger: not an integer"),
        ({"catalog": "{}"}, "unknown option"),
        ({"subscribePattern": "(", "subscribe": ""}, "bad regex"),
        ({"cluster": ""}, "cluster is required"),
        ({"startingTimestamp": "soon"}, "startingTimestamp: not a timestamp"),
        ({"startingTimestamp": "-1"}, "milliseconds since the epoch"),
        ({"startingOffsetsByTimestamp": "[1]"}, "JSON must look like"),
        ({"startingOffsetsByTimestamp": '{"t": {"0": "x"}}'}, "not a timestamp"),
        ({"startingOffsetsByTimestampStrategy": "maybe"}, "expected error or latest"),
        ({"endingTimestamp": "5"}, "endingTimestamp is for batch reads"),
        ({"kafka.isolation.level": "committed"}, "expected read_uncommitted or read_committed"),
        ({"isolation.level": "read_committed"}, "unknown option"),  # Spark's name has kafka.
    ],
)
def test_bad_options(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReadOptions({**BASE, **extra}, streaming=True)


def test_max_offsets_per_trigger_is_parsed() -> None:
    options = ReadOptions({**BASE, "MaxOffsetsPerTrigger": "500"}, streaming=True)
    assert options.max_offsets_per_trigger == 500


def test_isolation_level_is_sparks_kafka_option() -> None:
    assert ReadOptions(BASE).isolation_level == reading.READ_UNCOMMITTED  # Kafka's default
    for streaming in (False, True, None):
        options = ReadOptions(
            {**BASE, "Kafka.Isolation.Level": "read_committed"}, streaming=streaming
        )
        assert options.isolation_level == reading.READ_COMMITTED


def _info(topic: str, partition: int) -> PartitionInfo:
    return PartitionInfo(topic, partition, leader_id=1, isr=(1,), replica_ids=(1,))


def test_timestamp_options_and_precedence() -> None:
    both = ReadOptions(
        {**BASE, "startingTimestamp": "1000", "startingOffsetsByTimestamp": '{"t": {"0": 5}}'}
    )
    assert both.starting_by_time == ByTimestamp("startingTimestamp", every=1000)
    by_json = ReadOptions({**BASE, "endingOffsetsByTimestamp": '{"t": {"1": 7}}'})
    assert by_json.ending_by_time == ByTimestamp(
        "endingOffsetsByTimestamp", per_partition={"t": {1: 7}}
    )
    assert by_json.starting_by_time is None and by_json.timestamp_strategy == "error"
    latest = ReadOptions({**BASE, "startingOffsetsByTimestampStrategy": "LATEST"}, streaming=True)
    assert latest.timestamp_strategy == "latest"


def test_resolving_timestamps_per_partition() -> None:
    parts = [_info("t", 0), _info("t", 1), _info("t", 2)]
    bounds = {("t", p): Bounds(0, 100 + p) for p in range(3)}
    by = ByTimestamp("startingOffsetsByTimestamp", per_partition={"t": {0: 50, 1: 60}})
    assert by.wanted(parts) == {("t", 0): 50, ("t", 1): 60}
    found = {("t", 0): 42, ("t", 1): None}
    resolved = resolve_by_timestamp(parts, by, found, EARLIEST, bounds, if_missing="latest")
    assert resolved == {"t": {0: 42, 1: 101, 2: EARLIEST}}
    fallback = {"t": {2: 9}}  # startingOffsets JSON for the partition the timestamps skip
    assert (
        resolve_by_timestamp(parts, by, found, fallback, bounds, if_missing="latest")["t"][2] == 9
    )
    with pytest.raises(ValueError, match=r"t-1 has no committed record at or after timestamp 60"):
        resolve_by_timestamp(parts, by, found, EARLIEST, bounds, if_missing="error")
    every = ByTimestamp("startingTimestamp", every=70)
    assert every.wanted(parts[:2]) == {("t", 0): 70, ("t", 1): 70}
    with pytest.raises(ValueError, match=r"names partitions that are not read: \[\('t', 1\)\]"):
        by.wanted(parts[:1])


def test_pack_balances_record_counts_and_keeps_each_group_in_order() -> None:
    assert pack([100, 1, 1, 1], 2) == [[0], [1, 2, 3]]
    assert pack([5, 7, 3, 9, 4], 2) == [[0, 1, 2], [3, 4]]  # 15 and 13
    assert pack([5, 7], 4) == [[0], [1]]  # never more groups than items
    assert pack([], 2) == []
    groups = pack(list(range(1, 40)), 3)
    assert sorted(i for g in groups for i in g) == list(range(39))  # each item exactly once
    loads = [sum(i + 1 for i in g) for g in groups]
    assert max(loads) - min(loads) <= 39  # within the heaviest item


def test_ranges_beyond_the_task_slots_are_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SHORT_CIRCUIT_ENV, "0")  # locate() asks no replica
    target = ClusterTarget.resolve("127.0.0.1:6379")
    ranges = [OffsetRange("t", p, 0, 10 * (p + 1), (1,)) for p in range(5)]

    def shape(slots: int | None, min_partitions: int = 0) -> list[list[tuple[int, int]]]:
        parts = _range_partitions(ranges, target, task_slots=slots, min_partitions=min_partitions)
        return [[(r.partition, r.size) for r, _ in part.reads] for part in parts]

    assert shape(2) == [[(0, 10), (1, 20), (4, 50)], [(2, 30), (3, 40)]]
    one_each = [[(p, 10 * (p + 1))] for p in range(5)]
    assert shape(None) == one_each  # a session that did not say its parallelism
    assert shape(5) == one_each
    assert shape(2, min_partitions=5) == one_each  # minPartitions asks for splitting


def test_a_spark_worker_freezes_its_heap_at_its_first_two_joins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    joined: list[ClusterTarget] = []
    monkeypatch.setattr(reading, "connect", joined.append)
    monkeypatch.setattr(spark_source, "_joins", 0)
    target = ClusterTarget.resolve("127.0.0.1:6379")
    assert gc.get_freeze_count() == 0
    try:
        spark_source._join(target)
        first = gc.get_freeze_count()
        assert first > 0
        imported_by_the_first_task = [[i] for i in range(100)]  # lists: always tracked
        spark_source._join(target)
        second = gc.get_freeze_count()
        assert second >= first + len(imported_by_the_first_task)
        spark_source._join(target)
        assert joined == [target, target, target]
        assert gc.get_freeze_count() == second  # no more: a task's garbage stays collectable
    finally:
        gc.unfreeze()
