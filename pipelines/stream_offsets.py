"""Offsets of the streaming ``raylog`` source: pure decisions, no Ray and no Spark.

A streaming query's offset is ``{topic: {partition: next offset}}``, with partitions as strings
because Spark stores it as JSON in the checkpoint. This module decides:

- :func:`initial`: where a new query starts (``startingOffsets``: earliest = log start offset,
  latest = high watermark, or per partition with -2/-1);
- :func:`latest`: where the next micro-batch ends: each partition's high watermark (never
  below where it already is), capped by a row limit (``maxOffsetsPerTrigger``) spread over the
  partitions in proportion to their backlog, and by the Trigger.AvailableNow target. A
  partition first seen now (created while the query runs) starts from 0, as Spark's Kafka
  source starts new partitions from earliest;
- :func:`ranges`: the offset ranges of a micro-batch, with ``failOnDataLoss`` applied to
  offsets below the log start offset (fail naming topic, partition and offsets, or skip).

The Spark adapter (:mod:`raylog.pipelines.spark_source`) fetches the catalog and bounds and
feeds them in. A bound's "high watermark" is the partition's last fetchable offset: for
read_committed (``kafka.isolation.level``), its last stable offset.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from raylog.pipelines.catalog import PartitionInfo, read_order
from raylog.pipelines.reading import (
    EARLIEST,
    LATEST,
    Bounds,
    DataLossError,
    OffsetRange,
    OffsetSpec,
    split,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Positions = dict[TopicPartition, int]  # next offset to read, per partition
NEW_PARTITION_START = 0  # "earliest" for a partition the query has not seen before


def to_json(positions: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Spark's offset form: ``{"t": {"0": 12}}`` (JSON object keys are strings)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(positions.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_json(offsets: Mapping[str, Mapping[str, int]]) -> Positions:
    try:
        return {(t, int(p)): int(o) for t, ps in offsets.items() for p, o in ps.items()}
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"not a raylog stream offset: {offsets!r}") from exc


def initial(
    partitions: Sequence[PartitionInfo], bounds: Mapping[TopicPartition, Bounds], spec: OffsetSpec
) -> Positions:
    """Where a new query starts. Partitions a JSON spec does not name start at earliest."""
    out: Positions = {}
    for info in partitions:
        tp = (info.topic, info.partition)
        b = bounds[tp]
        if isinstance(spec, int):
            wanted = spec
        else:
            wanted = spec.get(info.topic, {}).get(info.partition, EARLIEST)
        if wanted == EARLIEST:
            out[tp] = b.log_start_offset
        elif wanted == LATEST:
            out[tp] = b.high_watermark
        elif wanted < 0:
            raise ValueError(f"startingOffsets: {info.topic}-{info.partition}: offset {wanted}")
        else:
            out[tp] = wanted  # below the log start: ranges() applies failOnDataLoss
    return out


def latest(
    start: Mapping[TopicPartition, int],
    bounds: Mapping[TopicPartition, Bounds],
    *,
    max_rows: int | None = None,
    target: Mapping[TopicPartition, int] | None = None,
) -> Positions:
    """The end of the next micro-batch.

    ``bounds`` names the partitions read now (new ones start at NEW_PARTITION_START); a
    partition in ``start`` that is gone keeps its offset. ``target`` (Trigger.AvailableNow)
    caps every partition; a partition not in it (created later) is not read.
    """
    begin = dict(start)
    for tp in bounds:
        begin.setdefault(tp, NEW_PARTITION_START)
    end: Positions = dict(begin)
    for tp, b in bounds.items():
        # Invariant: an end never moves back (a new leader can report an older HW for a while).
        available = max(begin[tp], b.high_watermark)
        if target is not None:
            available = min(available, max(begin[tp], target.get(tp, begin[tp])))
        end[tp] = available
    if max_rows is not None:
        end = _cap(begin, end, max_rows)
    return end


def _cap(begin: Positions, end: Positions, max_rows: int) -> Positions:
    """Spread ``max_rows`` over the partitions in proportion to their backlog (Spark's Kafka
    source does the same), giving the rounding remainder to partitions without a share, then
    to the largest backlogs."""
    if max_rows < 1:
        raise ValueError(f"maxOffsetsPerTrigger must be positive, got {max_rows}")
    backlog = {tp: end[tp] - begin[tp] for tp in end}
    total = sum(backlog.values())
    if total <= max_rows:
        return end
    share = {tp: max_rows * n // total for tp, n in backlog.items()}
    left = max_rows - sum(share.values())
    # Partitions left without a share first, so that each one with a backlog progresses.
    for tp in sorted(backlog, key=lambda tp: (share[tp] > 0, -backlog[tp], tp)):
        if left <= 0:
            break
        if share[tp] < backlog[tp]:
            share[tp] += 1
            left -= 1
    return {tp: begin[tp] + share[tp] for tp in end}


def ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    partitions: Mapping[TopicPartition, PartitionInfo],
    bounds: Mapping[TopicPartition, Bounds],
    *,
    min_partitions: int = 0,
    fail_on_data_loss: bool = True,
) -> list[OffsetRange]:
    """The offset ranges of the micro-batch ``[start, end)``."""
    out = []
    for tp, stop in sorted(end.items()):
        topic, partition = tp
        begin = start.get(tp, NEW_PARTITION_START)
        if stop == begin:
            continue
        b = bounds.get(tp)
        info = partitions.get(tp)
        lost = None
        if info is None or b is None:
            lost = f"{topic}-{partition}: the partition is gone; offsets {begin}..{stop - 1} lost"
        elif stop < begin:
            lost = f"{topic}-{partition}: offset went back from {begin} to {stop}"
        elif begin < b.log_start_offset:
            lost = (
                f"{topic}-{partition}: offsets {begin}..{min(stop, b.log_start_offset) - 1} "
                f"are no longer in the log (log start offset {b.log_start_offset})"
            )
        if lost is not None:
            if fail_on_data_loss:
                raise DataLossError(lost + "; set failOnDataLoss=false to skip them")
            log.warning("%s; skipping them (failOnDataLoss=false)", lost)
            if info is None or b is None or stop < begin:
                continue
            begin = min(stop, b.log_start_offset)
        if stop > begin:
            out.append(OffsetRange(topic, partition, begin, stop, tuple(read_order(info))))
    return split(out, min_partitions)
