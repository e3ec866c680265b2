"""ControllerActor: the active/standby controller and its reconcile loop.

This module owns the Ray shell of raylog's controller: who is active (the lease), the one copy
of the cluster metadata it acts on (compare-and-swapped in the object store before anything is
done with it), broker sessions, and the loop that makes replicas match the metadata; its admin
requests are ``raylog.actors.controller_admin``. Every decision comes from the pure modules:
``metadata`` (transitions), ``election`` (leaders, ISR, fencing, AlterPartition), ``sessions``,
``reconciler`` (the pushes), ``placement`` (where replicas go) and ``config_keys`` (validation).

Active and standby. Every ControllerActor runs a :class:`LeaseKeeper` on ``controller/lease``.
The holder is active and its controller epoch is the lease epoch. On election it re-reads the
metadata, records its epoch in it (``take_controllership``, a CAS write) and only then acts. A
lost CAS means another controller wrote: it re-reads and demotes if that controller's epoch is
newer. Before every write it checks ``is_holder()``, which turns false at the lease deadline,
strictly before any standby can take over (see ``raylog.storage.lease``). A standby takes over
within ``lease_ms + poll_ms`` of the active one's death (at once after a graceful release).

Commands to replicas carry the controller epoch; brokers and replicas refuse older ones.

Sessions and no split brain. A broker heartbeats every ``broker.heartbeat.interval.ms``. Before
sending heartbeat ``h`` it reads its machine's monotonic clock, ``t0``; when the controller
accepts ``h`` the broker extends its replicas' write lease to ``t0 + session - guard`` on that
same clock (replicas run on their broker's node). A leader refuses produce once its lease
lapsed. The controller moves leadership away from broker ``b`` only:

1. after ``b``'s session expired by the controller's monotonic clock: no heartbeat accepted for
   ``session`` ms. The last accepted heartbeat was received at controller time ``R >= t0``
   (real time), so fencing happens at ``>= t0 + session`` while every lease ``b`` granted ends
   by ``t0 + session - guard``: ``guard`` (10 % of the session) absorbs rate differences between
   the two machines' clocks. A newly active controller counts every session from its own
   activation ``A``: the old controller accepted heartbeats only while ``is_holder()``, i.e.
   before its lease deadline, which precedes ``A``; so every lease granted ends before
   ``A + session``.
2. or when Ray confirmed the death of ``b``'s process (a never-returning ``wait_forever`` call on
   its session sentinel failed with RayActorError; see ``raylog.actors.broker``) AND each
   replica ``b`` leads is confirmed unable to write: its ``revoke_session_lease`` answered, or
   Ray reports it dead. Replicas are owned by their broker actor, so they die with it; the
   revocation covers the window before they do. Without both confirmations the controller
   falls back to (1).
3. or on controlled shutdown / preferred election: the old leader is told to step down (phase 1
   of a reconcile round) before the new one is told to lead (phase 2). If the old leader cannot
   be reached in phase 1 its acks=1 writes may briefly overlap (acks=all cannot complete there:
   its followers already follow the new epoch), as in Kafka.

A broker that was fenced and comes back (same incarnation, heartbeat) or registers anew gets
no lease until it has applied the metadata version that unfenced it (``lease_from_epoch``), so a
replica that still thinks it leads an old epoch is demoted before it can write again. The
session rules (expiry, ``lease_from_epoch``, takeover) are the pure
``raylog.actors.control.sessions``, which the seeded simulator drives too.

Reconcile. One loop, woken by every metadata change, a new broker link and a push applied, and
run at least every ``reconcile_interval_ms``: fence brokers whose session expired, then start
the pushes the :class:`~raylog.actors.control.reconciler.Reconciler` decides (each unfenced
broker's replicas with their role commands, in two phases: non-leader commands, then leader
commands once the old leaders stepped down; again when its desired set changed, it
re-registered, or ``resync_interval_ms`` passed), each phase a Ray call of its own whose outcome
goes back to the reconciler. Brokers create missing replica actors, delete strays (deleted
topics) and forward the commands.

Every Ray call goes through :func:`ray_call` (timeouts, dead peers) so failures are handled in one
place. Ray actor methods here are async: they all run on the actor's one event loop, so the
controller state is touched by one task at a time between awaits; metadata writes are serialised
by ``_write_lock``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import ray

from raylog.actors import logs
from raylog.actors.calls import (
    NAMESPACE,
    REPLICA_START_TIMEOUT_MS,
    call_self_after_init,
    monotonic_ms,
    ray_call,
    replica_actor_name,
)
from raylog.actors.control import capacity, config_keys, election, health
from raylog.actors.control import metadata as md_
from raylog.actors.control.listeners import Endpoint
from raylog.actors.control.metadata import ClusterMetadata, TopicPartition
from raylog.actors.control.metadata_store import MetadataStore, VersionedMetadata
from raylog.actors.control.reconciler import FOLLOWERS, Outcome, Push, Reconciler
from raylog.actors.control.sessions import BrokerSessions, HeartbeatReply, RegisterReply
from raylog.actors.controller_admin import AdminRequests
from raylog.actors.controller_capacity import CapacityRequests
from raylog.actors.controller_links import GroupSyncReport, LinkRequests, MirrorProgress
from raylog.actors.replication.messages import AlterPartitionRequest, AlterPartitionResponse
from raylog.storage import pki
from raylog.storage.errors import (
    BrokerIdNotRegisteredError,
    BrokerNotAvailableError,
    NotControllerError,
    PreconditionFailedError,
    RaylogError,
    RequestTimedOutError,
)
from raylog.storage.leasekeeper import LeaseKeeper
from raylog.storage.objectstore import open_object_store

log = logging.getLogger(__name__)

T = TypeVar("T")

CONTROLLER_LEASE_KEY = "controller/lease"
CALL_TIMEOUT_MS_DEFAULT = 5_000
RECONCILE_INTERVAL_MS_DEFAULT = 500
RESYNC_INTERVAL_MS_DEFAULT = 10_000
DEATH_CONFIRM_TIMEOUT_MS = 2_000  # bound on confirming a dead broker's leaders cannot write
SLOW_PUSH_MS = 100  # a push slower than this is logged (INFO: one that starts replicas takes s)
STUCK_PUSH_MS = 15_000  # and a warning above this
WAIT_RECONCILED_MS_MAX = 30_000


# --- what crosses Ray between the controller and brokers --------------------------------------


class ControllerStatus(msgspec.Struct, frozen=True):
    controller_id: str
    active: bool
    controller_epoch: int
    metadata_epoch: int
    reconciled_epoch: int  # the metadata epoch every unfenced broker has applied
    pushing: tuple[int, ...] = ()  # brokers a push is in flight to
    node_id: str = ""  # the Ray node this controller runs on
    balancer: str = ""  # replica.balancer.enable: off, balanced, moving ..., paused: ...
    capacity_request: str = ""  # nodes asked of Ray's autoscaler, while the request stands


@dataclass
class _BrokerLink:
    """How the active controller reaches one incarnation of a broker: its handle, the watch on
    its death, and what its last push answered (its session is in ``BrokerSessions``, what it
    was pushed in the :class:`Reconciler`)."""

    handle: Any
    incarnation_id: str
    watch: asyncio.Task[None] | None = None
    leos: dict[TopicPartition, int] = field(default_factory=dict)
    # Set once Ray confirmed this incarnation dead: a push to it in flight gives up at once
    # instead of holding the new leaders' commands that wait for it until it fails.
    gone: asyncio.Event = field(default_factory=asyncio.Event)


@ray.remote(
    num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=1000, enable_task_events=False
)
class ControllerActor(AdminRequests, LinkRequests, CapacityRequests):
    """One controller; active while it holds the lease, standby otherwise. Its admin requests
    (topics, configs, elections, reassignments, producer ids) are :class:`AdminRequests`."""

    def __init__(
        self,
        store_url: str,
        controller_id: str,
        *,
        s3_endpoint: str | None = None,
        cluster_id: str = "raylog",
        lease_ms: int = 15_000,
        renew_ms: int = 5_000,
        poll_ms: int = 2_000,
        broker_configs: dict[str, str] | None = None,
        reconcile_interval_ms: int = RECONCILE_INTERVAL_MS_DEFAULT,
        resync_interval_ms: int = RESYNC_INTERVAL_MS_DEFAULT,
        call_timeout_ms: int = CALL_TIMEOUT_MS_DEFAULT,
        auto_start: bool = True,
    ) -> None:
        logs.configure()  # timestamped lines in this worker's log
        self.controller_id = controller_id
        self._cluster_id = cluster_id
        self._store = open_object_store(store_url, endpoint_url=s3_endpoint)
        self._store_location = (store_url, s3_endpoint)  # told to brokers (tiered storage)
        self._mstore = MetadataStore(self._store)
        self._lease_args = {"lease_ms": lease_ms, "renew_ms": renew_ms, "poll_ms": poll_ms}
        self._broker_config = config_keys.broker_config(broker_configs)
        self._broker_overrides = dict(broker_configs or {})
        self._leader_rebalance_due: tuple[int, int] | None = None  # (controller epoch, due ms)
        self._balance_due: tuple[int, int] | None = None  # the same, for replica balancing
        self._balancer_state = "off" if not self._broker_config.replica_balancer_enable else ""
        self.balancer_moves = 0  # partitions the balancer started moving while active here
        self._fenced_since: dict[int, int] = {}  # the balancer's clock on fenced brokers
        self._capacity_request: capacity.CapacityRequest | None = None  # to Ray's autoscaler
        self._capacity_epoch: int | None = None
        self._session_ms = self._broker_config.broker_session_timeout_ms
        self._reconcile_interval_ms = min(reconcile_interval_ms, max(10, self._session_ms // 4))
        self._resync_interval_ms = resync_interval_ms
        self._call_timeout_ms = call_timeout_ms
        self._keeper: LeaseKeeper | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._epoch: int | None = None  # controller epoch while active
        self._md: VersionedMetadata | None = None
        self._write_lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._links: dict[int, _BrokerLink] = {}
        self._reconciler: Reconciler | None = None  # while active
        self._calls: set[asyncio.Task[None]] = set()  # push calls in flight
        self._push_started_ms: dict[int, int] = {}  # push id -> when its phase 1 was sent
        self._loop_task: asyncio.Task[None] | None = None
        self._activation: asyncio.Task[None] | None = None
        self._stopped = False
        self._sessions = BrokerSessions(self._session_ms)
        # Incarnations Ray confirmed dead: a late heartbeat from one (a process outliving its
        # node for a moment) must not unfence it; only a new incarnation comes back.
        self._dead_incarnations: set[str] = set()
        self._offline_check = election.OfflineReportCheck()  # heartbeats' offline reports
        self.unclean_elections = 0  # metric
        self._ca: pki.CertificateAuthority | None = None  # loaded on the first certificate
        self._transitions = health.Transitions()  # metrics: ISR shrinks/expands, elections
        # Cross-cluster links (controller_links): gateways' progress reports (partitions, and
        # group-offset sync per link and broker), and each link's discovery (next due ms, the
        # task running it, its last error).
        self._link_progress: dict[tuple[str, int], MirrorProgress] = {}
        self._link_group_reports: dict[tuple[str, int], GroupSyncReport] = {}
        self._discoveries: dict[str, tuple[int, asyncio.Task[None] | None, str]] = {}
        if auto_start:
            # Also after Ray restarts this actor: it rejoins the contest for the lease by itself.
            call_self_after_init("start")

    # --- lifecycle -----------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        """Start the lease keeper and the reconcile loop on the first call (also after Ray
        restarts this actor: brokers looking for the active controller call every one)."""
        if self._loop is not None or self._stopped:
            return
        self._loop = asyncio.get_running_loop()
        self._write_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._keeper = LeaseKeeper(
            self._store,
            f"{self.controller_id}-{uuid.uuid4().hex[:8]}",
            key=CONTROLLER_LEASE_KEY,
            on_elected=self._from_lease_thread_elected,
            on_demoted=self._from_lease_thread_demoted,
            **self._lease_args,
        )
        self._keeper.start()
        self._loop_task = self._loop.create_task(self._reconcile_loop())

    async def start(self) -> ControllerStatus:
        """Join the contest for the lease; returns at once (active or standby)."""
        self._ensure_started()
        return await self.status()

    async def stop(self, release: bool = True) -> None:
        """Stop contending; a holder demotes first and (``release``) hands over at once."""
        self._stopped = True
        if self._keeper is not None:
            await asyncio.to_thread(self._keeper.stop, release=release)
        self._demote("stopped")
        if self._loop_task is not None:
            self._loop_task.cancel()

    async def status(self) -> ControllerStatus:
        self._ensure_started()
        md = self._md.metadata if self._md is not None else None
        rec = self._reconciler
        return ControllerStatus(
            controller_id=self.controller_id,
            active=self._is_active(),
            controller_epoch=self._epoch or -1,
            metadata_epoch=md.metadata_epoch if md is not None else -1,
            reconciled_epoch=-1 if rec is None else rec.reconciled_epoch,
            pushing=() if rec is None else rec.pushing(),
            node_id=ray.get_runtime_context().get_node_id(),
            balancer=self._balancer_state if self._is_active() else "",
            capacity_request=self._capacity_status() if self._is_active() else "",
        )

    def _from_lease_thread_elected(self, epoch: int) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._start_activation, epoch)

    def _from_lease_thread_demoted(self) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._demote, "stopping" if self._stopped else "lease lost")

    def _start_activation(self, epoch: int) -> None:
        assert self._loop is not None
        self._activation = self._loop.create_task(self._activate(epoch))

    async def _activate(self, epoch: int) -> None:
        """Steps: 1. re-read the metadata; 2. CAS-write our epoch into it; 3. start acting.

        Sessions of every known broker start counting at this activation (module docstring).
        """
        assert self._write_lock is not None and self._wake is not None
        async with self._write_lock:
            try:
                self._md = await asyncio.to_thread(
                    self._mstore.take_controllership,
                    epoch,
                    self._cluster_id,
                    lambda: self._holds(epoch),
                )
            except NotControllerError as exc:
                log.error("%s: %s", self.controller_id, exc)
                return
            self._epoch = epoch
            now = monotonic_ms()
            self._links = {}
            self._sessions.take_over(now)
            self._reconciler = Reconciler(epoch, self._resync_interval_ms, self._broker_overrides)
        log.info("%s active at controller epoch %d", self.controller_id, epoch)
        self._wake.set()

    def _demote(self, why: str) -> None:
        if self._epoch is not None:
            loud = why not in ("stopping", "stopped")  # a stop is asked for, not a fault
            (log.warning if loud else log.info)(
                "%s demoted (%s) at epoch %s", self.controller_id, why, self._epoch
            )
        self._epoch = None
        self._md = None
        for link in self._links.values():
            if link.watch is not None:
                link.watch.cancel()
        for call in self._calls:
            call.cancel()
        self._links = {}
        for _, task, _ in self._discoveries.values():
            if task is not None:
                task.cancel()
        self._discoveries = {}
        self._link_progress = {}
        self._link_group_reports = {}
        self._reconciler = None
        self._push_started_ms = {}
        self._sessions.take_over(monotonic_ms())

    def _holds(self, epoch: int | None) -> bool:
        keeper = self._keeper
        return keeper is not None and epoch is not None and keeper.epoch == epoch

    def _is_active(self) -> bool:
        return self._md is not None and self._holds(self._epoch)

    def _require_active(self) -> VersionedMetadata:
        if not self._is_active() or self._md is None:
            raise NotControllerError(f"{self.controller_id} is not the active controller")
        return self._md

    # --- metadata writes -------------------------------------------------------------------------

    async def _mutate(self, change: Callable[[ClusterMetadata], tuple[ClusterMetadata, T]]) -> T:
        """Decide with ``change`` on the current metadata, CAS-write the result, then act.

        Invariant: ``self._md`` is always a version that is (or was) stored; nothing is sent to
        brokers about a version before its write succeeded.
        """
        assert self._write_lock is not None and self._wake is not None
        async with self._write_lock:
            current = self._require_active()
            new, result = change(current.metadata)
            if new is current.metadata:
                return result
            self._require_active()  # the lease deadline may have passed while deciding
            try:
                self._md = await asyncio.to_thread(self._mstore.write, new, current.etag)
            except PreconditionFailedError:
                await self._after_lost_cas()
                raise NotControllerError(
                    f"{self.controller_id}: metadata changed under us; retry"
                ) from None
            log.debug("metadata epoch %d written (%s)", new.metadata_epoch, change.__qualname__)
            self._count_transitions(current.metadata, new)
            if self._is_active():
                self._wake.set()
            return result

    async def _after_lost_cas(self) -> None:
        stored = await asyncio.to_thread(self._mstore.load)
        if stored is None or self._epoch is None or stored.metadata.controller_epoch > self._epoch:
            self._demote("a newer controller wrote the metadata")
        else:
            self._md = stored  # our own write of unknown outcome landed: adopt it

    # --- broker registration and heartbeats -----------------------------------------------------

    async def register_broker(
        self,
        broker_id: int,
        incarnation_id: str,
        rack: str | None,
        host: str,
        port: int,
        handle: Any,
        sentinel: Any,
        endpoints: tuple[Endpoint, ...] = (),
    ) -> RegisterReply:
        """BrokerRegistration: records the incarnation (fencing an older one) and watches it.
        ``endpoints``: its client listeners, as clients reach them."""
        self._ensure_started()
        live = self._sessions.live(broker_id, monotonic_ms())

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, None]:
            out = election.register_broker(
                md,
                broker_id,
                incarnation_id,
                rack,
                host,
                port,
                old_session_live=live,
                log_end_offsets=self._leos(),
                endpoints=endpoints,
            )
            self._count_unclean(out)
            return out.metadata, None

        await self._mutate(change)
        md = self._require_active().metadata
        reg = md.brokers[broker_id]
        self._attach(broker_id, incarnation_id, handle, sentinel, md.metadata_epoch)
        assert self._epoch is not None
        return RegisterReply(reg.broker_epoch, self._epoch, *self._store_location)

    def _attach(
        self,
        broker_id: int,
        incarnation_id: str,
        handle: Any,
        sentinel: Any,
        lease_from_epoch: int,
    ) -> None:
        """Start tracking (and watching) this incarnation of the broker."""
        assert self._loop is not None and self._wake is not None
        old = self._links.get(broker_id)
        if old is not None and old.watch is not None:
            old.watch.cancel()
        link = _BrokerLink(handle, incarnation_id)
        self._sessions.start(broker_id, incarnation_id, monotonic_ms(), lease_from_epoch)
        link.watch = self._loop.create_task(self._watch(broker_id, incarnation_id, sentinel))
        self._links[broker_id] = link
        if self._reconciler is not None:
            self._reconciler.attach(broker_id, incarnation_id)
        self._wake.set()

    async def heartbeat(
        self,
        broker_id: int,
        incarnation_id: str,
        applied_epoch: int,
        handle: Any,
        sentinel: Any,
        offline: Sequence[tuple[str, int]] = (),
    ) -> HeartbeatReply:
        """A broker's heartbeat; says whether it may extend its replicas' write leases.

        ``offline``: the (topic, partition) of every replica of this broker whose log failed
        (the whole set each time); the metadata is brought in line with it
        (:func:`election.set_offline_replicas`) before the answer."""
        self._ensure_started()
        current = self._require_active()
        assert self._epoch is not None
        reg = current.metadata.brokers.get(broker_id)
        if incarnation_id in self._dead_incarnations:
            return HeartbeatReply(
                False, True, "fenced", self._epoch, current.metadata.metadata_epoch
            )
        if reg is None or reg.incarnation_id != incarnation_id:
            return HeartbeatReply(
                False, False, "unknown", self._epoch, current.metadata.metadata_epoch
            )
        link = self._links.get(broker_id)
        if link is None or link.incarnation_id != incarnation_id:
            # First heartbeat to this controller (it took over): track it from now on; leases
            # only after it applied our current version.
            self._attach(
                broker_id, incarnation_id, handle, sentinel, current.metadata.metadata_epoch
            )
            link = self._links[broker_id]
        if reg.state == "fenced":

            def unfence(md: ClusterMetadata) -> tuple[ClusterMetadata, None]:
                out = election.unfence_broker(md, broker_id, self._leos())
                self._count_unclean(out)
                return out.metadata, None

            await self._mutate(unfence)
            md = self._require_active().metadata
            self._sessions.unfenced(broker_id, md.metadata_epoch)
            self._forget_pushed(broker_id, incarnation_id)
            reg = md.brokers[broker_id]
        lease_ok = self._sessions.heartbeat(
            broker_id, applied_epoch, monotonic_ms(), fenced=reg.state == "fenced"
        )
        reported = {TopicPartition(t, p) for t, p in offline}
        if self._offline_check.differs(self._require_active().metadata, broker_id, reported):
            await self._set_offline(broker_id, incarnation_id, reported)
        md = self._require_active().metadata  # is_holder() is checked once more before granting
        return HeartbeatReply(lease_ok, True, reg.state, self._epoch, md.metadata_epoch)

    async def _set_offline(
        self, broker_id: int, incarnation_id: str, offline: set[TopicPartition]
    ) -> None:
        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, election.Outcome]:
            reg = md.brokers.get(broker_id)
            if reg is None or reg.incarnation_id != incarnation_id:
                return md, election.Outcome(md)
            out = election.set_offline_replicas(md, broker_id, offline, self._leos())
            return out.metadata, out

        out = await self._mutate(change)
        self._count_unclean(out)
        for c in out.changes:
            log.warning(
                "%s-%d: the replica on broker %d is %s; leader %s, ISR %s",
                c.topic,
                c.partition,
                broker_id,
                "offline (its log failed)" if c.topic_partition in offline else "online again",
                c.leader,
                c.isr,
            )

    async def controlled_shutdown(self, broker_id: int, incarnation_id: str) -> bool:
        """Move the broker's leaderships away; returns once the move reached the brokers.

        True when the broker leads nothing any more (partitions whose only ISR member it is go
        offline instead, as in Kafka).
        """
        self._ensure_started()
        reg = self._require_active().metadata.brokers.get(broker_id)
        if reg is None or reg.incarnation_id != incarnation_id:
            raise BrokerIdNotRegisteredError(
                f"Broker {broker_id} ({incarnation_id}) is not registered"
            )

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, election.Outcome]:
            out = election.controlled_shutdown(md, broker_id)
            return out.metadata, out

        out = await self._mutate(change)
        md = self._require_active().metadata
        # Wait only for the brokers hosting the moved partitions (a dead, not yet fenced broker
        # elsewhere must not hold the shutdown up).
        involved = {
            b
            for c in out.changes
            for b in md.topics[c.topic].partitions[c.partition].replicas
            if b != broker_id and md.brokers[b].state != "fenced"
        }
        await self._wait_applied(involved, md.metadata_epoch, WAIT_RECONCILED_MS_MAX)
        md = self._require_active().metadata
        return not any(p.leader == broker_id for _, p in md_.partitions(md))

    # --- death detection ------------------------------------------------------------------------

    async def _watch(self, broker_id: int, incarnation_id: str, sentinel: Any) -> None:
        """Hold a never-returning call on the broker's sentinel; its failure is Ray confirming
        that the broker's process (or node) died."""
        try:
            await ray_call(sentinel.wait_forever.remote(), None)
        except BrokerNotAvailableError:
            await self._on_broker_died(broker_id, incarnation_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("watch of broker %d ended unexpectedly", broker_id)

    async def broker_node_died(self, broker_id: int) -> None:
        """The node watcher saw the broker's Ray node die: the same fast path as the death
        watch (``_on_broker_died``), for whichever incarnation is registered."""
        self._ensure_started()
        reg = self._require_active().metadata.brokers.get(broker_id)
        if reg is not None:
            await self._on_broker_died(broker_id, reg.incarnation_id)

    async def _on_broker_died(self, broker_id: int, incarnation_id: str) -> None:
        if not self._is_active():
            return
        link = self._links.get(broker_id)
        if link is not None and link.incarnation_id == incarnation_id:
            link.gone.set()
        if self._reconciler is not None:
            self._reconciler.gone(broker_id, incarnation_id)
        md = self._require_active().metadata
        reg = md.brokers.get(broker_id)
        if reg is None or reg.incarnation_id != incarnation_id or reg.state == "fenced":
            return
        led = [tp for tp, p in md_.partitions(md) if p.leader == broker_id]
        seen_ms = monotonic_ms()
        confirmed = await asyncio.gather(*(self._cannot_write(tp, broker_id) for tp in led))
        if not all(confirmed):
            log.warning(
                "broker %d died but its leaders are not confirmed fenced; waiting for "
                "its session to expire",
                broker_id,
            )
            return
        confirmed_ms = monotonic_ms()
        self._dead_incarnations.add(incarnation_id)
        await self._fence(broker_id, incarnation_id)
        log.warning(
            "broker %d (%s) confirmed dead by Ray: %d leaders confirmed fenced in %d ms, "
            "fenced in %d ms more (at %d)",
            broker_id,
            incarnation_id,
            len(led),
            confirmed_ms - seen_ms,
            monotonic_ms() - confirmed_ms,
            monotonic_ms(),
        )

    async def _cannot_write(self, tp: TopicPartition, broker_id: int) -> bool:
        """True once the replica is dead or has dropped its write lease."""
        name = replica_actor_name(tp.topic, tp.partition, broker_id)
        try:
            handle = await asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE)
        except ValueError:
            return True  # no such actor: nothing can write
        try:
            return bool(
                await ray_call(handle.revoke_session_lease.remote(), DEATH_CONFIRM_TIMEOUT_MS)
            )
        except BrokerNotAvailableError:
            return True
        except RequestTimedOutError:
            return False

    async def _fence(self, broker_id: int, incarnation_id: str) -> None:
        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, None]:
            reg = md.brokers.get(broker_id)
            if reg is None or reg.incarnation_id != incarnation_id or reg.state == "fenced":
                return md, None
            out = election.fence_broker(md, broker_id, self._leos())
            self._count_unclean(out)
            return out.metadata, None

        try:
            await self._mutate(change)
        except NotControllerError:
            return
        self._forget_pushed(broker_id, incarnation_id)

    def _forget_pushed(self, broker_id: int, incarnation_id: str) -> None:
        if self._reconciler is not None:
            self._reconciler.forget_pushed(broker_id, incarnation_id)

    def _count_unclean(self, out: election.Outcome) -> None:
        if out.unclean_elections:
            self.unclean_elections += out.unclean_elections
            log.warning(
                "unclean leader election for %s",
                [c.topic_partition for c in out.changes if c.unclean],
            )

    def _leos(self) -> dict[TopicPartition, dict[int, int]]:
        out: dict[TopicPartition, dict[int, int]] = {}
        for b, link in self._links.items():
            for tp, leo in link.leos.items():
                out.setdefault(tp, {})[b] = leo
        return out

    # --- the reconcile loop ---------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        assert self._wake is not None
        while not self._stopped:  # ends with stop(); each round is bounded by call timeouts
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._reconcile_interval_ms / 1000)
            self._wake.clear()
            if not self._is_active():
                continue
            try:
                await self._expire_sessions()
                await self._push_round()
                await self._reassignment_round()
                await self._auto_leader_rebalance()
                self._link_discovery_round()
                await self._capacity_round()
                await self._replica_balance()  # last: a failing plan holds nothing else up
            except NotControllerError:
                continue
            except Exception:
                log.exception("%s: reconcile round failed", self.controller_id)

    async def _expire_sessions(self) -> None:
        md = self._require_active().metadata
        due = self._sessions.due_for_fencing(md, monotonic_ms(), self._reconcile_interval_ms)
        for broker_id, silent_ms in due:
            log.warning("broker %d session expired (%d ms): fencing", broker_id, silent_ms)
            await self._fence(broker_id, md.brokers[broker_id].incarnation_id)

    async def _push_round(self) -> None:
        """Start the pushes the reconciler asks for (``raylog.actors.control.reconciler``).

        Each phase call runs as a task of its own and the round waits for none: a leader phase
        waits only for phase 1 of the brokers that may still lead its partitions, so a hung
        broker holds up the partitions it may lead, until Ray confirms it dead or its session
        expires and it is fenced, and nothing else: not the other brokers' commands, not the
        next round, not the session expiry that fences it.
        """
        md = self._require_active().metadata
        assert self._reconciler is not None
        now = monotonic_ms()
        for call in self._reconciler.round(md, now):
            self._push_started_ms[call.push_id] = now
            self._start_call(call)

    def _start_call(self, call: Push) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._call_broker(call))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _call_broker(self, call: Push) -> None:
        """One phase of a push; its outcome goes to the reconciler, which may release leader
        phases waiting for it. A push applied in full wakes the loop for what may follow;
        after a failure the next round comes at the reconcile interval (no hot retry loop)."""
        reconciler = self._reconciler
        try:
            outcome = await self._apply(call)
        except Exception:  # a bug, not a broker's answer: logged; the next round pushes again
            log.exception("push (%s) of metadata epoch %d", call.phase, call.metadata_epoch)
            outcome = Outcome.FAILED
        if reconciler is None or reconciler is not self._reconciler or self._md is None:
            return  # demoted meanwhile
        progress = reconciler.answered(call, outcome, self._md.metadata)
        for released in progress.pushes:
            self._start_call(released)
        for ended in progress.ended:
            took_ms = monotonic_ms() - self._push_started_ms.pop(ended.push_id, monotonic_ms())
            slow = took_ms > SLOW_PUSH_MS
            (log.warning if took_ms > STUCK_PUSH_MS else log.info if slow else log.debug)(
                "pushed metadata epoch %d to broker %d in %d ms (at %d)%s",
                ended.metadata_epoch,
                ended.broker_id,
                took_ms,
                monotonic_ms(),
                "" if ended.applied else ": not applied",
            )
            if ended.applied:
                self._sessions.applied(ended.broker_id, ended.metadata_epoch)
                assert self._wake is not None
                self._wake.set()

    async def _apply(self, call: Push) -> Outcome:
        """The broker's ``apply`` for one phase, given up at once if Ray confirms its death."""
        link = self._links.get(call.broker_id)
        if link is None or link.incarnation_id != call.incarnation_id:
            return Outcome.FAILED  # a newer incarnation registered: this push ends unapplied
        if link.gone.is_set():
            return Outcome.GONE
        if not self._is_active():
            return Outcome.FAILED
        assert self._epoch is not None
        remote = link.handle.apply.remote(self._epoch, call.metadata_epoch, call.specs, call.phase)
        answer = asyncio.ensure_future(ray_call(remote, self._push_timeout_ms(link, call)))
        gone = asyncio.ensure_future(link.gone.wait())
        try:
            await asyncio.wait((answer, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            answer.cancel()
            raise
        finally:
            gone.cancel()
        if not answer.done():  # Ray confirmed the broker dead first
            answer.cancel()
            log.warning(
                "push (%s) to broker %d abandoned: Ray confirmed it dead",
                call.phase,
                call.broker_id,
            )
            return Outcome.GONE
        try:
            states = answer.result()
        except RaylogError as exc:
            log.warning("push (%s) to broker %d failed: %s", call.phase, call.broker_id, exc)
            return Outcome.FAILED
        link.leos = {TopicPartition(s.topic, s.partition): s.log_end_offset for s in states}
        return Outcome.APPLIED

    def _push_timeout_ms(self, link: _BrokerLink, call: Push) -> int:
        """How long one phase may take: a phase 1 that makes the broker start replicas it did
        not report hosting waits for them too (the broker bounds each start by
        REPLICA_START_TIMEOUT_MS, all in parallel); given up sooner, it would be pushed again
        and again while the broker is still starting the same replicas, and never count as
        applied."""
        if call.phase == FOLLOWERS and any(
            TopicPartition(s.topic, s.partition) not in link.leos for s in call.specs
        ):
            return self._call_timeout_ms + REPLICA_START_TIMEOUT_MS
        return self._call_timeout_ms

    async def _wait_reconciled(self, epoch: int, timeout_ms: int) -> bool:
        """Wait (bounded) until every unfenced broker applied metadata ``epoch``."""
        deadline = monotonic_ms() + timeout_ms
        assert self._wake is not None
        while self._reconciler is None or self._reconciler.reconciled_epoch < epoch:
            if monotonic_ms() >= deadline or not self._is_active():
                return False
            self._wake.set()
            await asyncio.sleep(0.005)
        return True

    async def _wait_applied(self, brokers: set[int], epoch: int, timeout_ms: int) -> bool:
        """Wait (bounded) until each of ``brokers`` applied metadata ``epoch`` or later."""
        deadline = monotonic_ms() + timeout_ms
        assert self._wake is not None
        self._wake.set()
        while True:  # bounded by the deadline
            if self._sessions.all_applied(brokers, epoch):
                return True
            if monotonic_ms() >= deadline or not self._is_active():
                return False
            await asyncio.sleep(0.005)

    # --- AlterPartition -------------------------------------------------------------------------

    async def alter_partition(
        self,
        broker_id: int,
        broker_epoch: int,
        topic: str,
        partition: int,
        request: AlterPartitionRequest,
    ) -> AlterPartitionResponse:
        """A leader's ISR proposal (forwarded by its broker), validated by election.py."""
        self._ensure_started()
        tp = TopicPartition(topic, partition)

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, None]:
            out = election.alter_partition(
                md,
                broker_id,
                broker_epoch,
                tp,
                request.leader_epoch,
                request.partition_epoch,
                request.new_isr,
                request.fence,
            )
            return out.metadata, None

        try:
            await self._mutate(change)
            error = 0
        except RaylogError as exc:
            if isinstance(exc, NotControllerError):
                raise
            error = exc.error_code
        p = md_.get_partition(self._require_active().metadata, topic, partition)
        if error and p.leader_epoch != request.leader_epoch:
            # Only answers about the leader's own epoch carry the committed state.
            return AlterPartitionResponse(
                error,
                request.leader_epoch,
                request.partition_epoch,
                request.new_isr,
                request.request_id,
            )
        return AlterPartitionResponse(
            error, p.leader_epoch, p.partition_epoch, p.isr, request.request_id
        )

    async def metadata(self) -> ClusterMetadata:
        self._ensure_started()
        return self._require_active().metadata

    async def wait_reconciled(self, timeout_ms: int = WAIT_RECONCILED_MS_MAX) -> int:
        """Wait until every unfenced broker applied the current metadata; returns its epoch
        (-1 when that did not happen within ``timeout_ms``)."""
        self._ensure_started()
        epoch = self._require_active().metadata.metadata_epoch
        done = await self._wait_reconciled(epoch, min(timeout_ms, WAIT_RECONCILED_MS_MAX))
        return epoch if done else -1

    def _count_transitions(self, old: ClusterMetadata, new: ClusterMetadata) -> None:
        seen, total = health.transitions(old, new), self._transitions
        self._transitions = health.Transitions(
            isr_shrinks=total.isr_shrinks + seen.isr_shrinks,
            isr_expands=total.isr_expands + seen.isr_expands,
            leader_elections=total.leader_elections + seen.leader_elections,
        )

    async def metrics(self) -> dict[str, int]:
        """Counters since this controller started (Kafka's controller metrics); 0 on a standby
        that never was active."""
        t = self._transitions
        return {
            "active": int(self._is_active()),
            "isr_shrinks": t.isr_shrinks,
            "isr_expands": t.isr_expands,
            "leader_elections": t.leader_elections,
            "unclean_leader_elections": self.unclean_elections,
            "replica_balancer_moves": self.balancer_moves,
        }

    async def issue_certificate(
        self,
        subject: str,
        ips: list[str],
        dns_names: list[str] | None = None,
        days: int = pki.LEAF_DAYS,
    ) -> pki.LeafCertificate:
        """A leaf certificate from the cluster CA (created in the object store on first use)
        for a broker's or gateway's replication channels, or (with the gateway's host names
        as ``dns_names``, pki.LISTENER_LEAF_DAYS) its client listeners. Any controller can
        answer."""
        ca = await self._certificate_authority()
        return ca.issue(subject, tuple(ips), tuple(dns_names or ()), days)

    async def _certificate_authority(self) -> pki.CertificateAuthority:
        """The cluster CA, read from (or created in) the object store on first use."""
        if self._ca is None:
            self._ca = await asyncio.to_thread(pki.ensure_cluster_ca, self._store, self._cluster_id)
        return self._ca

    async def leader_of(self, topic: str, partition: int) -> int:
        """The partition's leader broker id (-1: offline)."""
        self._ensure_started()
        return md_.get_partition(self._require_active().metadata, topic, partition).leader


__all__ = [
    "CONTROLLER_LEASE_KEY",
    "ControllerActor",
    "ControllerStatus",
    "HeartbeatReply",
    "RegisterReply",
]
