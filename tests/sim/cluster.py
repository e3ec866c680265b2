"""One seeded simulation of a partition: replicas, a controller stand-in, clients and faults.

Everything non-deterministic comes from one ``random.Random(seed)``: network delays, drops,
duplicates and partitions (network.py), fsync latency, crashes that lose unsynced writes or
tear them (disk.py), and the clients' choices. The replicas run the production state machine
(``raylog.actors.partition.PartitionReplica``) behind a tiny shell (``SimNode``) that carries out
each Ready exactly as the Ray shell must: log operations, fsync (later, as an event), HW
checkpoint, messages, produce results. Time is simulated; a run is a bounded number of steps,
each the processing of one event, and the checkers (checkers.py) run after every step.

The controller stand-in holds replicas, leader, leader epoch, partition epoch and ISR; commits
or refuses AlterPartition by epochs (answering a stale one with its current state); resends its
state to every replica periodically over the lossy network; takes a dead follower out of the ISR
(KRaft's fencing, never the last member); moves leadership on purpose now and then (preferred
election, while the old leader may still believe it leads); and after a leader's death is
confirmed (raylog's lease rule: death confirmed by Ray) elects from the live ISR members
(clean), or from any live replica when the scenario enables unclean election. A restarted
replica never inherits its previous incarnation's leadership (Kafka's broker epoch).

Idempotent producers (Kafka's clients with ``enable.idempotence``): a few producers with
producer ids send acks=all batches with sequences, one request in flight each (what a Kafka
connection's ordering gives), resend the same batch after an error, after a lost answer, and
sometimes early while the first try is still in flight (a client timeout), now and then bump
their epoch and restart at sequence 0 (librdkafka's local epoch bump). Their batches go to
whichever replica the controller stand-in last made leader, so retries cross leader changes.

DeleteRecords: a client now and then asks the leader to move the log start offset up (to an
offset below the committed end, sometimes above the high watermark, sometimes -1), so log starts
move on the leader and, through fetch answers and pushes, on the followers; consumers whose
position falls below it restart from the log start, and a replaced or lagging replica restarts
its log at the leader's log start, possibly inside a batch.

Faults: message drop, delay (hence reordering), duplication (not on client connections, which
are TCP), network partitions between any two of replicas and controller, crashes that lose the
unsynced tail or keep a prefix of it (torn write), restarts that recover from the durable disk.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

import msgspec

from raylog.actors.messages import (
    CONSUMER_REPLICA_ID,
    AlterPartitionRequest,
    AlterPartitionResponse,
    BecomeFollower,
    BecomeLeader,
    BecomeObserver,
    DeleteRecordsRequest,
    FetchRequest,
    FetchResponse,
    LocalAppendDurable,
    ProduceRequest,
)
from raylog.actors.partition import (
    AppendBatch,
    PartitionReplica,
    ProduceResult,
    ReplicaConfig,
    Role,
    SendFetchData,
    SendPushData,
    SendToReplica,
    TruncateTo,
)
from raylog.actors.replication_types import AdvanceLogStart, DeleteRecordsResult
from raylog.storage.errors import (
    FencedLeaderEpochError,
    InvalidUpdateVersionError,
    OffsetOutOfRangeError,
)

from .checkers import Checkers, SimViolation
from .disk import SimDisk
from .network import NetworkConfig, SimNetwork

CONTROLLER = -100
CLIENT = -200
TICK_MS = 20
CONTROLLER_SYNC_MS = 150
IDEMPOTENT_PRODUCERS = 3
IDEMPOTENT_RETRY_MS = 1_500  # resend when no answer came for this long (answer lost)
IDEMPOTENT_EARLY_RETRY = 0.1  # chance to resend while the first try is still in flight
IDEMPOTENT_EPOCH_BUMP = 0.03  # chance to bump the epoch before a new batch
MAX_EVENTS_QUEUED = 100_000  # bound: a run that floods itself is a bug in the sim


@dataclass
class Scenario:
    """What one seed runs; ``from_seed`` picks a random mix."""

    replicas: int = 3
    observers: int = 0
    min_insync_replicas: int = 2
    replication_mode: str = "pull"
    unclean_leader_election_enable: bool = False
    steps: int = 1000
    produce_interval_ms: int = 15
    consume_interval_ms: int = 30
    delete_records_interval_ms: int = 150
    fault_interval_ms: int = 120
    fsync_max_ms: int = 8
    network: NetworkConfig = field(default_factory=NetworkConfig)
    replica_class: type[PartitionReplica] = PartitionReplica

    @classmethod
    def from_seed(cls, seed: int, **overrides: Any) -> Scenario:
        rng = random.Random(seed ^ 0x5EED)
        scenario = cls(
            replicas=rng.choice((2, 3, 3, 3)),
            observers=rng.choice((0, 0, 1)),
            min_insync_replicas=rng.choice((1, 2, 2)),
            replication_mode=rng.choice(("pull", "push")),
            network=NetworkConfig(
                drop_probability=rng.choice((0.0, 0.02, 0.1)),
                duplicate_probability=rng.choice((0.0, 0.05)),
                delay_max_ms=rng.choice((3, 20, 60)),
            ),
            fault_interval_ms=rng.choice((60, 120, 300)),
        )
        for key, value in overrides.items():
            setattr(scenario, key, value)
        return scenario

    def replica_config(self) -> ReplicaConfig:
        return ReplicaConfig(
            replica_lag_time_max_ms=300,
            min_insync_replicas=self.min_insync_replicas,
            replication_mode=self.replication_mode,
            unclean_leader_election_enable=self.unclean_leader_election_enable,
            max_pending_acks_all=50,
            max_pending_acks_local=50,
            fetch_max_bytes=4096,
            fetch_max_wait_ms=100,
            fetch_timeout_ms=300,
            fetch_backoff_ms=20,
            push_idle_fetch_ms=100,
            alter_partition_timeout_ms=200,
        )


@dataclass
class SimNode:
    node_id: int
    disk: SimDisk
    replica: PartitionReplica
    alive: bool = True
    incarnation: int = 0
    verified_batches: int = 0  # checker 2: batches below the HW already compared


@dataclass
class IdempotentProducer:
    producer_id: int
    producer_epoch: int = 0
    next_sequence: int = 0
    batch: tuple[bytes, int, int] | None = None  # (data, base sequence, record count) unacked
    in_flight: int | None = None  # request id of the latest try
    sent_ms: int = 0
    tries: int = 0


@dataclass
class Consumer:
    position: int = 0
    in_flight: int | None = None  # request id
    sent_ms: int = 0
    restarted: bool = False  # moved up to a log start: the next batch may begin below it


class Simulation:
    def __init__(self, seed: int, scenario: Scenario | None = None, trace: bool = False) -> None:
        self.seed = seed
        self.trace = trace
        self.scenario = scenario or Scenario.from_seed(seed)
        self.rng = random.Random(seed)
        self.net = SimNetwork(self.rng, self.scenario.network)
        self.config = self.scenario.replica_config()
        self.now_ms = 0
        self.queue: list[tuple[int, int, str, tuple[Any, ...]]] = []
        self.sequence = 0
        self.checkers = Checkers()
        n = self.scenario.replicas
        self.replica_ids = tuple(range(n))
        self.observer_ids = tuple(range(n, n + self.scenario.observers))
        self.nodes: dict[int, SimNode] = {}
        for node_id in (*self.replica_ids, *self.observer_ids):
            disk = SimDisk()
            self.nodes[node_id] = SimNode(node_id, disk, self._new_replica(node_id, disk))
        # Controller state.
        self.leader = 0
        self.leader_epoch = 0
        self.partition_epoch = 0
        self.isr: tuple[int, ...] = self.replica_ids
        self.controller_epoch = 1
        # Clients.
        self.next_request_id = 1
        # request id -> (acks, data, record count)
        self.produce_requests: dict[int, tuple[int, bytes, int]] = {}
        self.acked_all: dict[bytes, int] = {}  # batch data -> base offset
        self.consumers = [Consumer(), Consumer()]
        self.producers = [IdempotentProducer(1000 + i) for i in range(IDEMPOTENT_PRODUCERS)]
        self.idempotent_requests: dict[int, int] = {}  # request id -> producer index
        self.consumer_requests: dict[int, int] = {}  # request id -> consumer index
        self.delete_requests: set[int] = set()
        # Checker 8: the highest low watermark a DeleteRecords was answered with.
        self.acked_low_watermark = 0
        self.batch_counter = 0
        self.stats: dict[str, int] = {
            "acked_all": 0,
            "acked_local": 0,
            "errors": 0,
            "crashes": 0,
            "replacements": 0,
            "elections": 0,
            "consumed": 0,
            "idempotent_acked": 0,
            "idempotent_acked_after_retry": 0,
            "deletes_acked": 0,
        }
        self.steps_done = 0

    # --- plumbing -----------------------------------------------------------------------------

    def _new_replica(self, node_id: int, disk: SimDisk) -> PartitionReplica:
        return self.scenario.replica_class(
            node_id,
            self.config,
            log_start_offset=disk.log_start,
            log_end_offset=disk.end_offset,
            epoch_cache=disk.epoch_cache(),
            high_watermark=disk.hw_checkpoint,
            producer_batches=[batch.meta for batch in disk.batches],
        )

    def _schedule(self, delay_ms: int, kind: str, *args: Any) -> None:
        if len(self.queue) >= MAX_EVENTS_QUEUED:
            raise SimViolation("event queue overflow")
        self.sequence += 1
        heapq.heappush(self.queue, (self.now_ms + delay_ms, self.sequence, kind, args))

    def _send(self, src: int, dst: int, message: Any, client: bool = False) -> None:
        incarnation = self.nodes[dst].incarnation if dst in self.nodes else 0
        # Client connections are TCP: lost with a partition or a crash, never duplicated.
        for delay in self.net.deliveries(src, dst, duplicate=not client):
            self._schedule(delay, "deliver", src, dst, incarnation, message)

    def _step_node(self, node: SimNode, message: Any) -> None:
        node.replica.step(message, self.now_ms)
        self._run_ready(node)

    def _run_ready(self, node: SimNode, writer: bool = False) -> None:
        ready = node.replica.ready()
        appended = False
        for op in ready.log_ops:
            if isinstance(op, TruncateTo) and op.full:
                node.disk.start_at(op.offset, op.generation)
                node.verified_batches = 0
            elif isinstance(op, TruncateTo):
                node.disk.truncate(op.offset, op.generation)
                node.verified_batches = min(node.verified_batches, len(node.disk.batches))
            elif isinstance(op, AdvanceLogStart):
                if op.offset > node.replica.high_watermark:
                    raise SimViolation(f"replica {node.node_id} log start {op.offset} above its HW")
                self.checkers.note_log_start(op.offset)
                gone = node.disk.advance_log_start(op.offset)
                node.verified_batches = max(0, node.verified_batches - gone)
            else:
                assert isinstance(op, AppendBatch)
                node.disk.append(op.batch, op.data, op.generation)
                appended = True
                if writer:
                    self.checkers.check_single_writer(op.batch.leader_epoch, node.node_id)
        if appended:
            delay = self.rng.randint(0, self.scenario.fsync_max_ms)
            end, generation = node.disk.end_offset, node.disk.generation
            self._schedule(delay, "fsync", node.node_id, node.incarnation, end, generation)
        if ready.checkpoint_high_watermark is not None:
            node.disk.hw_checkpoint = ready.checkpoint_high_watermark
        for out in ready.messages:
            if isinstance(out, SendToReplica):
                self._send(node.node_id, out.to, out.message)
            elif isinstance(out, SendPushData):
                batches = node.disk.read(out.base_offset, 1 << 30, out.end_offset)
                assert batches and batches[0].meta.base_offset == out.base_offset
                request = msgspec.structs.replace(out.request, batches=batches)
                self._send(node.node_id, out.to, request)
            else:
                assert isinstance(out, SendFetchData)
                self._send_fetch_data(node, out)
        for request in ready.alter_partition:
            self._send(node.node_id, CONTROLLER, request)
        for result in ready.produce_results:
            self._send(node.node_id, CLIENT, result, client=True)
        for deleted in ready.delete_records_results:
            self._send(node.node_id, CLIENT, deleted, client=True)

    def _send_fetch_data(self, node: SimNode, out: SendFetchData) -> None:
        response = out.response
        if response.error_code == 0 and out.fetch_offset < out.upper_offset:
            batches = node.disk.read(out.fetch_offset, out.max_bytes, out.upper_offset)
            response = msgspec.structs.replace(response, batches=batches)
        dst = CLIENT if out.to == CONSUMER_REPLICA_ID else out.to
        self._send(node.node_id, dst, response, client=dst == CLIENT)

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> Simulation:
        for node_id in self.nodes:
            self._schedule(self.rng.randint(0, TICK_MS), "tick", node_id, 0)
        self._schedule(0, "controller_sync")
        self._schedule(5, "produce")
        self._schedule(9, "idempotent_produce")
        self._schedule(7, "consume")
        self._schedule(11, "delete_records")
        self._schedule(self.scenario.fault_interval_ms, "fault")
        for _ in range(self.scenario.steps):
            if not self.queue:
                break
            at_ms, _seq, kind, args = heapq.heappop(self.queue)
            self.now_ms = max(self.now_ms, at_ms)
            if self.trace:
                print(f"{self.now_ms:>7} ms  {kind:<16} {args}")
            getattr(self, f"_on_{kind}")(*args)
            self.steps_done += 1
            self._check_after_step()
        return self

    def _on_tick(self, node_id: int, incarnation: int) -> None:
        node = self.nodes[node_id]
        if not node.alive or node.incarnation != incarnation:
            return
        node.replica.tick(self.now_ms)
        self._run_ready(node)
        self._schedule(TICK_MS, "tick", node_id, incarnation)

    def _on_fsync(self, node_id: int, incarnation: int, end: int, generation: int) -> None:
        node = self.nodes[node_id]
        if not node.alive or node.incarnation != incarnation:
            return
        if node.disk.sync(end, generation):
            self._step_node(node, LocalAppendDurable(end, generation))

    def _on_deliver(self, src: int, dst: int, incarnation: int, message: Any) -> None:
        if dst == CONTROLLER:
            self._controller_receive(message)
        elif dst == CLIENT:
            self._client_receive(src, message)
        else:
            node = self.nodes[dst]
            if not node.alive or node.incarnation != incarnation:
                return
            was_leader_epoch = (node.replica.role, node.replica.leader_epoch)
            node.replica.step(message, self.now_ms)
            self._run_ready(node, writer=isinstance(message, ProduceRequest))
            if node.replica.role is Role.LEADER and was_leader_epoch != (
                Role.LEADER,
                node.replica.leader_epoch,
            ):
                self._check_new_leader(node)

    # --- controller stand-in ------------------------------------------------------------------

    def _controller_receive(self, message: Any) -> None:
        assert isinstance(message, AlterPartitionRequest)
        if message.leader_epoch != self.leader_epoch or message.leader_id != self.leader:
            code = FencedLeaderEpochError.error_code
        elif message.partition_epoch != self.partition_epoch:
            code = InvalidUpdateVersionError.error_code
        else:
            assert self.leader in message.new_isr
            assert set(message.new_isr) <= set(self.replica_ids)
            self.isr = message.new_isr
            self.partition_epoch += 1
            code = 0
        response = AlterPartitionResponse(
            code, message.leader_epoch, self.partition_epoch, self.isr, message.request_id
        )
        self._send(CONTROLLER, message.leader_id, response)

    def _commands(self, node_id: int) -> Any:
        if node_id == self.leader:
            return BecomeLeader(
                self.controller_epoch,
                self.leader_epoch,
                self.partition_epoch,
                self.isr,
                self.replica_ids,
                self.observer_ids,
            )
        if node_id in self.observer_ids:
            return BecomeObserver(
                self.controller_epoch, self.leader, self.leader_epoch, self.partition_epoch
            )
        return BecomeFollower(
            self.controller_epoch, self.leader, self.leader_epoch, self.partition_epoch
        )

    def _on_controller_sync(self) -> None:
        # Metadata propagation: the controller resends its state; epochs make it idempotent.
        for node_id, node in self.nodes.items():
            if node.alive:
                self._send(CONTROLLER, node_id, self._commands(node_id))
        self._schedule(CONTROLLER_SYNC_MS, "controller_sync")

    def _elect(self) -> None:
        """Elect after the leader's death is confirmed (or when there is no leader)."""
        old = self.leader
        live_isr = [r for r in self.isr if self.nodes[r].alive]
        others = [r for r in live_isr if r != old]
        if others:
            new_leader = self.rng.choice(others)
            self.isr = tuple(r for r in self.isr if r != old)
        elif live_isr:
            new_leader = old  # restarted, and the only live ISR member: clean to elect
        elif self.scenario.unclean_leader_election_enable and (
            live := [r for r in self.replica_ids if self.nodes[r].alive]
        ):
            new_leader = self.rng.choice(live)
            self.isr = (new_leader,)
        else:
            new_leader = -1
        if new_leader == -1 and old == -1:
            return
        self.leader = new_leader
        self.leader_epoch += 1
        self.partition_epoch += 1
        self.stats["elections"] += 1
        self._on_controller_sync_once()

    def _on_controller_sync_once(self) -> None:
        for node_id, node in self.nodes.items():
            if node.alive:
                self._send(CONTROLLER, node_id, self._commands(node_id))

    def _on_node_dead(self, node_id: int, incarnation: int, leader_epoch: int) -> None:
        """Ray reported a replica's death (~20 ms after it happened)."""
        if node_id == self.leader:
            if leader_epoch == self.leader_epoch:
                self._elect()
            return
        node = self.nodes[node_id]
        if node.alive or node.incarnation != incarnation or node_id not in self.isr:
            return
        if len(self.isr) > 1:
            # KRaft fences a dead broker and takes it out of every ISR (never the last member):
            # an ISR change the leader learns from the controller, not from AlterPartition.
            self.isr = tuple(r for r in self.isr if r != node_id)
            self.partition_epoch += 1
            self._on_controller_sync_once()

    def _move_leader(self) -> None:
        """Controlled leader change (preferred election): to another live ISR member."""
        others = [r for r in self.isr if r != self.leader and self.nodes[r].alive]
        if self.leader < 0 or not others:
            return
        self.leader = self.rng.choice(others)
        self.leader_epoch += 1
        self.partition_epoch += 1
        self.stats["elections"] += 1
        self._on_controller_sync_once()

    # --- faults -------------------------------------------------------------------------------

    def _on_fault(self) -> None:
        choice = self.rng.random()
        alive = [n for n in self.nodes.values() if n.alive]
        dead = [n for n in self.nodes.values() if not n.alive]
        if choice < 0.3 and len(alive) > 1:
            self._crash(self.rng.choice(alive))
        elif choice < 0.6 and dead:
            self._restart(self.rng.choice(dead))
        elif choice < 0.7 and alive:
            self._replace(self.rng.choice(alive))
        elif choice < 0.8:
            a, b = self.rng.sample([*self.nodes, CONTROLLER], 2)
            self.net.cut.add(frozenset((a, b)))
        elif choice < 0.88:
            self._move_leader()
        else:
            self.net.cut.clear()
        self._schedule(self.rng.randint(1, 2 * self.scenario.fault_interval_ms), "fault")

    def _crash(self, node: SimNode) -> None:
        node.alive = False
        node.incarnation += 1
        node.disk.crash(self.rng, tear=self.rng.random() < 0.5)
        self.stats["crashes"] += 1
        # Ray reports the actor's death to the controller within ~20 ms.
        self._schedule(20, "node_dead", node.node_id, node.incarnation, self.leader_epoch)

    def _restart(self, node: SimNode) -> None:
        node.alive = True
        node.incarnation += 1
        node.replica = self._new_replica(node.node_id, node.disk)
        node.verified_batches = 0
        self._schedule(self.rng.randint(0, TICK_MS), "tick", node.node_id, node.incarnation)
        if self.leader in (-1, node.node_id):
            # No leader, and an ISR member is back: it may lead (clean: it is in the ISR). Or
            # the leader restarted before its death was reported: a new incarnation never
            # inherits its predecessor's epoch (Kafka's broker epoch), so elect anew.
            self._elect()
        self._send(CONTROLLER, node.node_id, self._commands(node.node_id))

    def _replace(self, node: SimNode) -> None:
        """The replica's process is replaced on a running machine (its broker re-created the
        actor: a topic config changed, or the actor died alone): the page cache keeps every
        write, recovery syncs it, and the controller, which elected no one, sends the same
        command again (a leader resumes the epoch it led)."""
        node.incarnation += 1
        node.disk.durable_count = len(node.disk.batches)
        node.disk.generation += 1
        node.replica = self._new_replica(node.node_id, node.disk)
        node.verified_batches = 0
        self.stats["replacements"] += 1
        self._schedule(self.rng.randint(0, TICK_MS), "tick", node.node_id, node.incarnation)
        self._send(CONTROLLER, node.node_id, self._commands(node.node_id))

    # --- clients ------------------------------------------------------------------------------

    def _on_produce(self) -> None:
        self._schedule(self.rng.randint(1, 2 * self.scenario.produce_interval_ms), "produce")
        if self.leader < 0:
            return
        self.batch_counter += 1
        data = f"s{self.seed}b{self.batch_counter}".encode()
        acks = self.rng.choice((0, 1, -1, -1))
        request_id = self.next_request_id
        self.next_request_id += 1
        count = self.rng.randint(1, 3)
        self.produce_requests[request_id] = (acks, data, count)
        request = ProduceRequest(request_id, acks, 1000, count, len(data), data)
        self._send(CLIENT, self.leader, request, client=True)

    def _on_idempotent_produce(self) -> None:
        self._schedule(
            self.rng.randint(1, 2 * self.scenario.produce_interval_ms), "idempotent_produce"
        )
        index = self.rng.randrange(len(self.producers))
        producer = self.producers[index]
        if self.leader < 0:
            return
        if producer.in_flight is not None:
            waited_ms = self.now_ms - producer.sent_ms
            if waited_ms < IDEMPOTENT_RETRY_MS and self.rng.random() >= IDEMPOTENT_EARLY_RETRY:
                return
        if producer.batch is None:
            if self.rng.random() < IDEMPOTENT_EPOCH_BUMP:
                producer.producer_epoch += 1
                producer.next_sequence = 0
            seq, count = producer.next_sequence, self.rng.randint(1, 3)
            data = f"s{self.seed}p{producer.producer_id}e{producer.producer_epoch}q{seq}n{count}"
            producer.batch = (data.encode(), seq, count)
            producer.tries = 0
        data, seq, count = producer.batch
        request_id = self.next_request_id
        self.next_request_id += 1
        producer.in_flight, producer.sent_ms = request_id, self.now_ms
        producer.tries += 1
        self.idempotent_requests[request_id] = index
        request = ProduceRequest(
            request_id,
            -1,
            1000,
            count,
            len(data),
            data,
            producer.producer_id,
            producer.producer_epoch,
            seq,
        )
        self._send(CLIENT, self.leader, request, client=True)

    def _idempotent_result(self, index: int, message: ProduceResult) -> None:
        producer = self.producers[index]
        batch = producer.batch
        current = producer.in_flight == message.request_id
        if message.error_code == 0:
            # Any try's success (also a stale one's) says where the batch is committed; a
            # duplicate must be answered with the original batch's offsets.
            if batch is None or not current:
                return  # an answer to an earlier try of an already acknowledged batch
            data, _seq, count = batch
            self.checkers.commit(
                message.base_offset, message.base_offset + count, data, "idempotent ack"
            )
            self.acked_all[data] = message.base_offset
            self.stats["idempotent_acked"] += 1
            if producer.tries > 1:
                self.stats["idempotent_acked_after_retry"] += 1
            producer.next_sequence += count
            producer.batch, producer.in_flight = None, None
            return
        self.stats["errors"] += 1
        key = f"error_{message.error_code}"
        self.stats[key] = self.stats.get(key, 0) + 1
        if message.error_code in (45, 47) and current:
            # One request in flight, in order, and retried unchanged: a correct leader never
            # finds it out of order or fenced.
            raise SimViolation(
                f"idempotent producer {producer.producer_id} got error {message.error_code} "
                f"for its current batch {batch}: {message.message}"
            )
        if current:
            producer.in_flight = None  # resend on its next turn

    def _on_delete_records(self) -> None:
        self._schedule(
            self.rng.randint(1, 2 * self.scenario.delete_records_interval_ms), "delete_records"
        )
        if self.leader < 0:
            return
        # Mostly at or below what is committed; now and then -1 (the HW) or above the HW.
        choice = self.rng.random()
        if choice < 0.2:
            offset = -1
        elif choice < 0.3:
            offset = self.checkers.committed_end + self.rng.randint(1, 5)
        else:
            offset = self.rng.randint(0, self.checkers.committed_end)
        request_id = self.next_request_id
        self.next_request_id += 1
        self.delete_requests.add(request_id)
        request = DeleteRecordsRequest(request_id, offset, 1000)
        self._send(CLIENT, self.leader, request, client=True)

    def _on_consume(self) -> None:
        self._schedule(self.rng.randint(1, 2 * self.scenario.consume_interval_ms), "consume")
        index = self.rng.randrange(len(self.consumers))
        consumer = self.consumers[index]
        if consumer.in_flight is not None and self.now_ms - consumer.sent_ms < 500:
            return
        # KIP-392: consumers read from the leader or from any replica.
        target = self.leader if self.rng.random() < 0.6 else self.rng.choice(list(self.nodes))
        if target < 0:
            return
        request_id = self.next_request_id
        self.next_request_id += 1
        consumer.in_flight, consumer.sent_ms = request_id, self.now_ms
        self.consumer_requests[request_id] = index
        epoch = self.leader_epoch if self.rng.random() < 0.5 else -1
        request = FetchRequest(CONSUMER_REPLICA_ID, request_id, epoch, consumer.position, -1, 2048)
        self._send(CLIENT, target, request, client=True)

    def _client_receive(self, src: int, message: Any) -> None:
        if isinstance(message, DeleteRecordsResult):
            if message.request_id not in self.delete_requests:
                return  # a duplicate answer
            self.delete_requests.discard(message.request_id)
            if message.error_code == 0:
                self.stats["deletes_acked"] += 1
                self.acked_low_watermark = max(self.acked_low_watermark, message.low_watermark)
            return
        if isinstance(message, ProduceResult) and message.request_id in self.idempotent_requests:
            self._idempotent_result(self.idempotent_requests.pop(message.request_id), message)
            return
        if isinstance(message, ProduceResult):
            acks, data, count = self.produce_requests.pop(message.request_id, (None, b"", 0))
            if acks is None:
                return  # a duplicate answer
            if message.error_code != 0:
                self.stats["errors"] += 1
                key = f"error_{message.error_code}"
                self.stats[key] = self.stats.get(key, 0) + 1
            elif acks == -1:
                self.stats["acked_all"] += 1
                self.acked_all[data] = message.base_offset
                self.checkers.commit(
                    message.base_offset, message.base_offset + count, data, "acks=all write lost"
                )
            else:
                self.stats["acked_local"] += 1
            return
        assert isinstance(message, FetchResponse)
        index = self.consumer_requests.pop(message.request_id, None)
        if index is None:
            return
        consumer = self.consumers[index]
        if consumer.in_flight == message.request_id:
            consumer.in_flight = None
        if (
            message.error_code == OffsetOutOfRangeError.error_code
            and consumer.position < message.log_start_offset
        ):
            # Records below the log start were deleted: start again from it (a consumer's
            # auto.offset.reset=earliest).
            consumer.position = message.log_start_offset
            consumer.restarted = True
            return
        if message.error_code != 0:
            return
        for batch in message.batches:
            meta = batch.meta
            # 5. never above the high watermark of the replica that served the read.
            if meta.next_offset > message.high_watermark:
                raise SimViolation(
                    f"consumer read {meta} from {src} above its HW {message.high_watermark}"
                )
            if meta.next_offset <= consumer.position:
                continue  # the first batch may start before the position
            # 6. skip / nonmonotonic (after a restart at a log start inside a batch, that
            # batch begins below the position).
            straddles = consumer.restarted and meta.base_offset < consumer.position
            consumer.restarted = False
            if meta.base_offset != consumer.position and not straddles:
                raise SimViolation(
                    f"consumer {index} at {consumer.position} got batch at {meta.base_offset}"
                )
            self.checkers.commit(meta.base_offset, meta.next_offset, batch.data, "consumer read")
            consumer.position = meta.next_offset
            self.stats["consumed"] += 1

    # --- checks -------------------------------------------------------------------------------

    def _check_new_leader(self, node: SimNode) -> None:
        """Checkers 1 and 3: a new leader holds every committed batch at or above its log
        start. Checker 8: after a clean election, its log start is at or above every low
        watermark a DeleteRecords was answered with (deleted records never come back)."""
        start = node.replica.log_start_offset
        if not self.scenario.unclean_leader_election_enable and start < self.acked_low_watermark:
            raise SimViolation(
                f"new leader {node.node_id} (epoch {node.replica.leader_epoch}) starts at "
                f"{start}, below the acknowledged low watermark {self.acked_low_watermark}"
            )
        for base_offset, data in self.checkers.committed.items():
            if self.checkers.committed_next[base_offset] <= start:
                continue  # deleted (DeleteRecords)
            held = node.disk.batch_at(base_offset)
            if held is None or held.data != data:
                raise SimViolation(
                    f"new leader {node.node_id} (epoch {node.replica.leader_epoch}) lacks "
                    f"committed batch {data!r} at {base_offset}: has {held}"
                )

    def _check_after_step(self) -> None:
        for node in self.nodes.values():
            if not node.alive:
                continue
            replica = node.replica
            hw = replica.high_watermark
            self.checkers.check_hw_monotonic(node.node_id, node.incarnation, hw)
            # 2. batches below this replica's HW are the committed ones.
            batches = node.disk.batches
            i = node.verified_batches
            while i < len(batches) and batches[i].meta.next_offset <= hw:
                meta = batches[i].meta
                self.checkers.commit(
                    meta.base_offset, meta.next_offset, batches[i].data, f"replica {node.node_id}"
                )
                i += 1
            node.verified_batches = i

    def final_check(self) -> None:
        """At the end: committed idempotent batches have no gaps and no duplicates (checker 7),
        and every acked acks=all write is on the live leader (clean runs)."""
        self.checkers.check_idempotent_sequences()
        if self.leader < 0:
            return
        node = self.nodes[self.leader]
        if not node.alive or node.replica.role is not Role.LEADER:
            return
        for data, base_offset in self.acked_all.items():
            if self.checkers.committed_next[base_offset] <= node.replica.log_start_offset:
                continue  # deleted (DeleteRecords)
            held = node.disk.batch_at(base_offset)
            if held is None or held.data != data:
                raise SimViolation(f"acked write {data!r} at {base_offset} missing on leader")


def run_seed(seed: int, scenario: Scenario | None = None, trace: bool = False) -> Simulation:
    """Run one seed and its final check; raises SimViolation/InvariantViolation with context."""
    sim = Simulation(seed, scenario, trace)
    try:
        sim.run()
        sim.final_check()
    except AssertionError as e:
        raise type(e)(
            f"seed {seed} failed at step {sim.steps_done} (t={sim.now_ms} ms): {e}\n"
            f"replay: RAYLOG_SIM_SEED={seed} .venv/bin/python -m pytest tests/sim -k replay\n"
            f"scenario: {sim.scenario}"
        ) from e
    return sim
