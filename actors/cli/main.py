"""The `raylog` command line: start a cluster and operate it like Kafka's tools.

This module parses the arguments and dispatches; each command group is a module of this package
(``up``, ``topics``, ``configs``, ``brokers``, ``leader_election``, ``status``, ``reassign``,
``pipeline``, ``users``, ``quotas``, ``certs``, ``acls``, ``links``), each adding its commands to
the parser with ``add_subcommands``. How a command reaches the running cluster is ``client``'s;
the cluster itself is ``raylog.actors.cluster``'s. A command whose parser sets ``prepare``
(``users create``, ``links create``) has it run here first, in the caller's process, to read a
secret and pass on only what it derives.

`raylog up` runs a cluster in the foreground. Every other command finds the cluster from
``--data-dir`` (or $RAYLOG_DATA_DIR) or ``--address`` and asks the active controller or the
supervisor. Tables for people, ``--json`` for scripts; a failure is one line on stderr and
exit 1.
"""

from __future__ import annotations

import argparse
import io
import sys
import threading
from typing import TextIO

from raylog.actors.cli import (
    acls,
    brokers,
    certs,
    configs,
    leader_election,
    links,
    pipeline,
    quotas,
    reassign,
    status,
    topics,
    up,
    users,
)
from raylog.actors.cli.client import CliError, run_on_cluster


def build_parser() -> argparse.ArgumentParser:
    """One line per command group: its module's ``add_subcommands(sub)`` adds its commands
    (taking ``--data-dir``/``--address`` from ``client.add_cluster_args``)."""
    parser = argparse.ArgumentParser(prog="raylog", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up.add_subcommands(sub, run_here)
    topics.add_subcommands(sub)
    configs.add_subcommands(sub)
    brokers.add_subcommands(sub)
    leader_election.add_subcommands(sub)
    status.add_subcommands(sub)
    pipeline.add_subcommands(sub)
    reassign.add_subcommands(sub)
    users.add_subcommands(sub)
    quotas.add_subcommands(sub)
    certs.add_subcommands(sub)
    acls.add_subcommands(sub)
    links.add_subcommands(sub)
    return parser


class _MainThreadStdout(io.TextIOBase):
    """``sys.stdout`` for commands other than ``up``: what the main thread writes (tables,
    JSON) goes to stdout, what other threads write goes to stderr. Ray's driver relays raylet
    warnings ("N worker processes have been started ...") to ``sys.stdout`` from a background
    thread, which would otherwise land in the middle of ``--json`` output."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self._out, self._err = out, err

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        main = threading.current_thread() is threading.main_thread()
        return (self._out if main else self._err).write(text)

    def flush(self) -> None:
        self._out.flush()
        self._err.flush()


def run_here(argv: list[str]) -> int:
    """A command `raylog up` runs for a CLI (actors/cli/server.py), with its Ray connection."""
    args = build_parser().parse_args(argv)
    if args.command == "up":
        raise CliError("up is not run by a running cluster")
    return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    except CliError as e:
        print(f"raylog: {e}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    guarded = args.command != "up"
    if "prepare" in vars(args):
        # A secret a command takes (users create's password) is read here, in this process;
        # only what prepare derives from it goes on, as hidden arguments.
        try:
            argv = args.prepare(args, argv)
        except CliError as e:
            print(f"raylog: {e}", file=sys.stderr)
            return 1
    # The commands that ask the running cluster (those with --data-dir); `pipeline` runs here,
    # and so do those that write files where they are run (``runs_here``: `certs`).
    remote = not getattr(args, "address", None) and not getattr(args, "runs_here", False)
    if guarded and "data_dir" in vars(args) and remote:
        served = run_on_cluster(args, argv)
        if served is not None:
            return served
    if guarded and not isinstance(sys.stdout, _MainThreadStdout):
        sys.stdout = _MainThreadStdout(sys.stdout, sys.stderr)
    try:
        return _dispatch(args)
    finally:
        if guarded:
            # The command's output is complete. Ray's exit hook (ray.shutdown, on the main
            # thread) prints the raylet warnings it held back for de-duplication to
            # sys.stdout: they belong on stderr, after the table or JSON document.
            sys.stdout.flush()
            sys.stdout = sys.stderr


if __name__ == "__main__":
    sys.exit(main())
