"""What an idle embedded cluster costs: CPU per process while nothing is produced or read.

Starts `raylog up` (3 brokers), creates a topic (``--partitions`` partitions, RF=3), waits
until every replica is in sync, then reads each of the cluster's processes' CPU time from
/proc over ``--seconds``. Ray's processes of this cluster are told apart from any other by
their environment (Ray's temp dir lies in this run's data dir). The machine is shared: figures
are noisy. A replica's share is mostly its state machine's tick (``TICK_MS`` of the replica
shell).

    .venv/bin/python benchmarks/idle.py [--partitions 4] [--seconds 20]

Prints one JSON document, last on stdout: ``processes``, per kind of process (the actor class
of a ``ray::`` worker, e.g. ReplicaActor, GatewayActor, BrokerActor, ControllerActor, and
Ray's ``raylet`` and ``gcs_server``), ``count``, ``cores_total`` and ``cores_each`` (shares of
one core); ``cores_total`` for the whole cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from spark_read import RAYLOG, log, raylog_up

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(marker: bytes) -> dict[tuple[int, str], float]:
    """CPU seconds so far of every Ray process whose environment holds ``marker``."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read().split(b"\0")[0].decode(errors="replace")
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker not in f.read():
                    continue
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone, or not ours to read
            continue
        if command.startswith("ray::"):
            kind = command.split()[0].removeprefix("ray::").split(".")[0]
        elif "raylet" in command or "gcs_server" in command:
            kind = Path(command.split()[0]).name
        else:
            continue
        found[(int(name), kind)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raylog-bench-") as tmp:
        data_dir = Path(tmp) / "up"
        with raylog_up(data_dir):
            subprocess.run(
                [*RAYLOG, "topics", "create", "idle", "--partitions", str(args.partitions),
                 "--replication-factor", "3", "--data-dir", str(data_dir)],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
            deadline = time.monotonic() + 120
            while True:  # bounded by the deadline: every replica in sync
                done = subprocess.run(
                    [*RAYLOG, "topics", "describe", "idle", "--under-replicated-partitions",
                     "--json", "--data-dir", str(data_dir)],
                    check=True, capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                if not any(topic["partitions"] for topic in json.loads(done.stdout)):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("replicas did not get in sync")
                time.sleep(0.5)
            log(f"measuring {args.seconds} s of idle")
            marker = str(data_dir).encode()
            before = cpu_seconds(marker)
            time.sleep(args.seconds)  # the measured window: nothing runs on purpose
            after = cpu_seconds(marker)
    kinds: dict[str, list[float]] = {}
    for key, spent in after.items():
        if key in before:
            kinds.setdefault(key[1], []).append((spent - before[key]) / args.seconds)
    result = {
        "partitions": args.partitions,
        "replication_factor": 3,
        "seconds": args.seconds,
        "cpus": os.cpu_count(),
        "note": "share of one core; shared machine: figures are noisy",
        "processes": {
            kind: {
                "count": len(shares),
                "cores_total": round(sum(shares), 3),
                "cores_each": round(sum(shares) / len(shares), 4),
            }
            for kind, shares in sorted(kinds.items(), key=lambda item: -sum(item[1]))
        },
        "cores_total": round(sum(sum(s) for s in kinds.values()), 3),
    }
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
