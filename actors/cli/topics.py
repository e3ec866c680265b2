"""`raylog topics create|delete|list|describe`, as Kafka's ``kafka-topics.sh`` does them.

``create`` waits until every partition serves: a leader that accepts writes and its ISR
following (the controller's ``topic_readiness``), with progress on stderr for waits longer than
PROGRESS_AFTER_S. At its deadline (``--timeout``) the topic exists and its replicas are still
starting: it says what is pending and how to follow it, and exits EXIT_STILL_CREATING, not 1
(1 is a creation refused, with the reason). A topic that does not fit the brokers present,
while the controller has asked Ray's autoscaler for nodes, is asked for again within the same
``--timeout`` (one line on stderr says so).

``describe`` prints what ``kafka-topics.sh --describe`` prints (a topic line, then a line per
partition), or JSON with ``--json``; partition health comes from
``raylog.actors.control.health``, the same code `raylog status` and the metrics use.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any

from raylog.actors.cli.client import (
    CALL_TIMEOUT_S,
    CliError,
    add_cluster_args,
    call,
    connect,
)
from raylog.actors.cli.text import ids, parse_configs, print_json

RECONCILE_WAIT_S = 30.0  # how long delete waits for every broker to apply it
CREATE_WAIT_S = 120.0  # `topics create --timeout`'s default: until every partition serves
PROGRESS_AFTER_S = 2.0  # a longer wait shows progress on stderr
PROGRESS_EVERY_S = 5.0  # and again this often while the count stands still
READY_POLL_MS = 1_000  # one topic_readiness call waits this long at most
EXIT_STILL_CREATING = 3  # the topic was created; its partitions did not all serve in time
PENDING_SHOWN_MAX = 10  # partitions named in the deadline message


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
    began = time.monotonic()
    create(controller, args, configs, began + args.timeout)
    readiness = wait_serving(args, controller, args.name, args.timeout - (time.monotonic() - began))
    if readiness is not None and readiness.done:
        print(f"Created topic {args.name}.", flush=True)
        return 0
    print(still_creating(args.name, readiness, args.timeout), file=sys.stderr)
    return EXIT_STILL_CREATING


def create(controller: Any, args: argparse.Namespace, configs: dict[str, str], due: float) -> None:
    """The controller's ``create_topic``, asked again every ``capacity.RETRY_S`` until ``due``
    while it answers that Ray's autoscaler was asked for the nodes the topic needs."""
    from raylog.actors.control import capacity
    from raylog.storage.errors import CapacityPendingError, NotControllerError, one_line

    shown = False
    while True:  # bounded by ``due``
        try:
            call(controller, "create_topic", args.name, args.partitions, args.replication_factor,
                 configs)  # fmt: skip
            return
        except CliError as exc:
            pending = exc.__cause__
            if isinstance(pending, NotControllerError) and time.monotonic() < due:
                time.sleep(capacity.RETRY_S)  # a controller failover while waiting: ask anew
                with contextlib.suppress(CliError):
                    controller = connect(args)
                continue
            if not isinstance(pending, CapacityPendingError):
                raise
            left_s = due - time.monotonic()
            if left_s <= capacity.RETRY_S:
                raise CliError(f"{one_line(pending)}: none joined in time") from None
            if not shown:
                print(f"raylog: {one_line(pending)}; waiting for them up to {left_s:.0f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
                shown = True
            time.sleep(capacity.RETRY_S)


def wait_serving(args: argparse.Namespace, controller: Any, name: str, timeout_s: float) -> Any:
    """The topic's last readiness (``reconciler.TopicReadiness``) once every partition serves
    or at the deadline (None if the controller never answered). Progress goes to stderr after
    PROGRESS_AFTER_S; a controller that fails meanwhile (a failover) is looked up again."""
    began = time.monotonic()
    deadline = began + timeout_s
    readiness, shown, shown_at = None, -1, 0.0
    while True:  # bounded by the deadline
        wait_ms = int(max(0.0, min(READY_POLL_MS / 1000, deadline - time.monotonic())) * 1000)
        try:
            readiness = call(controller, "topic_readiness", name, wait_ms)
        except CliError:
            if time.monotonic() >= deadline:
                return readiness
            time.sleep(READY_POLL_MS / 1000)
            with contextlib.suppress(CliError):  # still none: the next call fails and retries
                controller = connect(args)
            continue
        now = time.monotonic()
        if readiness.done or now >= deadline:
            return readiness
        count = len(readiness.serving)
        if now - began >= PROGRESS_AFTER_S and (
            count != shown or now - shown_at >= PROGRESS_EVERY_S
        ):
            started = readiness.replicas_started
            replicas = f", {started}/{readiness.replicas} replicas started" if started >= 0 else ""
            print(
                f"raylog: {name}: {count}/{readiness.partitions} partitions ready{replicas}",
                file=sys.stderr,
                flush=True,
            )
            shown, shown_at = count, now


def still_creating(name: str, readiness: Any, timeout_s: float) -> str:
    """The deadline message: the topic exists, what is pending, how to follow it."""
    follow = f"follow it with `raylog topics describe {name}`"
    if readiness is None:
        return (
            f"raylog: topic {name} created; the controller did not say within {timeout_s:.0f} s "
            f"whether its partitions serve; {follow}"
        )
    pending = [p for p, _ in readiness.pending]
    waits = sorted({b for _, brokers in readiness.pending for b in brokers if b >= 0})
    named = ", ".join(str(p) for p in pending[:PENDING_SHOWN_MAX])
    more = (
        f" and {len(pending) - PENDING_SHOWN_MAX} more" if len(pending) > PENDING_SHOWN_MAX else ""
    )
    on = f" (waiting for brokers {ids(waits)})" if waits else " (waiting for leaders)"
    return (
        f"raylog: topic {name} created; after {timeout_s:.0f} s {len(pending)} of "
        f"{readiness.partitions} partitions are still starting: {named}{more}{on}; the creation "
        f"goes on: {follow}"
    )


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
    create.add_argument(
        "--timeout",
        type=float,
        default=CREATE_WAIT_S,
        metavar="S",
        help=f"wait at most S seconds for every partition to serve (default {CREATE_WAIT_S:.0f}); "
        f"then exit {EXIT_STILL_CREATING}: created, still starting",
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
