"""What a process does before it starts a raylog cluster's actors, apart from any command line.

In order (`raylog up` runs these steps; a test or another tool can run them without argv):

1. :func:`prepare_data_dir`: the data dir exists and is writable;
2. :func:`check_ports_free`: the gateway and metrics ports are free, before anything starts;
3. :func:`open_store` and :func:`cluster_id`: the object store holding the cluster's identity,
   lease and metadata, and the identity itself, created once and kept;
4. :func:`start_ray`: Ray started with the cluster's environment (token authentication,
   loopback, fast death detection, worker start concurrency, its temp dir under the data dir;
   ``raylog.actors.raycluster``)
   or joined at a given address; it returns the :class:`ClusterInfo` that ``cluster.json``
   records for other processes;
5. the cluster's actors: ``raylog.actors.cluster.embedded`` or ``raylog.actors.cluster.raynodes``.

Ray reads part of its environment when it is imported: nothing here imports Ray before
:func:`start_ray` has set that environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from pathlib import Path

from raylog.actors import logs, raycluster
from raylog.actors.raycluster import ClusterInfo
from raylog.storage.errors import PreconditionFailedError
from raylog.storage.objectstore import ObjectStore, open_object_store

HOST = "127.0.0.1"  # the embedded cluster listens on loopback only
IDENTITY_KEY = "cluster/identity.json"


class ClusterError(Exception):
    """A cluster that cannot be started as asked; the message is one line for the user."""


def prepare_data_dir(path: Path) -> Path:
    """``path`` made absolute, created if missing, and checked writable."""
    path = path.expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise ClusterError(f"data dir {path} is not writable: {e.strerror or e}") from e
    return path


def check_ports_free(host: str, ports: list[int], what: str = "port") -> None:
    """Fail before starting anything when a port is taken."""
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As asyncio.start_server does: a port in TIME_WAIT is free, a listening one is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as e:
                raise ClusterError(
                    f"{what} {host}:{port} is not available: {e.strerror or e}"
                ) from e


def open_store(
    url: str | None, data_dir: Path, s3_endpoint: str | None = None
) -> tuple[str, ObjectStore]:
    """The object store at ``url`` (default: a directory in the data dir) and its URL."""
    url = url or f"file://{data_dir / 'metadata'}"
    try:
        return url, open_object_store(url, endpoint_url=s3_endpoint)
    except Exception as e:
        raise ClusterError(f"object store {url} is not usable: {e}") from e


def cluster_id(store: ObjectStore) -> str:
    """The cluster's identity, created once in the object store (put-if-absent) and kept."""
    found = store.get(IDENTITY_KEY)
    if found is None:
        body = json.dumps({"cluster_id": uuid.uuid4().hex}).encode()
        # Losing the race means another process created it first: use theirs.
        with contextlib.suppress(PreconditionFailedError):
            store.put_if_absent(IDENTITY_KEY, body)
        found = store.get(IDENTITY_KEY)
        if found is None:
            raise ClusterError(f"object store lost {IDENTITY_KEY} right after writing it")
    return str(json.loads(found.body)["cluster_id"])


def start_ray(data_dir: Path, address: str | None = None) -> ClusterInfo:
    """Start this data dir's Ray cluster, or join the one at ``address`` (with Ray's own
    environment, token and temp dir as the user set them for it). Returns how other processes
    join it (its ``admin_port`` left 0: the caller serves commands, if at all)."""
    env = dict(os.environ) if address else raycluster.apply_ray_env(data_dir)
    import ray  # here: once the environment above is set

    init_kwargs: dict = {
        "namespace": "raylog",
        "include_dashboard": False,
        "logging_level": "WARNING",
        "log_to_driver": False,
    }
    try:
        logs.level_from(os.environ)  # the actors read it (raylog.actors.logs)
    except ValueError as e:
        raise ClusterError(str(e)) from e
    if address:
        init_kwargs["address"] = address
    else:
        init_kwargs["_temp_dir"] = env["RAY_TMPDIR"]
        init_kwargs["_system_config"] = raycluster.system_config()
    try:
        ray.init(**init_kwargs)
    except Exception as e:
        raise ClusterError(f"Ray did not start: {e}") from e
    return ClusterInfo(
        ray_address=ray.get_runtime_context().gcs_address,
        token_path=env.get("RAY_AUTH_TOKEN_PATH", ""),
        ray_temp_dir=env.get("RAY_TMPDIR", ""),
        pid=os.getpid(),
    )


def stop_ray() -> None:
    """Leave Ray (and stop it, when :func:`start_ray` started it)."""
    import ray

    ray.shutdown()


__all__ = [
    "HOST",
    "ClusterError",
    "check_ports_free",
    "cluster_id",
    "open_store",
    "prepare_data_dir",
    "start_ray",
    "stop_ray",
]
