"""The per-replica metric families of the Prometheus endpoint, from replica states (no Ray).

Proves: log size is reported for every replica; log compaction counters appear for replicas
that ran a pass, with their values, and not for others; leaders' offsets as before.
"""

from __future__ import annotations

from raylog.actors.metrics import ClusterCollector
from raylog.actors.replica import ReplicaState


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
