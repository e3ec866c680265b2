"""Reads of a log's segments: whole stored batches from an offset (CRC-checked), where those
batches lie on disk for a reader that reads the files itself (:class:`Extents`, headers
only), the batch a timestamp falls in (ListOffsets), and header walks.

Functions here take the log's :class:`SegmentList` and run under the Log's lock, after its
range checks (:meth:`Log.read` states the rules a read follows). A stored batch is checked
before it is used: a header that cannot be one (magic, length, past the file's end) or a
CRC-32C that fails raises :class:`DamagedBatchError` (a KafkaStorageError naming where the
damage starts), so corrupt bytes are never served.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from raylog.storage import batch as rb
from raylog.storage.errors import KafkaStorageError, RaylogError
from raylog.storage.log.segment import Segment
from raylog.storage.log.segment_list import SegmentList

# ListOffsets' special timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

# Header walks (Log.batch_headers) read this much at a time.
HEADER_SCAN_CHUNK_BYTES = 1 << 20
# locate() reads batch headers through a window of this size (one read per large batch).
HEADER_WINDOW_BYTES = 16 << 10


class DamagedBatchError(KafkaStorageError):
    """A stored batch fails its checks: the log is damaged from ``offset`` on (the batch's
    base offset when only its CRC-32C fails; its segment's base offset when its header cannot
    be one, since the header's offsets cannot be trusted then)."""

    def __init__(self, message: str, offset: int = -1) -> None:
        super().__init__(message)
        self.offset = offset


class TimestampOffset(NamedTuple):
    """Answer of :meth:`Log.offset_for_timestamp`."""

    timestamp: int
    offset: int


class Extents(NamedTuple):
    """Batches as :meth:`Log.read_extents` locates them: ``(segment file, position, size)``
    runs in order, and the offsets they span (the first batch's base offset, the offset after
    the last batch; -1 and -1 for none)."""

    runs: tuple[tuple[str, int, int], ...]
    first_offset: int
    next_offset: int


def collect(
    segments: SegmentList, offset: int, max_bytes: int, limit: int
) -> list[bytes | memoryview]:
    """The batches a read from ``offset`` returns, each CRC-checked, below offset ``limit``
    and within ``max_bytes`` (the first batch whole whatever its size).

    Each is a view of the chunk it was read in: a caller joins them once (one copy after the
    read)."""
    out: list[bytes | memoryview] = []
    total = 0
    i = segments.index_of(offset)
    seg = segments.open(i)
    pos = seg.lookup_position(offset)
    while True:
        if pos >= seg.size:
            i += 1
            if i >= len(segments):
                break
            seg = segments.open(i)
            pos = 0
            continue
        # Read what the budget allows (at least a header), then walk whole batches.
        want = max(max_bytes - total, rb.HEADER_SIZE)
        chunk = seg.read(pos, want)
        view = memoryview(chunk)
        at = 0
        done = False
        while len(chunk) - at >= rb.HEADER_SIZE:
            header = rb.parse_header(chunk, at)
            check_stored(seg, pos + at, header, offset)
            if header.next_offset <= offset:  # before the wanted batch: skip it
                at += header.size
                continue
            if header.last_offset >= limit:
                done = True
                break
            if total and total + header.size > max_bytes:
                done = True
                break
            if header.size > len(chunk) - at:
                if at:
                    break  # the chunk began at skipped batches: re-read from this one
                if total:  # cannot happen (the budget check above), but never split
                    done = True
                    break
                # The chunk began here with the whole budget, and this first batch is
                # larger than max_bytes: served whole anyway.
                data = seg.read(pos + at, header.size)
                _verify_stored(seg, pos + at, data, 0, header)
                out.append(data)
                total += header.size
                at += header.size
                done = True
                break
            _verify_stored(seg, pos + at, chunk, at, header)
            out.append(view[at : at + header.size])
            total += header.size
            at += header.size
        if done or (total and total >= max_bytes):
            break
        if at == 0 and len(chunk) < rb.HEADER_SIZE:
            raise KafkaStorageError(f"{seg.log_path} truncated under a read at byte {pos}")
        pos += at
    return out


def locate(segments: SegmentList, offset: int, max_bytes: int, limit: int) -> Extents:
    """:func:`collect`'s walk over batch headers alone: the same batches, as runs of files.

    Headers are read through a small window, so a walk over small batches reads each window
    once and one over large batches reads one window per batch. CRCs are the reader's to
    check."""
    runs: list[tuple[str, int, int]] = []
    total = 0
    first = next_offset = -1
    i = segments.index_of(offset)
    seg = segments.open(i)
    path = os.path.abspath(seg.log_path)  # absolute: the reader's working directory is its own
    pos = seg.lookup_position(offset)
    window, window_pos = b"", 0
    while True:
        if pos >= seg.size:
            i += 1
            if i >= len(segments):
                break
            seg = segments.open(i)
            path = os.path.abspath(seg.log_path)
            pos = 0
            window = b""
            continue
        at = pos - window_pos
        if not window or at < 0 or at + rb.HEADER_SIZE > len(window):
            window, window_pos, at = seg.read(pos, HEADER_WINDOW_BYTES), pos, 0
            if len(window) < rb.HEADER_SIZE:
                raise KafkaStorageError(f"{seg.log_path} truncated under a read at byte {pos}")
        header = rb.parse_header(window, at)
        check_stored(seg, pos, header, offset)
        if header.next_offset <= offset:  # before the wanted batch: skip it
            pos += header.size
            continue
        if header.last_offset >= limit or (total and total + header.size > max_bytes):
            break
        if runs and runs[-1][0] == path and runs[-1][1] + runs[-1][2] == pos:
            runs[-1] = (path, runs[-1][1], runs[-1][2] + header.size)
        else:
            runs.append((path, pos, header.size))
        if first < 0:
            first = header.base_offset
        next_offset = header.next_offset
        total += header.size
        pos += header.size
        if total >= max_bytes:
            break
    return Extents(tuple(runs), first, next_offset)


def offset_for_timestamp(
    segments: SegmentList, log_start_offset: int, timestamp_ms: int
) -> TimestampOffset | None:
    """The first batch at or above the log start offset whose maxTimestamp is >=
    ``timestamp_ms``: (its maxTimestamp, its base offset, or the log start offset when the
    batch holds it); None when no batch is that late."""
    for i, seg in enumerate(segments):
        if seg.size == 0 or seg.max_timestamp < timestamp_ms:
            continue
        seg = segments.open(i)
        pos = seg.lookup_timestamp_position(timestamp_ms)
        while pos < seg.size:
            header = rb.parse_header(seg.read(pos, rb.HEADER_SIZE))
            check_stored(seg, pos, header, -1)
            if header.last_offset >= log_start_offset and header.max_timestamp >= timestamp_ms:
                return TimestampOffset(
                    header.max_timestamp, max(header.base_offset, log_start_offset)
                )
            pos += header.size
    return None


def max_timestamp_batch(segments: SegmentList, log_start_offset: int) -> TimestampOffset | None:
    """ListOffsets' MAX_TIMESTAMP (KIP-734): the first batch at or above the log start offset
    with the largest maxTimestamp: (that maxTimestamp, its base offset, or the log start offset
    when the batch holds it); None in an empty log. Segments are visited by their own largest
    timestamp, highest first, until none left can hold a later batch: one segment's batch
    headers are read in the usual case (a segment's largest timestamp may belong to a batch
    below the log start, which is why the walk goes on)."""
    best: TimestampOffset | None = None
    order = sorted(range(len(segments)), key=lambda i: -segments[i].max_timestamp)
    for i in order:  # sorted() is stable: among equal timestamps, the earlier segment first
        if segments[i].size == 0 or (best is not None and segments[i].max_timestamp <= best[0]):
            continue
        seg = segments.open(i)
        pos = 0
        while pos < seg.size:
            header = rb.parse_header(seg.read(pos, rb.HEADER_SIZE))
            check_stored(seg, pos, header, -1)
            if header.last_offset >= log_start_offset and (
                best is None or header.max_timestamp > best[0]
            ):
                best = TimestampOffset(
                    header.max_timestamp, max(header.base_offset, log_start_offset)
                )
            pos += header.size
    return best


def first_position_at_or_after(seg: Segment, offset: int) -> int:
    """Position of the first batch of ``seg`` whose last offset is >= ``offset`` (the
    segment's size when none is); 0 for its base offset, without reading (a truncation there
    drops a segment whose first header may be damaged)."""
    if offset <= seg.base_offset:
        return 0
    pos = seg.lookup_position(offset)
    while pos < seg.size:
        header = rb.parse_header(seg.read(pos, rb.HEADER_SIZE))
        check_stored(seg, pos, header, offset)
        if header.last_offset >= offset:
            return pos
        pos += header.size
    return seg.size


def chunk_headers(
    seg: Segment, pos: int, chunk: bytes, *, markers: bool = False
) -> tuple[list[tuple[rb.BatchHeader, rb.EndTxnMarker | None]], int]:
    """The headers of the batches starting in ``chunk`` (read at ``pos`` of ``seg``), and how
    many bytes those batches take: a header walk goes on from there.

    With ``markers`` each control batch's transaction marker comes with its header (None for
    every other batch): a control batch is read whole, from the chunk when it lies inside it,
    else the chunk ends before it, unless it is the chunk's first batch, read on its own."""
    headers: list[tuple[rb.BatchHeader, rb.EndTxnMarker | None]] = []
    at = 0
    while len(chunk) - at >= rb.HEADER_SIZE:
        header = rb.parse_header(chunk, at)
        check_stored(seg, pos + at, header, -1)
        marker = None
        if markers and header.is_control:
            if at + header.size <= len(chunk):
                whole: bytes | memoryview = memoryview(chunk)[at : at + header.size]
            elif headers:
                break  # the next chunk starts with it
            else:
                whole = seg.read(pos, header.size)
            try:
                marker = rb.parse_end_txn_marker(whole, header)
            except RaylogError as exc:
                raise KafkaStorageError(f"{seg.log_path} at byte {pos + at}: {exc}") from exc
        headers.append((header, marker))
        at += header.size
    if not headers:
        raise KafkaStorageError(f"{seg.log_path}: short batch header at byte {pos}")
    return headers, at


def check_stored(seg: Segment, pos: int, header: rb.BatchHeader, offset: int) -> None:
    """Raise DamagedBatchError unless ``header`` (at ``pos``) can be a stored batch's."""
    if (
        header.magic != rb.MAGIC
        or header.batch_length < rb.MIN_BATCH_LENGTH
        or pos + header.size > seg.size
        or header.last_offset_delta < 0
    ):
        raise DamagedBatchError(
            f"corrupt batch header at byte {pos} of {seg.log_path} (reading offset {offset})",
            seg.base_offset,
        )


def _verify_stored(seg: Segment, pos: int, buf: bytes, at: int, header: rb.BatchHeader) -> None:
    if not rb.crc_ok(buf, at, header):
        raise DamagedBatchError(
            f"stored batch at byte {pos} of {seg.log_path} (offset {header.base_offset}) "
            "fails its CRC-32C; not served",
            max(header.base_offset, seg.base_offset),
        )
