"""``raylog reassign``: move partition replicas (KIP-455), rebalance, cancel, show progress.

This module owns the reassign command of the CLI; the work is the controller's
(``reassign_partitions``, ``rebalance``, ``cancel_reassignments``, ``list_reassignments``)::

    raylog reassign --topic T --partition P --replicas 1,2,3 [--throttle BYTES]
    raylog reassign --rebalance [--topic T] [--throttle BYTES]
    raylog reassign --cancel [--topic T [--partition P]]
    raylog reassign --list

Starting one prints progress (each adding replica's log end against the leader's) until every
started reassignment completes, bounded by ``--timeout``; ``--no-wait`` returns at once.
``--json`` prints one JSON document at the end instead. Exit code 1 with a one-line reason when a
partition is refused or the wait times out.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from raylog.actors.cli.client import CliError, add_cluster_args, call, connect
from raylog.actors.cli.text import error_names, print_json

POLL_S = 1.0
WAIT_TIMEOUT_S_DEFAULT = 600.0


def _replica_list(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--replicas wants broker ids like 1,2,3, got {text!r}"
        ) from None
    if not ids:
        raise argparse.ArgumentTypeError("--replicas names no broker")
    return ids


def _row_json(r: Any) -> dict[str, Any]:
    return {
        "topic": r.topic,
        "partition": r.partition,
        "replicas": list(r.replicas),
        "target": list(r.target),
        "adding": list(r.adding),
        "removing": list(r.removing),
        "leader": r.leader,
        "isr": list(r.isr),
        "leader_log_end_offset": r.leader_log_end_offset,
        "adding_log_end_offsets": {str(b): o for b, o in r.adding_log_end_offsets.items()},
    }


def _row_text(r: Any) -> str:
    copies = []
    for b, leo in sorted(r.adding_log_end_offsets.items()):
        state = "in ISR" if b in r.isr else f"{max(leo, 0)}/{max(r.leader_log_end_offset, 0)}"
        copies.append(f"{b}: {state}")
    return (
        f"{r.topic}-{r.partition}: {','.join(map(str, r.replicas))} -> "
        f"{','.join(map(str, r.target))}  adding [{'; '.join(copies)}]  "
        f"removing {','.join(map(str, r.removing)) or '-'}  leader {r.leader}"
    )


def _started_ok(codes: dict[tuple[str, int], tuple[int, str]]) -> list[tuple[str, int]]:
    return sorted(tp for tp, (code, _) in codes.items() if code == 0)


def _refusals(codes: dict[tuple[str, int], tuple[int, str]]) -> list[str]:
    names = error_names()
    return [
        f"{t}-{p}: {names.get(code, code)}: {message}"
        for (t, p), (code, message) in sorted(codes.items())
        if code != 0
    ]


class ActiveController:
    """The active controller, found again once when it changed under a call (a lease moved
    between ``connect`` and the call). Every call made through it is idempotent: a
    reassignment to the same target again is a no-op."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.handle = connect(args)

    def call(self, method: str, *call_args: Any) -> Any:
        try:
            return call(self.handle, method, *call_args)
        except CliError as e:
            if not str(e).startswith("NotControllerError"):
                raise
        self.handle = connect(self.args)
        return call(self.handle, method, *call_args)


def wait_moves(
    controller: ActiveController,
    partitions: list[tuple[str, int]],
    timeout_s: float,
    *,
    quiet: bool,
) -> tuple[bool, list[Any]]:
    """Poll progress until none of ``partitions`` is being reassigned (bounded by
    ``timeout_s``), printing each round's rows unless ``quiet``."""
    wanted = set(partitions)
    deadline = time.monotonic() + timeout_s
    rows: list[Any] = []
    while True:  # bounded by the deadline
        rows = [
            r for r in controller.call("list_reassignments") if (r.topic, r.partition) in wanted
        ]
        if not rows:
            return True, rows
        if not quiet:
            for r in rows:
                print(_row_text(r), flush=True)
        if time.monotonic() >= deadline:
            return False, rows
        time.sleep(POLL_S)


def cmd_reassign(args: argparse.Namespace) -> int:
    modes = sum(bool(x) for x in (args.replicas, args.rebalance, args.cancel, args.list))
    if modes != 1:
        raise CliError("choose one of --replicas, --rebalance, --cancel, --list")
    if args.replicas and (args.topic is None or args.partition is None):
        raise CliError("--replicas needs --topic and --partition")
    if args.partition is not None and args.topic is None:
        raise CliError("--partition needs --topic")
    if args.throttle is not None and args.throttle <= 0:
        raise CliError("--throttle wants a positive number of bytes per second")
    controller = ActiveController(args)
    if args.list:
        rows = controller.call("list_reassignments")
        if args.json:
            print_json({"reassignments": [_row_json(r) for r in rows]})
        else:
            for r in rows:
                print(_row_text(r))
            if not rows:
                print("No partition is being reassigned.")
        return 0
    if args.cancel:
        partitions = None
        if args.topic is not None:
            t = controller.call("describe_topic", args.topic)
            wanted = range(len(t.partitions)) if args.partition is None else [args.partition]
            partitions = [(args.topic, p) for p in wanted]
        codes = controller.call("cancel_reassignments", partitions)
        if partitions is not None and args.partition is None:
            # The whole topic: partitions that had nothing running are not an error.
            codes = {tp: c for tp, c in codes.items() if c[0] == 0}
        return _report(args, "Cancelled", codes, [], done=True)
    if args.rebalance:
        topics = None if args.topic is None else [args.topic]
        started = controller.call("rebalance", topics, args.throttle)
        codes = {tp: (0, "") for tp in started}
        if not started and not args.json:
            print("Replicas are already balanced; nothing to move.")
    else:
        codes = controller.call(
            "reassign_partitions",
            {(args.topic, args.partition): args.replicas},
            args.throttle,
        )
    partitions = _started_ok(codes)
    if args.no_wait or not partitions or _refusals(codes):
        return _report(args, "Started", codes, [], done=not partitions)
    done, rows = wait_moves(controller, partitions, args.timeout, quiet=args.json)
    return _report(args, "Completed" if done else "Still running", codes, rows, done=done)


def _report(
    args: argparse.Namespace,
    verb: str,
    codes: dict[tuple[str, int], tuple[int, str]],
    rows: list[Any],
    *,
    done: bool,
) -> int:
    ok = _started_ok(codes)
    refused = _refusals(codes)
    if args.json:
        print_json(
            {
                "partitions": [{"topic": t, "partition": p} for t, p in ok],
                "errors": refused,
                "done": done,
                "reassignments": [_row_json(r) for r in rows],
            }
        )
    elif ok:
        print(f"{verb} reassignment of partitions " + ", ".join(f"{t}-{p}" for t, p in ok))
    sys.stdout.flush()
    if refused:
        raise CliError("reassignment refused for " + "; ".join(refused))
    if not done and verb == "Still running":
        raise CliError(f"reassignment not complete after {args.timeout:.0f} s (still running)")
    return 0


def add_subcommands(sub: Any) -> None:
    """Adds ``reassign`` to ``raylog``'s subparsers."""
    p = sub.add_parser(
        "reassign", help="move partition replicas, rebalance brokers, cancel, show progress"
    )
    p.add_argument("--topic")
    p.add_argument("--partition", type=int)
    p.add_argument("--replicas", type=_replica_list, help="target broker ids, e.g. 2,3")
    p.add_argument("--rebalance", action="store_true", help="spread replicas over all brokers")
    p.add_argument("--cancel", action="store_true", help="cancel running reassignments")
    p.add_argument("--list", action="store_true", help="show running reassignments")
    p.add_argument(
        "--throttle",
        type=int,
        help="bytes/s for replicas catching up (leader.replication.throttled.rate), lifted "
        "when the reassignments complete",
    )
    p.add_argument("--no-wait", action="store_true", help="return once started")
    p.add_argument(
        "--timeout",
        type=float,
        default=WAIT_TIMEOUT_S_DEFAULT,
        help=f"seconds to wait for completion (default {WAIT_TIMEOUT_S_DEFAULT:.0f})",
    )
    p.set_defaults(func=cmd_reassign)
    add_cluster_args(p, json_flag=True)
