"""How long a `raylog` admin command takes: served by `raylog up`'s command endpoint, and
joining Ray itself (`--address`).

Starts `raylog up` (3 brokers), creates a topic (2 partitions, RF=3), then runs
`raylog topics describe` ``--runs`` times each way, interleaved so that both paths see the same
machine load, as a user does (a new process each time).

    .venv/bin/python benchmarks/cli.py [--runs 10]

Prints one JSON document, last on stdout: per path (``served_by_raylog_up``, ``joining_ray``)
``wall_s_median``, ``wall_s_min``, ``wall_s_max`` and ``cpu_s_median`` (the CLI process's user +
system CPU), and ``speedup_wall`` (the ratio of the median wall times).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from spark_read import RAYLOG, raylog_up

from raylog.actors import raycluster


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, of the child) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, timeout=120, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls = [w for w, _ in samples]
    return {
        "wall_s_median": round(statistics.median(walls), 3),
        "wall_s_min": round(min(walls), 3),
        "wall_s_max": round(max(walls), 3),
        "cpu_s_median": round(statistics.median(c for _, c in samples), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raylog-bench-") as tmp:
        data_dir = Path(tmp) / "up"
        with raylog_up(data_dir):
            env = dict(os.environ)
            env.pop("RAY_ADDRESS", None)
            subprocess.run(
                [*RAYLOG, "topics", "create", "cli", "--partitions", "2",
                 "--replication-factor", "3", "--data-dir", str(data_dir)],
                check=True, capture_output=True, timeout=120, env=env,
            )  # fmt: skip
            info = raycluster.read_cluster_info(data_dir)
            assert info is not None
            ray_env = {**env, **raycluster.ray_env(data_dir)}
            served = [*RAYLOG, "topics", "describe", "cli", "--data-dir", str(data_dir)]
            joined = [*RAYLOG, "topics", "describe", "cli", "--address", info.ray_address]
            endpoint, ray_path = [], []
            for _ in range(args.runs):  # interleaved: both paths see the same machine load
                endpoint.append(run(served, env))
                ray_path.append(run(joined, ray_env))
    result = {
        "command": "raylog topics describe cli (2 partitions, RF 3)",
        "runs": args.runs,
        "cpus": os.cpu_count(),
        "served_by_raylog_up": summary(endpoint),
        "joining_ray": summary(ray_path),
        "speedup_wall": round(
            statistics.median(w for w, _ in ray_path) / statistics.median(w for w, _ in endpoint), 1
        ),
    }
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
