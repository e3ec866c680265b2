"""The Ray node watcher: one broker and one gateway per Ray node with the ``raylog`` resource.

This module owns how a real (autoscaled) Ray cluster gets its brokers (`raylog up --address`).
A :class:`NodeWatcherActor` polls ``ray.nodes()`` every ``poll_ms`` and compares what it sees
with the brokers the supervisor runs on nodes, using the pure :func:`plan`:

- an alive node with the ``raylog`` resource and no broker gets a ``BrokerActor`` and a
  ``GatewayActor`` pinned to it (hard node affinity), started by the supervisor
  (``SupervisorActor.add_broker``, the same start as an embedded broker's) so that `raylog up`
  owns them and `raylog brokers ...` and the controlled shutdown work as in the embedded
  cluster. Rack from the node's ``raylog.rack`` label; the gateway listens on the node's address
  and on the port in its ``raylog.port`` label, else the watcher's ``broker_port`` (on a real
  cluster every node is its own machine; tests run several on one and label each a port). The
  broker id is the one persisted in the node's data directory
  (``<data>/broker-<id>/meta.properties``, read on that node by a small pinned task), so a
  machine that comes back keeps its id; a node with no broker directory gets an id above every
  id the cluster has known;
- a node that died has its broker fenced and its partitions re-elected at once: the watcher
  tells the controller (``broker_node_died``), which runs the same fast path as when Ray reports
  the broker's own death (Ray has confirmed the node, hence every replica on it, dead), and the
  supervisor, which forgets the pair (its actors died with the node);
- a node that comes up with the data of a broker decommissioned before (its node given back to
  the autoscaler, which now starts one again) is new capacity: its decommission is cancelled;
- a node Ray is draining (a spot instance's preemption notice, ``ray drain-node``: Ray lists it
  with its deadline) has its broker decommissioned (the controller's ``decommission``: marked
  draining, every replica moved to the other brokers) so that its partitions are whole
  elsewhere before the node goes. A refusal (a partition's replication factor needs the
  broker) is logged, and asked again every ``DRAIN_RETRY_MS``.

The node's data directory is the watcher's ``data_dir`` unless the node has a ``raylog.data-dir``
label: an absolute path, or a name under ``data_dir`` (``ray start --labels`` takes no ``/`` in
a value). The watcher keeps no state of its own (the supervisor's ``brokers_by_node`` is the
truth), so a watcher Ray restarts carries on. It is off in the embedded cluster, where the
supervisor starts the brokers `raylog up --brokers` asks for.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raylog.actors import logs
from raylog.actors.broker import META_FILE
from raylog.actors.calls import NAMESPACE, SUPERVISOR_ACTOR_NAME, controller_actor_name, ray_call
from raylog.actors.cluster.supervisor import BrokerSpec
from raylog.actors.control import config_keys
from raylog.actors.control import listeners as listeners_
from raylog.storage.errors import (
    BrokerNotAvailableError,
    NotControllerError,
    RaylogError,
    one_line,
)

log = logging.getLogger(__name__)

RAYLOG_RESOURCE = "raylog"
RACK_LABEL = "raylog.rack"
DATA_DIR_LABEL = "raylog.data-dir"
PORT_LABEL = "raylog.port"
POLL_MS_DEFAULT = 500
DRAIN_RETRY_MS = 10_000  # a refused decommission of a draining node's broker is asked again
CALL_TIMEOUT_MS = 10_000
ADD_BROKER_TIMEOUT_MS = 240_000  # the supervisor bounds each step (gateway 90 s, register 60 s)
_BROKER_DIR = re.compile(r"broker-(\d+)")
_NO_ANSWER: Any = object()  # _call_controller: no controller answered as the active one


class NodeView(msgspec.Struct, frozen=True):
    """What the watcher needs of one Ray node."""

    node_id: str
    alive: bool
    raylog: bool  # carries the ``raylog`` resource: it should run a broker
    rack: str | None = None
    address: str = "127.0.0.1"
    data_dir: str | None = None  # the ``raylog.data-dir`` label, if any
    port: int | None = None  # the ``raylog.port`` label, if any (and a valid port)


class WatchPlan(msgspec.Struct, frozen=True):
    """``start``: nodes that need a broker; ``lost``: broker ids whose node died or left."""

    start: list[NodeView]
    lost: list[int]


def parse_nodes(raw: Iterable[Mapping[str, Any]]) -> list[NodeView]:
    """``ray.nodes()`` entries as :class:`NodeView`, by node id."""
    out = []
    for n in raw:
        labels = n.get("Labels") or {}
        out.append(
            NodeView(
                node_id=str(n["NodeID"]),
                alive=bool(n.get("Alive")),
                raylog=float((n.get("Resources") or {}).get(RAYLOG_RESOURCE, 0)) > 0,
                rack=labels.get(RACK_LABEL),
                address=str(n.get("NodeManagerAddress") or "127.0.0.1"),
                data_dir=labels.get(DATA_DIR_LABEL),
                port=_port(labels.get(PORT_LABEL)),
            )
        )
    return sorted(out, key=lambda v: v.node_id)


def _port(label: str | None) -> int | None:
    """A ``raylog.port`` label as a port; None when absent or not a port (the default is used)."""
    if label is None or not label.isdigit() or not 0 < int(label) < 65536:
        if label is not None:
            log.warning("ignoring label %s=%r: not a port", PORT_LABEL, label)
        return None
    return int(label)


def node_data_dir(view: NodeView, default: str) -> str:
    """The node's data directory: its label (absolute, or a name under ``default``) or
    ``default``."""
    return str(Path(default) / view.data_dir) if view.data_dir else default


def plan(nodes: Sequence[NodeView], brokers_by_node: Mapping[str, int]) -> WatchPlan:
    """Which nodes need a broker and which brokers lost their node.

    A node that Ray lists as dead, or no longer lists at all, loses its broker; an alive
    ``raylog`` node without one gets one (a node that lost the resource keeps its broker: moving
    replicas off it is a reassignment, not the watcher's call).
    """
    alive = {n.node_id for n in nodes if n.alive}
    start = [n for n in nodes if n.alive and n.raylog and n.node_id not in brokers_by_node]
    lost = sorted(b for node, b in brokers_by_node.items() if node not in alive)
    return WatchPlan(start=start, lost=lost)


def choose_broker_id(
    on_disk: Sequence[int], in_use: Iterable[int], known: Iterable[int] = ()
) -> int:
    """The node's persisted id when it has exactly one that no running broker uses; else a new
    id above every id in use, on disk or ``known`` (e.g. a dead node's broker, which may come
    back: its replicas are still assigned to its id)."""
    used = set(in_use)
    mine = [b for b in on_disk if b not in used]
    if len(mine) == 1 and len(on_disk) == 1:
        return mine[0]
    return max(used | set(known) | set(on_disk), default=0) + 1


def broker_ids_in(data_dir: str) -> list[int]:
    """Broker ids persisted under ``data_dir`` (``broker-<id>/meta.properties``)."""
    root = Path(data_dir)
    if not root.is_dir():
        return []
    ids = []
    for d in root.iterdir():
        m = _BROKER_DIR.fullmatch(d.name)
        if m and (d / META_FILE).is_file():
            ids.append(int(m.group(1)))
    return sorted(ids)


@ray.remote(num_cpus=0, max_retries=0, enable_task_events=False)
def _broker_ids_on_node(data_dir: str) -> list[int]:
    return broker_ids_in(data_dir)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, enable_task_events=False)
class NodeWatcherActor:
    """Has the supervisor start a broker + gateway on every ``raylog`` node; reports the nodes
    that die to the controller and the supervisor."""

    def __init__(
        self,
        data_dir: str,
        *,
        supervisor_name: str = SUPERVISOR_ACTOR_NAME,
        controller_names: tuple[str, ...] = (controller_actor_name(0), controller_actor_name(1)),
        broker_configs: dict[str, str] | None = None,
        broker_port: int = 9092,
        poll_ms: int = POLL_MS_DEFAULT,
    ) -> None:
        logs.configure()  # timestamped lines in this worker's log
        self._supervisor_name = supervisor_name  # by name: a handle would be a stored argument
        self._supervisor: Any = None
        self._data_dir = data_dir
        self._controller_names = tuple(controller_names)
        self._broker_configs = dict(broker_configs or {})
        self._port = broker_port
        config = config_keys.broker_config(self._broker_configs)
        self._listeners = listeners_.configured(
            config, default=listeners_.RAY_CLUSTER_DEFAULT.format(port=broker_port)
        )
        self._poll_ms = poll_ms
        self._starting: dict[str, tuple[int, asyncio.Task[None]]] = {}  # node id -> broker id
        self._fencing: set[int] = set()  # lost brokers no controller has heard of yet
        self._decommissioned: set[int] = set()  # brokers of draining nodes, decommission started
        self._drain_retry_at: dict[int, float] = {}  # broker id -> next ask (monotonic s)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """No more rounds and no more starts (`raylog up` is stopping the brokers)."""
        for task in [self._task, *(t for _, t in self._starting.values())]:
            if task is not None:
                task.cancel()
        self._task = None

    async def brokers(self) -> dict[str, int]:
        """Node id -> broker id of the brokers on nodes (running, or being started)."""
        return await self._brokers_by_node()

    async def _loop(self) -> None:
        while True:  # the actor's lifetime; one bounded round per poll
            try:
                await self.poll_once()
            except Exception:
                log.exception("node watcher round failed")
            await asyncio.sleep(self._poll_ms / 1000)

    async def _sup(self) -> Any:
        if self._supervisor is None:
            self._supervisor = await asyncio.wait_for(
                asyncio.to_thread(ray.get_actor, self._supervisor_name, namespace=NAMESPACE),
                CALL_TIMEOUT_MS / 1000,
            )
        return self._supervisor

    async def _brokers_by_node(self) -> dict[str, int]:
        sup = await self._sup()
        running = await ray_call(sup.brokers_by_node.remote(), CALL_TIMEOUT_MS)
        return {**running, **{n: b for n, (b, _) in self._starting.items()}}

    async def poll_once(self) -> WatchPlan:
        """One round: start brokers on new nodes, report lost ones. Returns what it decided."""
        # Bounded: a round that gets no answer fails (logged) and the next one asks again.
        nodes = parse_nodes(
            await asyncio.wait_for(asyncio.to_thread(ray.nodes), CALL_TIMEOUT_MS / 1000)
        )
        by_node = await self._brokers_by_node()
        decided = plan(nodes, by_node)
        await self._decommission_draining(by_node)
        for broker_id in decided.lost:
            node = next(n for n, b in by_node.items() if b == broker_id)
            if broker_id not in self._fencing:  # once, not every round until a controller hears
                log.warning("node %s of broker %d is gone: fencing it", node, broker_id)
                self._fencing.add(broker_id)
            if await self._call_controller("broker_node_died", broker_id) is _NO_ANSWER:
                # No active controller (one is taking over): the broker stays reported lost,
                # so the next round tells the new one, which fences it at once instead of
                # after its session expires.
                continue
            self._fencing.discard(broker_id)
            starting = self._starting.pop(node, None)
            if starting is not None:
                starting[1].cancel()
            await ray_call((await self._sup()).node_lost.remote(broker_id), CALL_TIMEOUT_MS)
        if decided.start:
            md = await self._call_controller("metadata")
            if md is _NO_ANSWER:
                return decided  # no active controller yet: the next round starts them
            in_use = set(by_node.values())
            for view in decided.start:
                broker_id = await self._choose_id(view, in_use, md.brokers)
                in_use.add(broker_id)
                reg = md.brokers.get(broker_id)
                if reg is not None and reg.draining:
                    await self._returning(view, broker_id)
                self._start_broker(view, broker_id, md.cluster_id)
        return decided

    async def _decommission_draining(self, by_node: Mapping[str, int]) -> None:
        """Start the decommission of the broker of each node Ray is draining (once accepted;
        a refusal is asked again after ``DRAIN_RETRY_MS``)."""
        try:
            draining = await asyncio.wait_for(
                asyncio.to_thread(_draining_nodes), CALL_TIMEOUT_MS / 1000
            )
        except Exception as exc:  # Ray's private API moved or did not answer: no drains seen
            log.debug("draining nodes not known: %s", one_line(exc))
            return
        now = time.monotonic()
        for node, broker_id in sorted(by_node.items()):
            if node not in draining or broker_id in self._decommissioned:
                continue
            if now < self._drain_retry_at.get(broker_id, 0.0):
                continue
            self._drain_retry_at[broker_id] = now + DRAIN_RETRY_MS / 1000
            try:
                started = await self._call_controller(
                    "decommission", broker_id, None, refusals=True
                )
            except RaylogError as exc:
                log.warning(
                    "Ray is draining node %s: broker %d cannot be decommissioned yet: %s",
                    node,
                    broker_id,
                    one_line(exc),
                )
                continue
            if started is _NO_ANSWER:
                continue
            self._decommissioned.add(broker_id)
            log.warning(
                "Ray is draining node %s (deadline %s): broker %d decommissioned, %d partitions "
                "moving off it",
                node,
                draining[node] or "none",
                broker_id,
                len(started),
            )

    async def _returning(self, view: NodeView, broker_id: int) -> None:
        """A node comes up with the data of a broker decommissioned before its node went (given
        back to the autoscaler, or drained): new capacity, so the broker takes replicas again."""
        answer = await self._call_controller("cancel_decommission", broker_id)
        self._decommissioned.discard(broker_id)
        if answer is not _NO_ANSWER:
            log.info(
                "node %s brings back broker %d, decommissioned before: it takes replicas again",
                view.node_id,
                broker_id,
            )

    async def _choose_id(self, view: NodeView, in_use: set[int], known: Iterable[int]) -> int:
        """The id persisted on the node (read there by a pinned task) unless it is taken."""
        pinned = NodeAffinitySchedulingStrategy(view.node_id, soft=False)
        on_disk = await ray_call(
            _broker_ids_on_node.options(scheduling_strategy=pinned).remote(
                node_data_dir(view, self._data_dir)
            ),
            CALL_TIMEOUT_MS,
        )
        return choose_broker_id(on_disk, in_use, known)

    def _start_broker(self, view: NodeView, broker_id: int, cluster_id: str) -> None:
        """Ask the supervisor for the pair, in the background (a start takes seconds; the rounds
        go on meanwhile, so a node dying elsewhere is still seen at once)."""
        # The node's raylog.port label moves every listener's port by as much as the first's.
        first = self._listeners[0].port
        own = listeners_.for_broker(
            self._listeners, view.port - first if view.port else 0, view.address
        )
        spec = BrokerSpec(
            broker_id=broker_id,
            rack=view.rack or "",
            host=own[0].advertised_host,
            port=own[0].advertised_port,
            listeners=own,
            data_dir=node_data_dir(view, self._data_dir),
            cluster_id=cluster_id,
            controller_names=self._controller_names,
            broker_configs=self._broker_configs,
            node_id=view.node_id,
        )
        task = asyncio.get_running_loop().create_task(self._add(spec))
        self._starting[view.node_id] = (broker_id, task)
        log.info("node %s (rack %s): starting broker %d", view.node_id, view.rack, broker_id)

    async def _add(self, spec: BrokerSpec) -> None:
        try:
            sup = await self._sup()
            await ray_call(sup.add_broker.remote(spec), ADD_BROKER_TIMEOUT_MS)
            log.info("broker %d started on node %s", spec.broker_id, spec.node_id)
        except Exception as exc:  # the supervisor marked it lost: the next round tries again
            log.warning("broker %d on node %s: %s", spec.broker_id, spec.node_id, one_line(exc))
        finally:
            if self._starting.get(str(spec.node_id), (None,))[0] == spec.broker_id:
                del self._starting[str(spec.node_id)]

    async def _call_controller(self, method: str, *args: Any, refusals: bool = False) -> Any:
        """Call the active controller; :data:`_NO_ANSWER` when none answers as the active one
        (the next round retries). ``refusals``: the active one's refusal (a RaylogError it
        raised) is raised here, not logged and passed over."""
        for name in self._controller_names:  # bounded: one attempt per controller
            try:
                handle = await asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE)
                return await ray_call(getattr(handle, method).remote(*args), CALL_TIMEOUT_MS)
            except (ValueError, NotControllerError):
                continue
            except RaylogError as exc:
                if refusals and not isinstance(exc, BrokerNotAvailableError):  # its own answer
                    raise
                log.warning("controller %s %s failed: %s", name, method, exc)
        return _NO_ANSWER


def _draining_nodes() -> dict[str, int]:
    """Node id -> drain deadline (ms since the epoch; 0: none) of the nodes Ray is draining
    (Ray's own accessor, in a thread: a GCS round trip)."""
    # Here, not at the top: a private module of Ray's that a later Ray may move, which must
    # cost only this (the caller logs it), not the watcher's import.
    from ray._private.state import state

    return dict(state.get_draining_nodes())


__all__ = [
    "NodeView",
    "NodeWatcherActor",
    "WatchPlan",
    "broker_ids_in",
    "choose_broker_id",
    "node_data_dir",
    "parse_nodes",
    "plan",
]
