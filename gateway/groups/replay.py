"""Reading a ``__consumer_offsets`` partition back into its groups: what a new coordinator
knows after loading (``coordinator.py``, step 3 of its docstring).

This module owns the replay of the partition's batches from its log start to the load barrier:

1. The last record of a key wins; a null value (a tombstone) deletes the offset or the group.
   The barrier is a tombstone of group "" (:data:`BARRIER_GROUP`), which no group can have.
2. A transactional batch's offset records are pending under the batch header's producer id
   (``txn_offsets.py``); a control batch of that producer (its transaction's marker: COMMIT or
   ABORT) materializes or drops them; whatever is pending when the replay ends belongs to a
   transaction still open, and stays pending in its group.
3. A tombstone of an offset drops the pending offsets of that partition too.
4. Every record carries its log offset into the group (``CommittedOffset.log_offset``), so a
   transaction committed after a later plain commit of the same partition does not replace it.
"""

from __future__ import annotations

import logging
import struct

from raylog.gateway.groups import records as gr
from raylog.gateway.groups.group import CommittedOffset, Group, GroupState, Member
from raylog.gateway.groups.txn_offsets import PendingOffsets
from raylog.storage import batch as rb
from raylog.storage.records import iter_decoded

__all__ = ["BARRIER_GROUP", "OFFSETS_TOPIC", "GroupReplay"]

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
BARRIER_GROUP = ""  # the group of the load barrier's tombstone: no group has an empty id
# A control record's key (Kafka's ControlRecordType): int16 version, int16 type.
_CONTROL_KEY = struct.Struct(">hh")
_ABORT, _COMMIT = 0, 1


class GroupReplay:
    """Replays ``__consumer_offsets`` records: the last value of each key wins; offsets of
    transactional batches are pending under their producer until its marker (``txn_offsets``)."""

    def __init__(self) -> None:
        self.metadata: dict[str, gr.GroupMetadataValue | None] = {}
        self.offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        self.pending: dict[str, PendingOffsets] = {}

    def apply(self, records: bytes, from_offset: int) -> int:
        """Apply the records at or after ``from_offset`` of a fetch's whole batches; returns
        the next offset to read. Records that do not decode raise CorruptRecordError.

        The log checked each batch's CRC when it read it. A transactional batch's offsets are
        pending under the batch's producer id; a control batch (the transaction's marker)
        materializes or drops them. A transaction without a marker yet stays pending.
        """
        next_offset = from_offset
        view = memoryview(records)
        for pos, header in rb.iter_batches(view, verify=False):
            next_offset = max(next_offset, header.next_offset)
            section = rb.records_section(view[pos:], header)
            if header.is_control:
                if header.base_offset >= from_offset:
                    self._apply_marker(header.producer_id, section, header.records_count)
                continue
            producer_id = header.producer_id if header.is_transactional else rb.NO_PRODUCER_ID
            for record in iter_decoded(section, header.records_count):
                offset = header.base_offset + record.offset_delta
                if offset >= from_offset:
                    self._apply_one(record.key, record.value, offset, producer_id)
        return next_offset

    def _apply_marker(self, producer_id: int, section: bytes | memoryview, count: int) -> None:
        """A control batch: its first record's key is int16 version + int16 type (Kafka's
        ControlRecordType: 0 ABORT, 1 COMMIT; other types carry no transaction's end)."""
        key = next(iter(iter_decoded(section, count)), None)
        key_bytes = key.key if key is not None else None
        if key_bytes is None or len(key_bytes) < _CONTROL_KEY.size:
            log.warning("skipping a control batch of %s without a control key", OFFSETS_TOPIC)
            return
        _, kind = _CONTROL_KEY.unpack_from(key_bytes)
        if kind not in (_ABORT, _COMMIT):
            return
        for group_id, pending in self.pending.items():
            pending.complete(producer_id, kind == _COMMIT, self.offsets.setdefault(group_id, {}))

    def _apply_one(
        self, key_bytes: bytes | None, value_bytes: bytes | None, log_offset: int, producer_id: int
    ) -> None:
        if key_bytes is None:
            return
        try:
            key = gr.decode_key(key_bytes)
            value = gr.decode_value(key, value_bytes) if value_bytes is not None else None
        except gr.RecordFormatError as exc:
            log.warning("skipping a record of %s: %s", OFFSETS_TOPIC, exc)
            return
        if isinstance(key, gr.OffsetCommitKey):
            offsets = self.offsets.setdefault(key.group, {})
            tp = (key.topic, key.partition)
            if value is None:
                offsets.pop(tp, None)
                if key.group in self.pending:
                    self.pending[key.group].drop([tp])
                return
            assert isinstance(value, gr.OffsetCommitValue)
            committed = CommittedOffset(
                value.offset,
                value.leader_epoch,
                value.metadata,
                value.commit_timestamp_ms,
                log_offset,
            )
            if producer_id == rb.NO_PRODUCER_ID:
                offsets[tp] = committed
            else:
                self.pending.setdefault(key.group, PendingOffsets()).add(
                    producer_id, {tp: committed}
                )
        elif key.group != BARRIER_GROUP:
            assert value is None or isinstance(value, gr.GroupMetadataValue)
            self.metadata[key.group] = value

    def groups(self, now_ms: int) -> dict[str, Group]:
        groups: dict[str, Group] = {}
        for group_id in set(self.metadata) | set(self.offsets) | set(self.pending):
            group = Group(group_id)
            value = self.metadata.get(group_id)
            if value is not None:
                group.restore(
                    protocol_type=value.protocol_type or None,
                    generation_id=value.generation,
                    protocol_name=value.protocol,
                    leader_id=value.leader,
                    members=[
                        Member(
                            m.member_id,
                            m.client_id,
                            m.client_host,
                            m.session_timeout_ms,
                            m.rebalance_timeout_ms,
                            ((value.protocol, m.subscription),) if value.protocol else (),
                            m.assignment,
                            group_instance_id=m.group_instance_id,
                        )
                        for m in value.members
                    ],
                    now_ms=now_ms,
                )
            group.offsets.update(self.offsets.get(group_id, {}))
            group.pending_txn = self.pending.get(group_id, PendingOffsets())
            if group.state is GroupState.EMPTY and group.is_empty() and value is None:
                continue
            groups[group_id] = group
        return groups
