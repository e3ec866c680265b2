"""The ``raylog`` PySpark data source: batch reads of topics, shaped like Spark's Kafka source.

Usage::

    from raylog.pipelines import register
    register(spark)
    df = (spark.read.format("raylog")
          .option("cluster", "/var/lib/raylog")      # data dir with cluster.json, or Ray address
          .option("subscribe", "events")
          .option("startingOffsets", "earliest")
          .load())

Options (names and meanings of Spark's Kafka source; case-insensitive):

| option            | values                                   | default                  |
|-------------------|------------------------------------------|--------------------------|
| cluster           | data dir holding cluster.json, or a Ray  | required                 |
|                   | address (token from the driver's env)    |                          |
| subscribe         | comma-separated topics                   | exactly one of these 3   |
| subscribePattern  | a regex over topic names (full match)    |                          |
| assign            | JSON ``{"t": [0, 1]}``                   |                          |
| startingOffsets   | earliest, or JSON ``{"t": {"0": 23}}``   | earliest                 |
|                   | (-2 earliest)                            |                          |
| endingOffsets     | latest, or JSON (-1 latest)              | latest                   |
| minPartitions     | split offset ranges up to this many      | one per partition        |
|                   | Spark input partitions                   |                          |
| failOnDataLoss    | true: offsets below the log start fail;  | true                     |
|                   | false: warn and skip them                |                          |
| includeHeaders    | true adds ``headers``                    | false                    |
| catalog           | TEMPORARY, for tests until the           | required for now         |
|                   | controller answers metadata: JSON        |                          |
|                   | ``{"t": [{"partition": 0, "leader": 0,   |                          |
|                   | "isr": [0,1,2], "replicas": [0,1,2]}]}`` |                          |

Options are checked when the DataFrame is defined (``schema()``, on the driver), so an
unknown or conflicting option fails before any task runs. Offsets are resolved when Spark
plans the read (``partitions()``), against each partition's log start offset and high
watermark. Each input partition is one :class:`~raylog.pipelines.reading.OffsetRange`; the
reader joins Ray once per Python worker process (:func:`~raylog.pipelines.reading.connect`)
and yields ``pyarrow.RecordBatch``es in Spark's Arrow schema.

Streaming (``DataSourceStreamReader``) is not built yet.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from raylog.pipelines import reading
from raylog.pipelines.catalog import StaticCatalog

NAME = "raylog"

SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_DDL = ", headers array<struct<key: string, value: binary>>"

# Lower-case, as Spark hands them over (its options map is case-insensitive).
KNOWN_OPTIONS = frozenset(
    {
        "cluster",
        "subscribe",
        "subscribepattern",
        "assign",
        "startingoffsets",
        "endingoffsets",
        "minpartitions",
        "failondataloss",
        "includeheaders",
        "catalog",
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


class ReadOptions:
    """The data source's options, validated (every check that needs no cluster)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - KNOWN_OPTIONS)
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
        if not opts.get("catalog"):
            raise ValueError(
                "option catalog is required until the controller serves metadata "
                '(JSON {"topic": [{"partition": 0, "replicas": [0, 1, 2]}]})'
            )
        self.cluster: str = opts["cluster"]
        self.catalog = StaticCatalog.from_json(opts["catalog"])
        self.subscribe = [t.strip() for t in opts.get("subscribe", "").split(",") if t.strip()]
        self.subscribe_pattern: str | None = opts.get("subscribepattern")
        self.assign: dict[str, list[int]] | None = None
        if "assign" in opts:
            try:
                data = json.loads(opts["assign"])
                self.assign = {str(t): [int(p) for p in ps] for t, ps in data.items()}
            except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
                raise ValueError(f'option assign: expected JSON {{"t": [0, 1]}}: {exc}') from exc
        self.starting = reading.parse_offsets(
            opts.get("startingoffsets", "earliest"), "startingOffsets"
        )
        self.ending = reading.parse_offsets(opts.get("endingoffsets", "latest"), "endingOffsets")
        if self.starting == reading.LATEST:
            raise ValueError("startingOffsets=latest is for streaming queries, not batch reads")
        if self.ending == reading.EARLIEST:
            raise ValueError("endingOffsets=earliest is not allowed for batch reads")
        try:
            self.min_partitions = int(opts.get("minpartitions", "0"))
        except ValueError as exc:
            raise ValueError(f"option minPartitions: not an integer: {exc}") from exc
        if self.min_partitions < 0:
            raise ValueError(f"option minPartitions must be positive, got {self.min_partitions}")
        self.fail_on_data_loss = _bool(opts, "failondataloss", True)
        self.include_headers = _bool(opts, "includeheaders", False)
        # Subscription names must resolve in the catalog now, not in a task.
        reading.select_partitions(
            self.catalog,
            subscribe=self.subscribe,
            subscribe_pattern=self.subscribe_pattern,
            assign=self.assign,
        )


class RangePartition(InputPartition):
    """One Spark input partition: an offset range plus how to reach the cluster."""

    def __init__(self, offset_range: reading.OffsetRange, target_json: str) -> None:
        super().__init__(offset_range)
        self.offset_range = offset_range
        self.target_json = target_json


class RaylogDataSource(DataSource):
    """``spark.read.format("raylog")``: see the module docstring for options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        read = ReadOptions(self.options)  # fail on bad options when the DataFrame is defined
        return SCHEMA_DDL + (HEADERS_DDL if read.include_headers else "")

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaylogBatchReader(ReadOptions(self.options), schema)


class RaylogBatchReader(DataSourceReader):
    """Plans offset ranges on the driver side; reads one range per task."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.target = reading.ClusterTarget.resolve(options.cluster)
        from pyspark.sql.pandas.types import to_arrow_schema

        # Spark checks yielded batches against exactly this schema (timestamp[us, UTC]).
        self.arrow_schema: pa.Schema = to_arrow_schema(schema, timezone="UTC")

    def partitions(self) -> list[InputPartition]:
        o = self.options
        reading.connect(self.target)
        chosen = reading.select_partitions(
            o.catalog, subscribe=o.subscribe, subscribe_pattern=o.subscribe_pattern, assign=o.assign
        )
        ranges = reading.plan(
            chosen,
            reading.fetch_bounds(chosen),
            o.starting,
            o.ending,
            min_partitions=o.min_partitions,
            fail_on_data_loss=o.fail_on_data_loss,
        )
        target_json = self.target.to_json()
        parts: list[InputPartition] = [RangePartition(r, target_json) for r in ranges]
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, RangePartition):
            # Spark reads one partition of its own (None) when partitions() planned none:
            # every range was empty, so there is nothing to read.
            return
        reading.connect(reading.ClusterTarget.from_json(partition.target_json))
        for batch in reading.read_range(
            partition.offset_range,
            include_headers=self.options.include_headers,
            fail_on_data_loss=self.options.fail_on_data_loss,
        ):
            if batch.num_rows:
                yield batch.cast(self.arrow_schema)


def register(spark: Any) -> None:
    """Make ``spark.read.format("raylog")`` available in this session."""
    spark.dataSource.register(RaylogDataSource)
