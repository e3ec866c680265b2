"""Tiered storage on a replica (KIP-405's RemoteLogManager tasks), mixed into
:class:`raylog.actors.replica.ReplicaActor`.

For a topic with ``remote.storage.enable=true``, every ``remote.log.manager.task.interval.ms``
(Kafka's broker config; :data:`REMOTE_LOG_MANAGER_TASK_INTERVAL_MS_DEFAULT` here) one round
runs, in a thread (the object store's I/O never blocks the actor's event loop), one round at
a time:

- on the leader: once per leadership (leader epoch) :func:`~raylog.storage.remote.clean_up`
  (orphaned copies a crashed or fenced leader left); then the closed segments wholly below
  the last stable offset are copied one at a time from the next offset to copy of this
  leader's epoch lineage (:func:`~raylog.storage.remote.metadata.plan_copy`), at most
  ``COPIES_PER_ROUND_MAX`` per round; then remote retention (retention.ms / retention.bytes
  over both tiers: :func:`~raylog.storage.remote.metadata.remote_segments_past_retention`);
- on every replica, the leader and its followers alike: the oldest local segments that the
  remote metadata lists as copied (within this replica's own epoch lineage, so a follower
  never deletes offsets its leader's copies do not hold) and that local retention
  (local.retention.ms / local.retention.bytes, -2 following the totals) passes, are
  deleted; the round only counts them, the deletion itself runs on the event loop, as
  retention's does, and moves the log's (local) log start offset. Followers never copy.

Fencing is the metadata's: a copy started under an older leader epoch cannot finish once a
newer leader wrote (FencedLeaderEpochError), and a new leader continues from the last offset
copied in its own lineage. An unreachable object store (or any failure of a round) stops
copying and local deletion alike: nothing is deleted locally unless the metadata was read in
that round; the error is logged and kept (:meth:`TieredReplica.tiering_stats`) and the next
round tries again.

Reads below the local log start (Kafka's localLogStartOffset, this log's log start offset):
a consumer fetch at or above the partition's log start (the remote one: Kafka's
logStartOffset, ``min(remote start, local start)``) is served from the object store by
:class:`~raylog.storage.remote.RemoteReader` in a thread (whole batches of one remote segment,
at most ``max_bytes`` but the first; the process's bounded cache), with the aborted
transactions it overlaps for read_committed; ListOffsets answers earliest (-2) with the
partition's log start, earliest-local (-4, KIP-1005) with the local one, and a timestamp the
local tier is too late for from the remote segments (the first whose max timestamp is late
enough, then its batches and records, as a local lookup). The remote metadata is read at
every remote read, conditionally: the store sends it again only when its ETag changed.

Followers replicate from the leader's local log only: one behind the leader's local log
start truncates fully and starts there (the leader reports
its local log start to followers), and first takes the producer and transaction state there
from the remote tier (KIP-405's follower rebuild; the state machine waits for it:
``follower``): the producer-state snapshot uploaded with the remote segment that ends there,
which a copy takes exactly at the segment's end (:meth:`TieredReplica._snapshot_for`). That
state is written as the replica's local snapshot at once, so a restart keeps it. Where no
remote segment ends there (a DeleteRecords offset, or segments another leader cut
elsewhere), the state starts empty, as without tiering.

DeleteRecords (the leader's, before the local rules of ``delete_records``): the remote
metadata records the partition's new log start (CAS, fenced by the leader epoch) and the
remote segments wholly below it are deleted at once (:func:`~raylog.storage.remote.
move_log_start`); nothing below it is served from the store again, and ListOffsets earliest
answers it. An offset below the local log start is answered there (the local tier is not
touched); one at or above it also moves the local log start, as for any topic. The store
unreachable: the request fails (KAFKA_STORAGE_ERROR) and nothing moves.

The host class provides ``_log``, ``_sm``, ``_loop``, ``_step``, ``_go_offline``, ``topic``
and ``partition``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from raylog.actors.calls import DeleteRecordsOutcome, FetchOutcome
from raylog.actors.control import config_keys
from raylog.actors.producer_snapshots import SnapshotTaker, snapshot_at
from raylog.actors.replication import producer_snapshot
from raylog.actors.replication.messages import LocalLogStartAdvanced, RemoteStateBuilt
from raylog.actors.replication.producer_snapshot import ProducerSnapshot, SnapshotError
from raylog.actors.replication.ready import Role
from raylog.storage import batch as rb
from raylog.storage.batch import records_section
from raylog.storage.errors import (
    FencedLeaderEpochError,
    KafkaStorageError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RaylogError,
    UnknownLeaderEpochError,
)
from raylog.storage.log import Log
from raylog.storage.log.epochs import EpochEntry
from raylog.storage.log.segment_list import ClosedSegment
from raylog.storage.objectstore import ObjectStore, open_object_store
from raylog.storage.records import iter_records
from raylog.storage.remote import (
    RemoteReader,
    clean_up,
    copy_segment,
    delete_segments,
    metadata_store,
    move_log_start,
)
from raylog.storage.remote import metadata as rmeta
from raylog.storage.remote.format import RemotePartition

log = logging.getLogger(__name__)

READ_COMMITTED = 1  # Kafka's IsolationLevel
EARLIEST_LOCAL_TIMESTAMP = -4  # ListOffsets' earliest-local (KIP-1005)

REMOTE_LOG_MANAGER_TASK_INTERVAL_MS_DEFAULT = 30_000  # remote.log.manager.task.interval.ms
COPIES_PER_ROUND_MAX = 16  # bound on the segments one round copies (the rest: next round)


class RemoteStoreLocation(NamedTuple):
    """Where the cluster's object store is: its URL and the S3 endpoint (None: AWS's)."""

    url: str
    s3_endpoint: str | None = None

    def open(self) -> ObjectStore:
        return open_object_store(self.url, endpoint_url=self.s3_endpoint)


class RoundInputs(NamedTuple):
    """What a round needs from the state machine, read on the event loop before it starts."""

    leader_epoch: int  # -1: not the leader (no copy, no clean-up, no remote retention)
    lineage: Sequence[EpochEntry]
    log_end_offset: int
    last_stable_offset: int
    high_watermark: int
    now_ms: int  # wall clock, as segment timestamps


class RoundResult(NamedTuple):
    copied: int
    remote_deleted: int
    local_deletable: int  # the oldest local segments the event loop deletes


class TieredReplica:
    """The tiering task of one replica (see the module docstring)."""

    _log: Log
    _sm: Any
    _loop: asyncio.AbstractEventLoop
    _step: Callable[[Any], None]
    _go_offline: Callable[[str], None]
    _snapshots: SnapshotTaker
    _topic_config: config_keys.TopicConfig  # the host keeps it current (reconfigure)
    topic: str
    partition: int

    def _init_tiering(
        self,
        topic_id: str,
        location: RemoteStoreLocation | None,
        interval_ms: int,
        store_factory: Callable[[], ObjectStore] | None = None,
    ) -> None:
        """``store_factory`` opens the store (default: ``location.open``; tests give one
        that can be cut off). The store is opened at the first round of a tiered topic."""
        self._tier_partition = RemotePartition(topic_id, self.partition)
        self._tier_open = store_factory or (location.open if location is not None else None)
        self._tier_store: ObjectStore | None = None
        self._tier_reader: RemoteReader | None = None
        self._tier_interval_ms = max(1, interval_ms)
        self._tier_checked_ms = 0
        self._tier_task: asyncio.Task[None] | None = None
        self._tier_cleaned_epoch = -1  # the leader epoch whose clean_up ran
        self._tier_state_tasks: set[asyncio.Task[None]] = set()  # remote state reads
        # The producer snapshot the last copy uploaded: (leader epoch, offset, bytes).
        self._tier_carried: tuple[int, int, bytes] | None = None
        # The remote metadata last read, and its ETag (None: not read), for _read_meta.
        self._tier_meta: tuple[rmeta.RemoteLogMetadata, str | None] = (rmeta.EMPTY, None)
        self._tier_stats: dict[str, Any] = {
            "rounds": 0,
            "segments_copied": 0,
            "remote_segments_deleted": 0,
            "local_segments_deleted": 0,
            "orphans_removed": 0,
            "remote_states_taken": 0,
            "last_error": "",
        }

    def _tiering_enabled(self) -> bool:
        return bool(self._topic_config.remote_storage_enable)

    def _maybe_tier(self, monotonic_ms: int) -> None:
        """From the tick: start a round when one is due (see the module docstring)."""
        if self._tier_task is not None or not self._tiering_enabled():
            return
        if monotonic_ms - self._tier_checked_ms < self._tier_interval_ms:
            return
        self._tier_checked_ms = monotonic_ms
        sm = self._sm
        if sm.role not in (Role.LEADER, Role.FOLLOWER):
            return
        inputs = RoundInputs(
            leader_epoch=sm.leader_epoch if sm.role is Role.LEADER else -1,
            lineage=self._log.epoch_entries,
            log_end_offset=self._log.log_end_offset,
            last_stable_offset=sm.last_stable_offset,
            high_watermark=sm.high_watermark,
            now_ms=time.time_ns() // 1_000_000,
        )
        self._tier_task = self._loop.create_task(self._tier(inputs))

    async def _tier(self, inputs: RoundInputs) -> None:
        try:
            result = await asyncio.to_thread(self._tier_round, inputs)
        except Exception as exc:
            # An unreachable store, a fenced copy, a copy that would not tile, a bug: nothing
            # was deleted locally, the replica goes on serving; the next round tries again.
            self._tier_stats["last_error"] = f"{type(exc).__name__}: {exc}"
            log.warning(
                "replica %s-%d: tiered storage round failed: %s",
                self.topic,
                self.partition,
                self._tier_stats["last_error"],
            )
            return
        finally:
            self._tier_task = None
            self._tier_stats["rounds"] += 1
        self._tier_stats["last_error"] = ""
        self._tier_stats["segments_copied"] += result.copied
        self._tier_stats["remote_segments_deleted"] += result.remote_deleted
        if result.local_deletable:
            try:
                deleted = self._log.delete_local_segments(
                    result.local_deletable, min(inputs.high_watermark, self._sm.high_watermark)
                )
            except KafkaStorageError as exc:  # a failed log dir: this replica goes offline
                self._go_offline(str(exc))
                return
            if deleted:
                self._tier_stats["local_segments_deleted"] += deleted
                self._step(LocalLogStartAdvanced(self._log.log_start_offset))

    # -- a follower starting over at its leader's log start ---------------------------------------

    def _build_remote_state(self, offset: int) -> None:
        """The executor's ``build_remote_state``: read the producer state at ``offset`` from
        the remote tier in a thread, then step ``RemoteStateBuilt``."""
        task = self._loop.create_task(self._remote_state(offset))
        self._tier_state_tasks.add(task)
        task.add_done_callback(self._tier_state_tasks.discard)

    async def _remote_state(self, offset: int) -> None:
        failed = ""
        snapshot: ProducerSnapshot | None = None
        try:
            snapshot = await asyncio.to_thread(self._read_remote_state, offset)
        except Exception as exc:  # the store unreachable, a bug: the state machine asks again
            failed = f"{type(exc).__name__}: {exc}"
            log.warning(
                "replica %s-%d: producer state at %d from the remote tier: %s",
                self.topic,
                self.partition,
                offset,
                failed,
            )
        self._step(RemoteStateBuilt(offset, snapshot, failed))
        sm = self._sm
        if (
            snapshot is not None
            and sm.remote_state_wanted is None
            and sm.log.log_end_offset == offset == self._log.log_end_offset
        ):
            try:  # so that a restart starts from it, not from the empty log
                taken = self._snapshots.take(sm.log, force=True)
            except KafkaStorageError as exc:
                self._go_offline(str(exc))
                return
            self._tier_stats["remote_states_taken"] += taken

    def _read_remote_state(self, offset: int) -> ProducerSnapshot | None:
        """The producer-state snapshot at ``offset`` uploaded with the remote segment that
        ends there; None when there is none."""
        store = self._store()
        meta = self._read_meta(store)
        segment = next((s for s in meta.finished() if s.next_offset == offset), None)
        found = (
            None
            if segment is None
            else self._reader().producer_snapshot(self._tier_partition, segment)
        )
        if found is None or found[0] != offset:
            log.info(
                "replica %s-%d: the remote tier holds no producer state at %d; starting empty",
                self.topic,
                self.partition,
                offset,
            )
            return None
        try:
            snapshot = producer_snapshot.decode(found[1])
        except SnapshotError as exc:
            raise KafkaStorageError(f"remote producer snapshot at {offset}: {exc}") from exc
        if snapshot.offset != offset or not snapshot.usable(offset, offset, offset):
            raise KafkaStorageError(f"remote producer snapshot at {offset} is not usable there")
        return snapshot

    def _log_start_for_clients(self, local_start: int) -> int:
        """The partition's log start (Kafka's logStartOffset): the remote log's first offset
        when it is below the local one (as last read from the metadata)."""
        remote = int(self._tier_stats.get("remote_log_start_offset", -1))
        if not self._tiering_enabled() or remote < 0:
            return local_start
        return min(remote, local_start)

    def _below_local(self, offset: int) -> bool:
        """Whether ``offset`` is for the object store to serve."""
        return self._tiering_enabled() and 0 <= offset < self._log.log_start_offset

    def _epoch_error(self, current_leader_epoch: int) -> int:
        """A remote read's fencing, as the state machine checks a consumer fetch: 0 when it
        may go on, else Kafka's error code."""
        sm = self._sm
        if sm.role not in (Role.LEADER, Role.FOLLOWER):
            return NotLeaderOrFollowerError.error_code
        if 0 <= current_leader_epoch < sm.leader_epoch:
            return FencedLeaderEpochError.error_code
        if current_leader_epoch > sm.leader_epoch:
            return UnknownLeaderEpochError.error_code
        return 0

    async def _remote_fetch(
        self, fetch_offset: int, max_bytes: int, current_leader_epoch: int, isolation_level: int
    ) -> FetchOutcome:
        """A consumer fetch below the local log start, served from the object store."""
        sm = self._sm
        error = self._epoch_error(current_leader_epoch)
        if error:
            return FetchOutcome(error, -1, -1, -1, b"", sm.leader_epoch)
        try:
            records, aborted = await asyncio.to_thread(
                self._remote_read, fetch_offset, max(1, max_bytes), isolation_level
            )
        except RaylogError as exc:  # out of range, corrupt, the store unreachable
            return FetchOutcome(
                exc.error_code, -1, -1, -1, b"", sm.leader_epoch, f"remote read: {exc}"
            )
        return FetchOutcome(
            0,
            sm.high_watermark,
            sm.last_stable_offset,
            self._log_start_for_clients(self._log.log_start_offset),
            records,
            sm.leader_epoch,
            aborted_transactions=aborted,
        )

    def _remote_list_offset(self, timestamp: int) -> tuple[int, int] | None:
        """ListOffsets by time over the remote segments below the local log start:
        ``(timestamp, offset)`` of the first record that late, None when the remote tier
        holds none (the local tier is asked then)."""
        store, partition = self._store(), self._tier_partition
        meta = self._read_meta(store)
        local_start = self._log.log_start_offset
        for segment in meta.finished():
            if segment.base_offset >= local_start:
                return None
            if segment.max_timestamp_ms < timestamp or segment.end_offset < meta.log_start_offset:
                continue
            offset = max(segment.base_offset, meta.log_start_offset)  # DeleteRecords' start
            while offset <= segment.end_offset:  # bounded: each round moves on a batch
                for data in self._reader().read(partition, segment, offset, 1 << 20):
                    header = rb.parse_header(data)
                    first = max(header.base_offset, meta.log_start_offset)
                    offset = header.next_offset
                    if header.max_timestamp >= timestamp:
                        found = first_record_at(data, first, timestamp)
                        if found is not None:
                            return found
        return None

    async def _tiered_delete_records(self, wanted: int) -> DeleteRecordsOutcome | None:
        """DeleteRecords to ``wanted`` (in range) on a tiered leader: move the remote log's
        start (module docstring); the answer when that is all, None when the local log start
        moves too."""
        epoch = self._sm.leader_epoch
        try:
            meta = await asyncio.to_thread(
                move_log_start, self._store(), self._tier_partition, wanted, epoch
            )
        except RaylogError as exc:
            return DeleteRecordsOutcome(exc.error_code, -1, f"remote log: {exc}")
        self._note_meta(meta)
        if wanted < self._log.log_start_offset:
            return DeleteRecordsOutcome(0, wanted, "")
        return None

    def _remote_next_offset(self) -> int:
        """The offset after the remote log's last (ListOffsets -5), -1 when none is copied."""
        meta = self._read_meta(self._store())
        finished = meta.finished()
        return finished[-1].next_offset if finished else -1

    def _remote_read(
        self, offset: int, max_bytes: int, isolation_level: int
    ) -> tuple[bytes, tuple[tuple[int, int], ...]]:
        store, partition = self._store(), self._tier_partition
        segment = rmeta.segment_for_offset(self._read_meta(store), offset)
        if segment is None:
            raise OffsetOutOfRangeError(
                f"offset {offset} is below the log start offset of {self.topic}-{self.partition}"
            )
        batches = self._reader().read(partition, segment, offset, max_bytes)
        aborted: tuple[tuple[int, int], ...] = ()
        if isolation_level == READ_COMMITTED and batches:
            upper = rb.parse_header(batches[-1]).next_offset
            txns = self._reader().aborted_txns(partition, segment, offset, upper)
            aborted = tuple((t.producer_id, t.first_offset) for t in txns)
        return b"".join(batches), aborted

    def _store(self) -> ObjectStore:
        if self._tier_open is None:
            raise KafkaStorageError(
                "remote.storage.enable is set but this broker knows no object store"
            )
        if self._tier_store is None:
            self._tier_store = self._tier_open()
        return self._tier_store

    def _reader(self) -> RemoteReader:
        if self._tier_reader is None:
            self._tier_reader = RemoteReader(self._store())
        return self._tier_reader

    def _read_meta(self, store: ObjectStore) -> rmeta.RemoteLogMetadata:
        """The remote metadata, fresh (the store re-sends it only when its ETag changed); the
        remote log start it gives is kept."""
        held = metadata_store.read_newer(store, self._tier_partition, self._tier_meta)
        self._tier_meta = held
        self._note_meta(held[0])
        return held[0]

    def _note_meta(self, meta: rmeta.RemoteLogMetadata) -> None:
        """Keep the remote log start and next offset ``meta`` gives (-1: nothing served)."""
        start = rmeta.log_start_offset(meta)
        finished = meta.finished()
        self._tier_stats["remote_log_start_offset"] = -1 if start is None else start
        self._tier_stats["remote_next_offset"] = finished[-1].next_offset if finished else -1

    async def tiering_stats(self) -> dict[str, Any]:
        """What tiered storage did on this replica: rounds, segments copied, remote segments
        deleted by retention, local segments deleted, orphans removed, producer states taken
        from the remote tier (a follower starting over), the last round's error ("" when it
        succeeded), and the remote log's first and next offsets (-1: none copied, or not read
        yet)."""
        stats = dict(self._tier_stats)
        stats.setdefault("remote_log_start_offset", -1)
        stats.setdefault("remote_next_offset", -1)
        return stats

    # -- the round, in a thread -------------------------------------------------------------------

    def _tier_round(self, inputs: RoundInputs) -> RoundResult:
        store, partition = self._store(), self._tier_partition
        copied = remote_deleted = 0
        if inputs.leader_epoch >= 0:
            if self._tier_cleaned_epoch != inputs.leader_epoch:
                self._tier_stats["orphans_removed"] += clean_up(
                    store, partition, inputs.leader_epoch
                )
                self._tier_cleaned_epoch = inputs.leader_epoch
            copied = self._copy_closed(store, inputs)
            remote_deleted = self._remote_retention(store, inputs)
        meta = self._read_meta(store)
        closed = self._log.closed_segments()
        cfg = self._topic_config
        local = rmeta.local_segments_deletable(
            closed,
            self._log.active_segment_size_bytes,
            _highest_copied(meta, inputs),
            inputs.now_ms,
            rmeta.effective_local_retention(cfg.local_retention_ms, cfg.retention_ms),
            rmeta.effective_local_retention(cfg.local_retention_bytes, cfg.retention_bytes),
        )
        return RoundResult(copied, remote_deleted, local)

    def _copy_closed(self, store: ObjectStore, inputs: RoundInputs) -> int:
        """Copy the closed segments below the last stable offset, one at a time."""
        copied = 0
        while copied < COPIES_PER_ROUND_MAX:
            meta, _ = metadata_store.read(store, self._tier_partition)
            closed = self._log.closed_segments()
            plan = rmeta.plan_copy(
                meta,
                inputs.lineage,
                inputs.log_end_offset,
                self._log.log_start_offset,
                closed,
                inputs.last_stable_offset,
            )
            if plan is None:
                return copied
            files = closed[plan.segment]
            copy_segment(
                store,
                self._tier_partition,
                files,
                from_offset=plan.from_offset,
                leader_epoch=inputs.leader_epoch,
                index_interval_bytes=self._log.config.index_interval_bytes,
                producer_snapshot=self._snapshot_for(files, inputs.leader_epoch),
            )
            copied += 1
        return copied

    def _snapshot_for(self, files: ClosedSegment, leader_epoch: int) -> tuple[int, bytes] | None:
        """The producer-state snapshot at the segment's next offset, uploaded with it (what a
        follower starting over there takes): the newest snapshot between the log start and
        that offset (the log's own, or the one the previous copy of this leadership carried
        forward) carried forward over the producer batches in between, or without one the
        state the local log rebuilds up to there; None when a snapshot is unreadable. A
        backlog of copies (tiering turned on for a long log) thus replays each segment's
        headers once, not every segment's before it again."""
        end, start = files.next_offset, self._log.log_start_offset
        base, data = start, None
        carried = self._tier_carried
        if carried is not None and carried[0] == leader_epoch and start <= carried[1] <= end:
            base, data = carried[1], carried[2]
        for offset in self._log.producer_snapshot_offsets():  # newest first
            if offset > end:
                continue
            if offset < base or (offset == base and data is not None):
                break  # the carried one is as new
            if (found := self._log.read_producer_snapshot(offset)) is not None:
                base, data = offset, found
                break
        if data is None or base != end:
            try:
                data = snapshot_at(data, base, end, self._log.producer_batch_headers(base))
            except SnapshotError as exc:
                log.warning(
                    "replica %s-%d: snapshot at %d: %s", self.topic, self.partition, base, exc
                )
                return None
        self._tier_carried = (leader_epoch, end, data)
        return end, data

    def _remote_retention(self, store: ObjectStore, inputs: RoundInputs) -> int:
        """Delete the remote segments past retention.ms / retention.bytes over both tiers."""
        meta, _ = metadata_store.read(store, self._tier_partition)
        highest = _highest_copied(meta, inputs)
        local_only = self._log.active_segment_size_bytes + sum(
            s.size_bytes
            for s in self._log.closed_segments()
            if highest is None or s.next_offset - 1 > highest
        )
        cfg = self._topic_config
        gone = rmeta.remote_segments_past_retention(
            meta,
            inputs.now_ms,
            cfg.retention_ms,
            cfg.retention_bytes,
            local_only,
            log_start_offset=meta.log_start_offset,
        )
        if gone:
            ids = [s.segment_id for s in gone]
            delete_segments(store, self._tier_partition, ids, inputs.leader_epoch)
        return len(gone)


def first_record_at(data: bytes, batch_offset: int, timestamp: int) -> tuple[int, int] | None:
    """``(timestamp, offset)`` of the first record at or above ``batch_offset`` whose timestamp
    is at least ``timestamp`` in the batch ``data`` (Kafka's record precision, as its
    LogSegment.findOffsetByTimestamp reads records inside the batch it found)."""
    header = rb.parse_header(data, 0)
    for record in iter_records(records_section(data, header), header.records_count):
        offset = header.base_offset + record.offset_delta
        stamp = (
            header.max_timestamp
            if header.is_log_append_time
            else header.base_timestamp + record.timestamp_delta
        )
        if offset >= batch_offset and stamp >= timestamp:
            return stamp, offset
    return None


def _highest_copied(meta: rmeta.RemoteLogMetadata, inputs: RoundInputs) -> int | None:
    """The highest offset copied within this replica's own epoch lineage (None: none)."""
    start = rmeta.next_copy_offset(meta, inputs.lineage, inputs.log_end_offset).offset
    return None if start is None else start - 1
