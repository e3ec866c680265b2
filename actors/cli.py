"""The `raylog` command line: `raylog up` starts the embedded cluster in the foreground.

Only what exists is started. Today that is a local Ray cluster configured for raylog (token
authentication, loopback, fast death detection, its temp dir under the data dir) and the object
store holding the cluster's identity. The controller, brokers and gateways are built by later
issues; `raylog up` says so instead of pretending.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from raylog.actors import raycluster
from raylog.storage.objectstore import ObjectStore

DEFAULT_DATA_DIR = "./raylog-data"


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


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    running = raycluster.read_cluster_info(data_dir)
    if running is not None:
        raise CliError(f"a raylog cluster is already running from {data_dir} (pid {running.pid})")
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
        ports = ", ".join(f"127.0.0.1:{args.port + i}" for i in range(args.brokers))
        print(f"raylog cluster {cluster_id}", flush=True)
        print(f"  data dir:      {data_dir}")
        print(f"  object store:  {store_url}")
        print(f"  ray:           {gcs} (token {env['RAY_AUTH_TOKEN_PATH']})")
        print(f"  not built yet: controller, {args.brokers} brokers and their gateways ({ports})")
        print(f"raylog ready; stop with Ctrl-C or `kill -TERM {os.getpid()}`", flush=True)
        # Bounded waits so that signals are handled promptly on every platform.
        while not stop.wait(timeout=1.0):
            pass
        print("raylog stopping", flush=True)
    finally:
        raycluster.remove_cluster_info(data_dir)
        ray.shutdown()
    print("raylog stopped", flush=True)
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
    up.set_defaults(func=cmd_up)
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
