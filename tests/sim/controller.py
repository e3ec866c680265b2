"""The simulator's controller: raylog's own election rules and session protocol for one partition.

Every decision comes from the production pure module ``raylog.actors.control.election`` on a real
:class:`~raylog.actors.control.metadata.ClusterMetadata`: fencing a broker (session expiry, or Ray
confirming its death), registering a new incarnation of a broker, unfencing one that heartbeats
again, the preferred election, AlterPartition validation, and the command each replica is sent
(``election.role_command``). The broker sessions are production's too:
:class:`raylog.actors.control.sessions.BrokerSessions`, which ``ControllerActor`` keeps beside the
metadata. What this class adds is the call order of the Ray shell
(``raylog.actors.controller.ControllerActor``):

- a heartbeat of an incarnation the metadata does not know registers it (in production that is
  a registration call, refused while the old incarnation's session is live); the first
  heartbeat to a new controller starts a session there, with no lease until the broker has
  applied the version current then; a heartbeat of a fenced broker unfences it;
- a heartbeat answers ``lease_ok`` as ``BrokerSessions.heartbeat`` decides; the broker then
  extends its lease to ``t0 + session - guard`` on its own clock (``t0`` read before sending),
  which the simulation carries out;
- ``expire_sessions`` fences every broker ``BrokerSessions.due_for_fencing`` names;
- ``failover`` is a standby taking over: a new controller epoch written into the metadata (the
  stored copy, which is always the acted-on one: every change is written before it is sent)
  and ``BrokerSessions.take_over``.

Nothing here reads a clock or a random generator: the simulation passes time in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from raylog.actors.control import election
from raylog.actors.control import metadata as md_
from raylog.actors.control.metadata import ClusterMetadata, PartitionState, TopicPartition
from raylog.actors.control.sessions import BrokerSessions
from raylog.actors.replication.messages import (
    AlterPartitionRequest,
    AlterPartitionResponse,
    BecomeFollower,
    BecomeLeader,
    BecomeObserver,
)
from raylog.storage.errors import RaylogError

TOPIC = "sim"
TP = TopicPartition(TOPIC, 0)


def incarnation_id(node_id: int, broker_incarnation: int) -> str:
    return f"{node_id}.{broker_incarnation}"


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
    ) -> None:
        self.controller_epoch = 1
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
            self.sessions.start(b, reg.incarnation_id, 0, lease_from_epoch=md.metadata_epoch)

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

    def command_for(self, broker_id: int) -> BecomeLeader | BecomeFollower | BecomeObserver:
        return election.role_command(self.partition, broker_id, self.controller_epoch)

    def pushed_to(self) -> list[int]:
        """Brokers the controller pushes commands to: unfenced, the registered incarnation."""
        return [b for b, reg in self.md.brokers.items() if reg.state != "fenced"]

    # --- changes --------------------------------------------------------------------------------

    def _write(self, outcome: election.Outcome) -> bool:
        """Adopt a decision's metadata (the store's CAS always wins here: one controller acts
        at a time); whether it changed anything."""
        changed = outcome.metadata is not self.md
        self.md = outcome.metadata
        return changed

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
            self.sessions.start(broker_id, incarnation, now_ms, self.md.metadata_epoch)
        elif not self.sessions.tracks(broker_id, incarnation):  # first heartbeat to this one
            self.sessions.start(broker_id, incarnation, now_ms, self.md.metadata_epoch)
        if self.md.brokers[broker_id].state == "fenced":
            self._write(election.unfence_broker(self.md, broker_id, {TP: leos}))
            self.sessions.unfenced(broker_id, self.md.metadata_epoch)
        fenced = self.md.brokers[broker_id].state == "fenced"
        lease_ok = self.sessions.heartbeat(broker_id, applied_epoch, now_ms, fenced)
        offline = {TP} if log_failed else set()
        self._write(election.set_offline_replicas(self.md, broker_id, offline, {TP: leos}))
        return lease_ok

    def _fence(self, broker_id: int, leos: Mapping[int, int], expired: bool) -> Fenced:
        p = self.partition
        deposed = p.leader_epoch if p.leader == broker_id else -1
        self._write(election.fence_broker(self.md, broker_id, {TP: leos}))
        return Fenced(broker_id, deposed, expired)

    def expire_sessions(
        self, now_ms: int, leos: Mapping[int, int], confirm_ms: int
    ) -> list[Fenced]:
        """Fence every unfenced broker whose last accepted heartbeat is older than the session
        timeout at two checks ``confirm_ms`` apart (the slow path, as the controller runs it)."""
        due = self.sessions.due_for_fencing(self.md, now_ms, confirm_ms)
        return [self._fence(b, leos, expired=True) for b, _ in due]

    def broker_died(self, broker_id: int, incarnation: str, leos: Mapping[int, int]) -> bool:
        """Ray confirmed the death of this incarnation's process (the fast path): fence it at
        once if it is still the registered, unfenced one."""
        reg = self.md.brokers[broker_id]
        if reg.incarnation_id != incarnation or reg.state == "fenced":
            return False
        self._fence(broker_id, leos, expired=False)
        return True

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


__all__ = [
    "TOPIC",
    "TP",
    "Fenced",
    "SimController",
    "incarnation_id",
]
