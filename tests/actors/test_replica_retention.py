"""Retention driven by the ReplicaActor: every ``log.retention.check.interval.ms`` a replica
deletes whole segments past retention.bytes (only below the high watermark) and its log start
offset moves, as consumers see it through ListOffsets(earliest) and OFFSET_OUT_OF_RANGE.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
from support.waiting import wait_until

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeLeader
from raylog.storage import batch as rb
from raylog.storage.errors import OffsetOutOfRangeError

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 30.0
BATCHES = 40
VALUE = bytes(900)  # with the header each batch is ~1 KiB: segment.bytes 4096 holds ~4


def _earliest(replica: object) -> int:
    code, _, offset, _ = ray.get(replica.list_offsets.remote(-2), timeout=CALL_TIMEOUT_S)  # type: ignore[attr-defined]
    assert code == 0
    return offset


def test_replica_deletes_segments_past_retention_bytes(ray_local: Path, tmp_path: Path) -> None:
    topic = "retained"
    configs = {"segment.bytes": "4096", "retention.bytes": "8192"}
    replica = ReplicaActor.options(  # type: ignore[attr-defined]
        name=replica_actor_name(topic, 0, 0), namespace=NAMESPACE
    ).remote(topic, 0, 0, str(tmp_path / "r0"), configs, retention_check_interval_ms=50)
    try:
        ray.get(
            replica.become_leader.remote(
                BecomeLeader(
                    controller_epoch=1, leader_epoch=1, partition_epoch=1, isr=(0,), replicas=(0,)
                )
            ),
            timeout=CALL_TIMEOUT_S,
        )
        assert _earliest(replica) == 0
        for i in range(BATCHES):
            batch = rb.build_batch([rb.Record(key=b"%d" % i, value=VALUE, timestamp_ms=i)])
            outcome = ray.get(replica.produce.remote(batch, -1, 10_000), timeout=CALL_TIMEOUT_S)
            assert outcome.error_code == 0, outcome

        # ~10 segments of ~4 records; at most ~8 KiB beyond the active one may stay.
        wait_until(lambda: _earliest(replica) >= BATCHES - 16, timeout_s=CALL_TIMEOUT_S)
        below = ray.get(replica.fetch.remote(0, 1 << 20), timeout=CALL_TIMEOUT_S)
        assert below.error_code == OffsetOutOfRangeError.error_code

        def first_kept() -> tuple[int, Any] | None:
            # Retention may still be deleting (every 50 ms): read where the log starts now.
            start = _earliest(replica)
            kept = ray.get(replica.fetch.remote(start, 1 << 20), timeout=CALL_TIMEOUT_S)
            return (start, kept) if kept.error_code == 0 and kept.records else None

        start, kept = wait_until(first_kept, timeout_s=CALL_TIMEOUT_S)
        assert 0 < start < BATCHES
        assert len(list((tmp_path / "r0").glob("*.log"))) <= 4
        first = next(iter(rb.iter_batches(kept.records)))[1]
        assert first.base_offset == start
    finally:
        ray.kill(replica, no_restart=True)
