"""BrokerActor: one broker's identity, its session with the controller, and its replica actors.

This module owns what a Kafka broker process owns apart from the wire protocol:

- identity: ``broker.id`` persisted in ``<data>/broker-<id>/meta.properties``, a rack, and the
  host/port its gateway will listen on (recorded in its registration; the gateway comes later);
  every start of the actor (also a Ray restart) is a new incarnation (uuid);
- the session: it registers with the active controller and heartbeats every
  ``broker.heartbeat.interval.ms``; after each accepted heartbeat it extends its replicas' write
  lease to ``t0 + session - guard`` where ``t0`` was read just before sending (the safety
  argument is in ``raylog.actors.controller``). It finds the active controller by trying the
  configured controller actors in turn (their handles looked up once, with a deadline, and
  kept). Nothing slow sits on the heartbeat's path: lease grants go out without being awaited
  (one in flight per replica), so a replica busy starting or fsyncing does not delay the next
  heartbeat and let the session lapse;
- replicas: the controller pushes the full list of replicas this broker must host with their
  role commands (``apply``). The broker creates missing ``ReplicaActor``s (named, in namespace
  ``raylog``, pinned to this node, each with its WAL in ``<data>/broker-<id>/<topic>-<p>``),
  applies changed topic configs to running replicas in place (re-creating a replica from its
  WAL only when its ``replication.mode`` changed), stops and deletes replicas that are no longer
  assigned (deleted topics: data removed), and forwards the commands. New replicas start
  concurrently; one that does not answer within ``REPLICA_START_TIMEOUT_MS`` (a loaded machine)
  fails this apply but is kept, and the next apply waits for that same actor rather than
  starting it over. Commands from an older controller epoch than one already seen are refused;
- the AlterPartition path: replicas send their proposals to the broker (``set_controller`` is
  the broker), which adds its broker id and epoch and forwards them to the active controller,
  then hands the answer back to the replica;
- offline replicas: a replica whose log failed (a full disk, an I/O error) tells the broker
  (``replica_offline``; lease grants say so too). Every heartbeat carries the set of them, as a
  KRaft broker's carries its offline log directories, and the controller moves their
  leadership and ISR membership away. After ``replica.offline.retry.backoff.ms`` the broker
  re-creates such a replica from its log (reported offline until the new actor is up);
- controlled shutdown (``shutdown``): the controller moves leadership away first, then the
  broker stops its replicas.

Replica actors are created by this actor, so Ray makes them share its fate: when the broker's
process dies its replicas die too, and a restarted broker re-creates them from their WALs once
the controller tells it what to host. Ray does not restart replicas (``max_restarts=0``: one
pinned to a dead node would hold its name forever); a replica that dies alone is found dead by
the next ``apply`` (the controller resyncs every ``resync_interval_ms``) and re-created here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raylog.actors import logs
from raylog.actors.calls import (
    NAMESPACE,
    REPLICA_START_TIMEOUT_MS,
    ReplicaState,
    call_self_after_init,
    controller_actor_name,
    monotonic_ms,
    ray_call,
    replica_actor_name,
)
from raylog.actors.control import config_keys
from raylog.actors.control.listeners import Endpoint
from raylog.actors.control.reconciler import LEADERS, ReplicaSpec
from raylog.actors.control.sessions import SESSION_GUARD_FRACTION, HeartbeatReply, RegisterReply
from raylog.actors.process_memory import private_mib
from raylog.actors.replica import ReplicaActor
from raylog.actors.replica_tiering import RemoteStoreLocation
from raylog.actors.replication.messages import AlterPartitionRequest, BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.storage.errors import (
    BrokerNotAvailableError,
    DuplicateBrokerRegistrationError,
    InvalidConfigError,
    NotControllerError,
    RaylogError,
    RequestTimedOutError,
    one_line,
)
from raylog.storage.pki import LeafCertificate

log = logging.getLogger(__name__)

META_FILE = "meta.properties"
TOPIC_ID_SUFFIX = ".topic_id"
# A replica's data is first renamed to "<topic>-<partition>.<hex>-delete" (atomic: the partition's
# path is gone at once, even while a dying replica process still writes into its old directory),
# then removed; leftovers of an interrupted removal are removed by the next apply.
DELETED_SUFFIX = "-delete"
REPLICA_CALL_TIMEOUT_MS = 5_000
MEMORY_SAMPLE_REPLICAS = 16  # replicas whose private memory `status` reads
PID_CALL_TIMEOUT_MS = 1_000  # `status` asks those replicas their pid once; a busy one is skipped
NAME_RETRY_MAX = 200  # a dying actor keeps its name for a moment; bound the wait for it
NAME_RETRY_S = 0.05
REMOVE_CONFIRM_MS = 30_000  # how long a removal waits for Ray to confirm the replica dead
REGISTER_QUIET_ATTEMPTS = 20  # refusals logged at INFO, later ones at WARNING
REGISTER_ATTEMPTS_MAX = 10_000  # with backoff, far longer than any controller outage in tests
REGISTER_BACKOFF_MS_MAX = 1_000
CONTROLLER_LOOKUP_TIMEOUT_MS = 2_000  # ray.get_actor of a controller by name (a GCS round trip)


def delete_replica_data(log_dir: Path) -> None:
    """Delete a replica's log directory and its topic id file.

    The directory is renamed first, so its path is gone at once even while a dying replica
    process still writes into it (a file created during a plain ``rmtree`` would keep the
    directory alive); what the removal cannot delete, the next apply removes.
    """
    if log_dir.exists():
        doomed = log_dir.with_name(f"{log_dir.name}.{uuid.uuid4().hex}{DELETED_SUFFIX}")
        try:
            log_dir.rename(doomed)
        except OSError as exc:
            log.warning("cannot rename %s for deletion: %s", log_dir, exc)
            doomed = log_dir
        shutil.rmtree(doomed, ignore_errors=True)
    log_dir.with_name(log_dir.name + TOPIC_ID_SUFFIX).unlink(missing_ok=True)


def read_or_write_broker_id(broker_dir: Path, broker_id: int) -> int:
    """Persist ``broker.id`` in ``meta.properties``; refuse a directory of another broker."""
    broker_dir.mkdir(parents=True, exist_ok=True)
    meta = broker_dir / META_FILE
    if meta.exists():
        props = dict(line.split("=", 1) for line in meta.read_text().splitlines() if "=" in line)
        stored = int(props.get("broker.id", "-1"))
        if stored != broker_id:
            raise InvalidConfigError(f"{broker_dir} belongs to broker {stored}, not {broker_id}")
        return stored
    tmp = meta.with_suffix(".tmp")
    tmp.write_text(f"version=1\nbroker.id={broker_id}\n")
    tmp.replace(meta)
    return broker_id


def _is_dead(result: object) -> bool:
    return isinstance(result, BrokerNotAvailableError)


def _send_command(handle: Any, spec: ReplicaSpec) -> Any:
    """Send the spec's role command to the replica; returns the call's ref."""
    if isinstance(spec.command, BecomeLeader):
        return handle.become_leader.remote(spec.command)
    if spec.command.__class__.__name__ == "BecomeObserver":
        return handle.become_observer.remote(spec.command)
    return handle.become_follower.remote(spec.command)


@dataclass
class _Hosted:
    handle: Any
    topic_id: str
    configs: dict[str, str]
    throttle_bytes_per_sec: int = 0  # last set on the replica (reassignment catch-up)
    granting: bool = False  # a lease grant to this actor is in flight
    spec: ReplicaSpec | None = None  # the last one applied
    offline: str | None = None  # why its log failed; the controller hears it by heartbeat
    offline_since_ms: int = 0
    offline_recorded: bool = False  # a heartbeat reporting it offline was answered
    pid: int = 0  # its process, once asked (the private memory it costs)


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4, enable_task_events=False)
class SessionSentinel:
    """Lives exactly as long as the broker process that created it; the controller's death watch.

    Why a separate actor: Ray reports the death of a restartable actor (the broker has
    ``max_restarts=-1``) to a caller only after it decided to restart it (seconds), but the
    death of a non-restartable one at once. The sentinel is owned by the broker actor, so Ray
    kills it as soon as the broker's process dies (a SIGKILL or ray.kill of the broker), and with
    its node (benchmarks/failover.py measures both). Cost: one more small process.
    """

    async def wait_forever(self) -> None:
        await asyncio.Event().wait()

    async def ping(self) -> bool:
        return True


@ray.remote(
    num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=1000, enable_task_events=False
)
class BrokerActor:
    """One broker: session, replica actors, and the relay between them and the controller."""

    def __init__(
        self,
        broker_id: int,
        data_dir: str,
        *,
        rack: str | None = None,
        host: str = "127.0.0.1",
        port: int = 9092,
        controller_names: tuple[str, ...] = (controller_actor_name(0), controller_actor_name(1)),
        broker_configs: dict[str, str] | None = None,
        auto_start: bool = True,
        endpoints: tuple[Endpoint, ...] = (),
    ) -> None:
        logs.configure()  # timestamped lines in this worker's log
        self.broker_id = broker_id
        self.dir = Path(data_dir) / f"broker-{broker_id}"
        read_or_write_broker_id(self.dir, broker_id)
        self.rack = rack
        self.host = host
        self.port = port
        self.endpoints = tuple(endpoints)  # its gateway's listeners, as clients reach them
        self.incarnation_id = uuid.uuid4().hex
        self._controller_names = tuple(controller_names)
        self._config = config_keys.broker_config(broker_configs)
        self._heartbeat_ms = self._config.broker_heartbeat_interval_ms
        self._session_ms = self._config.broker_session_timeout_ms
        self._guard_ms = int(self._session_ms * SESSION_GUARD_FRACTION)
        self._controller_handles: dict[str, Any] = {}  # by name; dropped once found dead
        self._controller_name: str | None = None  # the one that last answered as active
        self._broker_epoch = -1
        self._controller_epoch = -1  # highest seen; older commands are refused
        self._applied_epoch = -1
        self._lease_until_ms = 0
        self._heartbeats = 0  # answered by the active controller, this incarnation
        self._grants: set[asyncio.Task[None]] = set()
        self._hosted: dict[tuple[str, int], _Hosted] = {}
        # Replica actors created whose start outlasted REPLICA_START_TIMEOUT_MS (with their
        # topic id): the next apply waits for them again, or stops them if no longer wanted.
        self._starting: dict[tuple[str, int], tuple[Any, str]] = {}
        self._recreating: dict[tuple[str, int], asyncio.Task[None]] = {}  # offline ones
        self._beat_now: asyncio.Event | None = None  # wakes the heartbeat loop early
        self._apply_lock: asyncio.Lock | None = None
        self._start_lock: asyncio.Lock | None = None
        self._sentinel: Any = None
        self._heartbeater: asyncio.Task[None] | None = None
        self._stopping = False
        self._node_id = ray.get_runtime_context().get_node_id()
        self._leaf: LeafCertificate | None = None  # replication channels' TLS certificate
        # The cluster's object store, from the controller at registration: replicas of topics
        # with remote.storage.enable tier their closed segments there.
        self._remote_store: RemoteStoreLocation | None = None
        if auto_start:
            # Also after Ray restarts this actor: the new incarnation registers by itself.
            call_self_after_init("start")

    def _self(self) -> Any:
        return ray.get_runtime_context().current_actor

    # --- lifecycle -----------------------------------------------------------------------------

    def _ensure_loop_state(self) -> None:
        if self._apply_lock is None:
            self._apply_lock = asyncio.Lock()
            self._start_lock = asyncio.Lock()
            self._beat_now = asyncio.Event()

    async def start(self) -> int:
        """Register with the active controller and start heartbeating; returns the broker
        epoch. Idempotent: a second call waits for the first; a call after one that failed
        (its error is logged) tries again, so whoever finds this broker unregistered can start
        it (the supervisor does, on `raylog brokers start`)."""
        self._ensure_loop_state()
        assert self._start_lock is not None
        async with self._start_lock:
            if self._heartbeater is not None or self._stopping:
                return self._broker_epoch
            try:
                self._sentinel = SessionSentinel.options(  # type: ignore[attr-defined]
                    scheduling_strategy=NodeAffinitySchedulingStrategy(self._node_id, soft=False)
                ).remote()
                await ray_call(self._sentinel.ping.remote(), REPLICA_START_TIMEOUT_MS)
                await self._register()
                await self._fetch_certificate()
            except BaseException:
                log.exception("broker %d did not start", self.broker_id)
                self._sentinel = None  # its only reference: Ray ends it
                raise
            self._heartbeater = asyncio.get_running_loop().create_task(self._heartbeat_loop())
            return self._broker_epoch

    async def _fetch_certificate(self) -> None:
        """This broker's leaf from the cluster CA, for its replicas' replication channels.
        Without one (an older controller, a store error) they run without TLS, HMAC only."""
        try:
            self._leaf = await self._call_controller(
                "issue_certificate", f"broker:{self.broker_id}", [ray.util.get_node_ip_address()]
            )
        except Exception as exc:
            log.warning("broker %d: no TLS certificate for replication: %r", self.broker_id, exc)

    async def _register(self) -> None:
        backoff_ms = 50
        for attempt in range(REGISTER_ATTEMPTS_MAX):
            if self._stopping:
                return
            try:
                reply: RegisterReply = await self._call_controller(
                    "register_broker",
                    self.broker_id,
                    self.incarnation_id,
                    self.rack,
                    self.host,
                    self.port,
                    self._self(),
                    self._sentinel,
                    self.endpoints,
                )
                self._broker_epoch = reply.broker_epoch
                if reply.store_url:
                    self._remote_store = RemoteStoreLocation(reply.store_url, reply.s3_endpoint)
                self._controller_epoch = max(self._controller_epoch, reply.controller_epoch)
                log.info("broker %d registered, epoch %d", self.broker_id, reply.broker_epoch)
                return
            except (NotControllerError, DuplicateBrokerRegistrationError) as exc:
                # Quiet while a controller fails over; loud once it lasts (a broker that stays
                # unregistered is fenced while its supervisor counts it as running).
                noisy = attempt >= REGISTER_QUIET_ATTEMPTS
                (log.warning if noisy else log.info)(
                    "broker %d registration refused (attempt %d): %s",
                    self.broker_id,
                    attempt + 1,
                    exc,
                )
            await asyncio.sleep(backoff_ms / 1000)
            backoff_ms = min(backoff_ms * 2, REGISTER_BACKOFF_MS_MAX)
        raise NotControllerError(f"broker {self.broker_id} could not register")

    async def status(self) -> dict[str, Any]:
        self._ensure_loop_state()
        return {
            "broker_id": self.broker_id,
            "incarnation_id": self.incarnation_id,
            "broker_epoch": self._broker_epoch,
            "controller_epoch": self._controller_epoch,
            "applied_epoch": self._applied_epoch,
            "lease_valid_ms": self._lease_until_ms - monotonic_ms(),
            "heartbeats": self._heartbeats,
            "replicas": sorted(f"{t}-{p}" for t, p in self._hosted),
            "offline_replicas": {
                f"{t}-{p}": h.offline for (t, p), h in sorted(self._hosted.items()) if h.offline
            },
            "rack": self.rack,
            "port": self.port,
            "node_id": self._node_id,
            "pid": os.getpid(),
            "replica_private_mib": await self._replica_private_mib(),
        }

    async def _replica_private_mib(self) -> float | None:
        """The median private memory (USS, MiB) of up to MEMORY_SAMPLE_REPLICAS hosted replicas
        (each a process on this node), or None before any answers: what one more replica
        costs here, for the controller's memory check of new replicas."""
        sample = list(self._hosted.values())[:MEMORY_SAMPLE_REPLICAS]
        unasked = [h for h in sample if not h.pid]
        pids = await asyncio.gather(
            *(ray_call(h.handle.pid.remote(), PID_CALL_TIMEOUT_MS) for h in unasked),
            return_exceptions=True,
        )
        for hosted, pid in zip(unasked, pids, strict=True):
            if isinstance(pid, int):
                hosted.pid = pid
        figures = sorted(m for h in sample if h.pid and (m := private_mib(h.pid)) is not None)
        return round(figures[len(figures) // 2], 1) if figures else None

    async def replica_states(self, timeout_ms: int = REPLICA_CALL_TIMEOUT_MS) -> list[ReplicaState]:
        """The state of every hosted replica that answers within ``timeout_ms`` (metrics)."""
        hosted = list(self._hosted.values())
        results = await asyncio.gather(
            *(ray_call(h.handle.state.remote(), timeout_ms) for h in hosted),
            return_exceptions=True,
        )
        return [r for r in results if isinstance(r, ReplicaState)]

    async def replicas_started(self, topic: str) -> int:
        """How many replicas of ``topic`` this broker hosts, started (topic creation's
        progress)."""
        return sum(1 for t, _ in self._hosted if t == topic)

    async def replica(self, topic: str, partition: int) -> Any:
        """The handle of a hosted replica (None if not hosted here)."""
        hosted = self._hosted.get((topic, partition))
        return None if hosted is None else hosted.handle

    # --- the controller link -----------------------------------------------------------------

    async def _call_controller(self, method: str, *args: Any, timeout_ms: int | None = None) -> Any:
        """Call the active controller: the one that answered last first, then the other
        configured controllers in turn. Raises NotControllerError when none answers as the
        active one."""
        timeout = timeout_ms or REPLICA_CALL_TIMEOUT_MS
        names = sorted(self._controller_names, key=lambda n: n != self._controller_name)
        why: list[str] = []
        for name in names:  # bounded: one attempt per configured controller
            try:
                handle = await self._controller_handle(
                    name, min(timeout, CONTROLLER_LOOKUP_TIMEOUT_MS)
                )
                result = await ray_call(getattr(handle, method).remote(*args), timeout)
            except BrokerNotAvailableError as exc:  # that actor is gone: look it up again later
                self._controller_handles.pop(name, None)
                why.append(f"{name}: {one_line(exc)}")
                continue
            except (NotControllerError, RequestTimedOutError) as exc:
                why.append(f"{name}: {one_line(exc)}")
                continue
            self._controller_name = name
            return result
        raise NotControllerError(f"no active controller answered ({'; '.join(why)})")

    async def _controller_handle(self, name: str, timeout_ms: int) -> Any:
        """The controller actor of that name, looked up once (a GCS round trip, in a thread,
        with a deadline) and kept: a handle stays valid across Ray's restarts of the actor.
        Raises BrokerNotAvailableError when there is no such actor (yet) and
        RequestTimedOutError when the lookup does not answer in time."""
        handle = self._controller_handles.get(name)
        if handle is not None:
            return handle
        lookup = asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE)
        try:
            handle = await asyncio.wait_for(lookup, timeout_ms / 1000)
        except ValueError as exc:  # no actor of that name (yet)
            raise BrokerNotAvailableError(f"no controller actor {name}: {exc}") from exc
        except TimeoutError as exc:
            raise RequestTimedOutError(
                f"looking up {name}: no answer within {timeout_ms} ms"
            ) from exc
        self._controller_handles[name] = handle
        return handle

    async def _heartbeat_loop(self) -> None:
        while not self._stopping:  # ends with shutdown(); one heartbeat per interval
            t0 = monotonic_ms()
            # Reported offline: replicas whose log failed, and those being re-created since.
            reporting = {k: h for k, h in self._hosted.items() if h.offline is not None}
            try:
                reply: HeartbeatReply = await self._call_controller(
                    "heartbeat",
                    self.broker_id,
                    self.incarnation_id,
                    self._applied_epoch,
                    self._self(),
                    self._sentinel,
                    sorted({*reporting, *self._recreating}),
                    timeout_ms=max(self._heartbeat_ms, self._session_ms // 3),
                )
                self._controller_epoch = max(self._controller_epoch, reply.controller_epoch)
                self._heartbeats += 1
                if reply.registered and reply.state != "fenced":
                    # The controller wrote the report before answering: the replicas it named
                    # lead no more (their leader epoch moved on) and may be re-created.
                    for key, hosted in reporting.items():
                        if self._hosted.get(key) is hosted:
                            hosted.offline_recorded = True
                if not reply.registered:
                    await self._register()
                elif reply.lease_ok:
                    self._grant_lease(t0 + self._session_ms - self._guard_ms)
            except RaylogError as exc:
                log.warning("broker %d heartbeat failed: %s", self.broker_id, exc)
            except Exception:
                log.exception("broker %d heartbeat failed", self.broker_id)
            self._retry_offline()
            delay_ms = t0 + self._heartbeat_ms - monotonic_ms()
            assert self._beat_now is not None
            if delay_ms > 0 and not self._beat_now.is_set():
                with contextlib.suppress(TimeoutError):  # early: a replica went offline
                    await asyncio.wait_for(self._beat_now.wait(), delay_ms / 1000)
            self._beat_now.clear()

    def _grant_lease(self, until_ms: int) -> None:
        """Extend every hosted replica's write lease (this node's monotonic clock) without
        waiting for the replicas: a replica whose previous grant is still in flight is skipped
        this time (the next heartbeat's grant, a later ``until_ms``, follows once it answered),
        so at most one grant per replica is ever outstanding."""
        self._lease_until_ms = max(self._lease_until_ms, until_ms)
        loop = asyncio.get_running_loop()
        for key, hosted in list(self._hosted.items()):
            if hosted.granting:
                continue
            hosted.granting = True
            task = loop.create_task(self._grant_one(key, hosted, until_ms))
            self._grants.add(task)
            task.add_done_callback(self._grants.discard)

    async def _grant_one(self, key: tuple[str, int], hosted: _Hosted, until_ms: int) -> None:
        try:
            offline = await ray_call(
                hosted.handle.set_session_lease.remote(until_ms), REPLICA_CALL_TIMEOUT_MS
            )
            if offline:
                self._mark_offline(key, hosted, offline)
        except RaylogError as exc:  # gone or slow: the next apply or heartbeat deals with it
            log.debug("broker %d: lease grant to %s-%d failed: %s", self.broker_id, *key, exc)
        except Exception:
            log.exception("broker %d: lease grant to %s-%d failed", self.broker_id, *key)
        finally:
            hosted.granting = False

    # --- offline replicas (a failed log) -------------------------------------------------------

    async def replica_offline(self, topic: str, partition: int, reason: str, actor_id: str) -> None:
        """A hosted replica's log failed (it calls this once; lease grants also say so).
        ``actor_id`` tells a replica re-created since from the one that failed."""
        self._ensure_loop_state()
        hosted = self._hosted.get((topic, partition))
        if hosted is not None and hosted.handle._actor_id.hex() == actor_id:
            self._mark_offline((topic, partition), hosted, reason)

    def _mark_offline(self, key: tuple[str, int], hosted: _Hosted, reason: str) -> None:
        if hosted.offline is not None or self._hosted.get(key) is not hosted:
            return
        hosted.offline = reason
        hosted.offline_since_ms = monotonic_ms()
        log.error(
            "broker %d: replica %s-%d offline (%s); re-created in %d ms",
            self.broker_id,
            *key,
            reason,
            self._config.replica_offline_retry_backoff_ms,
        )
        if self._beat_now is not None:
            self._beat_now.set()  # the controller moves its leadership at the next heartbeat

    def _retry_offline(self) -> None:
        """Re-create (from its log) each replica offline for replica.offline.retry.backoff.ms
        whose offline state the controller has recorded."""
        now = monotonic_ms()
        backoff = self._config.replica_offline_retry_backoff_ms
        loop = asyncio.get_running_loop()
        for key, hosted in list(self._hosted.items()):
            if hosted.offline is None or key in self._recreating or self._stopping:
                continue
            # Only once the controller has recorded it offline: a replica that lost unsynced
            # writes must never resume leading the epoch it led (its followers may hold other
            # records at the same offsets of that epoch, which no truncation would find).
            if hosted.offline_recorded and now - hosted.offline_since_ms >= backoff:
                task = loop.create_task(self._recreate(key, hosted))
                self._recreating[key] = task
                task.add_done_callback(lambda _t, key=key: self._recreating.pop(key, None))

    async def _recreate(self, key: tuple[str, int], hosted: _Hosted) -> None:
        """Replace an offline replica by a new actor that recovers its log from disk. Not as
        leader: the controller gave its leadership away, and tells it what it is now once the
        heartbeats stop reporting it offline."""
        assert self._apply_lock is not None
        try:
            async with self._apply_lock:
                spec = hosted.spec
                if self._hosted.get(key) is not hosted or spec is None or self._stopping:
                    return
                log.warning("broker %d: re-creating offline replica %s-%d", self.broker_id, *key)
                await self._remove(key, delete_data=False)
                await self._ensure(spec)
                fresh = self._hosted[key]
                fresh.spec = spec
                if not spec.is_leader:
                    _send_command(fresh.handle, spec)
        except Exception:  # the next push (or retry) re-creates it
            log.exception("broker %d: re-creating replica %s-%d", self.broker_id, *key)

    # --- replicas -------------------------------------------------------------------------------

    async def apply(
        self, controller_epoch: int, metadata_epoch: int, specs: list[ReplicaSpec], phase: str
    ) -> list[ReplicaState]:
        """Host exactly ``specs``; forward the non-leader commands (phase "followers") or the
        leader commands (phase "leaders"). Returns the states of every hosted replica."""
        self._ensure_loop_state()
        assert self._apply_lock is not None
        if controller_epoch < self._controller_epoch:
            raise NotControllerError(
                f"controller epoch {controller_epoch} is older than {self._controller_epoch}"
            )
        self._controller_epoch = controller_epoch
        async with self._apply_lock:
            if controller_epoch < self._controller_epoch:
                raise NotControllerError(f"controller epoch {controller_epoch} is stale")
            wanted = {(s.topic, s.partition): s for s in specs}
            for key in [k for k in self._hosted if k not in wanted]:
                await self._remove(key, delete_data=True)
            for key in [k for k in self._starting if k not in wanted]:
                await self._stop(key, self._starting.pop(key)[0])
                delete_replica_data(self._log_dir(*key))
            self._remove_stray_dirs(wanted)
            await asyncio.gather(*(self._ensure(s) for s in specs))
            leaders = phase == LEADERS
            me = self._self()
            calls = []
            keys = []
            for s in specs:
                keys.append((s.topic, s.partition))
                hosted = self._hosted[(s.topic, s.partition)]
                hosted.spec = s
                if s.is_leader != leaders:
                    calls.append(ray_call(hosted.handle.state.remote(), REPLICA_CALL_TIMEOUT_MS))
                    continue
                hosted.handle.set_controller.remote(me)  # again: a restarted replica forgot it
                rate = s.throttle_bytes_per_sec
                if isinstance(s.command, BecomeLeader) and hosted.throttle_bytes_per_sec != rate:
                    hosted.handle.set_replication_throttle.remote(rate)
                    hosted.throttle_bytes_per_sec = rate
                calls.append(ray_call(_send_command(hosted.handle, s), REPLICA_CALL_TIMEOUT_MS))
            results = await asyncio.gather(*calls, return_exceptions=True)
            dead = []
            for key, result in zip(keys, results, strict=True):
                if _is_dead(result):  # re-created from its WAL by the next apply
                    dead.append(key)
                    log.warning("broker %d: replica %s-%d died", self.broker_id, *key)
                    gone = self._hosted.get(key)
                    if gone is not None and gone.offline is None:
                        self._hosted.pop(key)  # an offline one waits for _retry_offline
                elif isinstance(result, BaseException):
                    log.warning(
                        "broker %d: replica %s-%d refused its command: %r",
                        self.broker_id,
                        *key,
                        result,
                    )
            if dead:
                raise BrokerNotAvailableError(f"replicas {dead} died; re-creating them")
            if leaders:
                self._applied_epoch = max(self._applied_epoch, metadata_epoch)
            return [r for r in results if isinstance(r, ReplicaState)]

    def _log_dir(self, topic: str, partition: int) -> Path:
        return self.dir / f"{topic}-{partition}"

    async def _ensure(self, spec: ReplicaSpec) -> None:
        key = (spec.topic, spec.partition)
        hosted = self._hosted.get(key)
        replica_config = self._replica_config(spec.configs)
        if hosted is not None and hosted.topic_id == spec.topic_id:
            if hosted.configs == spec.configs or hosted.offline is not None:
                # An offline replica is re-created only by _retry_offline (with the configs of
                # its latest spec), once the controller has recorded it offline: a new actor
                # sooner would be told to lead again the epoch whose unsynced writes its log
                # lost, while its followers hold other records at those offsets.
                return
            # Changed configs apply in place (Kafka's dynamic topic configs), unless the
            # replication mode changed: then the replica is re-created from its WAL.
            try:
                applied = await ray_call(
                    hosted.handle.reconfigure.remote(dict(spec.configs), replica_config),
                    REPLICA_CALL_TIMEOUT_MS,
                )
            except BrokerNotAvailableError:
                applied = False  # the replica died: re-created below, with the new configs
            if applied:
                hosted.configs = dict(spec.configs)
                return
        if hosted is not None:
            # The replication mode changed (re-created from its WAL) or the topic was
            # re-created (wiped).
            await self._remove(key, delete_data=hosted.topic_id != spec.topic_id)
        log_dir = self._log_dir(spec.topic, spec.partition)
        id_file = log_dir.with_name(log_dir.name + TOPIC_ID_SUFFIX)
        if id_file.exists() and id_file.read_text() != spec.topic_id:
            delete_replica_data(log_dir)  # data of an older topic of that name
        id_file.write_text(spec.topic_id)
        name = replica_actor_name(spec.topic, spec.partition, self.broker_id)
        handle = None
        starting = self._starting.pop(key, None)
        if starting is not None and starting[1] == spec.topic_id:
            handle = starting[0]  # created by an earlier apply, not answering yet then
        elif starting is not None:
            await self._stop(key, starting[0])
        for _ in range(0 if handle is not None else NAME_RETRY_MAX):
            try:
                # Off the event loop: creating a named actor waits for the GCS to register the
                # name, and a broker starting a topic's replicas must keep heartbeating.
                handle = await asyncio.to_thread(
                    self._create_replica, name, spec, log_dir, replica_config
                )
                break
            except ValueError:  # the name is still held by a dying incarnation
                await asyncio.sleep(NAME_RETRY_S)
        if handle is None:
            raise RequestTimedOutError(f"replica actor name {name} stayed taken")
        try:
            await ray_call(handle.ping.remote(), REPLICA_START_TIMEOUT_MS)
        except RequestTimedOutError:
            # Still starting (a loaded machine): the next apply waits for this same actor
            # instead of starting it over; this one fails, so the push is made again.
            self._starting[key] = (handle, spec.topic_id)
            raise
        handle.set_controller.remote(self._self())
        if self._lease_until_ms > monotonic_ms():
            handle.set_session_lease.remote(self._lease_until_ms)
        self._hosted[key] = _Hosted(handle, spec.topic_id, dict(spec.configs))

    def _create_replica(
        self, name: str, spec: ReplicaSpec, log_dir: Path, replica_config: ReplicaConfig
    ) -> Any:
        """A new ReplicaActor named ``name``; ValueError while the name is taken."""
        return ReplicaActor.options(  # type: ignore[attr-defined]
            name=name,
            namespace=NAMESPACE,
            scheduling_strategy=NodeAffinitySchedulingStrategy(self._node_id, soft=False),
            # Not restarted by Ray: a replica pinned to a dead node would hold its name
            # forever. The broker re-creates a dead replica from its WAL instead.
            max_restarts=0,
        ).remote(
            spec.topic,
            spec.partition,
            self.broker_id,
            str(log_dir),
            dict(spec.configs),
            replica_config,
            session_lease=True,
            retention_check_interval_ms=self._config.log_retention_check_interval_ms,
            cleaner_backoff_ms=self._config.log_cleaner_backoff_ms,
            tls=self._leaf,
            topic_id=spec.topic_id,
            remote_store=self._remote_store,
            remote_log_manager_interval_ms=self._config.remote_log_manager_task_interval_ms,
        )

    def _replica_config(self, configs: dict[str, str]) -> ReplicaConfig:
        cfg = config_keys.effective(configs)
        return ReplicaConfig(
            replica_lag_time_max_ms=self._config.replica_lag_time_max_ms,
            fetch_max_bytes=self._config.replica_fetch_max_bytes,
            min_insync_replicas=cfg.min_insync_replicas,
            replication_mode=cfg.replication_mode,
            unclean_leader_election_enable=cfg.unclean_leader_election_enable,
            acks_before_fsync=cfg.flush_messages > 1,
            remote_storage=cfg.remote_storage_enable,
        )

    async def _remove(self, key: tuple[str, int], *, delete_data: bool) -> None:
        """Stop a replica actor, wait (bounded) until Ray confirms it dead, maybe drop its data."""
        hosted = self._hosted.pop(key)
        await self._stop(key, hosted.handle)
        if delete_data:
            delete_replica_data(self._log_dir(*key))

    async def _stop(self, key: tuple[str, int], handle: Any) -> None:
        """Kill a replica actor and wait (bounded) until Ray confirms it dead."""
        ray.kill(handle, no_restart=True)
        # Bounded in time too: this runs under the apply lock, and a replica that neither dies
        # nor answers must not hold up every later apply (the data goes by rename regardless).
        deadline = monotonic_ms() + REMOVE_CONFIRM_MS
        for _ in range(NAME_RETRY_MAX):
            remaining_ms = deadline - monotonic_ms()
            if remaining_ms <= 0:
                log.warning("broker %d: replica %s-%d not confirmed dead", self.broker_id, *key)
                break
            try:
                await ray_call(handle.ping.remote(), min(REPLICA_CALL_TIMEOUT_MS, remaining_ms))
            except BrokerNotAvailableError:
                break
            except RequestTimedOutError:
                continue
            await asyncio.sleep(NAME_RETRY_S)

    def _remove_stray_dirs(self, wanted: dict[tuple[str, int], ReplicaSpec]) -> None:
        """Delete data of partitions no longer assigned here (a topic deleted while down) and
        what an interrupted deletion left behind."""
        keep = {self._log_dir(t, p).name for t, p in wanted}
        for id_file in self.dir.glob(f"*{TOPIC_ID_SUFFIX}"):
            name = id_file.name.removesuffix(TOPIC_ID_SUFFIX)
            if name not in keep:
                delete_replica_data(self.dir / name)
        for doomed in self.dir.glob(f"*{DELETED_SUFFIX}"):
            shutil.rmtree(doomed, ignore_errors=True)

    # --- AlterPartition relay ---------------------------------------------------------------------

    async def alter_partition(
        self, topic: str, partition: int, request: AlterPartitionRequest, replica: Any
    ) -> None:
        """A leader replica's proposal: forward with this broker's id and epoch, answer back."""
        try:
            response = await self._call_controller(
                "alter_partition", self.broker_id, self._broker_epoch, topic, partition, request
            )
        except RaylogError as exc:
            log.info("AlterPartition %s-%d not answered: %s", topic, partition, exc)
            return  # the replica resends after alter_partition_timeout_ms
        replica.alter_partition_response.remote(response)

    # --- controlled shutdown ----------------------------------------------------------------

    async def shutdown(self) -> bool:
        """Controlled shutdown: leadership moves away first, then replicas stop. Returns True
        when the controller confirmed this broker leads nothing any more."""
        self._ensure_loop_state()
        moved = False
        try:
            moved = bool(
                await self._call_controller(
                    "controlled_shutdown",
                    self.broker_id,
                    self.incarnation_id,
                    timeout_ms=60_000,
                )
            )
        except RaylogError as exc:
            log.warning("broker %d controlled shutdown not confirmed: %s", self.broker_id, exc)
        await self._stop_replicas(together=False)
        return moved

    async def stop(self) -> None:
        """Stop without moving leadership: the whole cluster stops, its controllers first, so
        the metadata keeps every leader and ISR as they were for the next start."""
        self._ensure_loop_state()
        await self._stop_replicas(together=True)

    async def _stop_replicas(self, *, together: bool) -> None:
        """Stop every hosted replica: all at once when the whole cluster stops (no controller
        is watching), else one by one, so that a broker going away alone does not burst its
        replicas' deaths onto the machine the other brokers' sessions run on."""
        self._stopping = True
        if self._heartbeater is not None:
            self._heartbeater.cancel()
        keys = list(self._hosted)
        for handle, _ in self._starting.values():
            ray.kill(handle, no_restart=True)
        self._starting.clear()
        if together:
            await asyncio.gather(*(self._remove(key, delete_data=False) for key in keys))
        else:
            for key in keys:
                await self._remove(key, delete_data=False)
        # The controller sees the sentinel die and fences this broker, which leads nothing now
        # (after a controlled shutdown) or is stopping with the whole cluster.
        if self._sentinel is not None:
            ray.kill(self._sentinel, no_restart=True)


__all__ = ["BrokerActor", "delete_replica_data", "read_or_write_broker_id"]
