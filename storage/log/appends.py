"""Appends: a leader's offset assignment and stamping of a client batch
(:func:`append`), a follower's batches checked to follow the log (:func:`append_replicated`),
and rolls of the active segment.

An append writes and returns: it never fsyncs the data it writes (see :meth:`Log.flush`).
A roll fsyncs the segment it closes, with its index files, so that only the active segment
can hold unsynced bytes. Functions taking a :class:`LogState` run under the Log's lock.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import msgspec

from raylog.storage import batch as rb
from raylog.storage.errors import (
    FencedLeaderEpochError,
    InvalidRecordError,
    KafkaStorageError,
    RecordTooLargeError,
)
from raylog.storage.log.config import MAX_BATCH_BYTES, MAX_RELATIVE_OFFSET, LogConfig
from raylog.storage.log.epochs import UNDEFINED_EPOCH
from raylog.storage.log.segment import Segment
from raylog.storage.log.state import LogState
from raylog.storage.log.truncation import start_empty_at

logger = logging.getLogger(__name__)


class AppendInfo(msgspec.Struct, frozen=True):
    """What an append stored: offsets assigned and the LogAppendTime (-1 under CreateTime)."""

    base_offset: int
    last_offset: int
    records_count: int
    size_bytes: int
    log_append_time: int
    log_start_offset: int
    max_timestamp: int


def append(state: LogState, view: memoryview, leader_epoch: int, now_ms: int) -> AppendInfo:
    """Leader path: ``view`` (a validated client batch) stamped and written at the log end."""
    base = state.log_end_offset
    stamped = stamp(view, base, leader_epoch, state.epochs.latest_epoch, now_ms, state.config)
    stored = stamped.header
    try:
        _maybe_roll(state, stored)
        state.segments.active.append([stamped.head, stamped.body], [stored])
        if state.epochs.note(leader_epoch, base):
            state.epochs.persist()
    except OSError as exc:  # Segment.append already cut back its own partial write
        raise KafkaStorageError(f"append to {state.directory} failed: {exc}") from exc
    _note_written(state, stored.size)
    return AppendInfo(
        base_offset=base,
        last_offset=stored.last_offset,
        records_count=stored.records_count,
        size_bytes=stored.size,
        log_append_time=stamped.log_append_time,
        log_start_offset=state.log_start_offset,
        max_timestamp=stored.max_timestamp,
    )


def append_replicated(
    state: LogState, view: memoryview, headers: list[rb.BatchHeader]
) -> AppendInfo:
    """Follower path: ``view`` (batches of ``headers``, see :func:`replicated_headers`)
    written at the log end, after :func:`check_follows`; the log restarts empty at the first
    batch when that says so."""
    first = headers[0]
    restart = check_follows(
        headers, state.log_start_offset, state.log_end_offset, state.epochs.latest_epoch
    )
    pos = 0
    new_epochs = False
    try:
        if restart:
            start_empty_at(state.segments, first.base_offset, state.config.index_interval_bytes)
            state.all_durable()  # what was written is gone
            logger.info(
                "log %s restarts at %d: the leader's batch there holds the log start offset %d",
                state.directory,
                first.base_offset,
                state.log_start_offset,
            )
        for h in headers:
            # One batch per write keeps rolls exact.
            _maybe_roll(state, h)
            state.segments.active.append([view[pos : pos + h.size]], [h])
            pos += h.size
            # Invariant: no epoch entry starts below the log start offset.
            start = max(h.base_offset, state.log_start_offset)
            new_epochs |= state.epochs.note(h.partition_leader_epoch, start)
    except (OSError, KafkaStorageError) as exc:
        # The batches before the failing one are stored (a contiguous prefix): account for
        # them so a later flush covers them, then report the failure.
        if pos:
            _note_written(state, pos)
        if new_epochs:
            state.epochs.persist()
        raise KafkaStorageError(f"append to {state.directory} failed: {exc}") from exc
    if new_epochs:
        state.epochs.persist()
    _note_written(state, len(view))
    return AppendInfo(
        base_offset=first.base_offset,
        last_offset=headers[-1].last_offset,
        records_count=sum(h.records_count for h in headers),
        size_bytes=len(view),
        log_append_time=-1,
        log_start_offset=state.log_start_offset,
        max_timestamp=max(h.max_timestamp for h in headers),
    )


def roll(state: LogState) -> None:
    """Start a new, empty active segment at the log end. Raises OSError."""
    # 1. Make the old segment durable, so that (invariant) only the active segment can hold
    #    unsynced bytes: every write so far is durable.
    try:
        state.fsync(state.segments.active.fd)
    except OSError as exc:
        state.failed("fsync", exc)  # as in a flush: page cache state unknown
        raise
    # 2. Its index files, then the new segment and its directory entry.
    state.segments.roll(state.config.index_interval_bytes)
    state.stats.fsyncs += 1
    state.all_durable()
    state.stats.segments_rolled += 1


def _maybe_roll(state: LogState, header: rb.BatchHeader) -> None:
    if roll_due(state.segments.active, header, state.config):
        roll(state)


def _note_written(state: LogState, size: int) -> None:
    """Count a write, which the next flush makes durable."""
    state.writes += 1
    state.stats.appends += 1
    state.stats.bytes_appended += size


class Stamped(NamedTuple):
    """A client batch as the log stores it: ``head`` (a stamped copy of the 61-byte header)
    then ``body`` (the caller's bytes, never copied)."""

    head: bytearray
    body: memoryview
    header: rb.BatchHeader  # of the stored batch
    log_append_time: int  # -1 under CreateTime


def stamp(
    view: memoryview,
    base_offset: int,
    leader_epoch: int,
    latest_epoch: int,
    now_ms: int,
    config: LogConfig,
) -> Stamped:
    """Stamp a validated client batch with its base offset, the leader epoch and, under
    LogAppendTime, ``now_ms``. Raises FencedLeaderEpochError when ``leader_epoch`` is older
    than the log's latest (UNDEFINED_EPOCH: none yet)."""
    if latest_epoch != UNDEFINED_EPOCH and leader_epoch < latest_epoch:
        raise FencedLeaderEpochError(f"append in epoch {leader_epoch} after epoch {latest_epoch}")
    head = bytearray(view[: rb.HEADER_SIZE])
    body = view[rb.HEADER_SIZE :]
    rb.set_base_offset(head, 0, base_offset)
    rb.set_partition_leader_epoch(head, 0, leader_epoch)
    append_time = -1
    if config.log_append_time:
        append_time = now_ms
        # Under the CRC: hash the stamped header tail, then the untouched body.
        rb.stamp_log_append_time(head, now_ms, body)
    return Stamped(head, body, rb.parse_header(head), append_time)


def replicated_headers(view: memoryview) -> list[rb.BatchHeader]:
    """The headers of replicated batches, each framed, CRC-checked and within the log's
    limits (raises CorruptRecordError, RecordTooLargeError or InvalidRecordError)."""
    headers = [h for _, h in rb.iter_batches(view, verify=True)]
    for h in headers:
        if h.size > MAX_BATCH_BYTES:
            raise RecordTooLargeError(f"replicated batch of {h.size} bytes")
        if h.last_offset_delta < 0:
            raise InvalidRecordError(f"lastOffsetDelta {h.last_offset_delta} < 0")
    return headers


def check_follows(
    headers: list[rb.BatchHeader], log_start_offset: int, log_end_offset: int, latest_epoch: int
) -> bool:
    """Raise InvalidRecordError unless replicated ``headers`` may follow the log (the rules of
    :meth:`Log.append_replicated`); returns whether the log restarts at the first batch."""
    expected = log_end_offset
    first = headers[0]
    restart = first.base_offset < expected < first.next_offset and expected == log_start_offset
    if restart:
        expected = first.base_offset
    epoch = latest_epoch
    for h in headers:
        if h.base_offset < expected:  # gaps are a compacted leader log's
            raise InvalidRecordError(
                f"replicated batch at offset {h.base_offset}, below {expected}"
            )
        if 0 <= h.partition_leader_epoch < epoch:
            raise InvalidRecordError(
                f"replicated batch in epoch {h.partition_leader_epoch} after {epoch}"
            )
        epoch = max(epoch, h.partition_leader_epoch)
        expected = h.next_offset
    return restart


def roll_due(active: Segment, header: rb.BatchHeader, config: LogConfig) -> bool:
    """Whether the batch of ``header`` should start a new segment rather than join the active
    one (segment.bytes, segment.ms, or int32 relative offsets); never for an empty segment.

    segment.ms is judged as Kafka does: the incoming batch's maxTimestamp minus the first
    batch's, so replaying old timestamps does not roll on every append. On a compacted log
    max.compaction.lag.ms caps it (KIP-354), so no record stays in the active segment, out of
    the cleaner's reach, for longer.
    """
    if active.size == 0:
        return False
    full = active.size + header.size > config.segment_bytes
    segment_ms = config.segment_ms
    if config.compact:  # KIP-354: a record waits at most max.compaction.lag.ms
        segment_ms = min(segment_ms, config.max_compaction_lag_ms)
    aged = header.max_timestamp - active.first_batch_timestamp > segment_ms
    records = header.records_count
    overflow = active.next_offset + records - active.base_offset > MAX_RELATIVE_OFFSET
    return full or aged or overflow
