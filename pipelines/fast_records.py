"""The vectorised record decoder: uncompressed records sections in, Arrow columns out.

The fast path of :mod:`raylog.pipelines.records` (which owns the decompression and the
reference decoder, a per-record Python loop kept as the specification); the record layout
and its rules are those of :mod:`raylog.storage.records`. Pure: no Ray, no I/O. The records
sections of all wanted batches of one fetch response are joined into one buffer and decoded
together, in three steps:

1. One sequential pass reads, for every record, where it ends and its fields up to the
   headers (the layout's ``RECORD_FIELDS``): timestampDelta, offsetDelta, and the position
   and length of its key and value. It runs in C (``_record_scan.c``, built at install time:
   ``record_fields``, the layout's function of that name in C). Where that extension was not
   built, its twin does the same in two steps: the layout's walk of the lengths finds where each
   record ends (:func:`record_ends_python`), then numpy decodes the fields of every record at
   once, field by field (:func:`record_fields_numpy`). Tests check that the C scanner, the
   twins and the layout's walk agree.
2. numpy turns the deltas into offsets and timestamps and picks the rows in the window; the
   headers, when asked for, are decoded by numpy looping over the header index, never over
   records. Varints are the layout's: zigzag LEB128 of at most ``VARINT_MAX_BYTES``.
3. Key and value columns are copied out of the joined buffer into Arrow binary arrays, by C
   (``gather``) or, without the extension, by Arrow's ``take`` over a view of the buffer.

The fast path decodes exactly what the reference decodes and nothing else. Whenever the input
is anything but well formed (a length past its record, a varint past 64 bits, an offset delta
outside ``[0, 2**31)``, a timestamp that overflows int64, a header key that is not UTF-8, a
buffer of 2 GiB or more), it raises :class:`Unfit` and the caller runs the reference decoder,
which raises the precise error (or decodes the oddity). numpy checks every byte index against
its record's end before it reads it; the joined buffer carries ``PAD`` zero bytes so that a
varint read from a position at most its record's end stays inside the buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from raylog.storage import records as layout
from raylog.storage.batch import BatchHeader
from raylog.storage.errors import CorruptRecordError

try:
    from raylog.storage import _record_scan  # type: ignore[attr-defined]
except ImportError:  # the C extension is optional (no compiler at install time)
    _record_scan = None

Buffer = bytes | bytearray | memoryview

PAD = 16  # >= the longest varint, layout.VARINT_MAX_BYTES
_INT64_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)
_OFFSET_DELTA_LIMIT = 1 << 31
_BUFFER_SIZE_MAX = (1 << 31) - 1 - PAD  # Arrow binary offsets are int32

_HEADER_FIELDS = [pa.field("key", pa.string()), pa.field("value", pa.binary())]
HEADER_TYPE = pa.list_(pa.struct(_HEADER_FIELDS))


class Unfit(Exception):  # a signal to the caller, not an error of the input
    """The input is not one the fast path decodes exactly; run the reference decoder."""


class Chunk(NamedTuple):
    """The decoded rows of one call, column by column (topic and partition are constants)."""

    keys: pa.Array
    values: pa.Array
    offsets: pa.Array
    timestamps: pa.Array
    timestamp_types: pa.Array
    headers: pa.Array | None


def decode(
    sections: Sequence[tuple[BatchHeader, Buffer]],
    start_offset: int,
    end_offset: int,
    include_headers: bool,
) -> Chunk | None:
    """The records with ``start_offset <= offset < end_offset`` of the given batches.

    ``sections`` are (header, uncompressed records section) of non-control batches whose
    recordsCount the caller has checked. Returns None when no record is in the window.
    Raises Unfit for any input the reference decoder must handle.
    """
    if not sections or start_offset < _INT64_MIN or end_offset > _INT64_MAX:
        raise Unfit("window outside int64")
    blob = b"".join([*(data for _, data in sections), bytes(PAD)])
    size = len(blob) - PAD
    if size > _BUFFER_SIZE_MAX:
        raise Unfit("records sections of 2 GiB or more")
    u8 = np.frombuffer(blob, dtype=np.uint8)
    ends, ts_delta, offset_delta, key_pos, key_len, value_pos, value_len, pos = record_fields(
        blob, sections
    )
    counts = [h.records_count for h, _ in sections]
    per_record = np.repeat(np.arange(len(sections)), counts)

    offsets = _offsets(sections, per_record, offset_delta)
    rows = _window(offsets, start_offset, end_offset)
    if rows is None:
        return None
    timestamps, log_append = _timestamps(sections, per_record[rows], ts_delta[rows])
    buffer = pa.py_buffer(blob)
    headers = None
    if include_headers:
        headers = _headers(u8, buffer, pos[rows], ends[rows])
    return Chunk(
        keys=_binary(buffer, key_pos[rows], key_len[rows], pa.binary()),
        values=_binary(buffer, value_pos[rows], value_len[rows], pa.binary()),
        offsets=pa.array(offsets[rows], pa.int64()),
        timestamps=pa.array(timestamps, pa.int64()).cast(pa.timestamp("ms")),
        timestamp_types=pa.array(log_append.astype(np.int32), pa.int32()),
        headers=headers,
    )


def _window(offsets: np.ndarray, start_offset: int, end_offset: int) -> slice | np.ndarray | None:
    """The rows with ``start_offset <= offset < end_offset``: a slice when they are one run,
    the usual case (a window cuts only its first and last batches), which numpy takes as a
    view where indices would copy every column; else their indices; None when there are none.
    """
    keep = (offsets >= start_offset) & (offsets < end_offset)
    first = int(keep.argmax())
    if not keep[first]:
        return None
    end = len(keep) - int(keep[::-1].argmax())
    if keep[first:end].all():
        return slice(first, end)
    return np.flatnonzero(keep)


def record_ends(blob: bytes, sections: Sequence[tuple[BatchHeader, Buffer]]) -> np.ndarray:
    """Where each record ends in ``blob`` (step 1), by the C extension if it was built."""
    if _record_scan is None:
        return np.array(record_ends_python(blob, sections), dtype=np.int64)
    counts = [header.records_count for header, _ in sections]
    sizes = [len(data) for _, data in sections]
    try:
        return np.frombuffer(_record_scan.record_ends(blob, counts, sizes), dtype=np.int64)
    except ValueError as exc:
        raise Unfit(str(exc)) from exc


Fields = tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray
]


def record_fields(blob: bytes, sections: Sequence[tuple[BatchHeader, Buffer]]) -> Fields:
    """Steps 1 and 2's varints: for every record, where it ends, its timestampDelta and
    offsetDelta, its key's position and length, its value's position and length, and where
    its headers start. In one C pass if the extension was built, else by numpy."""
    if _record_scan is None:
        return record_fields_numpy(blob, sections)
    counts = [header.records_count for header, _ in sections]
    sizes = [len(data) for _, data in sections]
    try:
        fields = _record_scan.record_fields(blob, counts, sizes)
    except ValueError as exc:
        raise Unfit(str(exc)) from exc
    columns = np.frombuffer(fields, dtype=np.int64).reshape(-1, 8).T
    return tuple(columns)  # type: ignore[return-value]


def record_fields_numpy(blob: bytes, sections: Sequence[tuple[BatchHeader, Buffer]]) -> Fields:
    """:func:`record_fields` by numpy, field by field over all records (the C pass's twin)."""
    ends = record_ends(blob, sections)
    u8 = np.frombuffer(blob, dtype=np.uint8)
    starts = np.empty_like(ends)
    if ends.size:
        starts[0] = 0
        starts[1:] = ends[:-1]
    _, pos = _varints(u8, starts, ends)  # the record length, already checked by record_ends
    pos += 1  # attributes: unused
    ts_delta, pos = _varints(u8, pos, ends)
    offset_delta, pos = _varints(u8, pos, ends)
    key_len, pos = _varints(u8, pos, ends)
    key_pos = pos
    pos = _skip(pos, key_len, ends)
    value_len, pos = _varints(u8, pos, ends)
    value_pos = pos
    pos = _skip(pos, value_len, ends)
    return ends, ts_delta, offset_delta, key_pos, key_len, value_pos, value_len, pos


def record_ends_python(blob: bytes, sections: Sequence[tuple[BatchHeader, Buffer]]) -> list[int]:
    """:func:`record_ends` in Python: the record layout's walk of the lengths
    (:func:`raylog.storage.records.record_ends`), which checks what the reference checks of the
    framing: positive lengths, records inside their section, the last record ending it."""
    counts = [header.records_count for header, _ in sections]
    sizes = [len(data) for _, data in sections]
    try:
        return layout.record_ends(blob, counts, sizes)
    except CorruptRecordError as exc:
        raise Unfit(str(exc)) from exc


def _varints(u8: np.ndarray, pos: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varint at each ``pos`` (as int64) and the position after each.

    Raises Unfit if a position is past its end, a varint runs past its end or past 64 bits.
    """
    if (pos > ends).any():
        raise Unfit("field past its record")
    b = u8[pos]  # pos <= end <= len(u8) - PAD: inside
    value = (b & 0x7F).astype(np.uint64)
    after = pos + 1
    more = np.flatnonzero(b >= 0x80)
    for i in range(1, layout.VARINT_MAX_BYTES):
        if not more.size:
            break
        b = u8[pos[more] + i]  # i < PAD: inside
        if i == layout.VARINT_MAX_BYTES - 1 and (b > 1).any():
            raise Unfit("varint past 64 bits")
        value[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * i)
        after[more] += 1
        more = more[b >= 0x80]
    if (after > ends).any():
        raise Unfit("varint past its record")
    signed = (value >> np.uint64(1)) ^ (np.uint64(0) - (value & np.uint64(1)))
    return signed.view(np.int64), after


def _skip(pos: np.ndarray, length: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``pos`` past a field of ``length`` bytes (negative: null, no bytes), inside its record."""
    if (length > ends - pos).any():  # compared before adding: a huge length cannot wrap
        raise Unfit("field past its record")
    return pos + np.maximum(length, 0)


def _offsets(
    sections: Sequence[tuple[BatchHeader, Buffer]], per_record: np.ndarray, delta: np.ndarray
) -> np.ndarray:
    bases = [h.base_offset for h, _ in sections]
    if max(bases) > _INT64_MAX - _OFFSET_DELTA_LIMIT:
        raise Unfit("base offset too close to int64's limit")
    if ((delta < 0) | (delta >= _OFFSET_DELTA_LIMIT)).any():
        raise Unfit("offset delta outside [0, 2**31)")
    return np.array(bases, dtype=np.int64)[per_record] + delta


def _timestamps(
    sections: Sequence[tuple[BatchHeader, Buffer]], per_record: np.ndarray, delta: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's timestamp (CreateTime: base + delta; LogAppendTime: the batch's max) and
    whether it is a LogAppendTime."""
    base = np.array([h.base_timestamp for h, _ in sections], dtype=np.int64)[per_record]
    max_ts = np.array([h.max_timestamp for h, _ in sections], dtype=np.int64)[per_record]
    log_append = np.array([h.is_log_append_time for h, _ in sections], dtype=bool)[per_record]
    summed = base + delta  # wraps on overflow: detected below
    overflow = ((delta > 0) & (summed < base)) | ((delta < 0) & (summed > base))
    if (overflow & ~log_append).any():
        raise Unfit("timestamp overflows int64")
    return np.where(log_append, max_ts, summed), log_append


def _headers(u8: np.ndarray, buffer: pa.Buffer, pos: np.ndarray, ends: np.ndarray) -> pa.Array:
    """The headers of the given records (``pos``: where each record's header count is).

    Loops over the header index (0, 1, ...), each pass decoding that header of every record
    that has one; a header lands at ``list_offsets[record] + index`` in the flat columns.
    """
    pos = pos.copy()
    count, pos = _varints(u8, pos, ends)
    if ((count < 0) | (count > ends - pos)).any():  # a header takes at least 2 bytes
        raise Unfit("header count")
    list_offsets = np.zeros(len(count) + 1, dtype=np.int64)
    np.cumsum(count, out=list_offsets[1:])
    total = int(list_offsets[-1])
    key_pos = np.empty(total, dtype=np.int64)
    key_len = np.empty(total, dtype=np.int64)
    value_pos = np.empty(total, dtype=np.int64)
    value_len = np.empty(total, dtype=np.int64)
    active = np.flatnonzero(count > 0)
    index = 0
    while active.size:  # bounded: each pass drops the records with exactly `index` headers
        slot = list_offsets[active] + index
        p, end = pos[active], ends[active]
        n, p = _varints(u8, p, end)
        if (n < 0).any():
            raise Unfit("null header key")
        key_pos[slot], key_len[slot] = p, n
        p = _skip(p, n, end)
        n, p = _varints(u8, p, end)
        value_pos[slot], value_len[slot] = p, n
        pos[active] = _skip(p, n, end)
        index += 1
        active = active[count[active] > index]
    if (pos != ends).any():
        raise Unfit("bytes after the headers")
    keys = _utf8(_binary(buffer, key_pos, key_len, pa.binary()))
    values = _binary(buffer, value_pos, value_len, pa.binary())
    entries = pa.StructArray.from_arrays([keys, values], fields=_HEADER_FIELDS)
    return pa.ListArray.from_arrays(pa.array(list_offsets.astype(np.int32)), entries, HEADER_TYPE)


def _utf8(keys: pa.Array) -> pa.Array:
    """Header keys as strings, checked as the reference checks them (Python's strict UTF-8).

    All-ASCII keys (the usual case) need no per-key check; otherwise each key is decoded by
    Python, so that exactly what Python rejects (surrogates, overlongs, split characters) is
    rejected.
    """
    data = keys.buffers()[2]
    if data is not None and data.size and np.frombuffer(data, dtype=np.uint8).max() >= 0x80:
        try:
            for key in keys.to_pylist():
                key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Unfit("header key not UTF-8") from exc
    return keys.view(pa.string())


def _binary(buffer: pa.Buffer, pos: np.ndarray, length: np.ndarray, type_: pa.DataType) -> pa.Array:
    """The fields at ``pos`` of ``length`` bytes (negative: null) as a fresh binary array,
    copied out by C (``gather``) if the extension was built, else by Arrow."""
    n = len(pos)
    valid = length >= 0
    if _record_scan is None:
        return _binary_by_take(buffer, pos, length, valid, type_)
    try:
        offsets, data = _record_scan.gather(
            buffer, np.ascontiguousarray(pos, np.int64), np.ascontiguousarray(length, np.int64)
        )
    except ValueError as exc:
        raise Unfit(str(exc)) from exc
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(type_, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)])


def _binary_by_take(
    buffer: pa.Buffer, pos: np.ndarray, length: np.ndarray, valid: np.ndarray, type_: pa.DataType
) -> pa.Array:
    """:func:`_binary` by Arrow: ``buffer`` is viewed as 2n elements: field i, then the bytes
    from its end to field i+1 (fields are in buffer order and do not overlap, so the offsets
    rise); ``take`` copies the even ones out."""
    n = len(pos)
    bounds = np.empty(2 * n + 1, dtype=np.int32)
    bounds[0 : 2 * n : 2] = pos
    bounds[1 : 2 * n : 2] = pos + np.maximum(length, 0)
    bounds[2 * n] = bounds[2 * n - 1] if n else 0
    bitmap = None
    if not valid.all():
        bits = np.zeros(2 * n, dtype=bool)
        bits[0::2] = valid
        bitmap = pa.py_buffer(np.packbits(bits, bitorder="little"))
    spans = pa.Array.from_buffers(type_, 2 * n, [bitmap, pa.py_buffer(bounds), buffer])
    spans.validate()  # offsets inside the buffer: a guard, true by construction
    return spans.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))
