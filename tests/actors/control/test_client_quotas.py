"""actors/control/client_quotas.py: AlterClientQuotas' checks and Kafka's error codes per entry,
set / remove / validate-only, DescribeClientQuotas' filters (exact, default, any; strict), and
that metadata documents without client quotas still decode."""

from __future__ import annotations

import msgspec
import pytest

from raylog.actors.control import client_quotas as cq
from raylog.actors.control import metadata as md_

INVALID, UNSUPPORTED = 42, 35
U, C = cq.USER, cq.CLIENT_ID


def alter(md, *entries, validate_only=False):
    return cq.alter_client_quotas(
        md, [cq.ClientQuotaEntry(e, ops) for e, ops in entries], validate_only
    )


def setting(key, value):
    return [(key, value, False)]


@pytest.mark.parametrize(
    ("entity", "ops", "code", "message"),
    [
        ([], setting("producer_byte_rate", 1), INVALID, "Invalid empty client quota entity"),
        ([(U, "a"), (U, "b")], setting("producer_byte_rate", 1), INVALID, "duplicate entity"),
        ([("ip", "1.2.3.4")], setting("producer_byte_rate", 1), UNSUPPORTED, "entity type: ip"),
        ([(U, "")], setting("producer_byte_rate", 1), INVALID, "Empty user not supported"),
        ([(C, "<default>")], setting("producer_byte_rate", 1), INVALID, "default client-id"),
        ([(U, "a")], setting("bogus", 1), INVALID, "Invalid configuration key bogus"),
        ([(U, "a")], [("bogus", 0, True)], INVALID, "Invalid configuration key bogus"),
        ([(U, "a")], setting("controller_mutation_rate", 1), INVALID, "Invalid configuration"),
        ([(U, "a")], setting("producer_byte_rate", -5), INVALID, "must be greater than 0"),
        ([(U, "a")], setting("consumer_byte_rate", 0), INVALID, "must be greater than 0"),
        ([(U, "a")], setting("request_percentage", float("nan")), INVALID, "greater than 0"),
        ([(U, "a")], setting("producer_byte_rate", 1.5), INVALID, "cannot be a fractional"),
        ([(U, "a")], setting("producer_byte_rate", 1e19), INVALID, "too large for a LONG"),
    ],
)
def test_bad_entries_get_kafkas_errors(entity, ops, code, message) -> None:
    md = md_.ClusterMetadata(cluster_id="t")
    out, results = alter(md, (entity, ops), ([(U, "ok")], setting("producer_byte_rate", 10)))
    assert results[0].error_code == code and message in results[0].message
    assert results[1].error_code == 0  # the valid entry is applied
    assert [(r.user, r.client_id, r.values) for r in out.client_quotas] == [
        ("ok", None, {"producer_byte_rate": 10.0})
    ]


def test_set_remove_and_validate_only() -> None:
    md = md_.ClusterMetadata(cluster_id="t")
    same, results = alter(
        md, ([(U, "alice")], setting("producer_byte_rate", 1024)), validate_only=True
    )
    assert same is md and results[0].error_code == 0
    md, _ = alter(
        md,
        ([(U, "alice"), (C, None)], setting("request_percentage", 12.5)),
        ([(C, "app")], setting("consumer_byte_rate", 2048)),
        ([(U, None)], setting("producer_byte_rate", 1024)),
    )
    assert md.metadata_epoch == 1
    assert [(r.user, r.client_id) for r in md.client_quotas] == [
        (None, "app"),
        ("<default>", None),
        ("alice", "<default>"),
    ]
    # Removing what is not set changes nothing; removing the last value removes the entity.
    same, results = alter(md, ([(C, "app")], [("producer_byte_rate", 0, True)]))
    assert same is md and results[0].error_code == 0
    md, _ = alter(md, ([(C, "app")], [("consumer_byte_rate", 0, True)]))
    assert [(r.user, r.client_id) for r in md.client_quotas] == [
        ("<default>", None),
        ("alice", "<default>"),
    ]
    assert cq.entity_of(md.client_quotas[1]) == [(U, "alice"), (C, None)]


def test_documents_without_client_quotas_decode() -> None:
    md = md_.ClusterMetadata(cluster_id="t")
    raw = msgspec.json.decode(msgspec.json.encode(md))
    del raw["client_quotas"]
    assert msgspec.json.decode(msgspec.json.encode(raw), type=md_.ClusterMetadata) == md
    md, _ = alter(md, ([(U, "a"), (C, "b")], setting("producer_byte_rate", 5)))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(md), type=md_.ClusterMetadata) == md


def _table() -> md_.ClusterMetadata:
    md, _ = alter(
        md_.ClusterMetadata(cluster_id="t"),
        ([(U, "alice")], setting("producer_byte_rate", 1)),
        ([(U, "alice"), (C, "app")], setting("producer_byte_rate", 2)),
        ([(U, None)], setting("producer_byte_rate", 3)),
        ([(C, "app")], setting("producer_byte_rate", 4)),
        ([(C, None)], setting("producer_byte_rate", 5)),
    )
    return md


EXACT, DEFAULT, ANY = cq.MATCH_EXACT, cq.MATCH_DEFAULT, cq.MATCH_SPECIFIED


@pytest.mark.parametrize(
    ("components", "strict", "values"),
    [
        ([], False, [1, 2, 3, 4, 5]),
        ([], True, []),
        ([(U, EXACT, "alice")], False, [1, 2]),
        ([(U, EXACT, "alice")], True, [1]),
        ([(U, DEFAULT, None)], False, [3]),
        ([(U, ANY, None)], False, [1, 2]),  # any name: not the default
        ([(C, EXACT, "app")], True, [4]),
        ([(C, EXACT, "app")], False, [2, 4]),
        ([(U, EXACT, "alice"), (C, ANY, None)], True, [2]),
        ([(C, DEFAULT, None)], True, [5]),
        ([(U, EXACT, "bob")], False, []),
    ],
)
def test_describe_filters(components, strict, values) -> None:
    found = cq.describe_client_quotas(_table(), components, strict)
    assert found.error_code == 0
    assert sorted(v["producer_byte_rate"] for _, v in found.entries) == values


@pytest.mark.parametrize(
    ("components", "code", "message"),
    [
        ([("", EXACT, "x")], INVALID, "Invalid empty entity type."),
        ([(U, EXACT, "a"), (U, ANY, None)], INVALID, "cannot appear more than once"),
        ([("ip", ANY, None)], UNSUPPORTED, "Unsupported entity type ip"),
        ([(U, EXACT, None)], INVALID, "MATCH_TYPE_EXACT, but set match string to null"),
        ([(U, DEFAULT, "a")], INVALID, "MATCH_TYPE_DEFAULT, but also specified a match"),
        ([(U, ANY, "a")], INVALID, "MATCH_TYPE_SPECIFIED, but also specified a match"),
        ([(U, 7, None)], UNSUPPORTED, "Unknown match type 7"),
    ],
)
def test_describe_errors(components, code, message) -> None:
    found = cq.describe_client_quotas(_table(), components, False)
    assert (found.error_code, found.entries) == (code, [])
    assert message in found.message
