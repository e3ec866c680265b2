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
- Transactional and control batches are copied as they are (raylog does not offer
  transactions yet; there is nothing of theirs to compact).
- A rewritten batch is recompressed with its codec; its CRC is recomputed.
"""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple

from raylog.storage import batch as rb
from raylog.storage.compression import CODEC_NONE, compress
from raylog.storage.records import iter_records, restamp_record

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
        """Put every keyed record of one stored batch (data batches only)."""
        if header.is_control or header.is_transactional or not header.records_count:
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
) -> CleanedBatch:
    """One stored batch (``batch`` holds exactly it) after a cleaning pass.

    ``keep_if_empty``: the batch is the last of its producer in the log, kept (empty) even
    when every record goes.
    """
    horizon = delete_horizon_ms(header)
    if header.is_control or header.is_transactional:
        return CleanedBatch(batch, 0, horizon)
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
        if keep_if_empty:
            return CleanedBatch(_rebuild(header, b"", 0, header.base_timestamp, -1), removed, -1)
        return CleanedBatch(None, removed, -1)
    if needs_horizon:
        horizon = now_ms + delete_retention_ms
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
    data = _rebuild(header, records, len(kept), base_ts, max_ts, horizon >= 0)
    return CleanedBatch(data, removed, horizon)


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
    "clean_batch",
    "delete_horizon_ms",
    "key_digest",
]
