"""The offsets of a consumer group's open transactions (TxnOffsetCommit, KIP-98/447): pure.

This module owns what a group keeps of the offsets a transactional producer commits through
TxnOffsetCommit: they are written to ``__consumer_offsets`` in one transactional batch of that
producer and then kept here, per producer id, *pending*: OffsetFetch does not see them and they
do not replace the group's committed offsets until the transaction's marker is written to the
group's ``__consumer_offsets`` partition. A COMMIT marker materializes them, an ABORT drops them.

Rules, each Kafka's (``GroupMetadata`` / ``OffsetMetadataManager``), the same for a live group
and for one rebuilt by replaying the log, so that both agree:

1. A producer's later pending offset of a partition replaces its earlier one.
2. On COMMIT a pending offset becomes the committed one unless the committed one's record is
   later in the log (a plain OffsetCommit appended after the transactional one): each offset
   carries its record's log offset (``CommittedOffset.log_offset``) and the higher wins, so a
   compacted log materializes the same offset.
3. A tombstone of a partition's offset (OffsetDelete, DeleteGroups) drops every producer's
   pending offset of that partition too.
4. Offset expiry leaves alone a partition with pending offsets, and a group with any is not
   expired away (``group_admin.plan_offset_expiry``).

No I/O, no clock; the coordinator (``coordinator.py``) appends the records and calls
:meth:`PendingOffsets.complete` once the marker is written, or its replay does on reading one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # group.py imports this module; the type is only named here
    from raylog.gateway.groups.group import CommittedOffset

__all__ = ["PendingOffsets"]

TopicPartition = tuple[str, int]


@dataclass
class PendingOffsets:
    """One group's pending transactional offsets: producer id -> partition -> offset."""

    by_producer: dict[int, dict[TopicPartition, CommittedOffset]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.by_producer.values())

    def add(self, producer_id: int, offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        """Offsets of ``producer_id``'s open transaction, written to the log (rule 1)."""
        self.by_producer.setdefault(producer_id, {}).update(offsets)

    def complete(
        self, producer_id: int, commit: bool, committed: dict[TopicPartition, CommittedOffset]
    ) -> list[TopicPartition]:
        """The marker of ``producer_id``'s transaction is written: on ``commit`` its pending
        offsets go into ``committed`` (rule 2), else they are dropped. Returns the partitions
        whose committed offset changed."""
        pending = self.by_producer.pop(producer_id, None)
        if not pending or not commit:
            return []
        changed = []
        for tp, offset in pending.items():
            current = committed.get(tp)
            if current is None or offset.log_offset > current.log_offset:
                committed[tp] = offset
                changed.append(tp)
        return changed

    def drop(self, partitions: Iterable[TopicPartition]) -> None:
        """Tombstones of ``partitions`` are written (rule 3)."""
        partitions = set(partitions)
        for producer_id, pending in list(self.by_producer.items()):
            for tp in partitions & pending.keys():
                del pending[tp]
            if not pending:
                del self.by_producer[producer_id]

    def clear(self) -> None:
        self.by_producer.clear()

    def has(self, tp: TopicPartition) -> bool:
        """Whether some open transaction holds an offset of ``tp`` (OffsetFetch v7's
        require_stable answers such a partition UNSTABLE_OFFSET_COMMIT, 88)."""
        return any(tp in pending for pending in self.by_producer.values())

    def partitions(self) -> set[TopicPartition]:
        return {tp for pending in self.by_producer.values() for tp in pending}

    def producers(self) -> set[int]:
        return {p for p, pending in self.by_producer.items() if pending}
