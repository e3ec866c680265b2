"""`raylog status`: the controllers (which is active, on which node), the brokers by state,
and partition health (offline, under-replicated, under min ISR, offline replicas), from
``raylog.actors.control.health`` as the metrics endpoint computes it."""

from __future__ import annotations

import argparse
from typing import Any

from raylog.actors.cli.client import add_cluster_args, call, connect, supervisor
from raylog.actors.cli.text import ids, print_json

STATUS_TIMEOUT_S = 5.0  # each controller's answer


def cmd_status(args: argparse.Namespace) -> int:
    from raylog.actors.control import health

    controller = connect(args)
    status = call(controller, "status")
    controllers = _controllers()
    md = call(controller, "metadata")
    stopped = {b for b, how in call(supervisor(), "lifecycle").items() if how == "stopped"}
    brokers = health.broker_rows(md, stopped)
    h = health.cluster_health(health.partition_health(md))
    by_state = {s: [r.broker_id for r in brokers if r.state == s] for s in health.BROKER_STATES}
    if args.json:
        print_json(
            {
                "cluster_id": md.cluster_id,
                "controller": {
                    "id": status.controller_id,
                    "epoch": status.controller_epoch,
                    "metadata_epoch": status.metadata_epoch,
                },
                "controllers": controllers,
                "replica_balancer": status.balancer,
                "autoscaler_request": status.capacity_request,
                "brokers": by_state,
                "topics": len(md.topics),
                "partitions": h.partitions,
                "offline_partitions": h.offline_partitions,
                "under_replicated_partitions": h.under_replicated_partitions,
                "under_min_isr_partitions": h.under_min_isr_partitions,
                "offline_replicas": h.offline_replicas,
            }
        )
        return 0
    print(f"cluster:                     {md.cluster_id}")
    print(f"active controller:           {status.controller_id} (epoch {status.controller_epoch}, "
          f"metadata epoch {status.metadata_epoch})")  # fmt: skip
    where = ", ".join(f"{c['id']} {c['role']} on {c['node'] or '?'}" for c in controllers)
    print(f"controllers:                 {where}")
    print(f"replica balancer:            {status.balancer or '-'}")
    if status.capacity_request:
        print(f"autoscaler request:          {status.capacity_request}")
    for state, brokers_in in by_state.items():
        print(f"brokers {state + ':':<20} {len(brokers_in)} [{ids(brokers_in)}]")
    print(f"topics:                      {len(md.topics)} ({h.partitions} partitions)")
    print(f"offline partitions:          {h.offline_partitions}")
    print(f"under-replicated partitions: {h.under_replicated_partitions}")
    print(f"under-min-ISR partitions:    {h.under_min_isr_partitions}")
    print(f"offline replicas:            {h.offline_replicas}", flush=True)
    return 0


def _controllers() -> list[dict[str, Any]]:
    """Each controller's id, role (active, standby, or not answering) and node address."""
    import ray

    from raylog.actors.calls import CONTROLLERS, NAMESPACE, controller_actor_name

    addresses = {n["NodeID"]: n.get("NodeManagerAddress", "") for n in ray.nodes()}
    rows = []
    for i in range(CONTROLLERS):
        name = controller_actor_name(i)
        try:
            handle = ray.get_actor(name, namespace=NAMESPACE)
            found = ray.get(handle.status.remote(), timeout=STATUS_TIMEOUT_S)
        except Exception:  # missing, restarting or slow: say so, do not fail the command
            rows.append({"id": name, "role": "not answering", "node": ""})
            continue
        role = "active" if found.active else "standby"
        node = addresses.get(found.node_id, found.node_id)
        rows.append({"id": found.controller_id, "role": role, "node": node})
    return rows


def add_subcommands(sub: Any) -> None:
    """Adds ``status`` to ``raylog``'s subparsers."""
    p = sub.add_parser("status", help="controller, brokers and partition health")
    p.set_defaults(func=cmd_status)
    add_cluster_args(p, json_flag=True)
