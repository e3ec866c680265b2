"""Log compaction (``cleanup.policy=compact``): the per-batch rules of Kafka's log cleaner.

Pure functions over batch bytes; :meth:`raylog.storage.log.Log.clean` reads segments, calls
these and swaps the cleaned segments in. Kafka's design, followed here:

- The log splits at the *first dirty offset* (the cleaner checkpoint): below it the log was
  cleaned before, above it (up to the *cut*: the active segment, the high watermark and
  ``min.compaction.lag.ms``) it was not. An :class:`OffsetMap` holds, for each key in the
  dirty part, the offset of its latest record.
- Every segment below the cut is rewritten keeping a record when its key is not in the map or
  the map names this very record (or a later one never exists: the map holds the latest).
  Records without a key are removed (a topic that was ``delete`` before may hold some).
- Offsets never change: a rewritten batch keeps its base offset, its last offset delta, its
  producer id, epoch and base sequence, and its partition leader epoch; records keep their
  offset deltas. A batch left with no record is dropped, unless it is the last batch of its
  producer in the log: that one stays, empty, so that the producer's sequence survives (a
  replica rebuilds idempotent-producer state from batch headers).
- Tombstones (a null value) are kept for ``delete.retention.ms`` after the cleaner first
  keeps them (KIP-534): that pass sets the batch's *delete horizon* (attributes bit 6, the
  horizon stored in baseTimestamp, record timestamp deltas re-based on it so every record's
  timestamp is unchanged). A later pass after the horizon removes them.
- Transactions (Kafka's CleanedTransactionMetadata, :class:`TxnFilter`): a pass cleans only
  below the last stable offset, so every transaction it meets is decided. The batches of
  aborted transactions (the ``.txnindex`` entries overlapping the pass) are removed and never
  enter the offset map; committed transactional records are compacted as any others. A
  transaction marker stays while the pass still meets a batch of its transaction; a pass that
  meets none gives it a delete horizon (delete.retention.ms, as a tombstone's), and a pass
  after the horizon removes it (an ABORT marker's ``.txnindex`` entry goes with it). A control
  batch with no record left (kept for its producer's sequence) goes when it is not its
  producer's last batch.
- A rewritten batch is recompressed with its codec; its CRC is recomputed.
"""

from __future__ import annotations

import hashlib
import struct
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from raylog.storage import batch as rb
from raylog.storage.compression import CODEC_NONE, compress
from raylog.storage.log.txnindex import AbortedTxn
from raylog.storage.records import StoredRecord, iter_records, restamp_record

Buffer = bytes | bytearray | memoryview

DELETE_HORIZON_FLAG = 0x40  # attributes bit 6 (KIP-534)
# Kafka's default log.cleaner.dedupe.buffer.size (128 MiB) holds about 5 million keys at 24
# bytes each; a Python dict entry costs about 150 bytes, so a million keys is ~150 MiB.
MAX_OFFSET_MAP_ENTRIES = 1_000_000

_UINT32 = struct.Struct(">I")


# Keys up to this long are map keys as they are; longer ones by their 16-byte digest.
SHORT_KEY_BYTES = 32


def key_digest(key: bytes) -> bytes:
    """16 bytes standing for a long key in the offset map (as Kafka's map keeps an MD5)."""
    return hashlib.blake2b(key, digest_size=16).digest()


class OffsetMap:
    """Key -> offset of the latest record with that key, bounded in entries.

    Short keys are stored as they are (no hashing); longer ones by digest, in a second dict,
    so a short key never meets a digest. An entry costs about 150 bytes either way.
    """

    def __init__(self, max_entries: int = MAX_OFFSET_MAP_ENTRIES) -> None:
        self.max_entries = max_entries
        self._short: dict[bytes, int] = {}
        self._long: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._short) + len(self._long)

    @property
    def full(self) -> bool:
        return len(self) >= self.max_entries

    def get(self, key: bytes) -> int:
        if len(key) <= SHORT_KEY_BYTES:
            return self._short.get(key, -1)
        return self._long.get(key_digest(key), -1)

    def add_batch(self, batch: Buffer, header: rb.BatchHeader) -> None:
        """Put every keyed record of one stored batch (data batches only; the caller skips
        those of aborted transactions)."""
        if header.is_control or not header.records_count:
            return
        section = rb.records_section(batch, header)
        base = header.base_offset
        short, long_ = self._short, self._long
        for record in iter_records(section, header.records_count):
            key = record.key
            if key is None:
                continue
            if len(key) <= SHORT_KEY_BYTES:
                short[key] = base + record.offset_delta
            else:
                long_[key_digest(key)] = base + record.offset_delta


class CleanedBatch(NamedTuple):
    """What one batch becomes: its bytes (None: dropped) and what the pass learned."""

    data: bytes | memoryview | None
    records_removed: int
    delete_horizon_ms: int  # the batch's horizon after the pass, -1 when it has none


def delete_horizon_ms(header: rb.BatchHeader) -> int:
    """The batch's delete horizon (KIP-534), -1 when it has none."""
    if header.attributes & DELETE_HORIZON_FLAG:
        return header.base_timestamp
    return -1


def clean_batch(
    batch: Buffer,
    header: rb.BatchHeader,
    offset_map: OffsetMap,
    *,
    now_ms: int,
    delete_retention_ms: int,
    keep_if_empty: bool,
    aborted: bool = False,
) -> CleanedBatch:
    """One stored data batch (``batch`` holds exactly it) after a cleaning pass.

    ``keep_if_empty``: the batch is the last of its producer in the log, kept (empty) even
    when every record goes. ``aborted``: the batch belongs to an aborted transaction (every
    record goes).
    """
    horizon = delete_horizon_ms(header)
    if aborted:
        return _emptied(header, header.records_count, keep_if_empty)
    section = rb.records_section(batch, header)
    base = header.base_offset
    kept = []
    tombstones = 0
    for record in iter_records(section, header.records_count):
        if record.key is None:
            continue  # a compacted topic keeps only keyed records
        offset = base + record.offset_delta
        if offset < offset_map.get(record.key):
            continue  # a later record has this key
        if record.value_is_null:
            if 0 <= horizon <= now_ms:
                continue  # a tombstone past its delete horizon
            tombstones += 1
        kept.append(record)
    removed = header.records_count - len(kept)
    needs_horizon = tombstones and horizon < 0
    if not removed and not needs_horizon:
        return CleanedBatch(batch, 0, horizon)
    if not kept:
        return _emptied(header, removed, keep_if_empty)
    if needs_horizon:
        horizon = now_ms + delete_retention_ms
    return CleanedBatch(_kept(header, section, kept, horizon, needs_horizon), removed, horizon)


def clean_control_batch(
    batch: Buffer,
    header: rb.BatchHeader,
    *,
    txn_data_gone: bool,
    now_ms: int,
    delete_retention_ms: int,
    keep_if_empty: bool,
) -> CleanedBatch:
    """One stored control batch after a cleaning pass (the module docstring's rules).
    ``txn_data_gone``: :meth:`TxnFilter.control_batch` said the pass met no batch of the
    marker's transaction."""
    horizon = delete_horizon_ms(header)
    if not txn_data_gone:
        return CleanedBatch(batch, 0, horizon)
    if not header.records_count:  # emptied by an earlier pass
        return CleanedBatch(batch if keep_if_empty else None, 0, -1)
    if horizon < 0:  # the first pass to find the transaction's data gone: the horizon starts
        horizon = now_ms + delete_retention_ms
        section = rb.records_section(batch, header)
        kept = list(iter_records(section, header.records_count))
        return CleanedBatch(_kept(header, section, kept, horizon, True), 0, horizon)
    if horizon <= now_ms:
        return _emptied(header, header.records_count, keep_if_empty)
    return CleanedBatch(batch, 0, horizon)


def _emptied(header: rb.BatchHeader, removed: int, keep_if_empty: bool) -> CleanedBatch:
    """A batch whose every record went: dropped, or kept empty for its producer's sequence."""
    if keep_if_empty:
        return CleanedBatch(_rebuild(header, b"", 0, header.base_timestamp, -1), removed, -1)
    return CleanedBatch(None, removed, -1)


def _kept(
    header: rb.BatchHeader,
    section: Buffer,
    kept: list[StoredRecord],
    horizon: int,
    new_horizon: bool,
) -> bytes:
    """The batch of ``header`` holding the ``kept`` records of its records ``section``, with
    ``horizon`` as its delete horizon (-1: none); ``new_horizon``: set it now, re-basing the
    records' timestamp deltas on it so every record's timestamp is unchanged."""
    if new_horizon:
        base_ts = horizon
        records = b"".join(
            restamp_record(section, r, header.base_timestamp + r.timestamp_delta - horizon)
            for r in kept
        )
    else:
        base_ts = header.base_timestamp
        records = b"".join(bytes(section[r.start : r.end]) for r in kept)
    if header.is_log_append_time:
        max_ts = header.max_timestamp
    else:
        max_ts = max(header.base_timestamp + r.timestamp_delta for r in kept)
    return _rebuild(header, records, len(kept), base_ts, max_ts, horizon >= 0)


class TxnFilter:
    """Which batches of a pass belong to aborted transactions, and which markers' transactions
    the pass met no batch of (Kafka's CleanedTransactionMetadata). Fed every batch of the
    pass in log order; ``aborted``: the aborted transactions overlapping the pass (from the
    ``.txnindex`` files)."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._pending = deque(sorted(aborted, key=lambda t: t.first_offset))
        # Producer id -> whether the pass met a batch of its aborted transaction.
        self._aborted: dict[int, bool] = {}
        # Producers whose ongoing (committed) transaction the pass met a batch of.
        self._committed: set[int] = set()

    def _begin_aborted_up_to(self, offset: int) -> None:
        while self._pending and self._pending[0].first_offset <= offset:
            self._aborted[self._pending.popleft().producer_id] = False

    def data_batch(self, header: rb.BatchHeader) -> bool:
        """Whether the data batch of ``header`` belongs to an aborted transaction."""
        if not header.is_transactional:
            return False
        self._begin_aborted_up_to(header.last_offset)
        pid = header.producer_id
        if pid in self._aborted:
            self._aborted[pid] = True
            return True
        self._committed.add(pid)
        return False

    def control_batch(self, header: rb.BatchHeader, marker: rb.EndTxnMarker | None) -> bool:
        """Whether the pass met no batch of the transaction the control batch of ``header``
        ends (its marker may go, after its delete horizon)."""
        self._begin_aborted_up_to(header.last_offset)
        if not header.records_count:
            return True  # emptied by an earlier pass
        if marker is None:
            return False  # another control type: kept
        pid = header.producer_id
        if marker.commit:
            met = pid in self._committed
            self._committed.discard(pid)
            return not met
        return not self._aborted.pop(pid, False)


def _rebuild(
    header: rb.BatchHeader,
    records: bytes,
    count: int,
    base_timestamp: int,
    max_timestamp: int,
    with_horizon: bool = False,
) -> bytes:
    """A batch with the header's identity (offsets, epochs, producer) around new records."""
    codec = header.compression
    body = compress(codec, records) if codec != CODEC_NONE and records else records
    attributes = header.attributes & ~DELETE_HORIZON_FLAG
    if with_horizon:
        attributes |= DELETE_HORIZON_FLAG
    if not count:
        attributes &= ~rb.COMPRESSION_MASK  # an empty batch has nothing to compress
        max_timestamp = header.max_timestamp
    buf = bytearray(rb.HEADER_SIZE + len(body))
    rb.HEADER.pack_into(
        buf,
        0,
        header.base_offset,
        len(buf) - rb.LOG_OVERHEAD,
        header.partition_leader_epoch,
        rb.MAGIC,
        0,  # crc, below
        attributes,
        header.last_offset_delta,
        base_timestamp,
        max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        count,
    )
    buf[rb.HEADER_SIZE :] = body
    _UINT32.pack_into(buf, rb.CRC_POS, rb.compute_crc(buf, 0, len(buf)))
    return bytes(buf)


__all__ = [
    "DELETE_HORIZON_FLAG",
    "MAX_OFFSET_MAP_ENTRIES",
    "CleanedBatch",
    "OffsetMap",
    "TxnFilter",
    "clean_batch",
    "clean_control_batch",
    "delete_horizon_ms",
    "key_digest",
]
