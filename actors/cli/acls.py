"""`raylog acls add|list|remove`: Kafka's ACLs, as ``kafka-acls.sh`` manages them (CreateAcls,
DescribeAcls and DeleteAcls, asked of the active controller).

The commands talk to the controller over Ray: they are authenticated by the cluster's Ray
connection (its token), not by a Kafka principal, so ACLs do not apply to them; an operator
can always repair the ACLs that lock every client out. ACLs take effect on the gateways whose
``authorizer.class.name`` is Kafka's StandardAuthorizer (within a metadata poll).

A resource is one of ``--topic``, ``--group``, ``--cluster`` or ``--transactional-id``;
``add`` creates one ACL per ``--operation`` (ALLOW, or DENY with ``--deny``), on the LITERAL
name or, with ``--prefixed``, on every name starting with it. ``list`` and ``remove`` take the
same flags as a filter (Kafka's AclBindingFilter: what is not given matches everything; a
resource given matches its LITERAL pattern unless ``--pattern-type`` says otherwise: ``match``
finds every ACL that applies to the name). ``remove`` without any filter needs ``--all``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raylog.actors.cli.client import CliError, add_cluster_args, call, connect
from raylog.actors.cli.text import error_names, print_json
from raylog.actors.control import acls
from raylog.actors.control.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

OPERATIONS = [op.name for op in AclOperation if op not in (AclOperation.UNKNOWN, AclOperation.ANY)]
PATTERN_TYPES = ("literal", "prefixed", "any", "match")


def _resource(args: argparse.Namespace) -> tuple[ResourceType, str] | None:
    if args.topic is not None:
        return ResourceType.TOPIC, args.topic
    if args.group is not None:
        return ResourceType.GROUP, args.group
    if args.transactional_id is not None:
        return ResourceType.TRANSACTIONAL_ID, args.transactional_id
    if args.cluster:
        return ResourceType.CLUSTER, acls.CLUSTER_NAME
    return None


def bindings(args: argparse.Namespace) -> list[AclBinding]:
    """``add``'s ACLs, one per operation."""
    resource = _resource(args)
    if resource is None:
        raise CliError(
            "acls add needs a resource: --topic, --group, --cluster or --transactional-id"
        )
    if not args.principal:
        raise CliError("acls add needs --principal, e.g. User:alice")
    if not args.operation:
        raise CliError(f"acls add needs --operation: {', '.join(OPERATIONS)}")
    pattern = PatternType.PREFIXED if args.prefixed else PatternType.LITERAL
    permission = AclPermissionType.DENY if args.deny else AclPermissionType.ALLOW
    return [
        AclBinding(
            resource_type=resource[0],
            resource_name=resource[1],
            pattern_type=pattern,
            principal=args.principal,
            host=args.host or "*",
            operation=AclOperation[op],
            permission_type=permission,
        )
        for op in dict.fromkeys(args.operation)
    ]


def filters(args: argparse.Namespace) -> list[AclBindingFilter]:
    """``list``'s and ``remove``'s filters, one per operation given (one if none)."""
    resource = _resource(args)
    if args.pattern_type is not None:
        pattern = PatternType[args.pattern_type.upper()]
    elif args.prefixed:
        pattern = PatternType.PREFIXED
    else:
        pattern = PatternType.LITERAL if resource is not None else PatternType.ANY
    if args.deny:
        permission = AclPermissionType.DENY
    elif args.allow:
        permission = AclPermissionType.ALLOW
    else:
        permission = AclPermissionType.ANY
    operations = [AclOperation[op] for op in dict.fromkeys(args.operation or ())]
    return [
        AclBindingFilter(
            resource_type=resource[0] if resource else ResourceType.ANY,
            resource_name=resource[1] if resource else None,
            pattern_type=pattern,
            principal=args.principal,
            host=args.host,
            operation=operation,
            permission_type=permission,
        )
        for operation in operations or [AclOperation.ANY]
    ]


def _failure(code: int, message: str) -> str:
    return f"{error_names().get(code, f'error {code}')}: {message}"


def _row(acl: AclBinding) -> dict[str, str]:
    return {
        "resource_type": acl.resource_type.name,
        "resource_name": acl.resource_name,
        "pattern_type": acl.pattern_type.name,
        "principal": acl.principal,
        "host": acl.host,
        "operation": acl.operation.name,
        "permission_type": acl.permission_type.name,
    }


def _print_table(found: list[AclBinding]) -> None:
    if not found:
        print("No ACLs.", flush=True)
        return
    rows = [_row(a) for a in found]
    heads = list(rows[0])
    widths = {h: max(len(h), *(len(r[h]) for r in rows)) for h in heads}
    print("  ".join(h.upper().ljust(widths[h]) for h in heads).rstrip())
    for r in rows:
        print("  ".join(r[h].ljust(widths[h]) for h in heads).rstrip())
    sys.stdout.flush()


def cmd_add(args: argparse.Namespace) -> int:
    wanted = bindings(args)
    results = call(connect(args), "create_acls", wanted)
    failed = [
        f"{acl.operation.name}: {_failure(code, message)}"
        for acl, (code, message) in zip(wanted, results, strict=True)
        if code
    ]
    if failed:
        raise CliError("; ".join(failed))
    print(f"Added {len(wanted)} ACL(s).", flush=True)
    _print_table(wanted)
    return 0


def _matching(controller: Any, wanted: list[AclBindingFilter]) -> list[AclBinding]:
    found: dict[AclBinding, None] = {}
    for f in wanted:
        found.update(dict.fromkeys(call(controller, "describe_acls", f)))
    return list(found)


def cmd_list(args: argparse.Namespace) -> int:
    found = _matching(connect(args), filters(args))
    if args.json:
        print_json([_row(a) for a in found])
    else:
        _print_table(found)
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    wanted = filters(args)
    unfiltered = AclBindingFilter()
    if not args.all and any(f == unfiltered for f in wanted):
        raise CliError("acls remove without a filter removes every ACL: add --all to mean it")
    results = call(connect(args), "delete_acls", wanted)
    failed = [_failure(r.error_code, r.message) for r in results if r.error_code]
    if failed:
        raise CliError("; ".join(failed))
    removed = [acl for r in results for acl in r.deleted]
    print(f"Removed {len(removed)} ACL(s).", flush=True)
    if removed:
        _print_table(removed)
    return 0


def _add_filter_args(p: argparse.ArgumentParser, adding: bool) -> None:
    p.add_argument("--principal", help="Kafka's principal, e.g. User:alice (User:* is everyone)")
    p.add_argument("--host", help="a client's IP address (default * for add: every host)")
    p.add_argument(
        "--operation",
        action="append",
        type=str.upper,
        choices=OPERATIONS,
        metavar="OPERATION",
        help=f"repeatable: {', '.join(OPERATIONS)}",
    )
    permission = p.add_mutually_exclusive_group()
    permission.add_argument("--deny", action="store_true", help="a DENY ACL (beats any ALLOW)")
    if not adding:
        permission.add_argument("--allow", action="store_true", help="ALLOW ACLs only")
    resource = p.add_mutually_exclusive_group()
    resource.add_argument("--topic", metavar="NAME")
    resource.add_argument("--group", metavar="NAME")
    resource.add_argument("--transactional-id", metavar="ID")
    resource.add_argument("--cluster", action="store_true", help="the cluster (kafka-cluster)")
    pattern = p.add_mutually_exclusive_group()
    pattern.add_argument(
        "--prefixed", action="store_true", help="every resource whose name starts with NAME"
    )
    if not adding:
        pattern.add_argument(
            "--pattern-type",
            type=str.lower,
            choices=PATTERN_TYPES,
            help="literal (default with a resource), prefixed, any (exact names), match (every "
            "ACL that applies to the name)",
        )


def add_subcommands(sub: Any) -> None:
    """Adds ``acls`` to ``raylog``'s subparsers."""
    acls_parser = sub.add_parser("acls", help="Kafka's ACLs (added, listed, removed)")
    acls_sub = acls_parser.add_subparsers(dest="acls_command", required=True)

    add = acls_sub.add_parser("add", help="allow (or --deny) a principal operations on a resource")
    _add_filter_args(add, adding=True)
    add.set_defaults(func=cmd_add)
    add_cluster_args(add)

    listing = acls_sub.add_parser("list", help="the ACLs matching the filter (all by default)")
    _add_filter_args(listing, adding=False)
    listing.set_defaults(func=cmd_list)
    add_cluster_args(listing, json_flag=True)

    remove = acls_sub.add_parser("remove", help="remove the ACLs matching the filter")
    _add_filter_args(remove, adding=False)
    remove.add_argument("--all", action="store_true", help="no filter: remove every ACL")
    remove.set_defaults(func=cmd_remove)
    add_cluster_args(remove)
