"""Kafka's classic consumer group protocol as a pure state machine: one :class:`Group` per id.

This module owns the decisions of the group coordinator for one group: who is a member, which
generation is current, which protocol the group runs, who leads, when a rebalance starts and
completes, when a member's session expires, and which offset commits are accepted. It does no
I/O and reads no clock: time comes in as ``now_ms`` on every call, generated member ids come in
as arguments, and the coordinator (``coordinator.py``) carries out what comes out. What the admin
APIs and offset expiry read from a group and plan for it is ``group_admin.py``'s.

States, as Kafka names them (``GroupState``)::

    Empty ──join──> PreparingRebalance ──all joined / rebalance timeout──> CompletingRebalance
      ^                 ^    │ (no members left)                                │ leader's SyncGroup
      │                 │    └───────────────> Empty                            v
      │                 └──── join / leave / expiry / protocol change ──── Stable
    Dead: the coordinator no longer owns the group (partition unloaded); every call gets an error.

Answers that cannot be given at once (a JoinGroup waits for the rebalance to complete, a
follower's SyncGroup for the leader's) are queued as :class:`Reply` values; the coordinator takes
them with :meth:`Group.take_replies` after every call and wakes the waiting requests. When the
group's metadata must be written to ``__consumer_offsets`` (a generation's assignment is
complete, or the group became Empty) :attr:`Group.needs_persist` is set: the coordinator writes
the record and only then sends the replies, as Kafka does.

Rules kept here, each Kafka's (``GroupCoordinator.scala`` / ``GroupMetadata.scala``):

1. JoinGroup v4+ from a member without an id gets MEMBER_ID_REQUIRED (79) with a generated id;
   that id is pending until the member joins with it (or its session timeout passes).
2. The group's protocol is one every member supports, chosen by the members' first preferences;
   a member sharing none with the group gets INCONSISTENT_GROUP_PROTOCOL (23).
3. A rebalance completes when every member has rejoined, or at the rebalance timeout (the
   largest of the members'), when those that did not rejoin are removed.
4. A member not heard from within its session timeout is removed (while it awaits a JoinGroup
   answer it is kept; while it awaits SyncGroup, it has its rebalance timeout).
5. Offset commits need the current generation and a known member, except "simple" commits
   (generation < 0) to a group without members. A transactional commit (TxnOffsetCommit) is
   checked likewise when it names a generation or member (v3), else not at all; its offsets
   stay pending until the transaction ends (``txn_offsets.py``).
6. ``group.initial.rebalance.delay.ms`` (Kafka's InitialDelayedJoin): the first rebalance of an
   Empty group does not complete before that delay, extended by the same delay (within the
   rebalance timeout) while new members keep arriving in generation 0. A group of consumers
   started together then forms once, with everyone, instead of one rebalance per arrival; and a
   leader's first assignment sees the topic metadata its client was still fetching.
7. Admin APIs (ListGroups, DescribeGroups, DeleteGroups, OffsetDelete) and offset expiry read
   the group and plan deletions in ``group_admin.py``; the group applies what they plan once
   written (:meth:`Group.delete`, :meth:`Group.remove_offsets`).
8. Static membership (KIP-345): a member joining with a ``group_instance_id`` is given its
   member id at once (no MEMBER_ID_REQUIRED round trip). The instance id names one member at a
   time (:attr:`Group.static_members`); the same instance joining again without a member id
   (a restarted consumer) takes over that member under a new id, and the old id is fenced:
   its waiting JoinGroup/SyncGroup and every later request naming the instance with it get
   FENCED_INSTANCE_ID (82). A request naming an instance the group does not know gets
   UNKNOWN_MEMBER_ID. Taking over a Stable group's member does not rebalance unless the
   group's protocol would change (Kafka's rule) or, in a "consumer" group, the member's
   subscribed topics changed (raylog's addition: its subscription bytes also carry its
   generation and owned partitions, which a restart always changes, so Kafka compares only
   the protocol and a restarted member with a new subscription would never be served); the
   member is answered with the current generation once the group's record carries its new
   id, and with the *old* leader id, so that a rejoining leader does not run an assignment the
   Stable group would ignore (KIP-814's skip_assignment needs JoinGroup v9, not advertised);
   if that write fails the takeover is undone. In CompletingRebalance a takeover rebalances
   (the leader may be assigning to the old id). A static member that does not rejoin a
   rebalance is kept in the next generation (with its last metadata) until its session
   expires; a leader that did not rejoin is replaced by one that did, and a rebalance that no
   member rejoined waits another rebalance timeout.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.txn_offsets import PendingOffsets

__all__ = [
    "CLASSIC_GROUP_TYPE",
    "CONSUMER_PROTOCOL_TYPE",
    "GROUP_MAX_SESSION_TIMEOUT_MS",
    "GROUP_MIN_SESSION_TIMEOUT_MS",
    "CommittedOffset",
    "Group",
    "GroupState",
    "JoinMember",
    "JoinResult",
    "Member",
    "MemberIdentity",
    "Reply",
    "SyncResult",
    "subscription_topics",
]

# group.min.session.timeout.ms / group.max.session.timeout.ms, Kafka's defaults. Client defaults
# fit: kafka-python and aiokafka 10000, librdkafka 45000 (45000 since KIP-735), kafkajs 30000.
GROUP_MIN_SESSION_TIMEOUT_MS = 6_000
GROUP_MAX_SESSION_TIMEOUT_MS = 1_800_000


CONSUMER_PROTOCOL_TYPE = "consumer"  # the protocol type of Kafka's consumers (ConsumerProtocol)
CLASSIC_GROUP_TYPE = "classic"  # ListGroups v5's group type: every group here is a classic one


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class JoinMember(NamedTuple):
    """One member in the leader's JoinGroupResponse: what its assignor is given."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


class JoinResult(NamedTuple):
    """JoinGroupResponse's fields. ``members`` is filled for the leader only."""

    error_code: int
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: Sequence[JoinMember] = ()


class MemberIdentity(NamedTuple):
    """A member named by a request: its member id and, for a static member, its instance id."""

    member_id: str
    group_instance_id: str | None = None


class SyncResult(NamedTuple):
    error_code: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


class Reply(NamedTuple):
    """A deferred answer: the JoinGroup ("join") or SyncGroup ("sync") of ``member_id``."""

    member_id: str
    kind: str
    result: JoinResult | SyncResult


class CommittedOffset(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    # Where its record is in __consumer_offsets (-1: not known): of a plain and a transactional
    # commit of one partition, the later in the log wins (``txn_offsets.py``, rule 2).
    log_offset: int = -1


def subscription_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics of a "consumer" member's subscription (ConsumerProtocolSubscription, any
    version: int16 version, then the topics as an int32 count of int16-length strings).

    None when the bytes are not a subscription; the caller must then assume every topic.
    """
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        if not 0 <= count <= len(metadata):
            return None
        pos, topics = 6, set()
        for _ in range(count):
            (length,) = struct.unpack_from(">h", metadata, pos)
            if length < 0 or pos + 2 + length > len(metadata):
                return None
            topics.add(bytes(metadata[pos + 2 : pos + 2 + length]).decode("utf-8"))
            pos += 2 + length
    except (struct.error, UnicodeDecodeError):
        return None
    return frozenset(topics)


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata) in the member's preference order
    assignment: bytes = b""
    last_heartbeat_ms: int = 0
    awaiting_join: bool = False  # a JoinGroup of this member waits for the rebalance
    awaiting_sync: bool = False  # a SyncGroup of this member waits for the leader's
    group_instance_id: str | None = None  # set for a static member (rule 8)

    def metadata_for(self, protocol: str) -> bytes:
        return next(m for name, m in self.protocols if name == protocol)

    def protocol_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.protocols)


class _Takeover(NamedTuple):
    """What a static takeover in a Stable group replaced (rule 8), to undo it."""

    old_member_id: str
    new_member_id: str
    old_protocols: tuple[tuple[str, bytes], ...]
    old_session_timeout_ms: int
    old_rebalance_timeout_ms: int
    leader_id: str | None  # the group's leader before the takeover: what the member is told


@dataclass
class Group:
    """One consumer group's membership, generation and committed offsets."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    # Rule 8: group_instance_id -> member id of the static member holding it.
    # Invariant: exactly the members with a group_instance_id, each under its own.
    static_members: dict[str, str] = field(default_factory=dict)
    # Ids handed out with MEMBER_ID_REQUIRED, not yet joined: id -> expiry time.
    pending_members: dict[str, int] = field(default_factory=dict)
    rebalance_deadline_ms: int = 0
    # The initial delay of a rebalance that began Empty (rule 6): no join completes before
    # ``join_delay_until_ms`` (None: no delay running).
    join_delay_until_ms: int | None = None
    join_delay_ms: int = 0
    join_delay_remaining_ms: int = 0
    new_member_added: bool = False
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    # Offsets of transactions still open, per producer (``txn_offsets.py``).
    pending_txn: PendingOffsets = field(default_factory=PendingOffsets)
    needs_persist: bool = False
    _replies: list[Reply] = field(default_factory=list)
    # A Stable group's static takeover whose record is being written: undone if that fails.
    _takeover: _Takeover | None = None

    # --- JoinGroup ------------------------------------------------------------------------------

    def join(
        self,
        *,
        member_id: str,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        require_known_member_id: bool,
        new_member_id: str,
        now_ms: int,
        initial_rebalance_delay_ms: int = 0,
        group_instance_id: str | None = None,
    ) -> JoinResult | None:
        """An immediate answer, or None when the answer comes later as a "join" :class:`Reply`.

        ``initial_rebalance_delay_ms`` is the broker's ``group.initial.rebalance.delay.ms``
        (rule 6); it applies when this join starts the rebalance of an Empty group.
        ``group_instance_id`` makes the member a static one (rule 8).
        """
        if not self.group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID, member_id=member_id)
        if not GROUP_MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= GROUP_MAX_SESSION_TIMEOUT_MS:
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id=member_id)
        if self.state is GroupState.DEAD:
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=member_id)
        protocols = tuple(protocols)
        if not self._supports(member_id, protocol_type, protocols):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        if not member_id:
            if group_instance_id is not None and group_instance_id in self.static_members:
                return self._take_over(
                    group_instance_id,
                    new_member_id,
                    protocols,
                    session_timeout_ms,
                    rebalance_timeout_ms,
                    now_ms,
                )
            if require_known_member_id and group_instance_id is None:
                self.pending_members[new_member_id] = now_ms + session_timeout_ms
                return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=new_member_id)
            member_id = new_member_id
        elif member_id in self.pending_members and group_instance_id is None:
            del self.pending_members[member_id]
        else:
            # Pending ids are handed to dynamic members only: a static member naming one is
            # not a member of the group (Kafka throws here; the member resets its id).
            error = self._check_current_member(member_id, group_instance_id)
            if error:
                return JoinResult(error, member_id=member_id)
            return self._rejoin(self.members[member_id], protocols, now_ms)
        self._add_member(
            Member(
                member_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocols,
                last_heartbeat_ms=now_ms,
                awaiting_join=True,
                group_instance_id=group_instance_id,
            ),
            protocol_type,
            now_ms,
            initial_rebalance_delay_ms,
        )
        return None

    def _supports(self, member_id: str, protocol_type: str, protocols: tuple) -> bool:
        if not protocol_type or not protocols:
            return False
        others = [m for m in self.members.values() if m.member_id != member_id]
        if not others:
            return True
        if protocol_type != self.protocol_type:
            return False
        names = {name for name, _ in protocols}
        return any(all(name in m.protocol_names() for m in others) for name in names)

    def _add_member(
        self, member: Member, protocol_type: str, now_ms: int, initial_delay_ms: int
    ) -> None:
        if not self.members:
            self.protocol_type = protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id
        if self.state is GroupState.PREPARING_REBALANCE:
            if self.join_delay_until_ms is not None and self.generation_id == 0:
                self.new_member_added = True  # the initial delay may be extended (rule 6)
            self._try_complete_join(now_ms)
        else:
            delay_ms = initial_delay_ms if self.state is GroupState.EMPTY else 0
            self._prepare_rebalance(now_ms, initial_delay_ms=delay_ms)

    def _rejoin(
        self, member: Member, protocols: tuple[tuple[str, bytes], ...], now_ms: int
    ) -> JoinResult | None:
        member.last_heartbeat_ms = now_ms
        state = self.state
        if state is GroupState.PREPARING_REBALANCE:
            member.protocols = protocols
            member.awaiting_join = True
            self._try_complete_join(now_ms)
            return None
        if state is GroupState.COMPLETING_REBALANCE and member.protocols == protocols:
            # A retried JoinGroup: answer with the generation already formed.
            return self._join_result(member.member_id)
        if (
            state is GroupState.STABLE
            and member.protocols == protocols
            and member.member_id != self.leader_id
        ):
            return self._join_result(member.member_id)
        # The leader rejoining (e.g. its subscription's metadata changed) or new protocols.
        member.protocols = protocols
        member.awaiting_join = True
        self._prepare_rebalance(now_ms)
        return None

    def _take_over(
        self,
        group_instance_id: str,
        new_member_id: str,
        protocols: tuple[tuple[str, bytes], ...],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        now_ms: int,
    ) -> None:
        """A known static instance joins without a member id (rule 8): its member continues
        under ``new_member_id``; the answer always comes as a "join" :class:`Reply`."""
        old_member_id = self.static_members[group_instance_id]
        member = self.members[old_member_id]
        takeover = _Takeover(
            old_member_id,
            new_member_id,
            member.protocols,
            member.session_timeout_ms,
            member.rebalance_timeout_ms,
            self.leader_id,
        )
        # 1. Fence the old id: whatever it still waits for ends now.
        if member.awaiting_join:
            self._reply(
                old_member_id,
                "join",
                JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=old_member_id),
            )
        if member.awaiting_sync:
            self._reply(old_member_id, "sync", SyncResult(ErrorCode.FENCED_INSTANCE_ID))
            member.awaiting_sync = False
        # 2. The same member (its place, assignment and leadership) under the new id.
        self._rename_member(old_member_id, new_member_id)
        member.protocols = protocols
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.last_heartbeat_ms = now_ms
        member.awaiting_join = True
        # 3. Stable and nothing the assignment depends on changed: no rebalance.
        if (
            self.state is GroupState.STABLE
            and self._select_protocol() == self.protocol_name
            and self._same_subscription(takeover.old_protocols, protocols)
        ):
            member.awaiting_join = False
            self._takeover = takeover
            self.needs_persist = True
            self._reply(
                new_member_id,
                "join",
                JoinResult(
                    ErrorCode.NONE,
                    self.generation_id,
                    self.protocol_type,
                    self.protocol_name,
                    takeover.leader_id or "",
                    new_member_id,
                ),
            )
        elif self.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(now_ms)
        else:
            self._prepare_rebalance(now_ms)

    def _rename_member(self, old_member_id: str, new_member_id: str) -> None:
        """Move a member to a new id, keeping its place in the group's order."""
        member = self.members[old_member_id]
        member.member_id = new_member_id
        self.members = {
            (new_member_id if member_id == old_member_id else member_id): m
            for member_id, m in self.members.items()
        }
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = new_member_id
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id

    def _same_subscription(
        self, old: tuple[tuple[str, bytes], ...], new: tuple[tuple[str, bytes], ...]
    ) -> bool:
        """Whether a "consumer" member subscribes to the same topics in the group's protocol
        (other groups: always, Kafka's rule alone)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None:
            return True
        old_metadata, new_metadata = dict(old), dict(new)
        if self.protocol_name not in old_metadata or self.protocol_name not in new_metadata:
            return False
        return subscription_topics(old_metadata[self.protocol_name]) == subscription_topics(
            new_metadata[self.protocol_name]
        )

    # --- rebalance ------------------------------------------------------------------------------

    def _prepare_rebalance(self, now_ms: int, *, initial_delay_ms: int = 0) -> None:
        if self.state is GroupState.COMPLETING_REBALANCE:
            # The assignment being formed is void: waiting followers must rejoin.
            for member in self.members.values():
                member.assignment = b""
                if member.awaiting_sync:
                    member.awaiting_sync = False
                    self._reply(
                        member.member_id, "sync", SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
                    )
        self.state = GroupState.PREPARING_REBALANCE
        timeout_ms = self._rebalance_timeout_ms()
        self.rebalance_deadline_ms = now_ms + timeout_ms
        if initial_delay_ms > 0:
            self.join_delay_until_ms = now_ms + initial_delay_ms
            self.join_delay_ms = initial_delay_ms
            self.join_delay_remaining_ms = max(timeout_ms - initial_delay_ms, 0)
            self.new_member_added = False
        self._try_complete_join(now_ms)

    def _rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def _end_join_delay(self, now_ms: int) -> None:
        """The initial delay ran out: extend it while members keep arriving, else let the
        rebalance complete by the usual rule (rule 6)."""
        if self.new_member_added and self.join_delay_remaining_ms > 0:
            delay_ms = min(self.join_delay_ms, self.join_delay_remaining_ms)
            self.join_delay_remaining_ms = max(self.join_delay_remaining_ms - delay_ms, 0)
            self.join_delay_until_ms = now_ms + delay_ms
            self.new_member_added = False
            return
        self._clear_join_delay()
        self._try_complete_join(now_ms)

    def _clear_join_delay(self) -> None:
        self.join_delay_until_ms = None
        self.new_member_added = False

    def _try_complete_join(self, now_ms: int, *, deadline_passed: bool = False) -> None:
        if self.state is not GroupState.PREPARING_REBALANCE or self.join_delay_until_ms is not None:
            return
        all_joined = not self.pending_members and all(
            m.awaiting_join for m in self.members.values()
        )
        if not (all_joined or deadline_passed):
            return
        # Dynamic members that did not rejoin leave; static ones stay until their session
        # expires (rule 8).
        for member in [m for m in self.members.values() if not m.awaiting_join]:
            if member.group_instance_id is None:
                self._remove(member.member_id)
        self.pending_members.clear()
        joined = [m.member_id for m in self.members.values() if m.awaiting_join]
        if self.members and not joined:
            # Only static members are left and none rejoined: wait for them (or for their
            # sessions to expire) another rebalance timeout.
            self.rebalance_deadline_ms = now_ms + self._rebalance_timeout_ms()
            return
        if self.leader_id not in joined:
            self.leader_id = joined[0] if joined else None
        self.generation_id += 1
        if not self.members:
            self.state = GroupState.EMPTY
            self.protocol_name = None
            self.leader_id = None
            self.needs_persist = True
            return
        self.protocol_name = self._select_protocol()
        self.state = GroupState.COMPLETING_REBALANCE
        for member in self.members.values():
            if member.awaiting_join:
                self._reply(member.member_id, "join", self._join_result(member.member_id))
            member.awaiting_join = False
            member.last_heartbeat_ms = now_ms

    def _select_protocol(self) -> str:
        members = list(self.members.values())
        candidates = [
            name
            for name in members[0].protocol_names()
            if all(name in m.protocol_names() for m in members)
        ]
        votes = dict.fromkeys(candidates, 0)
        for m in members:
            votes[next(name for name in m.protocol_names() if name in votes)] += 1
        # Ties go to the earliest in the leader's preference order.
        leader = self.members.get(self.leader_id or "", members[0])
        order = [name for name in leader.protocol_names() if name in votes]
        return max(order, key=lambda name: (votes[name], -order.index(name)))

    def _join_result(self, member_id: str) -> JoinResult:
        members: list[JoinMember] = []
        if member_id == self.leader_id:
            assert self.protocol_name is not None
            members = [
                JoinMember(m.member_id, m.group_instance_id, m.metadata_for(self.protocol_name))
                for m in self.members.values()
            ]
        return JoinResult(
            ErrorCode.NONE,
            self.generation_id,
            self.protocol_type,
            self.protocol_name,
            self.leader_id or "",
            member_id,
            members,
        )

    # --- SyncGroup ------------------------------------------------------------------------------

    def sync(
        self,
        *,
        member_id: str,
        generation_id: int,
        assignments: Mapping[str, bytes],
        now_ms: int,
        group_instance_id: str | None = None,
    ) -> SyncResult | None:
        """An immediate answer, or None when it comes later as a "sync" :class:`Reply`."""
        error = self._check_member(member_id, generation_id, group_instance_id)
        if error:
            return SyncResult(error)
        member = self.members[member_id]
        member.last_heartbeat_ms = now_ms
        if self.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        if self.state is GroupState.STABLE:
            return SyncResult(
                ErrorCode.NONE, self.protocol_type, self.protocol_name, member.assignment
            )
        # CompletingRebalance: wait for the leader's assignment.
        member.awaiting_sync = True
        if member_id == self.leader_id:
            for m in self.members.values():
                m.assignment = bytes(assignments.get(m.member_id, b""))
            self.state = GroupState.STABLE
            self.needs_persist = True
            for m in self.members.values():
                if m.awaiting_sync:
                    m.awaiting_sync = False
                    self._reply(
                        m.member_id,
                        "sync",
                        SyncResult(
                            ErrorCode.NONE, self.protocol_type, self.protocol_name, m.assignment
                        ),
                    )
        return None

    def persist_failed(self, error_code: int, now_ms: int) -> list[Reply]:
        """The group's record could not be written: replies not yet sent carry ``error_code``
        instead, and a Stable group rebalances again (Kafka's resetAndPropagateAssignmentError);
        a static takeover the record was to carry is undone instead (rule 8).
        """
        takeover = self._takeover
        if takeover is not None:
            return self._undo_takeover(takeover, error_code, now_ms)
        replies = [
            r._replace(result=SyncResult(error_code)) if r.kind == "sync" else r
            for r in self.take_replies()
        ]
        if self.state is GroupState.STABLE:
            for m in self.members.values():
                m.assignment = b""
            self._prepare_rebalance(now_ms)
        return replies + self.take_replies()

    def _undo_takeover(self, takeover: _Takeover, error_code: int, now_ms: int) -> list[Reply]:
        """Kafka's revert of a static member whose new id could not be persisted: the old id
        holds the instance again, and the new one's JoinGroup gets the error and no id."""
        replies = [r for r in self.take_replies() if r.member_id != takeover.new_member_id]
        self._rename_member(takeover.new_member_id, takeover.old_member_id)
        member = self.members[takeover.old_member_id]
        member.protocols = takeover.old_protocols
        member.session_timeout_ms = takeover.old_session_timeout_ms
        member.rebalance_timeout_ms = takeover.old_rebalance_timeout_ms
        member.last_heartbeat_ms = now_ms
        failed = JoinResult(
            error_code,
            self.generation_id,
            self.protocol_type,
            self.protocol_name,
            takeover.leader_id or "",
        )
        return [*replies, Reply(takeover.new_member_id, "join", failed)]

    # --- Heartbeat and LeaveGroup ---------------------------------------------------------------

    def heartbeat(
        self,
        *,
        member_id: str,
        generation_id: int,
        now_ms: int,
        group_instance_id: str | None = None,
    ) -> int:
        error = self._check_member(member_id, generation_id, group_instance_id)
        if error:
            return error
        self.members[member_id].last_heartbeat_ms = now_ms
        if self.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, member_id: str, now_ms: int, group_instance_id: str | None = None) -> int:
        """Remove one member (LeaveGroup); its waiting requests get UNKNOWN_MEMBER_ID.

        A static member may be named by its instance id alone (an empty member id: an admin
        removing it, KIP-345); named with a member id, the instance must be held by that id.
        """
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not member_id:
            current = (
                self.static_members.get(group_instance_id)
                if group_instance_id is not None
                else None
            )
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            member_id = current
        elif member_id in self.pending_members:
            del self.pending_members[member_id]
            self._try_complete_join(now_ms)
            return ErrorCode.NONE
        else:
            error = self._check_current_member(member_id, group_instance_id)
            if error:
                return error
        self._remove_and_rebalance(member_id, now_ms)
        return ErrorCode.NONE

    def _remove_and_rebalance(self, member_id: str, now_ms: int) -> None:
        self._remove(member_id)
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(now_ms)
        else:
            self._try_complete_join(now_ms)

    def _remove(self, member_id: str) -> None:
        member = self.members.pop(member_id)
        if member.awaiting_join:
            self._reply(
                member_id, "join", JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id)
            )
        if member.awaiting_sync:
            self._reply(member_id, "sync", SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        if member.group_instance_id is not None:
            del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)

    def _check_member(
        self, member_id: str, generation_id: int, group_instance_id: str | None = None
    ) -> int:
        if not self.group_id:
            return ErrorCode.INVALID_GROUP_ID
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._check_current_member(member_id, group_instance_id)
        if error:
            return error
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def _check_current_member(self, member_id: str, group_instance_id: str | None) -> int:
        """Kafka's ``validateCurrentMember``: a named instance must be held by ``member_id``
        (else FENCED_INSTANCE_ID, or UNKNOWN_MEMBER_ID for an instance the group does not
        know); without one, ``member_id`` must be a member."""
        if group_instance_id is not None:
            current = self.static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            return ErrorCode.FENCED_INSTANCE_ID if current != member_id else ErrorCode.NONE
        return ErrorCode.NONE if member_id in self.members else ErrorCode.UNKNOWN_MEMBER_ID

    # --- time -----------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """Expire sessions and pending member ids; end a rebalance whose timeout passed."""
        if self.state is GroupState.DEAD:
            return
        for pending, expiry_ms in list(self.pending_members.items()):
            if now_ms >= expiry_ms:
                del self.pending_members[pending]
                self._try_complete_join(now_ms)
        for member in list(self.members.values()):
            if member.member_id in self.members and not self._keep_alive(member, now_ms):
                self._remove_and_rebalance(member.member_id, now_ms)
        if self.state is not GroupState.PREPARING_REBALANCE:
            return
        if self.join_delay_until_ms is not None:
            if now_ms >= self.join_delay_until_ms:
                self._end_join_delay(now_ms)
        elif now_ms >= self.rebalance_deadline_ms:
            self._try_complete_join(now_ms, deadline_passed=True)

    def _keep_alive(self, member: Member, now_ms: int) -> bool:
        if member.awaiting_join:
            return True  # the rebalance timeout bounds it instead
        if member.awaiting_sync:
            return now_ms < member.last_heartbeat_ms + member.rebalance_timeout_ms
        return now_ms < member.last_heartbeat_ms + member.session_timeout_ms

    def next_deadline_ms(self) -> int | None:
        """The earliest time :meth:`tick` may change something (None: nothing scheduled)."""
        times = list(self.pending_members.values())
        for m in self.members.values():
            if m.awaiting_sync:
                times.append(m.last_heartbeat_ms + m.rebalance_timeout_ms)
            elif not m.awaiting_join:
                times.append(m.last_heartbeat_ms + m.session_timeout_ms)
        if self.state is GroupState.PREPARING_REBALANCE:
            delay_until = self.join_delay_until_ms
            times.append(self.rebalance_deadline_ms if delay_until is None else delay_until)
        return min(times, default=None)

    # --- offsets --------------------------------------------------------------------------------

    def validate_commit(
        self, member_id: str, generation_id: int, group_instance_id: str | None = None
    ) -> int:
        """0 when an OffsetCommit of ``member_id`` at ``generation_id`` may be written."""
        if not self.group_id:
            return ErrorCode.INVALID_GROUP_ID
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and not self.members:
            return ErrorCode.NONE  # a simple commit (assign(), no group membership)
        if group_instance_id is not None:
            # A fenced instance learns it here whatever the group's state (Kafka's order).
            error = self._check_current_member(member_id, group_instance_id)
            if error:
                return error
        if self.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return self._check_member(member_id, generation_id)

    def validate_txn_commit(
        self, member_id: str, generation_id: int, group_instance_id: str | None = None
    ) -> int:
        """0 when a TxnOffsetCommit of ``member_id`` at ``generation_id`` may be written
        (Kafka's validateOffsetCommit of a transactional commit): without a generation, member
        id and instance id (TxnOffsetCommit v0-2) nothing is checked, whatever the group's
        state; otherwise the member must be current and the generation the group's, during a
        rebalance too (no REBALANCE_IN_PROGRESS: KIP-447's producer commits for the generation
        it read)."""
        if not self.group_id:
            return ErrorCode.INVALID_GROUP_ID
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and not member_id and group_instance_id is None:
            return ErrorCode.NONE
        error = self._check_current_member(member_id, group_instance_id)
        if error:
            return error
        return (
            ErrorCode.ILLEGAL_GENERATION if generation_id != self.generation_id else ErrorCode.NONE
        )

    def commit(
        self, member_id: str, offsets: Mapping[tuple[str, int], CommittedOffset], now_ms: int
    ) -> None:
        """Apply commits that were validated and written; a commit also counts as a heartbeat."""
        self.offsets.update(offsets)
        member = self.members.get(member_id)
        if member is not None:
            member.last_heartbeat_ms = now_ms

    def fetch_offsets(
        self, partitions: Iterable[tuple[str, int]] | None
    ) -> dict[tuple[str, int], CommittedOffset | None]:
        """Committed offsets of ``partitions`` (None: all); None for a partition without one."""
        if partitions is None:
            return dict(self.offsets)
        return {tp: self.offsets.get(tp) for tp in partitions}

    # --- loading and unloading ------------------------------------------------------------------

    def restore(
        self,
        *,
        protocol_type: str | None,
        generation_id: int,
        protocol_name: str | None,
        leader_id: str | None,
        members: Sequence[Member],
        now_ms: int,
    ) -> None:
        """Set membership from a GroupMetadata record read back from ``__consumer_offsets``.

        A group with members is Stable at once (they keep heartbeating to the new coordinator,
        whose session timers start now); one without is Empty.
        """
        self.protocol_type = protocol_type
        self.generation_id = generation_id
        self.protocol_name = protocol_name
        self.leader_id = leader_id
        self.members = {}
        self.static_members = {}
        for m in members:
            m.last_heartbeat_ms = now_ms
            m.awaiting_join = m.awaiting_sync = False
            self.members[m.member_id] = m
            if m.group_instance_id is not None:
                # Records are written from a group that keeps the invariant; should one name
                # an instance twice, the last member holds it and the other is dynamic.
                earlier = self.static_members.get(m.group_instance_id)
                if earlier is not None:
                    self.members[earlier].group_instance_id = None
                self.static_members[m.group_instance_id] = m.member_id
        self.state = GroupState.STABLE if self.members else GroupState.EMPTY
        if self.leader_id not in self.members:
            self.leader_id = next(iter(self.members), None)

    def unload(self, error_code: int = ErrorCode.NOT_COORDINATOR) -> None:
        """The coordinator lost the group: Dead, and every waiting request gets ``error_code``."""
        for member in self.members.values():
            if member.awaiting_join:
                self._reply(
                    member.member_id, "join", JoinResult(error_code, member_id=member.member_id)
                )
            if member.awaiting_sync:
                self._reply(member.member_id, "sync", SyncResult(error_code))
            member.awaiting_join = member.awaiting_sync = False
        self._clear_join_delay()
        self.state = GroupState.DEAD

    def is_empty(self) -> bool:
        return (
            not self.members
            and not self.pending_members
            and not self.offsets
            and not self.pending_txn
        )

    def exists(self) -> bool:
        """Whether the admin APIs see this group: not Dead, and not a group that never formed
        a generation and holds nothing (e.g. after a refused JoinGroup)."""
        if self.state is GroupState.DEAD:
            return False
        return self.generation_id > 0 or not self.is_empty()

    # --- deletion (the admin APIs and offset expiry decide it: group_admin.py) ---------------

    def delete(self) -> None:
        """The group's tombstones are written: it is Dead, and requests still holding it get
        COORDINATOR_NOT_AVAILABLE, so that clients look the coordinator up again and meet a new
        group (Kafka's transition to Dead)."""
        self.unload(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        self.offsets.clear()
        self.pending_txn.clear()
        self.pending_members.clear()

    def remove_offsets(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Apply an OffsetDelete (or an expiry) whose tombstones are written: a tombstone
        drops the partition's pending transactional offsets too (``txn_offsets.py``, rule 3)."""
        partitions = list(partitions)
        for tp in partitions:
            self.offsets.pop(tp, None)
        self.pending_txn.drop(partitions)

    # --- replies --------------------------------------------------------------------------------

    def _reply(self, member_id: str, kind: str, result: JoinResult | SyncResult) -> None:
        self._replies.append(Reply(member_id, kind, result))

    def take_replies(self) -> list[Reply]:
        """The answers to send. The coordinator takes them once the record the group asked
        for (if any) is written, so a takeover taken with them is settled."""
        replies, self._replies = self._replies, []
        self._takeover = None
        return replies
