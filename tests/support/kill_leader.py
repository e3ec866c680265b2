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

``--kill-gateway`` SIGKILLs the process of the leader's gateway actor alone (its broker and
replicas go on), as a crash of that process would; it prints ``killed: {"leader": id,
"gateway_pid": pid}``.

``--kill-on-stdin`` and ``--crash-on-stdin`` do the slow part first (joining Ray, finding the
leader and the actors to kill), print ``ready: {"leader": id}``, and act once a line arrives on
stdin (EOF too; at most ``GO_WAIT_S`` later): a test times the kill to the moment it wants,
within a few Ray calls. ``--kill-on-stdin`` then kills as ``--kill`` does; ``--crash-on-stdin``
crashes the whole broker as ``raylog brokers kill`` does (the supervisor kills its broker actor
and its gateway, with the transaction and group coordinators in it; neither is restarted until
``raylog brokers start``). Both print the ``killed:`` line.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

CALL_TIMEOUT_S = 30.0
FIND_DEADLINE_S = 60.0
GO_WAIT_S = 300.0


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
    if mode == "--crash-on-stdin":
        return _crash(ray, leader)
    if mode == "--kill-gateway":
        return _kill_gateway(ray, leader)
    replicas = []
    for name, t in md.topics.items():
        for p in t.partitions:
            if leader in p.replicas:
                actor_name = replica_actor_name(name, p.partition, leader)
                with contextlib.suppress(ValueError):  # not started
                    replicas.append((actor_name, ray.get_actor(actor_name, namespace=NAMESPACE)))
    broker = ray.get_actor(broker_actor_name(leader), namespace=NAMESPACE)
    if mode == "--kill-on-stdin":
        _wait_for_go(leader)
    killed = []
    for actor_name, handle in replicas:
        try:
            ray.kill(handle, no_restart=True)
            killed.append(actor_name)
        except ValueError:
            pass  # gone meanwhile
    ray.kill(broker, no_restart=False)
    print("killed: " + json.dumps({"leader": leader, "replicas": killed}), flush=True)
    return 0


def _kill_gateway(ray: Any, leader: int) -> int:
    from raylog.actors.calls import NAMESPACE, gateway_actor_name

    gateway = ray.get_actor(gateway_actor_name(leader), namespace=NAMESPACE)
    pid = ray.get(gateway.__ray_call__.remote(lambda _: os.getpid()), timeout=CALL_TIMEOUT_S)
    os.kill(pid, signal.SIGKILL)  # a process of the cluster this test started
    print("killed: " + json.dumps({"leader": leader, "gateway_pid": pid}), flush=True)
    return 0


def _wait_for_go(leader: int) -> None:
    print("ready: " + json.dumps({"leader": leader}), flush=True)
    select.select([sys.stdin], [], [], GO_WAIT_S)


def _crash(ray: Any, leader: int) -> int:
    from raylog.actors.calls import NAMESPACE, SUPERVISOR_ACTOR_NAME

    supervisor = ray.get_actor(SUPERVISOR_ACTOR_NAME, namespace=NAMESPACE)
    _wait_for_go(leader)
    ray.get(supervisor.kill_broker.remote(leader), timeout=CALL_TIMEOUT_S)
    print("killed: " + json.dumps({"leader": leader, "replicas": []}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
