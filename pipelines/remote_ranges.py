"""Bulk reads of tiered topics' remote segments straight from the object store (KIP-405).

A topic with remote.storage.enable keeps its older closed segments in the object store only
(:mod:`raylog.storage.remote`). A pipeline reads that history there itself, in parallel, one
task per remote segment (or part of one), never through a replica actor; the rest of a
partition, at or above its local log start, is read from the replicas as any other range
(:mod:`raylog.pipelines.reading`). Owns:

1. Learning the remote tier (:func:`learn`): for the chosen partitions of tiered topics
   (:attr:`~raylog.pipelines.catalog.PartitionInfo.remote_topic_id`), where the cluster's
   object store is (the controller's ``store_location``: the URL and S3 endpoint brokers are
   given; the reading process opens it with its own credentials, the standard chain of the
   store's client, so no secret crosses Ray or a Spark plan) and each partition's remote log
   metadata, read after the partition's bounds (so the remote tier reaches the local log
   start those bounds hold: a local segment is deleted only once copied). For
   read_committed, the aborted transactions overlapping the remote part: every remote
   segment's aborted-txn index (``RemoteReader.aborted_txns``), and those whose ABORT marker
   is still only in the local tier (the leader's answer to a read_committed fetch at the local
   log start names them).
2. Planning, pure (:class:`Tiers`): the partition's log start lowered to the remote log's
   first offset (Kafka's logStartOffset) where the tiers meet; then each planned range split
   at the local log start: below it one :class:`RemoteRange` per remote segment it overlaps,
   at and above it the rest, an ordinary range. The pieces tile the range exactly: no offset
   is read twice or skipped.
3. Reading a remote range (:func:`read_remote`): ``RemoteReader.read`` a slice of whole
   batches at a time, every batch's CRC-32C checked (by the reader and by the decode), and
   the span checked: the first batch holds the wanted offset and starts within the segment,
   each next batch starts where the one before ends, none ends past the segment's end offset.
   Records outside the range are dropped, so a range stops at its exact end offset. For
   read_committed the range's end is at or below the last stable offset (the planner's
   bound) and the records of the aborted transactions the planner found are left out.
   A remote segment that retention deleted under the read is data loss (``failOnDataLoss``).

:func:`read_range` and :func:`locate` take both kinds of range, for the Spark source and Ray
Data.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from raylog.pipelines import reading, records
from raylog.pipelines.catalog import PartitionInfo, read_order
from raylog.pipelines.reading import Bounds, Located, OffsetRange
from raylog.storage import batch as rb
from raylog.storage.errors import OffsetOutOfRangeError, RaylogError
from raylog.storage.objectstore import ObjectStore, open_object_store
from raylog.storage.remote import (
    RemotePartition,
    RemoteReader,
    RemoteSegment,
    metadata,
    metadata_store,
)
from raylog.storage.short_circuit import ReadStats

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# The last offset of an aborted transaction whose ABORT marker is in the local tier: past
# every remote range.
IN_LOCAL_TIER = (1 << 63) - 1
REMOTE_READS_MAX = 1_000_000  # bound on the reads of one range (each one advances)


class RemoteSpanError(RaylogError):
    """A remote read returned batches that are not the span asked for."""


@dataclass(frozen=True)
class StoreLocation:
    """The cluster's object store: its URL and S3 endpoint (None: AWS's)."""

    url: str
    s3_endpoint: str | None = None


@dataclass(frozen=True)
class RemoteLog:
    """What the planner learned of one partition's remote tier."""

    topic_id: str
    local_log_start_offset: int  # from the partition's bounds, read before the metadata
    segments: tuple[RemoteSegment, ...]  # the COPY_FINISHED ones, in offset order
    # read_committed: (producer id, first offset, last offset) of the aborted transactions
    # overlapping the remote part (IN_LOCAL_TIER: the marker is in the local tier).
    aborted: tuple[tuple[int, int, int], ...] = ()
    log_start_offset: int = -1  # where DeleteRecords moved the partition's log start (-1: never)

    @property
    def start(self) -> int | None:
        """The first offset the remote tier serves (its first segment's, or the log start
        DeleteRecords set), when it reaches the local log start (the tiers meet) and lies below
        it; else None (nothing below the local log start is readable)."""
        if not self.segments or self.segments[-1].next_offset < self.local_log_start_offset:
            return None
        start = max(self.segments[0].base_offset, self.log_start_offset)
        return start if start < self.local_log_start_offset else None


@dataclass(frozen=True)
class RemoteRange(OffsetRange):
    """Records ``[start, end)`` of one partition, all in one remote segment, read from the
    object store (``replica_ids`` is empty: no replica is asked)."""

    store: StoreLocation = field(kw_only=True)
    topic_id: str = field(kw_only=True)
    segment: RemoteSegment = field(kw_only=True)
    # read_committed: (producer id, first offset) of the aborted transactions it overlaps.
    aborted_transactions: tuple[tuple[int, int], ...] = field(default=(), kw_only=True)


# ---------------------------------------------------------------------------------------------
# 2. Planning (pure).


@dataclass(frozen=True)
class Tiers:
    """The remote tiers of the partitions a read chose (none for topics without tiering)."""

    store: StoreLocation | None = None
    logs: Mapping[TopicPartition, RemoteLog] = field(default_factory=dict)

    def bounds(self, bounds: Mapping[TopicPartition, Bounds]) -> dict[TopicPartition, Bounds]:
        """``bounds`` with each tiered partition's log start lowered to its remote log's
        first offset, where the tiers meet."""
        out = dict(bounds)
        for tp, remote in self.logs.items():
            b, start = bounds[tp], remote.start
            if start is not None and start < b.log_start_offset:
                out[tp] = Bounds(start, b.high_watermark, b.read_committed)
        return out

    def split(self, ranges: Sequence[OffsetRange]) -> list[OffsetRange]:
        """Each range split at its partition's local log start: below it one
        :class:`RemoteRange` per remote segment it overlaps, the rest as it was."""
        out: list[OffsetRange] = []
        for r in ranges:
            remote = self.logs.get((r.topic, r.partition))
            if remote is None or remote.start is None or r.start >= remote.local_log_start_offset:
                out.append(r)
                continue
            assert self.store is not None
            upto = min(r.end, remote.local_log_start_offset)
            at = r.start
            for segment in remote.segments:  # bounded: the metadata's segments
                if at >= upto:
                    break
                if segment.next_offset <= at:
                    continue
                if segment.base_offset > at:
                    break  # a gap: raised below
                end = min(upto, segment.next_offset)
                out.append(
                    RemoteRange(
                        r.topic,
                        r.partition,
                        at,
                        end,
                        (),
                        store=self.store,
                        topic_id=remote.topic_id,
                        segment=segment,
                        aborted_transactions=aborted_within(remote.aborted, at, end),
                    )
                )
                at = end
            if at < upto:
                raise ValueError(
                    f"{r.topic}-{r.partition}: offsets {at}..{upto - 1} are in no remote "
                    "segment and below the local log start"
                )
            if r.end > upto:
                out.append(OffsetRange(r.topic, r.partition, upto, r.end, r.replica_ids))
        return out


def aborted_within(
    aborted: Sequence[tuple[int, int, int]], start: int, end: int
) -> tuple[tuple[int, int], ...]:
    """(producer id, first offset) of the aborted transactions overlapping ``[start, end)``,
    as a fetch answer names them (Kafka's TransactionIndex.collectAbortedTxns)."""
    return tuple(
        sorted((pid, first) for pid, first, last in aborted if last >= start and first < end)
    )


# ---------------------------------------------------------------------------------------------
# 1. Learning the remote tier.


def store_location() -> StoreLocation:
    """The cluster's object store, from the controller (asked at every plan that reads a
    tiered topic: one call, and a process may plan reads of a cluster started again)."""
    url, endpoint = reading.ask_controller("store_location")
    return StoreLocation(url, endpoint)


@functools.cache
def open_store(location: StoreLocation) -> ObjectStore:
    """The store, opened once per process without its probe: a reader writes nothing there."""
    return open_object_store(location.url, endpoint_url=location.s3_endpoint, probe=False)


@functools.cache
def remote_reader(location: StoreLocation) -> RemoteReader:
    """One reader per store and process, over the process's shared cache of remote bytes."""
    return RemoteReader(open_store(location))


def learn(
    partitions: Sequence[PartitionInfo],
    bounds: Mapping[TopicPartition, Bounds],
    isolation_level: int = reading.READ_UNCOMMITTED,
    *,
    location: StoreLocation | None = None,
    store: ObjectStore | None = None,
) -> Tiers:
    """The remote tiers of the tiered partitions among ``partitions``, whose ``bounds`` were
    read before (see the module docstring). ``location`` / ``store``: the controller's
    store, opened here, by default."""
    tiered = [p for p in partitions if p.remote_topic_id]
    if not tiered:
        return Tiers()
    location = location if location is not None else store_location()
    store = store if store is not None else open_store(location)
    reader = RemoteReader(store)
    logs: dict[TopicPartition, RemoteLog] = {}
    for info in tiered:
        tp = (info.topic, info.partition)
        partition = RemotePartition(info.remote_topic_id, info.partition)
        meta, _ = metadata_store.read(store, partition)
        local_start = bounds[tp].log_start_offset
        remote = RemoteLog(
            info.remote_topic_id,
            local_start,
            tuple(metadata.served(meta)),
            log_start_offset=meta.log_start_offset,
        )
        if isolation_level == reading.READ_COMMITTED and remote.start is not None:
            aborted = _remote_aborted(reader, partition, remote) + _local_aborted(info, local_start)
            remote = dataclasses.replace(remote, aborted=aborted)
        logs[tp] = remote
    return Tiers(location, logs)


def _remote_aborted(
    reader: RemoteReader, partition: RemotePartition, remote: RemoteLog
) -> tuple[tuple[int, int, int], ...]:
    """The aborted transactions in the indexes of the remote segments below the local log
    start (each segment's index lists those whose ABORT marker it holds)."""
    out = []
    for segment in remote.segments:
        if segment.base_offset >= remote.local_log_start_offset:
            break
        for txn in reader.aborted_txns(
            partition, segment, segment.base_offset, segment.next_offset
        ):
            out.append((txn.producer_id, txn.first_offset, txn.last_offset))
    return tuple(out)


def _local_aborted(info: PartitionInfo, local_start: int) -> tuple[tuple[int, int, int], ...]:
    """The aborted transactions that began below the local log start and whose ABORT marker
    is in the local tier: the leader's read_committed answer at the local log start names
    every aborted transaction overlapping it."""
    import ray

    errors = []
    order = [info.leader_id] if info.leader_id >= 0 else []
    for rid in order + [r for r in read_order(info) if r not in order]:
        try:
            handle = reading.replica_handle(info.topic, info.partition, rid)
            outcome = ray.get(
                handle.read_committed.remote(
                    local_start, 1, 0, isolation_level=reading.READ_COMMITTED
                ),
                timeout=reading.CALL_TIMEOUT_S,
            )
        except (ValueError, ray.exceptions.RayError, TimeoutError) as exc:
            reading.forget_handle(info.topic, info.partition, rid)
            errors.append(f"replica {rid}: {exc!r}")
            continue
        if outcome.error_code:
            errors.append(f"replica {rid}: error {outcome.error_code}")
            continue
        return tuple(
            (pid, first, IN_LOCAL_TIER)
            for pid, first in outcome.aborted_transactions
            if first < local_start
        )
    raise RuntimeError(
        f"{info.topic}-{info.partition}: no replica named the aborted transactions at the "
        f"local log start {local_start}: {'; '.join(errors[-3:])}"
    )


# ---------------------------------------------------------------------------------------------
# 3. Reading.


def read_remote(
    r: RemoteRange,
    *,
    include_headers: bool = False,
    fail_on_data_loss: bool = True,
    max_bytes: int = reading.FETCH_MAX_BYTES,
    isolation_level: int = reading.READ_UNCOMMITTED,
    reader: RemoteReader | None = None,
    stats: ReadStats | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``r`` from its remote segment as Arrow batches, in order (see the
    module docstring for the checks)."""
    segment = r.segment
    if not segment.base_offset <= r.start < r.end <= segment.next_offset:
        raise ValueError(
            f"{r.topic}-{r.partition}: range {r.start}..{r.end} is not within remote segment "
            f"[{segment.base_offset}, {segment.end_offset}]"
        )
    reader = reader if reader is not None else remote_reader(r.store)
    partition = RemotePartition(r.topic_id, r.partition)
    aborted = None
    if isolation_level == reading.READ_COMMITTED:
        aborted = records.AbortedTransactions(r.aborted_transactions)
    offset, expected = r.start, None
    for _ in range(REMOTE_READS_MAX):
        try:
            batches = reader.read(partition, segment, offset, max_bytes)
        except OffsetOutOfRangeError as exc:
            message = (
                f"{r.topic}-{r.partition}: offsets {offset}..{r.end - 1} left the remote tier "
                f"before they were read ({exc})"
            )
            if fail_on_data_loss:
                raise reading.DataLossError(
                    message + "; set failOnDataLoss=false to skip them"
                ) from exc
            log.warning("%s; skipping them", message)
            return
        expected = check_span(batches, segment, offset, expected)
        data: Any = batches[0] if len(batches) == 1 else b"".join(batches)
        cols = records.new_columns(include_headers)
        next_offset = records.decode_into(data, cols, offset, r.end, aborted=aborted)
        if next_offset != expected and next_offset < r.end:  # the decode stops at the end
            raise RemoteSpanError(f"decoded up to {next_offset}, the batches end at {expected}")
        if stats is not None:
            stats.remote_bytes += len(data)
        offset = next_offset
        yield records.to_arrow(cols, r.topic, r.partition, include_headers)
        if offset >= r.end:
            return
    raise RuntimeError(f"{r.topic}-{r.partition}: {REMOTE_READS_MAX} remote reads did not end")


def check_span(
    batches: Sequence[bytes], segment: RemoteSegment, offset: int, expected: int | None
) -> int:
    """The offset after the last of ``batches`` (a read of ``segment`` at ``offset``), when
    they are the span asked for: the first holds ``offset`` and starts within the segment
    (at ``expected``, the end of the read before, if any), each next one starts where the one
    before ends, none ends past the segment's end offset. RemoteSpanError otherwise."""
    if not batches:
        raise RemoteSpanError(f"no batch at offset {offset} of remote segment {segment.segment_id}")
    for i, data in enumerate(batches):
        header = rb.parse_header(data)
        if i == 0 and not segment.base_offset <= header.base_offset <= offset < header.next_offset:
            raise RemoteSpanError(
                f"a read at offset {offset} began with the batch at {header.base_offset}"
            )
        if expected is not None and header.base_offset != expected:
            raise RemoteSpanError(f"a batch at offset {header.base_offset}, {expected} due")
        if header.last_offset > segment.end_offset:
            raise RemoteSpanError(
                f"a batch ends at {header.last_offset}, past remote segment "
                f"{segment.segment_id}'s end {segment.end_offset}"
            )
        expected = header.next_offset
    assert expected is not None
    return expected


def read_range(
    r: OffsetRange,
    *,
    include_headers: bool = False,
    fail_on_data_loss: bool = True,
    max_bytes: int = reading.FETCH_MAX_BYTES,
    stats: ReadStats | None = None,
    located: Located | None = None,
    isolation_level: int = reading.READ_UNCOMMITTED,
) -> Iterator[pa.RecordBatch]:
    """:func:`read_remote` for a :class:`RemoteRange`, else :func:`reading.read_range`."""
    if isinstance(r, RemoteRange):
        return read_remote(
            r,
            include_headers=include_headers,
            fail_on_data_loss=fail_on_data_loss,
            max_bytes=max_bytes,
            isolation_level=isolation_level,
            stats=stats,
        )
    return reading.read_range(
        r,
        include_headers=include_headers,
        fail_on_data_loss=fail_on_data_loss,
        max_bytes=max_bytes,
        stats=stats,
        located=located,
        isolation_level=isolation_level,
    )


def locate(
    ranges: Sequence[OffsetRange], isolation_level: int = reading.READ_UNCOMMITTED
) -> list[Located | None]:
    """:func:`reading.locate` for the ranges replicas serve; None for remote ranges."""
    local = [r for r in ranges if not isinstance(r, RemoteRange)]
    found = iter(reading.locate(local, isolation_level))
    return [None if isinstance(r, RemoteRange) else next(found) for r in ranges]
