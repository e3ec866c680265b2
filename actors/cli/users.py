"""`raylog users create|delete|list`: SASL/SCRAM users, as Kafka's ``kafka-configs.sh
--entity-type users`` manages them (KIP-554's AlterUserScramCredentials and
DescribeUserScramCredentials, asked of the active controller).

The password never leaves the process it is typed into: `users create` reads it (from
``--password-file``, ``--password-stdin`` or, on a terminal, a prompt typed twice), draws a
fresh salt per mechanism and derives RFC 5802's SaltedPassword there, as Kafka's admin clients
do; only (mechanism, iterations, salt, salted password) travels on. A command normally runs in
the data dir's `raylog up` process (``client.run_on_cluster``), which receives arguments only: so
``main`` calls :func:`prepare_create` first, in the caller's process, and the derived
credentials reach `raylog up` as the hidden ``--scram-credential`` arguments of the request
(over its loopback endpoint, never a process's argv). `raylog up` never reads a password.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import getpass
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from raylog.actors.cli.client import CliError, add_cluster_args, call, connect
from raylog.actors.cli.text import error_names, print_json
from raylog.actors.control.scram import (
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    SCRAM_HASHES,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    salted_password,
)

DEFAULT_MECHANISMS = (SCRAM_SHA_256, SCRAM_SHA_512)
DEFAULT_ITERATIONS = 8192
SALT_BYTES = 32
PASSWORD_BYTES_MAX = 4096  # a password file or stdin; more is not a password
CREDENTIAL_FLAG = "--scram-credential"  # hidden: MECHANISM:ITERATIONS:SALT_B64:SALTED_B64


def read_password(
    args: argparse.Namespace,
    stdin: TextIO | None = None,
    prompt: Callable[[str], str] = getpass.getpass,
) -> str:
    """The password from ``--password-file``, ``--password-stdin`` or a prompt typed twice on
    a terminal (one trailing newline of a file or stdin is not part of it)."""
    stdin = stdin or sys.stdin
    if args.password_file or args.password_stdin:
        where = args.password_file or "stdin"
        try:
            if args.password_file:
                with open(args.password_file, encoding="utf-8") as f:
                    text = f.read(PASSWORD_BYTES_MAX + 1)
            else:
                text = stdin.read(PASSWORD_BYTES_MAX + 1)
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"cannot read the password from {where}: {type(e).__name__}") from None
        if len(text) > PASSWORD_BYTES_MAX:
            raise CliError(f"the password from {where} is over {PASSWORD_BYTES_MAX} characters")
        password = text[:-1] if text.endswith("\n") else text
        password = password[:-1] if password.endswith("\r") else password
    elif stdin.isatty():
        password = prompt(f"Password for {args.name}: ")
        if prompt(f"Password for {args.name} again: ") != password:
            raise CliError("the passwords typed differ")
    else:
        raise CliError(
            "users create needs a password: --password-file PATH, --password-stdin, or a "
            "terminal to type it at"
        )
    if not password:
        raise CliError("the password is empty")
    return password


def credential_args(
    mechanisms: list[str],
    iterations: int,
    password: str,
    urandom: Callable[[int], bytes] = os.urandom,
) -> list[str]:
    """One hidden ``--scram-credential`` value per mechanism, each with a fresh salt."""
    values = []
    for mechanism in mechanisms:
        salt = urandom(SALT_BYTES)
        salted = salted_password(mechanism, password, salt, iterations)
        b64 = [base64.b64encode(x).decode() for x in (salt, salted)]
        values.append(f"{mechanism}:{iterations}:{b64[0]}:{b64[1]}")
    return values


def parse_credential(user: str, value: str) -> tuple[str, str, int, bytes, bytes]:
    """A ``--scram-credential`` value as the controller's upsertion; the error never shows it."""
    try:
        mechanism, iterations, salt, salted = value.split(":")
        b64 = [base64.b64decode(x, validate=True) for x in (salt, salted)]
        return user, mechanism, int(iterations), b64[0], b64[1]
    except (ValueError, binascii.Error):
        raise CliError(f"a malformed {CREDENTIAL_FLAG} value") from None


def prepare_create(args: argparse.Namespace, argv: list[str]) -> list[str]:
    """Run by ``main`` in the caller's process: read the password, derive the credentials
    into ``args`` and return ``argv`` with them as hidden arguments (for `raylog up`)."""
    if args.credentials:
        raise CliError(f"{CREDENTIAL_FLAG} is internal; give the password another way")
    if not ITERATIONS_MIN <= args.iterations <= ITERATIONS_MAX:
        raise CliError(f"--iterations must be in [{ITERATIONS_MIN}, {ITERATIONS_MAX}]")
    mechanisms = list(dict.fromkeys(args.mechanism or DEFAULT_MECHANISMS))
    args.credentials = credential_args(mechanisms, args.iterations, read_password(args))
    hidden = [x for value in args.credentials for x in (CREDENTIAL_FLAG, value)]
    return [*argv, *hidden]


def _alter(controller: Any, upsertions: list[Any], deletions: list[Any], what: str) -> None:
    """One AlterUserScramCredentials per change: Kafka refuses a user named twice."""
    ((_, code, message),) = call(controller, "alter_scram_credentials", upsertions, deletions)
    if code:
        name = error_names().get(code, f"error {code}")
        raise CliError(f"{what}: {name}: {message}")


def cmd_create(args: argparse.Namespace) -> int:
    if not args.credentials:  # `raylog up` running a request made without prepare_create
        raise CliError("users create reads the password in the raylog command's own process")
    upsertions = [parse_credential(args.name, value) for value in args.credentials]
    controller = connect(args)
    for upsertion in upsertions:
        _alter(controller, [upsertion], [], f"user {args.name!r} {upsertion[1]}")
    mechanisms = ", ".join(u[1] for u in upsertions)
    print(f"Completed updating SCRAM credentials for user {args.name} ({mechanisms}).", flush=True)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    controller = connect(args)
    mechanisms = list(dict.fromkeys(args.mechanism or ()))
    if not mechanisms:
        (found,) = call(controller, "describe_scram_credentials", [args.name])
        if found.error_code:
            raise CliError(f"user {args.name!r} has no SCRAM credentials")
        mechanisms = [mechanism for mechanism, _ in found.credentials]
    for mechanism in mechanisms:
        _alter(controller, [], [(args.name, mechanism)], f"user {args.name!r} {mechanism}")
    print(f"Deleted SCRAM credentials for user {args.name} ({', '.join(mechanisms)}).", flush=True)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    users = call(connect(args), "describe_scram_credentials", None)
    if args.json:
        print_json({d.user: dict(d.credentials) for d in users})
        return 0
    if not users:
        print("No SCRAM users.", flush=True)
        return 0
    width = max(len("USER"), *(len(d.user) for d in users))
    print(f"{'USER':<{width}}  MECHANISM      ITERATIONS")
    for d in users:
        for mechanism, iterations in d.credentials:
            print(f"{d.user:<{width}}  {mechanism:<13}  {iterations}")
    sys.stdout.flush()
    return 0


def add_subcommands(sub: Any) -> None:
    """Adds ``users`` to ``raylog``'s subparsers."""
    users = sub.add_parser("users", help="SASL/SCRAM users (created, deleted, listed)")
    users_sub = users.add_subparsers(dest="users_command", required=True)
    mechanism_help = f"repeatable; default {' and '.join(DEFAULT_MECHANISMS)}"

    create = users_sub.add_parser(
        "create", help="create a user or replace its credentials (the password is never an arg)"
    )
    create.add_argument("name")
    create.add_argument("--mechanism", action="append", choices=SCRAM_HASHES, help=mechanism_help)
    create.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help=f"SCRAM iterations, {ITERATIONS_MIN}..{ITERATIONS_MAX} (default {DEFAULT_ITERATIONS})",
    )
    source = create.add_mutually_exclusive_group()
    source.add_argument(
        "--password-file",
        type=Path,
        metavar="PATH",
        help="holds the password (a trailing newline is dropped)",
    )
    source.add_argument("--password-stdin", action="store_true", help="read it from stdin")
    create.add_argument(
        CREDENTIAL_FLAG, action="append", dest="credentials", help=argparse.SUPPRESS
    )
    create.set_defaults(func=cmd_create, prepare=prepare_create)
    add_cluster_args(create)

    delete = users_sub.add_parser("delete", help="delete a user's credentials (all by default)")
    delete.add_argument("name")
    delete.add_argument("--mechanism", action="append", choices=SCRAM_HASHES, help="repeatable")
    delete.set_defaults(func=cmd_delete)
    add_cluster_args(delete)

    listing = users_sub.add_parser("list", help="every SCRAM user: mechanisms and iterations")
    listing.set_defaults(func=cmd_list)
    add_cluster_args(listing, json_flag=True)
