"""A follower of a tiered topic that starts over at its leader's log start takes the producer
and transaction state there from the remote tier (KIP-405's follower rebuild), on the pure
state machine: it asks the shell (``Ready.build_remote_state``) and neither fetches nor takes
pushes until the answer (``RemoteStateBuilt``) comes; a failed read is asked again after
``REMOTE_STATE_RETRY_MS``; a transaction open across that offset is then open here, so the
ABORT marker's aborted entry starts where the transaction began; no remote state leaves the
state empty; becoming leader ends the wait; a topic that is not tiered never asks.
"""

from __future__ import annotations

from raylog.actors.replication import messages as msgs
from raylog.actors.replication import producer_snapshot
from raylog.actors.replication.follower import REMOTE_STATE_RETRY_MS
from raylog.actors.replication.messages import BatchMeta, FetchRequest, RecordBatch
from raylog.actors.replication.partition import (
    AppendBatch,
    PartitionReplica,
    Ready,
    ReplicaConfig,
    SendToReplica,
    TruncateTo,
)
from raylog.actors.replication.producer_snapshot import ProducerSnapshot
from raylog.actors.replication.txn_state import CONTROL_ABORT
from raylog.storage.errors import OffsetOutOfRangeError

PID = 4000
EPOCH = 5
START = 10  # the leader's log start: below it, the remote tier only


def remote_snapshot() -> ProducerSnapshot:
    """The state the remote tier holds at START: PID's transaction open since offset 2."""
    leader = PartitionReplica(
        0,
        log_end_offset=START,
        high_watermark=START,
        producer_batches=[BatchMeta(2, 1, 10, 1, PID, 0, 0, True)],
    )
    data = leader.log.snapshot()
    assert data is not None
    return producer_snapshot.decode(data)


def fetches(ready: Ready) -> list[FetchRequest]:
    return [
        m.message
        for m in ready.messages
        if isinstance(m, SendToReplica) and isinstance(m.message, FetchRequest)
    ]


def started_over(config: ReplicaConfig) -> tuple[PartitionReplica, Ready]:
    """A new, empty follower whose first fetch (from 0) is below the leader's log start."""
    follower = PartitionReplica(1, config)
    follower.step(msgs.BecomeFollower(1, 0, EPOCH, 0), 0)
    [request] = fetches(follower.ready())
    out_of_range = msgs.FetchResponse(
        0, request.request_id, EPOCH, OffsetOutOfRangeError.error_code, 12, START, 12, None
    )
    follower.step(out_of_range, 1)
    return follower, follower.ready()


def test_a_tiered_follower_takes_the_remote_state_before_it_fetches() -> None:
    follower, ready = started_over(ReplicaConfig(remote_storage=True))
    assert ready.log_ops == [TruncateTo(START, 1, full=True)]
    assert ready.build_remote_state == START and fetches(ready) == []
    follower.tick(5_000)  # asked once: no second ask, no fetch while the shell reads
    assert follower.ready().is_empty()

    follower.step(msgs.RemoteStateBuilt(START, remote_snapshot()), 5_001)
    [request] = fetches(follower.ready())
    assert request.fetch_offset == START
    assert follower.txns.has_open(PID) and follower.last_stable_offset == START
    marker = BatchMeta(START, 1, 70, EPOCH, PID, 0, -1, True, CONTROL_ABORT, 0)
    batches = (RecordBatch(marker, memoryview(b"m")),)
    answer = msgs.FetchResponse(0, request.request_id, EPOCH, 0, 11, START, 11, None, batches)
    follower.step(answer, 5_002)
    [append] = [op for op in follower.ready().log_ops if isinstance(op, AppendBatch)]
    assert append.aborted is not None and append.aborted.first_offset == 2  # not START
    assert not follower.txns.has_open(PID)


def test_a_failed_read_is_asked_again_and_no_remote_state_starts_empty() -> None:
    follower, _ = started_over(ReplicaConfig(remote_storage=True))
    follower.step(msgs.RemoteStateBuilt(START, None, "object store unreachable"), 100)
    assert follower.ready().is_empty()
    follower.tick(100 + REMOTE_STATE_RETRY_MS - 1)
    assert follower.ready().is_empty()
    follower.tick(100 + REMOTE_STATE_RETRY_MS)
    again = follower.ready()
    assert again.build_remote_state == START and fetches(again) == []
    follower.step(msgs.RemoteStateBuilt(START + 1, remote_snapshot()), 2_000)  # not the one wanted
    assert follower.ready().is_empty()
    follower.step(msgs.RemoteStateBuilt(START, None), 2_001)  # the remote tier holds none there
    assert [r.fetch_offset for r in fetches(follower.ready())] == [START]
    assert follower.txns.open_transactions == 0


def test_no_push_is_taken_while_the_remote_state_is_read() -> None:
    follower, _ = started_over(ReplicaConfig(remote_storage=True, replication_mode="push"))
    batch = RecordBatch(BatchMeta(START, 1, 10, EPOCH), memoryview(b"a"))
    follower.step(msgs.ReplicateRequest(0, EPOCH, START, -1, (batch,)), 2)
    ready = follower.ready()
    assert not [op for op in ready.log_ops if isinstance(op, AppendBatch)]
    [ack] = [m.message for m in ready.messages if isinstance(m.message, msgs.ReplicateAck)]
    assert not ack.in_push and ack.durable_end_offset == START


def test_becoming_leader_ends_the_wait() -> None:
    follower, _ = started_over(ReplicaConfig(remote_storage=True))
    follower.step(msgs.BecomeLeader(1, EPOCH + 1, 1, (1,), (0, 1)), 3)
    follower.ready()
    follower.step(msgs.RemoteStateBuilt(START, remote_snapshot()), 4)  # too late: dropped
    assert follower.ready().is_empty() and follower.txns.open_transactions == 0


def test_a_topic_that_is_not_tiered_fetches_at_once() -> None:
    _, ready = started_over(ReplicaConfig())
    assert ready.build_remote_state is None
    assert [r.fetch_offset for r in fetches(ready)] == [START]
