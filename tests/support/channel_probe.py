"""Print the replication-channel counters of every replica of a topic in a running cluster.

``python channel_probe.py DATA_DIR TOPIC`` joins the cluster's Ray with the data dir's token (a
separate process: Ray reads its token at import, and the test process has its own Ray session)
and prints one line: ``channels: {"<replica name>": {counters}, ...}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CALL_TIMEOUT_S = 30.0


def main(data_dir: str, topic: str) -> int:
    from raylog.actors import raycluster

    root = Path(data_dir)
    info = raycluster.read_cluster_info(root)
    if info is None:
        raise SystemExit(f"no cluster running from {root}")
    raycluster.apply_ray_env(root)
    import ray

    from raylog.actors.calls import NAMESPACE, controller_actor_name, replica_actor_name

    ray.init(address=info.ray_address, namespace=NAMESPACE, logging_level="WARNING")
    md = None
    for index in (0, 1):
        handle = ray.get_actor(controller_actor_name(index), namespace=NAMESPACE)
        if ray.get(handle.status.remote(), timeout=CALL_TIMEOUT_S).active:
            md = ray.get(handle.metadata.remote(), timeout=CALL_TIMEOUT_S)
    if md is None:
        raise SystemExit("no active controller")
    out = {}
    for p in md.topics[topic].partitions:
        for r in p.replicas:
            name = replica_actor_name(topic, p.partition, r)
            replica = ray.get_actor(name, namespace=NAMESPACE)
            stats = ray.get(replica.channel_stats.remote(), timeout=CALL_TIMEOUT_S)
            out[name] = {**stats, "leader": int(r == p.leader)}
    print("channels: " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
