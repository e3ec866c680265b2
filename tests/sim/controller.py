"""The simulator's controller: raylog's own election rules and session protocol for one partition.

Every decision comes from the production pure module ``raylog.actors.election`` on a real
:class:`~raylog.actors.metadata.ClusterMetadata`: fencing a broker (session expiry, or Ray
confirming its death), registering a new incarnation of a broker, unfencing one that heartbeats
again, the preferred election, AlterPartition validation, and the command each replica is sent
(``election.role_command``). What this class adds is the bookkeeping the Ray shell
(``raylog.actors.controller.ControllerActor``) keeps beside the metadata, the same way:

- a session per broker: the time of the last accepted heartbeat, the metadata version the
  broker last applied, and ``lease_from_epoch``, the version it must have applied before a
  heartbeat may extend its write lease (after it registered or was unfenced, and after a
  controller failover);
- a heartbeat answers ``lease_ok`` only when the broker is not fenced and has applied
  ``lease_from_epoch``; the broker then extends its lease to ``t0 + session - guard`` on its own
  clock (``t0`` read before sending), which the simulation carries out;
- ``expire_sessions`` fences every broker with no accepted heartbeat for ``session_ms``;
- ``failover`` is a standby taking over: a new controller epoch written into the metadata (the
  stored copy, which is always the acted-on one: every change is written before it is sent),
  every session counted again from the takeover, and no lease until a broker has applied a
  version of the new controller.

Nothing here reads a clock or a random generator: the simulation passes time in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from raylog.actors import election
from raylog.actors import metadata as md_
from raylog.actors.messages import (
    AlterPartitionRequest,
    AlterPartitionResponse,
    BecomeFollower,
    BecomeLeader,
    BecomeObserver,
)
from raylog.actors.metadata import ClusterMetadata, PartitionState, TopicPartition
from raylog.storage.errors import RaylogError

TOPIC = "sim"
TP = TopicPartition(TOPIC, 0)


def incarnation_id(node_id: int, broker_incarnation: int) -> str:
    return f"{node_id}.{broker_incarnation}"


@dataclass
class Session:
    """Of the registered incarnation of a broker (the metadata says which)."""

    last_heartbeat_ms: int
    applied_epoch: int = -1
    lease_from_epoch: int = 0


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
        self.session_ms = session_ms
        self.controller_epoch = 1
        md = ClusterMetadata(cluster_id="sim", controller_epoch=self.controller_epoch)
        for b in (*replica_ids, *observer_ids):
            md = md_.register_broker(md, b, incarnation_id(b, 0), None, "sim", b)
        md = md_.create_topic(
            md, TOPIC, "0" * 32, [[*replica_ids, *observer_ids]], configs, [list(observer_ids)]
        )
        md_.check(md)
        self.md = md
        self.sessions = {b: Session(0, lease_from_epoch=md.metadata_epoch) for b in md.brokers}

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
    ) -> bool:
        """One heartbeat (or the first one of a new incarnation, which registers it); whether
        the broker may extend its write lease. Raises DuplicateBrokerRegistrationError for a new
        incarnation while the registered one's session is live."""
        reg = self.md.brokers[broker_id]
        session = self.sessions[broker_id]
        if reg.incarnation_id != incarnation:
            live = (
                reg.state == "registered" and now_ms - session.last_heartbeat_ms <= self.session_ms
            )
            self._write(
                election.register_broker(
                    self.md, broker_id, incarnation, None, "sim", broker_id,
                    old_session_live=live, log_end_offsets={TP: leos},
                )
            )  # fmt: skip
            session = Session(now_ms, lease_from_epoch=self.md.metadata_epoch)
            self.sessions[broker_id] = session
        elif reg.state == "fenced":
            self._write(election.unfence_broker(self.md, broker_id, {TP: leos}))
            session.lease_from_epoch = self.md.metadata_epoch
        session.last_heartbeat_ms = now_ms
        session.applied_epoch = max(session.applied_epoch, applied_epoch)
        registered = self.md.brokers[broker_id].state != "fenced"
        return registered and session.applied_epoch >= session.lease_from_epoch

    def _fence(self, broker_id: int, leos: Mapping[int, int], expired: bool) -> Fenced:
        p = self.partition
        deposed = p.leader_epoch if p.leader == broker_id else -1
        self._write(election.fence_broker(self.md, broker_id, {TP: leos}))
        return Fenced(broker_id, deposed, expired)

    def expire_sessions(self, now_ms: int, leos: Mapping[int, int]) -> list[Fenced]:
        """Fence every registered broker whose last accepted heartbeat is older than the
        session timeout (the slow path)."""
        fenced = []
        for b, reg in sorted(self.md.brokers.items()):
            session = self.sessions[b]
            if reg.state == "registered" and now_ms - session.last_heartbeat_ms > self.session_ms:
                fenced.append(self._fence(b, leos, expired=True))
        return fenced

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
        and counts every session from now; no broker gets a lease until it has applied a
        version this controller wrote."""
        self.controller_epoch += 1
        self.md = md_.take_controllership(self.md, self.controller_epoch)
        self.sessions = {
            b: Session(now_ms, lease_from_epoch=self.md.metadata_epoch) for b in self.md.brokers
        }


__all__ = [
    "TOPIC",
    "TP",
    "Fenced",
    "SimController",
    "incarnation_id",
]
