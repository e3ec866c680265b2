"""ListOffsets on a leader replica (:class:`OffsetsReplica`, mixed into ReplicaActor).

Kafka's meanings of the request's ``timestamp`` (``ListOffsetsRequest``), each answered with
``(error_code, timestamp, offset, leader_epoch)``:

- -2 (earliest): the partition's log start offset (the remote log's first offset when the topic
  is tiered and the remote tier reaches lower), with the epoch of the batch there;
- -4 (earliest-local, KIP-405): the replica's local log start offset;
- -1 (latest): the last fetchable offset (the high watermark; the last stable offset for
  read_committed), with the leader's current epoch;
- -3 (max timestamp, KIP-734): the first record with the largest timestamp in the local log
  (Kafka searches its local segments only, tiered or not), with that timestamp;
- -5 (latest tiered, KIP-1005): the highest offset copied to the object store, -1 when none is
  (or the topic is not tiered, then with epoch -1);
- any other value: the first record whose timestamp is >= ``timestamp``, searched in the
  remote tier first, then the local log (the first batch whose maxTimestamp is late enough,
  then its records), with that record's timestamp.

As in Kafka's ``Partition.fetchOffsetForTimestamp``, an offset found by time (-3 and the plain
timestamps) at or above the last fetchable offset is not offered: (-1, -1). Offsets found in
the log carry the epoch of their batch (``leader_epoch`` is what a consumer validates its
position with, KIP-320), -1 when the epoch cache no longer reaches them.

Fencing (v4+, KIP-320): a ``current_leader_epoch`` below the leader's is FENCED_LEADER_EPOCH,
above it UNKNOWN_LEADER_EPOCH; -1 skips the check.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from raylog.actors.replica_tiering import (
    EARLIEST_LOCAL_TIMESTAMP,
    READ_COMMITTED,
    first_record_at,
)
from raylog.actors.replication.messages import UNDEFINED_EPOCH
from raylog.actors.replication.ready import Role
from raylog.storage.errors import (
    FencedLeaderEpochError,
    KafkaStorageError,
    NotLeaderOrFollowerError,
    RaylogError,
    UnknownLeaderEpochError,
)
from raylog.storage.log import DamagedBatchError, Log

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIERED_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "OffsetsReplica",
]

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3  # KIP-734
LATEST_TIERED_TIMESTAMP = -5  # KIP-1005

Answer = tuple[int, int, int, int]  # (error_code, timestamp, offset, leader_epoch)


class OffsetsReplica:
    """ReplicaActor's ListOffsets (see the module docstring)."""

    _sm: Any
    _log: Log
    _offline: str | None

    if TYPE_CHECKING:  # the ReplicaActor's and TieredReplica's, declared for the type checker

        def _ensure_started(self) -> None: ...
        def _on_storage_error(self, exc: DamagedBatchError) -> None: ...
        def _tiering_enabled(self) -> bool: ...
        def _log_start_for_clients(self, local_start: int) -> int: ...
        def _remote_list_offset(self, timestamp: int) -> tuple[int, int] | None: ...
        def _remote_next_offset(self) -> int: ...

    async def list_offsets(
        self,
        timestamp: int,
        current_leader_epoch: int = UNDEFINED_EPOCH,
        isolation_level: int = 0,
    ) -> Answer:
        """Kafka's ListOffsets on the leader (the module docstring)."""
        self._ensure_started()
        sm = self._sm
        if self._offline is not None:
            return (KafkaStorageError.error_code, -1, -1, -1)
        if sm.role is not Role.LEADER:
            return (NotLeaderOrFollowerError.error_code, -1, -1, -1)
        if current_leader_epoch != UNDEFINED_EPOCH and current_leader_epoch < sm.leader_epoch:
            return (FencedLeaderEpochError.error_code, -1, -1, sm.leader_epoch)
        if current_leader_epoch > sm.leader_epoch:
            return (UnknownLeaderEpochError.error_code, -1, -1, sm.leader_epoch)
        if timestamp == EARLIEST_TIMESTAMP:
            start = self._log_start_for_clients(sm.log_start_offset)
            return (0, -1, start, sm.log.epoch_at(start))
        if timestamp == EARLIEST_LOCAL_TIMESTAMP:
            return (0, -1, sm.log_start_offset, sm.log.epoch_at(sm.log_start_offset))
        # Kafka's lastFetchableOffset.
        fetchable = (
            sm.last_stable_offset if isolation_level == READ_COMMITTED else sm.high_watermark
        )
        if timestamp == LATEST_TIMESTAMP:
            return (0, -1, fetchable, sm.leader_epoch)
        try:
            if timestamp == LATEST_TIERED_TIMESTAMP:
                return await self._latest_tiered()
            if timestamp == MAX_TIMESTAMP:
                found = self._log.max_timestamp_batch()
            else:
                if self._tiering_enabled():  # the remote tier first: it holds older offsets
                    remote = await asyncio.to_thread(self._remote_list_offset, timestamp)
                    if remote is not None:
                        return (0, remote[0], remote[1], sm.log.epoch_at(remote[1]))
                found = self._log.offset_for_timestamp(timestamp)
            if found is None or found.offset >= fetchable:
                return (0, -1, -1, -1)
            # The first record that late; the batch's own maxTimestamp when no record reaches
            # it (a client set it so).
            wanted = found.timestamp if timestamp == MAX_TIMESTAMP else timestamp
            record = self._first_record_at(found.offset, wanted, fetchable)
        except RaylogError as exc:
            if isinstance(exc, DamagedBatchError):
                self._on_storage_error(exc)
            return (exc.error_code, -1, -1, -1)
        stamp, offset = record if record is not None else (found.timestamp, found.offset)
        return (0, stamp, offset, sm.log.epoch_at(offset))

    async def _latest_tiered(self) -> Answer:
        """-5: the last offset of the remote log, from its metadata as stored now."""
        if not self._tiering_enabled():
            return (0, -1, -1, -1)
        next_offset = await asyncio.to_thread(self._remote_next_offset)
        if next_offset < 0:
            return (0, -1, -1, -1)
        return (0, -1, next_offset - 1, self._sm.log.epoch_at(next_offset - 1))

    def _first_record_at(
        self, batch_offset: int, timestamp: int, below: int
    ) -> tuple[int, int] | None:
        """``(timestamp, offset)`` of the first record at or after ``timestamp`` in the batch
        at ``batch_offset`` (whose maxTimestamp is that late); ``batch_offset`` is the log
        start offset when that lies inside the batch."""
        data = self._log.read(batch_offset, 1, max_offset=below)  # that one batch, whole
        return first_record_at(data, batch_offset, timestamp)
