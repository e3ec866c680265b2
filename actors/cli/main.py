"""The `raylog` command line: start the embedded cluster and operate it like Kafka's tools.

`raylog up` starts a local Ray cluster configured for raylog (token authentication, loopback,
fast death detection, its temp dir under the data dir), the object store holding the cluster's
identity and metadata, two controllers (active + standby), a supervisor that owns ``--brokers``
brokers on racks a, b, c, ... and one Kafka gateway per broker on consecutive ports from
``--port``, and a Prometheus endpoint (``raylog.actors.cluster.metrics``) on ``--metrics-port``.
Ctrl-C (SIGINT) or SIGTERM stops them in reverse order: gateways, brokers (controlled shutdown),
controllers (releasing the lease), Ray.

`raylog up --address RAY_ADDRESS` runs raylog on an existing (e.g. autoscaled) Ray cluster
instead: controllers, supervisor and metrics on this (the head) node, and a node watcher
(``raylog.actors.cluster.node_watcher``) that starts one broker and one gateway on every Ray node
with the ``raylog`` resource, now and as nodes join (``--port`` is their default gateway port).

Every other command finds the cluster from ``--data-dir`` (its ``cluster.json``; or
$RAYLOG_DATA_DIR) or ``--address``, joins Ray with the cluster's token and asks the active
controller (topics, configs, leader-election, status) or the supervisor (brokers stop, kill,
start). Tables for people, ``--json`` for scripts; a failure is one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import string
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from raylog.actors import raycluster
from raylog.actors.calls import CONTROLLERS
from raylog.actors.cli import server as cli_server
from raylog.actors.control import config_keys
from raylog.storage.errors import RaylogError, one_line, remote_cause
from raylog.storage.objectstore import ObjectStore

DEFAULT_DATA_DIR = "./raylog-data"
HOST = "127.0.0.1"  # the embedded cluster listens on loopback only
DEFAULT_BROKERS = 3  # embedded cluster
# Takeover by the standby within lease_ms of the active one dying; lease >= 2 x renew.
CONTROLLER_LEASE = {"lease_ms": 6_000, "renew_ms": 2_000, "poll_ms": 200}
START_TIMEOUT_S = 90.0  # controllers elected, brokers registered, gateways serving
FIRST_NODE_TIMEOUT_S = 600.0  # cluster mode: an autoscaler may take minutes to add a node
STOP_STEP_TIMEOUT_S = 15.0
BROKER_SHUTDOWN_TIMEOUT_S = 40.0
PARTITIONS_LED_TIMEOUT_S = 30.0  # `raylog up` after the brokers: every partition has a leader
CONNECT_TIMEOUT_S = 20.0  # `raylog topics`: an active controller found
CALL_TIMEOUT_S = 30.0  # `raylog topics`: one controller call


class CliError(Exception):
    """A failure to report as one line and a non-zero exit."""


def _data_dir(args: argparse.Namespace) -> Path:
    raw = args.data_dir or os.environ.get("RAYLOG_DATA_DIR") or DEFAULT_DATA_DIR
    path = Path(raw).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise CliError(f"data dir {path} is not writable: {e.strerror or e}") from e
    return path


def _open_object_store(args: argparse.Namespace, data_dir: Path) -> tuple[str, ObjectStore]:
    from raylog.storage.objectstore import open_object_store

    url = args.object_store or f"file://{data_dir / 'metadata'}"
    try:
        return url, open_object_store(url, endpoint_url=args.s3_endpoint)
    except Exception as e:
        raise CliError(f"object store {url} is not usable: {e}") from e


def _cluster_id(store: ObjectStore) -> str:
    """The cluster's identity, created once in the object store (put-if-absent) and kept."""
    import json
    import uuid

    from raylog.storage.errors import PreconditionFailedError

    key = "cluster/identity.json"
    found = store.get(key)
    if found is None:
        body = json.dumps({"cluster_id": uuid.uuid4().hex}).encode()
        # Losing the race means another process created it first: use theirs.
        with contextlib.suppress(PreconditionFailedError):
            store.put_if_absent(key, body)
        found = store.get(key)
        if found is None:
            raise CliError(f"object store lost {key} right after writing it")
    return str(json.loads(found.body)["cluster_id"])


def _check_ports_free(host: str, ports: list[int], what: str = "port") -> None:
    """Fail before starting anything when a gateway port is taken (one line, exit 1)."""
    import socket

    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As asyncio.start_server does: a port in TIME_WAIT is free, a listening one is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as e:
                raise CliError(f"{what} {host}:{port} is not available: {e.strerror or e}") from e


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
        self.ports = {b: port + i for i, b in enumerate(self.broker_ids)}
        self.controllers: list[Any] = []
        self.supervisor: Any = None
        self.placement: dict[str, Any] = {}  # Ray options of the controllers and supervisor

    def _start_controllers(self) -> tuple[str, ...]:
        from raylog.actors.calls import NAMESPACE, controller_actor_name
        from raylog.actors.controller import ControllerActor

        names = tuple(controller_actor_name(i) for i in range(CONTROLLERS))
        for name in names:
            self.controllers.append(
                ControllerActor.options(name=name, namespace=NAMESPACE, **self.placement).remote(  # type: ignore[attr-defined]
                    self.store_url,
                    name,
                    s3_endpoint=self.s3_endpoint,
                    cluster_id=self.cluster_id,
                    broker_configs=self.broker_configs,
                    **CONTROLLER_LEASE,
                )
            )
        return names

    def start(self, stop: threading.Event | None = None) -> None:
        import ray

        from raylog.actors.calls import NAMESPACE, SUPERVISOR_ACTOR_NAME
        from raylog.actors.cluster.supervisor import BrokerSpec, SupervisorActor

        names = self._start_controllers()
        specs = [
            BrokerSpec(
                broker_id=b,
                rack=_rack(i),
                host=HOST,
                port=self.ports[b],
                data_dir=str(self.data_dir),
                cluster_id=self.cluster_id,
                controller_names=names,
                broker_configs=self.broker_configs,
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
            raise CliError(one_line(e)) from e
        self._wait_ready()
        self._restore_preferred_leaders()

    def _restore_preferred_leaders(self) -> None:
        """A restart elects each partition's leader among the brokers that registered first,
        so leadership piles up on them. Put it back on the preferred replicas at once (Kafka's
        auto leader rebalance would, after ``leader.imbalance.check.interval.seconds``), then
        wait until they lead.

        A broker's new incarnation leaves the ISRs until it has caught up, so its preferred
        replicas are at first PREFERRED_LEADER_NOT_AVAILABLE: those whose broker is registered
        are elected again as they rejoin, bounded by ``PARTITIONS_LED_TIMEOUT_S``. Best effort:
        a partition whose preferred broker is gone keeps its leader (the automatic rebalance
        takes it over later), and a controller that does not answer is left alone."""
        import ray

        from raylog.storage.errors import PreferredLeaderNotAvailableError

        not_available = PreferredLeaderNotAvailableError.error_code
        deadline = time.monotonic() + PARTITIONS_LED_TIMEOUT_S
        wanted: list[tuple[str, int]] | None = None  # None: every partition
        elected = False
        while True:  # bounded by the deadline
            controller = self._active_controller()
            if controller is None:
                break
            try:
                elect = controller.elect_leaders.remote("preferred", wanted)
                codes = ray.get(elect, timeout=STOP_STEP_TIMEOUT_S)
                md = ray.get(controller.metadata.remote(), timeout=STOP_STEP_TIMEOUT_S)
            except ray.exceptions.RayError:
                break
            elected = elected or 0 in codes.values()
            wanted = [
                tp
                for tp, code in sorted(codes.items())
                if code == not_available and _preferred_catching_up(md, *tp)
            ]
            if not wanted or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if elected:
            self._wait_partitions_led()

    def _active_controller(self) -> Any:
        """The active controller's handle, or None when none answers as active."""
        import ray

        for controller in self.controllers:
            try:
                if ray.get(controller.status.remote(), timeout=5).active:
                    return controller
            except ray.exceptions.RayError:
                continue
        return None

    def _wait_ready(self) -> None:
        """Every broker registered and every gateway serving a view that lists them all; then
        every partition led (:meth:`_wait_partitions_led`)."""
        import ray

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if ray.get(self.supervisor.ready.remote(), timeout=15):
                    break
            except ray.exceptions.RayError:
                pass  # slow: ask again
            if time.monotonic() >= deadline:
                raise CliError(
                    f"cluster not ready within {START_TIMEOUT_S:.0f} s "
                    "(brokers not registered or gateways without metadata)"
                )
            time.sleep(0.1)
        self._wait_partitions_led()

    def _partitions_not_led(self) -> int | None:
        """Partitions whose leader (in the active controller's metadata) is not yet a running
        replica that leads at that epoch; None when the controllers or brokers do not answer."""
        import ray

        for controller in self.controllers:
            try:
                if not ray.get(controller.status.remote(), timeout=5).active:
                    continue
                md = ray.get(controller.metadata.remote(), timeout=5)
                handles = ray.get(self.supervisor.handles.remote(), timeout=5)
                states = ray.get(
                    [broker.replica_states.remote(2_000) for broker, _ in handles.values()],
                    timeout=5,
                )
            except ray.exceptions.RayError:
                continue  # slow or failing over: ask the other one
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
        return None

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
                print(
                    f"raylog: {waiting if waiting is not None else 'some'} partitions without a "
                    f"leader after {PARTITIONS_LED_TIMEOUT_S:.0f} s (raylog status shows which)",
                    file=sys.stderr,
                    flush=True,
                )
                return
            time.sleep(0.1)

    def bootstrap_servers(self) -> str:
        return ",".join(f"{HOST}:{self.ports[b]}" for b in self.broker_ids)

    def summary(self) -> list[str]:
        """The lines `raylog up` prints about the brokers once ready."""
        racks = ", ".join(_rack(i) for i in range(len(self.broker_ids)))
        return [
            f"  controllers:   {CONTROLLERS} (active + standby)",
            f"  brokers:       {len(self.broker_ids)} (racks {racks})",
            f"  bootstrap:     {self.bootstrap_servers()}",
        ]

    def news(self) -> list[str]:
        """Lines to print about brokers that appeared since the last call (none here: the
        embedded cluster's brokers are fixed)."""
        return []

    def stop(self) -> None:
        """1. gateways stop listening; 2. controllers stop and release the lease, so that no
        election follows the brokers' ends; 3. every broker stops its replicas, all at once.
        The metadata keeps each partition's leader and ISR for the next start: no leadership
        piles up on the broker stopped last, as a rolling controlled shutdown would leave it.
        Every step is bounded; a step that fails is reported and the next one still runs."""
        import ray

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
        import ray

        try:
            ray.get(refs, timeout=timeout_s)
        except Exception as e:
            print(f"raylog: stopping {what}: {one_line(e)}", file=sys.stderr, flush=True)


class RayNodesCluster(EmbeddedCluster):
    """`raylog up --address`: raylog on an existing Ray cluster, one broker per ``raylog`` node.

    The controllers, the supervisor and the node watcher are pinned to this process's node (the
    head, where the metadata store's directory is); the watcher has the supervisor start a
    broker and a gateway on every Ray node with the ``raylog`` resource as it appears, so the
    brokers belong to this process as in the embedded cluster and stop the same way.
    """

    def __init__(
        self,
        data_dir: Path,
        store_url: str,
        cluster_id: str,
        port: int,
        s3_endpoint: str | None = None,
        broker_configs: dict[str, str] | None = None,
    ) -> None:
        super().__init__(data_dir, store_url, cluster_id, 0, port, s3_endpoint, broker_configs)
        self.port = port
        self.watcher: Any = None
        self._announced: set[tuple[int, str | None]] = set()  # (broker id, node id)

    def start(self, stop: threading.Event | None = None) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from raylog.actors.calls import NAMESPACE, SUPERVISOR_ACTOR_NAME
        from raylog.actors.cluster.node_watcher import NodeWatcherActor
        from raylog.actors.cluster.supervisor import SupervisorActor

        here = ray.get_runtime_context().get_node_id()
        self.placement = {"scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False)}
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
            raise CliError(f"node watcher: {one_line(e)}") from e
        self._wait_first_broker(stop or threading.Event())

    def _wait_first_broker(self, stop: threading.Event) -> None:
        """At least one broker registered with its gateway serving (or a stop signal)."""
        deadline = time.monotonic() + FIRST_NODE_TIMEOUT_S
        while not stop.is_set() and not self._serving():
            if time.monotonic() >= deadline:
                raise CliError(
                    f"no broker within {FIRST_NODE_TIMEOUT_S:.0f} s: no Ray node with the "
                    "raylog resource joined (ray start --resources '{\"raylog\": 1}')"
                )
            stop.wait(timeout=0.5)
        self._announced = {(s.broker_id, s.node_id) for s in self._serving()}

    def _serving(self) -> list[Any]:
        return self._serving_or_none() or []

    def _serving_or_none(self) -> list[Any] | None:
        """The serving brokers, or None when the supervisor did not answer (slow: ask again)."""
        import ray

        try:
            return list(ray.get(self.supervisor.serving.remote(), timeout=15))
        except ray.exceptions.RayError:
            return None

    def bootstrap_servers(self) -> str:
        return ",".join(f"{s.host}:{s.port}" for s in self._serving())

    def summary(self) -> list[str]:
        serving = self._serving()
        racks = ", ".join(s.rack or "-" for s in serving)
        return [
            f"  controllers:   {CONTROLLERS} (active + standby)",
            f"  brokers:       one per Ray node with the raylog resource "
            f"({len(serving)} so far, racks {racks})",
            f"  bootstrap:     {','.join(f'{s.host}:{s.port}' for s in serving)}",
        ]

    def news(self) -> list[str]:
        """A line per broker that joined or left since the last call (its Ray node came or
        went, or its broker stopped serving)."""
        serving = self._serving_or_none()
        if serving is None:
            return []  # no answer must not read as every broker leaving
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
        return lines

    def stop(self) -> None:
        """The watcher first (no broker starts while they stop), then as the embedded cluster."""
        import ray

        if self.watcher is not None:
            self._await_step("node watcher", [self.watcher.stop.remote()], STOP_STEP_TIMEOUT_S)
        super().stop()
        if self.watcher is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.watcher, no_restart=True)


def _preferred_catching_up(md: Any, topic: str, partition: int) -> bool:
    """Whether the partition's preferred replica is out of its ISR only until it catches up:
    its broker is registered and its log has not failed."""
    topic_md = md.topics.get(topic)
    if topic_md is None or partition >= len(topic_md.partitions):
        return False
    p = topic_md.partitions[partition]
    pref = p.preferred_leader
    broker = md.brokers.get(pref)
    return (
        broker is not None
        and broker.state == "registered"
        and pref not in p.isr
        and pref not in p.offline_replicas
        and pref not in p.observers
    )


def _rack(index: int) -> str:
    """Racks a, b, c, ... z, aa, ab, ... (one per broker)."""
    letters = string.ascii_lowercase
    name = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, len(letters))
        name = letters[rem] + name
    return name


def _serve_metrics(cluster: EmbeddedCluster, port: int) -> Any:
    from raylog.actors.cluster.metrics import ClusterCollector, MetricsPortError, serve

    try:
        return serve(HOST, port, ClusterCollector(cluster.controllers, cluster.supervisor))
    except MetricsPortError as e:
        raise CliError(str(e)) from e


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    running = raycluster.read_cluster_info(data_dir)
    if running is not None:
        raise CliError(f"a raylog cluster is already running from {data_dir} (pid {running.pid})")
    broker_configs = _parse_configs(args.broker_config or [], flag="--broker-config")
    try:
        config_keys.broker_config(broker_configs)
    except RaylogError as e:
        raise CliError(str(e)) from e
    on_ray_nodes = bool(args.address)  # cluster mode: one broker per `raylog` Ray node
    if on_ray_nodes and args.brokers is not None:
        raise CliError(
            "--brokers does not apply with --address: every Ray node with the raylog resource "
            "runs one broker (ray start --resources '{\"raylog\": 1}')"
        )
    brokers = DEFAULT_BROKERS if args.brokers is None else args.brokers
    if on_ray_nodes:  # the gateways listen on the other nodes' addresses
        metrics_port = args.metrics_port if args.metrics_port is not None else args.port + 1
    else:
        _check_ports_free(HOST, [args.port + i for i in range(brokers)])
        metrics_port = args.metrics_port if args.metrics_port is not None else args.port + brokers
    _check_ports_free(HOST, [metrics_port], what="metrics port")
    store_url, store = _open_object_store(args, data_dir)
    cluster_id = _cluster_id(store)

    # Joining a cluster: Ray's own environment (token, temp dir) as the user set it for it.
    env = dict(os.environ) if on_ray_nodes else raycluster.apply_ray_env(data_dir)
    import ray

    init_kwargs: dict = {
        "namespace": "raylog",
        "include_dashboard": False,
        "logging_level": "WARNING",
        "log_to_driver": False,
    }
    if args.address:
        init_kwargs["address"] = args.address
    else:
        init_kwargs["_temp_dir"] = env["RAY_TMPDIR"]
        init_kwargs["_system_config"] = raycluster.FAST_DEATH_SYSTEM_CONFIG
    try:
        ray.init(**init_kwargs)
    except Exception as e:
        raise CliError(f"Ray did not start: {e}") from e

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    commands = cli_server.CommandServer(_run_here, cli_server.write_token(data_dir))
    cluster = (
        RayNodesCluster(
            data_dir,
            store_url,
            cluster_id,
            args.port,
            s3_endpoint=args.s3_endpoint,
            broker_configs=broker_configs,
        )
        if on_ray_nodes
        else EmbeddedCluster(
            data_dir,
            store_url,
            cluster_id,
            brokers,
            args.port,
            s3_endpoint=args.s3_endpoint,
            broker_configs=broker_configs,
        )
    )
    try:
        gcs = ray.get_runtime_context().gcs_address
        token = env.get("RAY_AUTH_TOKEN_PATH", "")
        raycluster.write_cluster_info(
            data_dir,
            raycluster.ClusterInfo(
                ray_address=gcs,
                token_path=token,
                ray_temp_dir=env.get("RAY_TMPDIR", ""),
                pid=os.getpid(),
                admin_port=commands.port,
            ),
        )
        print(f"raylog cluster {cluster_id}", flush=True)
        print(f"  data dir:      {data_dir}")
        print(f"  object store:  {store_url}")
        print(f"  ray:           {gcs} (token {token or 'none'})", flush=True)
        # A signal while starting is seen once start() returns (it is bounded).
        cluster.start(stop)
        metrics_server = _serve_metrics(cluster, metrics_port)
        if not stop.is_set():
            for line in cluster.summary():
                print(line)
            print(f"  metrics:       http://{HOST}:{metrics_port}/metrics")
            print(f"raylog ready; stop with Ctrl-C or `kill -TERM {os.getpid()}`", flush=True)
            # Bounded waits so that signals are handled promptly on every platform.
            while not stop.wait(timeout=1.0):
                for line in cluster.news():
                    print(line, flush=True)
        print("raylog stopping", flush=True)
        metrics_server.shutdown()
    finally:
        commands.close()
        try:
            cluster.stop()
        finally:
            raycluster.remove_cluster_info(data_dir)
            (data_dir / cli_server.TOKEN_FILE).unlink(missing_ok=True)
            ray.shutdown()
    print("raylog stopped", flush=True)
    return 0


# --- joining a running cluster ------------------------------------------------------------------


def _cluster_data_dir(args: argparse.Namespace) -> Path:
    """The data dir whose running cluster a command asks (not created when missing)."""
    raw = args.data_dir or os.environ.get("RAYLOG_DATA_DIR") or DEFAULT_DATA_DIR
    return Path(raw).expanduser().absolute()


def _join(args: argparse.Namespace) -> None:
    """Join the running cluster's Ray: from ``--address`` (Ray's own environment gives the
    token), else from the data dir's ``cluster.json`` (``--data-dir``, $RAYLOG_DATA_DIR, or the
    default)."""
    joined = sys.modules.get("ray")
    if joined is not None and joined.is_initialized():
        return  # run by `raylog up` for a CLI (actors/cli/server.py), with its connection
    address = getattr(args, "address", None)
    if address:
        ray_address = address
    else:
        data_dir = _cluster_data_dir(args)
        info = raycluster.read_cluster_info(data_dir)
        if info is None:
            raise CliError(f"no raylog cluster is running from {data_dir} (start one: raylog up)")
        # The Ray environment (token, loopback, temp dir) must be set before ray is imported.
        raycluster.apply_ray_env(data_dir)
        # `raylog up --address` records the Ray cluster's own token and temp dir, not the
        # data dir's: use what the running cluster wrote down.
        if info.token_path:
            os.environ["RAY_AUTH_TOKEN_PATH"] = info.token_path
        if info.ray_temp_dir:
            os.environ["RAY_TMPDIR"] = info.ray_temp_dir
        ray_address = info.ray_address
    import ray

    try:
        ray.init(
            address=ray_address,
            namespace="raylog",
            logging_level="WARNING",
            log_to_driver=False,
        )
    except Exception as e:
        raise CliError(f"cannot join Ray at {ray_address}: {one_line(e)}") from e


def _connect(args: argparse.Namespace) -> Any:
    """Join the running cluster; returns the active controller's handle."""
    _join(args)
    import ray

    from raylog.actors.calls import NAMESPACE, controller_actor_name

    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while time.monotonic() < deadline:
        for i in range(CONTROLLERS):
            try:
                handle = ray.get_actor(controller_actor_name(i), namespace=NAMESPACE)
                if ray.get(handle.status.remote(), timeout=5).active:
                    return handle
            except Exception:  # missing, dead or slow: try the other one
                continue
        time.sleep(0.2)
    raise CliError(f"no active controller within {CONNECT_TIMEOUT_S:.0f} s")


def _supervisor() -> Any:
    """The SupervisorActor of the `raylog up` process (after :func:`_connect`)."""
    import ray

    from raylog.actors.calls import NAMESPACE, SUPERVISOR_ACTOR_NAME

    try:
        return ray.get_actor(SUPERVISOR_ACTOR_NAME, namespace=NAMESPACE)
    except ValueError as e:
        raise CliError("this cluster has no broker supervisor (not started by raylog up)") from e


def _call(actor: Any, method: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
    import ray

    from raylog.actors.cluster.supervisor import SupervisorError

    try:
        return ray.get(getattr(actor, method).remote(*args), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError as e:
        raise CliError(f"{method}: no answer within {timeout_s:.0f} s") from e
    except Exception as e:
        cause = remote_cause(e)
        if isinstance(cause, SupervisorError):
            raise CliError(one_line(cause)) from e
        raise CliError(f"{type(cause).__name__}: {one_line(cause)}") from e


def _print_json(value: Any) -> None:
    import json

    print(json.dumps(value, indent=2, sort_keys=True), flush=True)


def _parse_configs(pairs: list[str], flag: str = "--config") -> dict[str, str]:
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"{flag} wants key=value, got {pair!r}")
        configs[key] = value
    return configs


# --- raylog topics ------------------------------------------------------------------------------


def cmd_topics_create(args: argparse.Namespace) -> int:
    configs = _parse_configs(args.config or [])
    controller = _connect(args)
    _call(controller, "create_topic", args.name, args.partitions, args.replication_factor, configs)
    # Leaders elected and every broker hosting its replicas: clients can produce at once.
    if _call(controller, "wait_reconciled", int(CALL_TIMEOUT_S * 1000)) < 0:
        print(f"raylog: topic {args.name} created; replicas not all started yet", file=sys.stderr)
    print(f"Created topic {args.name}.", flush=True)
    return 0


def cmd_topics_delete(args: argparse.Namespace) -> int:
    from raylog.gateway.actor import INTERNAL_TOPICS

    internal = [n for n in args.names if n in INTERNAL_TOPICS]
    if internal:
        raise CliError(f"topic {internal[0]} is internal and cannot be deleted")
    controller = _connect(args)
    for name in args.names:
        _call(controller, "delete_topic", name)
    # Every broker stopped the replicas and removed their data.
    if _call(controller, "wait_reconciled", int(CALL_TIMEOUT_S * 1000)) < 0:
        print("raylog: topics deleted; replicas not all stopped yet", file=sys.stderr)
    for name in args.names:
        print(f"Deleted topic {name}.", flush=True)
    return 0


def cmd_topics_list(args: argparse.Namespace) -> int:
    md = _call(_connect(args), "metadata")
    if args.json:
        _print_json(
            [
                {"name": name, "partitions": len(t.partitions), "topic_id": t.topic_id}
                for name, t in sorted(md.topics.items())
            ]
        )
    else:
        for name in sorted(md.topics):
            print(name)
        sys.stdout.flush()
    return 0


def _ids(ids: Any) -> str:
    return ",".join(str(i) for i in ids)


def cmd_topics_describe(args: argparse.Namespace) -> int:
    from raylog.actors.control import health

    md = _call(_connect(args), "metadata")
    if args.name and args.name not in md.topics:
        raise CliError(f"topic {args.name!r} does not exist")
    names = [args.name] if args.name else sorted(md.topics)
    rows = health.partition_health(md, names)
    if args.under_replicated_partitions:
        rows = [r for r in rows if r.under_replicated]
    if args.json:
        _print_json([_topic_json(md.topics[n], [r for r in rows if r.topic == n]) for n in names])
        return 0
    for name in names:
        t = md.topics[name]
        if not args.under_replicated_partitions:  # as kafka-topics.sh: only partition lines
            configs = ",".join(f"{k}={v}" for k, v in sorted(t.configs.items()))
            rf = len(t.partitions[0].replicas) if t.partitions else 0
            print(
                f"Topic: {name}\tTopicId: {t.topic_id}\tPartitionCount: {len(t.partitions)}\t"
                f"ReplicationFactor: {rf}\tConfigs: {configs}"
            )
        for r in rows:
            if r.topic == name:
                print(_partition_line(r))
    sys.stdout.flush()
    return 0


def _partition_line(r: Any) -> str:
    """One partition as kafka-topics.sh --describe prints it; replicas whose log failed (which
    Kafka's tool leaves out) follow as ``Offline: ...`` where there are any."""
    line = (
        f"\tTopic: {r.topic}\tPartition: {r.partition}\tLeader: {r.leader}\t"
        f"Replicas: {_ids(r.replicas)}\tIsr: {_ids(r.isr)}\tLeaderEpoch: {r.leader_epoch}"
    )
    return f"{line}\tOffline: {_ids(r.offline_replicas)}" if r.offline_replicas else line


def _topic_json(t: Any, rows: list[Any]) -> dict[str, Any]:
    return {
        "name": t.name,
        "topic_id": t.topic_id,
        "partition_count": len(t.partitions),
        "replication_factor": len(t.partitions[0].replicas) if t.partitions else 0,
        "configs": dict(t.configs),
        "partitions": [
            {
                "partition": r.partition,
                "leader": r.leader,
                "leader_epoch": r.leader_epoch,
                "replicas": list(r.replicas),
                "isr": list(r.isr),
                "offline": r.offline,
                "offline_replicas": list(r.offline_replicas),
                "under_replicated": r.under_replicated,
                "under_min_isr": r.under_min_isr,
            }
            for r in rows
        ],
    }


# --- raylog configs -----------------------------------------------------------------------------


def cmd_configs_describe(args: argparse.Namespace) -> int:
    entries = _call(_connect(args), "describe_configs", args.topic)
    if args.json:
        _print_json({e.name: {"value": e.value, "default": e.is_default} for e in entries})
        return 0
    print(f"All configs for topic {args.topic} are:")
    for e in entries:
        print(f"  {e.name}={e.value}{'' if e.is_default else ' (topic override)'}")
    sys.stdout.flush()
    return 0


def cmd_configs_alter(args: argparse.Namespace) -> int:
    sets = _parse_configs(args.set or [], flag="--set")
    deletes = set(args.delete or [])
    if not sets and not deletes:
        raise CliError("configs alter needs --set k=v or --delete k")
    if both := deletes & sets.keys():
        raise CliError(f"both set and deleted: {', '.join(sorted(both))}")
    controller = _connect(args)
    # AlterConfigs replaces the whole override set: start from the current one.
    current = dict(_call(controller, "describe_topic", args.topic).configs)
    overrides = {k: v for k, v in {**current, **sets}.items() if k not in deletes}
    _call(controller, "alter_configs", args.topic, overrides)
    print(f"Completed updating config for topic {args.topic}.", flush=True)
    return 0


# --- raylog brokers -----------------------------------------------------------------------------


def cmd_brokers_list(args: argparse.Namespace) -> int:
    from raylog.actors.control import health

    md = _call(_connect(args), "metadata")
    stopped = {b for b, how in _call(_supervisor(), "lifecycle").items() if how == "stopped"}
    rows = health.broker_rows(md, stopped)
    if args.json:
        _print_json(
            [
                {
                    "id": r.broker_id,
                    "rack": r.rack,
                    "host": r.host,
                    "port": r.port,
                    "state": r.state,
                    "leader_partitions": r.leader_partitions,
                }
                for r in rows
            ]
        )
        return 0
    print(f"{'ID':>4}  {'RACK':<6} {'ADDRESS':<22} {'STATE':<9} LEADERS")
    for r in rows:
        address = f"{r.host}:{r.port}"
        print(
            f"{r.broker_id:>4}  {r.rack or '-':<6} {address:<22} {r.state:<9} {r.leader_partitions}"
        )
    sys.stdout.flush()
    return 0


def cmd_brokers_stop(args: argparse.Namespace) -> int:
    _connect(args)
    moved = _call(_supervisor(), "stop_broker", args.id, timeout_s=BROKER_SHUTDOWN_TIMEOUT_S * 2)
    if not moved:
        print(f"raylog: broker {args.id} stopped; leadership move not confirmed", file=sys.stderr)
    print(f"Broker {args.id} stopped (controlled shutdown).", flush=True)
    return 0


def cmd_brokers_kill(args: argparse.Namespace) -> int:
    _connect(args)
    _call(_supervisor(), "kill_broker", args.id)
    print(f"Broker {args.id} killed.", flush=True)
    return 0


def cmd_brokers_start(args: argparse.Namespace) -> int:
    _connect(args)
    _call(_supervisor(), "start_broker", args.id, timeout_s=START_TIMEOUT_S)
    print(f"Broker {args.id} started.", flush=True)
    return 0


# --- raylog leader-election ---------------------------------------------------------------------


def _error_names() -> dict[int, str]:
    from raylog.storage.errors import RaylogError

    names = {}
    pending = list(RaylogError.__subclasses__())
    while pending:  # bounded by the (finite) class tree
        cls = pending.pop()
        names[cls.error_code] = cls.__name__
        pending.extend(cls.__subclasses__())
    return names


def cmd_leader_election(args: argparse.Namespace) -> int:
    from raylog.storage.errors import ElectionNotNeededError

    if args.partition is not None and args.topic is None:
        raise CliError("--partition needs --topic")
    controller = _connect(args)
    partitions = None
    if args.topic is not None:
        t = _call(controller, "describe_topic", args.topic)
        wanted = range(len(t.partitions)) if args.partition is None else [args.partition]
        partitions = [(args.topic, p) for p in wanted]
    codes = _call(controller, "elect_leaders", "preferred", partitions)
    elected = sorted(tp for tp, code in codes.items() if code == 0)
    not_needed = sorted(
        tp for tp, code in codes.items() if code == ElectionNotNeededError.error_code
    )
    failed = sorted((tp, code) for tp, code in codes.items() if tp not in {*elected, *not_needed})
    names = _error_names()
    if elected:
        print("Successfully completed leader election (PREFERRED) for partitions "
              + ", ".join(f"{t}-{p}" for t, p in elected))  # fmt: skip
    if not_needed:
        print("Valid replica already elected for partitions "
              + ", ".join(f"{t}-{p}" for t, p in not_needed))  # fmt: skip
    if not (elected or not_needed or failed):
        print("No partition needs a preferred leader election.")
    sys.stdout.flush()
    if failed:
        raise CliError(
            "leader election failed for "
            + ", ".join(f"{t}-{p} ({names.get(code, code)})" for (t, p), code in failed)
        )
    return 0


# --- raylog status ------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    from raylog.actors.control import health

    controller = _connect(args)
    status = _call(controller, "status")
    md = _call(controller, "metadata")
    stopped = {b for b, how in _call(_supervisor(), "lifecycle").items() if how == "stopped"}
    brokers = health.broker_rows(md, stopped)
    h = health.cluster_health(health.partition_health(md))
    by_state = {
        s: [r.broker_id for r in brokers if r.state == s] for s in ("alive", "fenced", "shutdown")
    }
    if args.json:
        _print_json(
            {
                "cluster_id": md.cluster_id,
                "controller": {
                    "id": status.controller_id,
                    "epoch": status.controller_epoch,
                    "metadata_epoch": status.metadata_epoch,
                },
                "brokers": by_state,
                "topics": len(md.topics),
                "partitions": h.partitions,
                "offline_partitions": h.offline_partitions,
                "under_replicated_partitions": h.under_replicated_partitions,
                "under_min_isr_partitions": h.under_min_isr_partitions,
                "offline_replicas": h.offline_replicas,
            }
        )
        return 0
    print(f"cluster:                     {md.cluster_id}")
    print(f"active controller:           {status.controller_id} (epoch {status.controller_epoch}, "
          f"metadata epoch {status.metadata_epoch})")  # fmt: skip
    for state, ids in by_state.items():
        print(f"brokers {state + ':':<20} {len(ids)} [{_ids(ids)}]")
    print(f"topics:                      {len(md.topics)} ({h.partitions} partitions)")
    print(f"offline partitions:          {h.offline_partitions}")
    print(f"under-replicated partitions: {h.under_replicated_partitions}")
    print(f"under-min-ISR partitions:    {h.under_min_isr_partitions}")
    print(f"offline replicas:            {h.offline_replicas}", flush=True)
    return 0


# --- the parser ---------------------------------------------------------------------------------


def _add_cluster_args(p: argparse.ArgumentParser, json_flag: bool = False) -> None:
    """How a command finds the running cluster (and --json where scripts read the output)."""
    p.add_argument(
        "--data-dir",
        help=f"the cluster's data dir (default $RAYLOG_DATA_DIR or {DEFAULT_DATA_DIR})",
    )
    p.add_argument("--address", help="the Ray address of the cluster (instead of --data-dir)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON for scripts")


def _add_up(sub: Any) -> None:
    up = sub.add_parser("up", help="start the embedded cluster in the foreground")
    up.add_argument(
        "--brokers",
        type=int,
        help=f"brokers to start (default {DEFAULT_BROKERS}; not with --address)",
    )
    up.add_argument(
        "--port",
        type=int,
        default=9092,
        help="first gateway port (default 9092); with --address: every node's gateway port "
        "unless its raylog.port label says otherwise",
    )
    up.add_argument(
        "--metrics-port",
        type=int,
        help="Prometheus endpoint port (default: the port after the last gateway, 9095; "
        "with --address: --port + 1)",
    )
    up.add_argument(
        "--data-dir", help=f"data directory (default $RAYLOG_DATA_DIR or {DEFAULT_DATA_DIR})"
    )
    up.add_argument(
        "--object-store", help="s3://bucket/prefix (default: a directory in the data dir)"
    )
    up.add_argument("--s3-endpoint", help="endpoint URL of an S3-compatible store")
    up.add_argument(
        "--address",
        help="run on this Ray cluster instead of starting one: one broker and gateway on every "
        "Ray node with the raylog resource (rack from its raylog.rack label)",
    )
    up.add_argument(
        "--broker-config",
        action="append",
        metavar="KEY=VALUE",
        help="a broker config, as in Kafka's server.properties (repeatable)",
    )
    up.set_defaults(func=cmd_up)


def _add_topics(sub: Any) -> None:
    topics = sub.add_parser("topics", help="create, delete, list and describe topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--replication-factor", type=int, default=3)
    create.add_argument(
        "--config", action="append", metavar="KEY=VALUE", help="a topic config (repeatable)"
    )
    create.set_defaults(func=cmd_topics_create)
    _add_cluster_args(create)
    delete = topics_sub.add_parser("delete", help="delete topics (replicas stop, data removed)")
    delete.add_argument("names", nargs="+", metavar="name")
    delete.set_defaults(func=cmd_topics_delete)
    _add_cluster_args(delete)
    listing = topics_sub.add_parser("list", help="list topic names")
    listing.set_defaults(func=cmd_topics_list)
    _add_cluster_args(listing, json_flag=True)
    describe = topics_sub.add_parser("describe", help="describe one topic or all")
    describe.add_argument("name", nargs="?")
    describe.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="only partitions whose ISR is smaller than their replicas",
    )
    describe.set_defaults(func=cmd_topics_describe)
    _add_cluster_args(describe, json_flag=True)


def _add_configs(sub: Any) -> None:
    configs = sub.add_parser("configs", help="describe and alter topic configs")
    configs_sub = configs.add_subparsers(dest="configs_command", required=True)
    describe = configs_sub.add_parser("describe", help="every config of a topic")
    describe.add_argument("--topic", required=True)
    describe.set_defaults(func=cmd_configs_describe)
    _add_cluster_args(describe, json_flag=True)
    alter = configs_sub.add_parser("alter", help="set or delete topic config overrides")
    alter.add_argument("--topic", required=True)
    alter.add_argument("--set", action="append", metavar="KEY=VALUE", help="repeatable")
    alter.add_argument("--delete", action="append", metavar="KEY", help="repeatable")
    alter.set_defaults(func=cmd_configs_alter)
    _add_cluster_args(alter)


def _add_brokers(sub: Any) -> None:
    brokers = sub.add_parser("brokers", help="list, stop, kill and start brokers")
    brokers_sub = brokers.add_subparsers(dest="brokers_command", required=True)
    listing = brokers_sub.add_parser("list", help="id, rack, address, state, partitions led")
    listing.set_defaults(func=cmd_brokers_list)
    _add_cluster_args(listing, json_flag=True)
    for name, func, text in (
        ("stop", cmd_brokers_stop, "controlled shutdown: leadership moves first"),
        ("kill", cmd_brokers_kill, "hard crash: kill the broker's actors, no clean-up"),
        ("start", cmd_brokers_start, "start a stopped or killed broker again, as it was"),
    ):
        p = brokers_sub.add_parser(name, help=text)
        p.add_argument("id", type=int)
        p.set_defaults(func=func)
        _add_cluster_args(p)


def _add_leader_election(sub: Any) -> None:
    p = sub.add_parser("leader-election", help="move leadership to preferred replicas")
    p.add_argument("--preferred", action="store_true", required=True)
    p.add_argument("--topic")
    p.add_argument("--partition", type=int)
    p.set_defaults(func=cmd_leader_election)
    _add_cluster_args(p)


def _add_status(sub: Any) -> None:
    p = sub.add_parser("status", help="controller, brokers and partition health")
    p.set_defaults(func=cmd_status)
    _add_cluster_args(p, json_flag=True)


def build_parser() -> argparse.ArgumentParser:
    """One line per command group; other modules add theirs here as ``_add_x(sub)`` hooks
    (taking the subparsers object, calling ``_add_cluster_args`` for --data-dir/--address)."""
    parser = argparse.ArgumentParser(prog="raylog", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_up(sub)
    _add_topics(sub)
    _add_configs(sub)
    _add_brokers(sub)
    _add_leader_election(sub)
    _add_status(sub)
    __import__("raylog.actors.cli.pipeline", fromlist=["add_subcommands"]).add_subcommands(sub)
    __import__("raylog.actors.cli.reassign", fromlist=["add_subcommands"]).add_subcommands(sub)
    return parser


class _MainThreadStdout(io.TextIOBase):
    """``sys.stdout`` for commands other than ``up``: what the main thread writes (tables,
    JSON) goes to stdout, what other threads write goes to stderr. Ray's driver relays raylet
    warnings ("N worker processes have been started ...") to ``sys.stdout`` from a background
    thread, which would otherwise land in the middle of ``--json`` output."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self._out, self._err = out, err

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        main = threading.current_thread() is threading.main_thread()
        return (self._out if main else self._err).write(text)

    def flush(self) -> None:
        self._out.flush()
        self._err.flush()


def _run_here(argv: list[str]) -> int:
    """A command `raylog up` runs for a CLI (actors/cli/server.py), with its Ray connection."""
    args = build_parser().parse_args(argv)
    if args.func is cmd_up:
        raise CliError("up is not run by a running cluster")
    return _dispatch(args)


def _run_on_cluster(args: argparse.Namespace, argv: list[str]) -> int | None:
    """Has the running `raylog up` of the data dir run this command; None when it serves no
    commands (then the caller joins Ray itself)."""
    data_dir = _cluster_data_dir(args)
    info = raycluster.read_cluster_info(data_dir)
    if info is None or not info.admin_port:
        return None
    try:
        token = (data_dir / cli_server.TOKEN_FILE).read_text().strip()
    except OSError:
        return None
    try:
        # The data dir as this process resolved it: `raylog up` runs in another directory.
        answer = cli_server.request(info.admin_port, token, [*argv, "--data-dir", str(data_dir)])
    except cli_server.NotServed:
        return None
    except (OSError, ValueError) as e:
        print(f"raylog: the cluster's command endpoint failed: {one_line(e)}", file=sys.stderr)
        return 1
    sys.stdout.write(answer["stdout"])
    sys.stdout.flush()
    sys.stderr.write(answer["stderr"])
    return int(answer["code"])


def _dispatch(args: argparse.Namespace) -> int:
    if getattr(args, "brokers", None) is not None and args.brokers < 1:
        print("raylog: --brokers must be at least 1", file=sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except CliError as e:
        print(f"raylog: {e}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    guarded = getattr(args, "func", None) is not cmd_up
    # The commands that ask the running cluster (those with --data-dir); `pipeline` runs here.
    if guarded and "data_dir" in vars(args) and not getattr(args, "address", None):
        served = _run_on_cluster(args, argv)
        if served is not None:
            return served
    if guarded and not isinstance(sys.stdout, _MainThreadStdout):
        sys.stdout = _MainThreadStdout(sys.stdout, sys.stderr)
    try:
        return _dispatch(args)
    finally:
        if guarded:
            # The command's output is complete. Ray's exit hook (ray.shutdown, on the main
            # thread) prints the raylet warnings it held back for de-duplication to
            # sys.stdout: they belong on stderr, after the table or JSON document.
            sys.stdout.flush()
            sys.stdout = sys.stderr


if __name__ == "__main__":
    sys.exit(main())
