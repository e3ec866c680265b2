"""The state machine's side of DeleteRecords (Kafka's Partition.deleteRecordsOnLeader,
DelayedDeleteRecords and the follower's maybeIncrementLogStartOffset).

Claims: the leader moves its log start at once (an ``AdvanceLogStart`` for the shell), -1 means
the high watermark, and answers with the low watermark only once every ISR member reports a log
start at or above the requested offset; an offset above the high watermark or negative (other
than -1) is OFFSET_OUT_OF_RANGE, a non-leader answers NOT_LEADER_OR_FOLLOWER, a request times out
with REQUEST_TIMED_OUT, leaving leadership fails it, an ISR shrink can complete it; parked
fetches are answered at once so followers learn the new start; followers adopt the leader's log
start from fetch answers and pushes, never above their own high watermark, and report theirs in
fetches and push acks; a follower started inside a batch takes that batch whole; in push
mode, a follower left below the leader's log start is not pushed to but pulls and starts over.
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
)

from raylog.actors.replication.messages import (
    BatchMeta,
    BecomeFollower,
    DeleteRecordsRequest,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    LocalLogStartAdvanced,
    RecordBatch,
    ReplicateAck,
    ReplicateRequest,
)
from raylog.actors.replication.partition import (
    PartitionReplica,
    Ready,
    ReplicaConfig,
    SendPushData,
    SendToReplica,
)
from raylog.actors.replication.ready import (
    AdvanceLogStart,
    AppendBatch,
    DeleteRecordsResult,
    TruncateTo,
)
from raylog.storage.errors import (
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
)


def committed_leader(records: int = 10, **config: Any) -> PartitionReplica:
    """An RF=3 leader whose ``records`` records are committed (both followers fetched them)."""
    leader = make_leader(**config)
    produce(leader, 1, acks=1, count=records)
    make_durable(leader)
    for follower in (1, 2):
        follower_fetch(leader, follower, records, 1)
    assert leader.high_watermark == records
    return leader


def delete(
    replica: PartitionReplica,
    request_id: int,
    offset: int,
    now_ms: int = 10,
    timeout_ms: int = 1_000,
) -> Ready:
    replica.step(DeleteRecordsRequest(request_id, offset, timeout_ms), now_ms)
    return replica.ready()


def fetch_reporting(
    leader: PartitionReplica, follower: int, log_start_offset: int, now_ms: int
) -> Ready:
    request = FetchRequest(
        follower, 1000 + now_ms, EPOCH, leader.log_end_offset, EPOCH, 1 << 20, 0, log_start_offset
    )
    leader.step(request, now_ms)
    return leader.ready()


def answers(ready: Ready) -> dict[int, DeleteRecordsResult]:
    return {r.request_id: r for r in ready.delete_records_results}


def test_leader_advances_at_once_and_answers_when_every_isr_member_has() -> None:
    leader = committed_leader()
    ready = delete(leader, 7, 4)
    assert ready.log_ops == [AdvanceLogStart(4)]
    assert leader.log_start_offset == 4
    assert answers(ready) == {}  # the followers' log starts are not known yet
    assert answers(fetch_reporting(leader, 1, 4, 20)) == {}
    done = answers(fetch_reporting(leader, 2, 6, 30))
    assert done == {7: DeleteRecordsResult(7, 0, 4)}  # the low watermark: min over the ISR


def test_minus_one_means_the_high_watermark_and_rf1_answers_at_once() -> None:
    leader = make_leader(isr=(0,), replicas=(0,))
    produce(leader, 1, acks=1, count=5)
    make_durable(leader)
    ready = delete(leader, 3, -1)
    assert ready.log_ops == [AdvanceLogStart(5)]
    assert answers(ready) == {3: DeleteRecordsResult(3, 0, 5)}
    # Again below the log start: nothing to do, answered with the low watermark.
    ready = delete(leader, 4, 2)
    assert ready.log_ops == []
    assert answers(ready) == {4: DeleteRecordsResult(4, 0, 5)}


def test_out_of_range_offsets_and_non_leaders_are_refused() -> None:
    leader = committed_leader()
    for request_id, offset in ((1, 11), (2, -2)):
        ready = delete(leader, request_id, offset)
        assert ready.log_ops == []
        assert answers(ready)[request_id].error_code == OffsetOutOfRangeError.error_code
    assert leader.log_start_offset == 0
    follower = PartitionReplica(1)
    follower.step(BecomeFollower(1, 0, EPOCH, 0), 0)
    follower.ready()
    ready = delete(follower, 3, 0)
    assert answers(ready)[3].error_code == NotLeaderOrFollowerError.error_code


def test_a_request_times_out_and_leaving_leadership_fails_the_rest() -> None:
    leader = committed_leader()
    delete(leader, 1, 4, now_ms=10, timeout_ms=100)
    delete(leader, 2, 6, now_ms=10, timeout_ms=10_000)
    leader.tick(109)
    assert answers(leader.ready()) == {}
    leader.tick(110)
    timed_out = answers(leader.ready())
    assert timed_out == {
        1: DeleteRecordsResult(1, RequestTimedOutError.error_code, -1, timed_out[1].message)
    }
    leader.step(BecomeFollower(2, 1, EPOCH + 1, 1), 200)
    failed = answers(leader.ready())
    assert failed[2].error_code == NotLeaderOrFollowerError.error_code
    assert leader.pending_deletes == {}


def test_a_member_leaving_the_isr_no_longer_holds_the_low_watermark() -> None:
    leader = committed_leader()
    delete(leader, 1, 5, timeout_ms=100_000)
    produce(leader, 2, acks=1, now_ms=20)  # follower 2 never fetches it
    make_durable(leader, 20)
    assert answers(fetch_reporting(leader, 1, 5, 30)) == {}
    leader.tick(40_000)  # 2 has not caught up for longer than replica.lag.time.max.ms
    proposal = leader.ready()
    assert [p.new_isr for p in proposal.alter_partition] == [(0, 1)]
    done = answers(commit_alter(leader, proposal, 40_000))
    assert done == {1: DeleteRecordsResult(1, 0, 5)}


def test_parked_fetches_are_answered_with_the_new_log_start() -> None:
    leader = committed_leader()
    leader.step(FetchRequest(1, 99, EPOCH, 10, EPOCH, 1 << 20, max_wait_ms=500), 5)
    assert fetch_answers(leader.ready()) == []
    parked = fetch_answers(delete(leader, 1, 8))
    assert [(a.request_id, a.log_start_offset) for a in parked] == [(99, 8)]


def follower_with_log(end: int, high_watermark: int, **config: Any) -> PartitionReplica:
    follower = PartitionReplica(
        1,
        ReplicaConfig(**config),
        log_end_offset=end,
        epoch_cache=[(EPOCH, 0)],
        high_watermark=high_watermark,
    )
    follower.step(BecomeFollower(1, 0, EPOCH, 0), 0)
    return follower


def sent_fetch(ready: Ready) -> FetchRequest:
    return next(
        m.message
        for m in ready.messages
        if isinstance(m, SendToReplica) and isinstance(m.message, FetchRequest)
    )


def test_follower_adopts_the_leaders_log_start_up_to_its_own_high_watermark() -> None:
    follower = follower_with_log(end=10, high_watermark=6)
    request = sent_fetch(follower.ready())
    assert request.log_start_offset == 0
    # The leader's HW is 10 and its log start 8; ours is 6 until the answer raises it to 10.
    follower.step(FetchResponse(0, request.request_id, EPOCH, 0, 7, 8, 10), 1)
    ready = follower.ready()
    assert ready.log_ops == [AdvanceLogStart(7)]  # bounded by our new HW, min(7, 10)
    assert follower.log_start_offset == 7
    again = sent_fetch(ready)
    follower.step(FetchResponse(0, again.request_id, EPOCH, 0, 10, 8, 10), 2)
    ready = follower.ready()
    assert ready.log_ops == [AdvanceLogStart(8)]
    assert sent_fetch(ready).log_start_offset == 8  # reported to the leader


def test_push_carries_the_log_start_both_ways() -> None:
    leader = committed_leader(replication_mode="push")
    follower_fetch(leader, 1, 10, 2)  # caught up: pushes start
    delete(leader, 1, 6)
    ready = produce(leader, 2, count=2)
    pushes = [m.request for m in ready.messages if isinstance(m, SendPushData)]
    assert pushes and all(p.log_start_offset == 6 for p in pushes)
    follower = follower_with_log(end=10, high_watermark=10, replication_mode="push")
    first = sent_fetch(follower.ready())
    follower.step(FetchResponse(0, first.request_id, EPOCH, 0, 10, 0, 10), 1)
    follower.ready()
    batch = RecordBatch(BatchMeta(10, 2, 10, EPOCH), b"x")
    follower.step(ReplicateRequest(0, EPOCH, 10, EPOCH, (batch,), log_start_offset=6), 2)
    assert follower.ready().log_ops[-1] == AdvanceLogStart(6)
    ack = make_durable(follower, 3).messages[0].message
    assert isinstance(ack, ReplicateAck) and ack.log_start_offset == 6


def test_an_answer_to_a_fetch_a_push_overtook_is_dropped() -> None:
    # Push mode: our fetch from 5 is in flight when a push brings [5, 10). DeleteRecords then
    # moves the leader's log start to 8, and the answer to the fetch says 5 is out of range.
    # Acting on it would start our log over at 8, dropping [8, 10), which we hold and the
    # leader may already count as committed (simulator seed 1000906, failed logs: the replica
    # that did so was elected and lacked committed batches). Kafka's fetcher drops an answer
    # whose fetch offset is no longer the partition's: we fetch again later, from 10.
    follower = follower_with_log(end=5, high_watermark=3, replication_mode="push")
    request = sent_fetch(follower.ready())
    assert request.fetch_offset == 5
    batch = RecordBatch(BatchMeta(5, 5, 10, EPOCH), b"x")
    follower.step(ReplicateRequest(0, EPOCH, 5, EPOCH, (batch,)), 1)
    make_durable(follower, 2)
    assert follower.log_end_offset == 10
    out_of_range = FetchResponse(0, request.request_id, EPOCH, 1, 9, 8, 12)
    follower.step(out_of_range, 3)
    ready = follower.ready()
    assert [op for op in ready.log_ops if isinstance(op, TruncateTo)] == []
    assert (follower.log_start_offset, follower.log_end_offset) == (0, 10)
    assert follower.fetch_in_flight is None  # dropped; pushes are flowing
    follower.tick(1_000)  # none for push_idle_fetch_ms: it fetches, from its log end
    assert sent_fetch(follower.ready()).fetch_offset == 10


def test_a_follower_started_inside_a_batch_takes_that_batch_whole() -> None:
    follower = follower_with_log(end=3, high_watermark=3)
    request = sent_fetch(follower.ready())
    # The leader's log starts at 15, inside its batch [10, 19]: we are behind it.
    follower.step(FetchResponse(0, request.request_id, EPOCH, 1, 20, 15, 20), 1)
    ready = follower.ready()
    assert ready.log_ops == [TruncateTo(15, 1, full=True)]
    again = sent_fetch(ready)
    assert again.fetch_offset == 15
    batch = RecordBatch(BatchMeta(10, 10, 100, EPOCH), b"x")
    follower.step(FetchResponse(0, again.request_id, EPOCH, 0, 20, 15, 20, None, (batch,)), 2)
    ready = follower.ready()
    assert [type(op) for op in ready.log_ops] == [AppendBatch]
    assert (follower.log_start_offset, follower.log_end_offset) == (15, 20)
    assert follower.epoch_cache == [(EPOCH, 15)]


@pytest.mark.parametrize(
    "config",
    [{"unclean_leader_election_enable": True}, {"acks_before_fsync": True}],
    ids=["unclean", "acks-before-fsync"],
)
def test_a_follower_whose_hw_says_nothing_ends_inside_the_leaders_first_batch(
    config: dict[str, Any],
) -> None:
    # Simulator seed 418655930 (unclean elections, push mode): after truncating for a diverging
    # epoch, our log ends at 5, at our HW; the leader's log starts there, inside its batch
    # [4, 7). Where an unclean election (or a power loss under a relaxed flush policy) may
    # have put other records below our HW, our record 4 need not be the leader's, and the
    # leader deleted it anyway: we start over at 5 and take the batch whole.
    follower = follower_with_log(end=5, high_watermark=5, **config)
    request = sent_fetch(follower.ready())
    assert request.fetch_offset == 5
    batch = RecordBatch(BatchMeta(4, 3, 30, EPOCH), b"x")
    follower.step(FetchResponse(0, request.request_id, EPOCH, 0, 7, 5, 7, None, (batch,)), 1)
    ready = follower.ready()
    assert [type(op) for op in ready.log_ops] == [TruncateTo, AppendBatch]
    assert (follower.log_start_offset, follower.log_end_offset) == (5, 7)


def test_a_follower_joins_the_isr_only_once_its_log_start_reaches_the_leaders() -> None:
    leader = make_leader(isr=(0, 1), replicas=(0, 1, 2))
    produce(leader, 1, acks=1, count=10)
    make_durable(leader)
    follower_fetch(leader, 1, 10, 1)
    assert answers(delete(leader, 1, 6)) == {}  # follower 1 has not reported 6 yet
    # Follower 2 catches up, still reporting log start 0: not yet in sync.
    assert follower_fetch(leader, 2, 10, 2).alter_partition == []
    ready = follower_fetch(leader, 2, 10, 3, log_start_offset=6)
    assert [p.new_isr for p in ready.alter_partition] == [(0, 1, 2)]
    # The expansion is in flight: 2 already counts towards the low watermark (maximal ISR).
    delete(leader, 2, 8)
    assert answers(fetch_reporting(leader, 1, 8, 4)) == {1: DeleteRecordsResult(1, 0, 6)}
    assert answers(fetch_reporting(leader, 2, 8, 5)) == {2: DeleteRecordsResult(2, 0, 8)}


def test_a_log_start_moved_by_retention_does_not_keep_a_follower_out_of_the_isr() -> None:
    # Retention moves the leader's log start every round; the follower learns it from each
    # answer and reports it in its next fetch, one round behind. Only a log start set by a
    # DeleteRecords must be held to join (tests above): this follower joins.
    leader = make_leader(isr=(0, 1), replicas=(0, 1, 2))
    produce(leader, 1, acks=1, count=10)
    make_durable(leader)
    follower_fetch(leader, 1, 10, 1)
    reported_start = 0
    for round_ in range(1, 4):
        leader.step(LocalLogStartAdvanced(round_), 10 * round_)
        ready = follower_fetch(leader, 2, 10, 10 * round_ + 1, log_start_offset=reported_start)
        reported_start = leader.log_start_offset
        if ready.alter_partition:
            break
    assert [p.new_isr for p in ready.alter_partition] == [(0, 1, 2)]
    assert reported_start < 4 and leader.log_start_offset > 0


def test_a_follower_whose_log_diverged_below_the_leaders_log_start_starts_over_there() -> None:
    # Our log ends at 20 (HW 12) with batches the leader does not have; the leader's log starts
    # at 17, inside its batch [16, 19], and it knows no epoch below that.
    follower = follower_with_log(end=20, high_watermark=12)
    request = sent_fetch(follower.ready())
    diverged = EpochEndOffset(EPOCH, 17)
    follower.step(FetchResponse(0, request.request_id, EPOCH, 0, 25, 17, 25, diverged), 1)
    ready = follower.ready()
    assert ready.log_ops == [TruncateTo(17, 1, full=True)]  # not a cut inside a batch
    assert (follower.log_start_offset, follower.log_end_offset) == (17, 17)


def test_a_follower_ending_at_the_leaders_log_start_inside_a_batch_starts_over() -> None:
    # Our log ends at 17 (HW 12), which is the leader's log start, inside its batch [16, 19]:
    # our batch ending at 17 is not the leader's (KIP-320 cannot tell: the leader knows no
    # epoch below 17), so we start over at 17 and take the leader's batch whole.
    follower = follower_with_log(end=17, high_watermark=12)
    request = sent_fetch(follower.ready())
    batch = RecordBatch(BatchMeta(16, 4, 40, EPOCH), b"x")
    follower.step(FetchResponse(0, request.request_id, EPOCH, 0, 20, 17, 20, None, (batch,)), 1)
    ready = follower.ready()
    assert [type(op) for op in ready.log_ops] == [TruncateTo, AppendBatch]
    assert ready.log_ops[0] == TruncateTo(17, 1, full=True)
    assert (follower.log_start_offset, follower.log_end_offset) == (17, 20)


def test_a_follower_left_below_the_log_start_is_not_pushed_to_but_pulls() -> None:
    """Push mode: DeleteRecords moves the log start past the end of a follower out of the ISR
    that a push is still in flight to; its ack must not make the leader push from below its
    log start (data it no longer has): the follower falls back to pull, is told its offset is
    out of range and starts over at the log start."""
    leader = committed_leader(replication_mode="push")  # both followers caught up at 10
    produce(leader, 1, acks=1, count=5, now_ms=10)  # pushed to both: in flight from 10
    make_durable(leader, 10)
    follower_fetch(leader, 1, 15, 20)  # 1 catches up; 2 stays at 10 and leaves the ISR
    leader.tick(40_000)
    commit_alter(leader, leader.ready(), 40_000)
    assert leader.isr == (0, 1) and leader.high_watermark == 15
    delete(leader, 2, 14, now_ms=40_001)
    assert leader.log_start_offset == 14
    # Follower 2's ack of the push from 10: its log now ends at 12, below our log start.
    leader.step(ReplicateAck(2, EPOCH, 12, in_push=True, log_end_offset=12), 40_002)
    assert [m for m in leader.ready().messages if isinstance(m, SendPushData)] == []
    # Its fetch from 12 (pull) is told the offset is out of range, with our log start.
    answer = fetch_answers(follower_fetch(leader, 2, 12, 40_003))
    assert [(a.error_code, a.log_start_offset) for a in answer] == [
        (OffsetOutOfRangeError.error_code, 14)
    ]
