"""What the admin APIs and offset expiry read from a consumer group and plan for it: pure.

This module owns the decisions of ListGroups, DescribeGroups, DeleteGroups and OffsetDelete, and
of the coordinator's offset expiry (KIP-211), over one :class:`~raylog.gateway.groups.group.Group`:
what they show of it, and which committed offsets (and whether the group) a deletion removes.
It reads the group and changes nothing: the coordinator writes the tombstones a plan asks for,
then applies the plan with ``Group.remove_offsets`` / ``Group.delete``. No I/O, no clock: times
come in as arguments.

Rules, each Kafka's (``GroupMetadata.summary`` / ``handleDeleteGroups`` /
``handleDeleteOffsets`` / ``removeExpiredOffsets``):

1. A description carries the protocol and each member's metadata and assignment only while
   Stable.
2. Only an Empty group may be deleted (else NON_EMPTY_GROUP, 68).
3. Committed offsets may be deleted from an Empty group, or from a "consumer" group for topics
   no member is subscribed to (else GROUP_SUBSCRIBED_TO_TOPIC, 86); an Empty group whose last
   offsets are deleted is deleted with them. Pending transactional offsets of a partition are
   deleted with it (a tombstone drops them: ``txn_offsets.py``), and an Empty group is deleted
   whatever transactions hold offsets in it (Kafka's rule, by state alone).
4. Offsets expire after ``offsets.retention.minutes`` as :func:`plan_offset_expiry` says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import NamedTuple

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.group import (
    CLASSIC_GROUP_TYPE,
    CONSUMER_PROTOCOL_TYPE,
    CommittedOffset,
    Group,
    GroupState,
    subscription_topics,
)

__all__ = [
    "GroupDescription",
    "GroupListing",
    "MemberDescription",
    "OffsetDeletePlan",
    "check_delete",
    "describe",
    "filter_listings",
    "listing",
    "plan_offset_delete",
    "plan_offset_expiry",
    "subscribed_topics",
]


class MemberDescription(NamedTuple):
    """One member in DescribeGroups. Metadata and assignment are empty unless Stable."""

    member_id: str
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes
    group_instance_id: str | None = None


class GroupDescription(NamedTuple):
    """DescribeGroups' answer for one group (Kafka's ``GroupSummary``)."""

    state: str  # a GroupState value; "" when the group could not be described (an error)
    protocol_type: str
    protocol: str  # "" unless Stable
    members: tuple[MemberDescription, ...] = ()


class GroupListing(NamedTuple):
    """ListGroups' answer for one group."""

    group_id: str
    protocol_type: str
    state: str
    group_type: str = CLASSIC_GROUP_TYPE


class OffsetDeletePlan(NamedTuple):
    """What an OffsetDelete may do: the group-level error (nothing else when it is set), the
    error of each partition asked for, the committed offsets to tombstone, and whether the group
    goes too (it is Empty and holds no other offset)."""

    error_code: int
    partition_errors: Mapping[tuple[str, int], int] = MappingProxyType({})
    remove: tuple[tuple[str, int], ...] = ()
    delete_group: bool = False


def filter_listings(
    listings: Iterable[GroupListing], states: Iterable[str] = (), types: Iterable[str] = ()
) -> list[GroupListing]:
    """ListGroups' StatesFilter (v4+) and TypesFilter (v5+): an empty filter keeps every group;
    names match case-insensitively, as Kafka's group coordinator compares them."""
    wanted_states = {s.lower() for s in states}
    wanted_types = {t.lower() for t in types}
    return [
        g
        for g in listings
        if (not wanted_states or g.state.lower() in wanted_states)
        and (not wanted_types or g.group_type.lower() in wanted_types)
    ]


def listing(group: Group) -> GroupListing:
    return GroupListing(group.group_id, group.protocol_type or "", group.state.value)


def describe(group: Group) -> GroupDescription:
    """Kafka's ``GroupMetadata.summary``: protocol, metadata and assignment only if Stable."""
    stable = group.state is GroupState.STABLE and group.protocol_name is not None
    protocol = group.protocol_name if stable else None
    members = tuple(
        MemberDescription(
            m.member_id,
            m.client_id,
            m.client_host,
            m.metadata_for(protocol) if protocol else b"",
            m.assignment if protocol else b"",
            m.group_instance_id,
        )
        for m in group.members.values()
    )
    return GroupDescription(group.state.value, group.protocol_type or "", protocol or "", members)


def check_delete(group: Group) -> int:
    """0 when DeleteGroups may delete this group (it must be Empty)."""
    if not group.exists():
        return ErrorCode.GROUP_ID_NOT_FOUND
    if group.state is not GroupState.EMPTY:
        return ErrorCode.NON_EMPTY_GROUP
    return ErrorCode.NONE


def plan_offset_delete(group: Group, partitions: Iterable[tuple[str, int]]) -> OffsetDeletePlan:
    """Which of ``partitions``' committed offsets an OffsetDelete removes."""
    partitions = list(dict.fromkeys(partitions))
    if not group.exists():
        return OffsetDeletePlan(ErrorCode.GROUP_ID_NOT_FOUND)
    if group.state is GroupState.EMPTY:
        subscribed: frozenset[str] | None = frozenset()
    elif group.protocol_type == CONSUMER_PROTOCOL_TYPE:
        subscribed = subscribed_topics(group)
    else:
        return OffsetDeletePlan(ErrorCode.NON_EMPTY_GROUP)
    errors = {
        tp: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
        if subscribed is None or tp[0] in subscribed
        else ErrorCode.NONE
        for tp in partitions
    }
    # A partition with a pending transactional offset is tombstoned too (txn_offsets, rule 3).
    held = set(group.offsets) | group.pending_txn.partitions()
    remove = tuple(tp for tp, e in errors.items() if e == ErrorCode.NONE and tp in held)
    delete_group = (
        group.state is GroupState.EMPTY
        and bool(partitions)
        and not group.pending_members
        and held <= set(remove)
    )
    return OffsetDeletePlan(ErrorCode.NONE, errors, remove, delete_group)


def subscribed_topics(group: Group) -> frozenset[str] | None:
    """The union of the members' subscribed topics; None when one cannot be read."""
    topics: set[str] = set()
    for member in group.members.values():
        # The group's protocol, or every protocol of a member rejoining without it.
        names = member.protocol_names()
        if group.protocol_name in names:
            names = (group.protocol_name,)
        for name in names:
            found = subscription_topics(member.metadata_for(name))
            if found is None:
                return None
            topics |= found
    return frozenset(topics)


def plan_offset_expiry(
    group: Group, now_ms: int, retention_ms: int, empty_since_ms: int | None
) -> OffsetDeletePlan:
    """The committed offsets past ``offsets.retention.minutes`` (KIP-211, Kafka's
    ``GroupMetadata.removeExpiredOffsets``); times are wall-clock ms.

    - An Empty group with a protocol type: every offset, once the group has been empty for
      the retention (``empty_since_ms``; unknown: each offset's commit time).
    - A group without one (it only commits, never joins): each offset once its commit is
      that old.
    - A Stable "consumer" group: the offsets of topics no member subscribes to, once their
      commit is that old; the others are in use.
    - Otherwise (rebalancing, or subscriptions that cannot be read): none.

    ``delete_group`` when the group is Empty and would hold no offset afterwards, also an
    Empty group that holds none now (Kafka's ``cleanupGroupMetadata`` turns it Dead at the
    next check, however briefly it has been Empty): Kafka then writes its tombstone too.
    A partition with a pending transactional offset keeps its committed one, and a group with
    any pending offset is kept.
    """

    def old(committed: CommittedOffset) -> bool:
        return committed.commit_timestamp_ms + retention_ms <= now_ms

    pending = group.pending_txn.partitions()  # left alone (txn_offsets, rule 4)

    expired: list[tuple[str, int]] = []
    if group.state is GroupState.EMPTY:
        if group.protocol_type is not None and empty_since_ms is not None:
            if empty_since_ms + retention_ms <= now_ms:
                expired = [tp for tp in group.offsets if tp not in pending]
        else:
            expired = [tp for tp, c in group.offsets.items() if old(c) and tp not in pending]
    elif group.state is GroupState.STABLE and group.protocol_type == CONSUMER_PROTOCOL_TYPE:
        subscribed = subscribed_topics(group)
        if subscribed is not None:
            expired = [
                tp
                for tp, c in group.offsets.items()
                if tp[0] not in subscribed and old(c) and tp not in pending
            ]
    remove = tuple(sorted(expired))
    delete_group = (
        group.state is GroupState.EMPTY
        and not group.members
        and not pending
        and len(remove) == len(group.offsets)
    )
    return OffsetDeletePlan(ErrorCode.NONE, remove=remove, delete_group=delete_group)
