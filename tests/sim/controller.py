"""The simulator's controller: raylog's own election rules and session protocol for one partition.

Every decision comes from the production pure module ``raylog.actors.control.election`` on a real
:class:`~raylog.actors.control.metadata.ClusterMetadata`: fencing a broker (session expiry, or Ray
confirming its death), registering a new incarnation of a broker, unfencing one that heartbeats
again, the preferred election, AlterPartition validation, and the command each replica is sent
(``election.role_command``). The broker sessions are production's too:
:class:`raylog.actors.control.sessions.BrokerSessions`, which ``ControllerActor`` keeps beside the
metadata, and so are the pushes: :class:`raylog.actors.control.reconciler.Reconciler` decides
which broker is sent which specs in which phase, which leader phase waits for which step-down,
and when a broker is resynced; the simulation carries each :class:`Push` over its network and
answers it (applied, failed by timeout, or the broker's death confirmed). What this class adds
is the call order of the Ray shell (``raylog.actors.controller.ControllerActor``):

- a heartbeat of an incarnation the metadata does not know registers it (in production that is
  a registration call, refused while the old incarnation's session is live); the first
  heartbeat to a new controller starts a session there, with no lease until the broker has
  applied the version current then; a heartbeat of a fenced broker unfences it;
- a heartbeat answers ``lease_ok`` as ``BrokerSessions.heartbeat`` decides; the broker then
  extends its lease to ``t0 + session - guard`` on its own clock (``t0`` read before sending),
  which the simulation carries out;
- ``expire_sessions`` fences every broker ``BrokerSessions.due_for_fencing`` names;
- ``failover`` is a standby taking over: a new controller epoch written into the metadata (the
  stored copy, which is always the acted-on one: every change is written before it is sent),
  ``BrokerSessions.take_over`` and a new reconciler, which links each broker at its first
  heartbeat (in production that is when the new controller learns the broker's handle);
- a broker's link starts with its session (registration, or its first heartbeat to this
  controller); fencing or unfencing a broker makes the reconciler push it everything again, and
  Ray confirming a broker's death makes it give up the pushes in flight to it.

Checker 11's excuse is kept here too (:meth:`SimController.may_overlap`): when the reconciler
let a new leader start while an old one could not be stepped down.

Nothing here reads a clock or a random generator: the simulation passes time in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from raylog.actors.control import election
from raylog.actors.control import metadata as md_
from raylog.actors.control.metadata import ClusterMetadata, PartitionState, TopicPartition
from raylog.actors.control.reconciler import FOLLOWERS, LEADERS, Outcome, Push, Reconciler
from raylog.actors.control.sessions import BrokerSessions
from raylog.actors.replication.messages import AlterPartitionRequest, AlterPartitionResponse
from raylog.storage.errors import RaylogError

TOPIC = "sim"
TP = TopicPartition(TOPIC, 0)


def incarnation_id(node_id: int, broker_incarnation: int) -> str:
    return f"{node_id}.{broker_incarnation}"


@dataclass(frozen=True)
class ApplyRequest:
    """One phase of a push as a broker receives it (``BrokerActor.apply``'s arguments)."""

    controller_epoch: int
    call: Push


@dataclass(frozen=True)
class ApplyAnswer:
    """A broker's answer to an :class:`ApplyRequest` (``applied`` False: refused)."""

    controller_epoch: int
    call: Push
    applied: bool


@dataclass
class Fenced:
    """A broker the controller fenced: which, why, and the leader epoch it was deposed from
    (-1 when it did not lead)."""

    broker_id: int
    deposed_leader_epoch: int
    expired: bool  # session expiry (the broker may be alive), not a confirmed death


class SimController:
    def __init__(
        self,
        replica_ids: tuple[int, ...],
        observer_ids: tuple[int, ...],
        configs: Mapping[str, str],
        session_ms: int,
        resync_ms: int,
        round_ms: int,
        reconciler_class: type[Reconciler] = Reconciler,
    ) -> None:
        self.controller_epoch = 1
        self.resync_ms = resync_ms
        self.round_ms = round_ms  # the reconcile interval: a round at least this often
        self.reconciler_class = reconciler_class
        self.reconciler = reconciler_class(self.controller_epoch, resync_ms)
        self.wake = False  # a round is due at once (a change, a new link, a push applied)
        # Calls in flight: (controller epoch, push id, phase) -> the call.
        self.in_flight: dict[tuple[int, int, str], Push] = {}
        # Checker 11: per broker, the highest leader epoch a new leader was started in while
        # this broker could not be stepped down, and when its last push ended.
        self.unreached: dict[int, int] = {}
        self.push_ended_ms: dict[int, int] = {}
        md = ClusterMetadata(cluster_id="sim", controller_epoch=self.controller_epoch)
        for b in (*replica_ids, *observer_ids):
            md = md_.register_broker(md, b, incarnation_id(b, 0), None, "sim", b)
        md = md_.create_topic(
            md, TOPIC, "0" * 32, [[*replica_ids, *observer_ids]], configs, [list(observer_ids)]
        )
        md_.check(md)
        self.md = md
        self.sessions = BrokerSessions(session_ms)
        for b, reg in md.brokers.items():  # each registered: tracked with the version that did
            self._start_session(b, reg.incarnation_id, 0)

    # --- what the metadata says ---------------------------------------------------------------

    @property
    def partition(self) -> PartitionState:
        return md_.get_partition(self.md, TOPIC, 0)

    @property
    def leader(self) -> int:
        return self.partition.leader

    @property
    def metadata_epoch(self) -> int:
        return self.md.metadata_epoch

    def pushed_to(self) -> list[int]:
        """Brokers the controller pushes commands to: unfenced, the registered incarnation."""
        return [b for b, reg in self.md.brokers.items() if reg.state != "fenced"]

    def stale_requests(self) -> dict[int, list[ApplyRequest]]:
        """A push of the current specs to each broker this controller pushes to, both phases
        (push id -1): after a failover such requests of the deposed controller arrive late and
        must change nothing."""
        out = {}
        for b in self.pushed_to():
            specs = self.reconciler.desired(self.md, b)
            incarnation = self.md.brokers[b].incarnation_id
            out[b] = [
                ApplyRequest(self.controller_epoch, Push(-1, b, incarnation, phase, epoch, specs))
                for phase, epoch in (
                    (FOLLOWERS, self.metadata_epoch),
                    (LEADERS, self.metadata_epoch),
                )
            ]
        return out

    # --- changes --------------------------------------------------------------------------------

    def _write(self, outcome: election.Outcome) -> bool:
        """Adopt a decision's metadata (the store's CAS always wins here: one controller acts
        at a time); whether it changed anything."""
        changed = outcome.metadata is not self.md
        self.md = outcome.metadata
        self.wake = self.wake or changed
        return changed

    def _start_session(self, broker_id: int, incarnation: str, now_ms: int) -> None:
        """Track (and link) this incarnation; no lease before it applied the current version."""
        self.sessions.start(broker_id, incarnation, now_ms, self.md.metadata_epoch)
        self.reconciler.attach(broker_id, incarnation)
        self.wake = True

    def heartbeat(
        self,
        broker_id: int,
        incarnation: str,
        applied_epoch: int,
        now_ms: int,
        leos: Mapping[int, int],
        log_failed: bool = False,
    ) -> bool:
        """One heartbeat (or the first one of a new incarnation, which registers it); whether
        the broker may extend its write lease. Raises DuplicateBrokerRegistrationError for a new
        incarnation while the registered one's session is live."""
        reg = self.md.brokers[broker_id]
        if reg.incarnation_id != incarnation:
            self._write(
                election.register_broker(
                    self.md, broker_id, incarnation, None, "sim", broker_id,
                    old_session_live=self.sessions.live(broker_id, now_ms),
                    log_end_offsets={TP: leos},
                )
            )  # fmt: skip
            self._start_session(broker_id, incarnation, now_ms)
        elif not self.sessions.tracks(broker_id, incarnation):  # first heartbeat to this one
            self._start_session(broker_id, incarnation, now_ms)
        if self.md.brokers[broker_id].state == "fenced":
            self._write(election.unfence_broker(self.md, broker_id, {TP: leos}))
            self.sessions.unfenced(broker_id, self.md.metadata_epoch)
            self.reconciler.forget_pushed(broker_id, incarnation)
        fenced = self.md.brokers[broker_id].state == "fenced"
        lease_ok = self.sessions.heartbeat(broker_id, applied_epoch, now_ms, fenced)
        offline = {TP} if log_failed else set()
        self._write(election.set_offline_replicas(self.md, broker_id, offline, {TP: leos}))
        return lease_ok

    def _fence(self, broker_id: int, leos: Mapping[int, int], expired: bool) -> Fenced:
        p = self.partition
        deposed = p.leader_epoch if p.leader == broker_id else -1
        incarnation = self.md.brokers[broker_id].incarnation_id
        self._write(election.fence_broker(self.md, broker_id, {TP: leos}))
        self.reconciler.forget_pushed(broker_id, incarnation)
        return Fenced(broker_id, deposed, expired)

    def expire_sessions(
        self, now_ms: int, leos: Mapping[int, int], confirm_ms: int
    ) -> list[Fenced]:
        """Fence every unfenced broker whose last accepted heartbeat is older than the session
        timeout at two checks ``confirm_ms`` apart (the slow path, as the controller runs it)."""
        due = self.sessions.due_for_fencing(self.md, now_ms, confirm_ms)
        return [self._fence(b, leos, expired=True) for b, _ in due]

    def broker_died(
        self, broker_id: int, incarnation: str, leos: Mapping[int, int]
    ) -> tuple[bool, list[Push]]:
        """Ray confirmed the death of this incarnation's process (the fast path): fence it at
        once if it is still the registered, unfenced one. Whether it was fenced, and its calls
        in flight (they fail at once: the caller answers them ``Outcome.GONE``)."""
        self.reconciler.gone(broker_id, incarnation)
        dead = [
            call
            for call in self.in_flight.values()
            if call.broker_id == broker_id and call.incarnation_id == incarnation
        ]
        reg = self.md.brokers[broker_id]
        if reg.incarnation_id != incarnation or reg.state == "fenced":
            return False, dead
        self._fence(broker_id, leos, expired=False)
        return True, dead

    def preferred_election(self) -> bool:
        return self._write(election.elect_leaders(self.md, "preferred", [TP]))

    def alter_partition(
        self, broker_id: int, incarnation: str, request: AlterPartitionRequest
    ) -> AlterPartitionResponse:
        """A leader's ISR proposal, forwarded by its broker with the broker epoch of the
        incarnation that sent it (-1 for an incarnation the controller does not know)."""
        reg = self.md.brokers[broker_id]
        broker_epoch = reg.broker_epoch if reg.incarnation_id == incarnation else -1
        try:
            self._write(
                election.alter_partition(
                    self.md, broker_id, broker_epoch, TP,
                    request.leader_epoch, request.partition_epoch, request.new_isr,
                    request.fence,
                )
            )  # fmt: skip
            code = 0
        except RaylogError as exc:
            code = exc.error_code
        p = self.partition
        return AlterPartitionResponse(
            code, request.leader_epoch, p.partition_epoch, p.isr, request.request_id
        )

    def failover(self, now_ms: int) -> None:
        """A standby takes over: it reads the stored metadata, writes its own epoch into it,
        and counts every session from now; no broker gets a lease until it has applied the
        version current at its first heartbeat to this controller."""
        self.controller_epoch += 1
        self.md = md_.take_controllership(self.md, self.controller_epoch)
        self.sessions.take_over(now_ms)
        self.reconciler = self.reconciler_class(self.controller_epoch, self.resync_ms)
        self.in_flight = {}  # the deposed controller's answers go nowhere

    # --- pushes ---------------------------------------------------------------------------------

    def reconcile(self, now_ms: int) -> list[Push]:
        """A reconcile round: the calls to send now."""
        self.wake = False
        return self._sending(self.reconciler.round(self.md, now_ms))

    def answered(
        self, call: Push, outcome: Outcome, now_ms: int
    ) -> tuple[list[Push], list[tuple[int, tuple[int, int]]]]:
        """A call ended (a broker's answer, its timeout, or its broker's confirmed death): the
        calls it released, and the pushes it ended that the reconciler counts applied, as
        (broker id, (controller epoch, push id)). Calls no longer in flight change nothing."""
        if self.in_flight.pop(self._key(call), None) is None:
            return [], []
        progress = self.reconciler.answered(call, outcome, self.md)
        if call.phase == FOLLOWERS and outcome is not Outcome.APPLIED:
            self._unreached(call.broker_id, call)
        applied = []
        for ended in progress.ended:
            self.push_ended_ms[ended.broker_id] = now_ms
            if ended.applied:
                self.sessions.applied(ended.broker_id, ended.metadata_epoch)
                self.wake = True
                applied.append((ended.broker_id, (self.controller_epoch, ended.push_id)))
        return self._sending(progress.pushes), applied

    def request(self, call: Push) -> ApplyRequest:
        return ApplyRequest(self.controller_epoch, call)

    def _key(self, call: Push) -> tuple[int, int, str]:
        return (self.controller_epoch, call.push_id, call.phase)

    def _sending(self, calls: list[Push]) -> list[Push]:
        for call in calls:
            self.in_flight[self._key(call)] = call
            if call.phase == LEADERS:  # a new leader may start: who cannot be stepped down?
                for b, reg in self.md.brokers.items():
                    if reg.state != "fenced" and not self.reconciler.linked(b, reg.incarnation_id):
                        self._unreached(b, call)
        return calls

    def _unreached(self, broker_id: int, call: Push) -> None:
        """Checker 11: a leader of the epoch ``call`` names may start while ``broker_id`` has
        not been stepped down."""
        epoch = max((s.command.leader_epoch for s in call.specs), default=-1)
        self.unreached[broker_id] = max(self.unreached.get(broker_id, -1), epoch)

    def may_overlap(self, broker_id: int, leader_epoch: int, now_ms: int) -> bool:
        """Checker 11's excuse: may this broker still write in ``leader_epoch`` after another
        replica wrote in a later epoch? Only if it could not be stepped down when a later
        leader was started (its phase 1 failed, or it had no link to this controller), and
        the controller has not given up on it: it has no link yet, or a push to it is in
        flight, or its last one ended at most one reconcile round ago (the next round pushes
        it again)."""
        if self.unreached.get(broker_id, -1) <= leader_epoch:
            return False
        reg = self.md.brokers[broker_id]
        if not self.reconciler.linked(broker_id, reg.incarnation_id):
            return True
        if self.reconciler.in_flight(broker_id) is not None:
            return True
        return now_ms - self.push_ended_ms.get(broker_id, -(10**9)) <= self.round_ms


__all__ = [
    "TOPIC",
    "TP",
    "Fenced",
    "SimController",
    "incarnation_id",
]
