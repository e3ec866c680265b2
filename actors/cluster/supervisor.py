"""SupervisorActor: owns the embedded cluster's brokers and gateways, and starts, stops and kills
them on request (`raylog brokers start|stop|kill`).

Why an actor owned by `raylog up`, and not the CLI creating actors itself: a Ray actor lives as
long as its owner (the process that created it) unless it is detached. `raylog brokers start`
runs in a short-lived CLI process, so a broker it created would die when the command exits; a
detached one would outlive `raylog up` and leak when that process ends. The supervisor is created
by `raylog up` (not detached) and creates every broker and gateway itself, so all of them share
the fate of the `raylog up` process: when it exits, Ray removes them all. It also keeps the one
thing a restart needs that the metadata does not hold, the launch spec of each broker (id, rack,
data dir, port), so `brokers start ID` brings a broker back exactly as it was.

Lifecycle of one broker, as the supervisor sees it:

- ``running``: its BrokerActor and GatewayActor exist (the controller decides alive / fenced);
- ``stopped``: controlled shutdown done (`brokers stop`): leaderships moved, replicas stopped,
  both actors ended;
- ``killed``: `brokers kill` ended the broker actor, and with it (Ray fate-sharing: they are
  owned by the broker) its replica actors and session sentinel, and its gateway, with no
  clean-up; the controller learns it from the sentinel's death and fences it.

- ``lost``: (cluster mode) the Ray node it was pinned to died, and both actors with it; the
  node watcher adds it again (:meth:`SupervisorActor.add_broker`) when the node comes back.

A gateway whose process dies alone (a crash, the OOM killer) while its broker runs is
re-created and started again, the same spec, at once and then every ``GATEWAY_RESTART_BACKOFF_S``
while it fails: the broker still leads its partitions, and without its gateway no client could
reach them. The supervisor learns of the death from a call it keeps waiting on every gateway it
started (``wait_forever``), as the controller learns of a broker's from its session sentinel.
Clients see their connections reset, reconnect once the gateway listens again, and resend what
was in flight (idempotent producers' sequences make that exactly once).

On a real Ray cluster (``raylog up --address``) the supervisor starts no broker by itself: the
node watcher (``raylog.actors.cluster.node_watcher``) finds the Ray nodes that carry the ``raylog``
resource and asks :meth:`SupervisorActor.add_broker` for a broker and a gateway pinned to each
(``BrokerSpec.node_id``). The pair starts, and `raylog up` stops it, exactly as an embedded one.

Every call is bounded; a broker that cannot be started reports why in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Literal

import msgspec
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raylog.actors import logs
from raylog.actors.broker import BrokerActor
from raylog.actors.calls import NAMESPACE, broker_actor_name, gateway_actor_name, ray_call
from raylog.actors.control.listeners import Listener
from raylog.gateway.actor import GatewayActor
from raylog.storage.errors import RaylogError, one_line

log = logging.getLogger(__name__)

GATEWAY_START_TIMEOUT_MS = 90_000  # actor creation included: slow on a loaded machine
BROKER_SHUTDOWN_TIMEOUT_MS = 60_000
GATEWAY_STOP_TIMEOUT_MS = 15_000
REGISTER_TIMEOUT_S = 60.0  # a started broker registered with the controller
NAME_FREE_TIMEOUT_S = 10.0  # a killed actor's name is released shortly after its death
POLL_S = 0.05
STATUS_TIMEOUT_MS = 5_000  # a running broker answers status() in this long unless restarting
GATEWAY_RESTART_BACKOFF_S = 1.0  # between tries to re-create a gateway that died alone

Lifecycle = Literal["running", "stopped", "killed", "lost"]


class BrokerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything needed to start broker ``broker_id`` again exactly as before."""

    broker_id: int
    rack: str
    host: str
    port: int
    data_dir: str
    cluster_id: str
    controller_names: tuple[str, ...]
    broker_configs: dict[str, str] = {}
    node_id: str | None = None  # cluster mode: both actors pinned to this Ray node
    # The gateway's client listeners (listeners.for_broker's); none: PLAINTEXT on host:port.
    listeners: tuple[Listener, ...] = ()


async def ray_status(broker: Any, timeout_ms: int) -> Any:
    """``broker.status()`` with Ray's own exceptions (``ray_call`` folds them into one)."""

    async def call() -> Any:
        return await broker.status.remote()

    return await asyncio.wait_for(call(), timeout_ms / 1000)


class SupervisorError(Exception):
    """A supervisor request that cannot be done; the message is one line for the CLI."""


class _Running:
    def __init__(self, broker: Any, gateway: Any) -> None:
        self.broker = broker
        self.gateway = gateway


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=100, enable_task_events=False)
class SupervisorActor:
    """Starts, stops and kills the brokers and gateways of the cluster `raylog up` runs."""

    def __init__(self, specs: list[BrokerSpec]) -> None:
        logs.configure()  # timestamped lines in this worker's log
        self._specs = {s.broker_id: s for s in specs}
        self._running: dict[int, _Running] = {}
        self._lifecycle: dict[int, Lifecycle] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._watches: dict[int, asyncio.Task[None]] = {}  # on each started gateway

    def _lock(self, broker_id: int) -> asyncio.Lock:
        if broker_id not in self._specs:
            known = ",".join(str(b) for b in sorted(self._specs))
            raise SupervisorError(f"no broker {broker_id} in this cluster (brokers: {known})")
        return self._locks.setdefault(broker_id, asyncio.Lock())

    # --- what the CLI and the metrics endpoint read ----------------------------------------------

    async def lifecycle(self) -> dict[int, Lifecycle]:
        return {b: self._lifecycle.get(b, "stopped") for b in sorted(self._specs)}

    async def specs(self) -> list[BrokerSpec]:
        return [self._specs[b] for b in sorted(self._specs)]

    async def handles(self) -> dict[int, tuple[Any, Any]]:
        """broker id -> (broker, gateway) handles of the running brokers."""
        return {b: (r.broker, r.gateway) for b, r in sorted(self._running.items())}

    async def ready(self) -> bool:
        """Every running broker registered, and every running gateway serving metadata that
        lists all of them."""
        want = sorted(self._running)
        try:
            brokers = await asyncio.gather(
                *(ray_call(r.broker.status.remote(), 5_000) for r in self._running.values())
            )
            gateways = await asyncio.gather(
                *(ray_call(r.gateway.status.remote(), 5_000) for r in self._running.values())
            )
        except RaylogError:
            return False  # slow or restarting (brokers restart by themselves): ask again
        registered = all(s["broker_epoch"] > 0 for s in brokers)
        return registered and all(g["serving"] and g["brokers"] == want for g in gateways)

    async def serving(self) -> list[BrokerSpec]:
        """The running brokers that are registered and whose gateway serves metadata (cluster
        mode: the brokers `raylog up` announces)."""

        async def check(broker_id: int, running: _Running) -> BrokerSpec | None:
            try:
                broker, gateway = await asyncio.gather(
                    ray_call(running.broker.status.remote(), 5_000),
                    ray_call(running.gateway.status.remote(), 5_000),
                )
            except Exception:  # starting, slow, unschedulable or gone: not serving now
                return None
            ok = broker["broker_epoch"] > 0 and gateway["serving"]
            return self._specs[broker_id] if ok else None

        found = await asyncio.gather(*(check(b, r) for b, r in sorted(self._running.items())))
        return [s for s in found if s is not None]

    # --- start ----------------------------------------------------------------------------------

    async def start_all(self) -> None:
        """Start every broker, then every gateway (as `raylog up` does at start-up)."""
        for b in sorted(self._specs):
            self._create_broker(b)
        await asyncio.gather(*(self._start_gateway(b) for b in sorted(self._specs)))

    async def start_broker(self, broker_id: int) -> None:
        """`raylog brokers start`: the same id, rack, data dir and port; returns once the broker
        registered and its gateway listens."""
        async with self._lock(broker_id):
            how = self._lifecycle.get(broker_id)
            if how == "running" and not await self._gone_for_good(broker_id):
                if await self._registered(broker_id) is not False:
                    raise SupervisorError(
                        f"broker {broker_id} is already running (if it stays unregistered, "
                        f"`raylog brokers kill {broker_id}` first)"
                    )
                # Alive but not registered: its start never ran or failed. Start it again.
                log.warning("broker %d: alive but not registered; starting it", broker_id)
                broker = self._running[broker_id].broker
                with contextlib.suppress(RaylogError):  # its error is in the broker's log
                    await ray_call(broker.start.remote(), int(REGISTER_TIMEOUT_S * 1000))
                await self._wait_registered(broker_id)
                return
            if how == "running":  # its actor died (Ray gave up, or was told not to restart it)
                log.warning("broker %d: its actor died; starting a new one", broker_id)
                self._end(broker_id, "killed")
            if how == "lost" or not await self._node_alive(broker_id):
                # (Before the node watcher has seen the node die, too: a start there would only
                # wait for actors that can never be placed.)
                raise SupervisorError(
                    f"the Ray node of broker {broker_id} is gone; the broker starts again when "
                    "a node with its data dir joins"
                )
            await self._start_pair(broker_id)

    async def _node_alive(self, broker_id: int) -> bool:
        """Whether the Ray node a broker is pinned to is alive (True when it is not pinned)."""
        spec = self._specs.get(broker_id)
        if spec is None or spec.node_id is None:
            return True
        try:
            nodes = await asyncio.wait_for(asyncio.to_thread(ray.nodes), STATUS_TIMEOUT_MS / 1000)
        except TimeoutError:
            return True  # Ray did not say: try the start, bounded as before
        return any(n.get("NodeID") == spec.node_id and n.get("Alive") for n in nodes)

    async def _gone_for_good(self, broker_id: int) -> bool:
        """Whether a running broker's actor is dead for good (Ray gave up restarting it, or it
        was killed without restart): it answers nothing, ever."""
        return await self._dead(self._running[broker_id].broker)

    @staticmethod
    async def _dead(actor: Any) -> bool:
        """Whether ``actor`` is dead for good; slow, or being restarted by Ray
        (ActorUnavailableError), is not dead."""
        try:
            await ray_status(actor, STATUS_TIMEOUT_MS)
        except ray.exceptions.ActorDiedError:
            return True
        except (ray.exceptions.RayError, TimeoutError):
            return False
        return False

    async def _registered(self, broker_id: int) -> bool | None:
        """Whether a running broker is registered (None: it did not answer in time)."""
        try:
            status = await ray_call(self._running[broker_id].broker.status.remote(), 5_000)
        except RaylogError:
            return None
        return bool(status["broker_epoch"] > 0)

    async def _start_pair(self, broker_id: int) -> None:
        """Broker and gateway created, the gateway listening, the broker registered."""
        await self._wait_names_free(broker_id)
        self._create_broker(broker_id)
        await self._start_gateway(broker_id)
        await self._wait_registered(broker_id)

    # --- cluster mode: brokers on the nodes the node watcher found ------------------------------

    async def add_broker(self, spec: BrokerSpec) -> None:
        """Start broker ``spec.broker_id`` and its gateway on node ``spec.node_id`` (the node
        watcher's request); returns once the broker registered and its gateway listens.

        Idempotent for a broker already running on that node. A broker id that ran on another
        node (a machine that came back as a new Ray node) takes the new node. A start that fails
        leaves the broker ``lost``, so the watcher asks again on its next round."""
        lock = self._locks.setdefault(spec.broker_id, asyncio.Lock())
        async with lock:
            if self._lifecycle.get(spec.broker_id) == "running":
                if self._specs[spec.broker_id].node_id == spec.node_id:
                    return
                self._end(spec.broker_id, "lost")
            self._specs[spec.broker_id] = spec
            try:
                await self._start_pair(spec.broker_id)
            except BaseException:
                if spec.broker_id in self._running:
                    self._end(spec.broker_id, "lost")
                self._lifecycle[spec.broker_id] = "lost"
                raise

    async def node_lost(self, broker_id: int) -> None:
        """The node of ``broker_id`` died (the node watcher saw it): its actors died with it."""
        lock = self._locks.setdefault(broker_id, asyncio.Lock())
        async with lock:
            if broker_id in self._running:
                self._end(broker_id, "lost")
            elif broker_id in self._specs:
                self._lifecycle[broker_id] = "lost"

    async def brokers_by_node(self) -> dict[str, int]:
        """Ray node id -> broker id of every pinned broker whose node has not been lost (running,
        stopped or killed on purpose: the watcher leaves those alone)."""
        return {
            s.node_id: b
            for b, s in sorted(self._specs.items())
            if s.node_id is not None and self._lifecycle.get(b) != "lost"
        }

    def _placement(self, broker_id: int) -> dict[str, Any]:
        """Where a broker's actors go: pinned to its node, if it has one. Hard: a broker belongs
        to its node's disk; if the node dies, so does the pair."""
        node_id = self._specs[broker_id].node_id
        if node_id is None:
            return {}
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}

    def _create_broker(self, broker_id: int) -> None:
        spec = self._specs[broker_id]
        broker = BrokerActor.options(  # type: ignore[attr-defined]
            name=broker_actor_name(broker_id), namespace=NAMESPACE, **self._placement(broker_id)
        ).remote(
            broker_id,
            spec.data_dir,
            rack=spec.rack,
            host=spec.host,
            port=spec.port,
            controller_names=spec.controller_names,
            broker_configs=spec.broker_configs,
            endpoints=tuple(listener.endpoint() for listener in spec.listeners),
        )
        self._running[broker_id] = _Running(broker, self._new_gateway(broker_id))
        self._lifecycle[broker_id] = "running"

    def _new_gateway(self, broker_id: int) -> Any:
        spec = self._specs[broker_id]
        return GatewayActor.options(  # type: ignore[attr-defined]
            name=gateway_actor_name(broker_id), namespace=NAMESPACE, **self._placement(broker_id)
        ).remote(
            broker_id,
            spec.cluster_id,
            host=spec.host,
            port=spec.port,
            controller_names=spec.controller_names,
            broker_configs=spec.broker_configs,
            listeners=spec.listeners,
        )

    async def _start_gateway(self, broker_id: int) -> None:
        gateway = self._running[broker_id].gateway
        try:
            await ray_call(gateway.start.remote(), GATEWAY_START_TIMEOUT_MS)
        except Exception as exc:
            raise SupervisorError(f"gateway of broker {broker_id}: {one_line(exc)}") from None
        self._watch(broker_id, gateway)

    def _watch(self, broker_id: int, gateway: Any) -> None:
        previous = self._watches.pop(broker_id, None)
        if previous is not None and previous is not asyncio.current_task():
            previous.cancel()
        self._watches[broker_id] = asyncio.get_running_loop().create_task(
            self._on_gateway_death(broker_id, gateway)
        )

    async def _on_gateway_death(self, broker_id: int, gateway: Any) -> None:
        """Wait for ``gateway`` to die; if its broker still runs with it, start a new one
        (module docstring)."""
        try:
            await gateway.wait_forever.remote()
        except ray.exceptions.ActorDiedError:
            pass
        except ray.exceptions.RayError as exc:  # unreachable, not known dead: looked at below
            log.warning("gateway of broker %d: watch failed (%s)", broker_id, exc)
        while True:  # bounded by the pair's lifecycle: ends once it is ended or replaced
            async with self._lock(broker_id):
                running = self._running.get(broker_id)
                if running is None or running.gateway is not gateway:
                    return  # ended on purpose, or replaced
                if not await self._dead(gateway):
                    self._watch(broker_id, gateway)  # alive after all
                    return
                # A broker that does not answer is down too (its node died, say): that path
                # restarts the pair (node_lost, `brokers start`), not this one.
                if await self._answers(running.broker):
                    replaced = await self._replace_gateway(broker_id, running)
                    if replaced is None:
                        return
                    gateway = replaced
            await asyncio.sleep(GATEWAY_RESTART_BACKOFF_S)

    async def _replace_gateway(self, broker_id: int, running: _Running) -> Any | None:
        """Start a new gateway for a running broker whose gateway died (the caller holds the
        broker's lock): None once it listens (and is watched), else the gateway actor that is
        now the pair's, dead or ended, for the next try."""
        log.warning("gateway of broker %d died; starting a new one", broker_id)
        # Ray keeps the name of an actor whose process died (rather than one it was told to
        # kill) taken while its owner lives: killing it through Ray releases the name.
        with contextlib.suppress(Exception):
            ray.kill(running.gateway, no_restart=True)
        try:
            await self._wait_name_free(gateway_actor_name(broker_id))
        except SupervisorError as exc:
            log.warning("gateway of broker %d not restarted yet: %s", broker_id, exc)
            return running.gateway
        fresh = self._new_gateway(broker_id)
        self._running[broker_id] = _Running(running.broker, fresh)
        try:
            await self._start_gateway(broker_id)
        except SupervisorError as exc:
            log.warning("gateway of broker %d not restarted yet: %s", broker_id, exc)
            # Ended (its port still taken, say), so the next try finds it dead.
            with contextlib.suppress(Exception):
                ray.kill(fresh, no_restart=True)
            return fresh
        return None

    @staticmethod
    async def _answers(actor: Any) -> bool:
        try:
            await ray_status(actor, STATUS_TIMEOUT_MS)
        except (ray.exceptions.RayError, TimeoutError):
            return False
        return True

    async def _wait_registered(self, broker_id: int) -> None:
        deadline = time.monotonic() + REGISTER_TIMEOUT_S
        while time.monotonic() < deadline:
            if await self._registered(broker_id):
                return
            await asyncio.sleep(POLL_S)
        raise SupervisorError(f"broker {broker_id} did not register within {REGISTER_TIMEOUT_S} s")

    async def _wait_names_free(self, broker_id: int) -> None:
        """A dead actor keeps its name for a moment; a new one with that name fails until then."""
        deadline = time.monotonic() + NAME_FREE_TIMEOUT_S
        for name in (broker_actor_name(broker_id), gateway_actor_name(broker_id)):
            await self._wait_name_free(name, deadline)

    @staticmethod
    async def _wait_name_free(name: str, deadline: float | None = None) -> None:
        deadline = deadline if deadline is not None else time.monotonic() + NAME_FREE_TIMEOUT_S
        while True:
            try:
                await asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE)
            except ValueError:
                return  # free
            if time.monotonic() >= deadline:
                raise SupervisorError(f"actor name {name} still taken; try again")
            await asyncio.sleep(POLL_S)

    # --- stop and kill --------------------------------------------------------------------------

    async def stop_broker(self, broker_id: int) -> bool:
        """`raylog brokers stop`: controlled shutdown (leaderships move first), then the broker
        and its gateway end. Returns True when the controller confirmed the broker led nothing."""
        async with self._lock(broker_id):
            running = self._running.get(broker_id)
            if running is None:
                raise SupervisorError(f"broker {broker_id} is not running")
            try:
                moved = bool(
                    await ray_call(running.broker.shutdown.remote(), BROKER_SHUTDOWN_TIMEOUT_MS)
                )
            except RaylogError as exc:
                raise SupervisorError(f"broker {broker_id} controlled shutdown: {exc}") from None
            with contextlib.suppress(RaylogError):
                await ray_call(running.gateway.stop.remote(), GATEWAY_STOP_TIMEOUT_MS)
            self._end(broker_id, "stopped")
            return moved

    async def kill_broker(self, broker_id: int) -> None:
        """`raylog brokers kill`: a crash. The broker actor is killed (its replicas and sentinel,
        owned by it, die with it) and so is its gateway; nothing is shut down cleanly."""
        async with self._lock(broker_id):
            if broker_id not in self._running:
                raise SupervisorError(f"broker {broker_id} is not running")
            self._end(broker_id, "killed")

    def _end(self, broker_id: int, how: Lifecycle) -> None:
        watch = self._watches.pop(broker_id, None)
        if watch is not None:
            watch.cancel()
        running = self._running.pop(broker_id)
        for handle in (running.broker, running.gateway):
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        self._lifecycle[broker_id] = how

    # --- what `raylog up` calls when it stops ---------------------------------------------------

    async def stop_gateways(self) -> None:
        """Every running gateway stops listening; one that fails does not hold up the others
        (the first failure is raised once all are done)."""
        results = await asyncio.gather(
            *(
                ray_call(r.gateway.stop.remote(), GATEWAY_STOP_TIMEOUT_MS)
                for r in self._running.values()
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def running(self) -> list[int]:
        """Ids of the running brokers."""
        return sorted(self._running)

    async def stop_brokers(self) -> None:
        """Every running broker stops its replicas at once, leadership left where it is (the
        controllers stopped first); one that fails does not hold up the others (the first
        failure is raised once all are done)."""
        results = await asyncio.gather(
            *(
                ray_call(r.broker.stop.remote(), BROKER_SHUTDOWN_TIMEOUT_MS)
                for r in self._running.values()
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def kill_all(self) -> None:
        for broker_id in list(self._running):
            self._end(broker_id, "stopped")


__all__ = ["BrokerSpec", "SupervisorActor", "SupervisorError"]
