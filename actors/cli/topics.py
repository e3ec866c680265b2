"""`raylog topics create|delete|list|describe`, as Kafka's ``kafka-topics.sh`` does them.

``describe`` prints what ``kafka-topics.sh --describe`` prints (a topic line, then a line per
partition), or JSON with ``--json``; partition health comes from
``raylog.actors.control.health``, the same code `raylog status` and the metrics use.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raylog.actors.cli.client import (
    CALL_TIMEOUT_S,
    CliError,
    add_cluster_args,
    call,
    connect,
)
from raylog.actors.cli.text import ids, parse_configs, print_json

RECONCILE_WAIT_S = 30.0  # how long create and delete wait for every broker to apply them


def wait_reconciled(controller: Any) -> bool:
    """Whether every live broker applied the controller's metadata within RECONCILE_WAIT_S. The
    call's own timeout outlasts the controller's wait by CALL_TIMEOUT_S, so that a slow
    reconcile is reported as such, not as a controller that did not answer."""
    wait_ms = int(RECONCILE_WAIT_S * 1000)
    epoch = call(
        controller, "wait_reconciled", wait_ms, timeout_s=RECONCILE_WAIT_S + CALL_TIMEOUT_S
    )
    return int(epoch) >= 0


def cmd_create(args: argparse.Namespace) -> int:
    configs = parse_configs(args.config or [])
    controller = connect(args)
    call(controller, "create_topic", args.name, args.partitions, args.replication_factor, configs)
    # Leaders elected and every broker hosting its replicas: clients can produce at once.
    if not wait_reconciled(controller):
        print(f"raylog: topic {args.name} created; replicas not all started yet", file=sys.stderr)
    print(f"Created topic {args.name}.", flush=True)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    from raylog.gateway.actor import INTERNAL_TOPICS

    internal = [n for n in args.names if n in INTERNAL_TOPICS]
    if internal:
        raise CliError(f"topic {internal[0]} is internal and cannot be deleted")
    controller = connect(args)
    for name in args.names:
        call(controller, "delete_topic", name)
    # Every broker stopped the replicas and removed their data.
    if not wait_reconciled(controller):
        print("raylog: topics deleted; replicas not all stopped yet", file=sys.stderr)
    for name in args.names:
        print(f"Deleted topic {name}.", flush=True)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    md = call(connect(args), "metadata")
    if args.json:
        print_json(
            [
                {"name": name, "partitions": len(t.partitions), "topic_id": t.topic_id}
                for name, t in sorted(md.topics.items())
            ]
        )
    else:
        for name in sorted(md.topics):
            print(name)
        sys.stdout.flush()
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from raylog.actors.control import health

    md = call(connect(args), "metadata")
    if args.name and args.name not in md.topics:
        raise CliError(f"topic {args.name!r} does not exist")
    names = [args.name] if args.name else sorted(md.topics)
    rows = health.partition_health(md, names)
    if args.under_replicated_partitions:
        rows = [r for r in rows if r.under_replicated]
    if args.json:
        print_json([topic_json(md.topics[n], [r for r in rows if r.topic == n]) for n in names])
        return 0
    for name in names:
        t = md.topics[name]
        if not args.under_replicated_partitions:  # as kafka-topics.sh: only partition lines
            configs = ",".join(f"{k}={v}" for k, v in sorted(t.configs.items()))
            rf = len(t.partitions[0].replicas) if t.partitions else 0
            print(
                f"Topic: {name}\tTopicId: {t.topic_id}\tPartitionCount: {len(t.partitions)}\t"
                f"ReplicationFactor: {rf}\tConfigs: {configs}"
            )
        for r in rows:
            if r.topic == name:
                print(partition_line(r))
    sys.stdout.flush()
    return 0


def partition_line(r: Any) -> str:
    """One partition as kafka-topics.sh --describe prints it; replicas whose log failed (which
    Kafka's tool leaves out) follow as ``Offline: ...`` where there are any."""
    line = (
        f"\tTopic: {r.topic}\tPartition: {r.partition}\tLeader: {r.leader}\t"
        f"Replicas: {ids(r.replicas)}\tIsr: {ids(r.isr)}\tLeaderEpoch: {r.leader_epoch}"
    )
    return f"{line}\tOffline: {ids(r.offline_replicas)}" if r.offline_replicas else line


def topic_json(t: Any, rows: list[Any]) -> dict[str, Any]:
    return {
        "name": t.name,
        "topic_id": t.topic_id,
        "partition_count": len(t.partitions),
        "replication_factor": len(t.partitions[0].replicas) if t.partitions else 0,
        "configs": dict(t.configs),
        "partitions": [
            {
                "partition": r.partition,
                "leader": r.leader,
                "leader_epoch": r.leader_epoch,
                "replicas": list(r.replicas),
                "isr": list(r.isr),
                "offline": r.offline,
                "offline_replicas": list(r.offline_replicas),
                "under_replicated": r.under_replicated,
                "under_min_isr": r.under_min_isr,
            }
            for r in rows
        ],
    }


def add_subcommands(sub: Any) -> None:
    """Adds ``topics`` to ``raylog``'s subparsers."""
    topics = sub.add_parser("topics", help="create, delete, list and describe topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--replication-factor", type=int, default=3)
    create.add_argument(
        "--config", action="append", metavar="KEY=VALUE", help="a topic config (repeatable)"
    )
    create.set_defaults(func=cmd_create)
    add_cluster_args(create)
    delete = topics_sub.add_parser("delete", help="delete topics (replicas stop, data removed)")
    delete.add_argument("names", nargs="+", metavar="name")
    delete.set_defaults(func=cmd_delete)
    add_cluster_args(delete)
    listing = topics_sub.add_parser("list", help="list topic names")
    listing.set_defaults(func=cmd_list)
    add_cluster_args(listing, json_flag=True)
    describe = topics_sub.add_parser("describe", help="describe one topic or all")
    describe.add_argument("name", nargs="?")
    describe.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="only partitions whose ISR is smaller than their replicas",
    )
    describe.set_defaults(func=cmd_describe)
    add_cluster_args(describe, json_flag=True)
