"""Unit tests of mirror appends in the pure replication state machine (KIP-986 cluster links).

Three ``PartitionReplica``s (leader 0, followers 1 and 2) run through the production
``ReadyExecutor`` over in-memory logs, with their messages delivered in order and fsyncs
completed at once; no Ray, no disk. The claims: a mirror leader appends the source's batches
at their own offsets, gaps kept, and its followers hold the same batches; a refetched overlap
is skipped and a batch straddling the log end refused; an empty log starts over at a source
whose log starts higher, and the followers follow it there; the epoch, leadership and
mirror-link checks; clients' produce, transaction markers and DeleteRecords refused while the
link is active, and accepted after a disconnect (a new epoch) at the log end; acks=all answered
when the HW covers the batches, acks=1 when they are durable, a position query at once, a
refetch once what is there is acked; NOT_ENOUGH_REPLICAS below min.insync.replicas;
producer and transaction state follow mirrored batches (LSO, sequences); a new leader goes on
from its log end; push mode pushes contiguous appends and falls back to fetching after a gap.
After every run the logs agree below each replica's HW (the simulator's checker 2).
"""

from __future__ import annotations

from typing import Any

from raylog.actors.replication.executor import ReadyExecutor
from raylog.actors.replication.messages import (
    AlterPartitionRequest,
    AlterPartitionResponse,
    BatchMeta,
    BecomeFollower,
    BecomeLeader,
    DeleteRecordsRequest,
    MirrorAppendRequest,
    ProduceRequest,
    RecordBatch,
)
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.ready import (
    AppendBatch,
    DeleteRecordsResult,
    ProduceResult,
    ReplicaConfig,
    Role,
    SendFetchData,
)
from raylog.actors.replication.txn_state import CONTROL_COMMIT
from raylog.storage.errors import (
    FencedLeaderEpochError,
    InvalidRequestError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
)

LINK = "east"
EPOCH = 1
ROUNDS_MAX = 10_000


class MemoryPort:
    """One replica's port: its log in a list, its messages into the shared network queue."""

    def __init__(self, net: MirrorNet, replica_id: int) -> None:
        self.net = net
        self.replica_id = replica_id
        self.log_append_time = False
        self.batches: list[RecordBatch] = []
        self.flushes: list[tuple[int, int]] = []
        self.results: dict[int, ProduceResult] = {}
        self.deleted: dict[int, DeleteRecordsResult] = {}

    @property
    def log_end_offset(self) -> int:
        return self.net.replicas[self.replica_id].log_end_offset

    def truncate_to(self, offset: int) -> None:
        self.batches = [b for b in self.batches if b.meta.next_offset <= offset]

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.batches = []

    def advance_log_start(self, offset: int, high_watermark: int) -> None:
        self.batches = [b for b in self.batches if b.meta.next_offset > offset]

    def append(self, op: AppendBatch) -> int:
        self.batches.append(RecordBatch(op.batch, op.data))  # type: ignore[arg-type]
        return op.batch.base_offset

    def stored_batch(self, op: AppendBatch) -> bytes:
        return op.data

    def read_batches(
        self, offset: int, max_bytes: int, upper_offset: int
    ) -> tuple[RecordBatch, ...]:
        out: list[RecordBatch] = []
        for batch in self.batches:
            if batch.meta.next_offset <= offset or batch.meta.next_offset > upper_offset:
                continue
            if out and sum(b.meta.size_bytes for b in out) + batch.meta.size_bytes > max_bytes:
                break
            out.append(batch)
        return tuple(out)

    def checkpoint_high_watermark(self, high_watermark: int) -> None:
        pass

    def start_flush(self, end_offset: int, generation: int) -> None:
        self.flushes.append((end_offset, generation))

    def shared_frame(self, message: Any) -> None:
        return None

    def send(self, to: int, message: Any, frame: Any = None) -> None:
        self.net.queue.append((to, message))

    def send_later(self, delay_ms: int, to: int, message: Any) -> None:
        self.net.queue.append((to, message))

    def propose(self, request: AlterPartitionRequest) -> None:
        self.net.proposals.append((self.replica_id, request))

    def build_remote_state(self, offset: int) -> None:
        raise AssertionError("no topic here is tiered")

    def answer_consumer_fetch(self, out: SendFetchData) -> None:
        pass

    def complete_produce(self, result: ProduceResult) -> None:
        self.results[result.request_id] = result

    def complete_delete_records(self, result: DeleteRecordsResult) -> None:
        self.deleted[result.request_id] = result

    def wake_long_polls(self) -> None:
        pass


class MirrorNet:
    """Leader 0 of a mirror topic and followers 1 and 2; the controller commits every ISR
    proposal. ``run`` delivers messages and completes fsyncs until nothing moves."""

    def __init__(self, isr: tuple[int, ...] = (0, 1, 2), **config: Any) -> None:
        self.queue: list[tuple[int, Any]] = []
        self.proposals: list[tuple[int, AlterPartitionRequest]] = []
        self.now_ms = 0
        self.replicas = [PartitionReplica(i, ReplicaConfig(**config)) for i in range(3)]
        self.ports = [MemoryPort(self, i) for i in range(3)]
        self.executors = [
            ReadyExecutor(r, p) for r, p in zip(self.replicas, self.ports, strict=True)
        ]
        self.down: set[int] = set()  # replicas whose messages are lost
        self.next_id = 1
        self.lead(0, EPOCH, isr, LINK)

    def lead(self, leader: int, epoch: int, isr: tuple[int, ...], link: str) -> None:
        self.leader = leader
        self.executors[leader].step(BecomeLeader(1, epoch, epoch, isr, (0, 1, 2), (), link), 0)
        for i in range(3):
            if i != leader:
                self.executors[i].step(BecomeFollower(1, leader, epoch, epoch), 0)
        self.run()

    def run(self) -> None:
        for _ in range(ROUNDS_MAX):
            if self.queue:
                to, message = self.queue.pop(0)
                if to not in self.down:
                    self.executors[to].step(message, self.now_ms)
            elif any(p.flushes for p in self.ports):
                for executor, port in zip(self.executors, self.ports, strict=True):
                    while port.flushes:
                        executor.flushed(*port.flushes.pop(0), self.now_ms)
            elif self.proposals:
                sender, request = self.proposals.pop(0)
                answer = AlterPartitionResponse(
                    0,
                    request.leader_epoch,
                    request.partition_epoch + 1,
                    request.new_isr,
                    request.request_id,
                )
                self.executors[sender].step(answer, self.now_ms)
            else:
                self.check_logs_agree()
                return
        raise AssertionError("the network did not settle")

    def tick(self, ms: int) -> None:
        self.now_ms += ms
        for executor in self.executors:
            executor.tick(self.now_ms)
        self.run()

    def idle(self) -> None:
        """Let the followers' parked fetches be answered: they learn the leader's HW."""
        self.tick(self.replicas[0].config.fetch_max_wait_ms)

    def mirror(
        self,
        *batches: RecordBatch,
        epoch: int = EPOCH,
        acks: int = -1,
        to: int | None = None,
        settle: bool = True,
        source_log_start: int = -1,
    ) -> ProduceResult | None:
        """A mirror append to ``to`` (the leader); its result, None while it waits."""
        request_id = self.next_id
        self.next_id += 1
        target = self.leader if to is None else to
        request = MirrorAppendRequest(request_id, epoch, acks, 30_000, batches, source_log_start)
        self.executors[target].step(request, self.now_ms)
        if settle:
            self.run()
        return self.ports[target].results.get(request_id)

    def log(self, replica_id: int) -> list[tuple[BatchMeta, bytes]]:
        return [(b.meta, bytes(b.data)) for b in self.ports[replica_id].batches]

    def check_logs_agree(self) -> None:
        """Checker 2 of tests/sim: the batches below each replica's HW equal the leader's."""
        leader = dict((m.base_offset, d) for m, d in self.log(self.leader))
        start = self.replicas[self.leader].log_start_offset  # below it the leader deleted
        for i, replica in enumerate(self.replicas):
            for meta, data in self.log(i):
                if start < meta.next_offset <= replica.high_watermark:
                    assert leader.get(meta.base_offset) == data, (i, meta)


def batch(base: int, count: int = 1, epoch: int = EPOCH, **fields: Any) -> RecordBatch:
    """A source batch at ``base``, restamped with ``epoch`` as the shell does."""
    data = b"source %d+%d" % (base, count)
    return RecordBatch(BatchMeta(base, count, len(data), epoch, **fields), data)  # type: ignore[arg-type]


def offsets(net: MirrorNet, replica_id: int) -> list[tuple[int, int]]:
    return [(m.base_offset, m.next_offset) for m, _ in net.log(replica_id)]


# --- offsets ---------------------------------------------------------------------------------


def test_batches_go_at_their_source_offsets_with_gaps_and_followers_hold_the_same() -> None:
    net = MirrorNet()
    result = net.mirror(batch(0, 3), batch(3, 2), batch(10, 4), batch(20, 1))
    assert result is not None and result.error_code == 0 and result.appended == 4
    assert offsets(net, 0) == [(0, 3), (3, 5), (10, 14), (20, 21)]
    net.idle()
    for i in (1, 2):
        assert net.log(i) == net.log(0)
        assert net.replicas[i].high_watermark == 21
    assert net.replicas[0].high_watermark == net.replicas[0].log_end_offset == 21
    assert net.replicas[0].epoch_cache == [(EPOCH, 0)]


def test_a_refetched_overlap_is_skipped_and_the_rest_appended() -> None:
    net = MirrorNet()
    net.mirror(batch(0, 3))
    result = net.mirror(batch(0, 3), batch(3, 2))
    assert result is not None and result.error_code == 0 and result.appended == 1
    assert offsets(net, 0) == [(0, 3), (3, 5)]
    again = net.mirror(batch(0, 3), batch(3, 2))  # all of it there, and acknowledged
    assert again is not None and again.error_code == 0 and again.appended == 0
    assert offsets(net, 0) == [(0, 3), (3, 5)]


def test_a_batch_straddling_the_log_end_is_refused_and_nothing_appended() -> None:
    net = MirrorNet()
    net.mirror(batch(0, 3))
    result = net.mirror(batch(0, 3), batch(2, 4), batch(6, 1))
    assert result is not None and result.error_code == InvalidRequestError.error_code
    assert "[2, 6) straddles the log end 3" in result.message
    assert offsets(net, 0) == [(0, 3)]


def test_the_log_start_follows_the_source_never_above_the_hw() -> None:
    net = MirrorNet()
    # A source that starts higher: its first batches lie above a gap, then the log start
    # follows the source's once the HW covers it (on every replica).
    result = net.mirror(batch(100, 5), batch(105, 2), source_log_start=100)
    assert result is not None and result.error_code == 0 and result.appended == 2
    leader = net.replicas[0]
    assert offsets(net, 0) == [(100, 105), (105, 107)] and leader.high_watermark == 107
    net.mirror(batch(107, 1), source_log_start=100)
    assert leader.log_start_offset == 100
    net.check_logs_agree()
    # The source's log start moves up (retention): the mirror's follows, to its HW at most.
    net.mirror(batch(108, 2), source_log_start=106, acks=1, settle=False)
    assert leader.log_start_offset == 106
    net.run()
    for i in (1, 2):
        assert net.replicas[i].log_start_offset == 106
        assert net.log(i) == net.log(0)


def test_a_source_log_start_above_the_log_end_empties_the_log_first() -> None:
    net = MirrorNet()
    net.mirror(batch(0, 3, producer_id=7, is_transactional=True))  # a transaction left open
    leader = net.replicas[0]
    assert leader.last_stable_offset == 0
    # The source's retention passed it (its marker too): the mirror drops what it holds, on
    # every ISR member (the low watermark), its open transaction with it, and then continues
    # above the gap.
    first = net.mirror(batch(50, 2), source_log_start=50)
    assert first is not None and first.error_code == 0 and first.appended == 0
    assert all(r.log_start_offset == 3 and r.last_stable_offset == 3 for r in net.replicas)
    assert all(net.ports[i].batches == [] for i in range(3))
    result = net.mirror(batch(50, 2), source_log_start=50)
    assert result is not None and result.error_code == 0 and result.appended == 1
    assert offsets(net, 0) == [(50, 52)] and leader.last_stable_offset == 52
    net.check_logs_agree()


def test_nothing_is_taken_past_a_source_retention_gap_until_the_log_is_committed() -> None:
    net = MirrorNet()
    net.mirror(batch(0, 3), acks=1, settle=False)  # appended, not yet on the followers
    leader = net.replicas[0]
    assert leader.high_watermark < 3
    held = net.mirror(batch(50, 2), source_log_start=50, acks=1, settle=False)
    assert held is not None and held.error_code == 0 and held.appended == 0
    assert offsets(net, 0) == [(0, 3)]
    net.run()  # the followers take it: the HW reaches the log end
    net.mirror(batch(50, 2), source_log_start=50)  # the log empties on every replica
    taken = net.mirror(batch(50, 2), source_log_start=50)
    assert taken is not None and taken.appended == 1 and offsets(net, 0) == [(50, 52)]


# --- who may append ---------------------------------------------------------------------------


def test_only_the_mirror_leader_of_the_named_epoch_appends() -> None:
    net = MirrorNet()
    fenced = net.mirror(batch(0), epoch=EPOCH - 1)
    unknown = net.mirror(batch(0), epoch=EPOCH + 1)
    follower = net.mirror(batch(0), to=1)
    assert fenced is not None and fenced.error_code == FencedLeaderEpochError.error_code
    assert unknown is not None and unknown.error_code == UnknownLeaderEpochError.error_code
    assert follower is not None and follower.error_code == NotLeaderOrFollowerError.error_code
    assert net.replicas[0].log_end_offset == 0
    plain = MirrorNet()
    plain.lead(0, EPOCH + 1, (0, 1, 2), "")  # a normal topic
    refused = plain.mirror(batch(0), epoch=EPOCH + 1)
    assert refused is not None and refused.error_code == InvalidRequestError.error_code
    assert refused.message == "not a mirror topic"


def test_clients_writes_are_refused_while_mirrored_and_taken_after_a_disconnect() -> None:
    net = MirrorNet()
    net.mirror(batch(0, 3), batch(7, 2))
    leader = net.executors[0]
    leader.step(ProduceRequest(901, -1, 30_000, 1, 5, b"client"), 0)
    marker = ProduceRequest(902, -1, 30_000, 1, 5, b"mark", 7, 0, -1, True, CONTROL_COMMIT, 0)
    leader.step(marker, 0)
    leader.step(DeleteRecordsRequest(903, 2, 30_000), 0)
    port = net.ports[0]
    for request_id in (901, 902):
        assert port.results[request_id].error_code == InvalidRequestError.error_code
        assert port.results[request_id].message == (
            "this topic is a mirror of link east: it is read-only while the link is active"
        )
    assert port.deleted[903].error_code == InvalidRequestError.error_code
    assert offsets(net, 0) == [(0, 3), (7, 9)] and net.replicas[0].log_start_offset == 0
    # The controller disconnects the link: a new epoch without it. Clients write at the end.
    net.lead(0, EPOCH + 1, (0, 1, 2), "")
    stale = net.mirror(batch(9), epoch=EPOCH)
    assert stale is not None and stale.error_code == FencedLeaderEpochError.error_code
    leader.step(ProduceRequest(904, -1, 30_000, 1, 5, b"after"), 0)
    net.run()
    assert port.results[904].error_code == 0 and port.results[904].base_offset == 9
    net.idle()
    assert net.log(1) == net.log(0) and net.replicas[1].high_watermark == 10


# --- acks ------------------------------------------------------------------------------------


def test_acks_all_waits_for_the_high_watermark_and_acks_1_for_the_local_fsync() -> None:
    net = MirrorNet()
    net.down = {1}  # follower 1's fetches are lost: the HW cannot pass what it holds
    assert net.mirror(batch(0, 2), acks=-1) is None
    one = net.mirror(batch(2, 2), acks=1)
    assert one is not None and one.error_code == 0 and one.appended == 1
    net.down = set()
    net.tick(net.replicas[1].config.fetch_timeout_ms)  # follower 1 fetches again
    assert net.ports[0].results[1].error_code == 0 and net.ports[0].results[1].appended == 1


def test_a_position_query_is_answered_at_once_and_a_refetch_once_what_is_there_is_acked() -> None:
    net = MirrorNet()
    net.down = {1}
    net.mirror(batch(0, 2), acks=-1)
    query = net.mirror(acks=-1)
    assert query is not None and query.error_code == 0 and query.appended == 0
    assert net.replicas[0].log_end_offset == 2 and net.replicas[0].high_watermark == 0
    assert net.mirror(batch(0, 2), acks=-1) is None  # nothing new, and not acked yet
    net.down = set()
    net.tick(net.replicas[1].config.fetch_timeout_ms)
    assert [net.ports[0].results[i].error_code for i in (1, 3)] == [0, 0]
    assert net.ports[0].results[3].appended == 0


def test_acks_all_below_min_insync_replicas_is_refused_before_appending() -> None:
    net = MirrorNet(isr=(0,), min_insync_replicas=2)
    result = net.mirror(batch(0, 2), acks=-1)
    assert result is not None and result.error_code == NotEnoughReplicasError.error_code
    assert net.replicas[0].log_end_offset == 0


# --- producer and transaction state -----------------------------------------------------------


def test_producer_and_transaction_state_follow_mirrored_batches() -> None:
    net = MirrorNet()
    txn = {"producer_id": 7, "producer_epoch": 0, "is_transactional": True}
    net.mirror(batch(0, 2, producer_id=5, producer_epoch=0, base_sequence=0))
    net.mirror(batch(2, 3, base_sequence=0, **txn), batch(5, 1, producer_id=5, base_sequence=2))
    for replica in net.replicas:
        assert replica.producers.entry(5) is not None
        assert replica.producers.entry(5).last_sequence == 2  # type: ignore[union-attr]
        assert replica.txns.has_open(7)
        assert replica.last_stable_offset == 2  # the open transaction's first offset
    commit = batch(6, 1, control_type=CONTROL_COMMIT, coordinator_epoch=0, **txn)
    net.mirror(commit)
    net.idle()
    for replica in net.replicas:
        assert not replica.txns.has_open(7)
        assert replica.last_stable_offset == replica.high_watermark == 7


# --- leadership changes ---------------------------------------------------------------------


def test_a_new_leader_goes_on_from_its_log_end_with_its_own_epoch() -> None:
    net = MirrorNet()
    net.mirror(batch(0, 3), batch(5, 2))
    net.lead(1, EPOCH + 1, (0, 1, 2), LINK)  # the controller moves the leadership
    position = net.mirror(epoch=EPOCH + 1)
    assert position is not None and position.error_code == 0
    assert net.replicas[1].log_end_offset == 7  # the next source offset to fetch
    old = net.mirror(batch(7), epoch=EPOCH, to=0)
    assert old is not None and old.error_code == NotLeaderOrFollowerError.error_code
    result = net.mirror(batch(7, 2, epoch=EPOCH + 1), batch(9, 1, epoch=EPOCH + 1), epoch=2)
    assert result is not None and result.error_code == 0 and result.appended == 2
    assert offsets(net, 1) == [(0, 3), (5, 7), (7, 9), (9, 10)]
    assert net.replicas[1].epoch_cache == [(EPOCH, 0), (EPOCH + 1, 7)]
    net.idle()
    assert net.log(0) == net.log(2) == net.log(1)
    assert all(r.high_watermark == 10 for r in net.replicas)


# --- push mode -------------------------------------------------------------------------------


def test_push_mode_pushes_contiguous_appends_and_fetches_across_a_gap() -> None:
    net = MirrorNet(replication_mode="push")
    net.tick(1)  # the followers' first fetches find the leader's end: pushes from here
    net.mirror(batch(0, 2), batch(2, 1))
    assert all(net.log(i) == net.log(0) for i in (1, 2))
    assert net.replicas[1].push_active
    net.mirror(batch(10, 2))  # a gap: no batch starts at 3, where the next push would
    assert offsets(net, 1) == [(0, 2), (2, 3)]
    net.tick(net.replicas[1].config.push_idle_fetch_ms)  # push idle: they fetch across it
    assert all(net.log(i) == net.log(0) for i in (1, 2))
    net.mirror(batch(12, 1))  # caught up at the end: pushed again
    assert all(net.log(i) == net.log(0) for i in (1, 2))
    assert net.replicas[1].push_active
    # A gap while a push is in flight: its ack must not start a push where no batch starts.
    assert net.mirror(batch(13, 2), acks=1, settle=False) is None
    net.mirror(batch(20, 1), acks=1)
    net.tick(net.replicas[1].config.push_idle_fetch_ms)
    assert all(net.log(i) == net.log(0) for i in (1, 2))
    net.tick(net.replicas[1].config.push_idle_fetch_ms)
    assert all(r.high_watermark == 21 for r in net.replicas)
    assert net.replicas[0].role is Role.LEADER
