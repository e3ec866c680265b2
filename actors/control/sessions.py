"""The active controller's broker sessions: heartbeats, expiry, and when a write lease is due.

Pure: no Ray, no clock, no I/O; the caller passes the time in (the controller's monotonic
clock). :class:`raylog.actors.controller.ControllerActor` keeps one :class:`BrokerSessions`
beside the cluster metadata, and the seeded simulator (``tests/sim``) drives the same class,
so the rules below are tested under faults as they run in production. The module docstring of
``raylog.actors.controller`` proves why they leave no split brain; in short:

- A broker's session is of one incarnation (one process). It is live while the last accepted
  heartbeat is younger than ``session_ms``; a new incarnation is refused while the old one's
  session is live (``election.register_broker`` decides, given :meth:`BrokerSessions.live`).
- A heartbeat grants a write lease only when the broker is not fenced and has applied
  ``lease_from_epoch``: the metadata version that registered or unfenced it, or, after a
  controller failover, the version current at its first heartbeat to the new controller. A
  broker that was deposed while cut off thus learns so before it may write again.
- :meth:`BrokerSessions.expired` names every unfenced broker with no accepted heartbeat for
  ``session_ms``; the controller fences them. A session that has not heartbeat to this
  controller yet counts from its takeover (:meth:`BrokerSessions.take_over`).
- :meth:`BrokerSessions.due_for_fencing` is what the controller acts on: a session found
  expired stays suspected for ``confirm_ms`` and is fenced only if no heartbeat came in the
  meantime. The controller's own pauses (CPU starvation, a long GC) make every session look
  expired at the first check after the pause, while the heartbeats sent during the pause are
  still queued for it; Kafka's controller handles them first because they are ahead of the
  fencing check in its one event queue. Fencing later is always safe: a broker's leases end on
  their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from raylog.actors.control.metadata import ClusterMetadata

# A broker's write leases end this fraction of broker.session.timeout.ms before its session
# would (the safety argument is in raylog.actors.controller's module docstring).
SESSION_GUARD_FRACTION = 0.1


# --- what crosses Ray between the controller and brokers (here, not in the controller's module:
# a broker and its replicas load these without the controller's imports) ----------------------


class RegisterReply(msgspec.Struct, frozen=True):
    """``store_url`` / ``s3_endpoint``: the cluster's object store, where the broker's replicas
    of topics with remote.storage.enable copy their segments (tiered storage)."""

    broker_epoch: int
    controller_epoch: int
    store_url: str = ""
    s3_endpoint: str | None = None


class HeartbeatReply(msgspec.Struct, frozen=True):
    """``lease_ok``: the broker may extend its replicas' write leases from this heartbeat."""

    lease_ok: bool
    registered: bool  # False: this incarnation is unknown; register again
    state: str
    controller_epoch: int
    metadata_epoch: int


@dataclass
class Session:
    """One incarnation of a broker, as the active controller tracks it (never persisted)."""

    incarnation_id: str
    last_heartbeat_ms: int
    applied_epoch: int = -1  # the newest metadata version the broker is known to have applied
    lease_from_epoch: int = 0  # no write lease until it has applied this version


class BrokerSessions:
    """Every broker's session with the active controller; see the module docstring."""

    def __init__(self, session_ms: int, now_ms: int = 0) -> None:
        if session_ms <= 0:
            raise ValueError(f"session_ms must be positive, got {session_ms}")
        self.session_ms = session_ms
        self._sessions: dict[int, Session] = {}
        self._since_ms = now_ms  # sessions with no heartbeat to this controller count from here
        self._suspected: dict[int, int] = {}  # broker id -> when first found expired

    def take_over(self, now_ms: int) -> None:
        """This controller became active (or stepped down): forget every session; brokers that
        do not heartbeat from now on expire ``session_ms`` after ``now_ms``."""
        self._sessions = {}
        self._suspected = {}
        self._since_ms = now_ms

    def get(self, broker_id: int) -> Session | None:
        return self._sessions.get(broker_id)

    def tracks(self, broker_id: int, incarnation_id: str) -> bool:
        """Whether this incarnation of the broker has a session here."""
        session = self._sessions.get(broker_id)
        return session is not None and session.incarnation_id == incarnation_id

    def live(self, broker_id: int, now_ms: int) -> bool:
        """Whether the broker's tracked incarnation heartbeat within the session timeout."""
        session = self._sessions.get(broker_id)
        return session is not None and now_ms - session.last_heartbeat_ms < self.session_ms

    def start(
        self, broker_id: int, incarnation_id: str, now_ms: int, lease_from_epoch: int
    ) -> Session:
        """Track this incarnation from now (it registered, or heartbeat to this controller for
        the first time); it gets a lease once it has applied ``lease_from_epoch``."""
        session = Session(incarnation_id, now_ms, lease_from_epoch=lease_from_epoch)
        self._sessions[broker_id] = session
        return session

    def unfenced(self, broker_id: int, metadata_epoch: int) -> None:
        """The controller unfenced the broker in version ``metadata_epoch``: no lease before
        the broker has applied it (it may still believe in leaderships it lost)."""
        self._require(broker_id).lease_from_epoch = metadata_epoch

    def heartbeat(self, broker_id: int, applied_epoch: int, now_ms: int, fenced: bool) -> bool:
        """An accepted heartbeat of the tracked incarnation, which says it has applied
        ``applied_epoch``; whether the broker may extend its replicas' write leases."""
        session = self._require(broker_id)
        session.last_heartbeat_ms = max(session.last_heartbeat_ms, now_ms)
        session.applied_epoch = max(session.applied_epoch, applied_epoch)
        return not fenced and session.applied_epoch >= session.lease_from_epoch

    def applied(self, broker_id: int, metadata_epoch: int) -> None:
        """The broker answered a push of version ``metadata_epoch``: it has applied it."""
        session = self._sessions.get(broker_id)
        if session is not None:
            session.applied_epoch = max(session.applied_epoch, metadata_epoch)

    def all_applied(self, broker_ids: Iterable[int], metadata_epoch: int) -> bool:
        """Whether each of these brokers is tracked and has applied ``metadata_epoch``."""
        for broker_id in broker_ids:
            session = self._sessions.get(broker_id)
            if session is None or session.applied_epoch < metadata_epoch:
                return False
        return True

    def expired(self, md: ClusterMetadata, now_ms: int) -> list[tuple[int, int]]:
        """``(broker_id, ms since its last accepted heartbeat)`` of every broker the metadata
        does not have fenced whose registered incarnation has not heartbeat for longer than
        ``session_ms`` (counted from the takeover when it has not heartbeat to this
        controller), in broker order."""
        out = []
        for broker_id in sorted(md.brokers):
            reg = md.brokers[broker_id]
            if reg.state == "fenced":
                continue
            session = self._sessions.get(broker_id)
            if session is not None and session.incarnation_id == reg.incarnation_id:
                last = session.last_heartbeat_ms
            else:
                last = self._since_ms
            if now_ms - last > self.session_ms:
                out.append((broker_id, now_ms - last))
        return out

    def due_for_fencing(
        self, md: ClusterMetadata, now_ms: int, confirm_ms: int
    ) -> list[tuple[int, int]]:
        """The :meth:`expired` sessions that were already expired at a check at least
        ``confirm_ms`` earlier, with no heartbeat accepted since (a heartbeat clears the
        suspicion: the session is not expired at the next check)."""
        expired = self.expired(md, now_ms)
        suspected = {b: self._suspected.get(b, now_ms) for b, _ in expired}
        due = [(b, silent) for b, silent in expired if now_ms - suspected[b] >= confirm_ms]
        for b, _ in due:
            del suspected[b]
        self._suspected = suspected
        return due

    def _require(self, broker_id: int) -> Session:
        session = self._sessions.get(broker_id)
        if session is None:
            raise KeyError(f"broker {broker_id} has no session with this controller")
        return session


__all__ = ["BrokerSessions", "Session"]
