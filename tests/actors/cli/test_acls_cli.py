"""`raylog acls` in the caller's process: what its flags become before anything is sent.

Proves: `acls add` makes one ACL per --operation (case-insensitive), LITERAL or --prefixed,
ALLOW or --deny, host * by default, the cluster as kafka-cluster; it refuses without a
resource, a principal or an operation, and two resources at once. `acls list` and `acls remove`
make Kafka's filters: nothing given matches every ACL, a resource matches its LITERAL pattern
unless --prefixed or --pattern-type (match, any) says otherwise, --allow / --deny narrow the
permission; `acls remove` without a filter needs --all.
"""

from __future__ import annotations

import argparse

import pytest

from raylog.actors.cli import acls as cli
from raylog.actors.cli import main as cli_main
from raylog.actors.cli.client import CliError
from raylog.actors.control.acls import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)


def parse(*argv: str) -> argparse.Namespace:
    return cli_main.build_parser().parse_args(["acls", *argv])


def test_add_makes_one_acl_per_operation() -> None:
    args = parse("add", "--principal", "User:alice", "--operation", "read", "--operation", "Write",
                 "--topic", "orders", "--prefixed")  # fmt: skip
    made = cli.bindings(args)
    assert [(b.operation, b.pattern_type, b.host, b.permission_type) for b in made] == [
        (AclOperation.READ, PatternType.PREFIXED, "*", AclPermissionType.ALLOW),
        (AclOperation.WRITE, PatternType.PREFIXED, "*", AclPermissionType.ALLOW),
    ]
    args = parse("add", "--principal", "User:*", "--operation", "ALTER", "--cluster", "--deny",
                 "--host", "10.0.0.1")  # fmt: skip
    (deny,) = cli.bindings(args)
    assert (deny.resource_type, deny.resource_name, deny.pattern_type) == (
        ResourceType.CLUSTER,
        "kafka-cluster",
        PatternType.LITERAL,
    )
    assert (deny.permission_type, deny.host) == (AclPermissionType.DENY, "10.0.0.1")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--principal", "User:a", "--operation", "READ"], "needs a resource"),
        (["--operation", "READ", "--group", "g"], "needs --principal"),
        (["--principal", "User:a", "--group", "g"], "needs --operation"),
    ],
)
def test_add_refuses_what_is_missing(argv: list[str], message: str) -> None:
    with pytest.raises(CliError, match=message):
        cli.bindings(parse("add", *argv))


def test_add_refuses_two_resources_and_unknown_operations() -> None:
    for argv in (["--topic", "t", "--group", "g"], ["--operation", "READS"]):
        with pytest.raises(SystemExit):
            parse("add", *argv)


def test_list_and_remove_filters() -> None:
    assert cli.filters(parse("list")) == [AclBindingFilter()]
    (topic,) = cli.filters(parse("list", "--topic", "orders"))
    assert (topic.resource_type, topic.resource_name, topic.pattern_type) == (
        ResourceType.TOPIC,
        "orders",
        PatternType.LITERAL,
    )
    (matched,) = cli.filters(parse("list", "--topic", "orders", "--pattern-type", "MATCH"))
    assert matched.pattern_type == PatternType.MATCH
    (prefixed,) = cli.filters(parse("list", "--group", "g", "--prefixed", "--deny"))
    assert (prefixed.pattern_type, prefixed.permission_type) == (
        PatternType.PREFIXED,
        AclPermissionType.DENY,
    )
    two = cli.filters(parse("remove", "--principal", "User:a", "--operation", "READ",
                            "--operation", "WRITE", "--allow"))  # fmt: skip
    assert [(f.principal, f.operation, f.permission_type) for f in two] == [
        ("User:a", AclOperation.READ, AclPermissionType.ALLOW),
        ("User:a", AclOperation.WRITE, AclPermissionType.ALLOW),
    ]


def test_remove_without_a_filter_needs_all() -> None:
    with pytest.raises(CliError, match="--all"):
        cli.cmd_remove(parse("remove"))
