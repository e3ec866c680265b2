"""Producer-state snapshots of one partition replica, pure: their bytes and their use.

A snapshot (Kafka's ProducerStateManager ``<offset>.snapshot``) holds the whole idempotent
producer state (``producer_state``) and transaction state (``txn_state``) a replica had when
its state machine's log ended at ``offset`` with every batch below it durable. A replica that
starts loads the newest usable snapshot and replays only the batch headers from its offset on,
instead of every header of the log (``replica_log.ReplicaLog``); the storage layer keeps the
files (``raylog.storage.log.snapshots``: naming, truncation, pruning) and never reads them.

Bytes: ``RLPS`` magic, version (uint16), CRC-32C (uint32) of the body, then the body, msgpack
(:class:`SnapshotBody`): the offset, the high watermark the state was taken at, the two tables
exactly as their ``export`` gives them (least recently appended producer first, so that the
memory bound evicts as the full rebuild would), the aborted transactions and the closed
transactions the high watermark has not passed. A snapshot that fails its magic, version,
CRC or the tables' invariants is refused (:class:`SnapshotError`), and the replica falls
back to an older one or to the whole log.

Decisions:
- The aborted list is in the snapshot rather than read back from the ``.txnindex`` files below
  its offset: the files are written without fsync between rolls and restored from this very
  state at start (``Log.restore_aborted_txns``), so they cannot be its source; the list is in
  memory whole anyway, so the snapshot costs what the memory does.
- The high watermark: a full rebuild counts every transaction whose marker is at or above the
  starting high watermark as unreplicated. The snapshot holds those at or above its own high
  watermark, so it is usable only when the starting one is not lower (:meth:`ProducerSnapshot.
  usable`); the shell checkpoints the high watermark before it takes one.
- A snapshot is taken only of a state equal to what the log below its offset rebuilds
  (``ReplicaLog.snapshot_exact``): a truncation may forget what a rebuild would know
  (``producer_state``'s and ``txn_state``'s truncation rules), and a snapshot of that would
  outlive the restart that repairs it.
- The log start: a live replica forgets a producer whose batches all lie below it
  (``producer_state``), a rebuild reads the batches of the first segment below it too; a
  snapshot carries the former, so after a restart from one a producer that appended again
  since holds no batch below the log start in its window. Nothing above the log start is
  decided differently.
- Retention: a snapshot keeps the state of producers whose batches retention deleted since,
  as Kafka's does (their epochs still fence zombies); a rebuild of the remaining log forgets
  them (rule 2 of ``producer_state``): both are safe.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c
import msgspec

from raylog.actors.replication.producer_state import ProducerBatch, ProducerStateTable
from raylog.actors.replication.txn_state import CompletedTxn, TxnTable, TxnTableState
from raylog.storage.log.txnindex import AbortedTxn

SNAPSHOT_MAGIC = b"RLPS"
SNAPSHOT_VERSION = 1
_HEAD = struct.Struct(">4sHI")  # magic, version, CRC-32C of the body

_Batch = tuple[int, int, int, int, int]
_Completed = tuple[int, int, int, bool, int, int]


class SnapshotError(ValueError):
    """Bytes that are no usable snapshot (the reason is the message)."""


class SnapshotBody(msgspec.Struct, array_like=True, frozen=True):
    """The msgpack body (see the module docstring); tuples as the tables export them."""

    offset: int
    high_watermark: int
    producers: list[tuple[int, int, list[_Batch], _Batch | None]]
    txns: list[tuple[int, int, int, list[_Completed], int, int]]
    aborted: list[tuple[int, int, int, int]]
    unreplicated: list[_Completed]


class ProducerSnapshot(NamedTuple):
    """A decoded snapshot: the two tables of a log that ended at ``offset``, loaded (a
    ``ReplicaLog`` that starts from it takes them over)."""

    offset: int
    high_watermark: int
    producers: ProducerStateTable
    txns: TxnTable

    def usable(self, log_start_offset: int, log_end_offset: int, high_watermark: int) -> bool:
        """Whether a replica whose recovered log spans [log_start_offset, log_end_offset) with
        this starting high watermark may start from it (see the module docstring)."""
        return (
            log_start_offset <= self.offset <= log_end_offset
            and self.high_watermark <= high_watermark
        )


def encode(
    offset: int, high_watermark: int, producers: ProducerStateTable, txns: TxnTable
) -> bytes:
    """The snapshot of the two tables of a log that ends at ``offset``."""
    txn_state = txns.export()
    body = msgspec.msgpack.encode(
        SnapshotBody(
            offset,
            high_watermark,
            producers.export(),
            txn_state.entries,
            txn_state.aborted,
            txn_state.unreplicated,
        )
    )
    return _HEAD.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, crc32c.crc32c(body)) + body


_DECODER = msgspec.msgpack.Decoder(SnapshotBody)


def decode(data: bytes) -> ProducerSnapshot:
    """The snapshot in ``data``; raises SnapshotError (see the module docstring)."""
    if len(data) < _HEAD.size:
        raise SnapshotError(f"{len(data)} bytes: shorter than the header")
    magic, version, crc = _HEAD.unpack_from(data)
    if magic != SNAPSHOT_MAGIC or version != SNAPSHOT_VERSION:
        raise SnapshotError(f"magic {magic!r} version {version}: not a snapshot this reads")
    body = memoryview(data)[_HEAD.size :]
    if crc32c.crc32c(body) != crc:
        raise SnapshotError("CRC-32C mismatch")
    try:
        raw = _DECODER.decode(body)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"undecodable body: {exc}") from exc
    if not 0 <= raw.high_watermark <= raw.offset:
        raise SnapshotError(f"high watermark {raw.high_watermark} outside [0, {raw.offset}]")
    producers, txns = ProducerStateTable(), TxnTable()
    try:
        producers.load(
            (pid, epoch, [ProducerBatch(*b) for b in batches], _batch(evicted))
            for pid, epoch, batches, evicted in raw.producers
        )
        txns.load(
            TxnTableState(
                [
                    (pid, first, epoch, [CompletedTxn(*t) for t in done], marker, coordinator)
                    for pid, first, epoch, done, marker, coordinator in raw.txns
                ],
                [AbortedTxn(*t) for t in raw.aborted],
                [CompletedTxn(*t) for t in raw.unreplicated],
            )
        )
    except ValueError as exc:
        raise SnapshotError(f"snapshot at {raw.offset}: {exc}") from exc
    return ProducerSnapshot(raw.offset, raw.high_watermark, producers, txns)


def _batch(fields: _Batch | None) -> ProducerBatch | None:
    return ProducerBatch(*fields) if fields is not None else None


__all__ = ["ProducerSnapshot", "SnapshotBody", "SnapshotError", "decode", "encode"]
