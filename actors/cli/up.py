"""`raylog up`: run a cluster in the foreground until Ctrl-C (SIGINT) or SIGTERM.

Without ``--address`` it starts a local Ray cluster configured for raylog and the embedded
cluster on it (``raylog.actors.cluster.embedded``: controllers, ``--brokers`` brokers, a gateway
per broker on consecutive ports from ``--port``); with ``--address RAY_ADDRESS`` it runs raylog
on that Ray cluster, one broker and gateway per Ray node with the ``raylog`` resource
(``raylog.actors.cluster.raynodes``). Both also serve Prometheus metrics on ``--metrics-port``.

This module owns the command: its arguments, what it prints, the signals, and the loopback
endpoint that runs the other commands for CLIs (``raylog.actors.cli.server``). The steps
before the actors start are ``raylog.actors.cluster.bootstrap``'s; the cluster modules import
Ray, so they are imported once Ray's environment is set.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import signal
import sys
import threading
from typing import Any

from raylog.actors import raycluster
from raylog.actors.cli import server as cli_server
from raylog.actors.cli.client import DEFAULT_DATA_DIR, CliError, data_dir_of
from raylog.actors.cli.text import parse_configs

DEFAULT_BROKERS = 3  # embedded cluster
DEFAULT_PORT = 9092


def cmd_up(args: argparse.Namespace, run_command: cli_server.Runner) -> int:
    """Runs until a signal; ``run_command`` runs a command a CLI sent to the endpoint."""
    if args.brokers is not None and args.brokers < 1:
        print("raylog: --brokers must be at least 1", file=sys.stderr)
        return 2
    from raylog.actors.cluster.bootstrap import ClusterError

    try:
        return _up(args, run_command)
    except ClusterError as e:
        raise CliError(str(e)) from e


def _up(args: argparse.Namespace, run_command: cli_server.Runner) -> int:
    from raylog.actors.cluster import bootstrap
    from raylog.actors.control import config_keys
    from raylog.actors.control import listeners as listeners_
    from raylog.storage.errors import RaylogError

    data_dir = bootstrap.prepare_data_dir(data_dir_of(args))
    running = raycluster.read_cluster_info(data_dir)
    if running is not None:
        raise CliError(f"a raylog cluster is already running from {data_dir} (pid {running.pid})")
    broker_configs = parse_configs(args.broker_config or [], flag="--broker-config")
    try:
        config = config_keys.broker_config(broker_configs)
    except RaylogError as e:
        raise CliError(str(e)) from e
    on_ray_nodes = bool(args.address)  # cluster mode: one broker per `raylog` Ray node
    if on_ray_nodes and args.brokers is not None:
        raise CliError(
            "--brokers does not apply with --address: every Ray node with the raylog resource "
            "runs one broker (ray start --resources '{\"raylog\": 1}')"
        )
    brokers = DEFAULT_BROKERS if args.brokers is None else args.brokers
    host = bootstrap.HOST
    if on_ray_nodes:  # the gateways listen on the other nodes' addresses
        try:
            listeners_.configured(
                config, default=listeners_.RAY_CLUSTER_DEFAULT.format(port=args.port)
            )
        except RaylogError as e:
            raise CliError(str(e)) from e
        metrics_port = args.metrics_port if args.metrics_port is not None else args.port + 1
    else:
        try:
            listened = [
                listener
                for own in listeners_.embedded_brokers(
                    listeners_.configured(config, default=f"PLAINTEXT://{host}:{args.port}"),
                    brokers,
                    host,
                )
                for listener in own
            ]
        except RaylogError as e:
            raise CliError(str(e)) from e
        for listener in listened:
            bootstrap.check_ports_free(listener.host or "0.0.0.0", [listener.port])
        metrics_port = args.metrics_port if args.metrics_port is not None else args.port + brokers
        if metrics_port in {listener.port for listener in listened}:
            raise CliError(f"metrics port {metrics_port} is a listener's: give --metrics-port")
    bootstrap.check_ports_free(host, [metrics_port], what="metrics port")
    store_url, store = bootstrap.open_store(args.object_store, data_dir, args.s3_endpoint)
    cluster_id = bootstrap.cluster_id(store)
    info = bootstrap.start_ray(data_dir, args.address)
    # Ray's environment is set: the cluster modules (they import Ray) may load now.
    from raylog.actors.cluster.embedded import EmbeddedCluster
    from raylog.actors.cluster.raynodes import RayNodesCluster

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    commands = cli_server.CommandServer(run_command, cli_server.write_token(data_dir))
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
        raycluster.write_cluster_info(data_dir, dataclasses.replace(info, admin_port=commands.port))
        print(f"raylog cluster {cluster_id}", flush=True)
        print(f"  data dir:      {data_dir}")
        print(f"  object store:  {store_url}")
        print(
            f"  ray:           {info.ray_address} (token {info.token_path or 'none'})", flush=True
        )
        # A signal while starting is seen once start() returns (it is bounded).
        cluster.start(stop)
        metrics_server = cluster.serve_metrics(metrics_port)
        if not stop.is_set():
            for line in cluster.summary():
                print(line)
            print(f"  metrics:       http://{host}:{metrics_port}/metrics")
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
            bootstrap.stop_ray()
    print("raylog stopped", flush=True)
    return 0


def add_subcommands(sub: Any, run_command: cli_server.Runner) -> None:
    """Adds ``up`` to ``raylog``'s subparsers; ``run_command`` is how `raylog up` runs a command
    a CLI sends it (``raylog.actors.cli.main.run_here``)."""
    up = sub.add_parser("up", help="start the embedded cluster in the foreground")
    up.add_argument(
        "--brokers",
        type=int,
        help=f"brokers to start (default {DEFAULT_BROKERS}; not with --address)",
    )
    up.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"first gateway port (default {DEFAULT_PORT}); with --address: every node's gateway "
        "port unless its raylog.port label says otherwise",
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
    up.set_defaults(func=functools.partial(cmd_up, run_command=run_command))
