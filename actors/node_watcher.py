"""The Ray node watcher: one broker per Ray node that carries the ``raylog`` resource.

This module owns how a real (autoscaled) Ray cluster gets its brokers. A
:class:`NodeWatcherActor` polls ``ray.nodes()`` every ``poll_ms`` and compares what it sees with
the brokers it runs, using the pure :func:`plan`:

- an alive node with the ``raylog`` resource and no broker gets a ``BrokerActor`` pinned to it
  (hard node affinity), rack from the node's ``raylog.rack`` label. Its broker id is the one
  persisted in the node's data directory (``<data>/broker-<id>/meta.properties``, read on that
  node by a small pinned task), so a machine that comes back keeps its id; a node with no
  broker directory gets the lowest id above every id in use;
- a node that died has its broker fenced and its partitions re-elected at once: the watcher
  tells the controller (``broker_node_died``), which runs the same fast path as when Ray reports
  the broker's own death (Ray has confirmed the node, hence every replica on it, dead).

The node's data directory is the watcher's ``data_dir`` unless the node has a ``raylog.data-dir``
label (tests run several Ray nodes on one machine and give each its own). The watcher is off in
the embedded cluster, where ``raylog up`` starts its brokers itself.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raylog.actors.broker import META_FILE, BrokerActor, broker_actor_name
from raylog.actors.controller import controller_actor_name, ray_call
from raylog.actors.replica import NAMESPACE
from raylog.storage.errors import NotControllerError, RaylogError

log = logging.getLogger(__name__)

RAYLOG_RESOURCE = "raylog"
RACK_LABEL = "raylog.rack"
DATA_DIR_LABEL = "raylog.data-dir"
POLL_MS_DEFAULT = 500
CALL_TIMEOUT_MS = 10_000
_BROKER_DIR = re.compile(r"broker-(\d+)")


class NodeView(msgspec.Struct, frozen=True):
    """What the watcher needs of one Ray node."""

    node_id: str
    alive: bool
    raylog: bool  # carries the ``raylog`` resource: it should run a broker
    rack: str | None = None
    address: str = "127.0.0.1"
    data_dir: str | None = None  # the ``raylog.data-dir`` label, if any


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
            )
        )
    return sorted(out, key=lambda v: v.node_id)


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


def choose_broker_id(on_disk: Sequence[int], in_use: Iterable[int]) -> int:
    """The node's persisted id when it has exactly one free one; else a new id above all."""
    used = set(in_use)
    mine = [b for b in on_disk if b not in used]
    if len(mine) == 1 and len(on_disk) == 1:
        return mine[0]
    return max(used | set(on_disk), default=0) + 1


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


@ray.remote(num_cpus=0, max_retries=0)
def _broker_ids_on_node(data_dir: str) -> list[int]:
    return broker_ids_in(data_dir)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class NodeWatcherActor:
    """Starts a broker on every ``raylog`` node and reports nodes that die to the controller."""

    def __init__(
        self,
        data_dir: str,
        *,
        controller_names: tuple[str, ...] = (controller_actor_name(0), controller_actor_name(1)),
        broker_configs: dict[str, str] | None = None,
        broker_port: int = 9092,
        broker_name_prefix: str = "",
        poll_ms: int = POLL_MS_DEFAULT,
    ) -> None:
        self._data_dir = data_dir
        self._controller_names = tuple(controller_names)
        self._broker_configs = dict(broker_configs or {})
        self._port = broker_port
        self._prefix = broker_name_prefix
        self._poll_ms = poll_ms
        self._brokers: dict[str, tuple[int, Any]] = {}  # node id -> (broker id, handle)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def brokers(self) -> dict[str, int]:
        """Node id -> broker id of the brokers this watcher started."""
        return {node: b for node, (b, _) in self._brokers.items()}

    async def _loop(self) -> None:
        while True:  # the actor's lifetime; one bounded round per poll
            try:
                await self.poll_once()
            except Exception:
                log.exception("node watcher round failed")
            await asyncio.sleep(self._poll_ms / 1000)

    async def poll_once(self) -> WatchPlan:
        """One round: start brokers on new nodes, report lost ones. Returns what it decided."""
        nodes = parse_nodes(await asyncio.to_thread(ray.nodes))
        decided = plan(nodes, {n: b for n, (b, _) in self._brokers.items()})
        for broker_id in decided.lost:
            node = next(n for n, (b, _) in self._brokers.items() if b == broker_id)
            del self._brokers[node]
            log.warning("node %s of broker %d is gone: fencing it", node, broker_id)
            await self._call_controller("broker_node_died", broker_id)
        for view in decided.start:
            await self._start_broker(view)
        return decided

    async def _start_broker(self, view: NodeView) -> None:
        data_dir = view.data_dir or self._data_dir
        pinned = NodeAffinitySchedulingStrategy(view.node_id, soft=False)
        on_disk = await ray_call(
            _broker_ids_on_node.options(scheduling_strategy=pinned).remote(data_dir),
            CALL_TIMEOUT_MS,
        )
        md = await self._call_controller("metadata")
        in_use = {b for b, _ in self._brokers.values()} | (set(md.brokers) if md else set())
        broker_id = choose_broker_id(on_disk, in_use)
        handle = BrokerActor.options(  # type: ignore[attr-defined]
            name=f"{self._prefix}{broker_actor_name(broker_id)}",
            namespace=NAMESPACE,
            scheduling_strategy=pinned,
            get_if_exists=True,
        ).remote(
            broker_id,
            data_dir,
            rack=view.rack,
            host=view.address,
            port=self._port,
            controller_names=self._controller_names,
            broker_configs=self._broker_configs,
        )
        self._brokers[view.node_id] = (broker_id, handle)
        log.info("node %s (rack %s): broker %d started", view.node_id, view.rack, broker_id)

    async def _call_controller(self, method: str, *args: Any) -> Any:
        """Call the active controller; None when none answers (the next round retries)."""
        for name in self._controller_names:  # bounded: one attempt per controller
            try:
                handle = await asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE)
                return await ray_call(getattr(handle, method).remote(*args), CALL_TIMEOUT_MS)
            except (ValueError, NotControllerError):
                continue
            except RaylogError as exc:
                log.warning("controller %s %s failed: %s", name, method, exc)
        return None


__all__ = [
    "NodeView",
    "NodeWatcherActor",
    "WatchPlan",
    "broker_ids_in",
    "choose_broker_id",
    "parse_nodes",
    "plan",
]
