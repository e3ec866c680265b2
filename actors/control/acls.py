"""Pure: Kafka's ACL model (AclBinding, AclBindingFilter) and its StandardAuthorizer.

This module owns what an ACL is, which ACLs may be created, which a filter matches, and the
authorization decision the gateways make on every request, as Kafka's KRaft controller
(AclControlManager) and StandardAuthorizer make them, with Kafka's wire codes:

- An ACL allows or denies ``principal`` (``User:alice``; ``User:*`` is every principal) from
  ``host`` (an IP address; ``*`` is every host) one operation on the resources a pattern names:
  LITERAL (the name; ``*`` is every resource of the type) or PREFIXED (every name starting with
  it). The cluster is the one resource named ``kafka-cluster``.
- :meth:`Authorizer.authorize`: super users may do everything; else a matching DENY beats any
  ALLOW; an ALLOW of ALL allows every operation, of READ, WRITE, DELETE or ALTER also DESCRIBE,
  of ALTER_CONFIGS also DESCRIBE_CONFIGS (implications hold for ALLOW only, as Kafka's); a
  resource no ACL names at all (of any principal) is allowed only with
  ``allow.everyone.if.no.acl.found``.
- :func:`create_acls`, :func:`delete_acls`, :func:`describe_acls`: Kafka's validation and
  per-creation / per-filter results, on the ACL set stored in the cluster metadata.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import NamedTuple

import msgspec

from raylog.storage.errors import InvalidRequestError, RaylogError

__all__ = [
    "CLUSTER_NAME",
    "STANDARD_AUTHORIZER",
    "AclBinding",
    "AclBindingFilter",
    "AclOperation",
    "AclPermissionType",
    "Authorizer",
    "PatternType",
    "ResourceType",
    "create_acls",
    "delete_acls",
    "describe_acls",
    "parse_super_users",
]

# authorizer.class.name of Kafka's KRaft authorizer, the one raylog implements.
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
CLUSTER_NAME = "kafka-cluster"  # Kafka's name of the CLUSTER resource
WILDCARD = "*"  # every resource (LITERAL name) or every host
WILDCARD_PRINCIPAL = "User:*"
ACLS_MAX = 10_000  # bound on the stored set: every gateway polls the metadata that holds it


class ResourceType(IntEnum):
    """Kafka's org.apache.kafka.common.resource.ResourceType codes."""

    UNKNOWN = 0
    ANY = 1  # filters only
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    """Kafka's PatternType codes."""

    UNKNOWN = 0
    ANY = 1  # filters only: any pattern, names compared exactly
    MATCH = 2  # filters only: the patterns that match the name
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    """Kafka's AclOperation codes."""

    UNKNOWN = 0
    ANY = 1  # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(IntEnum):
    """Kafka's AclPermissionType codes."""

    UNKNOWN = 0
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


# The resources raylog authorizes; Kafka's other types (delegation tokens, users) do not exist
# in raylog, so ACLs on them could never take effect.
RESOURCE_TYPES = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
# What an ALLOW of an operation also allows (StandardAuthorizerData's IMPLIES_DESCRIBE and
# IMPLIES_DESCRIBE_CONFIGS).
_IMPLIED_BY = {
    AclOperation.DESCRIBE: frozenset(
        {
            AclOperation.DESCRIBE,
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.DELETE,
            AclOperation.ALTER,
        }
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset(
        {AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    ),
}


class AclBinding(msgspec.Struct, frozen=True, kw_only=True, order=True):
    """One ACL (Kafka's AclBinding: a resource pattern and an access control entry)."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType


class AclBindingFilter(NamedTuple):
    """Kafka's AclBindingFilter: ANY / None fields match everything; pattern type MATCH
    matches the patterns that apply to ``resource_name`` (LITERAL equal or ``*``, PREFIXED
    prefixes of it), ANY compares names exactly whatever the pattern type."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def matches(self, acl: AclBinding) -> bool:
        """Kafka's ResourcePatternFilter.matches and AccessControlEntryFilter.matches."""
        if self.resource_type != ResourceType.ANY and self.resource_type != acl.resource_type:
            return False
        exact = self.pattern_type in (PatternType.ANY, acl.pattern_type)
        if not exact and self.pattern_type != PatternType.MATCH:
            return False
        if self.resource_name is not None:
            if exact:
                if self.resource_name != acl.resource_name:
                    return False
            elif acl.pattern_type == PatternType.LITERAL:
                if acl.resource_name not in (self.resource_name, WILDCARD):
                    return False
            elif not self.resource_name.startswith(acl.resource_name):
                return False
        if self.principal is not None and self.principal != acl.principal:
            return False
        if self.host is not None and self.host != acl.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != acl.operation:
            return False
        return self.permission_type in (AclPermissionType.ANY, acl.permission_type)

    def unknown(self) -> bool:
        """Kafka's AclBindingFilter.isUnknown: a field the request gave an unknown code."""
        return 0 in (self.resource_type, self.pattern_type, self.operation, self.permission_type)


def _code(enum: type[IntEnum], value: int) -> IntEnum:
    """A wire code as its enum member; UNKNOWN for a code Kafka does not define."""
    try:
        return enum(value)
    except ValueError:
        return enum(0)


def binding(
    resource_type: int,
    resource_name: str,
    pattern_type: int,
    principal: str,
    host: str,
    operation: int,
    permission_type: int,
) -> AclBinding:
    """An AclBinding from wire codes (an unknown code becomes UNKNOWN: check_new refuses it)."""
    return AclBinding(
        resource_type=ResourceType(_code(ResourceType, resource_type)),
        resource_name=resource_name,
        pattern_type=PatternType(_code(PatternType, pattern_type)),
        principal=principal,
        host=host,
        operation=AclOperation(_code(AclOperation, operation)),
        permission_type=AclPermissionType(_code(AclPermissionType, permission_type)),
    )


def binding_filter(
    resource_type: int,
    resource_name: str | None,
    pattern_type: int,
    principal: str | None,
    host: str | None,
    operation: int,
    permission_type: int,
) -> AclBindingFilter:
    """An AclBindingFilter from wire codes (unknown codes become UNKNOWN)."""
    return AclBindingFilter(
        ResourceType(_code(ResourceType, resource_type)),
        resource_name,
        PatternType(_code(PatternType, pattern_type)),
        principal,
        host,
        AclOperation(_code(AclOperation, operation)),
        AclPermissionType(_code(AclPermissionType, permission_type)),
    )


def check_principal(principal: str) -> None:
    """Kafka's principal format, ``Type:name`` (raises InvalidRequestError)."""
    kind, colon, name = principal.partition(":")
    if not colon:
        raise InvalidRequestError(
            f"Could not parse principal from `{principal}` (no colon is present separating the "
            f"principal type from the principal name)"
        )
    if not kind or not name:
        raise InvalidRequestError(f"Could not parse principal from `{principal}`")


def check_new(acl: AclBinding) -> None:
    """Whether ``acl`` may be created (Kafka's AclControlManager.validateNewAcl and the
    broker's CreateAcls checks); raises InvalidRequestError (42) naming the problem."""
    if acl.resource_type not in RESOURCE_TYPES:
        raise InvalidRequestError(
            f"Invalid resourceType {acl.resource_type.name}: raylog authorizes "
            f"{', '.join(t.name for t in RESOURCE_TYPES)}"
        )
    if acl.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidRequestError(f"Invalid patternType {acl.pattern_type.name}")
    if acl.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        raise InvalidRequestError(f"Invalid operation {acl.operation.name}")
    if acl.permission_type not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        raise InvalidRequestError(f"Invalid permissionType {acl.permission_type.name}")
    if not acl.resource_name:
        raise InvalidRequestError("Resource name should not be empty")
    if acl.resource_type == ResourceType.CLUSTER and acl.resource_name != CLUSTER_NAME:
        raise InvalidRequestError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    check_principal(acl.principal)
    if not acl.host:
        raise InvalidRequestError("Host should not be empty: an IP address or *")


# Per creation: (Kafka error code, message); (0, "") when created (or already there).
CreationResult = tuple[int, str]


class DeletionResult(NamedTuple):
    """Per filter of a DeleteAcls: its error (a filter Kafka refuses) or the ACLs deleted."""

    error_code: int
    message: str
    deleted: tuple[AclBinding, ...]


def create_acls(
    table: tuple[AclBinding, ...], creations: Sequence[AclBinding]
) -> tuple[tuple[AclBinding, ...], list[CreationResult]]:
    """CreateAcls as Kafka's controller carries it out: each creation checked on its own
    (:func:`check_new`), an ACL that exists already is a success that adds nothing. Returns
    the new table (sorted; the very same tuple when nothing was added) and one result per
    creation."""
    present = set(table)
    added: list[AclBinding] = []
    results: list[CreationResult] = []
    for acl in creations:
        try:
            check_new(acl)
            if acl not in present and len(present) >= ACLS_MAX:
                raise InvalidRequestError(f"raylog stores at most {ACLS_MAX} ACLs")
        except RaylogError as exc:
            results.append((exc.error_code, str(exc)))
            continue
        if acl not in present:
            present.add(acl)
            added.append(acl)
        results.append((0, ""))
    if not added:
        return table, results
    return tuple(sorted((*table, *added))), results


def check_filter(f: AclBindingFilter) -> None:
    """Kafka's checks of a filter (raises InvalidRequestError)."""
    if f.unknown():
        raise InvalidRequestError("Filter contain UNKNOWN elements")


def describe_acls(table: Iterable[AclBinding], f: AclBindingFilter) -> list[AclBinding]:
    """The ACLs ``f`` matches (raises InvalidRequestError for a filter Kafka refuses)."""
    check_filter(f)
    return [acl for acl in table if f.matches(acl)]


def delete_acls(
    table: tuple[AclBinding, ...], filters: Sequence[AclBindingFilter]
) -> tuple[tuple[AclBinding, ...], list[DeletionResult]]:
    """DeleteAcls as Kafka's controller carries it out: per filter, INVALID_REQUEST for one it
    refuses, else the ACLs it matched, deleted; an ACL two filters match is reported by the
    first only. Returns the new table (the same tuple when nothing was deleted)."""
    gone: set[AclBinding] = set()
    results: list[DeletionResult] = []
    for f in filters:
        try:
            check_filter(f)
        except RaylogError as exc:
            results.append(DeletionResult(exc.error_code, str(exc), ()))
            continue
        matched = tuple(acl for acl in table if acl not in gone and f.matches(acl))
        gone.update(matched)
        results.append(DeletionResult(0, "", matched))
    if not gone:
        return table, results
    return tuple(acl for acl in table if acl not in gone), results


def parse_super_users(value: str) -> frozenset[str]:
    """Kafka's ``super.users``: principals separated by semicolons (raises
    InvalidRequestError for one that is not ``Type:name``)."""
    users = [u.strip() for u in value.split(";") if u.strip()]
    for user in users:
        check_principal(user)
    return frozenset(users)


class Authorizer:
    """Kafka's StandardAuthorizer over a fixed ACL set (see the module docstring). Build a new
    one when the ACLs change; lookups are indexed by resource type and name, and by the
    lengths of the PREFIXED patterns of each type."""

    def __init__(
        self,
        acls: Iterable[AclBinding],
        super_users: Iterable[str] = (),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._literal: dict[tuple[int, str], list[AclBinding]] = {}
        self._prefixed: dict[tuple[int, str], list[AclBinding]] = {}
        lengths: dict[int, set[int]] = {}
        self._by_type: dict[int, list[AclBinding]] = {}
        for acl in acls:
            key = (acl.resource_type, acl.resource_name)
            if acl.pattern_type == PatternType.PREFIXED:
                self._prefixed.setdefault(key, []).append(acl)
                lengths.setdefault(acl.resource_type, set()).add(len(acl.resource_name))
            else:
                self._literal.setdefault(key, []).append(acl)
            self._by_type.setdefault(acl.resource_type, []).append(acl)
        self._prefix_lengths = {t: sorted(n) for t, n in lengths.items()}

    def _resource_acls(self, resource_type: int, name: str) -> Iterable[AclBinding]:
        """Every ACL whose pattern applies to the resource, whoever it is for."""
        yield from self._literal.get((resource_type, name), ())
        if name != WILDCARD:
            yield from self._literal.get((resource_type, WILDCARD), ())
        for n in self._prefix_lengths.get(resource_type, ()):
            if n > len(name):
                break
            yield from self._prefixed.get((resource_type, name[:n]), ())

    def authorize(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        """Whether ``principal`` from ``host`` may do ``operation`` on the resource."""
        if principal in self.super_users:
            return True
        found = allowed = False
        for acl in self._resource_acls(resource_type, name):
            found = True
            if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
                continue
            if acl.host != host and acl.host != WILDCARD:
                continue
            if acl.permission_type == AclPermissionType.DENY:
                if acl.operation in (AclOperation.ALL, operation):
                    return False
            elif acl.operation == AclOperation.ALL or acl.operation in _IMPLIED_BY.get(
                operation, (operation,)
            ):
                allowed = True
        return allowed or (not found and self.allow_everyone_if_no_acl_found)

    def authorize_by_resource_type(
        self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        """Whether ``principal`` may do ``operation`` on some resource of the type (Kafka's
        Authorizer.authorizeByResourceType, KIP-679): an ALLOW of the operation (or ALL) on a
        pattern no DENY covers (a LITERAL ``*`` DENY covers all, a PREFIXED one every name it
        prefixes, a LITERAL one its name). Implied operations do not count, as in Kafka."""
        # Kafka asks authorize() about a made-up name first: super users, and everyone when no
        # ACL names it and allow.everyone.if.no.acl.found is set.
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allows: list[AclBinding] = []
        wildcard_allow = False
        for acl in self._by_type.get(resource_type, ()):
            if acl.host != host and acl.host != WILDCARD:
                continue
            if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
                continue
            if acl.operation not in (operation, AclOperation.ALL):
                continue
            literal = acl.pattern_type == PatternType.LITERAL
            if acl.permission_type == AclPermissionType.DENY:
                if literal and acl.resource_name == WILDCARD:
                    return False
                (deny_literal if literal else deny_prefixed).add(acl.resource_name)
            elif literal and acl.resource_name == WILDCARD:
                wildcard_allow = True  # a wildcard DENY later in the set still wins
            else:
                allows.append(acl)
        if wildcard_allow:
            return True
        for acl in allows:
            name = acl.resource_name
            if acl.pattern_type == PatternType.LITERAL and name in deny_literal:
                continue
            if not any(name[:n] in deny_prefixed for n in range(1, len(name) + 1)):
                return True
        return False
