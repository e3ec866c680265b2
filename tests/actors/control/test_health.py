"""Cluster health and the metrics counters read the metadata as Kafka's operators do.

Proves: a partition is under-replicated when its ISR is smaller than its voting replicas
(observers excluded), under min ISR only while online, offline without a leader; a fenced
broker's partitions show up in all three as the election moves on; brokers read alive, fenced
or shutdown; transitions() counts ISR shrinks, expands and leader elections between two
versions and nothing for a new topic; follower lag is measured against the one leader; the
gateway's request stats build cumulative Prometheus buckets; a failed log counts as an offline
replica and `topics describe` prints it.
"""

from __future__ import annotations

import msgspec

from raylog.actors.control import election as e
from raylog.actors.control import health
from raylog.actors.control import metadata as m
from raylog.actors.control.metadata import ClusterMetadata
from raylog.gateway.request_stats import LATENCY_BUCKETS_S, RequestStats


def cluster(n: int = 3) -> ClusterMetadata:
    md = ClusterMetadata(cluster_id="c1")
    for b in range(1, n + 1):
        md = m.register_broker(md, b, f"inc{b}", "abc"[b - 1], "127.0.0.1", 9091 + b)
    return md


def with_topic(md: ClusterMetadata, configs: dict[str, str] | None = None) -> ClusterMetadata:
    return m.create_topic(md, "t", "id-t", [[1, 2, 3], [2, 3, 1]], configs or {})


def test_healthy_cluster_has_nothing_to_report() -> None:
    md = with_topic(cluster())
    rows = health.partition_health(md)
    assert [(r.topic, r.partition, r.leader) for r in rows] == [("t", 0, 1), ("t", 1, 2)]
    assert health.cluster_health(rows) == health.ClusterHealth(
        partitions=2, offline_partitions=0, under_replicated_partitions=0,
        under_min_isr_partitions=0,
    )  # fmt: skip
    assert [r.state for r in health.broker_rows(md)] == ["alive"] * 3
    assert [r.leader_partitions for r in health.broker_rows(md)] == [1, 1, 0]


def test_fenced_brokers_shrink_isrs_then_take_partitions_offline() -> None:
    md = with_topic(cluster(), {"min.insync.replicas": "2"})
    one_down = e.fence_broker(md, 1, {}).metadata
    h = health.cluster_health(health.partition_health(one_down))
    assert (h.under_replicated_partitions, h.under_min_isr_partitions, h.offline_partitions) == (
        2, 0, 0,
    )  # fmt: skip
    assert health.partition_health(one_down)[0].leader == 2
    rows = health.broker_rows(one_down, stopped={3})
    assert [(r.broker_id, r.state) for r in rows] == [(1, "fenced"), (2, "alive"), (3, "shutdown")]

    two_down = e.fence_broker(one_down, 2, {}).metadata
    h = health.cluster_health(health.partition_health(two_down))
    assert (h.under_replicated_partitions, h.under_min_isr_partitions, h.offline_partitions) == (
        2, 2, 0,
    )  # fmt: skip
    all_down = e.fence_broker(two_down, 3, {}).metadata
    h = health.cluster_health(health.partition_health(all_down))
    # Offline partitions keep their last ISR member and are not counted under min ISR.
    assert (h.offline_partitions, h.under_min_isr_partitions) == (2, 0)


def test_transitions_count_shrinks_expands_and_elections() -> None:
    md = with_topic(cluster())
    assert health.transitions(cluster(), md) == health.Transitions()  # a new topic: nothing
    fenced = e.fence_broker(md, 1, {}).metadata
    t = health.transitions(md, fenced)
    # Partition 0 loses its leader 1 (shrink + election), partition 1 loses follower 1 (shrink).
    assert (t.isr_shrinks, t.isr_expands, t.leader_elections) == (2, 0, 1)
    back = msgspec.structs.replace(
        fenced,
        topics={
            "t": msgspec.structs.replace(
                fenced.topics["t"],
                partitions=tuple(
                    msgspec.structs.replace(p, isr=(*p.isr, 1))
                    for p in fenced.topics["t"].partitions
                ),
            )
        },
    )
    t = health.transitions(fenced, back)
    assert (t.isr_shrinks, t.isr_expands, t.leader_elections) == (0, 2, 0)


class _State(msgspec.Struct, frozen=True):
    topic: str
    partition: int
    replica_id: int
    role: str
    leader_id: int
    log_end_offset: int


def test_follower_lag_is_measured_against_the_one_leader() -> None:
    states = [
        _State("t", 0, 1, "leader", 1, 10),
        _State("t", 0, 2, "follower", 1, 7),
        _State("t", 0, 3, "follower", 1, 12),  # ahead of a new leader: no negative lag
        _State("t", 1, 2, "follower", 1, 3),  # its leader did not answer: no entry
    ]
    assert health.follower_lags(states) == {("t", 0, 2): 3, ("t", 0, 3): 0}


def test_request_stats_buckets_are_cumulative() -> None:
    stats = RequestStats()
    stats.received(100)
    stats.answered(0, 0.0004, 50)
    stats.answered(0, 0.003, 60)
    stats.answered(0, 99.0, 0)
    snap = stats.snapshot()
    assert (snap["bytes_in"], snap["bytes_out"]) == (100, 110)
    produce = snap["requests"][0]
    assert produce["count"] == 3
    buckets = dict(produce["buckets"])
    assert len(buckets) == len(LATENCY_BUCKETS_S) + 1
    assert (buckets["0.0005"], buckets["0.0025"], buckets["0.005"], buckets["+Inf"]) == (1, 1, 2, 3)


def test_a_failed_log_is_counted_and_described() -> None:
    from raylog.actors.cli import topics

    md = e.set_offline_replicas(with_topic(cluster()), 3, {m.TopicPartition("t", 0)}).metadata
    rows = health.partition_health(md)
    assert [r.offline_replicas for r in rows] == [(3,), ()]
    h = health.cluster_health(rows)
    assert (h.offline_replicas, h.under_replicated_partitions, h.offline_partitions) == (1, 1, 0)
    lines = [topics.partition_line(r) for r in rows]
    assert lines[0].endswith("\tIsr: 1,2\tLeaderEpoch: 0\tOffline: 3"), lines[0]
    assert "Offline" not in lines[1] and lines[1].endswith("\tLeaderEpoch: 0"), lines[1]
