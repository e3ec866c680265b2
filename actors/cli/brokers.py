"""`raylog brokers list|stop|kill|start|decommission`: the brokers of a cluster `raylog up` runs.

``list`` reads the controller's metadata (id, rack, address, state, partitions led); ``stop``
(controlled shutdown: leadership moves first), ``kill`` (a crash: the broker's actors die at
once) and ``start`` (back with the same id, rack, data dir and port) are carried out by the
supervisor actor of the `raylog up` process (``raylog.actors.cluster.supervisor``).
``decommission`` marks a broker draining (it takes no new replica) and moves every replica off
it with reassignments (the controller's ``decommission``: refused, naming the topic, when a
partition's replication factor needs the broker), waits for them as ``raylog reassign`` does,
then stops the broker (so that its Ray node can be given back); ``decommission --cancel`` and
``start`` end the draining.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raylog.actors.cli.client import CliError, add_cluster_args, call, connect, supervisor
from raylog.actors.cli.text import print_json

# How long the CLI waits for the supervisor's answer; the supervisor bounds each step itself.
STOP_TIMEOUT_S = 80.0  # a controlled shutdown, then the gateway's stop
START_TIMEOUT_S = 90.0  # the broker registered and its gateway listening


def cmd_list(args: argparse.Namespace) -> int:
    from raylog.actors.control import health

    md = call(connect(args), "metadata")
    stopped = {b for b, how in call(supervisor(), "lifecycle").items() if how == "stopped"}
    rows = health.broker_rows(md, stopped)
    if args.json:
        print_json(
            [
                {
                    "id": r.broker_id,
                    "rack": r.rack,
                    "host": r.host,
                    "port": r.port,
                    "state": r.state,
                    "leader_partitions": r.leader_partitions,
                }
                for r in rows
            ]
        )
        return 0
    print(f"{'ID':>4}  {'RACK':<6} {'ADDRESS':<22} {'STATE':<9} LEADERS")
    for r in rows:
        address = f"{r.host}:{r.port}"
        print(
            f"{r.broker_id:>4}  {r.rack or '-':<6} {address:<22} {r.state:<9} {r.leader_partitions}"
        )
    sys.stdout.flush()
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    connect(args)
    moved = call(supervisor(), "stop_broker", args.id, timeout_s=STOP_TIMEOUT_S)
    if not moved:
        print(f"raylog: broker {args.id} stopped; leadership move not confirmed", file=sys.stderr)
    print(f"Broker {args.id} stopped (controlled shutdown).", flush=True)
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    connect(args)
    call(supervisor(), "kill_broker", args.id)
    print(f"Broker {args.id} killed.", flush=True)
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from raylog.actors.cli import reassign

    controller = reassign.ActiveController(args)  # connects
    call(supervisor(), "start_broker", args.id, timeout_s=START_TIMEOUT_S)
    # Started on purpose: it takes new replicas again, even if it was decommissioned.
    if controller.call("cancel_decommission", args.id):
        print(f"Broker {args.id} takes new replicas again (no longer draining).")
    print(f"Broker {args.id} started.", flush=True)
    return 0


def cmd_decommission(args: argparse.Namespace) -> int:
    from raylog.actors.cli import reassign
    from raylog.actors.control import metadata as md_

    if args.throttle is not None and args.throttle <= 0:
        raise CliError("--throttle wants a positive number of bytes per second")
    controller = reassign.ActiveController(args)
    if args.cancel:
        if not controller.call("cancel_decommission", args.id):
            raise CliError(f"broker {args.id} is not being decommissioned")
        print(
            f"Broker {args.id} takes new replicas again; moves already started go on "
            "(`raylog reassign --list`, `raylog reassign --cancel`).",
            flush=True,
        )
        return 0
    started = controller.call("decommission", args.id, args.throttle)
    partitions = sorted(started)
    if partitions:
        print(f"Moving {len(partitions)} partitions off broker {args.id}", flush=True)
        done, _ = reassign.wait_moves(controller, partitions, args.timeout, quiet=False)
        if not done:
            raise CliError(
                f"replicas still moving off broker {args.id} after {args.timeout:.0f} s "
                "(follow them with `raylog reassign --list`, then run this again)"
            )
    md = controller.call("metadata")
    left = sorted(
        f"{tp.topic}-{tp.partition}" for tp, p in md_.partitions(md) if args.id in p.replicas
    )
    if left:
        raise CliError(
            f"broker {args.id} took replicas meanwhile ({', '.join(left[:3])}): run this again"
        )
    call(supervisor(), "stop_broker", args.id, timeout_s=STOP_TIMEOUT_S)
    print(f"Broker {args.id} decommissioned: it holds no replica and is stopped.", flush=True)
    return 0


def add_subcommands(sub: Any) -> None:
    """Adds ``brokers`` to ``raylog``'s subparsers."""
    brokers = sub.add_parser("brokers", help="list, stop, kill, start and decommission brokers")
    brokers_sub = brokers.add_subparsers(dest="brokers_command", required=True)
    listing = brokers_sub.add_parser("list", help="id, rack, address, state, partitions led")
    listing.set_defaults(func=cmd_list)
    add_cluster_args(listing, json_flag=True)
    for name, func, text in (
        ("stop", cmd_stop, "controlled shutdown: leadership moves first"),
        ("kill", cmd_kill, "hard crash: kill the broker's actors, no clean-up"),
        ("start", cmd_start, "start a stopped or killed broker again, as it was"),
    ):
        p = brokers_sub.add_parser(name, help=text)
        p.add_argument("id", type=int)
        p.set_defaults(func=func)
        add_cluster_args(p)
    p = brokers_sub.add_parser("decommission", help="move every replica off a broker, then stop it")
    p.add_argument("id", type=int)
    p.add_argument("--throttle", type=int, help="replication bytes/s for the moves")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the moves")
    p.add_argument(
        "--cancel", action="store_true", help="the broker takes new replicas again (stop draining)"
    )
    p.set_defaults(func=cmd_decommission)
    add_cluster_args(p)
