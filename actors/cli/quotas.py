"""`raylog quotas alter|describe`: client quotas, as Kafka's ``kafka-configs.sh --entity-type
users/clients`` manages them (KIP-546's AlterClientQuotas and DescribeClientQuotas, asked of
the active controller).

An entity is a user (``--user NAME`` or ``--user-default``), a client id (``--client-id ID`` or
``--client-default``), or both; its values are Kafka's quota keys ``producer_byte_rate``,
``consumer_byte_rate`` (bytes/s) and ``request_percentage`` (percent of one handler thread).
Every broker enforces them on its own connections (``gateway/quotas.py``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raylog.actors.cli.client import CliError, add_cluster_args, call, connect
from raylog.actors.cli.text import error_names, print_json
from raylog.actors.control.client_quotas import (
    CLIENT_ID,
    DEFAULT,
    MATCH_DEFAULT,
    MATCH_EXACT,
    QUOTA_KEYS,
    USER,
)


def entity(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """The entity of ``alter``: (type, name or None for the default)."""
    out: list[tuple[str, str | None]] = []
    if args.user is not None or args.user_default:
        out.append((USER, None if args.user_default else args.user))
    if args.client_id is not None or args.client_default:
        out.append((CLIENT_ID, None if args.client_default else args.client_id))
    if not out:
        raise CliError(
            "quotas alter needs an entity: --user, --user-default, --client-id or --client-default"
        )
    return out


def ops(args: argparse.Namespace) -> list[tuple[str, float, bool]]:
    """``--set KEY=VALUE`` and ``--delete KEY`` as AlterClientQuotas ops."""
    out: list[tuple[str, float, bool]] = []
    for item in args.set or ():
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or number is None:
            raise CliError(f"--set takes KEY=NUMBER, not {item!r}")
        out.append((key.strip(), number, False))
    out.extend((key, 0.0, True) for key in args.delete or ())
    if not out:
        raise CliError("quotas alter needs --set KEY=VALUE or --delete KEY")
    return out


def _name(entity_type: str, name: str | None) -> str:
    return f"{entity_type}={DEFAULT if name is None else name}"


def cmd_alter(args: argparse.Namespace) -> int:
    wanted = entity(args)
    changes = ops(args)
    ((_, code, message),) = call(connect(args), "alter_client_quotas", [(wanted, changes)], False)
    shown = ", ".join(_name(t, n) for t, n in wanted)
    if code:
        raise CliError(f"{shown}: {error_names().get(code, f'error {code}')}: {message}")
    print(f"Completed updating client quotas for {shown}.", flush=True)
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    components: list[tuple[str, int, str | None]] = []
    for entity_type, name in ((USER, args.user), (CLIENT_ID, args.client_id)):
        if name == DEFAULT:
            components.append((entity_type, MATCH_DEFAULT, None))
        elif name is not None:
            components.append((entity_type, MATCH_EXACT, name))
    found = call(connect(args), "describe_client_quotas", components, False)
    if found.error_code:
        name = error_names().get(found.error_code, f"error {found.error_code}")
        raise CliError(f"describing client quotas: {name}: {found.message}")
    rows = [({t: DEFAULT if n is None else n for t, n in e}, values) for e, values in found.entries]
    if args.json:
        print_json([{"entity": e, "values": v} for e, v in rows])
        return 0
    if not rows:
        print("No client quotas.", flush=True)
        return 0
    for e, values in rows:
        shown = ", ".join(f"{t}={n}" for t, n in e.items())
        quota = ", ".join(f"{k}={v:g}" for k, v in sorted(values.items()))
        print(f"Quota configs for {shown} are {quota}")
    sys.stdout.flush()
    return 0


def add_subcommands(sub: Any) -> None:
    """Adds ``quotas`` to ``raylog``'s subparsers."""
    quotas = sub.add_parser("quotas", help="client quotas (byte rates, request percentage)")
    quotas_sub = quotas.add_subparsers(dest="quotas_command", required=True)
    keys = ", ".join(QUOTA_KEYS)

    alter = quotas_sub.add_parser("alter", help="set or delete an entity's quota values")
    user = alter.add_mutually_exclusive_group()
    user.add_argument("--user", help="a user (the principal's name; ANONYMOUS without SASL)")
    user.add_argument("--user-default", action="store_true", help="the default user")
    client = alter.add_mutually_exclusive_group()
    client.add_argument("--client-id", help="a client id")
    client.add_argument("--client-default", action="store_true", help="the default client id")
    alter.add_argument("--set", action="append", metavar="KEY=VALUE", help=f"repeatable: {keys}")
    alter.add_argument("--delete", action="append", metavar="KEY", help="repeatable")
    alter.set_defaults(func=cmd_alter)
    add_cluster_args(alter)

    describe = quotas_sub.add_parser(
        "describe", help=f"quotas of entities matching --user / --client-id ({DEFAULT}: default)"
    )
    describe.add_argument("--user")
    describe.add_argument("--client-id")
    describe.set_defaults(func=cmd_describe)
    add_cluster_args(describe, json_flag=True)
