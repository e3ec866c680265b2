"""`raylog links create|list|describe|alter|disconnect|delete`: cross-cluster links (KIP-986).

A link is defined on the destination cluster: it names the source's bootstrap servers, which of
its topics (``--topics REGEX``) and consumer groups (``--groups REGEX``) to mirror, and how to
reach it (``--config`` with Kafka's client names: ``security.protocol``, ``sasl.mechanism``,
``sasl.username``, ``ssl.ca.location`` ...). Secrets (``sasl.password``, ``sasl.jaas.config``)
never go on a command line: ``--config-file`` names a properties file (Kafka's
``--command-config``), which :func:`prepare_configs` reads in the caller's own process; its
values reach `raylog up` as hidden arguments of the request, over its loopback endpoint.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from raylog.actors.cli.client import CliError, add_cluster_args, call, connect
from raylog.actors.cli.text import parse_configs, print_json
from raylog.actors.control.links import SECRET_CONFIGS

FILE_CONFIG_FLAG = "--file-config"  # internal: a --config-file entry, carried to `raylog up`
MAX_CONFIG_FILE_BYTES = 1 << 20


def read_properties(path: Path) -> dict[str, str]:
    """A Java-style properties file: ``key=value`` lines, ``#``/``!`` comments, blank lines."""
    try:
        if path.stat().st_size > MAX_CONFIG_FILE_BYTES:
            raise CliError(f"{path}: larger than {MAX_CONFIG_FILE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    out = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise CliError(f"{path}:{number}: expected key=value")
        out[key.strip()] = value.strip()
    return out


def prepare_configs(args: argparse.Namespace, argv: list[str]) -> list[str]:
    """Run by ``main`` in the caller's process: read ``--config-file`` and pass its entries
    on as hidden arguments (for `raylog up`, which never reads the caller's files)."""
    if args.file_configs:
        raise CliError(f"{FILE_CONFIG_FLAG} is internal; use --config-file")
    entries = read_properties(Path(args.config_file)) if args.config_file else {}
    args.file_configs = [f"{k}={v}" for k, v in entries.items()]
    hidden = [x for value in args.file_configs for x in (FILE_CONFIG_FLAG, value)]
    return [*argv, *hidden]


def _configs(args: argparse.Namespace) -> dict[str, str]:
    given = parse_configs(args.config or [])
    secret = sorted(SECRET_CONFIGS & given.keys())
    if secret:
        raise CliError(
            f"{', '.join(secret)} must not be given on the command line (it would show in the "
            "process list and shell history): put it in a file named by --config-file"
        )
    return {**parse_configs(args.file_configs or [], flag="--config-file"), **given}


def _print_link(view: dict[str, Any]) -> None:
    print(
        f"Link {view['name']}: {view['state']}, mode {view['mode']}, source "
        f"{','.join(view['bootstrap'])}"
        + (f" (cluster {view['source_cluster_id']})" if view["source_cluster_id"] else "")
    )
    print(f"  topics.regex: {view['topics_regex'] or '(none)'}")
    print(f"  consumer.groups.regex: {view['groups_regex'] or '(none)'}")
    if view.get("discovery_error"):
        print(f"  discovery error: {view['discovery_error']}")
    print(f"  mirror topics: {', '.join(view['mirror_topics']) or '(none)'}")


def cmd_create(args: argparse.Namespace) -> int:
    view = call(
        connect(args),
        "create_link",
        args.name,
        args.bootstrap.split(","),
        args.mode,
        args.topics or "",
        args.groups or "",
        _configs(args),
    )
    print(f"Created link {view['name']} ({view['mode']}).", flush=True)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    views = call(connect(args), "list_links")
    if args.json:
        print_json(views)
        return 0
    if not views:
        print("No links.", flush=True)
    for view in views:
        _print_link(view)
    sys.stdout.flush()
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    view = call(connect(args), "describe_link", args.name)
    if args.json:
        print_json(view)
        return 0
    _print_link(view)
    print("  configs:")
    for key, value in view["configs"].items():
        print(f"    {key}={value}")
    for p in view.get("partitions", []):
        detail = ""
        if p.get("log_end_offset", -1) >= 0:
            detail = (
                f" next offset {p['log_end_offset']}, source HW {p['source_high_watermark']}, "
                f"lag {p['lag_records']} records / {p['lag_ms']} ms, "
                f"{p['records_per_sec']:.0f} records/s"
            )
        if p.get("error"):
            detail += f", error: {p['error']}"
        print(f"  {p['topic']}-{p['partition']}: {p['state']}{detail}")
    for g in view.get("groups", []):
        detail = f", {g['offsets']} offsets"
        if g.get("last_sync_ms"):
            ago_s = max(0, time.time_ns() // 1_000_000 - g["last_sync_ms"]) // 1000
            detail += f", last synced {ago_s} s ago"
        if g.get("error"):
            detail += f", error: {g['error']}"
        print(f"  group {g['group']}: {g['state']}{detail}")
    for error in view.get("groups_errors", []):
        print(f"  groups not synced: {error}")
    sys.stdout.flush()
    return 0


def cmd_alter(args: argparse.Namespace) -> int:
    configs = _configs(args)
    configs.update(dict.fromkeys(args.delete_config or [], ""))
    view = call(
        connect(args),
        "alter_link",
        args.name,
        args.bootstrap.split(",") if args.bootstrap else None,
        args.topics,
        args.groups,
        configs or None,
    )
    print(f"Altered link {view['name']}.", flush=True)
    return 0


def cmd_disconnect(args: argparse.Namespace) -> int:
    call(connect(args), "disconnect_link", args.name, args.topic)
    what = f"topic {args.topic} of link {args.name}" if args.topic else f"link {args.name}"
    print(f"Disconnected {what}: its topics are writable.", flush=True)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    call(connect(args), "delete_link", args.name)
    print(f"Deleted link {args.name}; its mirror topics stay, writable.", flush=True)
    return 0


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", action="append", metavar="KEY=VALUE", help="repeatable")
    p.add_argument("--config-file", help="a properties file of link configs (secrets go here)")
    p.add_argument(FILE_CONFIG_FLAG, dest="file_configs", action="append", help=argparse.SUPPRESS)
    p.set_defaults(prepare=prepare_configs)


def add_subcommands(sub: Any) -> None:
    """Adds ``links`` to ``raylog``'s subparsers."""
    links = sub.add_parser("links", help="cross-cluster links (mirror topics from a source)")
    links_sub = links.add_subparsers(dest="links_command", required=True)

    create = links_sub.add_parser("create", help="mirror a source cluster's topics here")
    create.add_argument("name")
    create.add_argument("--bootstrap", required=True, help="the source: HOST:PORT[,HOST:PORT]")
    create.add_argument("--mode", choices=("async", "sync"), default="async")
    create.add_argument("--topics", metavar="REGEX", help="source topics to mirror")
    create.add_argument("--groups", metavar="REGEX", help="consumer groups to mirror")
    _config_args(create)
    create.set_defaults(func=cmd_create)
    add_cluster_args(create)

    list_ = links_sub.add_parser("list", help="every link and its mirror topics")
    list_.set_defaults(func=cmd_list)
    add_cluster_args(list_, json_flag=True)

    describe = links_sub.add_parser("describe", help="a link, its configs and partitions")
    describe.add_argument("name")
    describe.set_defaults(func=cmd_describe)
    add_cluster_args(describe, json_flag=True)

    alter = links_sub.add_parser("alter", help="change a link's source, regexes or configs")
    alter.add_argument("name")
    alter.add_argument("--bootstrap")
    alter.add_argument("--topics", metavar="REGEX")
    alter.add_argument("--groups", metavar="REGEX")
    alter.add_argument("--delete-config", action="append", metavar="KEY", help="repeatable")
    _config_args(alter)
    alter.set_defaults(func=cmd_alter)
    add_cluster_args(alter)

    disconnect = links_sub.add_parser(
        "disconnect", help="stop mirroring (the link or one topic): the topics become writable"
    )
    disconnect.add_argument("name")
    disconnect.add_argument("--topic")
    disconnect.set_defaults(func=cmd_disconnect)
    add_cluster_args(disconnect)

    delete = links_sub.add_parser("delete", help="remove a link; its mirrors stay, writable")
    delete.add_argument("name")
    delete.set_defaults(func=cmd_delete)
    add_cluster_args(delete)
