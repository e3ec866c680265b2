"""Hard-kill the broker leading a partition of a running `raylog up` cluster (live tests).

``python kill_leader.py DATA_DIR TOPIC PARTITION`` joins the cluster's Ray with the data dir's
token (a separate process: Ray reads its token when it is imported, and the test process has
its own Ray session), asks the active controller for the partition's leader, kills that broker's
replica actors (``ray.kill``: no graceful shutdown, nothing flushed or handed over) and its
broker actor (Ray restarts the broker, which re-creates its replicas from their WALs), and
prints one line: ``killed: {"leader": id, "replicas": [names]}``.

``python kill_leader.py DATA_DIR TOPIC PARTITION --fail-disk`` fails the leader replica's log
instead, as a full disk would: the replica's process may no longer grow a file past its
active segment's end (RLIMIT_FSIZE, set with prlimit), so its next append fails with EFBIG.
Nothing is killed; it prints ``failed: {"leader": id, "pid": pid, "segment": path}``.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

CALL_TIMEOUT_S = 30.0
FIND_DEADLINE_S = 60.0


def _active_controller(ray: Any) -> Any:
    from raylog.actors.calls import NAMESPACE, controller_actor_name

    deadline = time.monotonic() + FIND_DEADLINE_S
    while time.monotonic() < deadline:
        for index in (0, 1):
            try:
                handle = ray.get_actor(controller_actor_name(index), namespace=NAMESPACE)
                if ray.get(handle.status.remote(), timeout=5).active:
                    return handle
            except Exception:  # missing, dead or slow: try the other one
                continue
        time.sleep(0.2)
    raise SystemExit("no active controller")


def _fail_disk(ray: Any, root: Path, topic: str, partition: int, leader: int) -> int:
    from raylog.actors.calls import NAMESPACE, replica_actor_name

    replica = ray.get_actor(replica_actor_name(topic, partition, leader), namespace=NAMESPACE)
    pid = ray.get(replica.pid.remote(), timeout=CALL_TIMEOUT_S)
    segment = max(root.rglob(f"broker-{leader}/{topic}-{partition}/*.log"))
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (segment.stat().st_size + 64, hard))
    print(
        "failed: " + json.dumps({"leader": leader, "pid": pid, "segment": str(segment)}),
        flush=True,
    )
    return 0


def main(data_dir: str, topic: str, partition: str, mode: str = "--kill") -> int:
    from raylog.actors import raycluster

    root = Path(data_dir)
    info = raycluster.read_cluster_info(root)
    if info is None:
        raise SystemExit(f"no cluster running from {root}")
    raycluster.apply_ray_env(root)
    import ray

    from raylog.actors.calls import NAMESPACE, broker_actor_name, replica_actor_name

    ray.init(address=info.ray_address, namespace=NAMESPACE, logging_level="WARNING")
    md = ray.get(_active_controller(ray).metadata.remote(), timeout=CALL_TIMEOUT_S)
    leader = md.topics[topic].partitions[int(partition)].leader
    if leader < 0:
        raise SystemExit(f"{topic}-{partition} has no leader")
    if mode == "--fail-disk":
        return _fail_disk(ray, root, topic, int(partition), leader)
    killed = []
    for name, t in md.topics.items():
        for p in t.partitions:
            if leader in p.replicas:
                actor_name = replica_actor_name(name, p.partition, leader)
                try:
                    ray.kill(ray.get_actor(actor_name, namespace=NAMESPACE), no_restart=True)
                    killed.append(actor_name)
                except ValueError:
                    pass  # not started
    ray.kill(ray.get_actor(broker_actor_name(leader), namespace=NAMESPACE), no_restart=False)
    print("killed: " + json.dumps({"leader": leader, "replicas": killed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
