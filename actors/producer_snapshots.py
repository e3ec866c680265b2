"""A replica's producer-state snapshots on its Log: which one it starts from, when it takes one.

The bytes and the rules are ``replication.producer_snapshot``'s; the files are the Log's
(``storage/log/snapshots.py``). This module is the I/O between them, for the replica actor:

- start (:func:`start_state`): the newest snapshot at or below the log end that loads and is
  usable; a corrupt one is deleted (with a warning) and the next older one tried, as Kafka
  skips a corrupt snapshot; without one, every producer batch header of the log;
- taking (:class:`SnapshotTaker`): after a roll (the active segment's base offset passed the
  newest snapshot), at the first tick where the state machine's log end is durable and its
  state exact, as Kafka snapshots at each roll; and on a clean close. The high watermark is
  checkpointed first, so that a restart's is never below the snapshot's;
- carrying one forward (:func:`snapshot_at`): a snapshot replayed to a later offset, for the
  snapshot a tiered copy uploads at its segment's end.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

from raylog.actors.replica_port import batch_meta
from raylog.actors.replication.messages import BatchMeta
from raylog.actors.replication.producer_snapshot import ProducerSnapshot, SnapshotError, decode
from raylog.actors.replication.replica_log import ReplicaLog
from raylog.storage import batch as rb
from raylog.storage.log import Log

log = logging.getLogger(__name__)


def start_state(storage: Log) -> tuple[ProducerSnapshot | None, Iterator[BatchMeta]]:
    """The snapshot a replica over ``storage`` starts from (None: none usable) and the producer
    batch headers to replay after it."""
    start, end = storage.log_start_offset, storage.log_end_offset
    high_watermark = max(start, min(storage.high_watermark, end))  # as ReplicaLog clamps it
    for offset in storage.producer_snapshot_offsets():
        data = storage.read_producer_snapshot(offset)
        if data is None:
            continue
        try:
            snapshot = decode(data)
            if snapshot.offset != offset:
                raise SnapshotError(f"holds offset {snapshot.offset}")
        except SnapshotError as exc:
            log.warning("log %s: deleting bad snapshot at %d: %s", storage.directory, offset, exc)
            storage.delete_producer_snapshot(offset)
            continue
        if snapshot.usable(start, end, high_watermark):
            headers = storage.producer_batch_headers(offset)
            return snapshot, (batch_meta(h, m) for h, m in headers)
    return None, (batch_meta(h, m) for h, m in storage.producer_batch_headers())


def snapshot_at(
    data: bytes | None,
    start: int,
    end: int,
    headers: Iterator[tuple[rb.BatchHeader, rb.EndTxnMarker | None]],
) -> bytes:
    """A snapshot at ``end``: the snapshot ``data`` (taken at ``start``; None: the empty state
    of a log starting at ``start``) with the producer batches from ``start`` to ``end``
    replayed over it (``headers``: the log's from ``start`` on; those from ``end`` on are not
    read), as of a high watermark at ``end``. Raises SnapshotError for bytes that are no
    snapshot."""
    snapshot = None if data is None else decode(data)
    if snapshot is not None and snapshot.offset != start:
        raise SnapshotError(f"holds offset {snapshot.offset}, not {start}")
    metas = (
        batch_meta(h, m)
        for h, m in itertools.takewhile(lambda hm: hm[0].base_offset < end, headers)
    )
    state = ReplicaLog(start, end, [], end, metas, snapshot)
    carried = state.snapshot()
    if carried is None:  # a state rebuilt from a snapshot and batches is exact and durable
        raise SnapshotError(f"no snapshot at {end}")
    return carried


class SnapshotTaker:
    """When a replica writes a snapshot of its state machine's producer state."""

    def __init__(self, storage: Log) -> None:
        self._storage = storage
        offsets = storage.producer_snapshot_offsets()
        # Without one, a log that has rolled gets one at once; a new log after its first roll.
        self.last_offset = offsets[0] if offsets else 0

    def due(self) -> bool:
        """A roll since the newest snapshot."""
        return self._storage.active_segment_base_offset > self.last_offset

    def take(self, state: ReplicaLog, *, force: bool = False) -> bool:
        """Write a snapshot of ``state`` at its log end when one may be taken now; returns
        whether it did. Raises KafkaStorageError. On the event loop, with no await between
        encoding the state and writing it: a truncation meanwhile would make it describe
        other batches (a small file and two fsyncs, once per segment). ``force``: also over
        one already taken at that offset (the state there changed: taken from the remote
        tier)."""
        offset = state.log_end_offset
        if (offset == self.last_offset and not force) or offset != self._storage.log_end_offset:
            return False
        data = state.snapshot()
        if data is None:
            return False
        if self._storage.high_watermark < state.high_watermark:
            self._storage.checkpoint_high_watermark(state.high_watermark)
        self._storage.write_producer_snapshot(offset, data)
        self.last_offset = offset
        return True
