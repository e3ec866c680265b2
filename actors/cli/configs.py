"""`raylog configs describe|alter`: a topic's configs, as Kafka's ``kafka-configs.sh`` shows and
changes them (every config with its value and whether it is the default; overrides set or
deleted)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raylog.actors.cli.client import CliError, add_cluster_args, call, connect
from raylog.actors.cli.text import parse_configs, print_json


def cmd_describe(args: argparse.Namespace) -> int:
    entries = call(connect(args), "describe_configs", args.topic)
    if args.json:
        print_json({e.name: {"value": e.value, "default": e.is_default} for e in entries})
        return 0
    print(f"All configs for topic {args.topic} are:")
    for e in entries:
        print(f"  {e.name}={e.value}{'' if e.is_default else ' (topic override)'}")
    sys.stdout.flush()
    return 0


def cmd_alter(args: argparse.Namespace) -> int:
    sets = parse_configs(args.set or [], flag="--set")
    deletes = set(args.delete or [])
    if not sets and not deletes:
        raise CliError("configs alter needs --set k=v or --delete k")
    if both := deletes & sets.keys():
        raise CliError(f"both set and deleted: {', '.join(sorted(both))}")
    controller = connect(args)
    # AlterConfigs replaces the whole override set: start from the current one.
    current = dict(call(controller, "describe_topic", args.topic).configs)
    overrides = {k: v for k, v in {**current, **sets}.items() if k not in deletes}
    call(controller, "alter_configs", args.topic, overrides)
    print(f"Completed updating config for topic {args.topic}.", flush=True)
    return 0


def add_subcommands(sub: Any) -> None:
    """Adds ``configs`` to ``raylog``'s subparsers."""
    configs = sub.add_parser("configs", help="describe and alter topic configs")
    configs_sub = configs.add_subparsers(dest="configs_command", required=True)
    describe = configs_sub.add_parser("describe", help="every config of a topic")
    describe.add_argument("--topic", required=True)
    describe.set_defaults(func=cmd_describe)
    add_cluster_args(describe, json_flag=True)
    alter = configs_sub.add_parser("alter", help="set or delete topic config overrides")
    alter.add_argument("--topic", required=True)
    alter.add_argument("--set", action="append", metavar="KEY=VALUE", help="repeatable")
    alter.add_argument("--delete", action="append", metavar="KEY", help="repeatable")
    alter.set_defaults(func=cmd_alter)
    add_cluster_args(alter)
