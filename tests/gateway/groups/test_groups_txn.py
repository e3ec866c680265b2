"""Transactional offset commits in one group and in the replay of ``__consumer_offsets``: pure.

Proves: a producer's pending offsets are not the group's committed ones until its transaction
commits, and an abort drops them; of a pending and a plain commit of one partition the later
in the log wins, either way round; a tombstone drops every producer's pending offset of its
partition; TxnOffsetCommit's member checks are Kafka's (none without a generation, member or
instance id, even while rebalancing; ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID
otherwise, no REBALANCE_IN_PROGRESS); a group holding only pending offsets is not empty; expiry
leaves partitions with pending offsets and their group alone; OffsetDelete and DeleteGroups
tombstone them; the replay reads transactional batches as pending under their producer, and
COMMIT / ABORT markers, later plain commits and tombstones as the live group does; a transaction
without a marker stays pending after the load.
"""

from __future__ import annotations

from support.group_coordinator import marker

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups import group_admin
from raylog.gateway.groups import records as gr
from raylog.gateway.groups.group import CommittedOffset, Group, GroupState, Member
from raylog.gateway.groups.replay import GroupReplay
from raylog.gateway.groups.txn_offsets import PendingOffsets
from raylog.storage import batch as rb

T0, T1 = ("t", 0), ("t", 1)
DAY_MS = 24 * 3600 * 1000


def at(offset: int, log_offset: int, when_ms: int = 0) -> CommittedOffset:
    return CommittedOffset(offset, -1, "", when_ms, log_offset)


def stable_group(*members: tuple[str, str | None]) -> Group:
    """Group "g" Stable at generation 3 with the ``(member id, instance id)`` members."""
    group = Group("g")
    group.restore(
        protocol_type="consumer",
        generation_id=3,
        protocol_name="range",
        leader_id=members[0][0],
        members=[
            Member(m, "c", "/h", 10_000, 10_000, (("range", b""),), group_instance_id=i)
            for m, i in members
        ],
        now_ms=0,
    )
    return group


def test_pending_offsets_commit_abort_and_replace() -> None:
    pending = PendingOffsets()
    assert not pending
    pending.add(7, {T0: at(5, 10)})
    pending.add(7, {T0: at(6, 11), T1: at(1, 12)})  # the producer's later offset replaces
    pending.add(8, {T1: at(2, 13)})
    assert pending and pending.has(T0) and pending.producers() == {7, 8}
    committed: dict[tuple[str, int], CommittedOffset] = {}
    assert pending.complete(8, False, committed) == [] and committed == {}  # aborted
    assert pending.complete(7, True, committed) == [T0, T1]
    assert committed == {T0: at(6, 11), T1: at(1, 12)}
    assert not pending and pending.complete(7, True, committed) == []  # an unknown producer


def test_the_later_record_in_the_log_wins() -> None:
    pending = PendingOffsets()
    pending.add(7, {T0: at(5, 10), T1: at(5, 12)})
    # A plain commit of T0 appended after the transactional one (log offset 11); one of T1
    # before it (log offset 9).
    committed = {T0: at(99, 11), T1: at(1, 9)}
    assert pending.complete(7, True, committed) == [T1]
    assert committed == {T0: at(99, 11), T1: at(5, 12)}


def test_a_tombstone_drops_every_producers_pending_offset_of_its_partition() -> None:
    pending = PendingOffsets()
    pending.add(7, {T0: at(5, 10)})
    pending.add(8, {T0: at(6, 11), T1: at(1, 12)})
    pending.drop([T0])
    assert pending.partitions() == {T1} and pending.producers() == {8}
    pending.drop([T1])
    assert not pending and pending.by_producer == {}


def test_txn_commit_checks_are_kafkas() -> None:
    group = stable_group(("a", None), ("s", "inst"))
    # v0-2 name no member: nothing is checked, also during a rebalance.
    assert group.validate_txn_commit("", -1) == ErrorCode.NONE
    group.state = GroupState.PREPARING_REBALANCE
    assert group.validate_txn_commit("", -1) == ErrorCode.NONE
    group.state = GroupState.COMPLETING_REBALANCE  # no REBALANCE_IN_PROGRESS for a txn commit
    assert group.validate_txn_commit("a", 3) == ErrorCode.NONE
    assert group.validate_commit("a", 3) == ErrorCode.REBALANCE_IN_PROGRESS
    group.state = GroupState.STABLE
    assert group.validate_txn_commit("a", 2) == ErrorCode.ILLEGAL_GENERATION
    assert group.validate_txn_commit("x", 3) == ErrorCode.UNKNOWN_MEMBER_ID
    assert group.validate_txn_commit("a", -1) == ErrorCode.ILLEGAL_GENERATION
    assert group.validate_txn_commit("s", 3, "inst") == ErrorCode.NONE
    assert group.validate_txn_commit("old", 3, "inst") == ErrorCode.FENCED_INSTANCE_ID
    assert group.validate_txn_commit("s", 3, "other") == ErrorCode.UNKNOWN_MEMBER_ID
    assert Group("").validate_txn_commit("", -1) == ErrorCode.INVALID_GROUP_ID
    group.unload()
    assert group.validate_txn_commit("", -1) == ErrorCode.COORDINATOR_NOT_AVAILABLE


def test_pending_offsets_keep_a_group_and_its_partitions_from_expiry() -> None:
    group = Group("g")
    assert group.is_empty()
    group.pending_txn.add(7, {T0: at(5, 10)})
    assert not group.is_empty() and group.exists()
    group.offsets = {T0: at(1, 3), T1: at(2, 4)}  # both committed long ago
    plan = group_admin.plan_offset_expiry(group, 10 * DAY_MS, DAY_MS, None)
    assert plan.remove == (T1,) and not plan.delete_group
    group.pending_txn.clear()
    plan = group_admin.plan_offset_expiry(group, 10 * DAY_MS, DAY_MS, None)
    assert plan.remove == (T0, T1) and plan.delete_group


def test_offset_delete_and_group_delete_take_pending_offsets_with_them() -> None:
    group = Group("g")
    group.offsets = {T0: at(1, 3)}
    group.pending_txn.add(7, {T1: at(5, 10)})
    plan = group_admin.plan_offset_delete(group, [T0])
    assert plan.remove == (T0,) and not plan.delete_group  # T1 is still held
    plan = group_admin.plan_offset_delete(group, [T0, T1])
    assert plan.remove == (T0, T1) and plan.delete_group
    assert group_admin.check_delete(group) == ErrorCode.NONE  # Kafka: Empty is enough
    group.remove_offsets([T1])
    assert not group.pending_txn and group.offsets == {T0: at(1, 3)}
    group.pending_txn.add(7, {T1: at(5, 10)})
    group.delete()
    assert not group.pending_txn and group.is_empty()


def _offsets(
    *commits: tuple[str, tuple[str, int], int | None], base: int, producer: int = -1
) -> bytes:
    """One batch of OffsetCommit records (group, partition, offset; None: a tombstone), a
    transactional one of ``producer`` when given."""
    return rb.build_batch(
        [
            rb.Record(
                gr.encode_key(gr.OffsetCommitKey(g, tp[0], tp[1])),
                None
                if offset is None
                else gr.encode_value(gr.OffsetCommitValue(offset, -1, "", 0)),
                0,
            )
            for g, tp, offset in commits
        ],
        base_offset=base,
        producer_id=producer,
        producer_epoch=0 if producer >= 0 else -1,
        transactional=producer >= 0,
    )


def _replayed(*batches: bytes, from_offset: int = 0) -> dict[str, Group]:
    replay = GroupReplay()
    replay.apply(b"".join(batches), from_offset)
    return replay.groups(now_ms=0)


def _offset_of(group: Group, tp: tuple[str, int]) -> int | None:
    committed = group.offsets.get(tp)
    return committed.offset if committed is not None else None


def test_replay_of_committed_aborted_and_open_transactions() -> None:
    groups = _replayed(
        _offsets(("g", T0, 1), base=0),
        _offsets(("g", T0, 5), ("h", T0, 6), base=1, producer=7),  # committed below
        _offsets(("g", T1, 8), base=3, producer=8),  # aborted below
        _offsets(("h", T1, 9), base=4, producer=9),  # still open at the end
        marker(7, commit=True, base=5),
        marker(8, commit=False, base=6),
    )
    g, h = groups["g"], groups["h"]
    assert (_offset_of(g, T0), _offset_of(g, T1)) == (5, None)
    assert g.offsets[T0].log_offset == 1 and not g.pending_txn
    assert _offset_of(h, T0) == 6 and _offset_of(h, T1) is None
    assert h.pending_txn.producers() == {9} and h.pending_txn.has(T1)
    # A group that holds nothing but an open transaction's offsets is loaded too.
    only = _replayed(_offsets(("p", T0, 3), base=0, producer=9))
    assert set(only) == {"p"} and only["p"].pending_txn.has(T0)


def test_replay_keeps_the_later_of_a_plain_and_a_transactional_commit() -> None:
    groups = _replayed(
        _offsets(("g", T0, 5), ("g", T1, 5), base=0, producer=7),
        _offsets(("g", T0, 99), base=2),  # a plain commit after the transaction's T0
        marker(7, commit=True, base=3),
    )
    assert (_offset_of(groups["g"], T0), _offset_of(groups["g"], T1)) == (99, 5)


def test_replay_drops_pending_offsets_at_a_tombstone_and_skips_markers_before_the_start() -> None:
    groups = _replayed(
        _offsets(("g", T0, 5), ("g", T1, 6), base=0, producer=7),
        _offsets(("g", T0, None), base=2),  # OffsetDelete of T0
        marker(7, commit=True, base=3),
    )
    assert set(groups["g"].offsets) == {T1}
    pending = _offsets(("g", T0, 5), base=0, producer=7)
    # The marker lies before the fetch's start: it was applied from an earlier fetch.
    groups = _replayed(pending, from_offset=0)
    again = GroupReplay()
    again.apply(pending, 0)
    again.apply(marker(7, commit=True, base=1) + _offsets(("g", T1, 2), base=2), 2)
    assert groups["g"].pending_txn.has(T0) and again.groups(0)["g"].pending_txn.has(T0)
