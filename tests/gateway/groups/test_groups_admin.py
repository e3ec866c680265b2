"""The group admin decisions (``gateway/groups/group_admin.py``) over the pure state machine.

Proves: a description carries the protocol and each member's metadata and assignment only while
the group is Stable (Kafka's ``GroupMetadata.summary``); only an Empty group may be deleted
(NON_EMPTY_GROUP otherwise, GROUP_ID_NOT_FOUND for a group that never formed or is deleted), and
a deleted group is Dead, without offsets, and answers its members COORDINATOR_NOT_AVAILABLE;
OffsetDelete removes any committed offset of an Empty group (and the group with its last
offsets), only offsets of unsubscribed topics of a Stable "consumer" group
(GROUP_SUBSCRIBED_TO_TOPIC for the others, and for all when a subscription cannot be read), and
none of a non-consumer group with members (NON_EMPTY_GROUP); subscriptions encoded by
kafka-python (ConsumerProtocolSubscription v0-3) are read back; ListGroups' state and type
filters match case-insensitively and an empty filter keeps everything; offset expiry (KIP-211)
takes every offset of a group Empty for the retention (and the group), each offset of a group
that only commits by its commit time, and only old unsubscribed ones of a Stable consumer group;
an Empty group without offsets goes at the first expiry check (Kafka's cleanupGroupMetadata).
"""

from __future__ import annotations

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.group import (
    CommittedOffset,
    Group,
    GroupState,
    JoinResult,
    subscription_topics,
)
from raylog.gateway.groups.group_admin import (
    GroupListing,
    check_delete,
    describe,
    filter_listings,
    listing,
    plan_offset_delete,
    plan_offset_expiry,
)

SESSION_MS = 10_000
NOW_MS = 1_000


def subscription(*topics: str, version: int = 0) -> bytes:
    message = ConsumerProtocolSubscription(
        topics=list(topics), user_data=None, owned_partitions=[], generation_id=-1, rack_id=None
    )
    return bytes(message.encode(version=version))


def join(
    group: Group, member_id: str, new_id: str, metadata: bytes, protocol_type: str = "consumer"
) -> JoinResult | None:
    return group.join(
        member_id=member_id,
        client_id=f"client-{new_id}",
        client_host="/127.0.0.1",
        session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=SESSION_MS,
        protocol_type=protocol_type,
        protocols=[("range", metadata)],
        require_known_member_id=False,
        new_member_id=new_id,
        now_ms=NOW_MS,
    )


def stable_group(*topics: str, protocol_type: str = "consumer") -> Group:
    """One member "a", subscribed to ``topics``, assigned b"assignment", Stable."""
    group = Group("g")
    assert join(group, "", "a", subscription(*topics), protocol_type) is None
    assert (
        group.sync(member_id="a", generation_id=1, assignments={"a": b"assignment"}, now_ms=0)
        is None
    )
    group.take_replies()
    assert group.state is GroupState.STABLE
    return group


def commit(group: Group, *partitions: tuple[str, int]) -> None:
    group.commit("", {tp: CommittedOffset(5, -1, "", 0) for tp in partitions}, NOW_MS)


def test_a_stable_group_is_described_with_protocol_metadata_and_assignment() -> None:
    group = stable_group("t")
    described = describe(group)
    assert (described.state, described.protocol_type, described.protocol) == (
        "Stable",
        "consumer",
        "range",
    )
    [member] = described.members
    assert (member.member_id, member.client_id, member.client_host) == (
        "a",
        "client-a",
        "/127.0.0.1",
    )
    assert (member.metadata, member.assignment) == (subscription("t"), b"assignment")
    assert listing(group) == GroupListing("g", "consumer", "Stable", "classic")


def test_a_rebalancing_group_is_described_without_protocol_or_member_data() -> None:
    group = stable_group("t")
    assert join(group, "", "b", subscription("t")) is None  # b joins: a must rejoin
    described = describe(group)
    assert (described.state, described.protocol) == ("PreparingRebalance", "")
    assert {m.member_id for m in described.members} == {"a", "b"}
    assert all(m.metadata == b"" and m.assignment == b"" for m in described.members)


def test_only_an_empty_group_can_be_deleted() -> None:
    group = stable_group("t")
    commit(group, ("t", 0), ("u", 1))
    assert check_delete(group) == ErrorCode.NON_EMPTY_GROUP
    assert group.leave("a", NOW_MS) == ErrorCode.NONE
    assert group.state is GroupState.EMPTY
    assert group.exists() and check_delete(group) == ErrorCode.NONE
    group.delete()
    assert group.state is GroupState.DEAD and not group.offsets and not group.exists()
    assert check_delete(group) == ErrorCode.GROUP_ID_NOT_FOUND
    # A request that still holds the deleted group is told to find the coordinator again.
    assert join(group, "", "c", subscription("t")) == JoinResult(
        ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=""
    )
    assert group.validate_commit("", -1) == ErrorCode.COORDINATOR_NOT_AVAILABLE


def test_a_group_that_never_formed_does_not_exist_but_one_with_offsets_does() -> None:
    never = Group("g")
    assert not never.exists() and check_delete(never) == ErrorCode.GROUP_ID_NOT_FOUND
    simple = Group("s")  # assign() + commit: offsets, no generation
    commit(simple, ("t", 0))
    assert simple.exists() and check_delete(simple) == ErrorCode.NONE
    assert listing(simple) == GroupListing("s", "", "Empty", "classic")


def test_offset_delete_of_an_empty_group_removes_offsets_then_the_group() -> None:
    group = Group("s")
    commit(group, ("t", 0), ("t", 1))
    some = plan_offset_delete(group, [("t", 0), ("x", 9)])
    assert some.error_code == ErrorCode.NONE
    assert some.partition_errors == {("t", 0): 0, ("x", 9): 0}  # no offset: still no error
    assert some.remove == (("t", 0),) and not some.delete_group
    group.remove_offsets(some.remove)
    last = plan_offset_delete(group, [("t", 1)])
    assert last.remove == (("t", 1),) and last.delete_group


def test_offset_delete_of_a_stable_consumer_group_spares_subscribed_topics() -> None:
    group = stable_group("t")
    commit(group, ("t", 0), ("u", 0))
    plan = plan_offset_delete(group, [("t", 0), ("u", 0)])
    assert plan.error_code == ErrorCode.NONE
    assert plan.partition_errors == {
        ("t", 0): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
        ("u", 0): ErrorCode.NONE,
    }
    assert plan.remove == (("u", 0),) and not plan.delete_group


def test_offset_delete_when_subscriptions_cannot_be_read_or_the_group_is_not_consumer() -> None:
    unreadable = Group("g")
    assert join(unreadable, "", "a", b"\x00") is None
    commit(unreadable, ("u", 0))
    plan = plan_offset_delete(unreadable, [("u", 0)])
    assert plan.partition_errors == {("u", 0): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC}
    assert plan.remove == ()
    connect = stable_group("t", protocol_type="connect")
    assert plan_offset_delete(connect, [("u", 0)]).error_code == ErrorCode.NON_EMPTY_GROUP
    assert plan_offset_delete(Group("new"), [("u", 0)]).error_code == ErrorCode.GROUP_ID_NOT_FOUND


RETENTION_MS = 1_000


def committed_at(group: Group, when_ms: int, *partitions: tuple[str, int]) -> None:
    group.commit("", {tp: CommittedOffset(5, -1, "", when_ms) for tp in partitions}, NOW_MS)


def test_offset_expiry_of_a_stable_consumer_group_takes_only_old_unsubscribed_offsets() -> None:
    group = stable_group("t")
    committed_at(group, 0, ("t", 0), ("u", 0))
    committed_at(group, 500, ("u", 1))
    plan = plan_offset_expiry(group, RETENTION_MS, RETENTION_MS, empty_since_ms=None)
    assert plan.remove == (("u", 0),) and not plan.delete_group  # ("t", 0) is subscribed
    connect = stable_group("t", protocol_type="connect")
    committed_at(connect, 0, ("u", 0))
    assert plan_offset_expiry(connect, 10 * RETENTION_MS, RETENTION_MS, None).remove == ()


def test_offset_expiry_of_an_empty_group_counts_from_when_it_became_empty() -> None:
    group = stable_group("t")
    committed_at(group, 0, ("t", 0), ("u", 0))
    assert group.leave("a", NOW_MS) == ErrorCode.NONE
    group.tick(NOW_MS)
    assert group.state is GroupState.EMPTY
    assert plan_offset_expiry(group, 1_999, RETENTION_MS, empty_since_ms=1_000).remove == ()
    plan = plan_offset_expiry(group, 2_000, RETENTION_MS, empty_since_ms=1_000)
    assert plan.remove == (("t", 0), ("u", 0)) and plan.delete_group
    # Since when it is empty unknown: each offset's commit time stands in (Kafka's getOrElse).
    committed_at(group, 900, ("u", 1))
    plan = plan_offset_expiry(group, 1_500, RETENTION_MS, empty_since_ms=None)
    assert plan.remove == (("t", 0), ("u", 0)) and not plan.delete_group


def test_offset_expiry_takes_an_empty_group_without_offsets_at_once() -> None:
    group = stable_group("t")
    assert group.leave("a", NOW_MS) == ErrorCode.NONE
    group.tick(NOW_MS)
    assert group.state is GroupState.EMPTY and group.generation_id > 0
    plan = plan_offset_expiry(group, NOW_MS, RETENTION_MS, empty_since_ms=NOW_MS)
    assert plan.remove == () and plan.delete_group
    assert not plan_offset_expiry(stable_group("t"), NOW_MS, RETENTION_MS, None).delete_group


def test_offset_expiry_of_a_group_that_only_commits_goes_by_commit_time() -> None:
    group = Group("g")
    committed_at(group, 0, ("t", 0))
    committed_at(group, 800, ("t", 1))
    plan = plan_offset_expiry(group, 1_000, RETENTION_MS, empty_since_ms=0)
    assert plan.remove == (("t", 0),) and not plan.delete_group
    plan = plan_offset_expiry(group, 1_800, RETENTION_MS, empty_since_ms=0)
    assert plan.remove == (("t", 0), ("t", 1)) and plan.delete_group


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscriptions_encoded_by_kafka_python_are_read(version: int) -> None:
    assert subscription_topics(subscription("t", "ü", version=version)) == {"t", "ü"}


@pytest.mark.parametrize("garbage", [b"", b"\x00", b"\x00\x00\x00\x00\x00\x05\x00\x01t"])
def test_garbage_subscriptions_are_unreadable(garbage: bytes) -> None:
    assert subscription_topics(garbage) is None


def test_list_filters_match_case_insensitively() -> None:
    listings = [
        GroupListing("a", "consumer", "Stable"),
        GroupListing("b", "consumer", "Empty"),
        GroupListing("c", "", "PreparingRebalance"),
    ]
    assert filter_listings(listings) == listings
    assert [g.group_id for g in filter_listings(listings, ["stable", "EMPTY"])] == ["a", "b"]
    assert filter_listings(listings, types=["Classic"]) == listings
    assert filter_listings(listings, types=["consumer"]) == []
