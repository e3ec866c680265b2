"""Tiered storage on `raylog up` (the session's shared cluster, its object store a directory in
the data dir), driven by confluent-kafka.

Proves, on an RF=3 topic with remote.storage.enable, small segments and a small
local.retention.bytes: records produced past local retention are copied to the object store
and every replica deletes its copied local segments; a consumer from the beginning still
reads every record from offset 0, byte for byte (the older ones served from the object
store), and the low watermark stays 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import TopicPartition as KTopicPartition
from support.cluster import UpProcess
from support.waiting import wait_until

pytestmark = pytest.mark.slow

TOPIC = "tiered-live"
RECORDS = 240
VALUE_BYTES = 1000
# One tiering round every remote.log.manager.task.interval.ms (30 s by default, 1 s on the shared
# cluster: SHARED_BROKER_CONFIGS in tests/conftest.py); a few may be needed.
TIERED_WAIT_S = 240.0


@pytest.fixture(scope="module")
def up(shared_up: UpProcess) -> UpProcess:
    return shared_up


def _value(i: int) -> bytes:
    return (b"%06d-" % i) * (VALUE_BYTES // 7)


def _local_segments(data_dir: Path) -> list[int]:
    """How many .log files each replica of the topic's partition 0 holds."""
    return [len(list(d.glob("*.log"))) for d in sorted(data_dir.glob(f"broker-*/{TOPIC}-0"))]


def test_records_past_local_retention_are_read_from_offset_zero(up: UpProcess) -> None:
    admin = AdminClient({"bootstrap.servers": up.bootstrap})
    configs = {
        "remote.storage.enable": "true",
        "segment.bytes": "16384",
        "local.retention.bytes": "32768",
    }
    futures = admin.create_topics([NewTopic(TOPIC, 1, 3, config=configs)])
    futures[TOPIC].result(60)

    producer = Producer(
        {
            "bootstrap.servers": up.bootstrap,
            "acks": "all",
            "batch.num.messages": 4,
            "linger.ms": 20,
            "message.timeout.ms": 120_000,
        }
    )
    failed: list[KafkaError] = []
    for i in range(RECORDS):
        producer.produce(
            TOPIC, key=b"k%d" % i, value=_value(i), on_delivery=lambda e, _m: e and failed.append(e)
        )
    assert producer.flush(120) == 0
    assert failed == []

    # ~240 KiB in segments of 16 KiB: all but ~32 KiB (plus the active segment) copied and
    # deleted locally on every replica.
    wait_until(
        lambda: len(_local_segments(up.data_dir)) == 3 and max(_local_segments(up.data_dir)) <= 4,
        timeout_s=TIERED_WAIT_S,
        message="copied segments deleted locally on every replica",
    )

    consumer = Consumer(
        {
            "bootstrap.servers": up.bootstrap,
            "group.id": "tiered-live-reader",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": 65536,
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)
        assert (low, high) == (0, RECORDS)
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        seen: list[tuple[int, bytes, bytes]] = []
        stamps: list[int] = []

        def read_all() -> bool:
            message = consumer.poll(1.0)
            if message is not None:
                assert message.error() is None, message.error()
                seen.append((message.offset(), message.key(), message.value()))
                stamps.append(message.timestamp()[1])
            return len(seen) >= RECORDS

        wait_until(read_all, timeout_s=120, message="every record from offset 0")
        assert seen == [(i, b"k%d" % i, _value(i)) for i in range(RECORDS)]
    finally:
        consumer.close()
    _list_offsets_of_both_tiers(up, stamps)


def _list_offsets_of_both_tiers(up: UpProcess, stamps: list[int]) -> None:
    """ListOffsets v9 with kafka-python's admin client (it reads the gateway as Kafka 3.0):
    earliest is the remote log's start, earliest-local the replica's local start above it,
    latest-tiered the last copied offset, max-timestamp the first local record with the largest
    timestamp; each with the epoch of the batch it found, where the leader still knows it."""
    from kafka import KafkaAdminClient
    from kafka.admin import OffsetSpec

    admin = KafkaAdminClient(bootstrap_servers=up.bootstrap, request_timeout_ms=30_000)
    tp = KTopicPartition(TOPIC, 0)
    try:
        found = {
            spec: admin.list_partition_offsets({tp: spec})[tp]
            for spec in (
                OffsetSpec.EARLIEST,
                OffsetSpec.EARLIEST_LOCAL,
                OffsetSpec.LATEST_TIERED,
                OffsetSpec.LATEST,
                OffsetSpec.MAX_TIMESTAMP,
            )
        }
    finally:
        admin.close()
    local_start = found[OffsetSpec.EARLIEST_LOCAL].offset
    assert found[OffsetSpec.EARLIEST].offset == 0
    assert 0 < local_start < RECORDS
    assert local_start - 1 <= found[OffsetSpec.LATEST_TIERED].offset < RECORDS
    assert found[OffsetSpec.LATEST].offset == RECORDS
    # Max timestamp searches the local log, as Kafka's does: the first record there with the
    # largest timestamp (records produced within one millisecond share it).
    latest_ts = max(stamps[local_start:])
    top = found[OffsetSpec.MAX_TIMESTAMP]
    assert (top.offset, top.timestamp) == (stamps.index(latest_ts, local_start), latest_ts)
    assert found[OffsetSpec.LATEST].leader_epoch is not None
    assert top.leader_epoch is not None  # local: its batch's epoch
