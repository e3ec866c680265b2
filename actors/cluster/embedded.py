"""The embedded cluster: the actors `raylog up` starts on a Ray cluster of its own.

:class:`EmbeddedCluster` starts two controllers (active + standby on the lease), a supervisor
that owns ``brokers`` brokers on racks a, b, c, ... and one Kafka gateway per broker on
consecutive ports, waits until the cluster is ready, and stops it all in reverse order. Ray must
be started first (``raylog.actors.cluster.bootstrap``). Ready means, in order:

1. every broker registered and every gateway serving a view that lists them all;
2. every partition led by a running replica at the metadata's leader epoch;
3. after a restart, leadership back on each partition's preferred replica wherever that replica
   can lead within ``PARTITIONS_LED_TIMEOUT_S`` (those still catching up rejoin the ISR first);
4. consumer groups served: ``__consumer_offsets`` created at the first start (a cluster's first
   group would otherwise wait for its replicas to start), and every partition of it loaded by
   its leader's group coordinator, so that a first JoinGroup or OffsetCommit is answered at
   once.

Each wait is bounded; what is not done in time is reported in one line on stderr and does not
hold the cluster back.
"""

from __future__ import annotations

import contextlib
import string
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from raylog.actors.calls import (
    CONTROLLERS,
    NAMESPACE,
    SUPERVISOR_ACTOR_NAME,
    controller_actor_name,
)
from raylog.actors.cluster import metrics
from raylog.actors.cluster.bootstrap import HOST, ClusterError
from raylog.actors.cluster.supervisor import BrokerSpec, SupervisorActor
from raylog.actors.control import config_keys, election
from raylog.actors.control import listeners as listeners_
from raylog.actors.control.metadata import ClusterMetadata, TopicPartition
from raylog.actors.controller import ControllerActor
from raylog.gateway.groups.coordinator import OFFSETS_TOPIC
from raylog.storage.errors import one_line

# Takeover by the standby within lease_ms of the active one dying; lease >= 2 x renew.
CONTROLLER_LEASE = {"lease_ms": 6_000, "renew_ms": 2_000, "poll_ms": 200}
START_TIMEOUT_S = 90.0  # controllers elected, brokers registered, gateways serving
STOP_STEP_TIMEOUT_S = 15.0
BROKER_SHUTDOWN_TIMEOUT_S = 40.0
PARTITIONS_LED_TIMEOUT_S = 30.0  # every partition led; then, preferred leaders restored
ANSWER_TIMEOUT_S = 5.0  # one status or metadata call while waiting
POLL_S = 0.2
PARTITIONS_LISTED_MAX = 10  # in a line reporting what was not done in time


def rack_name(index: int) -> str:
    """Racks a, b, c, ... z, aa, ab, ... (one per broker)."""
    letters = string.ascii_lowercase
    name = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, len(letters))
        name = letters[rem] + name
    return name


def bootstrap_lines(
    listeners: tuple[listeners_.Listener, ...], servers: Callable[[int], str]
) -> list[str]:
    """``bootstrap:`` (the first listener's addresses: raylog's own tools use them), then a
    ``listener:`` line per listener when there are several or the one is not PLAINTEXT."""
    lines = [f"  bootstrap:     {servers(0)}"]
    if len(listeners) > 1 or listeners[0].security_protocol != "PLAINTEXT":
        for i, listener in enumerate(listeners):
            protocol = listener.security_protocol
            named = listener.name if listener.name == protocol else f"{listener.name} ({protocol})"
            lines.append(f"  listener:      {named} {servers(i)}")
    if any(listener.sasl for listener in listeners):
        lines.append("  sasl users:    raylog users create NAME (SCRAM; list: raylog users list)")
    if any(listener.tls for listener in listeners):
        lines.append("  tls:           raylog certs ca --out ca.pem (the CA clients trust)")
    return lines


def warn(line: str) -> None:
    """One line on stderr about what the cluster could not do (it goes on)."""
    print(f"raylog: {line}", file=sys.stderr, flush=True)


class EmbeddedCluster:
    """The actors `raylog up` starts, held for the process's lifetime (they are not detached).

    Start order: controllers, the supervisor, which starts the brokers (they register with the
    active controller) and one gateway per broker. The supervisor owns brokers and gateways so
    that `raylog brokers stop|kill|start` can replace them from another process while they stay
    tied to this one (see ``raylog.actors.cluster.supervisor``). Stop order is the reverse
    (:meth:`stop`).
    """

    def __init__(
        self,
        data_dir: Path,
        store_url: str,
        cluster_id: str,
        brokers: int,
        port: int,
        s3_endpoint: str | None = None,
        broker_configs: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.broker_configs = dict(broker_configs or {})
        self.store_url = store_url
        self.s3_endpoint = s3_endpoint
        self.cluster_id = cluster_id
        self.broker_ids = list(range(1, brokers + 1))
        config = config_keys.broker_config(self.broker_configs)
        self.listeners = listeners_.configured(config, default=f"PLAINTEXT://{HOST}:{port}")
        per_broker = listeners_.embedded_brokers(self.listeners, brokers, HOST)
        self.broker_listeners = dict(zip(self.broker_ids, per_broker, strict=True))
        # Each broker's first listener: where raylog's own tools reach it.
        self.ports = {b: own[0].advertised_port for b, own in self.broker_listeners.items()}
        self.controllers: list[Any] = []
        self.supervisor: Any = None
        self.placement: dict[str, Any] = {}  # Ray options of the controllers and supervisor

    def _controller_placements(self) -> list[dict[str, Any]]:
        """Ray options placing each controller: here, with the supervisor."""
        return [self.placement] * CONTROLLERS

    def _start_controllers(self) -> tuple[str, ...]:
        names = tuple(controller_actor_name(i) for i in range(CONTROLLERS))
        for name, placement in zip(names, self._controller_placements(), strict=True):
            self.controllers.append(self._new_controller(name, placement))
        return names

    def _new_controller(self, name: str, placement: dict[str, Any]) -> Any:
        return ControllerActor.options(name=name, namespace=NAMESPACE, **placement).remote(  # type: ignore[attr-defined]
            self.store_url,
            name,
            s3_endpoint=self.s3_endpoint,
            cluster_id=self.cluster_id,
            broker_configs=self.broker_configs,
            **CONTROLLER_LEASE,
        )

    def start(self, stop: threading.Event | None = None) -> None:
        """Start every actor and wait until the cluster is ready (see the module docstring)."""
        names = self._start_controllers()
        specs = [
            BrokerSpec(
                broker_id=b,
                rack=rack_name(i),
                host=self.broker_listeners[b][0].advertised_host,
                port=self.ports[b],
                data_dir=str(self.data_dir),
                cluster_id=self.cluster_id,
                controller_names=names,
                broker_configs=self.broker_configs,
                listeners=self.broker_listeners[b],
            )
            for i, b in enumerate(self.broker_ids)
        ]
        self.supervisor = SupervisorActor.options(  # type: ignore[attr-defined]
            name=SUPERVISOR_ACTOR_NAME, namespace=NAMESPACE
        ).remote(specs)
        try:
            # The supervisor bounds each gateway's start by START_TIMEOUT_S itself.
            ray.get(self.supervisor.start_all.remote(), timeout=START_TIMEOUT_S + 30)
        except Exception as e:
            raise ClusterError(one_line(e)) from e
        self._wait_ready()
        self._restore_preferred_leaders()
        self._serve_groups()

    def serve_metrics(self, port: int) -> Any:
        """The Prometheus endpoint on ``port`` (``raylog.actors.cluster.metrics``); returns its
        server (``shutdown()`` stops it)."""
        collector = metrics.ClusterCollector(self.controllers, self.supervisor)
        try:
            return metrics.serve(HOST, port, collector)
        except metrics.MetricsPortError as e:
            raise ClusterError(str(e)) from e

    # --- ready -----------------------------------------------------------------------------------

    def _wait_ready(self) -> None:
        """Every broker registered and every gateway serving a view that lists them all; then
        every partition led (:meth:`_wait_partitions_led`)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if ray.get(self.supervisor.ready.remote(), timeout=15):
                    break
            except ray.exceptions.RayError:
                pass  # slow: ask again
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"cluster not ready within {START_TIMEOUT_S:.0f} s "
                    "(brokers not registered or gateways without metadata)"
                )
            time.sleep(0.1)
        self._wait_partitions_led()

    def _active_metadata(self) -> tuple[Any, ClusterMetadata] | None:
        """The active controller's handle and metadata; None when none answers as active."""
        for controller in self.controllers:
            try:
                if not ray.get(controller.status.remote(), timeout=ANSWER_TIMEOUT_S).active:
                    continue
                return controller, ray.get(controller.metadata.remote(), timeout=ANSWER_TIMEOUT_S)
            except ray.exceptions.RayError:
                continue  # slow or failing over: ask the other one
        return None

    def _partitions_not_led(self) -> int | None:
        """Partitions whose leader (in the active controller's metadata) is not yet a running
        replica that leads at that epoch; None when the controllers or brokers do not answer."""
        found = self._active_metadata()
        if found is None:
            return None
        _, md = found
        try:
            handles = ray.get(self.supervisor.handles.remote(), timeout=ANSWER_TIMEOUT_S)
            states = ray.get(
                [broker.replica_states.remote(2_000) for broker, _ in handles.values()],
                timeout=ANSWER_TIMEOUT_S,
            )
        except ray.exceptions.RayError:
            return None
        leading = {
            (s.topic, s.partition, s.leader_epoch)
            for answer in states
            for s in answer
            if s.role == "leader"
        }
        return sum(
            (name, p.partition, p.leader_epoch) not in leading
            for name, topic in md.topics.items()
            for p in topic.partitions
        )

    def _wait_partitions_led(self) -> None:
        """After a restart the brokers reopen their replicas (an actor each) and the controller
        elects leaders; clients that connect before then get NOT_LEADER answers and back off.
        Waits (bounded) until every partition's leader leads; partitions that cannot be led
        (their replicas' brokers gone) are reported and do not hold the cluster back."""
        deadline = time.monotonic() + PARTITIONS_LED_TIMEOUT_S
        while True:
            waiting = self._partitions_not_led()
            if waiting == 0:
                return
            if time.monotonic() >= deadline:
                warn(
                    f"{waiting if waiting is not None else 'some'} partitions without a leader "
                    f"after {PARTITIONS_LED_TIMEOUT_S:.0f} s (raylog status shows which)"
                )
                return
            time.sleep(0.1)

    def _restore_preferred_leaders(self) -> None:
        """Put leadership back on each partition's preferred replica.

        A restart elects each partition's leader among the brokers that registered first, and
        a broker's new incarnation leaves every ISR until it has caught up, so leadership piles
        up on the first brokers. Kafka's auto leader rebalance would move it back after
        ``leader.imbalance.check.interval.seconds``; this does it before the cluster says ready:

        1. read the active controller's metadata and sort the partitions off their preferred
           replica (``election.preferred_leaders``): electable now, or catching up;
        2. elect the electable ones (one ElectLeaders call); the others are waited for;
        3. again from 1. until none of either kind is left or ``PARTITIONS_LED_TIMEOUT_S``
           passed; then say which are left (the controller's automatic rebalance moves them
           once their preferred replicas are in the ISR).

        Each round decides on one metadata version, so a replica that rejoins its ISR at any
        moment is elected on the next round. A partition whose preferred replica cannot come
        back (its broker not registered, its log failed there, or an observer) keeps its
        leader. Once something was elected, waits until the new leaders lead.
        """
        deadline = time.monotonic() + PARTITIONS_LED_TIMEOUT_S
        elected = False
        left: list[TopicPartition] | None = None  # None: no metadata read yet
        while True:  # bounded by the deadline: past it, one last read and no election
            past_deadline = time.monotonic() >= deadline
            found = self._active_metadata()
            codes: dict[tuple[str, int], int] = {}
            if found is not None:
                controller, md = found
                due = election.preferred_leaders(md)
                left = [*due.electable, *due.catching_up]
                if not left:
                    break
                if due.electable and not past_deadline:
                    wanted = [(tp.topic, tp.partition) for tp in due.electable]
                    # Slow, or the lease moved: decided again on fresh metadata.
                    with contextlib.suppress(ray.exceptions.RayError):
                        codes = ray.get(
                            controller.elect_leaders.remote("preferred", wanted),
                            timeout=STOP_STEP_TIMEOUT_S,
                        )
            if past_deadline:
                self._report_not_preferred(left)
                break
            if 0 in codes.values():
                elected = True  # read back at once what the election did
            else:
                time.sleep(POLL_S)
        if elected:
            self._wait_partitions_led()

    @staticmethod
    def _report_not_preferred(left: list[TopicPartition] | None) -> None:
        if left is None:
            warn(
                "no active controller answered: leadership not moved to the preferred replicas "
                "(raylog leader-election --preferred does it)"
            )
            return
        shown = sorted(left)[:PARTITIONS_LISTED_MAX]
        names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in shown)
        names += ", ..." if len(left) > len(shown) else ""
        warn(
            f"{len(left)} partitions not led by their preferred replica after "
            f"{PARTITIONS_LED_TIMEOUT_S:.0f} s ({names}); the controller's leader rebalance "
            "moves them once their preferred replicas are back in the ISR"
        )

    # --- what `raylog up` prints -----------------------------------------------------------------

    def _serve_groups(self) -> None:
        """Ready step 4 (module docstring), bounded by ``PARTITIONS_LED_TIMEOUT_S``."""
        try:
            handles = ray.get(self.supervisor.handles.remote(), timeout=ANSWER_TIMEOUT_S)
            _, gateway = next(iter(handles.values()))
            ray.get(gateway.set_up_groups.remote(), timeout=PARTITIONS_LED_TIMEOUT_S)
        except (ray.exceptions.RayError, StopIteration) as e:
            warn(f"{OFFSETS_TOPIC} not created: {one_line(e)} (the first group creates it)")
            return
        self._wait_partitions_led()
        deadline = time.monotonic() + PARTITIONS_LED_TIMEOUT_S
        while True:
            waiting = self._group_partitions_not_loaded(handles)
            if waiting == 0:
                return
            if time.monotonic() >= deadline:
                warn(
                    f"{waiting if waiting is not None else 'some'} partitions of {OFFSETS_TOPIC} "
                    f"not loaded by their coordinators after {PARTITIONS_LED_TIMEOUT_S:.0f} s: "
                    "their groups' first requests wait for them"
                )
                return
            time.sleep(POLL_S)

    def _group_partitions_not_loaded(self, handles: dict[int, tuple[Any, Any]]) -> int | None:
        """``__consumer_offsets`` partitions whose leader's coordinator has not loaded them;
        None when the controllers or gateways do not answer."""
        found = self._active_metadata()
        if found is None or OFFSETS_TOPIC not in found[1].topics:
            return None
        try:
            loaded = dict(
                zip(
                    handles,
                    ray.get(
                        [g.loaded_group_partitions.remote() for _, g in handles.values()],
                        timeout=ANSWER_TIMEOUT_S,
                    ),
                    strict=True,
                )
            )
        except ray.exceptions.RayError:
            return None
        return sum(
            p.partition not in loaded.get(p.leader, ())
            for p in found[1].topics[OFFSETS_TOPIC].partitions
        )

    def bootstrap_servers(self, listener: int = 0) -> str:
        """The brokers' addresses on their ``listener``-th listener (the first: raylog's own)."""
        return ",".join(own[listener].address for own in self.broker_listeners.values())

    def summary(self) -> list[str]:
        """The lines `raylog up` prints about the brokers once ready."""
        racks = ", ".join(rack_name(i) for i in range(len(self.broker_ids)))
        return [
            f"  controllers:   {CONTROLLERS} (active + standby)",
            f"  brokers:       {len(self.broker_ids)} (racks {racks})",
            *bootstrap_lines(self.listeners, self.bootstrap_servers),
        ]

    def news(self) -> list[str]:
        """Lines to print about brokers that appeared since the last call (none here: the
        embedded cluster's brokers are fixed)."""
        return []

    # --- stop ------------------------------------------------------------------------------------

    def stop(self) -> None:
        """1. gateways stop listening; 2. controllers stop and release the lease, so that no
        election follows the brokers' ends; 3. every broker stops its replicas, all at once.
        The metadata keeps each partition's leader and ISR for the next start: no leadership
        piles up on the broker stopped last, as a rolling controlled shutdown would leave it.
        Every step is bounded; a step that fails is reported and the next one still runs."""
        sup = self.supervisor
        if sup is not None:
            self._await_step("gateways", [sup.stop_gateways.remote()], STOP_STEP_TIMEOUT_S)
        self._await_step(
            "controllers", [c.stop.remote() for c in self.controllers], STOP_STEP_TIMEOUT_S
        )
        if sup is not None:
            self._await_step("brokers", [sup.stop_brokers.remote()], BROKER_SHUTDOWN_TIMEOUT_S)
            self._await_step("brokers", [sup.kill_all.remote()], STOP_STEP_TIMEOUT_S)
        for handle in [*self.controllers, *([sup] if sup is not None else [])]:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)

    @staticmethod
    def _await_step(what: str, refs: list[Any], timeout_s: float) -> None:
        try:
            ray.get(refs, timeout=timeout_s)
        except Exception as e:
            warn(f"stopping {what}: {one_line(e)}")
