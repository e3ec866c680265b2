"""The simulator's node: one broker and the shell of its replica, the Ready executor's port.

The replica is the production state machine driven by the production executor
(``raylog.actors.replication.executor.ReadyExecutor``): the order of a Ready's effects, the
early send of fresh batches, the group commit (one fsync in flight) and the flush policy are the
Ray actor's own. :class:`SimNode` is its port: the log is a :class:`SimDisk` (appends land in
the page cache, an fsync makes them durable when its completion event fires, a crash loses
what was not synced), messages go over the simulated network, AlterPartition proposals to the
controller stand-in (with the broker's incarnation, as a broker forwards them), completions to
the clients. A throttled fetch answer is a delayed send.

The node also holds its broker's state (incarnations, clock rate, write lease, the metadata and
controller epochs it applied, the pushes it applied, a failed log), the broker's side of
heartbeats (the lease a reply extends) and of the controller's pushes (a phase applied with the
replica's role command), and the checks that see appends as they happen: checker 4 (one writer
per leader epoch), checker 9's "a fenced broker never writes again in the epoch it was deposed
from", checker 11's "one leader at a time", and checker 8's "no log start above the high
watermark".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from raylog.actors.control.reconciler import LEADERS
from raylog.actors.replication.executor import ReadyExecutor
from raylog.actors.replication.messages import (
    AlterPartitionRequest,
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
    SendFetchData,
)

from .checkers import SimViolation, check_durable_on_isr
from .controller import ApplyAnswer, ApplyRequest
from .disk import SimDisk

if TYPE_CHECKING:
    from .cluster import Simulation

CONTROLLER = -100
CLIENT = -200
MIRROR_REQUEST_IDS = 1 << 40  # a link fetcher's requests (links.py) are numbered from here


@dataclass(frozen=True)
class Heartbeat:
    node_id: int
    broker_incarnation: int
    applied_epoch: int
    t0_ms: int  # the broker's clock, read before sending
    log_failure: int = 0  # raylog's heartbeats carry the broker's offline replicas (0: none)


@dataclass(frozen=True)
class HeartbeatReply:
    broker_incarnation: int
    lease_ok: bool
    t0_ms: int
    controller_epoch: int
    log_failure: int = 0  # the heartbeat's: the controller has recorded that failure


@dataclass(frozen=True)
class Forwarded:
    """An AlterPartition proposal as the broker forwards it: with its incarnation."""

    broker_incarnation: int
    request: AlterPartitionRequest


@dataclass(frozen=True)
class MirrorAnswer:
    """A mirror append's answer as the replica actor's ``mirror_append`` gives it: the result,
    and the leader's log end when it completed (the link fetcher's next position)."""

    result: ProduceResult
    log_end_offset: int


@dataclass(eq=False)
class SimNode:
    node_id: int
    disk: SimDisk
    sim: Simulation = field(repr=False)
    replica: PartitionReplica = field(init=False, repr=False)
    executor: ReadyExecutor = field(init=False, repr=False)
    alive: bool = True
    incarnation: int = 0  # of the replica's process (a crash or a replacement starts a new one)
    verified_batches: int = 0  # checker 2: batches below the HW already compared
    lso_inputs: tuple[int, ...] = ()  # checker 14: what its LSO was last checked at
    # The broker around the replica: its process incarnation (a crash and restart starts a
    # new one, a replacement of the replica does not), its session and clock.
    broker_incarnation: int = 0
    clock_rate: float = 1.0
    lease_until_ms: int = 0  # on this broker's clock
    applied_epoch: int = -1  # the newest metadata version whose command it applied
    controller_epoch: int = 0  # the newest controller epoch it heard from
    log_failed: bool = False  # its replica is offline (a failed log), the broker runs on
    log_failure: int = 0  # which failure of this node's log (heartbeats name it)
    log_failure_recorded: bool = False  # a heartbeat reporting it was answered
    # The (controller epoch, push id) whose phase 1 it applied last: a leader phase is carried
    # out only after its own push's phase 1.
    followers_applied: tuple[int, int] | None = None
    # Checker 12: every (controller epoch, push id) whose leader phase any incarnation of this
    # broker applied (so both phases: the leader phase waits for phase 1).
    applied_pushes: set[tuple[int, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.start_replica()

    def start_replica(self) -> None:
        """A new replica process over the disk as it is (recovered: the disk's own ends, epoch
        cache, HW checkpoint and producer batches), with a new executor."""
        scenario = self.sim.scenario
        disk = self.disk
        previous: ReadyExecutor | None = getattr(self, "executor", None)
        if previous is not None:
            self.sim.stats["sent_before_write"] += previous.sent_before_write
        self.replica = scenario.replica_class(
            self.node_id,
            self.sim.config,
            log_start_offset=disk.log_start,
            log_end_offset=disk.end_offset,
            epoch_cache=disk.epoch_cache(),
            high_watermark=disk.hw_checkpoint,
            producer_batches=[batch.meta for batch in disk.batches],
        )
        self.executor = scenario.executor_class(
            self.replica,
            self,
            flush_messages=scenario.flush_messages,
            flush_interval_ms=scenario.flush_ms,
        )
        if scenario.throttle_bytes_per_sec:
            self.executor.set_throttle(scenario.throttle_bytes_per_sec, self.sim.now_ms)
        self.verified_batches = 0
        self.lso_inputs = ()

    def flushed(self, end_offset: int, generation: int, now_ms: int) -> None:
        """The fsync started as ``start_flush(end_offset, generation)`` completed. One started
        before a truncation syncs nothing here (the disk drops it by generation), and the state
        machine ignores its report, but it still ends the executor's fsync in flight."""
        self.disk.sync(end_offset, generation)
        self.executor.flushed(end_offset, generation, now_ms)

    def heartbeat_reply(self, reply: HeartbeatReply, lease_ms: int) -> None:
        """The controller answered a heartbeat sent at ``reply.t0_ms`` on this broker's clock:
        it extends the write lease to ``lease_ms`` after that (session minus the guard)."""
        if reply.broker_incarnation != self.broker_incarnation:
            return
        self.controller_epoch = max(self.controller_epoch, reply.controller_epoch)
        if self.log_failed and reply.log_failure == self.log_failure:
            self.log_failure_recorded = True
        if reply.lease_ok:
            self.lease_until_ms = max(self.lease_until_ms, reply.t0_ms + lease_ms)

    def apply(self, request: ApplyRequest) -> Any:
        """One phase of a push, as raylog's broker applies it (``BrokerActor.apply``): refused
        from an older controller than one it heard from, and (Ray's order) a leader phase
        before its own phase 1; else answered, and the role command of the phase returned
        for the replica to step (None: none, or the replica is offline and refuses it)."""
        call, epoch = request.call, request.controller_epoch
        key = (epoch, call.push_id)
        leaders = call.phase == LEADERS
        applied = epoch >= self.controller_epoch and (not leaders or self.followers_applied == key)
        self.sim._send(self.node_id, CONTROLLER, ApplyAnswer(epoch, call, applied))
        if not applied:
            return None
        self.controller_epoch = epoch
        if leaders:
            self.applied_epoch = max(self.applied_epoch, call.metadata_epoch)
            self.applied_pushes.add(key)
        else:
            self.followers_applied = key
        commands = [s.command for s in call.specs if s.is_leader == leaders]
        return None if self.log_failed or not commands else commands[0]

    def refuse(self, message: Any, code: int, why: str) -> None:
        """Answer a client's write with an error; anything else (fetches, replication) goes
        unanswered, as if lost."""
        if isinstance(message, ProduceRequest):
            result: Any = ProduceResult(message.request_id, code, -1, why)
        elif isinstance(message, DeleteRecordsRequest):
            result = DeleteRecordsResult(message.request_id, code, -1, why)
        elif isinstance(message, MirrorAppendRequest):
            result = MirrorAnswer(ProduceResult(message.request_id, code, -1, why), -1)
        else:
            return
        self.sim._send(self.node_id, CLIENT, result, client=True)

    # --- the executor's port: the log -----------------------------------------------------------

    log_append_time = False  # the simulated batches carry no timestamps to stamp

    @property
    def log_end_offset(self) -> int:
        return self.disk.end_offset

    def truncate_to(self, offset: int) -> None:
        # The disk keeps the state machine's generation: an fsync from before this cut
        # makes nothing durable after it.
        self.disk.truncate(offset, self.replica.generation)
        self.verified_batches = min(self.verified_batches, len(self.disk.batches))

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.disk.start_at(offset, self.replica.generation)
        self.verified_batches = 0

    def advance_log_start(self, offset: int, high_watermark: int) -> None:
        if offset > high_watermark:
            raise SimViolation(f"replica {self.node_id} log start {offset} above its HW")
        self.sim.checkers.note_log_start(offset)
        gone = self.disk.advance_log_start(offset)
        self.verified_batches = max(0, self.verified_batches - gone)

    def append(self, op: AppendBatch) -> int:
        self.sim.stats["appends"] += 1
        if not op.replicated:  # a client's write: only a leader appends one
            self.sim.checkers.check_single_writer(op.batch.leader_epoch, self.node_id)
            self.sim._check_not_deposed(self, op.batch.leader_epoch)
            self.sim._check_one_leader(self, op.batch.leader_epoch)
        return self.disk.append(op.batch, op.data, op.generation)

    def stored_batch(self, op: AppendBatch) -> bytes:
        return op.data  # the simulated batches carry no header: stored as they come

    def read_batches(
        self, offset: int, max_bytes: int, upper_offset: int
    ) -> tuple[RecordBatch, ...]:
        return self.disk.read(offset, max_bytes, upper_offset)

    def checkpoint_high_watermark(self, high_watermark: int) -> None:
        self.disk.hw_checkpoint = high_watermark

    def start_flush(self, end_offset: int, generation: int) -> None:
        self.sim.stats["fsyncs"] += 1
        delay = self.sim.rng.randint(0, self.sim.scenario.fsync_max_ms)
        self.sim._schedule(delay, "fsync", self.node_id, self.incarnation, end_offset, generation)

    # --- the executor's port: messages and requests -----------------------------------------

    def shared_frame(self, message: Any) -> None:
        return None  # nothing is encoded: a message goes as it is

    def send(self, to: int, message: Any, frame: Any = None) -> None:
        self.sim._send(self.node_id, to, message)

    def send_later(self, delay_ms: int, to: int, message: Any) -> None:
        self.sim.stats["throttled"] += 1
        self.sim._schedule(delay_ms, "send_later", self.node_id, self.incarnation, to, message)

    def propose(self, request: AlterPartitionRequest) -> None:
        self.sim._send(self.node_id, CONTROLLER, Forwarded(self.broker_incarnation, request))

    def build_remote_state(self, offset: int) -> None:
        raise AssertionError("the simulator's topics are not tiered")

    def answer_consumer_fetch(self, out: SendFetchData) -> None:
        response = out.response
        if response.error_code == 0 and out.fetch_offset < out.upper_offset:
            batches = self.disk.read(out.fetch_offset, out.max_bytes, out.upper_offset)
            response = msgspec.structs.replace(response, batches=batches)
        if response.request_id in self.sim.read_committed_requests and response.error_code == 0:
            # As raylog's replica actor (replica_port._with_aborted): the aborted transactions
            # overlapping [fetch offset, the end of the batches read, or the LSO).
            self.sim.read_committed_requests.discard(response.request_id)
            end = response.batches[-1].meta.next_offset if response.batches else -1
            upper = end if end >= 0 else response.last_stable_offset
            aborted = self.replica.txns.aborted_between(out.fetch_offset, upper)
            response = msgspec.structs.replace(
                response,
                aborted_transactions=tuple((t.producer_id, t.first_offset) for t in aborted),
            )
        self.sim._send(self.node_id, CLIENT, response, client=True)

    def complete_produce(self, result: ProduceResult) -> None:
        written = self.sim.produce_requests.get(result.request_id)
        if (
            written is not None
            and written[0] == -1
            and result.error_code == 0
            and not self.sim.checkers.lossy
            and self.sim.scenario.flush_messages == 1
        ):
            check_durable_on_isr(
                self.node_id,
                self.replica.maximal_isr(),
                result.base_offset,
                result.base_offset + written[2],
                {n: node.disk for n, node in self.sim.nodes.items()},
            )
        answer: Any = result
        if result.request_id >= MIRROR_REQUEST_IDS:
            answer = MirrorAnswer(result, self.replica.log_end_offset)
        self.sim._send(self.node_id, CLIENT, answer, client=True)

    def complete_delete_records(self, result: DeleteRecordsResult) -> None:
        self.sim._send(self.node_id, CLIENT, result, client=True)

    def wake_long_polls(self) -> None:
        """Nothing waits: the simulated consumers are answered at once and ask again."""
