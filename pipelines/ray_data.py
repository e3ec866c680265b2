"""Ray Data over raylog topics: ``read_topic`` returns a ``ray.data.Dataset`` of records.

One read task per committed offset range (the same planning as the Spark source, see
:mod:`raylog.pipelines.reading`), rows with the same columns as Spark's Kafka source
(:func:`raylog.pipelines.records.schema`). Read tasks run as Ray tasks in the cluster that
holds the replicas, so they need no connection of their own; the driver must have joined it
(``cluster`` joins it when this process has not). A tiered topic's remote segments are read
straight from the object store, one task each (:mod:`raylog.pipelines.remote_ranges`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import ray
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from raylog.pipelines import reading, records, remote_ranges
from raylog.pipelines.catalog import Catalog, PartitionInfo

# Arrow bytes per record beyond key and value (offset, timestamp, type, partition, topic).
_ROW_OVERHEAD_BYTES = 32


class RaylogDatasource(Datasource):
    """A Ray Data datasource over planned offset ranges of raylog partitions."""

    def __init__(
        self,
        ranges: list[reading.OffsetRange],
        *,
        include_headers: bool = False,
        fail_on_data_loss: bool = True,
        bytes_per_record: int = 128,
        isolation_level: int = reading.READ_UNCOMMITTED,
    ) -> None:
        super().__init__()
        self._ranges = ranges
        self._include_headers = include_headers
        self._fail_on_data_loss = fail_on_data_loss
        self._isolation_level = isolation_level
        self._bytes_per_record = bytes_per_record + _ROW_OVERHEAD_BYTES

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(r.size for r in self._ranges) * self._bytes_per_record

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        # One task per planned range: ranges are the unit of parallelism (split them with
        # ``min_partitions``), so ``parallelism`` is not used to re-split here.
        include_headers, fail_on_data_loss = self._include_headers, self._fail_on_data_loss
        isolation_level = self._isolation_level
        # Where each range's first records lie, so that a task on that replica's node reads
        # them with no call (reading.locate); only where this process is in Ray.
        located: list[reading.Located | None] = [None] * len(self._ranges)
        if ray.is_initialized():
            located = remote_ranges.locate(self._ranges, isolation_level)
        tasks = []
        for r, at in zip(self._ranges, located, strict=True):

            def read_fn(
                r: reading.OffsetRange = r, at: reading.Located | None = at
            ) -> Iterable[pa.Table]:
                rows = 0
                for batch in remote_ranges.read_range(
                    r,
                    include_headers=include_headers,
                    fail_on_data_loss=fail_on_data_loss,
                    located=at,
                    isolation_level=isolation_level,
                ):
                    if batch.num_rows:
                        rows += batch.num_rows
                        yield pa.Table.from_batches([batch])
                if not rows:
                    # A range compaction emptied, or only markers and aborted records fill:
                    # one empty block with the schema, so that every block of the dataset
                    # has the same columns.
                    yield records.schema(include_headers).empty_table()

            metadata = BlockMetadata(
                # An upper bound: compacted, control and aborted offsets have no row.
                num_rows=r.size,
                size_bytes=r.size * self._bytes_per_record,
                input_files=None,
                exec_stats=None,
            )
            tasks.append(
                ReadTask(
                    read_fn,
                    metadata,
                    schema=records.schema(include_headers),
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks


def read_topic(
    topic: str | list[str],
    *,
    catalog: Catalog | None = None,
    start: str | int | Mapping[int, int] = "earliest",
    end: str | int | Mapping[int, int] = "latest",
    cluster: str | None = None,
    min_partitions: int = 0,
    include_headers: bool = False,
    fail_on_data_loss: bool = True,
    start_timestamp: int | None = None,
    end_timestamp: int | None = None,
    isolation_level: str = "read_uncommitted",
) -> ray.data.Dataset:
    """The committed records of ``topic`` from ``start`` to ``end`` as a Dataset.

    ``start`` / ``end``: "earliest", "latest", an offset for every partition, or
    ``{partition: offset}`` (-2 earliest, -1 latest). ``start_timestamp`` / ``end_timestamp``
    (ms since the epoch) take precedence: each partition from / up to its first record at
    least that late (Kafka's offsetsForTimes), its high watermark when none is that late.
    ``isolation_level`` (Kafka's ``isolation.level``): "read_uncommitted" reads every record
    below the high watermark; "read_committed" reads below the last stable offset ("latest"
    is that offset) and leaves out the records of aborted transactions. Transaction markers
    are never rows.
    ``catalog`` says where partitions live; by default the active controller's metadata
    (:func:`~raylog.pipelines.reading.controller_catalog`). ``cluster`` (data dir or Ray
    address) is joined when this process is not in Ray yet.
    """
    topics = [topic] if isinstance(topic, str) else list(topic)
    level = reading.parse_isolation_level(isolation_level, "isolation_level")
    if cluster is not None:
        reading.connect(reading.ClusterTarget.resolve(cluster))
    elif not ray.is_initialized():
        raise ValueError("read_topic: pass cluster=..., or join the cluster with ray.init first")
    if catalog is None:
        catalog = reading.controller_catalog()
    chosen = reading.select_partitions(catalog, subscribe=topics)
    local_bounds = reading.fetch_bounds(chosen, level)
    tiers = remote_ranges.learn(chosen, local_bounds, level)
    bounds = tiers.bounds(local_bounds)  # log starts of tiered topics: the remote ones
    starting = _spec(start, topics, "start")
    ending = _spec(end, topics, "end")
    ranges = tiers.split(
        reading.plan(
            chosen,
            bounds,
            _by_time(chosen, bounds, "start_timestamp", start_timestamp, starting, level),
            _by_time(chosen, bounds, "end_timestamp", end_timestamp, ending, level),
            min_partitions=min_partitions,
            fail_on_data_loss=fail_on_data_loss,
        )
    )
    source = RaylogDatasource(
        ranges,
        include_headers=include_headers,
        fail_on_data_loss=fail_on_data_loss,
        isolation_level=level,
    )
    # One block per range at most per task; tasks are as many as ranges.
    return ray.data.read_datasource(source, override_num_blocks=max(1, len(ranges)))


def _by_time(
    chosen: list[PartitionInfo],
    bounds: Mapping[tuple[str, int], reading.Bounds],
    name: str,
    timestamp: int | None,
    otherwise: Any,
    isolation_level: int,
) -> Any:
    by = None
    if timestamp is not None:
        by = reading.ByTimestamp(name, every=reading.parse_timestamp(timestamp, name))
    return reading.offsets_by_time(
        chosen, bounds, by, otherwise, if_missing="latest", isolation_level=isolation_level
    )


def _spec(value: str | int | Mapping[int, int], topics: list[str], name: str) -> Any:
    if isinstance(value, str):
        return reading.parse_offsets(value, name)
    if isinstance(value, int):
        if value in (reading.EARLIEST, reading.LATEST):
            return value
        return {t: _AllPartitions(value) for t in topics}
    return {t: {int(p): int(o) for p, o in value.items()} for t in topics}


class _AllPartitions(dict[int, int]):
    """One offset for every partition of a topic (``start=100``)."""

    def __init__(self, offset: int) -> None:
        super().__init__()
        self.offset = offset

    def get(self, key: int, default: Any = None) -> Any:  # type: ignore[override]
        return self.offset
