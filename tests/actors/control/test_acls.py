"""Kafka's ACL model and StandardAuthorizer (``actors/control/acls.py``), and ACLs in the metadata.

Proves, table-driven against Kafka's StandardAuthorizer semantics: a DENY beats any ALLOW (also
through ALL, wildcards and prefixes); LITERAL names, the LITERAL ``*`` wildcard and PREFIXED
patterns; the ``User:*`` principal and ``*`` host wildcards; the implied operations (ALL; READ,
WRITE, DELETE, ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS; for ALLOW only: a
DENY of READ does not deny DESCRIBE); super users; the no-ACL default, which any ACL on the
resource (of any principal) turns off; authorize_by_resource_type (KIP-679) with its dominant
DENY rules. CreateAcls refuses with INVALID_REQUEST (42) and Kafka's message each ANY/MATCH/
UNKNOWN code, an empty name, a CLUSTER not named kafka-cluster, a principal without its type,
an unsupported resource type, creates the others and is idempotent; filters match as Kafka's
(ANY exact names, MATCH the patterns that apply, null fields everything); DeleteAcls answers per
filter, reports an ACL two filters match once, refuses UNKNOWN filters; the metadata keeps ACLs
sorted and distinct, skips the write when nothing changed, decodes documents without the field
and round-trips JSON and msgpack; super.users parses Kafka's format.
"""

from __future__ import annotations

import msgspec
import pytest

from raylog.actors.control import acls
from raylog.actors.control import metadata as m
from raylog.actors.control.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    Authorizer,
    PatternType,
    ResourceType,
)
from raylog.storage.errors import InvalidRequestError

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
Op = AclOperation
ALICE, BOB = "User:alice", "User:bob"
HOST, OTHER_HOST = "10.0.0.1", "10.0.0.2"


def acl(
    name: str,
    op: AclOperation,
    permission: AclPermissionType = ALLOW,
    principal: str = ALICE,
    host: str = "*",
    pattern: PatternType = LIT,
    resource_type: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(
        resource_type=resource_type,
        resource_name=name,
        pattern_type=pattern,
        principal=principal,
        host=host,
        operation=op,
        permission_type=permission,
    )


# (case, ACLs, principal, host, operation, topic, allowed)
CASES = [
    ("no ACLs: denied by default", [], ALICE, HOST, Op.READ, "t", False),
    ("literal allow", [acl("t", Op.READ)], ALICE, HOST, Op.READ, "t", True),
    ("literal allow names another topic", [acl("u", Op.READ)], ALICE, HOST, Op.READ, "t", False),
    ("other principal's ACL", [acl("t", Op.READ, principal=BOB)], ALICE, HOST, Op.READ, "t", False),
    ("other operation", [acl("t", Op.WRITE)], ALICE, HOST, Op.READ, "t", False),
    ("deny beats allow", [acl("t", Op.READ), acl("t", Op.READ, DENY)], ALICE, HOST, Op.READ, "t",
     False),
    ("deny ALL beats allow", [acl("t", Op.READ), acl("t", Op.ALL, DENY)], ALICE, HOST, Op.READ,
     "t", False),
    ("wildcard deny beats literal allow",
     [acl("t", Op.READ), acl("*", Op.READ, DENY)], ALICE, HOST, Op.READ, "t", False),
    ("prefixed deny beats literal allow",
     [acl("t", Op.READ), acl("t", Op.READ, DENY, pattern=PRE)], ALICE, HOST, Op.READ, "t", False),
    ("User:* deny beats allow",
     [acl("t", Op.READ), acl("t", Op.READ, DENY, "User:*")], ALICE, HOST, Op.READ, "t", False),
    ("deny of another host", [acl("t", Op.READ), acl("t", Op.READ, DENY, host=OTHER_HOST)],
     ALICE, HOST, Op.READ, "t", True),
    ("wildcard name", [acl("*", Op.READ)], ALICE, HOST, Op.READ, "anything", True),
    ("prefixed", [acl("orders-", Op.READ, pattern=PRE)], ALICE, HOST, Op.READ, "orders-eu", True),
    ("prefixed equal to the name", [acl("orders", Op.READ, pattern=PRE)], ALICE, HOST, Op.READ,
     "orders", True),
    ("prefix longer than the name", [acl("orders-", Op.READ, pattern=PRE)], ALICE, HOST, Op.READ,
     "orders", False),
    ("literal is not a prefix", [acl("orders", Op.READ)], ALICE, HOST, Op.READ, "orders-eu", False),
    ("User:* principal", [acl("t", Op.READ, principal="User:*")], BOB, HOST, Op.READ, "t", True),
    ("host literal", [acl("t", Op.READ, host=HOST)], ALICE, HOST, Op.READ, "t", True),
    ("host other", [acl("t", Op.READ, host=OTHER_HOST)], ALICE, HOST, Op.READ, "t", False),
    ("ALL implies READ", [acl("t", Op.ALL)], ALICE, HOST, Op.READ, "t", True),
    ("ALL implies ALTER_CONFIGS", [acl("t", Op.ALL)], ALICE, HOST, Op.ALTER_CONFIGS, "t", True),
    ("READ implies DESCRIBE", [acl("t", Op.READ)], ALICE, HOST, Op.DESCRIBE, "t", True),
    ("WRITE implies DESCRIBE", [acl("t", Op.WRITE)], ALICE, HOST, Op.DESCRIBE, "t", True),
    ("DELETE implies DESCRIBE", [acl("t", Op.DELETE)], ALICE, HOST, Op.DESCRIBE, "t", True),
    ("ALTER implies DESCRIBE", [acl("t", Op.ALTER)], ALICE, HOST, Op.DESCRIBE, "t", True),
    ("CREATE does not imply DESCRIBE", [acl("t", Op.CREATE)], ALICE, HOST, Op.DESCRIBE, "t",
     False),
    ("DESCRIBE does not imply READ", [acl("t", Op.DESCRIBE)], ALICE, HOST, Op.READ, "t", False),
    ("ALTER_CONFIGS implies DESCRIBE_CONFIGS", [acl("t", Op.ALTER_CONFIGS)], ALICE, HOST,
     Op.DESCRIBE_CONFIGS, "t", True),
    ("ALTER does not imply ALTER_CONFIGS", [acl("t", Op.ALTER)], ALICE, HOST, Op.ALTER_CONFIGS,
     "t", False),
    ("a DENY of READ does not deny DESCRIBE", [acl("t", Op.READ), acl("t", Op.READ, DENY)],
     ALICE, HOST, Op.DESCRIBE, "t", True),
    ("a DENY of READ leaves WRITE", [acl("t", Op.WRITE), acl("t", Op.READ, DENY)], ALICE, HOST,
     Op.WRITE, "t", True),
    ("group ACLs do not apply to topics", [acl("t", Op.READ, resource_type=GROUP)], ALICE, HOST,
     Op.READ, "t", False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("bindings", "principal", "host", "operation", "name", "allowed"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_standard_authorizer_semantics(
    bindings: list[AclBinding],
    principal: str,
    host: str,
    operation: AclOperation,
    name: str,
    allowed: bool,
) -> None:
    authorizer = Authorizer(bindings)
    assert authorizer.authorize(principal, host, operation, TOPIC, name) is allowed


def test_super_users_are_allowed_everything_even_when_denied() -> None:
    authorizer = Authorizer([acl("*", Op.ALL, DENY, "User:*")], super_users={"User:admin"})
    assert authorizer.authorize("User:admin", HOST, Op.DELETE, TOPIC, "t")
    assert authorizer.authorize("User:admin", HOST, Op.ALTER, CLUSTER, acls.CLUSTER_NAME)
    assert not authorizer.authorize(ALICE, HOST, Op.READ, TOPIC, "t")


def test_allow_everyone_if_no_acl_found_holds_only_where_no_acl_names_the_resource() -> None:
    bindings = [acl("named", Op.READ, principal=BOB), acl("pre-", Op.WRITE, pattern=PRE)]
    open_ = Authorizer(bindings, allow_everyone_if_no_acl_found=True)
    assert open_.authorize(ALICE, HOST, Op.READ, TOPIC, "unnamed")
    assert not open_.authorize(ALICE, HOST, Op.READ, TOPIC, "named")  # bob's ACL names it
    assert not open_.authorize(ALICE, HOST, Op.READ, TOPIC, "pre-x")  # so does a prefix
    assert open_.authorize(ALICE, HOST, Op.READ, GROUP, "named")  # another resource type
    closed = Authorizer(bindings)
    assert not closed.authorize(ALICE, HOST, Op.READ, TOPIC, "unnamed")


# (case, ACLs, allowed): may alice WRITE some topic?
BY_TYPE = [
    ("nothing", [], False),
    ("a literal allow", [acl("t", Op.WRITE)], True),
    ("ALL counts", [acl("t", Op.ALL)], True),
    ("implied operations do not count", [acl("t", Op.DESCRIBE)], False),
    ("the literal denied", [acl("t", Op.WRITE), acl("t", Op.WRITE, DENY)], False),
    ("a prefix of it denied", [acl("orders", Op.WRITE), acl("ord", Op.WRITE, DENY, pattern=PRE)],
     False),
    ("a longer prefix denied", [acl("ord", Op.WRITE, pattern=PRE),
                                acl("orders", Op.WRITE, DENY, pattern=PRE)], True),
    ("wildcard deny", [acl("t", Op.WRITE), acl("*", Op.WRITE, DENY)], False),
    ("wildcard allow then wildcard deny", [acl("*", Op.WRITE), acl("*", Op.WRITE, DENY)], False),
    ("another principal's allow", [acl("t", Op.WRITE, principal=BOB)], False),
    ("User:* allow", [acl("t", Op.WRITE, principal="User:*")], True),
    ("another host", [acl("t", Op.WRITE, host=OTHER_HOST)], False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("bindings", "allowed"), [c[1:] for c in BY_TYPE], ids=[c[0] for c in BY_TYPE]
)
def test_authorize_by_resource_type(bindings: list[AclBinding], allowed: bool) -> None:
    authorizer = Authorizer(bindings)
    assert authorizer.authorize_by_resource_type(ALICE, HOST, Op.WRITE, TOPIC) is allowed


def test_authorize_by_resource_type_for_super_users_and_the_no_acl_default() -> None:
    assert Authorizer([], {ALICE}).authorize_by_resource_type(ALICE, HOST, Op.WRITE, TOPIC)
    everyone = Authorizer([], allow_everyone_if_no_acl_found=True)
    assert everyone.authorize_by_resource_type(ALICE, HOST, Op.WRITE, TOPIC)


def create(*bindings: AclBinding, table: tuple[AclBinding, ...] = ()) -> list[tuple[int, str]]:
    return acls.create_acls(table, list(bindings))[1]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"resource_type": ResourceType.ANY}, "Invalid resourceType ANY"),
        ({"resource_type": ResourceType.UNKNOWN}, "Invalid resourceType UNKNOWN"),
        ({"resource_type": ResourceType.USER}, "Invalid resourceType USER"),
        ({"pattern_type": PatternType.MATCH}, "Invalid patternType MATCH"),
        ({"pattern_type": PatternType.ANY}, "Invalid patternType ANY"),
        ({"operation": Op.ANY}, "Invalid operation ANY"),
        ({"permission_type": AclPermissionType.ANY}, "Invalid permissionType ANY"),
        ({"resource_name": ""}, "Resource name should not be empty"),
        ({"resource_type": CLUSTER}, "The only valid name for the CLUSTER resource"),
        ({"principal": "alice"}, "no colon is present"),
        ({"principal": "User:"}, "Could not parse principal"),
        ({"host": ""}, "Host should not be empty"),
    ],
)
def test_create_refuses_what_kafka_refuses(changes: dict[str, object], message: str) -> None:
    bad = msgspec.structs.replace(acl("t", Op.READ), **changes)
    good = acl("t", Op.READ)
    table, results = acls.create_acls((), [bad, good])
    assert results[0][0] == InvalidRequestError.error_code and message in results[0][1]
    assert results[1] == (0, "")
    assert table == (good,)


def test_unknown_wire_codes_become_unknown_and_are_refused() -> None:
    made = acls.binding(99, "t", 99, ALICE, "*", 99, 99)
    assert made.resource_type == ResourceType.UNKNOWN
    assert made.pattern_type == PatternType.UNKNOWN
    assert create(made)[0][0] == InvalidRequestError.error_code
    unknown_filter = acls.binding_filter(2, None, 1, None, None, 99, 1)
    with pytest.raises(InvalidRequestError, match="UNKNOWN"):
        acls.describe_acls((), unknown_filter)


def test_create_is_idempotent_and_keeps_the_table_sorted() -> None:
    a, b = acl("b", Op.READ), acl("a", Op.WRITE)
    table, results = acls.create_acls((), [a, b, a])
    assert results == [(0, "")] * 3 and table == (b, a)
    again, results = acls.create_acls(table, [a])
    assert again is table and results == [(0, "")]


def test_filters_match_as_kafkas() -> None:
    literal, wildcard = acl("orders", Op.READ), acl("*", Op.WRITE, principal=BOB)
    prefixed = acl("ord", Op.DESCRIBE, DENY, host=HOST, pattern=PRE)
    group = acl("orders", Op.READ, resource_type=GROUP)
    table = (literal, wildcard, prefixed, group)

    def found(**fields: object) -> set[AclBinding]:
        return set(acls.describe_acls(table, AclBindingFilter(**fields)))  # type: ignore[arg-type]

    assert found() == set(table)
    assert found(resource_type=TOPIC) == {literal, wildcard, prefixed}
    assert found(resource_type=TOPIC, resource_name="orders") == {literal}  # ANY: exact
    assert found(resource_name="ord", pattern_type=PRE) == {prefixed}
    assert found(resource_name="ord", pattern_type=LIT) == set()
    matched = found(resource_type=TOPIC, resource_name="orders", pattern_type=PatternType.MATCH)
    assert matched == {literal, wildcard, prefixed}
    assert found(principal=BOB) == {wildcard}
    assert found(host=HOST) == {prefixed}
    assert found(operation=Op.READ) == {literal, group}
    assert found(permission_type=DENY) == {prefixed}


def test_delete_answers_per_filter_and_reports_an_acl_once() -> None:
    a, b, c = acl("a", Op.READ), acl("b", Op.READ), acl("c", Op.WRITE)
    table = tuple(sorted((a, b, c)))
    filters = [
        AclBindingFilter(operation=Op.READ),
        AclBindingFilter(resource_name="a"),
        AclBindingFilter(operation=Op.UNKNOWN),
        AclBindingFilter(resource_name="nothing"),
    ]
    left, results = acls.delete_acls(table, filters)
    assert left == (c,)
    assert [r.deleted for r in results] == [(a, b), (), (), ()]
    assert results[2].error_code == InvalidRequestError.error_code
    assert [r.error_code for r in results] == [0, 0, 42, 0]
    same, _ = acls.delete_acls(left, [AclBindingFilter(resource_name="nothing")])
    assert same is left


def test_the_number_of_acls_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acls, "ACLS_MAX", 2)
    table, results = acls.create_acls((), [acl(n, Op.READ) for n in "abc"])
    assert len(table) == 2 and results[2][0] == InvalidRequestError.error_code


def test_metadata_keeps_acls_and_old_documents_decode() -> None:
    md = m.ClusterMetadata(cluster_id="c")
    out, results = m.create_acls(md, [acl("t", Op.READ), acl("g", Op.READ, resource_type=GROUP)])
    assert results == [(0, ""), (0, "")] and out.metadata_epoch == md.metadata_epoch + 1
    m.check(out)
    assert m.decode_json(m.encode_json(out)) == out
    assert m.decode_msgpack(m.encode_msgpack(out)) == out
    same, _ = m.create_acls(out, [acl("t", Op.READ)])
    assert same is out  # nothing new: no write
    gone, deleted = m.delete_acls(out, [AclBindingFilter(resource_type=GROUP)])
    assert [len(r.deleted) for r in deleted] == [1] and len(gone.acls) == 1
    old = msgspec.json.encode({"cluster_id": "c", "metadata_epoch": 4})
    assert m.decode_json(old).acls == ()
    unsorted = msgspec.structs.replace(out, acls=tuple(reversed(out.acls)))
    with pytest.raises(AssertionError, match="ACLs"):
        m.check(unsorted)


def test_super_users_parse_kafkas_format() -> None:
    assert acls.parse_super_users(" User:admin ; User:ops;") == {"User:admin", "User:ops"}
    assert acls.parse_super_users("") == frozenset()
    with pytest.raises(InvalidRequestError, match="no colon"):
        acls.parse_super_users("User:admin;ops")
