"""A replica whose log is damaged (:class:`DamagedReplica`, mixed into ReplicaActor): what the
shell does with the damage its log finds and records (storage/log/recovery.py, step 5).

- Found by a read (a follower's or a consumer's fetch, ListOffsets, the short-circuit reader
  falling back to the replica's read, a cleaning pass): the damaged batch is never served;
  the damage is recorded with the replica's own high watermark as its repair offset, and the
  replica goes offline (KAFKA_STORAGE_ERROR to every caller, as Kafka takes a log directory
  with an I/O error offline). Its broker reports it, the controller takes it out of the ISR
  (and, were it the leader, elects a clean ISR member: the damaged leader resigns), and after
  replica.offline.retry.backoff.ms the broker re-creates it: recovery cuts the log at the
  damage and the follower fetches everything above it from the leader, the path a truncation
  already takes. Replacing the damaged bytes in place would need a second write path into
  sealed segments for the same result; re-fetching the suffix is the simpler correct one.
- Known at start (the log was cut below the committed offsets): until the log ends at the
  repair offset again the replica lacks committed records. It follows and fetches; its
  leader shrinks it out of the ISR at its first fetch from below the HW (replication/isr.py)
  and adds it back by the normal catch-up rule. Told to lead meanwhile (the controller elected
  it before the shrink landed, or it is the last ISR member), it goes offline instead of
  leading with a hole: the controller then elects another ISR member, or leaves the
  partition offline when none is left.
- Repaired: once the log's durable end reaches the repair offset, the damage is forgotten.
"""

from __future__ import annotations

import logging
from typing import Any

from raylog.actors.replication.messages import BecomeLeader
from raylog.actors.replication.partition import PartitionReplica
from raylog.storage.errors import KafkaStorageError
from raylog.storage.log import DamagedBatchError, Log

log = logging.getLogger(__name__)


class DamagedReplica:
    """The ReplicaActor's handling of a damaged log (see the module docstring)."""

    topic: str
    partition: int
    replica_id: int
    _log: Log
    _sm: PartitionReplica
    _offline: str | None

    def _go_offline(self, reason: str) -> None:
        raise NotImplementedError  # ReplicaActor's

    def _repairing(self) -> str | None:
        """Why this replica may not lead now (its log lacks committed records); None: it
        may."""
        damage = self._log.damage
        if damage is None:
            return None
        if self._log.holds_damage:
            return f"damaged log from offset {damage.cut_offset}"
        if self._log.log_end_offset < damage.repair_offset:
            return (
                f"log lost committed records: it ends at {self._log.log_end_offset}, below "
                f"offset {damage.repair_offset}, until fetched again from the leader"
            )
        return None

    def _refuse_damaged_leadership(self, command: Any) -> None:
        """Raise KafkaStorageError (offline) instead of leading with a hole."""
        if not isinstance(command, BecomeLeader):
            return
        reason = self._repairing()
        if reason is not None:
            self._go_offline(f"not leading: {reason}")
            raise KafkaStorageError(self._offline or reason)

    def _on_storage_error(self, exc: KafkaStorageError) -> None:
        """A storage error in the data path: offline, recording a damaged batch with this
        replica's high watermark (the committed records it must fetch again)."""
        if isinstance(exc, DamagedBatchError):
            try:
                self._log.record_damage(exc.offset, self._sm.high_watermark)
            except KafkaStorageError as failed:
                log.error("%s-%d: damage not recorded: %s", self.topic, self.partition, failed)
        self._go_offline(str(exc))

    def _check_damage(self) -> None:
        """On tick: offline when a read found damage (one outside the data path, e.g. a
        cleaning pass); the damage forgotten once the repair is durable."""
        if self._log.damage is None:
            return
        if self._log.holds_damage:
            self._on_storage_error(KafkaStorageError(self._repairing() or "damaged log"))
            return
        if self._sm.durable_end_offset >= self._log.damage.repair_offset:
            self._log.clear_damage()


__all__ = ["DamagedReplica"]
