"""A producer's batches behind one the leader refused (nothing appended, a retriable error)
share that error instead of OUT_OF_ORDER_SEQUENCE_NUMBER or an append out of order.

The rules of ``refused_batches`` alone, then on the leader's state machine: refused for the ISR
below min.insync.replicas, for not leading yet, and by the shell (a lapsed lease); the retry of
the refused batch and those behind it are appended in order; the record expires.
"""

from __future__ import annotations

from support.partition_steps import EPOCH, commit_alter, make_leader, results

from raylog.actors.replication.messages import BecomeLeader, ProduceRequest
from raylog.actors.replication.partition import PartitionReplica, ReplicaConfig
from raylog.actors.replication.producer_state import MAX_SEQUENCE
from raylog.actors.replication.refused_batches import (
    HOLD_MS,
    MAX_PRODUCERS,
    RefusedBatches,
)
from raylog.storage.errors import (
    CorruptRecordError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceError,
)

PID = 7
NOT_ENOUGH = NotEnoughReplicasError.error_code
NOT_LEADER = NotLeaderOrFollowerError.error_code

# --- the rules alone ---------------------------------------------------------------------------


def test_a_later_sequence_shares_the_refusal_and_the_refused_one_goes_on() -> None:
    refused = RefusedBatches()
    refused.record(PID, 0, 10, NOT_ENOUGH, now_ms=0)
    held = refused.held_back(PID, 0, 12, last_sequence=9, now_ms=1)
    assert held is not None and (held.base_sequence, held.error_code) == (10, NOT_ENOUGH)
    assert refused.held_back(PID, 0, 10, last_sequence=9, now_ms=1) is None  # the retry
    assert refused.held_back(PID, 0, 8, last_sequence=9, now_ms=1) is None  # a duplicate's
    assert refused.held_back(PID + 1, 0, 12, last_sequence=9, now_ms=1) is None


def test_the_record_ends_when_the_gap_fills_a_newer_epoch_comes_or_it_expires() -> None:
    refused = RefusedBatches()
    refused.record(PID, 0, 10, NOT_ENOUGH, now_ms=0)
    assert refused.held_back(PID, 0, 12, last_sequence=11, now_ms=1) is None  # 10 appended
    assert len(refused) == 0
    refused.record(PID, 0, 10, NOT_ENOUGH, now_ms=0)
    assert refused.held_back(PID, 1, 0, last_sequence=None, now_ms=1) is None  # bumped epoch
    assert len(refused) == 0
    refused.record(PID, 0, 10, NOT_ENOUGH, now_ms=0)
    assert refused.held_back(PID, 0, 12, last_sequence=9, now_ms=HOLD_MS - 1) is not None
    assert refused.held_back(PID, 0, 12, last_sequence=9, now_ms=HOLD_MS) is None
    assert len(refused) == 0


def test_the_lowest_refused_sequence_stays_and_only_retriable_refusals_count() -> None:
    refused = RefusedBatches()
    refused.record(PID, 0, 10, NOT_ENOUGH, now_ms=0)
    refused.record(PID, 0, 12, NOT_LEADER, now_ms=5)  # behind the first: the gap starts at 10
    held = refused.held_back(PID, 0, 11, last_sequence=9, now_ms=6)
    assert held is not None and (held.base_sequence, held.error_code) == (10, NOT_ENOUGH)
    other = RefusedBatches()
    other.record(PID, 0, 10, CorruptRecordError.error_code, now_ms=0)  # not retriable
    other.record(PID, -1, -1, NOT_ENOUGH, now_ms=0)  # no sequence: not idempotent
    assert len(other) == 0


def test_sequences_wrap_and_records_are_bounded() -> None:
    refused = RefusedBatches()
    refused.record(PID, 0, MAX_SEQUENCE, NOT_ENOUGH, now_ms=0)
    assert refused.held_back(PID, 0, 0, last_sequence=MAX_SEQUENCE - 1, now_ms=1) is not None
    assert refused.held_back(PID, 0, 1, last_sequence=0, now_ms=1) is None  # wrapped past it
    for pid in range(MAX_PRODUCERS + 5):
        refused.record(pid, 0, 1, NOT_ENOUGH, now_ms=2)
    assert len(refused) == MAX_PRODUCERS
    assert refused.held_back(0, 0, 2, last_sequence=0, now_ms=3) is None  # the oldest left
    assert refused.held_back(MAX_PRODUCERS + 4, 0, 2, last_sequence=0, now_ms=3) is not None


# --- on the leader's state machine -------------------------------------------------------------


def produce_seq(
    replica: PartitionReplica, request_id: int, seq: int, now_ms: int = 0
) -> tuple[int, int]:
    """(error code, appended batches) of an acks=1 batch of one record at ``seq``."""
    replica.step(ProduceRequest(request_id, 1, 30_000, 1, 10, b"x", PID, 0, seq), now_ms)
    ready = replica.ready()
    answer = results(ready).get(request_id)
    return (answer.error_code if answer else 0, len(ready.log_ops))


def test_a_batch_behind_one_refused_below_min_isr_is_refused_alike_not_out_of_order() -> None:
    leader = make_leader(isr=(0,), replicas=(0, 1), min_insync_replicas=1)
    assert produce_seq(leader, 1, seq=0) == (0, 1)
    leader.reconfigure(ReplicaConfig(min_insync_replicas=2))
    leader.step(ProduceRequest(2, -1, 30_000, 1, 10, b"x", PID, 0, 1), 1)  # acks=all: refused
    assert results(leader.ready())[2].error_code == NOT_ENOUGH
    leader.reconfigure(ReplicaConfig(min_insync_replicas=1))  # the ISR suffices again
    # Pipelined behind it: without the rule, 45 (and librdkafka bumps its epoch).
    assert produce_seq(leader, 3, seq=2, now_ms=2) == (NOT_ENOUGH, 0)
    assert produce_seq(leader, 4, seq=1, now_ms=3) == (0, 1)  # the retries, in order
    assert produce_seq(leader, 5, seq=2, now_ms=4) == (0, 1)
    assert leader.log_end_offset == 3


def test_a_producer_with_no_state_is_not_appended_out_of_order_behind_a_refusal() -> None:
    leader = make_leader(isr=(0,), replicas=(0, 1), min_insync_replicas=2)
    leader.step(ProduceRequest(1, -1, 30_000, 1, 10, b"x", PID, 0, 0), 0)
    assert results(leader.ready())[1].error_code == NOT_ENOUGH
    leader.reconfigure(ReplicaConfig(min_insync_replicas=1))
    # Any sequence is accepted from a producer without state (KIP-360): seq 1 would go first.
    assert produce_seq(leader, 2, seq=1, now_ms=1) == (NOT_ENOUGH, 0)
    assert produce_seq(leader, 3, seq=0, now_ms=2) == (0, 1)
    assert produce_seq(leader, 4, seq=1, now_ms=3) == (0, 1)


def test_a_batch_refused_before_leading_holds_back_the_next_one_after_the_election() -> None:
    replica = PartitionReplica(0)
    assert produce_seq(replica, 1, seq=5) == (NOT_LEADER, 0)
    replica.step(BecomeLeader(1, EPOCH, 0, (0,), (0,)), 1)
    ready = replica.ready()
    if ready.alter_partition:  # a fresh replica fences before it trusts its ISR
        commit_alter(replica, ready, 1)
    assert produce_seq(replica, 2, seq=6, now_ms=2) == (NOT_LEADER, 0)
    assert produce_seq(replica, 3, seq=5, now_ms=3) == (0, 1)
    assert produce_seq(replica, 4, seq=6, now_ms=4) == (0, 1)


def test_after_the_hold_the_gap_is_out_of_order_as_kafka_answers_it() -> None:
    leader = make_leader(isr=(0,), replicas=(0, 1), min_insync_replicas=1)
    assert produce_seq(leader, 1, seq=0) == (0, 1)
    leader.reconfigure(ReplicaConfig(min_insync_replicas=2))
    leader.step(ProduceRequest(2, -1, 30_000, 1, 10, b"x", PID, 0, 1), 1)
    leader.reconfigure(ReplicaConfig(min_insync_replicas=1))
    late = produce_seq(leader, 3, seq=2, now_ms=1 + HOLD_MS)
    assert late == (OutOfOrderSequenceError.error_code, 0)
