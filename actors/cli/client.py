"""How a command reaches the running cluster.

A command finds the cluster from ``--data-dir`` (its ``cluster.json``; else $RAYLOG_DATA_DIR,
else ``./raylog-data``) or from ``--address``:

1. :func:`run_on_cluster`: the data dir's `raylog up` runs the command on its loopback command
   endpoint (``raylog.actors.cli.server``) with its own Ray connection, and this process never
   imports Ray;
2. else :func:`join`: this process joins Ray with the token and temp dir ``cluster.json`` names
   (or at ``--address``, with Ray's own environment), and the command asks the active
   controller (:func:`connect`) or the supervisor (:func:`supervisor`), each call bounded
   (:func:`call`).

Ray is imported only inside the functions that join it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from raylog.actors import raycluster
from raylog.actors.cli import server as cli_server
from raylog.storage.errors import one_line, remote_cause

DEFAULT_DATA_DIR = "./raylog-data"
CONNECT_TIMEOUT_S = 20.0  # an active controller found
CALL_TIMEOUT_S = 30.0  # one controller call


class CliError(Exception):
    """A failure to report as one line and a non-zero exit."""


def add_cluster_args(p: argparse.ArgumentParser, json_flag: bool = False) -> None:
    """How a command finds the running cluster (and --json where scripts read the output)."""
    p.add_argument(
        "--data-dir",
        help=f"the cluster's data dir (default $RAYLOG_DATA_DIR or {DEFAULT_DATA_DIR})",
    )
    p.add_argument("--address", help="the Ray address of the cluster (instead of --data-dir)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON for scripts")


def data_dir_of(args: argparse.Namespace) -> Path:
    """The data dir a command names (``--data-dir``, $RAYLOG_DATA_DIR, the default); absolute,
    not created."""
    raw = args.data_dir or os.environ.get("RAYLOG_DATA_DIR") or DEFAULT_DATA_DIR
    return Path(raw).expanduser().absolute()


def run_on_cluster(args: argparse.Namespace, argv: list[str]) -> int | None:
    """Has the running `raylog up` of the data dir run this command; None when it serves no
    commands (then the caller joins Ray itself)."""
    data_dir = data_dir_of(args)
    info = raycluster.read_cluster_info(data_dir)
    if info is None or not info.admin_port:
        return None
    try:
        token = (data_dir / cli_server.TOKEN_FILE).read_text().strip()
    except OSError:
        return None
    try:
        # The data dir as this process resolved it: `raylog up` runs in another directory.
        answer = cli_server.request(
            info.admin_port, token, [*argv, "--data-dir", str(data_dir)], on_stderr=_to_stderr
        )
    except cli_server.NotServed:
        return None
    except (OSError, ValueError) as e:
        print(f"raylog: the cluster's command endpoint failed: {one_line(e)}", file=sys.stderr)
        return 1
    sys.stdout.write(answer["stdout"])
    sys.stdout.flush()
    return int(answer["code"])  # its stderr was written as it came


def _to_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def join(args: argparse.Namespace) -> None:
    """Join the running cluster's Ray: from ``--address`` (Ray's own environment gives the
    token), else from the data dir's ``cluster.json``."""
    joined = sys.modules.get("ray")
    if joined is not None and joined.is_initialized():
        return  # run by `raylog up` for a CLI (actors/cli/server.py), with its connection
    address = getattr(args, "address", None)
    if address:
        ray_address = address
    else:
        data_dir = data_dir_of(args)
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


def connect(args: argparse.Namespace) -> Any:
    """Join the running cluster; returns the active controller's handle."""
    join(args)
    import ray

    from raylog.actors.calls import CONTROLLERS, NAMESPACE, controller_actor_name

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


def supervisor() -> Any:
    """The SupervisorActor of the `raylog up` process (after :func:`connect`)."""
    import ray

    from raylog.actors.calls import NAMESPACE, SUPERVISOR_ACTOR_NAME

    try:
        return ray.get_actor(SUPERVISOR_ACTOR_NAME, namespace=NAMESPACE)
    except ValueError as e:
        raise CliError("this cluster has no broker supervisor (not started by raylog up)") from e


def call(actor: Any, method: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
    """``actor.method(*args)``, its failure one line (a CliError)."""
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
