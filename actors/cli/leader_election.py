"""`raylog leader-election --preferred`: move leadership to the preferred replicas, as Kafka's
``kafka-leader-election.sh --election-type PREFERRED`` does (all partitions, one topic's, or
one partition)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raylog.actors.cli.client import CliError, add_cluster_args, call, connect
from raylog.actors.cli.text import error_names


def cmd_leader_election(args: argparse.Namespace) -> int:
    from raylog.storage.errors import ElectionNotNeededError

    if args.partition is not None and args.topic is None:
        raise CliError("--partition needs --topic")
    controller = connect(args)
    partitions = None
    if args.topic is not None:
        t = call(controller, "describe_topic", args.topic)
        wanted = range(len(t.partitions)) if args.partition is None else [args.partition]
        partitions = [(args.topic, p) for p in wanted]
    codes = call(controller, "elect_leaders", "preferred", partitions)
    elected = sorted(tp for tp, code in codes.items() if code == 0)
    not_needed = sorted(
        tp for tp, code in codes.items() if code == ElectionNotNeededError.error_code
    )
    failed = sorted((tp, code) for tp, code in codes.items() if tp not in {*elected, *not_needed})
    names = error_names()
    if elected:
        print("Successfully completed leader election (PREFERRED) for partitions "
              + ", ".join(f"{t}-{p}" for t, p in elected))  # fmt: skip
    if not_needed:
        print("Valid replica already elected for partitions "
              + ", ".join(f"{t}-{p}" for t, p in not_needed))  # fmt: skip
    if not (elected or not_needed or failed):
        print("No partition needs a preferred leader election.")
    sys.stdout.flush()
    if failed:
        raise CliError(
            "leader election failed for "
            + ", ".join(f"{t}-{p} ({names.get(code, code)})" for (t, p), code in failed)
        )
    return 0


def add_subcommands(sub: Any) -> None:
    """Adds ``leader-election`` to ``raylog``'s subparsers."""
    p = sub.add_parser("leader-election", help="move leadership to preferred replicas")
    p.add_argument("--preferred", action="store_true", required=True)
    p.add_argument("--topic")
    p.add_argument("--partition", type=int)
    p.set_defaults(func=cmd_leader_election)
    add_cluster_args(p)
