"""The rewrite of a cleaning pass: files in, ``.cleaned`` files out.

:func:`rewrite_segments` reads the segments a pass cleans and writes their cleaned copies,
never the log's state, so that it can run in a child process
(:mod:`raylog.storage.cleaner_process`): its job (:class:`RewriteJob`) and its answer
(:class:`Rewritten`) are plain picklable values. The per-batch rules are
:mod:`raylog.storage.log.cleaner`'s; planning the pass and swapping its files in are
:mod:`raylog.storage.log.compaction`'s.

A cleaned file is named ``B.log.<token>.cleaned``, B being the base offset of the first
segment of the group of segments it replaces (see :attr:`RewriteJob.token`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from raylog.storage import batch as rb
from raylog.storage.errors import KafkaStorageError
from raylog.storage.log import cleaner
from raylog.storage.log.config import MAX_BATCH_BYTES, MAX_RELATIVE_OFFSET, LogConfig
from raylog.storage.log.reads import HEADER_SCAN_CHUNK_BYTES
from raylog.storage.log.segment import (
    CLEANED_SUFFIX,
    LOG_SUFFIX,
    SCAN_CHUNK_BYTES,
    pread_exact,
    pwrite_all,
)
from raylog.storage.log.txnindex import AbortedTxn


class CleanedGroup(NamedTuple):
    """A ``.cleaned`` file a pass wrote, to replace the segments ``members`` (indexes into
    the pass's segments)."""

    base: int
    path: Path  # the .cleaned file
    members: range  # indexes of the target segments it replaces
    headers: list[tuple[int, rb.BatchHeader]]  # (position, header) of each batch written
    size: int


def _file_headers(path: Path, size: int) -> Iterator[tuple[int, rb.BatchHeader]]:
    """(position, header) of each batch in the first ``size`` bytes of a segment file,
    reading HEADER_SCAN_CHUNK_BYTES at a time and jumping over large bodies."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = 0
        while pos < size:
            chunk = pread_exact(fd, min(HEADER_SCAN_CHUNK_BYTES, size - pos), pos)
            at = 0
            while len(chunk) - at >= rb.HEADER_SIZE:
                header = rb.parse_header(chunk, at)
                if header.magic != rb.MAGIC or header.batch_length < rb.MIN_BATCH_LENGTH:
                    raise KafkaStorageError(f"corrupt batch header at byte {pos + at} of {path}")
                yield pos + at, header
                at += header.size
            if not at:
                raise KafkaStorageError(f"{path}: short batch header at byte {pos}")
            pos += at
    finally:
        os.close(fd)


def _file_batches(path: Path, size: int) -> Iterator[tuple[int, rb.BatchHeader, memoryview]]:
    """(position, header, bytes) of each whole batch in the first ``size`` bytes of a segment
    file, CRC-checked, reading about SCAN_CHUNK_BYTES at a time (a larger batch alone)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = 0
        while pos < size:
            chunk = memoryview(pread_exact(fd, min(SCAN_CHUNK_BYTES, size - pos), pos))
            at = 0
            while len(chunk) - at >= rb.HEADER_SIZE:
                header = rb.parse_header(chunk, at)
                if (
                    header.magic != rb.MAGIC
                    or header.batch_length < rb.MIN_BATCH_LENGTH
                    or header.size > MAX_BATCH_BYTES
                    or pos + at + header.size > size
                ):
                    raise KafkaStorageError(f"corrupt batch header at byte {pos + at} of {path}")
                if header.size > len(chunk) - at:
                    if at:
                        break  # read again from this batch
                    chunk = memoryview(pread_exact(fd, header.size, pos))
                if not rb.crc_ok(chunk, at, header):
                    raise KafkaStorageError(
                        f"batch at byte {pos + at} of {path} fails its CRC-32C; not cleaned"
                    )
                yield pos + at, header, chunk[at : at + header.size]
                at += header.size
            if not at:
                raise KafkaStorageError(f"{path}: short batch at byte {pos}")
            pos += at
    finally:
        os.close(fd)


def _group_segments(
    bases: list[int], sizes: list[int], cut: int, segment_bytes: int
) -> list[range]:
    """Consecutive runs of segments the cleaner merges into one: at most segment.bytes of
    (uncleaned) data, and offsets within int32 of the run's base."""
    groups: list[range] = []
    start = 0
    total = 0
    for i, size in enumerate(sizes):
        end = bases[i + 1] if i + 1 < len(bases) else cut
        too_big = total + size > segment_bytes
        too_wide = end - bases[start] > MAX_RELATIVE_OFFSET
        if i > start and (too_big or too_wide):
            groups.append(range(start, i))
            start, total = i, 0
        total += size
    groups.append(range(start, len(sizes)))
    return groups


class RewriteJob(NamedTuple):
    """What a cleaning pass reads and writes (files only: it may run in another process)."""

    directory: Path
    segments: list[tuple[int, Path, int]]  # the cleanable segments: (base offset, path, size)
    dirty_index: int  # segments[dirty_index:] are dirty
    cut: int  # the first offset not cleanable
    later: list[tuple[Path, int]]  # the segments after them (their headers only are read)
    config: LogConfig
    now_ms: int
    max_map_entries: int
    # Names this pass's files (``B.log.<token>.cleaned``): a pass never writes into a file of
    # another one, e.g. of an orphaned child still running after its replica was killed.
    token: str = ""
    # The aborted transactions overlapping the cleanable segments (their .txnindex entries).
    aborted: tuple[AbortedTxn, ...] = ()


class Rewritten(NamedTuple):
    """What :func:`rewrite_segments` wrote: ``.cleaned`` files for ``segments[:count]``."""

    count: int  # the segments cleaned (fewer than asked when the offset map filled)
    cut: int  # the first offset not cleaned: the next first dirty offset
    groups: list[CleanedGroup]
    removed: int  # records removed
    horizon: int  # the earliest delete horizon of a kept batch, -1: none
    failure: str | None = None  # a write failed (nothing to swap in; files removed)


RewriteRunner = Callable[[RewriteJob], Rewritten]


def rewrite_segments(job: RewriteJob, fsync: Callable[[int], None] = os.fdatasync) -> Rewritten:
    """Phases 1-3 of a cleaning pass: the offset map of the dirty part, each producer's last
    batch, and a ``.cleaned`` file per merged group (fsync'd). Reads the segment files and
    writes new files only, never the log's state, so it can run in a child process.

    Raises FileNotFoundError (a segment went meanwhile), KafkaStorageError or
    CorruptRecordError (bytes it cannot read); a failed write (OSError) removes what it wrote
    and is returned as ``failure``.
    """
    segments, config = job.segments, job.config
    # 1. The offset map of the dirty part, segment by segment, while it has room.
    offset_map = cleaner.OffsetMap(job.max_map_entries)
    count = len(segments)
    map_filter = cleaner.TxnFilter(job.aborted)  # aborted records never enter the map
    for i in range(job.dirty_index, len(segments)):
        if offset_map.full and i > job.dirty_index:
            count = i  # the map is full: clean up to here, the rest next time
            break
        _, path, size = segments[i]
        for _, header, data in _file_batches(path, size):
            if not header.is_control and not map_filter.data_batch(header):
                offset_map.add_batch(data, header)
    cut = job.cut if count == len(segments) else segments[count][0]
    later = [(path, size) for _, path, size in segments[count:]] + job.later
    # 2. Each producer's last batch in the log: kept (maybe empty) for its sequence.
    last_of_producer: dict[int, int] = {}
    for _, path, size in segments[:count]:
        for _, header in _file_headers(path, size):
            if header.producer_id >= 0:
                last_of_producer[header.producer_id] = header.base_offset
    for path, size in later:
        for _, header in _file_headers(path, size):
            last_of_producer.pop(header.producer_id, None)
    # 3. Rewrite, group by group.
    bases = [base for base, _, _ in segments[:count]]
    sizes = [size for _, _, size in segments[:count]]
    written: list[CleanedGroup] = []
    removed = 0
    horizon = -1
    txn_filter = cleaner.TxnFilter(job.aborted)  # fed every batch of the pass, in order
    for group in _group_segments(bases, sizes, cut, config.segment_bytes):
        try:
            out, group_removed, group_horizon = _write_group(
                job, group, offset_map, txn_filter, last_of_producer, fsync
            )
        except FileNotFoundError:
            for done in written:
                done.path.unlink(missing_ok=True)
            raise
        except OSError as exc:
            for done in written:
                done.path.unlink(missing_ok=True)
            return Rewritten(count, cut, [], 0, -1, failure=str(exc))
        written.append(out)
        removed += group_removed
        if group_horizon >= 0 and (horizon < 0 or group_horizon < horizon):
            horizon = group_horizon
    return Rewritten(count, cut, written, removed, horizon)


def _write_group(
    job: RewriteJob,
    group: range,
    offset_map: cleaner.OffsetMap,
    txn_filter: cleaner.TxnFilter,
    last_of_producer: dict[int, int],
    fsync: Callable[[int], None],
) -> tuple[CleanedGroup, int, int]:
    """Write one group's cleaned ``.cleaned`` file (fsync'd); returns it, the records
    removed and the earliest delete horizon its kept batches carry (-1: none)."""
    base = job.segments[group.start][0]
    path = job.directory / f"{base:020d}{LOG_SUFFIX}.{job.token}{CLEANED_SUFFIX}"
    headers: list[tuple[int, rb.BatchHeader]] = []
    removed = 0
    horizon = -1
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pending: list[bytes | memoryview] = []
        pending_bytes = 0
        pos = 0
        for i in group:
            _, segment_path, size = job.segments[i]
            for _, header, data in _file_batches(segment_path, size):
                keep_if_empty = last_of_producer.get(header.producer_id) == header.base_offset
                if header.is_control:
                    marker = rb.parse_end_txn_marker(data, header)
                    result = cleaner.clean_control_batch(
                        data,
                        header,
                        txn_data_gone=txn_filter.control_batch(header, marker),
                        now_ms=job.now_ms,
                        delete_retention_ms=job.config.delete_retention_ms,
                        keep_if_empty=keep_if_empty,
                    )
                else:
                    result = cleaner.clean_batch(
                        data,
                        header,
                        offset_map,
                        now_ms=job.now_ms,
                        delete_retention_ms=job.config.delete_retention_ms,
                        keep_if_empty=keep_if_empty,
                        aborted=txn_filter.data_batch(header),
                    )
                removed += result.records_removed
                if result.data is None:
                    continue
                out = result.data
                new_header = rb.parse_header(out) if out is not data else header
                headers.append((pos, new_header))
                pos += new_header.size
                if result.delete_horizon_ms >= 0 and (
                    horizon < 0 or result.delete_horizon_ms < horizon
                ):
                    horizon = result.delete_horizon_ms
                pending.append(out)
                pending_bytes += len(out)
                if pending_bytes >= SCAN_CHUNK_BYTES:
                    pwrite_all(fd, pending, pos - pending_bytes)
                    pending, pending_bytes = [], 0
        if pending:
            pwrite_all(fd, pending, pos - pending_bytes)
        fsync(fd)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return CleanedGroup(base, path, group, headers, pos), removed, horizon
