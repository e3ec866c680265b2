"""The decisions behind capacity requests to Ray's autoscaler: ``control/capacity.py`` (pure),
and how ``actors/autoscaler.py`` tells that an autoscaler runs."""

from __future__ import annotations

import json
import pickle

from raylog.actors import autoscaler
from raylog.actors.control import capacity
from raylog.storage.errors import (
    CapacityPendingError,
    InvalidReplicationFactorError,
    PolicyViolationError,
    TooFewBrokersPendingError,
    TooLittleMemoryPendingError,
    capacity_pending,
)


def test_too_few_brokers_asks_for_the_missing_ones() -> None:
    assert capacity.more_nodes(3, 3, [1000.0, 1000.0], 64) == 1
    assert capacity.more_nodes(5, 5, [1000.0], 64) == 4
    assert capacity.more_nodes(3, 3, [], 64) == 3
    assert capacity.more_nodes(3, 3, [1000.0, 1000.0, 1000.0], 64) == 0  # fits: none


def test_memory_asks_until_every_nodes_share_fits() -> None:
    # 30 replicas of 64 MiB over 3 brokers with 500 MiB free each: 10 each (640 MiB) does not
    # fit; over 4 brokers 8 each (512 MiB) still not; over 5, 6 each (384 MiB) does.
    assert capacity.more_nodes(30, 3, [500.0, 500.0, 500.0], 64) == 2
    # A new node is counted with as much free memory as the freest node, not more.
    assert capacity.more_nodes(30, 3, [500.0, 2000.0, 2000.0], 64) == 2
    # Unknown memory is not checked (as the memory check does).
    assert capacity.more_nodes(30, 3, [None, None, None], 64) == 0


def test_a_node_too_full_for_its_share_needs_no_nodes_but_a_rebalance() -> None:
    assert capacity.more_nodes(3, 1, [0.0, 5000.0], 64) is None
    assert capacity.more_nodes(10_000, 1, [100.0], 64, limit=8) is None


def test_the_request_grows_never_shrinks_and_clears_when_met_or_expired() -> None:
    first = capacity.renew(None, wanted=3, had=2, now_ms=0, timeout_ms=1000)
    assert first == capacity.CapacityRequest(nodes=3, expires_ms=1000, had=2)
    assert capacity.renew(first, wanted=2, had=2, now_ms=500, timeout_ms=1000).nodes == 3
    bigger = capacity.renew(first, wanted=5, had=2, now_ms=500, timeout_ms=1000)
    assert bigger.nodes == 5 and bigger.expires_ms == 1500
    assert capacity.request_done(bigger, active_brokers=4, now_ms=600) is None
    assert capacity.request_done(bigger, active_brokers=5, now_ms=600) == "met"
    assert capacity.request_done(bigger, active_brokers=4, now_ms=1500) == "expired"


def test_the_message_says_what_was_asked() -> None:
    request = capacity.CapacityRequest(nodes=3, expires_ms=61_000, had=2)
    text = capacity.pending_message("Replication factor 3 is larger", request, now_ms=1000)
    assert text.startswith("Replication factor 3 is larger; asked Ray's autoscaler for 1 more")
    assert text.endswith("3 in all, for 60 s more")


def test_free_memory_per_broker_shares_a_node_and_counts_its_replicas() -> None:
    node_of = {1: "n1", 2: "n1", 3: "n2"}
    memory = {"n1": 1000.0, "n2": 800.0}
    assignment = [(1, 3), (2, 3), (1,)]  # n1 holds 3 replicas, n2 two
    free = capacity.free_per_broker([1, 2, 3, 4], node_of, memory, assignment, 100)
    assert free == [350.0, 350.0, 600.0, None]


def test_the_pending_errors_keep_the_refusals_code_and_cross_processes() -> None:
    few = capacity_pending(InvalidReplicationFactorError("x"), "few; asked")
    little = capacity_pending(PolicyViolationError("y"), "little; asked")
    assert isinstance(few, TooFewBrokersPendingError) and few.error_code == 38
    assert isinstance(little, TooLittleMemoryPendingError) and little.error_code == 44
    for exc in (few, little):
        back = pickle.loads(pickle.dumps(exc))
        assert isinstance(back, CapacityPendingError) and str(back) == str(exc)
        assert back.error_code == exc.error_code


def _v1_status(types: list[str], written: float) -> bytes:
    report = {"active_nodes": {t: 1 for t in types}, "node_type_mapping": {}}
    return json.dumps({"time": written, "autoscaler_report": report}).encode()


def test_an_autoscaler_is_one_that_can_add_nodes() -> None:
    assert autoscaler.kind_from(b"1", None, 0.0) == "v2"
    named = _v1_status(["ray.head.default", "broker_a"], written=100.0)
    assert autoscaler.kind_from(b"0", named, now=110.0) == "v1"
    assert autoscaler.kind_from(b"0", named, now=100.0 + 61) is None  # its monitor is gone
    # `ray start` / ray.init() without an autoscaling config: Ray's read-only autoscaler.
    readonly = _v1_status(["node_" + "0a" * 28, "node_" + "1b" * 28], written=100.0)
    assert autoscaler.kind_from(b"0", readonly, now=110.0) is None
    assert autoscaler.kind_from(None, None, 0.0) is None
    assert autoscaler.kind_from(None, b"not json", 0.0) is None
    assert autoscaler.kind_from(None, b'{"time": 1, "autoscaler_report": []}', 2.0) is None
