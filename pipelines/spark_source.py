"""The ``raylog`` PySpark data source: batch and streaming reads, shaped like Spark's Kafka source.

Usage::

    from raylog.pipelines import register
    register(spark)
    df = (spark.read.format("raylog")            # or spark.readStream.format("raylog")
          .option("cluster", "/var/lib/raylog")  # data dir with cluster.json, or Ray address
          .option("subscribe", "events")
          .option("startingOffsets", "earliest")
          .load())

Columns: ``key`` and ``value`` (binary), ``topic``, ``partition``, ``offset``, ``timestamp``,
``timestampType``, and ``headers`` (array of key/value structs) with ``includeHeaders``.

Options (Spark's Kafka source names; case-insensitive):

| option               | values                                   | default                  |
|----------------------|------------------------------------------|--------------------------|
| cluster              | data dir holding cluster.json, or a Ray  | required                 |
|                      | address (token from the driver's env)    |                          |
| subscribe            | comma-separated topics                   | exactly one of these 3   |
| subscribePattern     | a regex over topic names (full match)    |                          |
| assign               | JSON ``{"t": [0, 1]}``                   |                          |
| startingOffsets      | earliest, latest (streaming only), or    | earliest (batch),        |
|                      | JSON ``{"t": {"0": 23}}`` (-2 earliest,  | latest (streaming)       |
|                      | -1 latest)                               |                          |
| endingOffsets        | batch only: latest, or JSON (-1 latest)  | latest                   |
| startingTimestamp    | ms since the epoch, for every partition: | (startingOffsets)        |
|                      | start at its first record that late      |                          |
| startingOffsetsBy-   | JSON ``{"t": {"0": 1700000000000}}``;    | (startingOffsets)        |
| Timestamp            | unnamed partitions use startingOffsets   |                          |
| startingOffsetsBy-   | no record that late: error (fail naming  | error                    |
| TimestampStrategy    | the partition) or latest (start at end)  |                          |
| endingTimestamp,     | batch only, as the starting pair; no     | (endingOffsets)          |
| endingOffsetsBy-     | record that late: the high watermark     |                          |
| Timestamp            |                                          |                          |
| maxOffsetsPerTrigger | streaming only: records per micro-batch, | no limit                 |
|                      | spread over partitions by backlog        |                          |
| minPartitions        | split offset ranges up to this many      | one per partition        |
|                      | Spark input partitions                   |                          |
| failOnDataLoss       | true: offsets below the log start fail;  | true                     |
|                      | false: warn and skip them                |                          |
| includeHeaders       | true adds ``headers``                    | false                    |
| kafka.isolation.level| read_uncommitted: every record below the | read_uncommitted         |
|                      | high watermark; read_committed: records  |                          |
|                      | below the last stable offset, those of   |                          |
|                      | aborted transactions left out            |                          |

``kafka.isolation.level`` is the Kafka consumer setting Spark's Kafka source passes through
(its ``kafka.`` options); the other ``kafka.`` options are Kafka client settings raylog does
not use, and are unknown options here. With read_committed, offsets (the planned ends,
``latest``, every micro-batch's end) stop at each partition's last stable offset, so a
transaction still open holds back every record from its first one on, as it does for Kafka's
consumers. Transaction markers are never rows, in either level.

Where partitions live comes from the active controller's metadata
(:func:`~raylog.pipelines.reading.controller_catalog`), asked when Spark plans a read (and at
every micro-batch of a streaming query, so new partitions and moved leaders are seen). Each
range is read from an in-sync follower when there is one, else the leader, and from the next
replica when one fails (:func:`~raylog.pipelines.catalog.read_order`). A read of a topic with
remote.storage.enable (batch or streaming) reads what lies below a partition's local log
start straight from the object store, one range per remote segment
(:mod:`~raylog.pipelines.remote_ranges`; the Python workers open the store with their own
credentials); a streaming query's earliest is the remote log's start.

Options are checked when the DataFrame is defined (``schema()``), so an unknown or conflicting
option fails before any task runs; a topic that does not exist fails a batch read when Spark
plans it, also before any task. Each input partition is one
:class:`~raylog.pipelines.reading.OffsetRange`; the reader joins Ray once per Python worker
process (:func:`~raylog.pipelines.reading.connect`, with the cluster's token) and yields
``pyarrow.RecordBatch``es in Spark's Arrow schema.

Spark's Python workers are started by the JVM with its environment: ``PYSPARK_PYTHON`` must
name a Python that has raylog installed (``register`` warns when it does not). The Ray token
needs nothing: with a data dir, the workers take it from ``cluster.json``; with a Ray address,
from the ``RAY_AUTH_*`` variables of the process that planned the read.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from raylog.pipelines import reading, remote_ranges, stream_offsets
from raylog.pipelines.catalog import Catalog, PartitionInfo

log = logging.getLogger(__name__)

NAME = "raylog"

SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_DDL = ", headers array<struct<key: string, value: binary>>"

# Lower-case, as Spark hands them over (its options map is case-insensitive).
ISOLATION_LEVEL = "kafka.isolation.level"  # Spark's Kafka source hands it to Kafka's consumer
KNOWN_OPTIONS = frozenset(
    {
        "cluster",
        "subscribe",
        "subscribepattern",
        "assign",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "startingoffsetsbytimestamp",
        "startingoffsetsbytimestampstrategy",
        "endingtimestamp",
        "endingoffsetsbytimestamp",
        "maxoffsetspertrigger",
        "minpartitions",
        "failondataloss",
        "includeheaders",
        ISOLATION_LEVEL,
    }
)
SUBSCRIPTIONS = ("subscribe", "subscribepattern", "assign")


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    text = options.get(key)
    if text is None:
        return default
    lowered = str(text).strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"option {key}: expected true or false, got {text!r}")
    return lowered == "true"


def _positive_int(options: Mapping[str, str], key: str, name: str) -> int | None:
    if key not in options:
        return None
    try:
        value = int(options[key])
    except ValueError as exc:
        raise ValueError(f"option {name}: not an integer: {options[key]!r}") from exc
    if value < 1:
        raise ValueError(f"option {name} must be positive, got {value}")
    return value


class ReadOptions:
    """The data source's options, validated (every check that needs no cluster)."""

    def __init__(self, options: Mapping[str, str], *, streaming: bool | None = False) -> None:
        """``streaming``: True for a stream, False for a batch read, None for the checks that
        hold for both (``schema()`` does not know which one it is)."""
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - KNOWN_OPTIONS - {"path"})
        if unknown:
            raise ValueError(
                f"unknown option(s) {unknown} for format {NAME!r}; known: {sorted(KNOWN_OPTIONS)}"
            )
        given = [k for k in SUBSCRIPTIONS if opts.get(k)]
        if len(given) != 1:
            raise ValueError(
                "exactly one of subscribe, subscribePattern, assign is required; "
                f"got {given or 'none'}"
            )
        if not opts.get("cluster"):
            raise ValueError("option cluster is required: a raylog data dir or a Ray address")
        self.cluster: str = opts["cluster"]
        self.subscribe = [t.strip() for t in opts.get("subscribe", "").split(",") if t.strip()]
        self.subscribe_pattern: str | None = opts.get("subscribepattern")
        self.assign: dict[str, list[int]] | None = None
        if "assign" in opts:
            try:
                data = json.loads(opts["assign"])
                self.assign = {str(t): [int(p) for p in ps] for t, ps in data.items()}
            except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
                raise ValueError(f'option assign: expected JSON {{"t": [0, 1]}}: {exc}') from exc
        default_start = "latest" if streaming else "earliest"
        self.starting = reading.parse_offsets(
            opts.get("startingoffsets", default_start), "startingOffsets"
        )
        self.ending = reading.parse_offsets(opts.get("endingoffsets", "latest"), "endingOffsets")
        if streaming is True and "endingoffsets" in opts:
            raise ValueError("endingOffsets is for batch reads, not streaming queries")
        if streaming is False:
            if self.starting == reading.LATEST:
                raise ValueError("startingOffsets=latest is for streaming queries, not batch reads")
            if self.ending == reading.EARLIEST:
                raise ValueError("endingOffsets=earliest is not allowed for batch reads")
        self.starting_by_time = reading.ByTimestamp.parse(
            opts.get("startingtimestamp"), opts.get("startingoffsetsbytimestamp"), "starting"
        )
        self.ending_by_time = reading.ByTimestamp.parse(
            opts.get("endingtimestamp"), opts.get("endingoffsetsbytimestamp"), "ending"
        )
        if streaming is True and self.ending_by_time is not None:
            raise ValueError(
                f"{self.ending_by_time.option} is for batch reads, not streaming queries"
            )
        strategy = str(opts.get("startingoffsetsbytimestampstrategy", "error")).strip().lower()
        if strategy not in reading.TIMESTAMP_STRATEGIES:
            raise ValueError(
                "option startingOffsetsByTimestampStrategy: expected error or latest, "
                f"got {strategy!r}"
            )
        self.timestamp_strategy = strategy
        self.max_offsets_per_trigger = _positive_int(
            opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger"
        )
        try:
            self.min_partitions = int(opts.get("minpartitions", "0"))
        except ValueError as exc:
            raise ValueError(f"option minPartitions: not an integer: {exc}") from exc
        if self.min_partitions < 0:
            raise ValueError(f"option minPartitions must be positive, got {self.min_partitions}")
        self.fail_on_data_loss = _bool(opts, "failondataloss", True)
        self.include_headers = _bool(opts, "includeheaders", False)
        self.isolation_level = reading.parse_isolation_level(
            opts.get(ISOLATION_LEVEL, "read_uncommitted"), ISOLATION_LEVEL
        )
        if self.subscribe_pattern is not None:
            import re

            try:
                re.compile(self.subscribe_pattern)
            except re.error as exc:
                raise ValueError(f"option subscribePattern: bad regex: {exc}") from exc

    def starting_offsets(
        self, chosen: list[PartitionInfo], bounds: Mapping[Any, reading.Bounds]
    ) -> reading.OffsetSpec:
        """startingOffsets, or the offsets startingTimestamp / startingOffsetsByTimestamp
        find (they take precedence, as in Spark)."""
        return reading.offsets_by_time(
            chosen,
            bounds,
            self.starting_by_time,
            self.starting,
            if_missing=self.timestamp_strategy,
            isolation_level=self.isolation_level,
        )

    def ending_offsets(
        self, chosen: list[PartitionInfo], bounds: Mapping[Any, reading.Bounds]
    ) -> reading.OffsetSpec:
        """endingOffsets, or what endingTimestamp / endingOffsetsByTimestamp find (a partition
        without a record that late ends at its high watermark, as in Spark)."""
        return reading.offsets_by_time(
            chosen,
            bounds,
            self.ending_by_time,
            self.ending,
            if_missing="latest",
            isolation_level=self.isolation_level,
        )

    def select(self, catalog: Catalog, *, missing_ok: bool = False) -> list[PartitionInfo]:
        return reading.select_partitions(
            catalog,
            subscribe=self.subscribe,
            subscribe_pattern=self.subscribe_pattern,
            assign=self.assign,
            missing_ok=missing_ok,
        )


class RangePartition(InputPartition):
    """One Spark input partition: the offset ranges its task reads, one after the other, each
    with where its first records lay when it was planned; plus how to reach the cluster."""

    def __init__(
        self,
        reads: tuple[tuple[reading.OffsetRange, reading.Located | None], ...],
        target_json: str,
    ) -> None:
        super().__init__(tuple(r for r, _ in reads))
        self.reads = reads
        self.target_json = target_json


def pack(weights: list[int], bins: int) -> list[list[int]]:
    """Indices of ``weights`` in at most ``bins`` groups of about equal total weight (the
    heaviest item first, each onto the lightest group so far): each group in index order, the
    groups in the order of their first index."""
    groups: list[list[int]] = [[] for _ in range(max(1, min(bins, len(weights))))]
    loads = [0] * len(groups)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        lightest = min(range(len(groups)), key=lambda g: (loads[g], g))
        groups[lightest].append(i)
        loads[lightest] += weights[i]
    return sorted((sorted(g) for g in groups if g), key=lambda g: g[0])


def _range_partitions(
    ranges: list[reading.OffsetRange],
    target: reading.ClusterTarget,
    *,
    task_slots: int | None,
    min_partitions: int,
    isolation_level: int = reading.READ_UNCOMMITTED,
) -> list[InputPartition]:
    """The Spark partitions of a read: its ranges, each with where its first records lie now,
    so that a task on that replica's node starts reading without a call (:func:`reading.locate`).

    One range per partition, as Spark's Kafka source does, unless there are more ranges than
    the session's task slots (``task_slots``, Spark's default parallelism, which
    :func:`register` records) and ``minPartitions`` is not set: then the ranges are packed into
    that many partitions of about equal record counts, as Spark's file sources pack small
    files. Every Spark task costs the JVM tens of milliseconds before it reads a row, and
    tasks beyond the slots only wait for one."""
    target_json = target.to_json()
    reads = list(zip(ranges, remote_ranges.locate(ranges, isolation_level), strict=True))
    if task_slots is None or min_partitions or len(reads) <= task_slots:
        return [RangePartition((read,), target_json) for read in reads]
    groups = pack([r.size for r in ranges], task_slots)
    return [RangePartition(tuple(reads[i] for i in g), target_json) for g in groups]


class RaylogDataSource(DataSource):
    """``spark.read.format("raylog")`` and ``spark.readStream.format("raylog")``."""

    # Spark's default parallelism in the session that registered the source (see register).
    task_slots: int | None = None

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        # Fail on bad options when the DataFrame is defined. The checks that depend on batch
        # or stream wait for reader() / streamReader(), still before any task runs.
        read = ReadOptions(self.options, streaming=None)
        return SCHEMA_DDL + (HEADERS_DDL if read.include_headers else "")

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaylogBatchReader(ReadOptions(self.options), schema, self.task_slots)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RaylogStreamReader(
            ReadOptions(self.options, streaming=True), schema, self.task_slots
        )


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    # Spark checks yielded batches against exactly this schema (timestamp[us, UTC]).
    return to_arrow_schema(schema, timezone="UTC")


_joins = 0  # how many times this process joined the cluster for Spark (see _join)


def _join(target: reading.ClusterTarget) -> None:
    """Join the cluster's Ray from one of Spark's Python workers (once per process; later
    calls find the connection), and keep the long-lived heap out of the collector's reach.

    A reused Spark Python worker runs a full ``gc.collect()`` after every task. With Ray
    joined, and what a task imports (pandas, pyarrow.compute and more: 33,000 objects more),
    that walked 120,000 long-lived objects each time, 15-50 ms of CPU per task that the next
    task waits for. ``gc.freeze()`` moves what the process holds into a generation the
    collector skips: once after joining Ray, and once more when the second task starts, by
    which time the first task's imports are done and its garbage was collected (a process
    that plans, where nothing collects in between, keeps what its first plan left, once).
    Only here, in the processes Spark starts for its tasks and plans: a user's own process
    keeps its collector as it was."""
    global _joins
    reading.connect(target)
    if _joins < 2:
        _joins += 1
        gc.freeze()


def _read(
    partition: InputPartition, options: ReadOptions, arrow_schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, RangePartition):
        # Spark reads one partition of its own (None) when partitions() planned none:
        # every range was empty, so there is nothing to read.
        return
    _join(reading.ClusterTarget.from_json(partition.target_json))
    for offset_range, located in partition.reads:
        for batch in remote_ranges.read_range(
            offset_range,
            include_headers=options.include_headers,
            fail_on_data_loss=options.fail_on_data_loss,
            located=located,
            isolation_level=options.isolation_level,
        ):
            if batch.num_rows:
                yield batch.cast(arrow_schema)


class RaylogBatchReader(DataSourceReader):
    """Plans offset ranges on the driver side; each task reads its partition's ranges."""

    def __init__(
        self, options: ReadOptions, schema: StructType, task_slots: int | None = None
    ) -> None:
        self.options = options
        self.target = reading.ClusterTarget.resolve(options.cluster)
        self.arrow_schema = _arrow_schema(schema)
        self.task_slots = task_slots

    def partitions(self) -> list[InputPartition]:
        o = self.options
        _join(self.target)
        chosen = o.select(reading.controller_catalog())
        local_bounds = reading.fetch_bounds(chosen, o.isolation_level)
        tiers = remote_ranges.learn(chosen, local_bounds, o.isolation_level)
        bounds = tiers.bounds(local_bounds)  # log starts of tiered topics: the remote ones
        ranges = tiers.split(
            reading.plan(
                chosen,
                bounds,
                o.starting_offsets(chosen, bounds),
                o.ending_offsets(chosen, bounds),
                min_partitions=o.min_partitions,
                fail_on_data_loss=o.fail_on_data_loss,
            )
        )
        return _range_partitions(
            ranges,
            self.target,
            task_slots=self.task_slots,
            min_partitions=self.options.min_partitions,
            isolation_level=self.options.isolation_level,
        )

    def read(self, partition: InputPartition) -> Iterator[Any]:
        yield from _read(partition, self.options, self.arrow_schema)


class RaylogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of committed records; offsets ``{topic: {partition: offset}}``.

    Lives in one Python process for the whole query (Spark's streaming source runner), so it
    joins Ray once; every call asks the controller for the current partitions and leaders.
    The decisions are :mod:`raylog.pipelines.stream_offsets`'s.
    """

    def __init__(
        self, options: ReadOptions, schema: StructType, task_slots: int | None = None
    ) -> None:
        self.options = options
        self.target = reading.ClusterTarget.resolve(options.cluster)
        self.arrow_schema = _arrow_schema(schema)
        self.task_slots = task_slots
        self.available_now_target: stream_offsets.Positions | None = None

    def _current(
        self, keep: stream_offsets.Positions | None = None
    ) -> tuple[dict[stream_offsets.TopicPartition, PartitionInfo], dict[Any, reading.Bounds]]:
        """The subscribed partitions now (plus ``keep``'s, when still there) and their bounds."""
        _join(self.target)
        catalog = reading.controller_catalog()
        chosen = {(p.topic, p.partition): p for p in self.options.select(catalog, missing_ok=True)}
        for tp in keep or {}:
            if tp not in chosen:
                found = [p for p in catalog.partitions(tp[0]) if p.partition == tp[1]]
                if found:
                    chosen[tp] = found[0]
        return chosen, reading.fetch_bounds(list(chosen.values()), self.options.isolation_level)

    def _tiered(
        self, chosen: dict[stream_offsets.TopicPartition, PartitionInfo], local: dict[Any, Any]
    ) -> tuple[remote_ranges.Tiers, dict[Any, reading.Bounds]]:
        """The remote tiers of the tiered partitions among ``chosen`` and the bounds with their
        log starts lowered to the remote ones, as a batch read plans (nothing is asked of the
        object store when no topic is tiered)."""
        tiers = remote_ranges.learn(list(chosen.values()), local, self.options.isolation_level)
        return tiers, tiers.bounds(local)

    def initialOffset(self) -> dict:
        chosen, local = self._current()
        _, bounds = self._tiered(chosen, local)  # earliest: a tiered partition's remote start
        infos = list(chosen.values())
        starting = self.options.starting_offsets(infos, bounds)
        positions = stream_offsets.initial(infos, bounds, starting)
        return stream_offsets.to_json(positions)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        _, bounds = self._current()
        self.available_now_target = {tp: b.high_watermark for tp, b in bounds.items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = stream_offsets.from_json(start)
        _, bounds = self._current()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = stream_offsets.latest(
            begin, bounds, max_rows=max_rows, target=self.available_now_target
        )
        return stream_offsets.to_json(end)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, stop = stream_offsets.from_json(start), stream_offsets.from_json(end)
        chosen, local = self._current(keep=stop)
        # Below a tiered partition's local log start the records are read from the object
        # store, one range per remote segment, as a batch read does.
        tiers, bounds = self._tiered(chosen, local)
        ranges = tiers.split(
            stream_offsets.ranges(
                begin,
                stop,
                chosen,
                bounds,
                min_partitions=self.options.min_partitions,
                fail_on_data_loss=self.options.fail_on_data_loss,
            )
        )
        return _range_partitions(
            ranges,
            self.target,
            task_slots=self.task_slots,
            min_partitions=self.options.min_partitions,
            isolation_level=self.options.isolation_level,
        )

    def read(self, partition: InputPartition) -> Iterator[Any]:
        yield from _read(partition, self.options, self.arrow_schema)

    def commit(self, end: dict) -> None:
        """Nothing to release: Spark's checkpoint holds the offsets; raylog keeps no reader
        state (no consumer group)."""


def register(spark: Any) -> None:
    """Make the ``raylog`` format available in this session (batch and streaming).

    Records the session's default parallelism, so that a read with more ranges than task
    slots packs them into that many Spark partitions (:func:`_range_partitions`). Warns when
    Spark's Python workers run a different Python than this one (set ``PYSPARK_PYTHON``
    before creating the session; raylog must be importable there).
    """
    context = getattr(spark, "sparkContext", None)  # None under Spark Connect
    worker_python = getattr(context, "pythonExec", None)
    if worker_python and os.path.realpath(worker_python) != os.path.realpath(sys.executable):
        log.warning(
            "Spark's Python workers run %s, not %s: set PYSPARK_PYTHON=%s before creating the "
            "session so that they can import raylog",
            worker_python,
            sys.executable,
            sys.executable,
        )
    slots = getattr(context, "defaultParallelism", None)
    source: type[RaylogDataSource] = RaylogDataSource
    if isinstance(slots, int) and slots > 0:
        # A subclass carrying the figure: Spark pickles the registered class (by value, as it
        # is not importable by name) to every process that plans a read.
        source = type(RaylogDataSource.__name__, (RaylogDataSource,), {"task_slots": slots})
    spark.dataSource.register(source)
