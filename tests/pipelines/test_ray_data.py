"""``read_topic`` (Ray Data) on real Ray replica actors, and offset planning without Ray.

Proves:
- ``read_topic`` returns exactly the produced records (keys, values, headers, timestamps,
  offsets) from earliest to latest, one read task per planned range; ``min_partitions``
  splits ranges; ``start``/``end`` per partition select exactly that window;
- planning (pure): -2/-1 resolve to log start / high watermark; offsets below the log start
  fail naming topic, partition and offsets, or are skipped with failOnDataLoss off; ends
  beyond the high watermark and inverted ranges fail; splitting keeps ranges contiguous;
- the catalog prefers in-sync followers, then the leader, then out-of-sync replicas; the
  controller's metadata becomes a catalog with broker ids as replica ids;
- failOnDataLoss after retention deleted a partition's first segments (a one-replica
  partition trimmed on disk before its actor opens it): fail naming topic, partition and
  offsets, or skip them.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
import ray
from support.pipelines import (
    CODECS,
    ProducedTopic,
    expected_rows,
    kafka_batch,
    kafka_codecs,
    make_records,
    start_partition_from_log,
    start_trimmed_partition,
    table_rows,
)
from support.waiting import wait_until

from raylog.actors.raycluster import ClusterInfo, write_cluster_info
from raylog.pipelines import read_topic
from raylog.pipelines.catalog import (
    PartitionInfo,
    StaticCatalog,
    catalog_from_metadata,
    read_order,
)
from raylog.pipelines.ray_data import RaylogDatasource
from raylog.pipelines.reading import (
    EARLIEST,
    LATEST,
    Bounds,
    ClusterTarget,
    DataLossError,
    Located,
    OffsetRange,
    ReadStats,
    _Fetcher,
    locate,
    parse_offsets,
    plan,
    read_range,
    replica_handle,
    split,
)
from raylog.storage import batch as rb
from raylog.storage.log import Log, LogConfig
from raylog.storage.short_circuit import SHORT_CIRCUIT_ENV, read_runs


def _collect(ds: ray.data.Dataset) -> list[dict]:
    return table_rows(pa.concat_tables(ray.get(ds.to_arrow_refs())))


@pytest.mark.slow
def test_read_topic_returns_exactly_what_was_produced(events_topic: ProducedTopic) -> None:
    catalog = StaticCatalog.from_json(events_topic.catalog)
    ds = read_topic(events_topic.topic, catalog=catalog, include_headers=True)
    assert ds.schema().names == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert _collect(ds) == events_topic.rows


@pytest.mark.slow
def test_read_topic_window_and_min_partitions(events_topic: ProducedTopic) -> None:
    catalog = StaticCatalog.from_json(events_topic.catalog)
    ds = read_topic(
        events_topic.topic,
        catalog=catalog,
        start={0: 3, 1: 50},
        end={0: 150, 1: -1},
        min_partitions=5,
    )
    assert ds.materialize().num_blocks() >= 5, "one read task (at least one block) per range"
    want = [
        {k: v for k, v in r.items() if k != "headers"}
        for r in events_topic.rows
        if (r["partition"] == 0 and 3 <= r["offset"] < 150)
        or (r["partition"] == 1 and r["offset"] >= 50)
    ]
    assert _collect(ds) == want


def _partition_ranges(events_topic: ProducedTopic) -> list[OffsetRange]:
    ends: dict[int, int] = {}
    for row in events_topic.rows:
        ends[row["partition"]] = max(ends.get(row["partition"], 0), row["offset"] + 1)
    return [
        OffsetRange(events_topic.topic, p, 0, end, tuple(_read_order_ids(events_topic, p)))
        for p, end in sorted(ends.items())
    ]


def _read_order_ids(events_topic: ProducedTopic, partition: int) -> list[int]:
    catalog = StaticCatalog.from_json(events_topic.catalog)
    (info,) = [i for i in catalog.partitions(events_topic.topic) if i.partition == partition]
    return read_order(info)


def _read(
    ranges: list[OffsetRange], stats: ReadStats, located: list[Located | None] | None = None
) -> list[dict]:
    at = located or [None] * len(ranges)
    batches = [
        b
        for r, where in zip(ranges, at, strict=True)
        for b in read_range(r, include_headers=True, stats=stats, located=where)
    ]
    return table_rows(pa.Table.from_batches(batches))


@pytest.mark.slow
def test_ranges_located_when_planned_are_read_without_a_call(
    events_topic: ProducedTopic, tmp_path: Path
) -> None:
    """The planner locates each range's records (reading.locate); a reader on that replica's
    node reads them with no call at all. Located runs that no longer hold (a file gone or
    damaged, runs shifted, another node) are never decoded into rows: the range is fetched."""
    whole = _partition_ranges(events_topic)
    ranges = split(whole, 3 * len(whole))  # starts inside the log, and inside batches
    assert any(r.start > 0 for r in ranges)
    located: list[Located | None] = []

    def all_located() -> bool:  # a follower learns the high watermark with its next fetch
        located[:] = locate(ranges)
        return all(where is not None for where in located)

    wait_until(all_located, timeout_s=30, interval_s=0.1, message="every range located")
    stats = ReadStats()
    assert _read(ranges, stats, located) == events_topic.rows
    assert stats.planned_bytes > 0
    assert (stats.local_bytes, stats.ray_bytes, stats.fallbacks) == (0, 0, 0), "no fetch call"

    first = located[0]
    assert first is not None
    path, position, size = first.runs[0]
    header = rb.parse_header(read_runs([(path, position, rb.HEADER_SIZE)]), 0)
    damaged = bytearray(Path(path).read_bytes())
    damaged[position + header.size - 2] ^= 0x10  # in the first located batch
    copy = tmp_path / "damaged.log"
    copy.write_bytes(damaged)
    wrong = {
        "missing": ((path + ".gone", position, size), *first.runs[1:]),
        "shifted": ((path, position + header.size, size - header.size), *first.runs[1:]),
        "bit flip": ((str(copy), position, size), *first.runs[1:]),
    }
    for case, runs in wrong.items():
        stats = ReadStats()
        bad = dataclasses.replace(first, runs=runs)
        assert _read(ranges[:1], stats, [bad]) == _read(ranges[:1], ReadStats()), case
        assert stats.fallbacks == 1 and stats.local_bytes > 0, case
    elsewhere = ReadStats()
    bad = dataclasses.replace(first, node_id="another-node")
    assert _read(ranges[:1], elsewhere, [bad]) == _read(ranges[:1], ReadStats())
    assert (elsewhere.planned_bytes, elsewhere.fallbacks) == (0, 0) and elsewhere.local_bytes


@pytest.mark.slow
def test_replicas_on_this_node_are_read_short_circuit(
    events_topic: ProducedTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica on the reader's Ray node answers where its batches lie and the reader reads
    the segment files itself: the same rows as through Ray, with no record bytes crossing
    Ray; RAYLOG_SHORT_CIRCUIT_READS=0 sends every byte through Ray."""
    ranges = _partition_ranges(events_topic)
    local = ReadStats()
    assert _read(ranges, local) == events_topic.rows
    assert (local.local_bytes > 0, local.ray_bytes, local.fallbacks) == (True, 0, 0)

    monkeypatch.setenv(SHORT_CIRCUIT_ENV, "0")
    through_ray = ReadStats()
    assert _read(ranges, through_ray) == events_topic.rows
    assert (through_ray.local_bytes, through_ray.ray_bytes) == (0, local.local_bytes)


@pytest.mark.slow
def test_ray_data_read_tasks_read_located_ranges_without_a_call(
    events_topic: ProducedTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read tasks made where this process is in Ray carry their ranges' located records: run
    here (on the replicas' node) they return every row without a single fetch call."""
    ranges = _partition_ranges(events_topic)
    wait_until(  # a follower learns the high watermark with its next fetch
        lambda: all(where is not None for where in locate(ranges)),
        timeout_s=30,
        interval_s=0.1,
        message="every range located",
    )
    tasks = RaylogDatasource(ranges, include_headers=True).get_read_tasks(parallelism=1)

    def no_fetch(*_: Any, **__: Any) -> Any:
        raise AssertionError("a located range made a fetch call")

    monkeypatch.setattr(_Fetcher, "call", no_fetch)
    tables = [table for task in tasks for table in task()]
    assert table_rows(pa.concat_tables(tables)) == events_topic.rows


@pytest.mark.slow
def test_a_short_circuit_read_that_does_not_hold_is_not_used(
    events_topic: ProducedTopic, tmp_path: Path
) -> None:
    """What a replica locates can be gone, cut or replaced before the reader gets there
    (retention, truncation, compaction), or damaged on disk (the replica read headers only):
    a file that is missing or shorter, bytes that span other offsets or fail their CRC, are
    never decoded into rows; the reader asks again through Ray."""
    r = _partition_ranges(events_topic)[0]
    handle = replica_handle(r.topic, r.partition, r.replica_ids[0])
    answer = ray.get(handle.fetch_extents.remote(0, 1 << 20), timeout=60)
    runs = answer.extents.runs
    assert answer.error_code == 0 and runs and answer.node_id
    path, position, size = runs[0]
    # The second batch onwards: whole, valid batches, but not the span the replica located.
    first = rb.parse_header(read_runs([(path, position, rb.HEADER_SIZE)]), 0)
    shifted = ((path, position + first.size, size - first.size), *runs[1:])
    damaged = bytearray(Path(path).read_bytes())
    damaged[position + first.size - 2] ^= 0x10  # in the first batch's last record
    copy = tmp_path / "damaged.log"
    copy.write_bytes(damaged)
    broken = {
        "missing": ((path + ".gone", position, size), *runs[1:]),
        "cut": ((path, os.path.getsize(path) - size // 2, size), *runs[1:]),
        "other offsets": shifted,
        "bit flip": ((str(copy), position, size), *runs[1:]),
    }
    stats = ReadStats()
    for name, bad_runs in broken.items():
        fetcher = _Fetcher(handle, 1 << 20, stats)
        outcome = msgspec.structs.replace(answer, extents=answer.extents._replace(runs=bad_runs))
        assert fetcher.decode(outcome, 0, r.end, False) is None, name
        assert not fetcher.short_circuit, name  # the next call goes through Ray
    assert stats.fallbacks == len(broken)
    fetcher = _Fetcher(handle, 1 << 20, stats)
    decoded = fetcher.decode(answer, 0, r.end, False)  # the answer as given holds
    assert decoded is not None and decoded[0] == answer.extents.next_offset
    assert fetcher.short_circuit and stats.local_bytes == size + sum(s for *_, s in runs[1:])


# --- planning, no Ray -----------------------------------------------------------------------


def _info(p: int = 0, leader: int = 0, isr: tuple[int, ...] = (0, 1, 2)) -> PartitionInfo:
    return PartitionInfo("t", p, leader, isr, (0, 1, 2))


def test_plan_resolves_earliest_and_latest() -> None:
    bounds = {("t", 0): Bounds(10, 100), ("t", 1): Bounds(0, 5)}
    ranges = plan([_info(0), _info(1, leader=1)], bounds, EARLIEST, LATEST)
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 10, 100), (1, 0, 5)]
    assert ranges[0].replica_ids == (1, 2, 0), "in-sync followers first, leader last"


def test_plan_data_loss_fails_or_skips() -> None:
    bounds = {("t", 0): Bounds(10, 100)}
    starting = parse_offsets('{"t": {"0": 4}}', "startingOffsets")
    with pytest.raises(DataLossError, match=r"t-0: offsets 4\.\.9 .*log start offset 10"):
        plan([_info()], bounds, starting, LATEST)
    (r,) = plan([_info()], bounds, starting, LATEST, fail_on_data_loss=False)
    assert (r.start, r.end) == (10, 100)


@pytest.mark.parametrize(
    ("starting", "ending", "message"),
    [
        ('{"t": {"0": 20}}', '{"t": {"0": 101}}', "beyond the high watermark"),
        ('{"t": {"0": 50}}', '{"t": {"0": 40}}', "starting offset 50 > ending offset 40"),
        ('{"t": {"0": -1}}', "latest", "latest"),
        ("earliest", '{"t": {"0": -2}}', "earliest"),
        ('{"t": {"7": 1}}', "latest", "not read"),
    ],
)
def test_plan_rejects_bad_ranges(starting: str, ending: str, message: str) -> None:
    bounds = {("t", 0): Bounds(10, 100)}
    with pytest.raises(ValueError, match=message):
        plan(
            [_info()],
            bounds,
            parse_offsets(starting, "startingOffsets"),
            parse_offsets(ending, "endingOffsets"),
        )


def test_split_until_min_partitions_keeps_ranges_contiguous() -> None:
    ranges = [OffsetRange("t", 0, 0, 1000, (0,)), OffsetRange("t", 1, 0, 10, (1,))]
    out = split(ranges, 6)
    assert len(out) == 6
    for p, (lo, hi) in ((0, (0, 1000)), (1, (0, 10))):
        mine = [r for r in out if r.partition == p]
        assert mine[0].start == lo and mine[-1].end == hi
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
    assert len(split([OffsetRange("t", 0, 5, 6, (0,))], 4)) == 1, "one record does not split"
    assert split([OffsetRange("t", 0, 5, 5, (0,))], 0) == [], "empty ranges read nothing"


def test_one_read_task_per_range() -> None:
    ranges = [OffsetRange("t", 0, 0, 10, (0,)), OffsetRange("t", 0, 10, 25, (0,))]
    tasks = RaylogDatasource(ranges).get_read_tasks(parallelism=100)
    assert [t.metadata.num_rows for t in tasks] == [10, 15]


def test_read_order_prefers_in_sync_followers() -> None:
    assert read_order(_info(leader=0, isr=(0, 1, 2))) == [1, 2, 0]
    assert read_order(_info(leader=2, isr=(2, 0))) == [0, 2, 1]
    assert read_order(_info(leader=-1, isr=(1,))) == [1, 0, 2]


def test_cluster_option_reads_cluster_json_of_a_data_dir(tmp_path: Path) -> None:
    token = tmp_path / "ray-token"
    token.write_text("secret")
    info = ClusterInfo("127.0.0.1:6379", str(token), str(tmp_path / "ray"), os.getpid())
    write_cluster_info(tmp_path, info)
    target = ClusterTarget.resolve(str(tmp_path))
    assert target.ray_address == "127.0.0.1:6379"
    env = dict(target.env)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(token)
    assert ClusterTarget.from_json(target.to_json()) == target
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"without cluster\.json"):
        ClusterTarget.resolve(str(tmp_path / "empty"))


def test_catalog_json_round_trip_and_validation() -> None:
    catalog = StaticCatalog.from_json('{"a": [{"partition": 1, "replicas": [3, 4]}]}')
    (info,) = catalog.partitions("a")
    assert (info.leader_id, info.isr, info.replica_ids) == (3, (3, 4), (3, 4))
    assert StaticCatalog.from_json(catalog.to_json()).partitions("a") == [info]
    assert catalog.topics() == ["a"] and catalog.partitions("b") == []
    with pytest.raises(ValueError, match="not replicas"):
        StaticCatalog.from_json('{"a": [{"partition": 0, "replicas": [0], "isr": [0, 9]}]}')
    with pytest.raises(ValueError, match="listed twice"):
        StaticCatalog.from_json(
            '{"a": [{"partition": 0, "replicas": [0]}, {"partition": 0, "replicas": [1]}]}'
        )


@pytest.mark.slow
def test_fail_on_data_loss_both_ways_after_retention(
    ray_local: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Offsets below a partition's log start (segments deleted by retention): fail naming
    topic, partition and offsets, or skip them and read the rest. The Spark source plans and
    reads with the same functions (reading.plan / read_range); its streaming decisions are in
    test_stream_offsets.py."""
    topic = "trimmed"
    recs = [make_records(20, seed=s) for s in range(12)]
    with kafka_codecs():
        batches = [kafka_batch(r, 0) for r in recs]
    actor, log_start = start_trimmed_partition(tmp_path_factory.mktemp("trimmed"), topic, batches)
    try:
        catalog = StaticCatalog.from_json({topic: [{"partition": 0, "leader": 0, "replicas": [0]}]})
        with pytest.raises(DataLossError, match=rf"{topic}-0: offsets 0\.\.{log_start - 1}"):
            read_topic(topic, catalog=catalog, start=0)
        skipped = _collect(read_topic(topic, catalog=catalog, start=0, fail_on_data_loss=False))
        assert [r["offset"] for r in skipped] == list(range(log_start, 12 * 20))
        # Earliest is the log start, not a loss.
        earliest = _collect(read_topic(topic, catalog=catalog))
        assert [r["offset"] for r in earliest] == list(range(log_start, 12 * 20))
    finally:
        ray.kill(actor)


@pytest.mark.slow
def test_read_topic_returns_a_compacted_partition_as_consumers_see_it(
    ray_local: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A compacted log (gaps between batches, batches holding fewer records than offsets,
    recompressed batches of every codec): Ray Data returns exactly the records the cleaner
    kept, at their original offsets, also when minPartitions splits ranges inside the gaps."""
    topic = "compacted-read"
    recs = [make_records(20, seed=s) for s in range(24)]
    for batch_recs in recs:
        for i, r in enumerate(batch_recs):
            if r["key"] is not None:
                r["key"] = b"key-%d" % (i % 5)  # five keys, written again and again
    codecs = list(CODECS.values())
    with kafka_codecs():
        batches = [kafka_batch(r, codecs[i % len(codecs)]) for i, r in enumerate(recs)]

    def clean(log: Log) -> None:
        assert log.clean(int(time.time() * 1000), log.high_watermark) is not None

    config = LogConfig(segment_bytes=4096, cleanup_policy="compact")
    actor, log = start_partition_from_log(
        tmp_path_factory.mktemp("compacted"),
        topic,
        batches,
        config,
        clean,
        {"cleanup.policy": "compact"},
    )
    try:
        cut = log.first_dirty_offset
        produced = [row for i, r in enumerate(recs) for row in expected_rows(r, topic, 0, 20 * i)]
        latest = {row["key"]: row["offset"] for row in produced if row["offset"] < cut}
        expected = [
            row
            for row in produced
            if row["offset"] >= cut
            or (row["key"] is not None and latest[row["key"]] == row["offset"])
        ]
        assert cut > 0 and len(expected) < len(produced)
        catalog = StaticCatalog.from_json({topic: [{"partition": 0, "leader": 0, "replicas": [0]}]})
        for min_partitions in (0, 7):
            dataset = read_topic(
                topic, catalog=catalog, start=0, min_partitions=min_partitions, include_headers=True
            )
            assert _collect(dataset) == expected
    finally:
        ray.kill(actor)


def test_catalog_from_controller_metadata() -> None:
    from raylog.actors.control.metadata import ClusterMetadata, PartitionState, TopicMetadata

    md = ClusterMetadata(
        cluster_id="c",
        topics={
            "a": TopicMetadata(
                name="a",
                topic_id="x",
                partitions=(
                    PartitionState(partition=0, replicas=(1, 2, 3), isr=(1, 3), leader=1),
                    PartitionState(partition=1, replicas=(2, 3, 1), isr=(2,), leader=-1),
                ),
            )
        },
    )
    catalog = catalog_from_metadata(md)
    assert catalog.topics() == ["a"]
    p0, p1 = catalog.partitions("a")
    assert (p0.leader_id, p0.isr, p0.replica_ids) == (1, (1, 3), (1, 2, 3))
    assert read_order(p0) == [3, 1, 2], "the in-sync follower, the leader, then the rest"
    assert read_order(p1) == [2, 1, 3], "no leader: the ISR, then the rest"
