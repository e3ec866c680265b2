"""Kafka's classic consumer group protocol as a pure state machine: one :class:`Group` per id.

This module owns the decisions of the group coordinator for one group: who is a member, which
generation is current, which protocol the group runs, who leads, when a rebalance starts and
completes, when a member's session expires, and which offset commits are accepted. It does no
I/O and reads no clock: time comes in as ``now_ms`` on every call, generated member ids come in
as arguments, and the coordinator (``group_coordinator.py``) carries out what comes out.

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
   (generation < 0) to a group without members.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from raylog.gateway.errors import ErrorCode

__all__ = [
    "GROUP_MAX_SESSION_TIMEOUT_MS",
    "GROUP_MIN_SESSION_TIMEOUT_MS",
    "CommittedOffset",
    "Group",
    "GroupState",
    "JoinResult",
    "Member",
    "Reply",
    "SyncResult",
]

# group.min.session.timeout.ms / group.max.session.timeout.ms, Kafka's defaults. Client defaults
# fit: kafka-python and aiokafka 10000, librdkafka 45000 (45000 since KIP-735), kafkajs 30000.
GROUP_MIN_SESSION_TIMEOUT_MS = 6_000
GROUP_MAX_SESSION_TIMEOUT_MS = 1_800_000


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class JoinResult(NamedTuple):
    """JoinGroupResponse's fields. ``members`` (id, metadata) is filled for the leader only."""

    error_code: int
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: Sequence[tuple[str, bytes]] = ()


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

    def metadata_for(self, protocol: str) -> bytes:
        return next(m for name, m in self.protocols if name == protocol)

    def protocol_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.protocols)


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
    # Ids handed out with MEMBER_ID_REQUIRED, not yet joined: id -> expiry time.
    pending_members: dict[str, int] = field(default_factory=dict)
    rebalance_deadline_ms: int = 0
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    needs_persist: bool = False
    _replies: list[Reply] = field(default_factory=list)

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
    ) -> JoinResult | None:
        """An immediate answer, or None when the answer comes later as a "join" :class:`Reply`."""
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
            if require_known_member_id:
                self.pending_members[new_member_id] = now_ms + session_timeout_ms
                return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=new_member_id)
            member_id = new_member_id
        elif member_id in self.pending_members:
            del self.pending_members[member_id]
        elif member_id not in self.members:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id)
        else:
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
            ),
            protocol_type,
            now_ms,
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

    def _add_member(self, member: Member, protocol_type: str, now_ms: int) -> None:
        if not self.members:
            self.protocol_type = protocol_type
        self.members[member.member_id] = member
        if self.leader_id is None:
            self.leader_id = member.member_id
        if self.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(now_ms)
        else:
            self._prepare_rebalance(now_ms)

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

    # --- rebalance ------------------------------------------------------------------------------

    def _prepare_rebalance(self, now_ms: int) -> None:
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
        timeout_ms = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        self.rebalance_deadline_ms = now_ms + timeout_ms
        self._try_complete_join(now_ms)

    def _try_complete_join(self, now_ms: int, *, deadline_passed: bool = False) -> None:
        if self.state is not GroupState.PREPARING_REBALANCE:
            return
        all_joined = not self.pending_members and all(
            m.awaiting_join for m in self.members.values()
        )
        if not (all_joined or deadline_passed):
            return
        for member in [m for m in self.members.values() if not m.awaiting_join]:
            self._remove(member.member_id)
        self.pending_members.clear()
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
            member.awaiting_join = False
            member.last_heartbeat_ms = now_ms
            self._reply(member.member_id, "join", self._join_result(member.member_id))

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
        members: list[tuple[str, bytes]] = []
        if member_id == self.leader_id:
            assert self.protocol_name is not None
            members = [
                (m.member_id, m.metadata_for(self.protocol_name)) for m in self.members.values()
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
    ) -> SyncResult | None:
        """An immediate answer, or None when it comes later as a "sync" :class:`Reply`."""
        error = self._check_member(member_id, generation_id)
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
        instead, and a Stable group rebalances again (Kafka's resetAndPropagateAssignmentError).
        """
        replies = [
            r._replace(result=SyncResult(error_code)) if r.kind == "sync" else r
            for r in self.take_replies()
        ]
        if self.state is GroupState.STABLE:
            for m in self.members.values():
                m.assignment = b""
            self._prepare_rebalance(now_ms)
        return replies + self.take_replies()

    # --- Heartbeat and LeaveGroup ---------------------------------------------------------------

    def heartbeat(self, *, member_id: str, generation_id: int, now_ms: int) -> int:
        error = self._check_member(member_id, generation_id)
        if error:
            return error
        self.members[member_id].last_heartbeat_ms = now_ms
        if self.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, member_id: str, now_ms: int) -> int:
        """Remove one member (LeaveGroup); its waiting requests get UNKNOWN_MEMBER_ID."""
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if member_id in self.pending_members:
            del self.pending_members[member_id]
            self._try_complete_join(now_ms)
            return ErrorCode.NONE
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
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
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)

    def _check_member(self, member_id: str, generation_id: int) -> int:
        if not self.group_id:
            return ErrorCode.INVALID_GROUP_ID
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

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
        if self.state is GroupState.PREPARING_REBALANCE and now_ms >= self.rebalance_deadline_ms:
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
            times.append(self.rebalance_deadline_ms)
        return min(times, default=None)

    # --- offsets --------------------------------------------------------------------------------

    def validate_commit(self, member_id: str, generation_id: int) -> int:
        """0 when an OffsetCommit of ``member_id`` at ``generation_id`` may be written."""
        if not self.group_id:
            return ErrorCode.INVALID_GROUP_ID
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and not self.members:
            return ErrorCode.NONE  # a simple commit (assign(), no group membership)
        if self.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

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
        for m in members:
            m.last_heartbeat_ms = now_ms
            m.awaiting_join = m.awaiting_sync = False
            self.members[m.member_id] = m
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
        self.state = GroupState.DEAD

    def is_empty(self) -> bool:
        return not self.members and not self.pending_members and not self.offsets

    # --- replies --------------------------------------------------------------------------------

    def _reply(self, member_id: str, kind: str, result: JoinResult | SyncResult) -> None:
        self._replies.append(Reply(member_id, kind, result))

    def take_replies(self) -> list[Reply]:
        replies, self._replies = self._replies, []
        return replies
