"""Helpers of the authorization tests: ALLOW ACLs for alice, and the RequestContext fields of
alice's connection to a gateway whose authorizer holds them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raylog.actors.control import acls
from raylog.actors.control.acls import AclBinding, AclOperation, PatternType, ResourceType
from raylog.gateway.authentication import ClientSession
from raylog.gateway.authorization import Authorization

ALICE = "User:alice"


def allow(
    resource_type: ResourceType,
    name: str,
    *ops: AclOperation,
    pattern: PatternType = PatternType.LITERAL,
) -> list[AclBinding]:
    """alice may do ``ops`` on the resources the pattern names, from any host."""
    return [
        acls.binding(resource_type, name, pattern, ALICE, "*", op, acls.AclPermissionType.ALLOW)
        for op in ops
    ]


def as_alice(*bindings: Sequence[AclBinding], super_users: Sequence[str] = ()) -> dict[str, Any]:
    """RequestContext fields: alice's session (from 127.0.0.1) on a gateway whose authorizer
    holds ``bindings``."""
    flat = tuple(sorted({b for group in bindings for b in group}))
    return {
        "session": ClientSession("127.0.0.1", sasl_listener=False, principal=ALICE),
        "authorization": Authorization(True, super_users, False, flat),
    }
