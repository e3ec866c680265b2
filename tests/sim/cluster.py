"""One seeded simulation of a partition: replicas, a controller stand-in, clients and faults.

Everything non-deterministic comes from one ``random.Random(seed)``: network delays, drops,
duplicates and partitions (network.py), fsync latency, crashes that lose unsynced writes or
tear them (disk.py), and the clients' choices. The replicas run the production state machine
(``raylog.actors.replication.partition.PartitionReplica``) and the production executor of its
Readys (``raylog.actors.replication.executor.ReadyExecutor``: the effects' order, early sends,
group commit, flush policy, throttle), whose port is the node (node.py): a simulated disk whose
fsyncs complete as later events, and the simulated network. What a seed runs is its scenario
(scenario.py). Time is simulated; a run is a bounded number of steps, each the processing of one
event, and the checkers (checkers.py) run after every step.

The controller (controller.py) decides with raylog's own pure election module on real cluster
metadata: it fences a broker whose death Ray confirmed (~20 ms after a crash, the fast path) or
whose session expired (the slow path: no heartbeat accepted for SESSION_MS, e.g. behind a
network partition), elects cleanly from the ISR (uncleanly when the scenario enables it),
registers a restarted broker as a new incarnation, unfences one that heartbeats again, commits
or refuses AlterPartition, runs preferred elections now and then (while the old leader may
still believe it leads), and fails over to a standby (a new controller epoch) now and then. Its
pushes are production's reconciler's (raylog.actors.control.reconciler): every reconcile round
(CONTROLLER_TICK_MS, and at once after a change) it says which broker gets which specs in
which phase (demotions and followers first, a new leader only after the old one's step-down
ended) and resyncs every broker every RESYNC_MS; each phase travels the lossy network as a
request the broker applies with the replica's real role command and answers, and fails by
timeout (PUSH_TIMEOUT_MS) or at once when Ray confirms the broker's death. A broker carries out
a leader phase only after its push's phase 1 (Ray runs one caller's calls to an actor in
order); requests of a deposed controller still in flight arrive late and must be refused.

Brokers heartbeat the controller every HEARTBEAT_MS over the same network and extend their
replicas' write lease to ``t0 + SESSION_MS - guard`` on their own clock when a heartbeat is
accepted with ``lease_ok``; a replica refuses produce and DeleteRecords once the lease lapsed.
Each broker's clock runs at its own rate (``clock_rate_min`` .. ``clock_rate_max``), which the
guard must absorb. Clients send to the leader they last heard of, sometimes the previous one
(stale metadata), so a deposed leader is offered writes.

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
unsynced tail or keep a prefix of it (torn write), restarts that recover from the durable disk,
controller failovers. Some seeds run a relaxed flush policy (flush.messages > 1, acknowledged
before fsync), where crashes keep the page cache: that is all such a topic promises to survive
(see ``Scenario.flush_messages``). Some run a reassignment's throttle on every leader, which
holds back fetch answers to followers outside the ISR.

After the last step the run settles (checker 10, liveness): faults and writes stop, every
crashed broker restarts, no message is lost any more, and the partition must converge within
SETTLE_MS of simulated time. With ``lossy_checks`` (for runs with unclean elections, which lose
acknowledged data by design) the checkers of lost data are off and this one, the state
machine's invariants and the split-brain checkers are what such a run proves.

Transactions (``Scenario.transactions``; transactions.py): transactional producers, zombies of
fenced ones, a coordinator stand-in writing markers, and a read_committed consumer.
Links (``Scenario.simulation_class``: links.LinkSimulation): the partition mirrors a source's.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from dataclasses import dataclass
from typing import Any

import msgspec

from raylog.actors.control.reconciler import Outcome, Push
from raylog.actors.replication.messages import (
    CONSUMER_REPLICA_ID,
    DeleteRecordsRequest,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
)
from raylog.actors.replication.ready import DeleteRecordsResult, ProduceResult, Role
from raylog.actors.replication.txn_state import CONTROL_COMMIT
from raylog.storage.errors import (
    DuplicateBrokerRegistrationError,
    KafkaStorageError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
)

from .checkers import Checkers, SimViolation
from .controller import ApplyAnswer, ApplyRequest, Fenced, incarnation_id
from .disk import SimDisk
from .network import SimNetwork
from .node import CLIENT, CONTROLLER, Forwarded, Heartbeat, HeartbeatReply, SimNode
from .scenario import Scenario
from .seeds import replay_command, replay_request
from .transactions import AbortedFilter, TxnWorkload

TICK_MS = 20
CONTROLLER_TICK_MS = 50  # the reconcile interval: expired sessions fenced, then a push round
PUSH_TIMEOUT_MS = 200  # a push's call timeout, scaled
HEARTBEAT_MS = 50  # broker.heartbeat.interval.ms, scaled to the simulation's time
LOG_RETRY_MS = 300  # replica.offline.retry.backoff.ms, scaled
SESSION_MS = 250  # broker.session.timeout.ms, scaled
LEASE_GUARD_MS = SESSION_MS // 10  # as raylog's broker: 10 % of the session
STALE_LEADER_ROUTING = 0.2  # chance that a client sends to the previous leader
IDEMPOTENT_PRODUCERS = 3
IDEMPOTENT_RETRY_MS = 1_500  # resend when no answer came for this long (answer lost)
IDEMPOTENT_EARLY_RETRY = 0.1  # chance to resend while the first try is still in flight
IDEMPOTENT_EPOCH_BUMP = 0.03  # chance to bump the epoch before a new batch
SETTLE_MS = 20_000  # checker 10: time to converge after the faults stop
SETTLE_CHECK_MS = 100
MAX_EVENTS_QUEUED = 100_000  # bound: a run that floods itself is a bug in the sim


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
    read_committed: bool = False  # isolation.level=read_committed (transactions.py)
    floor: int = 0  # the highest log start it restarted at


class Simulation:
    def __init__(self, seed: int, scenario: Scenario | None = None, trace: bool = False) -> None:
        self.seed = seed
        self.trace = trace
        self.settling = False  # checker 10's phase: no faults, no writes
        self.scenario = scenario or Scenario.from_seed(seed)
        self.rng = random.Random(seed)
        self.net = SimNetwork(self.rng, self.scenario.network)
        self.config = self.scenario.replica_config()
        self.now_ms = 0
        self.queue: list[tuple[int, int, str, tuple[Any, ...]]] = []
        self.sequence = 0
        self.checkers = Checkers(lossy=self.scenario.lossy_checks)
        n = self.scenario.replicas
        self.replica_ids = tuple(range(n))
        self.observer_ids = tuple(range(n, n + self.scenario.observers))
        self.nodes: dict[int, SimNode] = {}
        for node_id in (*self.replica_ids, *self.observer_ids):
            node = SimNode(node_id, SimDisk(), self)
            node.clock_rate = self.rng.uniform(
                self.scenario.clock_rate_min, self.scenario.clock_rate_max
            )
            self.nodes[node_id] = node
        self.controller = self.scenario.controller_class(
            self.replica_ids,
            self.observer_ids,
            {
                "min.insync.replicas": str(self.scenario.min_insync_replicas),
                "unclean.leader.election.enable": str(
                    self.scenario.unclean_leader_election_enable
                ).lower(),
            },
            SESSION_MS,
            self.scenario.resync_ms,
            CONTROLLER_TICK_MS,
            self.scenario.reconciler_class,
        )
        self.previous_leader = -1  # where clients with stale metadata still send
        # Checker 9: per broker, the highest leader epoch it was deposed from by fencing.
        self.deposed: dict[int, int] = {}
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
            "fenced_expired": 0,
            "controller_failovers": 0,
            "lease_refused": 0,
            "log_failures": 0,
            "log_recoveries": 0,
            "offline_changes": 0,  # the controller's record of offline replicas changed
            # The executors (node.py): fsyncs, appends, sends before the local write, and
            # fetch answers the throttle held back.
            "fsyncs": 0,
            "appends": 0,
            "sent_before_write": 0,
            "throttled": 0,
        }
        self.steps_done = 0
        self.txn = TxnWorkload(self) if self.scenario.transactions else None
        if self.txn is not None:
            self.consumers.append(Consumer(read_committed=True))
        self.read_committed_requests: set[int] = set()  # the node attaches aborted lists

    # --- what the controller's metadata says --------------------------------------------------

    @property
    def leader(self) -> int:
        return self.controller.leader

    @property
    def leader_epoch(self) -> int:
        return self.controller.partition.leader_epoch

    def _clock(self, node: SimNode) -> int:
        """``node``'s broker clock (its own rate; the controller's is the simulation's)."""
        return int(self.now_ms * node.clock_rate)

    def _leos(self) -> dict[int, int]:
        """Log end offsets of the live replicas (what an unclean election compares)."""
        return {b: n.replica.log_end_offset for b, n in self.nodes.items() if n.alive}

    def _route(self) -> int:
        """The leader a client sends to: the current one, or the previous (stale metadata)."""
        if self.previous_leader >= 0 and self.rng.random() < STALE_LEADER_ROUTING:
            return self.previous_leader
        return self.leader

    # --- plumbing -----------------------------------------------------------------------------

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

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> Simulation:
        for node_id in self.nodes:
            self._schedule(self.rng.randint(0, TICK_MS), "tick", node_id, 0)
            self._schedule(self.rng.randint(0, HEARTBEAT_MS), "heartbeat", node_id, 0)
        self._schedule(0, "controller_tick")
        self._schedule(5, "produce")
        self._schedule(9, "idempotent_produce")
        self._schedule(7, "consume")
        self._schedule(11, "delete_records")
        self._schedule(self.scenario.fault_interval_ms, "fault")
        if self.txn is not None:
            self.txn.start()
        for _ in range(self.scenario.steps):
            if not self.queue:
                break
            self._step()
        if self.scenario.settle:
            self._settle()
        for node in self.nodes.values():
            self.stats["sent_before_write"] += node.executor.sent_before_write
        return self

    def _step(self) -> None:
        at_ms, _seq, kind, args = heapq.heappop(self.queue)
        self.now_ms = max(self.now_ms, at_ms)
        if self.trace:
            print(f"{self.now_ms:>7} ms  {kind:<16} {args}")
        getattr(self, f"_on_{kind}")(*args)
        self.steps_done += 1
        self._check_after_step()

    # --- liveness -------------------------------------------------------------------------------

    def _settle(self) -> None:
        """Checker 10 (liveness): once the faults stop (every broker running, no partition, no
        message lost; delays and duplicates go on) and the clients stop writing, the partition
        converges within SETTLE_MS: one leader, every replica alive and holding the leader's
        log from the highest log start up, the ISR all replicas, the HW at the log end."""
        self.settling = True
        if self.txn is not None:
            self.txn.settle()
        self.net.cut.clear()
        self.net.config = dataclasses.replace(self.net.config, drop_probability=0.0)
        for node in self.nodes.values():
            if not node.alive:
                self._restart(node)
        deadline = self.now_ms + SETTLE_MS
        next_check = self.now_ms
        while self.queue and self.now_ms < deadline:
            self._step()
            if self.now_ms >= next_check:
                if not self._unconverged():
                    return
                next_check = self.now_ms + SETTLE_CHECK_MS
        raise SimViolation(
            f"not converged {SETTLE_MS} ms after the faults stopped: {self._unconverged()}"
        )

    def _unconverged(self) -> str:
        """What keeps the partition from having converged ("" once it has)."""
        leader_id = self.controller.leader
        if leader_id < 0:
            return "no leader"
        leader = self.nodes[leader_id]
        if not leader.alive or leader.replica.role is not Role.LEADER:
            return f"leader {leader_id} is not leading"
        end = leader.disk.end_offset
        if leader.replica.high_watermark != end:
            return f"leader HW {leader.replica.high_watermark} below its log end {end}"
        if set(self.controller.partition.isr) != set(self.replica_ids):
            return f"ISR {self.controller.partition.isr}"
        if self.txn is not None and self.txn.unfinished(leader.replica):
            return self.txn.unfinished(leader.replica)
        start = max(n.disk.log_start for n in self.nodes.values())
        want = [
            (b.meta.base_offset, b.data) for b in leader.disk.batches if b.meta.next_offset > start
        ]
        for node in self.nodes.values():
            if not node.alive:
                return f"replica {node.node_id} is down"
            if node.disk.end_offset != end:
                return f"replica {node.node_id} ends at {node.disk.end_offset}, leader at {end}"
            held = [
                (b.meta.base_offset, b.data)
                for b in node.disk.batches
                if b.meta.next_offset > start
            ]
            if held != want:
                return f"replica {node.node_id}'s log differs from the leader's above {start}"
        return ""

    def _on_txn(self, kind: str, *args: Any) -> None:
        getattr(self.txn, f"on_{kind}")(*args)

    def _on_tick(self, node_id: int, incarnation: int) -> None:
        node = self.nodes[node_id]
        if not node.alive or node.incarnation != incarnation:
            return
        node.executor.tick(self.now_ms)
        self._schedule(TICK_MS, "tick", node_id, incarnation)

    def _on_fsync(self, node_id: int, incarnation: int, end: int, generation: int) -> None:
        node = self.nodes[node_id]
        if not node.alive or node.incarnation != incarnation:
            return
        node.flushed(end, generation, self.now_ms)

    def _on_send_later(self, node_id: int, incarnation: int, to: int, message: Any) -> None:
        """A send the node's throttle held back (the process that held it still runs)."""
        node = self.nodes[node_id]
        if node.alive and node.incarnation == incarnation:
            self._send(node_id, to, message)

    def _on_deliver(self, src: int, dst: int, incarnation: int, message: Any) -> None:
        if dst == CONTROLLER:
            self._controller_receive(message)
        elif dst == CLIENT:
            self._client_receive(src, message)
        else:
            node = self.nodes[dst]
            if not node.alive or node.incarnation != incarnation:
                return
            if isinstance(message, HeartbeatReply):
                node.heartbeat_reply(message, SESSION_MS - LEASE_GUARD_MS)
                return
            if isinstance(message, ApplyRequest):
                message = node.apply(message)
                if message is None:
                    return
            elif node.log_failed:  # as raylog's offline replica: KAFKA_STORAGE_ERROR
                node.refuse(message, KafkaStorageError.error_code, "offline")
                return
            elif isinstance(message, (ProduceRequest, DeleteRecordsRequest)) and (
                self._clock(node) >= node.lease_until_ms
            ):
                self._refuse_without_lease(node, message)
                return
            was_leader_epoch = (node.replica.role, node.replica.leader_epoch)
            node.executor.step(message, self.now_ms)
            if (
                node.replica.role is Role.LEADER
                and was_leader_epoch != (Role.LEADER, node.replica.leader_epoch)
                # A deposed controller's command, arriving late at a broker that never heard
                # of its successor, makes a leader of an epoch already superseded: data
                # committed in a later epoch need not be there (it takes no write without a
                # lease, which checker 9 covers, and serves nothing above its own HW).
                and node.replica.leader_epoch >= self.controller.partition.leader_epoch
            ):
                self._check_new_leader(node)

    # --- brokers: heartbeats and leases -------------------------------------------------------

    def _on_heartbeat(self, node_id: int, broker_incarnation: int) -> None:
        node = self.nodes[node_id]
        if not node.alive or node.broker_incarnation != broker_incarnation:
            return
        failure = node.log_failure if node.log_failed else 0
        beat = Heartbeat(
            node_id, broker_incarnation, node.applied_epoch, self._clock(node), failure
        )
        self._send(node_id, CONTROLLER, beat)
        self._schedule(HEARTBEAT_MS, "heartbeat", node_id, broker_incarnation)

    def _refuse_without_lease(self, node: SimNode, message: Any) -> None:
        """As raylog's replica actor: no write lease, no write (NOT_LEADER_OR_FOLLOWER)."""
        self.stats["lease_refused"] += 1
        node.refuse(message, NotLeaderOrFollowerError.error_code, "lease lapsed")

    # --- the controller -------------------------------------------------------------------------

    def _controller_receive(self, message: Any) -> None:
        before = (self.controller.metadata_epoch, self.leader)
        if isinstance(message, Heartbeat):
            node_id = message.node_id
            offline_before = self.controller.partition.offline_replicas
            try:
                lease_ok = self.controller.heartbeat(
                    node_id,
                    incarnation_id(node_id, message.broker_incarnation),
                    message.applied_epoch,
                    self.now_ms,
                    self._leos(),
                    message.log_failure != 0,
                )
            except DuplicateBrokerRegistrationError:
                return  # the broker tries again with its next heartbeat
            if self.controller.partition.offline_replicas != offline_before:
                self.stats["offline_changes"] += 1
            epoch = self.controller.controller_epoch
            reply = HeartbeatReply(
                message.broker_incarnation, lease_ok, message.t0_ms, epoch, message.log_failure
            )
            self._send(CONTROLLER, node_id, reply)
        elif isinstance(message, ApplyAnswer):
            if message.controller_epoch != self.controller.controller_epoch:
                return  # to a deposed controller's request
            self._answer(message.call, Outcome.APPLIED if message.applied else Outcome.FAILED)
        else:
            assert isinstance(message, Forwarded)
            request = message.request
            response = self.controller.alter_partition(
                request.leader_id,
                incarnation_id(request.leader_id, message.broker_incarnation),
                request,
            )
            self._send(CONTROLLER, request.leader_id, response)
        self._after_decision(*before)

    def _after_decision(self, metadata_epoch: int, leader: int) -> None:
        """After the controller may have changed the metadata: count an election, remember the
        previous leader for stale clients, and run a reconcile round if one is due at once (a
        change, a new link, a push applied: what wakes production's loop)."""
        if self.controller.metadata_epoch != metadata_epoch and self.leader != leader:
            self.stats["elections"] += 1
            if leader >= 0:
                self.previous_leader = leader
        if self.controller.wake:
            self._reconcile()

    def _reconcile(self) -> None:
        self._push(self.controller.reconcile(self.now_ms))

    def _push(self, calls: list[Push]) -> None:
        """Send each call over the network; it fails if no answer came in PUSH_TIMEOUT_MS."""
        for call in calls:
            self._send(CONTROLLER, call.broker_id, self.controller.request(call))
            epoch = self.controller.controller_epoch
            self._schedule(PUSH_TIMEOUT_MS, "push_timeout", epoch, call)

    def _answer(self, call: Push, outcome: Outcome) -> None:
        """A call's outcome to the controller; checker 12: a push the reconciler counts applied
        was applied by its broker, both phases (what ``wait_reconciled``, controlled shutdown
        and the lease rule rely on)."""
        calls, applied = self.controller.answered(call, outcome, self.now_ms)
        for broker_id, key in applied:
            if key not in self.nodes[broker_id].applied_pushes:
                raise SimViolation(
                    f"the controller counts push {key} applied by broker {broker_id}, which did "
                    f"not apply it"
                )
        self._push(calls)

    def _on_push_timeout(self, controller_epoch: int, call: Push) -> None:
        if controller_epoch != self.controller.controller_epoch:
            return  # a deposed controller's call
        before = (self.controller.metadata_epoch, self.leader)
        self._answer(call, Outcome.FAILED)
        self._after_decision(*before)

    def _on_controller_tick(self) -> None:
        """A reconcile round: fence brokers whose session expired (the slow path; checker 9
        at that moment), then push."""
        self._schedule(CONTROLLER_TICK_MS, "controller_tick")
        before = (self.controller.metadata_epoch, self.leader)
        # The simulated controller never pauses, so nothing waits for it to confirm an expiry
        # (confirm_ms=0).
        fenced = self.controller.expire_sessions(self.now_ms, self._leos(), confirm_ms=0)
        for f in fenced:
            self.stats["fenced_expired"] += 1
            self._note_fenced(f)
        self.controller.wake = True  # a round every reconcile interval
        self._after_decision(*before)

    def _note_fenced(self, fenced: Fenced) -> None:
        """Checker 9: a broker the controller fences holds no write lease any more (it stopped
        accepting writes before anyone else may be elected), and it never again writes in the
        leader epoch it was deposed from."""
        node = self.nodes[fenced.broker_id]
        if fenced.expired and node.alive and self._clock(node) < node.lease_until_ms:
            raise SimViolation(
                f"broker {node.node_id} fenced at {self.now_ms} ms (session expired) while its "
                f"write lease runs until {node.lease_until_ms} on its clock "
                f"({self._clock(node)} now, rate {node.clock_rate:.3f})"
            )
        if fenced.deposed_leader_epoch >= 0:
            previous = self.deposed.get(node.node_id, -1)
            self.deposed[node.node_id] = max(previous, fenced.deposed_leader_epoch)

    def _check_not_deposed(self, node: SimNode, leader_epoch: int) -> None:
        deposed = self.deposed.get(node.node_id, -1)
        if leader_epoch <= deposed:
            raise SimViolation(
                f"broker {node.node_id} accepted a write in leader epoch {leader_epoch} after "
                f"the controller fenced it out of epoch {deposed}"
            )

    def _check_one_leader(self, node: SimNode, leader_epoch: int) -> None:
        """Checker 11: no write in an epoch older than one another replica already wrote in,
        unless the controller could not step this one down (``SimController.may_overlap``)."""
        newer = self.checkers.newer_writer(leader_epoch, node.node_id)
        if newer is None or self.controller.may_overlap(node.node_id, leader_epoch, self.now_ms):
            return
        raise SimViolation(
            f"broker {node.node_id} accepted a write in leader epoch {leader_epoch} after "
            f"broker {newer[1]} had in epoch {newer[0]}, and it was not out of the controller's "
            f"reach"
        )

    def _on_broker_dead(self, node_id: int, broker_incarnation: int) -> None:
        """Ray reported a broker process's death (~20 ms after it happened): the fast path."""
        before = (self.controller.metadata_epoch, self.leader)
        p = self.controller.partition
        deposed = p.leader_epoch if p.leader == node_id else -1
        dead = incarnation_id(node_id, broker_incarnation)
        fenced, calls = self.controller.broker_died(node_id, dead, self._leos())
        if fenced:
            self._note_fenced(Fenced(node_id, deposed, expired=False))
        for call in calls:
            self._answer(call, Outcome.GONE)
        self._after_decision(*before)

    def _move_leader(self) -> None:
        """Preferred leader election (controlled: the old leader may still believe it leads)."""
        before = (self.controller.metadata_epoch, self.leader)
        self.controller.preferred_election()
        self._after_decision(*before)

    def _controller_failover(self) -> None:
        """The active controller is replaced by a standby (a new controller epoch). Requests
        the old one sent shortly before arrive late, and must change nothing."""
        stale = self.controller.stale_requests()
        self.controller.failover(self.now_ms)
        self.stats["controller_failovers"] += 1
        for node_id, requests in stale.items():
            node = self.nodes[node_id]
            if not node.alive:
                continue
            delay = self.rng.randint(1, 2 * PUSH_TIMEOUT_MS)
            for request in requests:  # phase 1, then phase 2
                self._schedule(delay, "deliver", CONTROLLER, node_id, node.incarnation, request)
        self._reconcile()

    # --- faults -------------------------------------------------------------------------------

    def _on_fault(self) -> None:
        if self.settling:
            return
        if self.scenario.log_failures and self.rng.random() < 0.3:
            healthy = [n for n in self.nodes.values() if n.alive and not n.log_failed]
            if healthy:
                self._fail_log(self.rng.choice(healthy))
            self._schedule(self.rng.randint(1, 2 * self.scenario.fault_interval_ms), "fault")
            return
        choice = self.rng.random()
        alive = [n for n in self.nodes.values() if n.alive]
        dead = [n for n in self.nodes.values() if not n.alive]
        if choice < 0.28 and len(alive) > 1:
            self._crash(self.rng.choice(alive))
        elif choice < 0.56 and dead:
            self._restart(self.rng.choice(dead))
        elif choice < 0.65 and alive:
            self._replace(self.rng.choice(alive))
        elif choice < 0.78:
            a, b = self.rng.sample([*self.nodes, CONTROLLER], 2)
            self.net.cut.add(frozenset((a, b)))
        elif choice < 0.85:
            self._move_leader()
        elif choice < 0.9:
            self._controller_failover()
        else:
            self.net.cut.clear()
        self._schedule(self.rng.randint(1, 2 * self.scenario.fault_interval_ms), "fault")

    def _fail_log(self, node: SimNode) -> None:
        """The replica's log fails: it stops (what it had not synced is lost, as after a
        failed fsync; the write that failed is cut back, no tear); the broker runs on."""
        node.log_failed = True
        node.log_failure += 1
        node.log_failure_recorded = False
        node.incarnation += 1
        node.disk.crash(self.rng, tear=False, keep_page_cache=self.scenario.crash_keeps_page_cache)
        self.stats["log_failures"] += 1
        self._schedule(LOG_RETRY_MS, "log_back", node.node_id, node.incarnation)

    def _on_log_back(self, node_id: int, incarnation: int) -> None:
        """The broker re-creates the offline replica from its log, once a heartbeat reporting
        it was answered (the controller recorded it: it leads no more). It sends no command:
        the controller's next push (or resync) tells the new replica what it is."""
        node = self.nodes[node_id]
        if not node.alive or node.incarnation != incarnation or not node.log_failed:
            return
        if not node.log_failure_recorded:  # as raylog's broker: not before the controller knows
            self._schedule(LOG_RETRY_MS, "log_back", node.node_id, node.incarnation)
            return
        node.log_failed = False
        node.incarnation += 1
        node.disk.generation += 1
        node.start_replica()
        self.stats["log_recoveries"] += 1
        self._schedule(self.rng.randint(0, TICK_MS), "tick", node.node_id, node.incarnation)

    def _crash(self, node: SimNode) -> None:
        node.alive = False
        node.log_failed = False
        node.incarnation += 1
        tear = self.rng.random() < 0.5
        node.disk.crash(self.rng, tear, keep_page_cache=self.scenario.crash_keeps_page_cache)
        self.stats["crashes"] += 1
        # Ray reports the broker's death to the controller within ~20 ms.
        self._schedule(20, "broker_dead", node.node_id, node.broker_incarnation)

    def _restart(self, node: SimNode) -> None:
        """A new broker process (and replica) on the same disk. It registers as a new
        incarnation with its first heartbeat, which never inherits its predecessor's
        leadership (Kafka's broker epoch); the controller then sends it its command."""
        node.alive = True
        node.incarnation += 1
        node.broker_incarnation += 1
        node.lease_until_ms, node.applied_epoch, node.controller_epoch = 0, -1, 0
        node.start_replica()
        self._schedule(self.rng.randint(0, TICK_MS), "tick", node.node_id, node.incarnation)
        self._schedule(0, "heartbeat", node.node_id, node.broker_incarnation)

    def _replace(self, node: SimNode) -> None:
        """The replica's process is replaced on a running machine (its broker re-created the
        actor: a topic config changed, or the actor died alone): the page cache keeps every
        write, recovery syncs it, and the controller, which elected no one, sends the same
        command again with its next push to the broker, its resync at the latest (a leader
        resumes the epoch it led). Not an offline replica (a failed log): as raylog's broker,
        only _on_log_back re-creates it, once the controller has recorded the failure; sooner,
        it would lead again an epoch whose unsynced writes its log lost, while its followers
        hold other records at those offsets."""
        if node.log_failed:
            return
        node.incarnation += 1
        node.disk.durable_count = len(node.disk.batches)
        node.disk.generation += 1
        node.start_replica()
        self.stats["replacements"] += 1
        self._schedule(self.rng.randint(0, TICK_MS), "tick", node.node_id, node.incarnation)

    # --- clients ------------------------------------------------------------------------------

    def _on_produce(self) -> None:
        if self.settling:
            return
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
        self._send(CLIENT, self._route(), request, client=True)

    def _on_idempotent_produce(self) -> None:
        if self.settling:
            return
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
        self._send(CLIENT, self._route(), request, client=True)

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
        if message.error_code in (45, 47) and current and not self.checkers.lossy:
            # One request in flight, in order, and retried unchanged: a correct leader never
            # finds it out of order or fenced.
            raise SimViolation(
                f"idempotent producer {producer.producer_id} got error {message.error_code} "
                f"for its current batch {batch}: {message.message}"
            )
        if current:
            producer.in_flight = None  # resend on its next turn

    def _on_delete_records(self) -> None:
        if self.settling:
            return
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
        if consumer.read_committed:  # its answers carry aborted transactions (node.py)
            self.read_committed_requests.add(request_id)
            request = msgspec.structs.replace(request, isolation_level=1)
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
        if isinstance(message, ProduceResult) and self.txn and self.txn.receive(message):
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
            consumer.floor = max(consumer.floor, consumer.position)
            return
        if message.error_code != 0:
            return
        # 5. never above the high watermark (read_committed: the LSO) of the replica that served
        # the read; 13 and 15: what a read_committed consumer delivers.
        limit = message.last_stable_offset if consumer.read_committed else message.high_watermark
        aborted = AbortedFilter(message.aborted_transactions)
        for batch in message.batches:
            meta = batch.meta
            if meta.next_offset > limit:
                raise SimViolation(f"consumer {index} read {meta} from {src} above {limit}")
            delivers = aborted.delivers(meta)
            if meta.next_offset <= consumer.position:
                continue  # the first batch may start before the position
            # 6. skip / nonmonotonic (after a restart at a log start inside a batch, that
            # batch begins below the position); a mirror's log may skip (checker 17).
            straddles = consumer.restarted and meta.base_offset < consumer.position
            consumer.restarted = False
            gap = self.checkers.legal_gap(consumer.position, meta.base_offset)
            skips = not (gap or self.checkers.lossy)
            if meta.base_offset != consumer.position and not straddles and skips:
                raise SimViolation(
                    f"consumer {index} at {consumer.position} got batch at {meta.base_offset}"
                )
            self.checkers.commit(meta.base_offset, meta.next_offset, batch.data, "consumer read")
            consumer.position = meta.next_offset
            self.stats["consumed"] += 1
            if consumer.read_committed and (delivers or meta.control_type == CONTROL_COMMIT):
                self.stats["txn_read_committed"] += 1
                self.checkers.check_committed_read(bytes(batch.data), consumer.floor)

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
            # Checkers 14 and 16, when the LSO may have moved.
            lso_inputs = (hw, node.disk.end_offset, node.disk.log_start, replica.generation)
            if self.txn is not None and node.lso_inputs != lso_inputs:
                node.lso_inputs = lso_inputs
                lso = replica.last_stable_offset
                self.checkers.check_lso(node.node_id, node.incarnation, lso, node.disk)

    def final_check(self) -> None:
        """At the end: committed idempotent batches have no gaps and no duplicates (checker 7),
        and every acked acks=all write is on the live leader (clean runs)."""
        self.checkers.check_idempotent_sequences()
        if self.leader < 0 or self.checkers.lossy:
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
    scenario = scenario or Scenario.from_seed(seed)
    sim = (scenario.simulation_class or Simulation)(seed, scenario, trace)
    try:
        sim.run()
        sim.final_check()
    except AssertionError as e:
        raise type(e)(
            f"seed {seed} failed at step {sim.steps_done} (t={sim.now_ms} ms): {e}\n"
            f"replay: {replay_command(seed, sim.scenario.overrides)}\n"
            f"scenario: {sim.scenario}"
        ) from e
    return sim


def replay_from_environment() -> Simulation:
    """Re-run the seed RAYLOG_SIM_SEED with the scenario overrides RAYLOG_SIM_OVERRIDES, as a
    failure's replay command asks (RAYLOG_SIM_TRACE prints every event), twice: raise if the
    two runs differ, so that what the replay shows is what failed."""
    seed, overrides, trace = replay_request()
    first = run_seed(seed, Scenario.from_seed(seed, **overrides), trace=trace)
    second = run_seed(seed, Scenario.from_seed(seed, **overrides))
    assert (first.stats, first.now_ms, first.checkers.committed) == (
        second.stats,
        second.now_ms,
        second.checkers.committed,
    ), f"seed {seed} ran differently twice: the simulation is not deterministic"
    return first
