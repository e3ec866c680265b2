"""Unit tests of the pure replication state machine: one test per claim it makes.

Each test drives ``PartitionReplica`` with messages and explicit times and inspects the Ready it
produces; no shell, no Ray, no disk. The claims: ISR shrink after ``replica.lag.time.max.ms``
with Kafka's caught-up rule, the expand rule, the HW as min over the maximal ISR (leader counts
its durable end) and monotonic, the HW frozen below min ISR, acks=all NOT_ENOUGH_REPLICAS before
append and AFTER_APPEND after, the request timeout, the bound on pending requests, follower
truncation via ``diverging_epoch``, ``end_offset_for_epoch`` semantics, fencing by leader epoch,
observers outside the ISR, push replication and its fallback to pull, and invariant checks.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.partition_steps import (
    EPOCH,
    commit_alter,
    fetch_answers,
    follower_fetch,
    make_durable,
    make_leader,
    produce,
    results,
)

from raylog.actors.replication.isr import NEVER
from raylog.actors.replication.messages import (
    AlterPartitionResponse,
    BatchMeta,
    BecomeFollower,
    BecomeLeader,
    DeleteRecordsRequest,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    RecordBatch,
    ReplicateAck,
    ReplicateRequest,
    StopReplica,
)
from raylog.actors.replication.partition import (
    AppendBatch,
    InvariantViolation,
    PartitionReplica,
    ProduceResult,
    Ready,
    ReplicaConfig,
    Role,
    SendFetchData,
    SendPushData,
    SendToReplica,
    TruncateTo,
)
from raylog.storage.errors import (
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidConfigError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    UnknownLeaderEpochError,
)

# --- ISR -------------------------------------------------------------------------------------


def test_isr_shrinks_when_follower_not_caught_up_within_lag_time() -> None:
    leader = make_leader(replica_lag_time_max_ms=1_000)
    produce(leader, 1, acks=1)
    for now_ms in (200, 600, 1_000):
        follower_fetch(leader, 1, leader.log_end_offset, now_ms)  # 1 keeps up; 2 is silent
        leader.tick(now_ms)
        assert leader.ready().alter_partition == []  # 2 caught up at 0 (become-leader time)
    leader.tick(1_001)
    proposal = leader.ready().alter_partition
    assert [p.new_isr for p in proposal] == [(0, 1)]
    assert leader.isr == (0, 1, 2)  # not in effect until the controller commits it
    commit_alter(leader, Ready(alter_partition=proposal))
    assert leader.isr == (0, 1)


def test_caught_up_time_follows_kafkas_previous_fetch_rule() -> None:
    leader = make_leader(isr=(0,), replicas=(0, 1))
    for i in range(10):
        produce(leader, i, acks=1)
    follower_fetch(leader, 1, 5, now_ms=100)  # behind the leader's end (10) at this fetch
    assert leader.followers[1].last_caught_up_ms == NEVER
    for i in range(10, 20):
        produce(leader, i, acks=1)
    # Reaches the leader end *as of the previous fetch* (10): caught up as of that fetch (100).
    follower_fetch(leader, 1, 10, now_ms=200)
    assert leader.followers[1].last_caught_up_ms == 100
    follower_fetch(leader, 1, 20, now_ms=300)  # reaches the current end: caught up now
    assert leader.followers[1].last_caught_up_ms == 300


def test_isr_expands_when_follower_reaches_hw_and_epoch_start() -> None:
    # Recovered log [0, 10) with HW 4; leading epoch 1 starts at offset 10.
    leader = PartitionReplica(0, log_end_offset=10, epoch_cache=[(0, 0)], high_watermark=4)
    leader.step(BecomeLeader(1, EPOCH, 0, (0,), (0, 1)), 0)
    commit_alter(leader, leader.ready())  # its fence (a fresh replica given a partial ISR)
    assert follower_fetch(leader, 1, 6, 10).alter_partition == []  # >= HW, < epoch start
    ready = follower_fetch(leader, 1, 10, 20)
    assert [p.new_isr for p in ready.alter_partition] == [(0, 1)]


def test_a_follower_trailing_a_steady_stream_of_appends_joins_the_isr() -> None:
    # Every fetch of follower 1 reaches the leader's end as it was at the previous fetch, never
    # its end now: acks=1 appends keep arriving in between. Caught up by Kafka's rule, it holds
    # the HW (shouldWaitForReplicaToJoinIsr), so its end reaches the HW and it joins. A HW
    # taken over the ISR alone runs one round trip ahead of it forever.
    leader = make_leader(isr=(0,), replicas=(0, 1))
    fetched_to = 0
    for round_ in range(1, 6):
        produce(leader, round_, acks=1)
        make_durable(leader)
        ready = follower_fetch(leader, 1, fetched_to, now_ms=round_ * 10)
        fetched_to = leader.log_end_offset
        if ready.alter_partition:
            break
    assert [p.new_isr for p in ready.alter_partition] == [(0, 1)]
    assert round_ <= 3


def test_a_caught_up_follower_outside_the_isr_holds_the_hw_until_it_lags() -> None:
    leader = make_leader(isr=(0,), replicas=(0, 1), replica_lag_time_max_ms=1_000)
    produce(leader, 1, acks=1)
    make_durable(leader)
    follower_fetch(leader, 1, 0, now_ms=10)  # its first fetch in this epoch: not caught up
    produce(leader, 2, acks=1)
    make_durable(leader)
    assert leader.high_watermark == 2
    follower_fetch(leader, 1, 1, now_ms=20)  # reached our end as of its previous fetch
    produce(leader, 3, acks=1)
    make_durable(leader)
    assert leader.high_watermark == 2  # held by 1, caught up as of 10
    leader.tick(1_010)
    assert leader.high_watermark == 2
    leader.tick(1_011)  # 1 stopped fetching more than replica.lag.time.max.ms ago
    assert leader.high_watermark == leader.log_end_offset == 3


def test_a_follower_the_controller_refused_to_add_holds_no_hw_until_proposed_again() -> None:
    # Broker 2 shuts down (controlled): its replica keeps fetching, caught up, and the
    # controller refuses to add it (INELIGIBLE_REPLICA). It must not hold acks=all writes.
    leader = make_leader(isr=(0, 1), replicas=(0, 1, 2), alter_partition_timeout_ms=100)
    produce(leader, 1, acks=1)
    make_durable(leader)
    follower_fetch(leader, 1, 1, 10)
    (proposal,) = follower_fetch(leader, 2, 1, 10).alter_partition
    refused = IneligibleReplicaError.error_code
    leader.step(AlterPartitionResponse(refused, EPOCH, 0, (), proposal.request_id), 20)
    produce(leader, 2, acks=-1)
    make_durable(leader)
    follower_fetch(leader, 2, 1, 30)  # caught up as of its previous fetch: refused, no holder
    ready = follower_fetch(leader, 1, 2, 40)
    assert leader.high_watermark == 2 and results(ready)[2].error_code == 0
    # Once the refusal's backoff is over it is proposed again when it reaches the HW.
    assert follower_fetch(leader, 2, 2, 110).alter_partition == []  # still backing off
    assert [p.new_isr for p in follower_fetch(leader, 2, 2, 130).alter_partition] == [(0, 1, 2)]


def test_a_follower_that_never_caught_up_does_not_hold_the_hw() -> None:
    leader = make_leader(isr=(0,), replicas=(0, 1, 2), observers=(5,))
    for i in range(4):
        produce(leader, i, acks=1)
    make_durable(leader)
    follower_fetch(leader, 5, 0, now_ms=10)  # an observer: never a holder
    assert leader.high_watermark == 4  # 1 and 2 have not fetched in this epoch


def test_observer_never_joins_isr() -> None:
    leader = make_leader(isr=(0,), replicas=(0,), observers=(5,))
    produce(leader, 1, acks=1)
    make_durable(leader)
    ready = follower_fetch(leader, 5, leader.log_end_offset, 10)
    leader.tick(20)
    assert ready.alter_partition == [] and leader.ready().alter_partition == []
    assert 5 not in leader.maximal_isr()


# --- high watermark ----------------------------------------------------------------------------


def test_hw_is_min_over_isr_with_leader_durable_end_and_never_decreases() -> None:
    leader = make_leader()
    for i in range(3):
        produce(leader, i, acks=1)
    follower_fetch(leader, 1, 3, 10)
    follower_fetch(leader, 2, 3, 10)
    assert leader.high_watermark == 0  # the leader's own copy is not durable yet
    make_durable(leader)
    assert leader.high_watermark == 3
    produce(leader, 9, acks=1)
    make_durable(leader)
    follower_fetch(leader, 1, 4, 20)
    assert leader.high_watermark == 3  # follower 2 is still at 3
    follower_fetch(leader, 2, 2, 30)  # a follower reporting less never moves the HW back
    assert leader.high_watermark == 3


def test_hw_counts_pending_isr_additions_maximal_isr() -> None:
    leader = make_leader(isr=(0, 1), replicas=(0, 1, 2))
    ready = follower_fetch(leader, 2, 0, 5)  # reaches HW 0: proposed, not yet committed
    assert [p.new_isr for p in ready.alter_partition] == [(0, 1, 2)]
    produce(leader, 1, acks=1)
    make_durable(leader)
    follower_fetch(leader, 1, 1, 10)
    assert leader.isr == (0, 1)
    assert leader.high_watermark == 0  # held back by 2, a pending member
    follower_fetch(leader, 2, 1, 10)
    assert leader.high_watermark == 1


def test_a_proposal_answered_fenced_leader_epoch_still_holds_the_hw() -> None:
    # The controller committed our proposal to add 2, its answer was lost, and it then moved
    # leadership on (a new epoch); a resent proposal is answered FENCED_LEADER_EPOCH. The
    # addition may be committed, so 2 keeps holding the HW until the controller tells us our
    # new role (Kafka keeps its pending ISR state on this error). Dropping the proposal let a
    # deposed leader advance its HW past 2, which the controller then elected without those
    # batches (simulator seed 2000401).
    leader = make_leader(isr=(0, 1), replicas=(0, 1, 2))
    (proposal,) = follower_fetch(leader, 2, 0, 5).alter_partition
    produce(leader, 1, acks=1)
    make_durable(leader)
    follower_fetch(leader, 1, 1, 10)
    assert leader.high_watermark == 0  # held back by 2, a pending member
    fenced = FencedLeaderEpochError.error_code
    leader.step(AlterPartitionResponse(fenced, EPOCH, 9, (0, 1, 2), proposal.request_id), 20)
    follower_fetch(leader, 1, 1, 30)
    assert leader.alter_in_flight == proposal and leader.high_watermark == 0
    follower_fetch(leader, 2, 1, 40)
    assert leader.high_watermark == 1


def test_hw_frozen_while_isr_below_min_insync_replicas() -> None:
    leader = make_leader(isr=(0,), replicas=(0, 1), min_insync_replicas=2)
    produce(leader, 1, acks=1)
    ready = make_durable(leader)
    assert results(ready)[1].error_code == 0  # acks=1 still completes on local durability
    assert leader.high_watermark == 0


def test_follower_hw_is_min_of_leader_hw_and_own_end() -> None:
    follower = PartitionReplica(1)
    follower.step(BecomeFollower(1, 0, EPOCH, 0), 0)
    request = follower.ready().messages[0].message
    batch = RecordBatch(BatchMeta(0, 3, 10, EPOCH), b"x")
    follower.step(FetchResponse(0, request.request_id, EPOCH, 0, 7, 0, 7, None, (batch,)), 1)
    assert follower.high_watermark == 3


# --- acks --------------------------------------------------------------------------------------


def test_acks_1_completes_on_local_durability_acks_all_on_hw() -> None:
    leader = make_leader(isr=(0, 1), replicas=(0, 1))
    produce(leader, 1, acks=1)
    produce(leader, 2, acks=-1)
    done = results(make_durable(leader))
    assert list(done) == [1] and done[1].base_offset == 0
    done = results(follower_fetch(leader, 1, 2, 10))
    assert list(done) == [2] and done[2].base_offset == 1 and done[2].error_code == 0


def test_acks_all_below_min_isr_fails_before_append() -> None:
    leader = make_leader(isr=(0,), replicas=(0, 1), min_insync_replicas=2)
    ready = produce(leader, 1)
    assert results(ready)[1].error_code == NotEnoughReplicasError.error_code
    assert ready.log_ops == [] and leader.log_end_offset == 0


def test_reconfigure_applies_min_isr_from_the_next_produce_and_refuses_a_mode_change() -> None:
    leader = make_leader(isr=(0,), replicas=(0, 1), min_insync_replicas=1)
    produce(leader, 1)
    assert leader.log_end_offset == 1  # min ISR 1: appended
    leader.reconfigure(ReplicaConfig(min_insync_replicas=2))
    ready = produce(leader, 2)
    assert results(ready)[2].error_code == NotEnoughReplicasError.error_code
    assert leader.log_end_offset == 1  # refused before the append
    with pytest.raises(ValueError, match=r"replication\.mode"):
        leader.reconfigure(ReplicaConfig(min_insync_replicas=1, replication_mode="push"))
    with pytest.raises(InvalidConfigError):
        leader.reconfigure(ReplicaConfig(min_insync_replicas=0))
    assert leader.config.min_insync_replicas == 2  # a refused change changes nothing
    leader.reconfigure(ReplicaConfig(min_insync_replicas=1))
    produce(leader, 3)
    assert leader.log_end_offset == 2


def test_acks_all_shrink_after_append_fails_not_enough_replicas_after_append() -> None:
    leader = make_leader(
        isr=(0, 1), replicas=(0, 1), min_insync_replicas=2, replica_lag_time_max_ms=100
    )
    ready = produce(leader, 1)
    assert isinstance(ready.log_ops[0], AppendBatch) and not ready.log_ops[0].replicated
    leader.tick(101)
    ready = commit_alter(leader, leader.ready())
    assert leader.isr == (0,)
    assert results(ready)[1].error_code == NotEnoughReplicasAfterAppendError.error_code


def test_acks_all_times_out() -> None:
    leader = make_leader()
    produce(leader, 1, now_ms=0, timeout_ms=100)
    leader.tick(99)
    assert leader.ready().produce_results == []
    leader.tick(100)
    assert results(leader.ready())[1].error_code == RequestTimedOutError.error_code


def test_pending_acks_all_are_bounded() -> None:
    leader = make_leader(max_pending_acks_all=2)
    produce(leader, 1)
    produce(leader, 2)
    ready = produce(leader, 3)
    refused = results(ready)[3]
    assert refused.error_code == RequestTimedOutError.error_code
    assert "max_pending_acks_all=2" in refused.message
    assert ready.log_ops == [] and leader.log_end_offset == 2


def test_losing_leadership_fails_pending_with_not_leader() -> None:
    leader = make_leader()
    produce(leader, 1)
    leader.step(BecomeFollower(1, 1, EPOCH + 1, 1), 5)
    assert results(leader.ready())[1].error_code == NotLeaderOrFollowerError.error_code
    assert leader.role is Role.FOLLOWER


# --- divergence and epochs ---------------------------------------------------------------------


def test_end_offset_for_epoch_follows_kafka() -> None:
    replica = PartitionReplica(0, log_end_offset=30, epoch_cache=[(1, 0), (3, 10), (5, 20)])
    assert replica.end_offset_for_epoch(-1) == EpochEndOffset(-1, -1)
    assert replica.end_offset_for_epoch(5) == EpochEndOffset(5, 30)  # latest: the log end
    assert replica.end_offset_for_epoch(6) == EpochEndOffset(-1, -1)  # unknown future epoch
    assert replica.end_offset_for_epoch(3) == EpochEndOffset(3, 20)
    assert replica.end_offset_for_epoch(4) == EpochEndOffset(3, 20)  # floor epoch, next start
    assert replica.end_offset_for_epoch(2) == EpochEndOffset(1, 10)
    assert replica.end_offset_for_epoch(0) == EpochEndOffset(0, 0)  # below every epoch


def test_follower_truncates_diverged_suffix_using_diverging_epoch() -> None:
    # Leader: epoch 0 on [0, 10), epoch 2 on [10, 20). Follower: epoch 0 on [0, 5), then an
    # epoch-1 suffix [5, 8) that no leader kept.
    leader = PartitionReplica(1, log_end_offset=20, epoch_cache=[(0, 0), (2, 10)])
    leader.step(BecomeLeader(1, 3, 0, (1,), (0, 1)), 0)
    leader.ready()
    follower = PartitionReplica(0, log_end_offset=8, epoch_cache=[(0, 0), (1, 5)])
    follower.step(BecomeFollower(1, 1, 3, 0), 0)
    request = follower.ready().messages[0].message
    assert (request.fetch_offset, request.last_fetched_epoch) == (8, 1)
    leader.step(request, 1)
    answer = fetch_answers(leader.ready())[0]
    assert answer.diverging_epoch == EpochEndOffset(0, 10)
    follower.step(answer, 2)
    ready = follower.ready()
    # Kafka's rule: min(leader's end for epoch 0, our end for epoch 0) = 5, not min(10, 8).
    assert ready.log_ops == [TruncateTo(5, 1)]
    again = next(m.message for m in ready.messages if isinstance(m, SendToReplica))
    assert (again.fetch_offset, again.last_fetched_epoch) == (5, 0)
    leader.step(again, 3)
    answer = fetch_answers(leader.ready())[0]
    assert answer.diverging_epoch is None and answer.error_code == 0


def test_truncation_below_hw_is_an_invariant_violation() -> None:
    follower = PartitionReplica(0, log_end_offset=8, epoch_cache=[(0, 0), (1, 5)], high_watermark=8)
    follower.step(BecomeFollower(1, 1, 3, 0), 0)
    request = follower.ready().messages[0].message
    response = FetchResponse(1, request.request_id, 3, 0, 8, 0, 20, EpochEndOffset(0, 10))
    with pytest.raises(InvariantViolation):
        follower.step(response, 1)
    assert issubclass(InvariantViolation, AssertionError)


def test_truncation_below_hw_is_expected_where_acks_precede_the_fsync() -> None:
    # flush.messages > 1: the elected leader may have lost acknowledged records to a power
    # loss; the follower gives up what it holds beyond the leader's log, as Kafka's does.
    config = ReplicaConfig(acks_before_fsync=True)
    follower = PartitionReplica(
        0, config, log_end_offset=8, epoch_cache=[(0, 0), (1, 5)], high_watermark=8
    )
    follower.step(BecomeFollower(1, 1, 3, 0), 0)
    request = follower.ready().messages[0].message
    follower.step(FetchResponse(1, request.request_id, 3, 0, 8, 0, 20, EpochEndOffset(0, 10)), 1)
    assert follower.ready().log_ops == [TruncateTo(5, 1)]
    assert (follower.log_end_offset, follower.high_watermark) == (5, 5)


def test_fencing_with_stale_and_future_leader_epochs() -> None:
    leader = make_leader()
    stale = fetch_answers(follower_fetch(leader, 1, 0, 1, epoch=EPOCH - 1))[0]
    future = fetch_answers(follower_fetch(leader, 1, 0, 1, epoch=EPOCH + 1))[0]
    assert stale.error_code == FencedLeaderEpochError.error_code
    assert future.error_code == UnknownLeaderEpochError.error_code
    # A stale controller command is ignored.
    leader.step(BecomeFollower(1, 2, EPOCH - 1, 0), 2)
    assert leader.role is Role.LEADER
    # A follower refuses a push from a deposed leader.
    follower = PartitionReplica(1)
    follower.step(BecomeFollower(1, 0, 5, 0), 0)
    follower.ready()
    batch = RecordBatch(BatchMeta(0, 1, 1, 4), b"x")
    follower.step(ReplicateRequest(2, 4, 0, -1, (batch,)), 1)
    (reply,) = [m.message for m in follower.ready().messages if isinstance(m, SendToReplica)]
    assert reply.error_code == FencedLeaderEpochError.error_code
    assert follower.log_end_offset == 0


def test_new_leader_holds_hw_until_every_isr_follower_fetches() -> None:
    leader = PartitionReplica(0, log_end_offset=5, epoch_cache=[(0, 0)], high_watermark=2)
    leader.step(BecomeLeader(1, EPOCH, 0, (0, 1), (0, 1)), 0)
    leader.ready()
    assert leader.high_watermark == 2  # follower 1's end is unknown in this epoch
    follower_fetch(leader, 1, 5, 1)
    assert leader.high_watermark == 5


# --- long poll and push ------------------------------------------------------------------------


def test_pull_fetch_at_log_end_is_parked_until_data_arrives() -> None:
    leader = make_leader(isr=(0, 1), replicas=(0, 1))
    leader.step(FetchRequest(1, 77, EPOCH, 0, -1, 1 << 20, max_wait_ms=500), 0)
    assert fetch_answers(leader.ready()) == []
    answers = fetch_answers(produce(leader, 1, acks=1))
    assert [a.request_id for a in answers] == [77]


def test_push_mode_leader_pushes_to_caught_up_follower_and_stops_when_it_falls_behind() -> None:
    leader = make_leader(isr=(0, 1), replicas=(0, 1), replication_mode="push")
    follower_fetch(leader, 1, 0, 1)  # caught up: pushes start
    pushes = [m for m in produce(leader, 1).messages if isinstance(m, SendPushData)]
    assert [(m.to, m.base_offset, m.end_offset) for m in pushes] == [(1, 0, 1)]
    assert isinstance(pushes[0].request, ReplicateRequest)
    make_durable(leader)
    leader.step(ReplicateAck(1, EPOCH, 1), 2)
    done = results(leader.ready())
    assert done[1].error_code == 0  # acks=all completed by the push ack
    # The follower refuses a push (a gap): no more pushes until it fetches at the end again.
    leader.step(ReplicateAck(1, EPOCH, 1, in_push=False), 3)
    assert [m for m in produce(leader, 2).messages if isinstance(m, SendPushData)] == []
    follower_fetch(leader, 1, 2, 4)
    pushes = [m for m in produce(leader, 3).messages if isinstance(m, SendPushData)]
    assert len(pushes) == 1


def test_push_mode_keeps_one_push_in_flight_and_sends_the_rest_together() -> None:
    leader = make_leader(isr=(0, 1), replicas=(0, 1), replication_mode="push", fetch_max_bytes=25)
    follower_fetch(leader, 1, 0, 1)  # caught up: pushes start

    def pushes(ready: Ready) -> list[tuple[int, int, int]]:
        return [
            (m.base_offset, m.end_offset, m.max_bytes)
            for m in ready.messages
            if isinstance(m, SendPushData)
        ]

    assert pushes(produce(leader, 1)) == [(0, 1, 1 << 30)]  # the first goes at once
    for request_id in (2, 3, 4):  # appended while it is in flight: they wait for its ack
        assert pushes(produce(leader, request_id)) == []
    make_durable(leader)
    # Its ack: the three go in one push, from where the follower's log ends, within
    # replica.fetch.max.bytes.
    leader.step(ReplicateAck(1, EPOCH, 1, log_end_offset=1), 2)
    ready = leader.ready()
    assert pushes(ready) == [(1, 4, 25)]
    (push,) = [m for m in ready.messages if isinstance(m, SendPushData)]
    assert push.request.prev_epoch == EPOCH and leader.high_watermark == 1
    # The shell cut that push after two batches (the byte limit): the follower's ack says its
    # log ends at 3, and the next push starts there.
    leader.step(ReplicateAck(1, EPOCH, 3, log_end_offset=3), 3)
    assert pushes(leader.ready()) == [(3, 4, 25)] and leader.high_watermark == 3
    # A late ack of an earlier push sends nothing: the push in flight starts at 3.
    leader.step(ReplicateAck(1, EPOCH, 2, log_end_offset=2), 4)
    assert pushes(leader.ready()) == []
    # A fetch says where the follower is, and clears the push in flight (it was lost).
    follower_fetch(leader, 1, 4, 5)
    assert pushes(produce(leader, 5)) == [(4, 5, 1 << 30)]


def test_push_mode_follower_falls_back_to_pull_on_a_gap() -> None:
    follower = PartitionReplica(1, ReplicaConfig(replication_mode="push"))
    follower.step(BecomeFollower(1, 0, EPOCH, 0), 0)
    first_fetch = follower.ready().messages[0].message
    follower.step(FetchResponse(0, first_fetch.request_id, EPOCH, 0, 0, 0, 0), 1)
    assert follower.push_active  # caught up: now waits for pushes
    batch = RecordBatch(BatchMeta(0, 1, 1, EPOCH), b"a")
    follower.step(ReplicateRequest(0, EPOCH, 0, -1, (batch,)), 2)
    ready = follower.ready()
    assert [type(op) for op in ready.log_ops] == [AppendBatch]
    assert ready.log_ops[0].replicated  # the leader's stamped bytes: Log.append_replicated
    ack = make_durable(follower, 3).messages[0].message
    assert isinstance(ack, ReplicateAck) and ack.durable_end_offset == 1
    gap = RecordBatch(BatchMeta(5, 1, 1, EPOCH), b"z")  # offsets 1..4 never arrived
    follower.step(ReplicateRequest(0, EPOCH, 0, EPOCH, (gap,)), 4)
    sent = [m.message for m in follower.ready().messages if isinstance(m, SendToReplica)]
    assert isinstance(sent[0], ReplicateAck) and not sent[0].in_push
    assert isinstance(sent[1], FetchRequest) and sent[1].fetch_offset == 1
    assert not follower.push_active and follower.log_end_offset == 1


def test_truncation_takes_kafkas_intermediate_step_for_an_unknown_epoch() -> None:
    # Leader: epochs 0 @0, 2 @8, 4 @12. Follower: 0 @0, 3 @10 (epoch 3 never reached this leader).
    leader = PartitionReplica(1, log_end_offset=14, epoch_cache=[(0, 0), (2, 8), (4, 12)])
    leader.step(BecomeLeader(1, 5, 0, (1,), (0, 1)), 0)
    leader.ready()
    follower = PartitionReplica(0, log_end_offset=12, epoch_cache=[(0, 0), (3, 10)])
    follower.step(BecomeFollower(1, 1, 5, 0), 0)
    request = follower.ready().messages[0].message
    truncations = []
    for now_ms in range(1, 4):  # bounded: one round per epoch the logs disagree on
        leader.step(request, now_ms)
        answer = fetch_answers(leader.ready())[0]
        if answer.diverging_epoch is None:
            break
        follower.step(answer, now_ms)
        ready = follower.ready()
        truncations += [op.offset for op in ready.log_ops if isinstance(op, TruncateTo)]
        request = next(m.message for m in ready.messages if isinstance(m, SendToReplica))
    # First to 10 (our end of epoch 0, the largest we hold below the leader's epoch 2), then to
    # 8 (the leader's end of epoch 0): the follower's offsets 8 and 9 were never the leader's.
    assert truncations == [10, 8]
    assert (request.fetch_offset, request.last_fetched_epoch) == (8, 0)


def test_alter_partition_refused_as_stale_adopts_the_controllers_state() -> None:
    leader = make_leader(isr=(0, 1), replicas=(0, 1, 2))
    ready = follower_fetch(leader, 2, 0, 1)
    (request,) = ready.alter_partition
    # The commit's answer was lost; the resend is refused with the controller's current state.
    leader.step(AlterPartitionResponse(108, EPOCH, request.partition_epoch + 1, (0, 1, 2), -1), 2)
    assert leader.isr == (0, 1, 2) and leader.alter_in_flight is None


def test_unanswered_alter_partition_is_resent_after_timeout() -> None:
    leader = make_leader(isr=(0, 1), replicas=(0, 1, 2), alter_partition_timeout_ms=50)
    (request,) = follower_fetch(leader, 2, 0, 0).alter_partition
    leader.tick(49)
    assert leader.ready().alter_partition == []
    leader.tick(50)
    assert leader.ready().alter_partition == [request]


def test_parked_fetch_is_answered_at_max_wait() -> None:
    leader = make_leader(isr=(0, 1), replicas=(0, 1))
    leader.step(FetchRequest(1, 5, EPOCH, 0, -1, 1 << 20, max_wait_ms=100), 0)
    leader.tick(99)
    assert fetch_answers(leader.ready()) == []
    leader.tick(100)
    assert [a.request_id for a in fetch_answers(leader.ready())] == [5]


def test_stop_fails_pending_and_stale_stop_is_ignored() -> None:
    leader = make_leader()
    leader.step(StopReplica(1, EPOCH - 1, 0), 1)
    assert leader.role is Role.LEADER
    produce(leader, 1)
    leader.step(StopReplica(1, EPOCH, 1), 2)
    assert results(leader.ready())[1].error_code == NotLeaderOrFollowerError.error_code
    assert leader.role is Role.STOPPED


def test_consumer_reads_only_below_the_high_watermark() -> None:
    leader = make_leader(isr=(0, 1), replicas=(0, 1))
    produce(leader, 1, acks=1, count=3)
    make_durable(leader)
    leader.step(FetchRequest(-1, 9, -1, 0, -1, 1 << 20), 1)
    (out,) = [m for m in leader.ready().messages if isinstance(m, SendFetchData)]
    assert out.upper_offset == 0 == leader.high_watermark  # follower 1 has nothing yet
    follower_fetch(leader, 1, 3, 2)
    leader.step(FetchRequest(-1, 10, -1, 0, -1, 1 << 20), 3)
    (out,) = [m for m in leader.ready().messages if isinstance(m, SendFetchData)]
    assert out.upper_offset == 3


def test_consumers_read_up_to_fetch_max_bytes_and_followers_up_to_replica_fetch_max_bytes() -> None:
    # Kafka caps a consumer's partition read by the broker's fetch.max.bytes, not by
    # replica.fetch.max.bytes: the connector's 8 MiB reads must not be cut to 1 MiB.
    leader = make_leader(isr=(0, 1), replicas=(0, 1), consumer_fetch_max_bytes=64 << 20)
    produce(leader, 1, acks=1, count=3)
    make_durable(leader)
    follower_fetch(leader, 1, 3, 1)
    leader.step(FetchRequest(-1, 9, -1, 0, -1, 8 << 20), 2)
    (out,) = [m for m in leader.ready().messages if isinstance(m, SendFetchData)]
    assert out.max_bytes == 8 << 20
    leader.step(FetchRequest(-1, 10, -1, 0, -1, 100 << 20), 3)
    (out,) = [m for m in leader.ready().messages if isinstance(m, SendFetchData)]
    assert out.max_bytes == 64 << 20
    leader.step(FetchRequest(1, 11, EPOCH, 0, -1, 16 << 20), 4)  # a follower asking 16 MiB
    (out,) = [m for m in leader.ready().messages if isinstance(m, SendFetchData)]
    assert out.max_bytes == 10 << 20  # replica.fetch.max.bytes: raylog's default


def test_invariant_checks_survive_python_optimize() -> None:
    """InvariantViolation is raised explicitly, so ``python -O`` keeps the checks."""
    import subprocess
    import sys

    code = (
        "from raylog.actors.replication.partition import PartitionReplica, InvariantViolation\n"
        "try:\n"
        "    PartitionReplica(0, log_start_offset=5, log_end_offset=3)\n"
        "except InvariantViolation:\n"
        "    print('checked')\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "checked", out.stderr


def test_refused_alter_partition_backs_off_before_proposing_again() -> None:
    leader = make_leader(isr=(0, 1), replicas=(0, 1, 2), alter_partition_timeout_ms=100)
    (request,) = follower_fetch(leader, 2, 0, 0).alter_partition
    leader.step(
        AlterPartitionResponse(107, EPOCH, request.partition_epoch, (0, 1), request.request_id), 1
    )  # INELIGIBLE
    assert follower_fetch(leader, 2, 0, 50).alter_partition == []
    leader.tick(100)
    assert leader.ready().alter_partition == []
    leader.tick(101)
    assert [p.new_isr for p in leader.ready().alter_partition] == [(0, 1, 2)]


def test_observer_is_never_elected() -> None:
    replica = PartitionReplica(5)
    with pytest.raises(InvariantViolation):
        replica.step(BecomeLeader(1, EPOCH, 0, (5,), (0,), (5,)), 0)


def test_late_answer_to_an_earlier_proposal_keeps_the_one_in_flight() -> None:
    """Regression (found by the simulator, seed 1011566): a late refusal of an earlier proposal
    must not drop the proposal in flight, which the controller may still commit; while in
    flight its additions keep holding the HW back (maximal ISR)."""
    leader = make_leader(isr=(0, 1), replicas=(0, 1, 2))
    (request,) = follower_fetch(leader, 2, 0, 1).alter_partition
    stale = AlterPartitionResponse(
        108, EPOCH, leader.partition_epoch, (0, 1), request.request_id - 1
    )
    leader.step(stale, 2)
    assert leader.alter_in_flight == request
    produce(leader, 1, acks=1)
    make_durable(leader)
    follower_fetch(leader, 1, 1, 3)
    assert leader.high_watermark == 0  # replica 2 (at 0) may be in the ISR already


# --- idempotent producers ----------------------------------------------------------------------

PID = 42


def produce_idempotent(
    replica: PartitionReplica,
    request_id: int,
    seq: int,
    count: int = 1,
    acks: int = -1,
    epoch: int = 0,
    now_ms: int = 0,
) -> Ready:
    replica.step(ProduceRequest(request_id, acks, 30_000, count, 10, b"x", PID, epoch, seq), now_ms)
    return replica.ready()


def commit_everything(leader: PartitionReplica, now_ms: int = 0) -> Ready:
    """Make the leader's log durable and let both followers fetch its end: the HW reaches it."""
    ready = make_durable(leader, now_ms)
    for follower in (1, 2):
        more = follower_fetch(leader, follower, leader.log_end_offset, now_ms)
        ready.produce_results.extend(more.produce_results)
    return ready


def test_leader_answers_a_retry_with_the_original_offsets_and_appends_nothing() -> None:
    leader = make_leader()
    first = produce_idempotent(leader, 1, seq=0, count=2)
    assert [op.batch.base_offset for op in first.log_ops] == [0]
    assert first.log_ops[0].batch.producer_id == PID  # the header fields travel with the batch
    commit_everything(leader)
    produce_idempotent(leader, 2, seq=2, count=1)
    commit_everything(leader)
    retry = produce_idempotent(leader, 3, seq=0, count=2)
    assert retry.log_ops == []
    assert results(retry)[3] == ProduceResult(3, 0, 0, retry.produce_results[0].message)
    assert leader.log_end_offset == 3


def test_acks_all_duplicate_waits_until_the_high_watermark_covers_the_original() -> None:
    leader = make_leader()
    produce_idempotent(leader, 1, seq=0)
    make_durable(leader)
    retry = produce_idempotent(leader, 2, seq=0)  # original appended, not yet replicated
    assert retry.log_ops == [] and retry.produce_results == []
    follower_fetch(leader, 1, 1, 1)
    done = follower_fetch(leader, 2, 1, 2)
    assert {r.request_id: (r.error_code, r.base_offset) for r in done.produce_results} == {
        1: (0, 0),
        2: (0, 0),
    }


def test_acks_1_duplicate_completes_once_the_original_is_durable_locally() -> None:
    leader = make_leader()
    produce_idempotent(leader, 1, seq=0, acks=1)
    retry = produce_idempotent(leader, 2, seq=0, acks=1)
    assert retry.produce_results == []
    done = make_durable(leader)
    assert sorted((r.request_id, r.base_offset) for r in done.produce_results) == [(1, 0), (2, 0)]


def test_out_of_order_and_fenced_epoch_are_refused_before_append() -> None:
    leader = make_leader()
    produce_idempotent(leader, 1, seq=0, epoch=3)
    gap = produce_idempotent(leader, 2, seq=5, epoch=3)
    old = produce_idempotent(leader, 3, seq=1, epoch=2)
    bumped = produce_idempotent(leader, 4, seq=1, epoch=4)
    assert (gap.log_ops, old.log_ops, bumped.log_ops) == ([], [], [])
    assert results(gap)[2].error_code == 45
    assert results(old)[3].error_code == 47
    assert results(bumped)[4].error_code == 45
    assert produce_idempotent(leader, 5, seq=0, epoch=4).log_ops != []


def test_follower_builds_producer_state_from_replicated_batches_and_dedupes_as_leader() -> None:
    follower = PartitionReplica(1)
    follower.step(BecomeFollower(1, 0, EPOCH, 0), 0)
    fetch = follower.ready().messages[0].message
    batch = BatchMeta(0, 2, 10, EPOCH, PID, 0, 0)
    follower.step(
        FetchResponse(0, fetch.request_id, EPOCH, 0, 0, 0, 2, None, (RecordBatch(batch, b"x"),)),
        1,
    )
    follower.ready()
    # The leader dies before the HW covers the batch; the follower is elected.
    follower.step(BecomeLeader(1, EPOCH + 1, 1, (1,), (0, 1)), 2)
    follower.ready()
    retry = produce_idempotent(follower, 9, seq=0, count=2, acks=1)
    assert retry.log_ops == []
    done = make_durable(follower)
    assert [(r.request_id, r.error_code, r.base_offset) for r in done.produce_results] == [
        (9, 0, 0)
    ]


def test_truncation_removes_producer_state_above_the_cut() -> None:
    follower = PartitionReplica(
        0,
        log_end_offset=8,
        epoch_cache=[(0, 0), (1, 5)],
        producer_batches=[BatchMeta(0, 5, 10, 0, PID, 0, 0), BatchMeta(5, 3, 10, 1, PID, 0, 5)],
    )
    assert follower.producers.check(PID, 0, 5, 3).kind == "duplicate"
    follower.step(BecomeFollower(1, 1, 3, 0), 0)
    request = follower.ready().messages[0].message
    follower.step(FetchResponse(1, request.request_id, 3, 0, 0, 0, 20, EpochEndOffset(0, 10)), 1)
    assert follower.ready().log_ops == [TruncateTo(5, 1)]
    # Sequences 5..7 are gone with their batch: they are new again, 0..4 still a duplicate.
    assert follower.producers.check(PID, 0, 5, 3).kind == "append"
    assert follower.producers.check(PID, 0, 0, 5).kind == "duplicate"


def test_recovery_rebuilds_producer_state_from_the_logs_batch_headers() -> None:
    batches = [BatchMeta(i, 1, 10, 0, PID, 0, i) for i in range(7)]
    leader = PartitionReplica(0, log_end_offset=7, epoch_cache=[(0, 0)], producer_batches=batches)
    leader.step(BecomeLeader(1, EPOCH, 0, (0,), (0,)), 0)
    leader.ready()
    retry = produce_idempotent(leader, 1, seq=6, acks=1)
    assert [(r.error_code, r.base_offset) for r in retry.produce_results] == [(0, 6)]
    assert produce_idempotent(leader, 2, seq=1, acks=1).produce_results[0].error_code == 45
    assert produce_idempotent(leader, 3, seq=7, acks=1).log_ops != []


# --- a leader re-created from its WAL ------------------------------------------------------------


def _recovered(epoch_cache: list[tuple[int, int]], log_end: int) -> PartitionReplica:
    """Replica 0 as a re-created actor builds it: fresh, over a recovered log."""
    return PartitionReplica(
        0, ReplicaConfig(), log_end_offset=log_end, epoch_cache=epoch_cache, high_watermark=6
    )


def test_a_recreated_leader_resumes_the_epoch_it_led() -> None:
    # Its topic's configs changed: the broker re-created the actor, and the controller (no
    # election happened) tells it again to lead epoch 3, which its log already ends with.
    replica = _recovered([(1, 0), (3, 4)], log_end=10)
    replica.step(BecomeLeader(1, 3, 7, (0, 1, 2), (0, 1, 2)), 0)
    ready = replica.ready()
    assert replica.role is Role.LEADER and replica.leader_epoch == 3
    assert replica.epoch_cache == [(1, 0), (3, 4)]  # the epoch goes on where the log ends
    assert replica.leader_epoch_start_offset == 10  # a follower rejoins at our log end
    assert sorted(replica.followers) == [1, 2]
    # It fences its predecessor's proposals: its ISR again, bumping the partition epoch.
    fence = ready.alter_partition[-1]
    assert (fence.new_isr, fence.partition_epoch, fence.fence) == ((0, 1, 2), 7, True)
    commit_alter(replica, ready)
    assert replica.partition_epoch == 8 and not replica.isr_unconfirmed
    replica.tick(1_000)  # the ISR check on tick reads every follower's state
    # Followers fetching in epoch 3 carry on; the HW moves once both are at the log end.
    for follower in (1, 2):
        follower_fetch(replica, follower, 10, 1_000, epoch=3)
    assert replica.high_watermark == 10
    ready = produce(replica, 1, now_ms=1_000)
    assert [op.batch.base_offset for op in ready.log_ops if isinstance(op, AppendBatch)] == [10]


def test_a_recreated_leader_ignores_a_command_older_than_its_predecessors_isr() -> None:
    # The predecessor proposed ISR (0, 1, 2); the controller committed it at partition epoch 8,
    # and the answer reaches the re-created actor before the controller's command does, while a
    # command from before the commit (epoch 7, ISR (0,)) is still in flight: it is stale.
    replica = _recovered([(1, 0), (3, 4)], log_end=10)
    replica.step(AlterPartitionResponse(0, 3, 8, (0, 1, 2), 5), 0)
    replica.step(BecomeLeader(1, 3, 7, (0,), (0, 1, 2)), 1)
    assert replica.role is Role.NONE  # refused: on ISR (0,) its HW would ignore 1 and 2
    replica.step(BecomeLeader(1, 3, 8, (0, 1, 2), (0, 1, 2)), 2)
    assert replica.role is Role.LEADER and replica.isr == (0, 1, 2)


def test_a_recreated_leader_whose_epoch_left_no_batch_ignores_an_older_command_too() -> None:
    # The predecessor led epoch 3 without writing in it (its lease had lapsed), so the log's
    # last epoch is 1; it proposed ISR (0, 1, 2), committed at partition epoch 8, and the
    # answer reaches the re-created actor before a command from before the commit (7, ISR
    # (0,)). Taken as a new leadership, that command made a leader whose HW and DeleteRecords
    # ignored 1 and 2, which the controller could then elect with less (simulator seed
    # 1018763: an acknowledged low watermark undone).
    replica = _recovered([(1, 0)], log_end=10)
    replica.step(AlterPartitionResponse(0, 3, 8, (0, 1, 2), 5), 0)
    replica.step(BecomeLeader(1, 3, 7, (0,), (0, 1, 2)), 1)
    assert replica.role is Role.NONE
    replica.step(BecomeLeader(1, 3, 8, (0, 1, 2), (0, 1, 2)), 2)
    assert replica.role is Role.LEADER and replica.isr == (0, 1, 2)
    assert replica.epoch_cache == [(1, 0), (3, 10)]  # its epoch starts at its log end


def test_a_fresh_leader_given_a_partial_isr_fences_before_trusting_it() -> None:
    # The same predecessor, but this time nothing reaches the re-created actor before its
    # command: it cannot tell whether it resumes epoch 3 (no batch of it in the log), so it
    # fences, and until an answer comes every replica counts towards the HW and the low
    # watermark. Here the predecessor's proposal (0, 1) got there first.
    replica = _recovered([(1, 0)], log_end=10)
    replica.step(BecomeLeader(1, 3, 7, (0,), (0, 1, 2)), 0)
    fence = replica.ready().alter_partition[-1]
    assert (fence.new_isr, fence.partition_epoch, fence.fence) == ((0,), 7, True)
    replica.step(DeleteRecordsRequest(9, 6, 1_000), 1)
    assert replica.log_start_offset == 6 and replica.ready().delete_records_results == []
    # Still waiting for 1's log start: 1 may be in the ISR.
    assert (
        follower_fetch(replica, 2, 10, 2, epoch=3, log_start_offset=6).delete_records_results == []
    )
    replica.step(AlterPartitionResponse(108, 3, 8, (0, 1), fence.request_id), 3)
    assert (replica.isr, replica.isr_unconfirmed) == ((0, 1), False)
    assert replica.ready().delete_records_results == []
    ready = follower_fetch(replica, 1, 10, 4, epoch=3, log_start_offset=0)
    assert ready.delete_records_results == []  # 1 starts at 0, below 6
    done = follower_fetch(replica, 1, 10, 5, epoch=3, log_start_offset=6).delete_records_results
    assert [(d.request_id, d.error_code, d.low_watermark) for d in done] == [(9, 0, 6)]


def test_a_fresh_leader_given_every_replica_in_its_isr_leads_at_once() -> None:
    # Nothing a predecessor proposed could add a member: no fence, as on a new topic.
    replica = _recovered([(1, 0)], log_end=10)
    replica.step(BecomeLeader(1, 3, 7, (0, 1, 2), (0, 1, 2)), 0)
    assert replica.ready().alter_partition == [] and not replica.isr_unconfirmed


def test_a_refused_become_leader_changes_nothing() -> None:
    # Epoch 2 is older than the log's last epoch (3): refused, and the replica keeps no part of
    # the command (not a leader without follower states, which would fail every tick).
    replica = _recovered([(1, 0), (3, 4)], log_end=10)
    with pytest.raises(InvariantViolation):
        replica.step(BecomeLeader(1, 2, 7, (0, 1, 2), (0, 1, 2)), 0)
    assert replica.role is Role.NONE and replica.isr == () and replica.followers == {}
    replica.tick(1_000)


def test_only_a_fresh_replica_resumes_an_epoch() -> None:
    # A follower of epoch 3 is never made leader of epoch 3 without an election, which bumps
    # the epoch: such a command is ignored, as every same-epoch command to a non-leader is.
    replica = _recovered([(1, 0), (3, 4)], log_end=10)
    replica.step(BecomeFollower(1, 1, 3, 7), 0)
    replica.ready()
    replica.step(BecomeLeader(1, 3, 8, (0, 1, 2), (0, 1, 2)), 0)
    assert replica.role is Role.FOLLOWER and replica.leader_id == 1


def test_a_recreated_leader_holds_its_hw_until_its_predecessors_proposals_are_fenced() -> None:
    # The predecessor led on ISR (0, 2), proposed adding 1 once 1 had reached its HW, and was
    # replaced before the answer: the controller may still commit that proposal, after which 1,
    # at 8, would be an ISR member lacking what the HW covers above 8 (lost if 1 were elected).
    # The re-created actor (its HW checkpoint lazy, so 6) proposes its ISR with ``fence``, and
    # until an answer comes every replica counts towards the HW.
    replica = _recovered([(1, 0), (3, 4)], log_end=10)
    replica.step(BecomeLeader(1, 3, 7, (0, 2), (0, 1, 2)), 0)
    fence = replica.ready().alter_partition[-1]
    assert (fence.new_isr, fence.fence) == ((0, 2), True)
    follower_fetch(replica, 2, 10, 1, epoch=3)
    follower_fetch(replica, 1, 8, 1, epoch=3)
    assert replica.high_watermark == 8  # not 10: 1 may be in the ISR
    replica.tick(2)
    assert replica.alter_in_flight == fence  # 1 does not rejoin at 8 (below our end, 10)
    # The predecessor's proposal got there first: the fence is refused as stale, with the ISR.
    replica.step(AlterPartitionResponse(108, 3, 8, (0, 1, 2), fence.request_id), 3)
    assert (replica.isr, replica.isr_unconfirmed, replica.high_watermark) == ((0, 1, 2), False, 8)
    follower_fetch(replica, 1, 10, 4, epoch=3)
    assert replica.high_watermark == 10


def test_a_fence_that_is_committed_lets_the_hw_move_on_the_isr() -> None:
    replica = _recovered([(1, 0), (3, 4)], log_end=10)
    replica.step(BecomeLeader(1, 3, 7, (0, 2), (0, 1, 2)), 0)
    ready = replica.ready()
    follower_fetch(replica, 2, 10, 1, epoch=3)
    assert replica.high_watermark == 6  # 1 has not fetched: its end is unknown
    commit_alter(replica, ready, 2)  # partition epoch 8, ISR (0, 2): 1 was not added
    assert (replica.partition_epoch, replica.high_watermark) == (8, 10)


# --- unclean elections and log starts -----------------------------------------------------------


def _unclean_follower(**kwargs: Any) -> tuple[PartitionReplica, FetchRequest]:
    follower = PartitionReplica(0, ReplicaConfig(unclean_leader_election_enable=True), **kwargs)
    follower.step(BecomeFollower(1, 1, 5, 0), 0)
    return follower, follower.ready().messages[0].message


def test_a_follower_starts_over_at_an_unclean_leaders_end_below_its_log_start() -> None:
    # DeleteRecords moved our log start to 30; the new leader, elected uncleanly, ends at 12.
    follower, request = _unclean_follower(
        log_start_offset=30, log_end_offset=40, epoch_cache=[(2, 30)], high_watermark=40
    )
    out_of_range = FetchResponse(1, request.request_id, 5, 1, 12, 0, 12, None)
    follower.step(out_of_range, 1)
    ready = follower.ready()
    assert ready.log_ops == [TruncateTo(12, 1, full=True)]
    assert (follower.log_start_offset, follower.log_end_offset) == (12, 12)
    again = next(m.message for m in ready.messages if isinstance(m, SendToReplica))
    assert again.fetch_offset == 12  # not 40 again, which is out of range forever


def test_an_unclean_leader_diverging_at_its_log_start_empties_the_follower() -> None:
    # The leader's first epoch entry was moved up to its log start, 6, which may lie inside a
    # batch we hold: no cut can land there, so we start over at it.
    follower, request = _unclean_follower(
        log_end_offset=20, epoch_cache=[(0, 0), (3, 10)], high_watermark=15
    )
    diverging = FetchResponse(1, request.request_id, 5, 0, 20, 6, 30, EpochEndOffset(0, 6))
    follower.step(diverging, 1)
    assert follower.ready().log_ops == [TruncateTo(6, 1, full=True)]
    assert (follower.log_start_offset, follower.log_end_offset) == (6, 6)


def test_a_truncation_to_the_log_start_empties_the_log() -> None:
    # Our own first epoch entry sits at our log start, 4 (moved up to it, inside the batch
    # [3, 6)): a diverging epoch that ends our log there empties it instead of cutting at 4.
    follower, request = _unclean_follower(
        log_start_offset=4, log_end_offset=9, epoch_cache=[(2, 4)], high_watermark=4
    )
    diverging = FetchResponse(1, request.request_id, 5, 0, 9, 2, 12, EpochEndOffset(1, 7))
    follower.step(diverging, 1)
    assert follower.ready().log_ops == [TruncateTo(4, 1, full=True)]
