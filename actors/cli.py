"""The `raylog` command line: `raylog up` runs the embedded cluster in the foreground, and
`raylog topics create|describe` manage topics of a running one.

`raylog up` starts a local Ray cluster configured for raylog (token authentication, loopback,
fast death detection, its temp dir under the data dir), the object store holding the cluster's
identity and metadata, two controllers (active + standby), ``--brokers`` brokers on racks a, b,
c, ... and one Kafka gateway per broker on consecutive ports from ``--port``. Ctrl-C (SIGINT) or
SIGTERM stops them in reverse order: gateways, brokers (controlled shutdown), controllers
(releasing the lease), Ray.

`raylog topics` finds the cluster from ``--data-dir`` (its ``cluster.json``), joins Ray with the
cluster's token and calls the active controller.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import string
import sys
import threading
import time
from pathlib import Path
from typing import Any

from raylog.actors import raycluster, topic_config
from raylog.storage.errors import RaylogError
from raylog.storage.objectstore import ObjectStore

DEFAULT_DATA_DIR = "./raylog-data"
HOST = "127.0.0.1"  # the embedded cluster listens on loopback only
CONTROLLERS = 2  # active + standby
# Takeover by the standby within lease_ms of the active one dying; lease >= 2 x renew.
CONTROLLER_LEASE = {"lease_ms": 6_000, "renew_ms": 2_000, "poll_ms": 200}
START_TIMEOUT_S = 90.0  # controllers elected, brokers registered, gateways serving
STOP_STEP_TIMEOUT_S = 15.0
BROKER_SHUTDOWN_TIMEOUT_S = 40.0
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


def _check_ports_free(host: str, ports: list[int]) -> None:
    """Fail before starting anything when a gateway port is taken (one line, exit 1)."""
    import socket

    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As asyncio.start_server does: a port in TIME_WAIT is free, a listening one is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as e:
                raise CliError(f"port {host}:{port} is not available: {e.strerror or e}") from e


def _remote_cause(exc: BaseException) -> BaseException:
    """The exception a remote method raised (Ray wraps it in RayTaskError with ``cause``)."""
    return getattr(exc, "cause", None) or exc


class EmbeddedCluster:
    """The actors `raylog up` starts, held for the process's lifetime (they are not detached).

    Start order: controllers, brokers (which register with the active controller), then one
    gateway per broker. Stop order is the reverse (see :meth:`stop`).
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
        self.brokers: dict[int, Any] = {}
        self.gateways: dict[int, Any] = {}

    def start(self) -> None:
        import ray

        from raylog.actors.broker import BrokerActor, broker_actor_name
        from raylog.actors.controller import ControllerActor, controller_actor_name
        from raylog.actors.gateway_actor import GatewayActor, gateway_actor_name
        from raylog.actors.replica import NAMESPACE

        names = tuple(controller_actor_name(i) for i in range(CONTROLLERS))
        for name in names:
            self.controllers.append(
                ControllerActor.options(name=name, namespace=NAMESPACE).remote(  # type: ignore[attr-defined]
                    self.store_url,
                    name,
                    s3_endpoint=self.s3_endpoint,
                    cluster_id=self.cluster_id,
                    broker_configs=self.broker_configs,
                    **CONTROLLER_LEASE,
                )
            )
        for i, b in enumerate(self.broker_ids):
            self.brokers[b] = BrokerActor.options(  # type: ignore[attr-defined]
                name=broker_actor_name(b), namespace=NAMESPACE
            ).remote(
                b,
                str(self.data_dir),
                rack=_rack(i),
                host=HOST,
                port=self.ports[b],
                controller_names=names,
                broker_configs=self.broker_configs,
            )
        for b in self.broker_ids:
            self.gateways[b] = GatewayActor.options(  # type: ignore[attr-defined]
                name=gateway_actor_name(b), namespace=NAMESPACE
            ).remote(b, self.cluster_id, host=HOST, port=self.ports[b], controller_names=names)
        try:
            ray.get([g.start.remote() for g in self.gateways.values()], timeout=START_TIMEOUT_S)
        except Exception as e:
            raise CliError(str(_remote_cause(e)).splitlines()[0]) from e
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Every broker registered and every gateway serving a view that lists them all."""
        import ray

        deadline = time.monotonic() + START_TIMEOUT_S
        want = self.broker_ids
        while True:
            try:
                brokers = ray.get([b.status.remote() for b in self.brokers.values()], timeout=5)
                gateways = ray.get([g.status.remote() for g in self.gateways.values()], timeout=5)
                registered = all(s["broker_epoch"] > 0 for s in brokers)
                if registered and all(g["serving"] and g["brokers"] == want for g in gateways):
                    return
            except ray.exceptions.RayError:
                pass  # slow or restarting (brokers restart by themselves): ask again
            if time.monotonic() >= deadline:
                raise CliError(
                    f"cluster not ready within {START_TIMEOUT_S:.0f} s "
                    "(brokers not registered or gateways without metadata)"
                )
            time.sleep(0.1)

    def bootstrap_servers(self) -> str:
        return ",".join(f"{HOST}:{self.ports[b]}" for b in self.broker_ids)

    def stop(self) -> None:
        """1. gateways stop listening; 2. each broker shuts down controlled (leadership moves
        to the brokers still up); 3. controllers stop and release the lease. Every step is
        bounded; a step that fails is reported and the next one still runs."""
        import ray

        self._await_step(
            "gateways", [g.stop.remote() for g in self.gateways.values()], STOP_STEP_TIMEOUT_S
        )
        # One broker at a time, as Kafka's rolling shutdown: each moves its leaderships to the
        # brokers still running.
        for b, handle in self.brokers.items():
            self._await_step(f"broker {b}", [handle.shutdown.remote()], BROKER_SHUTDOWN_TIMEOUT_S)
        self._await_step(
            "controllers", [c.stop.remote() for c in self.controllers], STOP_STEP_TIMEOUT_S
        )
        for handle in [*self.gateways.values(), *self.brokers.values(), *self.controllers]:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)

    @staticmethod
    def _await_step(what: str, refs: list[Any], timeout_s: float) -> None:
        import ray

        try:
            ray.get(refs, timeout=timeout_s)
        except Exception as e:
            first = str(_remote_cause(e)).splitlines()[0] if str(e) else type(e).__name__
            print(f"raylog: stopping {what}: {first}", file=sys.stderr, flush=True)


def _rack(index: int) -> str:
    """Racks a, b, c, ... z, aa, ab, ... (one per broker)."""
    letters = string.ascii_lowercase
    name = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, len(letters))
        name = letters[rem] + name
    return name


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    running = raycluster.read_cluster_info(data_dir)
    if running is not None:
        raise CliError(f"a raylog cluster is already running from {data_dir} (pid {running.pid})")
    broker_configs = _parse_configs(args.broker_config or [], flag="--broker-config")
    try:
        topic_config.broker_config(broker_configs)
    except RaylogError as e:
        raise CliError(str(e)) from e
    _check_ports_free(HOST, [args.port + i for i in range(args.brokers)])
    store_url, store = _open_object_store(args, data_dir)
    cluster_id = _cluster_id(store)

    env = raycluster.apply_ray_env(data_dir)
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
    cluster = EmbeddedCluster(
        data_dir,
        store_url,
        cluster_id,
        args.brokers,
        args.port,
        s3_endpoint=args.s3_endpoint,
        broker_configs=broker_configs,
    )
    try:
        gcs = ray.get_runtime_context().gcs_address
        raycluster.write_cluster_info(
            data_dir,
            raycluster.ClusterInfo(
                ray_address=gcs,
                token_path=env["RAY_AUTH_TOKEN_PATH"],
                ray_temp_dir=env["RAY_TMPDIR"],
                pid=os.getpid(),
            ),
        )
        print(f"raylog cluster {cluster_id}", flush=True)
        print(f"  data dir:      {data_dir}")
        print(f"  object store:  {store_url}")
        print(f"  ray:           {gcs} (token {env['RAY_AUTH_TOKEN_PATH']})", flush=True)
        # A signal while starting is seen once start() returns (it is bounded).
        cluster.start()
        if not stop.is_set():
            racks = ", ".join(_rack(i) for i in range(args.brokers))
            print(f"  controllers:   {CONTROLLERS} (active + standby)")
            print(f"  brokers:       {args.brokers} (racks {racks})")
            print(f"  bootstrap:     {cluster.bootstrap_servers()}")
            print(f"raylog ready; stop with Ctrl-C or `kill -TERM {os.getpid()}`", flush=True)
            # Bounded waits so that signals are handled promptly on every platform.
            while not stop.wait(timeout=1.0):
                pass
        print("raylog stopping", flush=True)
    finally:
        try:
            cluster.stop()
        finally:
            raycluster.remove_cluster_info(data_dir)
            ray.shutdown()
    print("raylog stopped", flush=True)
    return 0


# --- raylog topics ------------------------------------------------------------------------------


def _connect(args: argparse.Namespace) -> Any:
    """Join the running cluster of ``--data-dir``; returns the active controller's handle."""
    raw = args.data_dir or os.environ.get("RAYLOG_DATA_DIR") or DEFAULT_DATA_DIR
    data_dir = Path(raw).expanduser().absolute()
    info = raycluster.read_cluster_info(data_dir)
    if info is None:
        raise CliError(f"no raylog cluster is running from {data_dir} (start one: raylog up)")
    # The Ray environment (token, loopback, temp dir) must be set before ray is imported.
    raycluster.apply_ray_env(data_dir)
    import ray

    try:
        ray.init(
            address=info.ray_address,
            namespace="raylog",
            logging_level="WARNING",
            log_to_driver=False,
        )
    except Exception as e:
        raise CliError(f"cannot join Ray at {info.ray_address}: {e}") from e
    from raylog.actors.controller import controller_actor_name
    from raylog.actors.replica import NAMESPACE

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


def _call(controller: Any, method: str, *args: Any) -> Any:
    import ray

    try:
        return ray.get(getattr(controller, method).remote(*args), timeout=CALL_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError as e:
        raise CliError(f"{method}: no answer within {CALL_TIMEOUT_S:.0f} s") from e
    except Exception as e:
        cause = _remote_cause(e)
        text = str(cause).splitlines()[0] if str(cause) else ""
        raise CliError(f"{type(cause).__name__}: {text}") from e


def _parse_configs(pairs: list[str], flag: str = "--config") -> dict[str, str]:
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"{flag} wants key=value, got {pair!r}")
        configs[key] = value
    return configs


def cmd_topics_create(args: argparse.Namespace) -> int:
    configs = _parse_configs(args.config or [])
    controller = _connect(args)
    _call(controller, "create_topic", args.name, args.partitions, args.replication_factor, configs)
    # Leaders elected and every broker hosting its replicas: clients can produce at once.
    if _call(controller, "wait_reconciled", int(CALL_TIMEOUT_S * 1000)) < 0:
        print(f"raylog: topic {args.name} created; replicas not all started yet", file=sys.stderr)
    print(f"Created topic {args.name}.", flush=True)
    return 0


def _ids(ids: Any) -> str:
    return ",".join(str(i) for i in ids)


def cmd_topics_describe(args: argparse.Namespace) -> int:
    controller = _connect(args)
    md = _call(controller, "metadata")
    names = [args.name] if args.name else sorted(md.topics)
    if args.name and args.name not in md.topics:
        raise CliError(f"topic {args.name!r} does not exist")
    for name in names:
        t = md.topics[name]
        configs = ",".join(f"{k}={v}" for k, v in sorted(t.configs.items()))
        rf = len(t.partitions[0].replicas) if t.partitions else 0
        print(
            f"Topic: {name}\tTopicId: {t.topic_id}\tPartitionCount: {len(t.partitions)}\t"
            f"ReplicationFactor: {rf}\tConfigs: {configs}"
        )
        for p in t.partitions:
            print(
                f"\tTopic: {name}\tPartition: {p.partition}\tLeader: {p.leader}\t"
                f"Replicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}\t"
                f"LeaderEpoch: {p.leader_epoch}"
            )
    sys.stdout.flush()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raylog", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the embedded cluster in the foreground")
    up.add_argument("--brokers", type=int, default=3, help="brokers to start (default 3)")
    up.add_argument("--port", type=int, default=9092, help="first gateway port (default 9092)")
    up.add_argument(
        "--data-dir", help=f"data directory (default $RAYLOG_DATA_DIR or {DEFAULT_DATA_DIR})"
    )
    up.add_argument(
        "--object-store", help="s3://bucket/prefix (default: a directory in the data dir)"
    )
    up.add_argument("--s3-endpoint", help="endpoint URL of an S3-compatible store")
    up.add_argument("--address", help="join this Ray cluster instead of starting one")
    up.add_argument(
        "--broker-config",
        action="append",
        metavar="KEY=VALUE",
        help="a broker config, as in Kafka's server.properties (repeatable)",
    )
    up.set_defaults(func=cmd_up)

    topics = sub.add_parser("topics", help="create and describe topics of a running cluster")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--replication-factor", type=int, default=3)
    create.add_argument(
        "--config", action="append", metavar="KEY=VALUE", help="a topic config (repeatable)"
    )
    create.set_defaults(func=cmd_topics_create)
    describe = topics_sub.add_parser("describe", help="describe one topic or all")
    describe.add_argument("name", nargs="?")
    describe.set_defaults(func=cmd_topics_describe)
    for p in (create, describe):
        p.add_argument(
            "--data-dir",
            help=f"the cluster's data dir (default $RAYLOG_DATA_DIR or {DEFAULT_DATA_DIR})",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "brokers", 1) < 1:
        print("raylog: --brokers must be at least 1", file=sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except CliError as e:
        print(f"raylog: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
