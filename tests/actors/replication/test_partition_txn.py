"""Unit tests of transactions in the pure replication state machine (``PartitionReplica``).

What they prove: the leader appends transactional batches under the idempotent rules and
refuses what Kafka refuses (INVALID_TXN_STATE 48, INVALID_PRODUCER_EPOCH 47 for markers and
zombies, TRANSACTION_COORDINATOR_FENCED 52), accepts a coordinator's batch without a sequence
(internal topics), and appends a marker for a producer with no open transaction; a
read_committed consumer's fetch reads up to the LSO, which stays at an open transaction's
first offset until the HW passes its marker; a follower that replicates the batches (markers
included) holds the leader's transaction state and, once elected, answers with the same LSO
and aborted list; a replica recovered from the log's batch headers holds it too; and the
idempotent producers' memory bound never forgets a producer with an open transaction.
"""

from __future__ import annotations

from support.partition_steps import EPOCH, make_durable, make_leader, results

from raylog.actors.replication.messages import (
    BatchMeta,
    BecomeFollower,
    BecomeLeader,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    RecordBatch,
)
from raylog.actors.replication.partition import (
    AppendBatch,
    PartitionReplica,
    Ready,
    SendFetchData,
)
from raylog.actors.replication.producer_state import ProducerStateTable
from raylog.actors.replication.txn_state import CONTROL_ABORT, CONTROL_COMMIT, AbortedTxn

PID = 4000


def txn_data(
    replica: PartitionReplica,
    request_id: int,
    seq: int,
    *,
    pid: int = PID,
    epoch: int = 0,
    transactional: bool = True,
    count: int = 1,
) -> Ready:
    request = ProduceRequest(request_id, 1, 30_000, count, 10, b"x", pid, epoch, seq, transactional)
    replica.step(request, 0)
    return replica.ready()


def txn_marker(
    replica: PartitionReplica,
    request_id: int,
    commit: bool,
    *,
    pid: int = PID,
    epoch: int = 0,
    coordinator_epoch: int = 0,
) -> Ready:
    control = CONTROL_COMMIT if commit else CONTROL_ABORT
    request = ProduceRequest(
        request_id, 1, 30_000, 1, 70, b"m", pid, epoch, -1, True, control, coordinator_epoch
    )
    replica.step(request, 0)
    return replica.ready()


def error_of(ready: Ready, request_id: int) -> int:
    return results(ready)[request_id].error_code


def appended(ready: Ready) -> list[BatchMeta]:
    return [op.batch for op in ready.log_ops if isinstance(op, AppendBatch)]


def committed_fetch(replica: PartitionReplica, offset: int = 0) -> SendFetchData:
    replica.step(FetchRequest(-1, 77, -1, offset, -1, 1 << 20, isolation_level=1), 0)
    (answer,) = [m for m in replica.ready().messages if isinstance(m, SendFetchData)]
    return answer


def single_leader() -> PartitionReplica:
    return make_leader(isr=(0,), replicas=(0,))


def test_a_non_transactional_batch_of_a_producer_in_a_transaction_is_refused() -> None:
    leader = single_leader()
    assert appended(txn_data(leader, 1, seq=0))
    refused = txn_data(leader, 2, seq=1, transactional=False)
    assert error_of(refused, 2) == 48 and not appended(refused)
    assert appended(txn_data(leader, 3, seq=1))  # the sequence goes on


def test_markers_are_fenced_by_producer_epoch_and_coordinator_epoch() -> None:
    leader = single_leader()
    txn_data(leader, 1, seq=0, epoch=2)
    assert error_of(txn_marker(leader, 2, True, epoch=1), 2) == 47
    assert appended(txn_marker(leader, 3, True, epoch=2, coordinator_epoch=5))
    assert error_of(txn_marker(leader, 4, False, epoch=2, coordinator_epoch=4), 4) == 52
    # A retried marker for a producer with no open transaction is appended, harmlessly.
    retry = txn_marker(leader, 5, True, epoch=2, coordinator_epoch=5)
    assert [b.control_type for b in appended(retry)] == [CONTROL_COMMIT]
    assert leader.txns.open_transactions == 0 and leader.txns.aborted == []


def test_an_abort_with_a_bumped_epoch_fences_the_old_epochs_data() -> None:
    leader = single_leader()
    txn_data(leader, 1, seq=0, epoch=2)
    txn_marker(leader, 2, False, epoch=3)  # the coordinator aborted on timeout (KIP-360)
    assert error_of(txn_data(leader, 3, seq=1, epoch=2), 3) == 47
    assert appended(txn_data(leader, 4, seq=0, epoch=3))


def test_a_coordinator_batch_without_a_sequence_skips_the_sequence_checks() -> None:
    leader = single_leader()
    for request_id in (1, 2, 3):  # the same "sequence" -1 each time: no duplicate, no gap
        ready = txn_data(leader, request_id, seq=-1, pid=9)
        assert [b.base_offset for b in appended(ready)] == [request_id - 1]
    assert leader.producers.entry(9) is None  # not an idempotent producer's window
    assert leader.txns.open_spans() == {9: 0}
    assert appended(txn_marker(leader, 4, True, pid=9))
    assert leader.txns.open_spans() == {}


def test_read_committed_reads_below_the_lso_until_the_hw_passes_the_marker() -> None:
    leader = single_leader()
    txn_data(leader, 1, seq=0, pid=-1, transactional=False)  # offset 0: plain data
    txn_data(leader, 2, seq=0, count=3)  # offsets 1..3: the transaction
    make_durable(leader)
    assert leader.high_watermark == 4 and leader.last_stable_offset == 1
    answer = committed_fetch(leader)
    assert answer.upper_offset == 1 and answer.response.last_stable_offset == 1
    abort = txn_marker(leader, 3, False)  # offset 4: ABORT
    # The shell indexes the aborted transaction (.txnindex) with the marker's append.
    (op,) = [op for op in abort.log_ops if isinstance(op, AppendBatch)]
    assert op.aborted == AbortedTxn(PID, 1, 4, 5)
    assert leader.last_stable_offset == 1  # the HW has not passed the marker yet
    make_durable(leader)
    assert leader.high_watermark == 5 and leader.last_stable_offset == 5
    assert committed_fetch(leader).upper_offset == 5
    assert leader.txns.aborted_between(0, 5) == [AbortedTxn(PID, 1, 4, 5)]
    # read_uncommitted reads to the HW, and is told the LSO too.
    leader.step(FetchRequest(-1, 78, -1, 0, -1, 1 << 20), 0)
    (plain,) = [m for m in leader.ready().messages if isinstance(m, SendFetchData)]
    assert plain.upper_offset == 5 and plain.response.last_stable_offset == 5


def _replicate(follower: PartitionReplica, batches: list[BatchMeta], hw: int) -> None:
    fetch = follower.ready().messages[0].message
    records = tuple(RecordBatch(b, b"x") for b in batches)
    end = batches[-1].next_offset
    follower.step(FetchResponse(0, fetch.request_id, EPOCH, 0, hw, 0, end, None, records), 1)
    follower.ready()


def test_a_follower_holds_the_leaders_transaction_state_and_serves_it_once_elected() -> None:
    leader = single_leader()
    log = [
        *appended(txn_data(leader, 1, seq=0, count=2)),  # 0..1, aborted by 2
        *appended(txn_marker(leader, 2, False)),
        *appended(txn_data(leader, 3, seq=2)),  # 3, committed by 5
        *appended(txn_data(leader, 4, seq=0, pid=PID + 1)),  # 4, open
        *appended(txn_marker(leader, 5, True)),
    ]
    make_durable(leader)
    assert [(b.base_offset, b.control_type) for b in log] == [
        (0, -1),
        (2, CONTROL_ABORT),
        (3, -1),
        (4, -1),
        (5, CONTROL_COMMIT),
    ]
    follower = PartitionReplica(1)
    follower.step(BecomeFollower(1, 0, EPOCH, 0), 0)
    _replicate(follower, log, hw=6)
    assert follower.txns.open_spans() == leader.txns.open_spans() == {PID + 1: 4}
    assert follower.txns.aborted == leader.txns.aborted == [AbortedTxn(PID, 0, 2, 3)]
    assert follower.last_stable_offset == leader.last_stable_offset == 4
    # Failover: the follower leads and answers read_committed as the leader did.
    follower.step(BecomeLeader(1, EPOCH + 1, 1, (1,), (0, 1)), 2)
    follower.ready()
    answer = committed_fetch(follower)
    assert answer.upper_offset == 4 and answer.response.last_stable_offset == 4
    assert error_of(txn_data(follower, 9, seq=1, pid=PID + 1, transactional=False), 9) == 48
    # A recovered replica rebuilds the same state from the log's headers.
    recovered = PartitionReplica(
        2, log_end_offset=6, epoch_cache=[(EPOCH, 0)], high_watermark=6, producer_batches=log
    )
    assert recovered.txns.open_spans() == {PID + 1: 4}
    assert recovered.txns.aborted == [AbortedTxn(PID, 0, 2, 3)]
    assert recovered.last_stable_offset == 4


def test_a_followers_truncation_into_a_transaction_reopens_it() -> None:
    follower = PartitionReplica(1)
    follower.step(BecomeFollower(1, 0, EPOCH, 0), 0)
    _replicate(
        follower,
        [
            BatchMeta(0, 2, 10, EPOCH, PID, 0, 0, True),
            BatchMeta(2, 1, 70, EPOCH, PID, 0, -1, True, CONTROL_ABORT, 0),
        ],
        hw=0,
    )
    assert follower.txns.aborted == [AbortedTxn(PID, 0, 2, 3)]
    follower.log.truncate(2, False, Ready())  # the new leader's log ends before the marker
    assert follower.txns.open_spans() == {PID: 0} and follower.txns.aborted == []
    assert follower.last_stable_offset == 0


def test_the_producer_bound_never_forgets_a_producer_with_an_open_transaction() -> None:
    table = ProducerStateTable(max_producers=2)
    table.pinned = lambda pid: pid == 1
    for pid in (1, 2, 3, 4):
        table.update(pid, 0, 0, pid * 10, 1)
    assert table.entry(1) is not None  # the least recent, but its transaction is open
    assert [pid for pid in (1, 2, 3, 4) if table.entry(pid)] == [1, 4]
