"""`raylog quotas` parsing: the entity (a user, a client id, both, or their defaults) and the
ops (--set KEY=NUMBER, --delete KEY) become AlterClientQuotas' entry; a missing entity or op
and a malformed --set fail with one line before anything is sent."""

from __future__ import annotations

import argparse

import pytest

from raylog.actors.cli import main as cli_main
from raylog.actors.cli import quotas
from raylog.actors.cli.client import CliError


def parse(*argv: str) -> argparse.Namespace:
    return cli_main.build_parser().parse_args(["quotas", *argv])


@pytest.mark.parametrize(
    ("argv", "entity"),
    [
        (["--user", "alice"], [("user", "alice")]),
        (["--user-default"], [("user", None)]),
        (["--client-id", "app"], [("client-id", "app")]),
        (["--user", "alice", "--client-default"], [("user", "alice"), ("client-id", None)]),
        (["--user-default", "--client-id", "app"], [("user", None), ("client-id", "app")]),
    ],
)
def test_the_entity(argv: list[str], entity: list[tuple[str, str | None]]) -> None:
    args = parse("alter", *argv, "--set", "producer_byte_rate=1024")
    assert quotas.entity(args) == entity


def test_the_ops() -> None:
    args = parse(
        "alter",
        "--user",
        "u",
        "--set",
        "producer_byte_rate=1024",
        "--set",
        "request_percentage=12.5",
        "--delete",
        "consumer_byte_rate",
    )
    assert quotas.ops(args) == [
        ("producer_byte_rate", 1024.0, False),
        ("request_percentage", 12.5, False),
        ("consumer_byte_rate", 0.0, True),
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "producer_byte_rate=1"], "needs an entity"),
        (["--user", "u"], "needs --set"),
        (["--user", "u", "--set", "producer_byte_rate"], "KEY=NUMBER"),
        (["--user", "u", "--set", "producer_byte_rate=fast"], "KEY=NUMBER"),
    ],
)
def test_bad_arguments_fail_before_anything_is_sent(argv: list[str], message: str) -> None:
    args = parse("alter", *argv)
    with pytest.raises(CliError, match=message):
        quotas.entity(args)
        quotas.ops(args)


def test_user_and_user_default_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        parse("alter", "--user", "u", "--user-default", "--set", "producer_byte_rate=1")
