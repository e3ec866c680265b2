"""The per-replica metric families of the Prometheus endpoint, from replica states (no Ray).

Proves: log size is reported for every replica; log compaction counters appear for replicas
that ran a pass, with their values, and not for others; leaders' offsets as before; replicas
whose log failed are counted cluster-wide (OfflineReplicaCount).
"""

from __future__ import annotations

from raylog.actors.calls import ReplicaState
from raylog.actors.cluster.metrics import ClusterCollector


def _state(replica: int, role: str, **extra: float) -> ReplicaState:
    return ReplicaState(
        topic="t",
        partition=0,
        replica_id=replica,
        role=role,
        leader_id=1,
        leader_epoch=3,
        partition_epoch=4,
        isr=(1, 2),
        high_watermark=90,
        log_start_offset=0,
        log_end_offset=100 if role == "leader" else 95,
        durable_end_offset=100,
        offline=None,
        **extra,
    )


def test_log_size_and_cleaner_counters_per_replica() -> None:
    states = [
        _state(
            1,
            "leader",
            log_size_bytes=4096,
            cleaner_passes=2,
            cleaner_records_removed=70,
            cleaner_dirty_ratio=0.25,
        ),
        _state(2, "follower", log_size_bytes=8192),
    ]
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in ClusterCollector._partition_families(states)
        for s in family.samples
    }

    def at(name: str, replica: int) -> float | None:
        labels = (("partition", "0"), ("replica", str(replica)), ("topic", "t"))
        return samples.get((name, labels))

    assert at("raylog_log_size_bytes", 1) == 4096
    assert at("raylog_log_size_bytes", 2) == 8192
    assert at("raylog_log_cleaner_passes_total", 1) == 2
    assert at("raylog_log_cleaner_records_removed_total", 1) == 70
    assert at("raylog_log_cleaner_passes_total", 2) is None
    assert at("raylog_log_cleaner_dirty_ratio", 1) == 0.25
    assert at("raylog_log_cleaner_dirty_ratio", 2) is None
    assert samples[("raylog_log_end_offset", (("partition", "0"), ("topic", "t")))] == 100


def test_offline_replicas_are_counted_cluster_wide() -> None:
    from raylog.actors.control import election
    from raylog.actors.control import metadata as m

    md = m.ClusterMetadata(cluster_id="c")
    for b in (1, 2, 3):
        md = m.register_broker(md, b, f"i{b}", None, "127.0.0.1", 9090 + b)
    md = m.create_topic(md, "t", "id-t", [[1, 2, 3], [2, 3, 1]], {})
    md = election.set_offline_replicas(md, 1, {m.TopicPartition("t", 0)}).metadata
    md = election.set_offline_replicas(md, 3, {m.TopicPartition("t", 1)}).metadata
    values = {
        s.name: s.value
        for family in ClusterCollector._cluster_families(md, {"active": 1})
        for s in family.samples
    }
    assert values["raylog_offline_replica_count"] == 2
    assert values["raylog_offline_partitions_count"] == 0  # both still have a leader
