"""Ray-side actions on an embedded cluster, run as a subprocess by the pipelines tests.

``python cluster_actions.py DATA_DIR ACTION ARGS``; prints one line: RESULT and JSON.

- ``kill-broker BROKER``: hard-kills the broker's replica actors and the broker actor itself
  (``ray.kill``: no graceful shutdown; Ray restarts the broker, which starts new replicas);
- ``read-topic TOPIC OUT[@START_TS][+LEVEL]...``: ``raylog.pipelines.read_topic`` (Ray Data)
  with headers (from ``start_timestamp`` START_TS when given, with ``isolation_level`` LEVEL,
  read_committed or read_uncommitted, when given), written to the Parquet file OUT; one read
  per OUT, in one process (joining Ray and starting Ray Data cost seconds each time).
  Also returns ``remote_ranges``: how many ranges of an earliest-to-latest plan of the topic
  are read from the object store (tiered topics; 0 otherwise).

A separate process because Ray reads its token when it is imported: the test process belongs
to its own Ray session, this one joins the cluster of DATA_DIR (``reading.connect``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from raylog.pipelines import reading


def _catalog() -> Any:
    return reading.controller_catalog()


def kill_broker(broker: str) -> dict[str, Any]:
    import ray

    from raylog.actors.calls import NAMESPACE, broker_actor_name, replica_actor_name

    b = int(broker)
    catalog = _catalog()
    killed = []
    for topic in catalog.topics():
        for info in catalog.partitions(topic):
            if b in info.replica_ids:
                name = replica_actor_name(topic, info.partition, b)
                try:
                    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
                    killed.append(name)
                except ValueError:
                    pass  # not started
    ray.kill(ray.get_actor(broker_actor_name(b), namespace=NAMESPACE), no_restart=False)
    return {"killed": killed}


def read_topic(topic: str, *outs: str) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from raylog.pipelines import read_topic as _read_topic

    rows = []
    for spec in outs:
        spec, _, level = spec.partition("+")
        out, _, start_ts = spec.partition("@")
        start_timestamp = int(start_ts) if start_ts else None
        ds = _read_topic(
            topic,
            include_headers=True,
            min_partitions=3,
            start_timestamp=start_timestamp,
            isolation_level=level or "read_uncommitted",
        )
        table = pa.concat_tables(ray.get(ds.to_arrow_refs()))
        pq.write_table(table, out)
        rows.append(table.num_rows)
    return {"rows": rows, "remote_ranges": _remote_ranges(topic)}


def _remote_ranges(topic: str) -> int:
    from raylog.pipelines import remote_ranges

    chosen = _catalog().partitions(topic)
    local_bounds = reading.fetch_bounds(chosen)
    tiers = remote_ranges.learn(chosen, local_bounds)
    bounds = tiers.bounds(local_bounds)
    planned = tiers.split(reading.plan(chosen, bounds, reading.EARLIEST, reading.LATEST))
    return sum(isinstance(r, remote_ranges.RemoteRange) for r in planned)


RESULT = "cluster-action-result: "  # Ray Data prints progress to stdout too
ACTIONS = {"kill-broker": kill_broker, "read-topic": read_topic}


def main(argv: list[str]) -> int:
    data_dir, action, *args = argv
    reading.connect(reading.ClusterTarget.resolve(data_dir))
    print(RESULT + json.dumps(ACTIONS[action](*args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
