"""How raylog starts and joins Ray: the environment every process of a cluster shares.

Owns the settings measured on Ray 2.60 (docs/DESIGN.md, "What Ray costs"):

- token authentication, with a token file kept in the cluster's data directory, so that every
  process that joins (drivers, the CLI, Spark's Python workers) presents the same token;
- loopback-only listeners for the embedded cluster (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`);
- Ray's temp dir inside the data directory, never the shared `/tmp/ray`;
- fast health checks, so that a dead node is seen in about half a second instead of 13 s;
- Ray's worker start concurrency, set for a cluster of many long-lived actor processes;
- the brokers' CPU priority: Ray's workers at nice 0, not 15, so that clients beside them do not
  starve them.

`cluster.json` in the data directory records how to reach a running embedded cluster; the CLI
and the Spark connector read it.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

# Node health checks of every cluster raylog starts: a node's death is visible in about 2 s
# instead of Ray's default ~15 s. 200 ms x 3 was too tight: on a loaded machine a raylet stalled
# for 0.6 s was declared dead, which ends a one-node cluster (CI at load averages of 10 and
# more: every later call timed out). Ray's defaults are too loose the other way: a broker actor
# killed with restart then took minutes to lead again (tests/actors/test_reassignment_ray.py;
# why is not yet understood).
FAST_DEATH_SYSTEM_CONFIG: dict[str, int] = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 4,
}

# Ray's raylet starts at most `worker_maximum_startup_concurrency` worker processes at once
# (default: the node's CPU count) and warns the driver each time its workers reach another
# multiple of 4x that number ("N PYTHON worker processes have been started ..."), a sign of
# tasks blocked in ray.get. raylog runs one process per replica on purpose, so a cluster it
# starts allows 4 starts per CPU: `raylog up`'s own processes stay below the warning, and a
# topic's replicas start no slower. Far more at once thrashes a small machine (docs/DESIGN.md).
STARTUP_CONCURRENCY_PER_CPU = 4


def system_config() -> dict[str, int]:
    """Ray's system config for a cluster raylog starts: FAST_DEATH_SYSTEM_CONFIG and the worker
    start concurrency (STARTUP_CONCURRENCY_PER_CPU per CPU of this machine)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        **FAST_DEATH_SYSTEM_CONFIG,
        "worker_maximum_startup_concurrency": STARTUP_CONCURRENCY_PER_CPU * max(1, cpus or 1),
    }


# Unix socket paths must stay under 108 bytes; Ray appends about 60 to its temp dir.
_RAY_TEMP_DIR_LEN_MAX = 40

CLUSTER_FILE = "cluster.json"
TOKEN_FILE = "ray-token"


@dataclass(frozen=True)
class ClusterInfo:
    """What a process needs to join a running embedded cluster."""

    ray_address: str
    token_path: str
    ray_temp_dir: str
    pid: int
    admin_port: int = 0  # `raylog up`'s command endpoint (actors/cli/server.py); 0: none


def token_path(data_dir: Path) -> Path:
    """Creates the cluster's Ray token on first use (0600) and returns its path."""
    path = data_dir / TOKEN_FILE
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


def ray_temp_dir(data_dir: Path) -> Path:
    """Ray's temp dir for this cluster: inside the data dir when the path is short enough.

    Ray puts unix sockets under its temp dir; a deep data dir would overflow the socket path
    limit, so then a short symlink in the data dir's parent chain is not possible and we fall
    back to a per-data-dir directory under /tmp named by a hash of the data dir.
    """
    inside = data_dir.resolve() / "ray"
    if len(str(inside)) <= _RAY_TEMP_DIR_LEN_MAX:
        return inside
    import hashlib

    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
    return Path("/tmp") / f"raylog-{digest}"


def ray_env(data_dir: Path) -> dict[str, str]:
    """Environment variables every process joining this cluster needs."""
    temp = ray_temp_dir(data_dir)
    return {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_path(data_dir)),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_TMPDIR": str(temp),
        "RAY_USAGE_STATS_ENABLED": "0",
    }


# glibc malloc tunables for the processes of a cluster this process starts (its Ray workers
# inherit them), unless the user set them: batches and channel frames are buffers of up to a few
# MiB, which glibc by default maps and unmaps (or trims off the heap) one by one, so every batch
# would fault in fresh zeroed pages. Kept in the heap, RF=3 followers use noticeably less CPU
# (benchmarks/kafka_clients.py). At most the trim threshold of free heap stays mapped.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(16 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}


# Ray starts its worker processes at nice 15, below its own daemons and below every ordinary
# process of the machine: right for batch tasks, wrong for raylog, whose workers are brokers. At
# nice 15 a client that busy-polls while its requests are in flight (librdkafka's broker threads
# do at max.in.flight) takes the CPU from the broker it waits for, which makes it poll longer.
# Measured on a 2-core machine (docs/DESIGN.md, "What Ray costs"): four idempotent
# confluent-kafka producers to one partition got 4,300 records/s at nice 15 (produce round trips
# of 0.5 s), 10,400 at 10, 23,600 at 5, 15,300-21,500 at 0. At 5 the RF=3 end-to-end p99 at
# 1000 records/s was 43-516 ms in six runs (Ray's nice-0 daemons preempt the brokers), at 0 and
# 15 12-22 ms. The price of 0: a 30x3 topic (90 processes starting at once, with the raylet at
# equal priority) served after 117-126 s, against 71-80 s at 15. Ray reads this in each worker
# process (not from the system config), so the workers inherit it.
PRIORITY_ENV = {"RAY_worker_niceness": "0"}


def apply_ray_env(data_dir: Path) -> dict[str, str]:
    """Sets this process's environment for joining or starting the cluster of `data_dir`; the
    Ray workers of a cluster it starts inherit MALLOC_ENV and PRIORITY_ENV (unless the user set
    those variables)."""
    env = ray_env(data_dir)
    os.environ.update(env)
    for key, value in {**MALLOC_ENV, **PRIORITY_ENV}.items():
        os.environ.setdefault(key, value)
    Path(env["RAY_TMPDIR"]).mkdir(parents=True, exist_ok=True)
    return env


def write_cluster_info(data_dir: Path, info: ClusterInfo) -> None:
    tmp = data_dir / (CLUSTER_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(info), indent=2))
    os.replace(tmp, data_dir / CLUSTER_FILE)


def read_cluster_info(data_dir: Path) -> ClusterInfo | None:
    """The running cluster recorded in `data_dir`, or None when none is recorded or it is gone."""
    path = data_dir / CLUSTER_FILE
    try:
        info = ClusterInfo(**json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError, TypeError):
        return None
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return info


def remove_cluster_info(data_dir: Path) -> None:
    (data_dir / CLUSTER_FILE).unlink(missing_ok=True)
