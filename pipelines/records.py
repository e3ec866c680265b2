"""Record decoding for readers: RecordBatch v2 bytes in, Arrow rows out.

The batch header is :mod:`raylog.storage.batch`'s and the record layout
:mod:`raylog.storage.records`'s; this module turns records into rows. Pure: no Ray, no I/O.

Output columns are those of Spark's Kafka source, so a raylog topic reads like a Kafka topic:

| column        | Arrow type                                 | Spark type                       |
|---------------|--------------------------------------------|----------------------------------|
| key           | binary                                     | binary                           |
| value         | binary                                     | binary                           |
| topic         | string                                     | string                           |
| partition     | int32                                      | int                              |
| offset        | int64                                      | long                             |
| timestamp     | timestamp[ms]                              | timestamp                        |
| timestampType | int32 (0 CreateTime, 1 LogAppendTime)      | int                              |
| headers       | list<struct<key: string, value: binary>>   | array<struct<key, value>>        |

``headers`` is present only when asked for (Spark's ``includeHeaders``).

Compression: every codec Kafka clients use, decompressed by :mod:`raylog.storage.compression`.

Control batches (transaction markers) never become rows, in either isolation level, as
consumers skip them. For read_committed, the records of aborted transactions are dropped as
Kafka's consumer drops them (:class:`AbortedTransactions`), given the aborted transactions the
replica's answer names.

Two decoders, one result. ``decode_into_reference`` (a Python loop over records, below) is the
specification. ``decode_into`` runs the vectorised decoder of :mod:`raylog.pipelines.fast_records`
on responses of at least ``FAST_MIN_RECORDS`` records, and the reference on smaller ones and on
any input the fast decoder declines (corrupt or merely odd): errors are always the reference's.
tests/pipelines/test_records_fast.py checks that the two return the same Arrow rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

from raylog.pipelines import fast_records
from raylog.storage import batch as rb
from raylog.storage.compression import (
    CODEC_NAMES,
    CODEC_NONE,
    decompress,
)
from raylog.storage.errors import CorruptRecordError, RaylogError
from raylog.storage.records import read_headers, record_fields

Buffer = bytes | bytearray | memoryview

# Below this many records in a fetch response the reference decoder is faster: the fast one
# costs a few hundred numpy and Arrow calls per response, whatever its size (benchmarks/decode.py).
FAST_MIN_RECORDS = 256

TIMESTAMP_TYPE_CREATE_TIME = 0
TIMESTAMP_TYPE_LOG_APPEND_TIME = 1

# list<struct<key: string, value: binary>>, defined beside the fast decoder that builds it.
HEADER_TYPE = fast_records.HEADER_TYPE


def schema(include_headers: bool = False) -> pa.Schema:
    """The Arrow schema of decoded rows (see the module's column table)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("ms")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


# ---------------------------------------------------------------------------------------------
# Records.


class _Columns:
    """The rows of one decode call: column chunks from the fast decoder, in order, and the rows
    of the reference decoder as Python lists (made into a chunk before the next fast chunk and
    at the end, so rows keep their order)."""

    __slots__ = (
        "chunks",
        "headers",
        "keys",
        "offsets",
        "timestamp_types",
        "timestamps",
        "values",
    )

    def __init__(self, include_headers: bool) -> None:
        self.chunks: list[fast_records.Chunk] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.timestamp_types: list[int] = []
        self.headers: list[list[tuple[str, bytes | None]]] | None = [] if include_headers else None

    @property
    def include_headers(self) -> bool:
        return self.headers is not None

    def add_chunk(self, chunk: fast_records.Chunk) -> None:
        if self.offsets:
            self._flush_rows()
        self.chunks.append(chunk)

    def take_chunks(self) -> list[fast_records.Chunk]:
        """All rows as chunks (at least one, possibly empty); the lists are left empty."""
        if self.offsets or not self.chunks:
            self._flush_rows()
        return self.chunks

    def _flush_rows(self) -> None:
        self.chunks.append(
            fast_records.Chunk(
                keys=pa.array(self.keys, pa.binary()),
                values=pa.array(self.values, pa.binary()),
                offsets=pa.array(self.offsets, pa.int64()),
                timestamps=pa.array(self.timestamps, pa.int64()).cast(pa.timestamp("ms")),
                timestamp_types=pa.array(self.timestamp_types, pa.int32()),
                headers=None if self.headers is None else pa.array(self.headers, HEADER_TYPE),
            )
        )
        for rows in (self.keys, self.values, self.offsets, self.timestamps):
            rows.clear()
        self.timestamp_types.clear()
        if self.headers is not None:
            self.headers.clear()


def _decode_records(
    data: bytes,
    header: rb.BatchHeader,
    start_offset: int,
    end_offset: int,
    cols: _Columns,
) -> None:
    """Append the records of one batch (``data`` = its uncompressed records section) with
    ``start_offset <= offset < end_offset``, as rows.

    Records are walked, and checked, by :func:`raylog.storage.records.record_fields`; the
    headers are read (and checked) only when asked for, and only for the rows returned.
    """
    base_offset = header.base_offset
    log_append = header.is_log_append_time
    base_ts = header.base_timestamp
    max_ts = header.max_timestamp
    ts_type = TIMESTAMP_TYPE_LOG_APPEND_TIME if log_append else TIMESTAMP_TYPE_CREATE_TIME
    keys, values, offsets = cols.keys, cols.values, cols.offsets
    timestamps, ts_types, headers_out = cols.timestamps, cols.timestamp_types, cols.headers
    for fields in record_fields(data, header.records_count):
        end, ts_delta, offset_delta, key_pos, key_length, value_pos, value_length, at = fields
        offset = base_offset + offset_delta
        if not start_offset <= offset < end_offset:
            continue
        keys.append(data[key_pos : key_pos + key_length] if key_length >= 0 else None)
        values.append(data[value_pos : value_pos + value_length] if value_length >= 0 else None)
        offsets.append(offset)
        timestamps.append(max_ts if log_append else base_ts + ts_delta)
        ts_types.append(ts_type)
        if headers_out is not None:
            headers_out.append(read_headers(data, at, end))


def decode_batches(
    buf: Buffer,
    *,
    topic: str,
    partition: int,
    start_offset: int = 0,
    end_offset: int = (1 << 63) - 1,
    include_headers: bool = False,
    verify_crc: bool = True,
    aborted_transactions: Iterable[tuple[int, int]] | None = None,
) -> pa.RecordBatch:
    """Decode concatenated v2 batches into one Arrow RecordBatch of :func:`schema` columns.

    Rows are the records with ``start_offset <= offset < end_offset`` (a fetch may return a
    batch that starts before the fetch offset). Control batches are skipped; with
    ``aborted_transactions`` (a read_committed answer's (producer id, first offset) pairs),
    so are the batches of those transactions (:class:`AbortedTransactions`). Truncated,
    mis-framed, CRC-failing or otherwise corrupt input raises CorruptRecordError (or
    InvalidRecordError for a wrong magic, UnsupportedCompressionTypeError for codec > 4).
    """
    cols = _Columns(include_headers)
    aborted = None
    if aborted_transactions is not None:
        aborted = AbortedTransactions(aborted_transactions)
    decode_into(buf, cols, start_offset, end_offset, verify_crc, aborted)
    return to_arrow(cols, topic, partition, include_headers)


def decode_into(
    buf: Buffer,
    cols: _Columns,
    start_offset: int,
    end_offset: int,
    verify_crc: bool = True,
    aborted: AbortedTransactions | None = None,
) -> int:
    """Append the wanted records of ``buf`` to ``cols``; returns the next offset after ``buf``.

    ``aborted``: for read_committed, the answer's aborted transactions, whose batches are
    skipped (it is advanced past ``buf``: the next slice of the same answer continues it).
    The fast decoder (:mod:`raylog.pipelines.fast_records`) first; for input it declines or
    finds wrong, the reference decoder, so errors (which batch, which byte) are the reference's.
    """
    skip = aborted.skipped(buf) if aborted is not None and aborted.active else frozenset()
    try:
        return decode_into_fast(
            buf, cols, start_offset, end_offset, verify_crc, FAST_MIN_RECORDS, skip
        )
    except (fast_records.Unfit, RaylogError):
        pass  # nothing was added to cols
    return decode_into_reference(buf, cols, start_offset, end_offset, verify_crc, skip)


def decode_into_fast(
    buf: Buffer,
    cols: _Columns,
    start_offset: int,
    end_offset: int,
    verify_crc: bool = True,
    min_records: int = 0,
    skip: frozenset[int] = frozenset(),
) -> int:
    """:func:`decode_into` by the vectorised decoder only; raises fast_records.Unfit for input
    it does not decode exactly as the reference does, or for fewer than ``min_records`` records
    in wanted batches. Adds to ``cols`` only on success. ``skip``: base offsets of batches
    to leave out (an aborted transaction's)."""
    walk = _Walk(buf, start_offset, end_offset, verify_crc, skip)
    wanted = list(walk)
    if sum(header.records_count for header, _ in wanted) < min_records:
        raise fast_records.Unfit(f"fewer than {min_records} records")
    sections: list[tuple[rb.BatchHeader, Buffer]] = [
        (header, body if header.compression == CODEC_NONE else decompress(header.compression, body))
        for header, body in wanted
    ]
    if sections:
        chunk = fast_records.decode(sections, start_offset, end_offset, cols.include_headers)
        if chunk is not None:
            cols.add_chunk(chunk)
    return walk.next_offset


def decode_into_reference(
    buf: Buffer,
    cols: _Columns,
    start_offset: int,
    end_offset: int,
    verify_crc: bool = True,
    skip: frozenset[int] = frozenset(),
) -> int:
    """:func:`decode_into` by the reference decoder (a Python loop over records): the
    specification the fast decoder is tested against, and its fallback."""
    walk = _Walk(buf, start_offset, end_offset, verify_crc, skip)
    for header, body in walk:
        codec = header.compression
        data = bytes(body) if codec == CODEC_NONE else decompress(codec, body)
        try:
            _decode_records(data, header, start_offset, end_offset, cols)
        except CorruptRecordError as exc:
            raise CorruptRecordError(
                f"batch at offset {header.base_offset} ({CODEC_NAMES.get(codec)}): {exc}"
            ) from exc
    return walk.next_offset


class _Walk:
    """The batches of a fetch response that a decode wants, for both decoders: iterating
    yields ``(header, records section)`` of each non-control batch overlapping
    [start_offset, end_offset) whose base offset is not in ``skip``, in order; ``next_offset``
    is then the offset after the last batch seen (control and skipped batches included), where
    the next read starts."""

    def __init__(
        self,
        buf: Buffer,
        start_offset: int,
        end_offset: int,
        verify_crc: bool,
        skip: frozenset[int] = frozenset(),
    ) -> None:
        self.view = memoryview(buf)
        self.start_offset, self.end_offset = start_offset, end_offset
        self.verify_crc = verify_crc
        self.skip = skip
        self.next_offset = start_offset

    def __iter__(self) -> Iterator[tuple[rb.BatchHeader, memoryview]]:
        view = self.view
        for pos, header in rb.iter_batches(view, verify=self.verify_crc):
            self.next_offset = max(self.next_offset, header.next_offset)
            if header.is_control or header.next_offset <= self.start_offset:
                continue
            if header.base_offset in self.skip:
                continue  # an aborted transaction's (read_committed)
            if header.base_offset >= self.end_offset:
                break
            if header.records_count == 0:
                continue  # every record compacted away; kept for its producer's sequence
            # A compacted batch keeps its offsets and holds fewer records than it spans.
            if header.records_count < 0 or header.records_count > header.last_offset_delta + 1:
                raise CorruptRecordError(
                    f"batch at offset {header.base_offset}: recordsCount "
                    f"{header.records_count}, lastOffsetDelta {header.last_offset_delta}"
                )
            yield header, view[pos + rb.HEADER_SIZE : pos + header.size]


class AbortedTransactions:
    """Kafka's consumer's read_committed filter over one fetch answer (as its CompletedFetch
    keeps it): which of the answer's batches hold records of an aborted transaction.

    The answer names its aborted transactions as (producer id, first offset) pairs. The
    answer's batches are taken in offset order; before each batch of a producer, every aborted
    transaction whose first offset is at or below the batch's last offset marks its producer
    aborted; that producer's ABORT marker clears the mark; while marked, the producer's
    transactional data batches are skipped. Non-transactional batches and batches of other
    producers are kept; control batches are never rows anyway.

    One object per answer: its state carries from one slice of the answer to the next (a
    short-circuit read decodes an answer in slices), in order, each slice once.
    """

    def __init__(self, aborted: Iterable[tuple[int, int]]) -> None:
        # By first offset: Kafka's priority queue of the answer's aborted transactions.
        self._pending = sorted((int(first), int(pid)) for pid, first in aborted)
        self._next = 0  # the first pending transaction not yet reached
        self._producers: set[int] = set()  # Kafka's abortedProducerIds

    @property
    def active(self) -> bool:
        """Whether a batch may still be skipped (a transaction to reach, or a producer marked)."""
        return self._next < len(self._pending) or bool(self._producers)

    def skips(self, batch: Buffer, header: rb.BatchHeader) -> bool:
        """Whether the whole batch ``batch`` (starting at its header) is data of an aborted
        transaction; call once per batch of the answer, in order."""
        if header.producer_id < 0:  # Kafka's hasProducerId
            return False
        pending = self._pending
        while self._next < len(pending) and pending[self._next][0] <= header.last_offset:
            self._producers.add(pending[self._next][1])
            self._next += 1
        if header.is_control:
            marker = rb.parse_end_txn_marker(batch, header)
            if marker is not None and not marker.commit:
                self._producers.discard(header.producer_id)
            return False
        return header.is_transactional and header.producer_id in self._producers

    def skipped(self, buf: Buffer) -> frozenset[int]:
        """The base offsets of the batches of ``buf`` (concatenated whole batches, the next
        slice of the answer) to skip. Framing is checked here; CRCs by the decode that
        follows."""
        view = memoryview(buf)
        out = []
        for pos, header in rb.iter_batches(view, verify=False):
            if self.skips(view[pos : pos + header.size], header):
                out.append(header.base_offset)
        return frozenset(out)


def new_columns(include_headers: bool = False) -> _Columns:
    return _Columns(include_headers)


def to_arrow(cols: _Columns, topic: str, partition: int, include_headers: bool) -> pa.RecordBatch:
    chunks = cols.take_chunks()

    def column(i: int) -> pa.Array:
        parts = [chunk[i] for chunk in chunks]
        return parts[0] if len(parts) == 1 else pa.concat_arrays(parts)

    keys, values, offsets, timestamps, timestamp_types = (column(i) for i in range(5))
    n = len(offsets)
    arrays = [
        keys,
        values,
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        offsets,
        timestamps,
        timestamp_types,
    ]
    if include_headers:
        arrays.append(column(5))
    return pa.RecordBatch.from_arrays(arrays, schema=schema(include_headers))


def concat(batches: Iterable[pa.RecordBatch], include_headers: bool) -> pa.Table:
    return pa.Table.from_batches(list(batches), schema=schema(include_headers))
