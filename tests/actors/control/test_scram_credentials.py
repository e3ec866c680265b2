"""SCRAM credentials in the cluster metadata (KIP-554), as Kafka's controller keeps them.

Proves: AlterUserScramCredentials' every validation branch answers per user with Kafka's code
(UNSUPPORTED_SASL_MECHANISM 33, UNACCEPTABLE_CREDENTIAL 93 for an empty or unusable name,
iterations out of [4096, 16384], an empty salt or a salted password of the wrong size,
DUPLICATE_RESOURCE 92 for a user named twice anywhere in a request, RESOURCE_NOT_FOUND 91 for
deleting what is not there) while the other users' changes apply; the stored keys are RFC
5802's of the salted password (the same the gateway's SASL exchange derives from the password);
an upsertion replaces the mechanism's credential only; a user whose last credential goes is
removed; a request that changes nothing keeps the document (no write). Describe answers
mechanisms and iterations only, RESOURCE_NOT_FOUND / DUPLICATE_RESOURCE per user. A document
without the field decodes (no users); bytes survive JSON and msgpack; the stored document holds
no password nor salted password; the record's repr hides the salt and keys.
"""

from __future__ import annotations

import msgspec
import pytest

from raylog.actors.control import metadata as m
from raylog.actors.control import scram
from raylog.actors.control.metadata import (
    ClusterMetadata,
    ScramDeletion,
    ScramUpsertion,
    ScramUserDescription,
)
from raylog.actors.control.scram import SCRAM_SHA_256, SCRAM_SHA_512
from raylog.gateway import sasl

SALT = b"s" * 32
PASSWORD = "correct horse battery staple"


def upsert(
    user: str, mechanism: str = SCRAM_SHA_256, iterations: int = 8192, salt: bytes = SALT
) -> ScramUpsertion:
    salted = scram.salted_password(mechanism, PASSWORD, salt, iterations)
    return ScramUpsertion(user, mechanism, iterations, salt, salted)


def alter(
    md: ClusterMetadata, *changes: ScramUpsertion | ScramDeletion
) -> tuple[ClusterMetadata, dict[str, tuple[int, str]]]:
    ups = [c for c in changes if isinstance(c, ScramUpsertion)]
    dels = [c for c in changes if isinstance(c, ScramDeletion)]
    out, results = m.alter_scram_credentials(md, ups, dels)
    m.check(out)
    return out, {user: (code, message) for user, code, message in results}


def with_alice_and_bob() -> ClusterMetadata:
    md, results = alter(
        ClusterMetadata(cluster_id="c"), upsert("alice"), upsert("bob", SCRAM_SHA_512)
    )
    assert results == {"alice": (0, ""), "bob": (0, "")}
    md, _ = alter(md, upsert("alice", SCRAM_SHA_512, 4096))
    return md


def test_upserted_keys_are_rfc_5802s_and_authenticate_with_the_password() -> None:
    md = with_alice_and_bob()
    assert md.metadata_epoch == 2
    alice = md.scram_credentials["alice"]
    assert [(r.mechanism, r.iterations) for r in alice] == [
        (SCRAM_SHA_256, 8192),
        (SCRAM_SHA_512, 4096),
    ]
    for record in alice:
        expected = sasl.scram_credential(record.mechanism, PASSWORD, SALT, record.iterations)
        assert (record.salt, record.stored_key, record.server_key) == (
            expected.salt,
            expected.stored_key,
            expected.server_key,
        )
        assert sasl.password_matches(record, PASSWORD)  # type: ignore[arg-type]
        assert not sasl.password_matches(record, PASSWORD + "!")  # type: ignore[arg-type]


def test_an_upsertion_replaces_only_its_mechanism() -> None:
    md = with_alice_and_bob()
    md2, results = alter(md, upsert("alice", SCRAM_SHA_256, 16384, b"t" * 16))
    assert results == {"alice": (0, "")}
    old_512 = md.scram_credentials["alice"][1]
    new_256, kept_512 = md2.scram_credentials["alice"]
    assert (new_256.iterations, new_256.salt) == (16384, b"t" * 16)
    assert kept_512 == old_512
    assert md2.scram_credentials["bob"] == md.scram_credentials["bob"]


def test_deleting_the_last_credential_removes_the_user() -> None:
    md = with_alice_and_bob()
    md, results = alter(
        md, ScramDeletion("alice", SCRAM_SHA_256), ScramDeletion("bob", SCRAM_SHA_512)
    )
    assert results == {"alice": (0, ""), "bob": (0, "")}
    assert [r.mechanism for r in md.scram_credentials["alice"]] == [SCRAM_SHA_512]
    assert "bob" not in md.scram_credentials
    md, _ = alter(md, ScramDeletion("alice", SCRAM_SHA_512))
    assert md.scram_credentials == {}


@pytest.mark.parametrize(
    ("change", "code", "says"),
    [
        (upsert("carol")._replace(mechanism="SCRAM-SHA-1"), 33, "Unknown SCRAM mechanism"),
        (upsert("carol")._replace(mechanism="PLAIN"), 33, "Unknown SCRAM mechanism"),
        (ScramDeletion("alice", "GSSAPI"), 33, "Unknown SCRAM mechanism"),
        (upsert(""), 93, "Username must not be empty"),
        (ScramDeletion("", SCRAM_SHA_256), 93, "Username must not be empty"),
        (upsert("a\nb"), 93, "control characters"),
        (upsert("x" * 256), 93, "at most 255"),
        (upsert("carol", iterations=4095), 93, "Too few iterations"),
        (upsert("carol", iterations=16385), 93, "Too many iterations"),
        (upsert("carol")._replace(salt=b""), 93, "Salt must not be empty"),
        (upsert("carol")._replace(salted_password=b"x" * 64), 93, "salted password is 32"),
        (ScramDeletion("carol", SCRAM_SHA_256), 91, "does not exist"),
        (ScramDeletion("bob", SCRAM_SHA_256), 91, "does not exist"),  # bob has 512 only
    ],
)
def test_a_refused_change_answers_its_code_and_leaves_the_others(
    change: ScramUpsertion | ScramDeletion, code: int, says: str
) -> None:
    md = with_alice_and_bob()
    out, results = alter(md, change, upsert("dave"))
    assert results[change.user][0] == code
    assert says in results[change.user][1]
    assert results["dave"] == (0, "")
    assert set(out.scram_credentials) == {"alice", "bob", "dave"}
    alone, _ = alter(md, change)
    assert alone is md  # nothing to write


@pytest.mark.parametrize(
    "changes",
    [
        (upsert("alice"), upsert("alice", SCRAM_SHA_512)),  # other mechanisms count too
        (ScramDeletion("alice", SCRAM_SHA_256), ScramDeletion("alice", SCRAM_SHA_512)),
        (ScramDeletion("alice", SCRAM_SHA_256), upsert("alice", SCRAM_SHA_512)),
        (upsert("alice"), upsert("alice"), upsert("alice")),
        (upsert("alice", iterations=1), upsert("alice")),  # the first refusal stands
    ],
)
def test_a_user_named_twice_is_a_duplicate_and_unchanged(
    changes: tuple[ScramUpsertion | ScramDeletion, ...],
) -> None:
    md = with_alice_and_bob()
    out, results = alter(md, *changes, upsert("bob"))
    first_refused = changes[0].user == "alice" and getattr(changes[0], "iterations", 0) == 1
    assert results["alice"][0] == (93 if first_refused else 92)
    if not first_refused:
        assert results["alice"][1] == m.CREDENTIAL_NAMED_TWICE
    assert results["bob"] == (0, "")
    assert out.scram_credentials["alice"] == md.scram_credentials["alice"]
    assert [r.mechanism for r in out.scram_credentials["bob"]] == [SCRAM_SHA_256, SCRAM_SHA_512]


def test_results_name_each_user_once_in_request_order() -> None:
    md = with_alice_and_bob()
    _, results = m.alter_scram_credentials(
        md,
        [upsert("zed"), upsert("alice", SCRAM_SHA_512)],
        [ScramDeletion("bob", SCRAM_SHA_512), ScramDeletion("alice", SCRAM_SHA_256)],
    )
    assert [(user, code) for user, code, _ in results] == [("bob", 0), ("alice", 92), ("zed", 0)]


def test_describe_answers_mechanisms_and_iterations_only() -> None:
    md = with_alice_and_bob()
    everyone = m.describe_scram_credentials(md, None)
    assert everyone == m.describe_scram_credentials(md, [])
    assert everyone == [
        ScramUserDescription("alice", 0, "", ((SCRAM_SHA_256, 8192), (SCRAM_SHA_512, 4096))),
        ScramUserDescription("bob", 0, "", ((SCRAM_SHA_512, 8192),)),
    ]
    asked = m.describe_scram_credentials(md, ["bob", "nobody", "alice", "alice"])
    assert [(d.user, d.error_code, d.credentials) for d in asked] == [
        ("bob", 0, ((SCRAM_SHA_512, 8192),)),
        ("nobody", 91, ()),
        ("alice", 92, ()),
    ]
    assert asked[1].message == m.NO_SUCH_USER + "nobody"
    assert asked[2].message == m.DESCRIBED_TWICE + "alice"
    assert m.describe_scram_credentials(ClusterMetadata(cluster_id="c"), None) == []


def test_a_document_without_the_field_decodes_with_no_users() -> None:
    old = msgspec.json.encode({"cluster_id": "c", "metadata_epoch": 4})
    assert m.decode_json(old).scram_credentials == {}
    assert m.decode_msgpack(msgspec.msgpack.encode({"cluster_id": "c"})).scram_credentials == {}


def test_credentials_round_trip_json_and_msgpack_and_hold_no_password() -> None:
    md = with_alice_and_bob()
    assert m.decode_json(m.encode_json(md)) == md
    assert m.decode_msgpack(m.encode_msgpack(md)) == md
    document = m.encode_json(md)
    for mechanism in (SCRAM_SHA_256, SCRAM_SHA_512):
        for iterations in (4096, 8192):
            salted = scram.salted_password(mechanism, PASSWORD, SALT, iterations)
            assert salted not in m.encode_msgpack(md)
            assert msgspec.json.encode(salted) not in document  # as base64
    assert PASSWORD.encode() not in document
    assert PASSWORD.encode() not in m.encode_msgpack(md)


def test_a_records_repr_hides_its_salt_and_keys() -> None:
    record = with_alice_and_bob().scram_credentials["bob"][0]
    text = repr(record) + repr(with_alice_and_bob())
    assert "hidden" in text
    for secret in (record.salt, record.stored_key, record.server_key):
        assert repr(secret) not in text


def test_check_refuses_a_malformed_credentials_table() -> None:
    record = with_alice_and_bob().scram_credentials["bob"][0]
    for table in (
        {"": (record,)},
        {"u": ()},
        {"u": (record, record)},
        {"u": (msgspec.structs.replace(record, mechanism="PLAIN"),)},
    ):
        with pytest.raises(AssertionError):
            m.check(ClusterMetadata(cluster_id="c", scram_credentials=table))
