"""The group coordinator of one gateway: consumer groups kept in ``__consumer_offsets``.

This module owns the asyncio side of Kafka's classic group protocol: which groups this broker
coordinates, loading them from the internal topic, writing their records, waking the JoinGroup
and SyncGroup requests that wait for a rebalance, and the timer that expires sessions. Every
decision about one group is :class:`~raylog.gateway.groups.group.Group`'s (pure, unit-tested); this
class feeds it requests and time and carries out what it returns.

Ownership, as Kafka's brokers do it (the shared machinery is ``gateway/internal_topic.py``'s):

1. A group lives in partition ``abs(java_hash(group_id)) % partitions`` of ``__consumer_offsets``;
   the broker leading that partition is its coordinator. The topic is created through the
   controller on the first FindCoordinator (RF = min(``offsets.topic.replication.factor``, live
   brokers)) with Kafka's configs (:data:`OFFSETS_TOPIC_CONFIGS`: compacted); an existing
   topic without compaction is given ``cleanup.policy=compact``, its other overrides kept.
2. Every ``TICK_MS`` (``internal_topic.py``) the coordinator refreshes which partitions this
   broker leads, loading those it gains. A group request that arrives while its partition loads
   waits for the load, and so does one that arrives before this broker's metadata shows who
   leads the partition (a client learns the coordinator from any gateway, whose metadata may be
   fresher than this one's); past ``LOAD_WAIT_MS`` it gets COORDINATOR_LOAD_IN_PROGRESS (14) or
   NOT_COORDINATOR (16). Answering those at once would fail clients: librdkafka retries an
   OffsetCommit answered 14 twice, a few hundred milliseconds apart, then hands the error to the
   application, so the first commit of a group on a fresh cluster (whose ``__consumer_offsets``
   partitions are created and loaded then) would fail. A request for a partition another broker
   leads gets NOT_COORDINATOR at once; ListGroups and DescribeGroups answer 14 at once while
   loading (admin clients retry them). On losing a partition its groups are dropped and their
   waiting requests get NOT_COORDINATOR.
3. Loading replays the partition behind a barrier record (``replay.py``): the last record of a
   key wins and a null value (a tombstone) deletes. The barrier is a tombstone of group "",
   which no group can have (Kafka's own loader would read it as a no-op too). A group's
   metadata record names each static member's ``group_instance_id``, so the new coordinator
   fences the same old member ids.
4. Writes (offset commits, a group's metadata after each completed rebalance or static
   member's takeover of a Stable group) are appended with acks=all through the backend's
   produce path, one at a time per partition, and applied to the group only once acknowledged.
   Produce errors become Kafka's coordinator errors (:data:`_STORE_ERRORS`).

5. Deleting a group (DeleteGroups) or offsets (OffsetDelete) writes tombstones (null values)
   for the group's metadata key and each deleted offset's key with acks=all, and changes the
   group only once they are acknowledged, so a new coordinator replaying the partition does
   not bring them back. The group's lock is held across the write, so no request changes it
   in between; a request that was waiting on it finds it Dead (COORDINATOR_NOT_AVAILABLE).

6. Offset expiry (KIP-211): every ``offsets.retention.check.interval.ms`` the coordinator
   tombstones the committed offsets past ``offsets.retention.minutes`` by Kafka's rules
   (:func:`group_admin.plan_offset_expiry`: a group Empty that long loses them all, and then itself)
   with acks=all, and applies that once acknowledged, as OffsetDelete does.

7. Transactional offset commits (TxnOffsetCommit, KIP-98/447): the offsets are appended with
   acks=all as one transactional batch of the producer, then kept pending in the group
   (``txn_offsets.py``) until the transaction coordinator reports its marker written to the
   group's partition (:meth:`GroupCoordinator.complete_transaction`). Loading reads the same
   from the log (``replay.py``): a transaction still open when the load ends stays pending.

8. Cross-cluster links (``actors/control/link_groups.py``): the commits of a group's offsets
   that an active link mirrors are refused (:meth:`GroupCoordinator.refused_commits`, asked by
   the OffsetCommit and TxnOffsetCommit handlers; the broker logs why, naming the link), and
   the link's sync writes them (:meth:`GroupCoordinator.sync_mirrored_offsets`) into groups
   without members only, under the group's lock, so no JoinGroup slips in between.

The log cleaner compacts the topic: a key's older records and, after ``delete.retention.ms``, its
tombstones are removed, so loading reads little more than the live groups and offsets. A
compact-only topic is never shrunk by retention, so no live offset is lost to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from raylog.gateway.backend import DataBackend
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups import group_admin
from raylog.gateway.groups import records as gr
from raylog.gateway.groups.group import (
    CommittedOffset,
    Group,
    GroupState,
    JoinResult,
    MemberIdentity,
    SyncResult,
)
from raylog.gateway.groups.group_admin import GroupDescription, GroupListing, OffsetDeletePlan
from raylog.gateway.groups.replay import BARRIER_GROUP, OFFSETS_TOPIC, GroupReplay
from raylog.gateway.internal_topic import (
    STORE_ERRORS,
    ConfigureTopic,
    CoordinatorNode,
    CreateTopic,
    InternalTopic,
    KeyLocks,
)
from raylog.storage import batch as rb

__all__ = [
    "OFFSETS_TOPIC",
    "CommitRefusals",
    "GroupCoordinator",
    "MirroredOffsets",
    "OffsetFetchResult",
]

log = logging.getLogger(__name__)

OFFSETS_RETENTION_MS_DEFAULT = 7 * 24 * 3600 * 1000  # offsets.retention.minutes = 10080
OFFSETS_RETENTION_CHECK_INTERVAL_MS_DEFAULT = 600_000  # offsets.retention.check.interval.ms
# The most a group request waits for its partition to be loaded here, or for this broker's
# metadata to show who leads the partition, before answering (module docstring, step 2).
LOAD_WAIT_MS = 10_000
WAIT_MARGIN_MS = 5_000  # beyond a rebalance timeout, the most a JoinGroup/SyncGroup waits
# A refused commit of the same group for the same reason is logged once per this interval
# (consumers auto-commit every few seconds); the memory of what was logged is bounded.
REFUSAL_LOG_INTERVAL_MS = 60_000
MAX_REFUSALS_REMEMBERED = 10_000

# (group id, topics) -> each topic whose offsets of the group a link owns, with why (the
# message names the link); empty when none.
CommitRefusals = Callable[[str, Sequence[str]], Mapping[str, str]]

# Kafka's __consumer_offsets configs (offsets.topic.segment.bytes: 100 MiB, compacted).
OFFSETS_TOPIC_CONFIGS: Mapping[str, str] = {
    "cleanup.policy": "compact",
    "segment.bytes": "104857600",
}

# Produce errors -> what a group client is told (Kafka's GroupMetadataManager mapping).
_STORE_ERRORS: Mapping[int, int] = {
    **STORE_ERRORS,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}

# What the replica answers a transactional batch of a fenced or stale producer: the producer
# is told as it is (Kafka's storeOffsets passes them through), so that it aborts or closes.
_FENCING_ERRORS = frozenset(
    {ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_TXN_STATE, ErrorCode.PRODUCER_FENCED}
)


class OffsetFetchResult(NamedTuple):
    error_code: int  # the group-level error
    offsets: Mapping[tuple[str, int], CommittedOffset | None]


class MirroredOffsets(NamedTuple):
    """What :meth:`GroupCoordinator.sync_mirrored_offsets` did."""

    error_code: int
    active: bool = False  # the group has members here: nothing written
    written: int = 0  # offsets that changed and were written


@dataclass
class _Partition:
    """One ``__consumer_offsets`` partition this broker leads."""

    leader_epoch: int
    loaded: bool = False
    groups: dict[str, Group] = field(default_factory=dict)
    # Group -> wall-clock ms since which it has been Empty (KIP-211's currentStateTimestamp):
    # from its metadata record when loaded Empty, else when a tick first saw it Empty.
    empty_since: dict[str, int] = field(default_factory=dict)
    loader: asyncio.Task[None] | None = None
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _unknown_group_as(error: int, code: int) -> int:
    """``code`` for a group this coordinator does not have (Kafka answers a Heartbeat,
    SyncGroup or LeaveGroup for one UNKNOWN_MEMBER_ID, and a generation's OffsetCommit
    ILLEGAL_GENERATION, so that the client rejoins); any other error as it is."""
    return code if error == ErrorCode.GROUP_ID_NOT_FOUND else error


class GroupCoordinator:
    """The groups of the ``__consumer_offsets`` partitions that broker ``broker_id`` leads."""

    def __init__(
        self,
        backend: DataBackend,
        broker_id: int,
        *,
        offsets_topic_num_partitions: int = 3,
        offsets_topic_replication_factor: int = 3,
        create_topic: CreateTopic | None = None,
        configure_topic: ConfigureTopic | None = None,
        initial_rebalance_delay_ms: int = 0,
        offsets_retention_ms: int = OFFSETS_RETENTION_MS_DEFAULT,
        offsets_retention_check_interval_ms: int = OFFSETS_RETENTION_CHECK_INTERVAL_MS_DEFAULT,
        load_wait_ms: int = LOAD_WAIT_MS,
        monotonic_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        commit_refusals: CommitRefusals | None = None,
    ) -> None:
        self._backend = backend
        self._commit_refusals = commit_refusals
        self._refusals_logged: dict[tuple[str, str], int] = {}  # (group, message) -> when
        self.broker_id = broker_id
        self._topic: InternalTopic[_Partition, GroupReplay] = InternalTopic(
            backend,
            broker_id,
            OFFSETS_TOPIC,
            OFFSETS_TOPIC_CONFIGS,
            num_partitions=offsets_topic_num_partitions,
            replication_factor=offsets_topic_replication_factor,
            barrier=self._barrier,
            new_partition=_Partition,
            new_replay=GroupReplay,
            loaded=self._loaded,
            unloaded=self._unloaded,
            create_topic=create_topic,
            configure_topic=configure_topic,
            monotonic_ms=monotonic_ms,
        )
        self._initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self._retention_ms = offsets_retention_ms
        self._retention_check_ms = offsets_retention_check_interval_ms
        self._last_retention_check_ms: int | None = None
        self._expiring: asyncio.Task[None] | None = None
        self._now = monotonic_ms
        self._wall = wall_ms
        self._lock = KeyLocks()  # per group id
        # (group, member, "join" | "sync") -> the request waiting for that answer.
        self._waiters: dict[tuple[str, str, str], asyncio.Future[Any]] = {}
        self._load_wait_ms = load_wait_ms

    @property
    def _owned(self) -> dict[int, _Partition]:
        return self._topic.owned

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self._topic.start(self._tick, "group coordinator")

    async def stop(self) -> None:
        await self._topic.stop(self._expiring)

    def loaded_partitions(self) -> list[int]:
        return self._topic.loaded_partitions()

    # --- FindCoordinator ------------------------------------------------------------------------

    async def find_coordinator(self, group_id: str) -> CoordinatorNode:
        return await self._topic.find_coordinator(group_id)

    async def set_up_topic(self) -> None:
        """Create ``__consumer_offsets`` now, as the first FindCoordinator would (`raylog up`
        does this before it says ready, so that a cluster's first group is served at once);
        nothing when it exists. Raises what the creation raised."""
        await self._topic.set_up_topic()

    # --- JoinGroup / SyncGroup / Heartbeat / LeaveGroup ----------------------------------------

    async def join_group(
        self,
        *,
        group_id: str,
        member_id: str,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        require_known_member_id: bool,
        group_instance_id: str | None = None,
    ) -> JoinResult:
        group, error = await self._serving_group(group_id, create=True)
        if group is None:
            return JoinResult(error, member_id=member_id)
        # Kafka's generateMemberId: a static member's id starts with its instance id.
        new_member_id = f"{group_instance_id or client_id}-{uuid.uuid4()}"
        async with self._lock(group_id):
            result = group.join(
                member_id=member_id,
                client_id=client_id,
                client_host=client_host,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
                protocol_type=protocol_type,
                protocols=protocols,
                require_known_member_id=require_known_member_id,
                new_member_id=new_member_id,
                now_ms=self._now(),
                initial_rebalance_delay_ms=self._initial_rebalance_delay_ms,
                group_instance_id=group_instance_id,
            )
            waiter = None
            if result is None:
                waiter = self._wait_for(group_id, member_id or new_member_id, "join")
            await self._settle(group)
        if waiter is None:
            assert result is not None
            return result
        try:
            async with asyncio.timeout((rebalance_timeout_ms + WAIT_MARGIN_MS) / 1000):
                return await waiter  # type: ignore[no-any-return]
        except TimeoutError:
            return JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member_id=member_id)

    async def sync_group(
        self,
        *,
        group_id: str,
        member_id: str,
        generation_id: int,
        assignments: Mapping[str, bytes],
        group_instance_id: str | None = None,
    ) -> SyncResult:
        group, error = await self._serving_group(group_id, create=False)
        if group is None:
            return SyncResult(_unknown_group_as(error, ErrorCode.UNKNOWN_MEMBER_ID))
        async with self._lock(group_id):
            result = group.sync(
                member_id=member_id,
                generation_id=generation_id,
                assignments=assignments,
                now_ms=self._now(),
                group_instance_id=group_instance_id,
            )
            waiter = self._wait_for(group_id, member_id, "sync") if result is None else None
            await self._settle(group)
        if waiter is None:
            assert result is not None
            return result
        member = group.members.get(member_id)
        timeout_ms = (member.rebalance_timeout_ms if member else 0) + WAIT_MARGIN_MS
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                return await waiter  # type: ignore[no-any-return]
        except TimeoutError:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)

    async def heartbeat(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
    ) -> int:
        group, error = await self._serving_group(group_id, create=False)
        if group is None:
            return _unknown_group_as(error, ErrorCode.UNKNOWN_MEMBER_ID)
        async with self._lock(group_id):
            return group.heartbeat(
                member_id=member_id,
                generation_id=generation_id,
                now_ms=self._now(),
                group_instance_id=group_instance_id,
            )

    async def leave_group(
        self, group_id: str, members: Sequence[MemberIdentity]
    ) -> tuple[int, list[int]]:
        """(group error, one error per member)."""
        group, error = await self._serving_group(group_id, create=False)
        if error == ErrorCode.GROUP_ID_NOT_FOUND:
            # Kafka asks the group, finds none, and answers each member UNKNOWN_MEMBER_ID.
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(members)
        if group is None:
            return error, [error] * len(members)
        async with self._lock(group_id):
            codes = [group.leave(m.member_id, self._now(), m.group_instance_id) for m in members]
            await self._settle(group)
        return ErrorCode.NONE, codes

    # --- OffsetCommit / OffsetFetch -------------------------------------------------------------

    async def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        offsets: Mapping[tuple[str, int], tuple[int, int, str | None]],
        group_instance_id: str | None = None,
    ) -> int:
        """Write ``(topic, partition) -> (offset, leader_epoch, metadata)``; one error for all."""
        group, error = await self._serving_group(group_id, create=generation_id < 0)
        if group is None:
            # A commit with a generation, to a group that does not exist: from an older
            # generation of a group since removed (Kafka's answer).
            return _unknown_group_as(error, ErrorCode.ILLEGAL_GENERATION)
        async with self._lock(group_id):
            error = group.validate_commit(member_id, generation_id, group_instance_id)
            if error:
                return error
            if not offsets:
                return ErrorCode.NONE
            error, committed = await self._write_offsets(group_id, offsets)
            if error == ErrorCode.NONE:
                group.commit(member_id, committed, self._now())
            return error

    async def commit_transactional_offsets(
        self,
        *,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        offsets: Mapping[tuple[str, int], tuple[int, int, str | None]],
    ) -> tuple[int, Mapping[tuple[str, int], int]]:
        """TxnOffsetCommit (module docstring, step 7): write ``(topic, partition) -> (offset,
        leader_epoch, metadata)`` as one transactional batch of ``producer_id``, pending in the
        group until :meth:`complete_transaction`. Returns (group error, partition errors): a
        group error applies to every partition (nothing written); otherwise each partition's
        own (0 once written).

        Kafka's GroupCoordinator.handleTxnCommitOffsets: an unknown group is created Empty, and
        the member checks are :meth:`Group.validate_txn_commit`'s.
        """
        group, error = await self._serving_group(group_id, create=True)
        if group is None:
            return error, {}
        async with self._lock(group_id):
            error = group.validate_txn_commit(member_id, generation_id, group_instance_id)
            if error:
                return error, {}
            if not offsets:
                return ErrorCode.NONE, {}
            error, committed = await self._write_offsets(
                group_id, offsets, producer=(producer_id, producer_epoch)
            )
            if error:
                return error, {}
            group.pending_txn.add(producer_id, committed)
        return ErrorCode.NONE, dict.fromkeys(committed, ErrorCode.NONE)

    def complete_transaction(self, offsets_partition: int, producer_id: int, commit: bool) -> None:
        """The COMMIT (``commit``) or ABORT marker of ``producer_id`` is written to
        ``__consumer_offsets`` partition ``offsets_partition``: each of its groups materializes
        or drops that producer's pending offsets. Nothing when the partition is not loaded
        here: the replay of the next load reads the marker."""
        owned = self._owned.get(offsets_partition)
        if owned is None or not owned.loaded:
            return
        for group in owned.groups.values():
            if group.state is not GroupState.DEAD:
                group.pending_txn.complete(producer_id, commit, group.offsets)

    def has_pending(self, group_id: str, topic: str, partition: int) -> bool:
        """Whether an open transaction holds an offset of the group's ``(topic, partition)``
        (OffsetFetch v7+ with require_stable answers it UNSTABLE_OFFSET_COMMIT, 88)."""
        group, _ = self._group(group_id, create=False)
        return group is not None and group.pending_txn.has((topic, partition))

    # --- cross-cluster links (module docstring, step 8) ------------------------------------------

    def refused_commits(self, group_id: str, topics: Iterable[str]) -> set[str]:
        """The topics among ``topics`` whose offsets of ``group_id`` an active link mirrors:
        a commit of them is refused (the handlers answer INVALID_REQUEST). Logs why, naming
        the link, once per group and reason per ``REFUSAL_LOG_INTERVAL_MS``."""
        if self._commit_refusals is None:
            return set()
        refusals = self._commit_refusals(group_id, sorted(set(topics)))
        now = self._now()
        for message in set(refusals.values()):
            key = (group_id, message)
            last = self._refusals_logged.get(key)
            if last is not None and now - last < REFUSAL_LOG_INTERVAL_MS:
                continue
            if len(self._refusals_logged) >= MAX_REFUSALS_REMEMBERED:
                self._refusals_logged.clear()
            self._refusals_logged[key] = now
            log.warning("commit refused: %s", message)
        return set(refusals)

    def coordinates(self, group_id: str) -> bool:
        """Whether this broker serves ``group_id`` now (its partition led and loaded here)."""
        owned = self._topic.owner_of(group_id)
        return owned is not None and owned.loaded

    async def sync_mirrored_offsets(
        self, group_id: str, offsets: Mapping[tuple[str, int], int]
    ) -> MirroredOffsets:
        """Write a link's mirrored ``(topic, partition) -> offset`` into ``group_id`` (created
        Empty if new) as committed offsets with leader epoch -1, only those that differ from
        the group's; nothing when the group has members here (``active``)."""
        group, error = self._group(group_id, create=True)
        if group is None:
            return MirroredOffsets(error)
        async with self._lock(group_id):
            if group.state is GroupState.DEAD:
                return MirroredOffsets(self._dead_error(group_id))
            if group.members or group.pending_members:
                return MirroredOffsets(ErrorCode.NONE, active=True)
            changed: dict[tuple[str, int], tuple[int, int, str | None]] = {}
            for tp, offset in sorted(offsets.items()):
                current = group.offsets.get(tp)
                if current is None or current.offset != offset:
                    changed[tp] = (offset, -1, "")
            if not changed:
                return MirroredOffsets(ErrorCode.NONE)
            error, committed = await self._write_offsets(group_id, changed)
            if error:
                return MirroredOffsets(error)
            group.commit("", committed, self._now())
        return MirroredOffsets(ErrorCode.NONE, written=len(committed))

    async def _write_offsets(
        self,
        group_id: str,
        offsets: Mapping[tuple[str, int], tuple[int, int, str | None]],
        *,
        producer: tuple[int, int] | None = None,
    ) -> tuple[int, dict[tuple[str, int], CommittedOffset]]:
        """Append one OffsetCommit record per partition (a transactional batch of ``producer``
        (id, epoch) when given): the error, and the offsets as written, each with its record's
        log offset."""
        wall = self._wall()
        items = [
            ((topic, partition), CommittedOffset(offset, epoch, metadata or "", wall))
            for (topic, partition), (offset, epoch, metadata) in offsets.items()
        ]
        records = [
            (
                gr.encode_key(gr.OffsetCommitKey(group_id, topic, partition)),
                gr.encode_value(gr.OffsetCommitValue(c.offset, c.leader_epoch, c.metadata, wall)),
            )
            for (topic, partition), c in items
        ]
        error, base_offset = await self._append_at(group_id, records, producer)
        if error:
            return error, {}
        return ErrorCode.NONE, {
            tp: c._replace(log_offset=base_offset + i) for i, (tp, c) in enumerate(items)
        }

    async def fetch_offsets(
        self, group_id: str, partitions: Sequence[tuple[str, int]] | None
    ) -> OffsetFetchResult:
        group, error = await self._serving_group(group_id, create=False)
        if error == ErrorCode.GROUP_ID_NOT_FOUND:
            # A group never seen has no offsets: -1 everywhere, no error (as Kafka).
            return OffsetFetchResult(ErrorCode.NONE, dict.fromkeys(partitions or (), None))
        if group is None:
            return OffsetFetchResult(error, {})
        return OffsetFetchResult(ErrorCode.NONE, group.fetch_offsets(partitions))

    # --- ListGroups / DescribeGroups / DeleteGroups / OffsetDelete -------------------------------

    def list_groups(self) -> tuple[int, list[GroupListing]]:
        """Every group of the partitions this broker leads; COORDINATOR_LOAD_IN_PROGRESS with
        the groups loaded so far while one is still loading (as Kafka)."""
        listings = [
            group_admin.listing(group)
            for owned in self._owned.values()
            if owned.loaded
            for group in owned.groups.values()
            if group.exists()
        ]
        loading = any(not owned.loaded for owned in self._owned.values())
        error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if loading else ErrorCode.NONE
        return error, sorted(listings)

    def describe_group(self, group_id: str) -> tuple[int, GroupDescription]:
        """(error, description). A group that does not exist (or the empty id, which Kafka
        accepts here) is Dead with GROUP_ID_NOT_FOUND, which DescribeGroups answers as no error
        before v6; a group this broker cannot answer for has state "" and the error."""
        group, error = self._group(group_id, create=False) if group_id else (None, 0)
        if group is not None and group.exists():
            return ErrorCode.NONE, group_admin.describe(group)
        if error in (ErrorCode.NONE, ErrorCode.GROUP_ID_NOT_FOUND):
            return ErrorCode.GROUP_ID_NOT_FOUND, GroupDescription(GroupState.DEAD.value, "", "")
        return error, GroupDescription("", "", "")

    async def delete_group(self, group_id: str) -> int:
        """DeleteGroups for one group: tombstones for its metadata and every offset."""
        group, error = await self._serving_group(group_id, create=False)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND if error == ErrorCode.INVALID_GROUP_ID else error
        async with self._lock(group_id):
            if group.state is GroupState.DEAD:  # unloaded or deleted while this request waited
                return self._dead_error(group_id)
            error = group_admin.check_delete(group)
            if error:
                return error
            # Tombstones for the offsets of open transactions too, which they drop.
            held = set(group.offsets) | group.pending_txn.partitions()
            keys = [gr.GroupMetadataKey(group_id)]
            keys += [gr.OffsetCommitKey(group_id, t, p) for t, p in sorted(held)]
            error = await self._append(group_id, [(gr.encode_key(k), None) for k in keys])
            if error:
                return error
            self._drop(group)
        return ErrorCode.NONE

    async def delete_offsets(
        self, group_id: str, partitions: Sequence[tuple[str, int]]
    ) -> tuple[int, Mapping[tuple[str, int], int]]:
        """OffsetDelete: (group error, each partition's error)."""
        group, error = await self._serving_group(group_id, create=False)
        if group is None:
            return error, {}
        async with self._lock(group_id):
            if group.state is GroupState.DEAD:
                return self._dead_error(group_id), {}
            plan = group_admin.plan_offset_delete(group, partitions)
            if plan.error_code:
                return plan.error_code, {}
            error = await self._remove_offsets(group, plan)
            if error:
                return error, {}
        return ErrorCode.NONE, plan.partition_errors

    async def _remove_offsets(self, group: Group, plan: OffsetDeletePlan) -> int:
        """Tombstones for ``plan``'s offsets (and the group's metadata when it goes too), then,
        once acknowledged, the change; the caller holds the group's lock."""
        keys: list[gr.Key] = [gr.OffsetCommitKey(group.group_id, t, p) for t, p in plan.remove]
        if plan.delete_group:
            keys.append(gr.GroupMetadataKey(group.group_id))
        if keys:
            error = await self._append(group.group_id, [(gr.encode_key(k), None) for k in keys])
            if error:
                return error
        group.remove_offsets(plan.remove)
        if plan.delete_group:
            self._drop(group)
        return ErrorCode.NONE

    def _dead_error(self, group_id: str) -> int:
        """For a group found Dead: NOT_COORDINATOR if its partition left this broker, else it
        was deleted (Kafka's ``groupNotExists`` check)."""
        partition = self._partition_of(group_id)
        owned = self._owned.get(partition) if partition is not None else None
        return ErrorCode.GROUP_ID_NOT_FOUND if owned is not None else ErrorCode.NOT_COORDINATOR

    def _drop(self, group: Group) -> None:
        """Forget a group whose tombstones are written."""
        group.delete()
        self._deliver(group.group_id, group.take_replies())
        partition = self._partition_of(group.group_id)
        owned = self._owned.get(partition) if partition is not None else None
        if owned is not None and owned.groups.get(group.group_id) is group:
            del owned.groups[group.group_id]
        # Requests waiting on the old lock find the old group Dead; new ones get a new group.
        self._lock.discard(group.group_id)

    # --- the groups of this broker ---------------------------------------------------------------

    def _group(self, group_id: str, *, create: bool) -> tuple[Group | None, int]:
        """The group and 0, or None and the error the client must get."""
        if not group_id:
            return None, ErrorCode.INVALID_GROUP_ID
        partition = self._partition_of(group_id)
        owned = self._owned.get(partition) if partition is not None else None
        if owned is None:
            return None, ErrorCode.NOT_COORDINATOR
        if not owned.loaded:
            return None, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        group = owned.groups.get(group_id)
        if group is None:
            if not create:
                return None, ErrorCode.GROUP_ID_NOT_FOUND
            group = owned.groups[group_id] = Group(group_id)
        return group, ErrorCode.NONE

    async def _serving_group(self, group_id: str, *, create: bool) -> tuple[Group | None, int]:
        """:meth:`_group`, once this broker can answer for the group (module docstring, step 2).

        While the group's partition loads here, or while this broker's metadata does not show
        another broker leading it (the client may have learned the leader from a gateway whose
        metadata is fresher than this one's), the request waits for that to change, up to
        ``load_wait_ms``, rather than answering COORDINATOR_LOAD_IN_PROGRESS (14) or
        NOT_COORDINATOR (16) at once.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._load_wait_ms / 1000
        while True:  # bounded by the deadline
            changed = self._topic.changed
            group, error = self._group(group_id, create=create)
            remaining = deadline - loop.time()
            if not self._may_serve_soon(group_id, error) or remaining <= 0:
                return group, error
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    def _may_serve_soon(self, group_id: str, error: int) -> bool:
        """Whether ``error`` (from :meth:`_group`) may turn into serving the group here: its
        partition is loading here, or no other broker is known to lead it."""
        if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            return True
        return error == ErrorCode.NOT_COORDINATOR and self._topic.may_lead_soon(group_id)

    def _partition_of(self, group_id: str) -> int | None:
        return self._topic.partition_of(group_id)

    def _wait_for(self, group_id: str, member_id: str, kind: str) -> asyncio.Future[Any]:
        key = (group_id, member_id, kind)
        old = self._waiters.pop(key, None)
        if old is not None and not old.done():
            # The member sent the request again (its first one timed out on its side).
            old.set_result(
                JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member_id=member_id)
                if kind == "join"
                else SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
            )
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[key] = future
        return future

    async def _settle(self, group: Group) -> None:
        """After a call into ``group``: write its metadata if asked, then send its replies."""
        if group.needs_persist:
            group.needs_persist = False
            error = await self._append(
                group.group_id,
                [
                    (
                        gr.encode_key(gr.GroupMetadataKey(group.group_id)),
                        gr.encode_value(self._group_value(group)),
                    )
                ],
            )
            if error:
                log.warning("group %s: metadata not written: error %d", group.group_id, error)
                self._deliver(group.group_id, group.persist_failed(error, self._now()))
                return
        self._deliver(group.group_id, group.take_replies())

    def _deliver(self, group_id: str, replies: Sequence[Any]) -> None:
        for reply in replies:
            future = self._waiters.pop((group_id, reply.member_id, reply.kind), None)
            if future is not None and not future.done():
                future.set_result(reply.result)

    def _group_value(self, group: Group) -> gr.GroupMetadataValue:
        protocol = group.protocol_name
        return gr.GroupMetadataValue(
            protocol_type=group.protocol_type or "",
            generation=group.generation_id,
            protocol=protocol,
            leader=group.leader_id,
            current_state_timestamp_ms=self._wall(),
            members=[
                gr.MemberMetadata(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.metadata_for(protocol) if protocol else b"",
                    m.assignment,
                )
                for m in group.members.values()
            ],
        )

    # --- writing to __consumer_offsets ----------------------------------------------------------

    async def _append(self, group_id: str, records: Sequence[tuple[bytes, bytes | None]]) -> int:
        error, _ = await self._append_at(group_id, records)
        return error

    async def _append_at(
        self,
        group_id: str,
        records: Sequence[tuple[bytes, bytes | None]],
        producer: tuple[int, int] | None = None,
    ) -> tuple[int, int]:
        """Append ``records`` as one batch to the group's partition with acks=all: (error,
        base offset). With ``producer`` (id, epoch) the batch is that producer's transactional
        one, without a sequence (the replica takes NO_SEQUENCE transactional batches on
        internal topics, as Kafka's coordinators write them)."""
        partition = self._partition_of(group_id)
        owned = self._owned.get(partition) if partition is not None else None
        if partition is None or owned is None:
            return ErrorCode.NOT_COORDINATOR, -1
        wall = self._wall()
        batch_records = [rb.Record(key, value, wall) for key, value in records]
        if producer is None:
            batch = rb.build_batch(batch_records)
        else:
            producer_id, producer_epoch = producer
            batch = rb.build_batch(
                batch_records,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=-1,
                transactional=True,
            )
        error, base_offset = await self._topic.append_at(partition, owned, batch)
        if error and producer is not None and error in _FENCING_ERRORS:
            return error, -1
        if error:
            return _STORE_ERRORS.get(error, ErrorCode.UNKNOWN_SERVER_ERROR), -1
        return ErrorCode.NONE, base_offset

    # --- leadership, loading, unloading ---------------------------------------------------------

    async def _tick(self) -> None:
        await self._topic.refresh()
        now = self._now()
        for owned in list(self._owned.values()):
            if not owned.loaded:
                continue
            for group in list(owned.groups.values()):
                if group.generation_id == 0 and group.is_empty():
                    # Never formed and holds nothing (e.g. a refused JoinGroup): forget it.
                    if not self._lock(group.group_id).locked():
                        del owned.groups[group.group_id]
                        self._lock.discard(group.group_id)
                    continue
                deadline = group.next_deadline_ms()
                if deadline is None or deadline > now:
                    continue
                lock = self._lock(group.group_id)
                if lock.locked():
                    continue  # a request is changing it; the next tick looks again
                async with lock:
                    group.tick(now)
                    await self._settle(group)
        self._note_empty_groups()
        if self._last_retention_check_ms is None:
            self._last_retention_check_ms = now  # the first check one interval after start
        elif now - self._last_retention_check_ms >= self._retention_check_ms and (
            self._expiring is None or self._expiring.done()
        ):
            self._last_retention_check_ms = now
            self._expiring = asyncio.get_running_loop().create_task(self._expire_offsets())

    def _note_empty_groups(self) -> None:
        """Since when each loaded group has been Empty (kept while it stays Empty)."""
        wall = self._wall()
        for owned in self._owned.values():
            if not owned.loaded:
                continue
            for group_id in list(owned.empty_since):
                group = owned.groups.get(group_id)
                if group is None or group.state is not GroupState.EMPTY:
                    del owned.empty_since[group_id]
            for group_id, group in owned.groups.items():
                if group.state is GroupState.EMPTY:
                    owned.empty_since.setdefault(group_id, wall)

    async def _expire_offsets(self) -> None:
        """KIP-211: tombstone the committed offsets past the retention
        (:func:`group_admin.plan_offset_expiry`), and an Empty group left without offsets."""
        for owned in list(self._owned.values()):
            if not owned.loaded:
                continue
            for group in list(owned.groups.values()):
                group_id = group.group_id
                plan = group_admin.plan_offset_expiry(
                    group, self._wall(), self._retention_ms, owned.empty_since.get(group_id)
                )
                if not (plan.remove or plan.delete_group):
                    continue
                async with self._lock(group_id):
                    if group.state is GroupState.DEAD:  # deleted or unloaded meanwhile
                        continue
                    plan = group_admin.plan_offset_expiry(  # again: a request may have changed it
                        group, self._wall(), self._retention_ms, owned.empty_since.get(group_id)
                    )
                    if not (plan.remove or plan.delete_group):
                        continue
                    error = await self._remove_offsets(group, plan)
                    if error:
                        log.warning("group %s: expired offsets kept: error %d", group_id, error)
                        continue
                log.info(
                    "group %s: %d committed offsets expired%s",
                    group_id,
                    len(plan.remove),
                    " and the group with them" if plan.delete_group else "",
                )

    def _barrier(self) -> bytes:
        barrier = gr.encode_key(gr.GroupMetadataKey(BARRIER_GROUP))
        return rb.build_batch([rb.Record(barrier, None, self._wall())])

    def _unloaded(self, partition: int, owned: _Partition) -> None:
        for group in owned.groups.values():
            group.unload(ErrorCode.NOT_COORDINATOR)
            self._deliver(group.group_id, group.take_replies())

    def _loaded(self, owned: _Partition, replay: GroupReplay) -> None:
        """A partition's groups, and since when each Empty one with metadata has been so."""
        owned.groups = replay.groups(self._now())
        owned.empty_since = {
            group_id: value.current_state_timestamp_ms
            for group_id, value in replay.metadata.items()
            if value is not None
            and group_id in owned.groups
            and owned.groups[group_id].state is GroupState.EMPTY
        }
