"""`raylog up --address`: raylog on an existing (e.g. autoscaled) Ray cluster.

:class:`RayNodesCluster` runs the supervisor and the node watcher
(``raylog.actors.cluster.node_watcher``) on this process's node (the head); the watcher has the
supervisor start one broker and one gateway on every Ray node with the ``raylog`` resource, now
and as nodes join, so the brokers belong to this process as in the embedded cluster and stop the
same way. The controllers run on the head too when the metadata store is a directory there.
With S3 (which every node reaches) they run on different nodes (:func:`controller_nodes`), so
that losing one node never takes both: the standby takes over from an active controller whose
node is lost, and this process starts the lost one again on a node that is left (each is pinned
to its node: Ray's soft node affinity placed controllers on other nodes than asked).
Continuous balancing (``replica.balancer.enable``) is on unless the user sets it: a node that
joins gets replicas without a `raylog reassign --rebalance`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raylog.actors.calls import (
    CONTROLLERS,
    NAMESPACE,
    SUPERVISOR_ACTOR_NAME,
    controller_actor_name,
)
from raylog.actors.cluster.bootstrap import ClusterError
from raylog.actors.cluster.embedded import (
    START_TIMEOUT_S,
    STOP_STEP_TIMEOUT_S,
    EmbeddedCluster,
    bootstrap_lines,
)
from raylog.actors.cluster.node_watcher import NodeWatcherActor, parse_nodes
from raylog.actors.cluster.supervisor import SupervisorActor
from raylog.actors.control import config_keys
from raylog.actors.control import listeners as listeners_
from raylog.storage.errors import one_line

BALANCER_KEY = "replica.balancer.enable"
FIRST_NODE_TIMEOUT_S = 600.0  # an autoscaler may take minutes to add a node


def controller_nodes(here: str, nodes: list[dict[str, Any]], count: int) -> list[str]:
    """The Ray node ids for ``count`` controllers: different nodes, those with the ``raylog``
    resource first (the brokers' nodes, which reach the store), then this one (the head);
    nodes are used again only when there are fewer than ``count``. ``nodes``: ``ray.nodes()``.
    """
    views = parse_nodes(nodes)
    order = [v.node_id for v in views if v.alive and v.raylog and v.node_id != here]
    order.append(here)
    return [order[i % len(order)] for i in range(count)]


def _pinned(node_id: str) -> dict[str, Any]:
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}


class RayNodesCluster(EmbeddedCluster):
    """raylog on an existing Ray cluster, one broker per ``raylog`` node (see the module
    docstring); started, reported and stopped as the embedded cluster is."""

    def __init__(
        self,
        data_dir: Path,
        store_url: str,
        cluster_id: str,
        port: int,
        s3_endpoint: str | None = None,
        broker_configs: dict[str, str] | None = None,
    ) -> None:
        # Nodes come and go here: new brokers take replicas without being asked (unless set).
        configs = {BALANCER_KEY: "true", **(broker_configs or {})}
        super().__init__(data_dir, store_url, cluster_id, 0, port, s3_endpoint, configs)
        self.port = port
        self.listeners = listeners_.configured(
            config_keys.broker_config(self.broker_configs),
            default=listeners_.RAY_CLUSTER_DEFAULT.format(port=port),
        )
        self.watcher: Any = None
        self._here = ""  # this process's Ray node id, once started
        self._controller_nodes: list[str] = []  # with S3: the node each controller is pinned to
        self._announced: set[tuple[int, str | None]] = set()  # (broker id, node id)

    def start(self, stop: threading.Event | None = None) -> None:
        """Start the controllers, the supervisor and the node watcher; returns once a first
        broker serves (or ``stop`` is set)."""
        self._here = ray.get_runtime_context().get_node_id()
        self.placement = {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(self._here, soft=False)
        }
        names = self._start_controllers()
        self.supervisor = SupervisorActor.options(  # type: ignore[attr-defined]
            name=SUPERVISOR_ACTOR_NAME, namespace=NAMESPACE, **self.placement
        ).remote([])
        self.watcher = NodeWatcherActor.options(namespace=NAMESPACE, **self.placement).remote(  # type: ignore[attr-defined]
            str(self.data_dir),
            supervisor_name=SUPERVISOR_ACTOR_NAME,
            controller_names=names,
            broker_configs=self.broker_configs,
            broker_port=self.port,
        )
        try:
            ray.get(self.watcher.start.remote(), timeout=START_TIMEOUT_S)
        except Exception as e:
            raise ClusterError(f"node watcher: {one_line(e)}") from e
        self._wait_first_broker(stop or threading.Event())

    def _controller_placements(self) -> list[dict[str, Any]]:
        if not self.store_url.startswith("s3://"):
            return super()._controller_placements()  # the store's directory is here
        self._controller_nodes = controller_nodes(self._here, ray.nodes(), CONTROLLERS)
        return [_pinned(node) for node in self._controller_nodes]

    def _keep_controllers(self) -> list[str]:
        """A controller whose node is gone is started again on a node that is left, apart
        from the other one where it can be: pinned to its node (Ray's soft node affinity
        may place a controller elsewhere at start), Ray cannot restart it. One line per
        controller started again."""
        if not self._controller_nodes:
            return []
        nodes = ray.nodes()
        alive = {n["NodeID"] for n in nodes if n.get("Alive")}
        addresses = {n["NodeID"]: n.get("NodeManagerAddress", "") for n in nodes}
        lines = []
        for i, node in enumerate(self._controller_nodes):
            if node in alive:
                continue
            taken = {n for j, n in enumerate(self._controller_nodes) if j != i}
            candidates = controller_nodes(self._here, nodes, len(nodes) + 1)
            choice = next((n for n in candidates if n not in taken), self._here)
            name = controller_actor_name(i)
            with contextlib.suppress(Exception):  # its restart, pending on a node that is gone
                ray.kill(self.controllers[i], no_restart=True)
            try:
                self.controllers[i] = self._new_controller(name, _pinned(choice))
            except ValueError:  # the name is not free yet: the next round tries again
                continue
            self.controllers[i].start.remote()
            self._controller_nodes[i] = choice
            lines.append(f"controller {name} started again on {addresses.get(choice, choice)}")
        return lines

    def _wait_first_broker(self, stop: threading.Event) -> None:
        """At least one broker registered with its gateway serving (or a stop signal)."""
        deadline = time.monotonic() + FIRST_NODE_TIMEOUT_S
        while not stop.is_set() and not self._serving():
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"no broker within {FIRST_NODE_TIMEOUT_S:.0f} s: no Ray node with the "
                    "raylog resource joined (ray start --resources '{\"raylog\": 1}')"
                )
            stop.wait(timeout=0.5)
        self._announced = {(s.broker_id, s.node_id) for s in self._serving()}

    def _serving(self) -> list[Any]:
        return self._serving_or_none() or []

    def _serving_or_none(self) -> list[Any] | None:
        """The serving brokers, or None when the supervisor did not answer (slow: ask again)."""
        try:
            return list(ray.get(self.supervisor.serving.remote(), timeout=15))
        except ray.exceptions.RayError:
            return None

    def bootstrap_servers(self) -> str:
        return ",".join(f"{s.host}:{s.port}" for s in self._serving())

    def summary(self) -> list[str]:
        serving = self._serving()
        racks = ", ".join(s.rack or "-" for s in serving)
        where = ""
        if self._controller_nodes:  # with S3: on nodes apart
            addresses = {n["NodeID"]: n.get("NodeManagerAddress", "") for n in ray.nodes()}
            where = " on " + ", ".join(addresses.get(n, n) for n in self._controller_nodes)
        return [
            f"  controllers:   {CONTROLLERS} (active + standby){where}",
            f"  brokers:       one per Ray node with the raylog resource "
            f"({len(serving)} so far, racks {racks})",
            *bootstrap_lines(
                self.listeners,
                lambda i: ",".join(s.listeners[i].address for s in serving),
            ),
        ]

    def news(self) -> list[str]:
        """A line per broker that joined or left since the last call (its Ray node came or
        went, or its broker stopped serving), and per controller started again."""
        restarted = self._keep_controllers()
        serving = self._serving_or_none()
        if serving is None:
            return restarted  # no answer must not read as every broker leaving
        current = {(s.broker_id, s.node_id): s for s in serving}
        lines = [
            f"broker {broker_id} left (its Ray node is gone or its gateway stopped serving)"
            for broker_id, node_id in sorted(self._announced - current.keys(), key=str)
        ]
        self._announced &= current.keys()
        for key, s in current.items():
            if key not in self._announced:
                self._announced.add(key)
                lines.append(f"broker {s.broker_id} joined at {s.host}:{s.port} (rack {s.rack})")
        return restarted + lines

    def stop(self) -> None:
        """The watcher first (no broker starts while they stop), then as the embedded cluster."""
        if self.watcher is not None:
            self._await_step("node watcher", [self.watcher.stop.remote()], STOP_STEP_TIMEOUT_S)
        super().stop()
        if self.watcher is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.watcher, no_restart=True)
