"""Log compaction on `raylog up`, through real clients (cleanup.policy=compact).

A confluent-kafka producer writes keyed records (gzip-compressed) and tombstones to a compacted
RF=3 topic with small segments, after one batch of an idempotent producer whose keys it all
writes again (the cleaner empties that batch and keeps it: the producer's last). The leader's
log cleaner compacts the closed segments. Then confluent-kafka, kafka-python, aiokafka and
kafkajs consumers, each reading from the beginning, must get:

- fewer records than were produced (the cleaner ran), each at the offset it was produced at
  with the key and value produced there, in offset order;
- for every key, the last value produced, or its tombstone (delete.retention.ms keeps
  tombstones a day);
- no record that is the latest of its key is missing: only superseded ones are;

and the metrics endpoint counts the cleaner's passes and the records they removed.

Consumers skip the offsets compaction removed (gaps between batches, and records missing
inside a batch whose offsets are kept), as they do against Kafka.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition
from support.cluster import UpProcess, scrape, total
from support.waiting import wait_until

from raylog.storage import batch as rb

pytestmark = pytest.mark.slow

KAFKAJS_DIR = Path(__file__).resolve().parent / "kafkajs"

TOPIC = "compacted-live"
KEYS = 12
ROUNDS = 40  # records per key
DELETED = {b"key-3", b"key-7"}
TIMEOUT_S = 90.0
# A replica checks every log.cleaner.backoff.ms whether a pass is due (15 s by default, 1 s on the
# shared cluster: SHARED_BROKER_CONFIGS in tests/conftest.py).
CLEANED_DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def cluster(shared_up: UpProcess) -> UpProcess:
    return shared_up


def _produce(bootstrap: str) -> dict[int, tuple[bytes, bytes | None]]:
    """Produce ROUNDS values per key, then tombstones for DELETED; returns offset -> record."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "gzip",  # kafkajs decodes gzip only (others need plugins)
            "batch.size": 4096,  # several batches per 8 KiB segment
            "message.timeout.ms": 120000,
        }
    )
    produced: dict[int, tuple[bytes, bytes | None]] = {}
    failed: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err)
        else:
            produced[msg.offset()] = (msg.key(), msg.value())

    # One batch of an idempotent producer, every key of it written again later: the cleaner
    # empties it and keeps it (the producer's last batch), and readers must step over it.
    idempotent = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 50}
    )
    for k in range(3):
        idempotent.produce(TOPIC, b"first", key=b"key-%d" % k, on_delivery=delivered)
    assert idempotent.flush(120) == 0 and not failed, failed
    for round_ in range(ROUNDS):
        for k in range(KEYS):
            value = b"value-%d-%d-" % (k, round_) + os.urandom(150)  # incompressible
            producer.produce(TOPIC, value, key=b"key-%d" % k, on_delivery=delivered)
        producer.poll(0)
    for key in sorted(DELETED):
        producer.produce(TOPIC, None, key=key, on_delivery=delivered)
    # Enough records after the tombstones that they leave the active segment.
    for round_ in range(10):
        for k in range(KEYS):
            if b"key-%d" % k not in DELETED:
                producer.produce(
                    TOPIC, b"tail-%d" % round_, key=b"key-%d" % k, on_delivery=delivered
                )
    assert producer.flush(180) == 0 and not failed, failed
    return produced


def _consume_confluent(bootstrap: str, end: int) -> list[tuple[int, bytes, bytes | None]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "compaction-check",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        out: list[tuple[int, bytes, bytes | None]] = []
        deadline_polls = 600
        while (not out or out[-1][0] < end - 1) and deadline_polls:
            deadline_polls -= 1
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.offset(), msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def _consume_kafka_python(bootstrap: str, end: int) -> list[tuple[int, bytes, bytes | None]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = KTopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        out: list[tuple[int, bytes, bytes | None]] = []
        for _ in range(600):  # bounded polls
            if out and out[-1][0] >= end - 1:
                break
            for records in consumer.poll(timeout_ms=500).values():
                out += [(r.offset, r.key, r.value) for r in records]
        return out
    finally:
        consumer.close()


def _consume_aiokafka(bootstrap: str, end: int) -> list[tuple[int, bytes, bytes | None]]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTP

    async def run() -> list[tuple[int, bytes, bytes | None]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = AioTP(TOPIC, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            out: list[tuple[int, bytes, bytes | None]] = []
            async with asyncio.timeout(TIMEOUT_S):
                while not out or out[-1][0] < end - 1:
                    for records in (await consumer.getmany(timeout_ms=500)).values():
                        out += [(r.offset, r.key, r.value) for r in records]
            return out
        finally:
            await consumer.stop()

    return asyncio.run(run())


def _consume_kafkajs(node: Path, bootstrap: str, end: int) -> list[tuple[int, bytes, bytes | None]]:
    run = subprocess.run(
        [str(node), "read_all.mjs", bootstrap, TOPIC, str(end)],
        cwd=KAFKAJS_DIR,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S + 30,
    )
    assert run.returncode == 0, (run.stdout[-1000:], run.stderr[-2000:])
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith(("[", "{"))]
    assert lines[-1] == {"done": True}

    def raw(text: str | None) -> bytes | None:
        return None if text is None else base64.b64decode(text)

    return [(int(offset), raw(key), raw(value)) for offset, key, value in lines[:-1]]


def _empty_kept_batches(cluster: UpProcess) -> int:
    """Batches the cleaner emptied and kept (an idempotent producer's last) in the leader's log."""
    leader = cluster.document("topics", "describe", TOPIC)[0]["partitions"][0]["leader"]
    found = 0
    for segment in sorted((cluster.data_dir / f"broker-{leader}" / f"{TOPIC}-0").glob("*.log")):
        for _, header in rb.iter_batches(segment.read_bytes()):
            found += header.records_count == 0 and header.producer_id >= 0
    return found


@dataclass(frozen=True)
class Compacted:
    """The compacted topic, once a consumer sees fewer records than were produced."""

    bootstrap: str
    produced: dict[int, tuple[bytes, bytes | None]]  # offset -> (key, value)
    end: int  # one past the last offset produced
    latest: dict[bytes, int]  # key -> the offset of its last record
    confluent_rows: list[tuple[int, bytes, bytes | None]]


@pytest.fixture(scope="module")
def compacted(cluster: UpProcess) -> Compacted:
    bootstrap = cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = {
        "cleanup.policy": "compact",
        "segment.bytes": "8192",
        "min.cleanable.dirty.ratio": "0.01",
    }
    topic = NewTopic(TOPIC, num_partitions=1, replication_factor=3, config=configs)
    admin.create_topics([topic], operation_timeout=30)[TOPIC].result(timeout=TIMEOUT_S)
    produced = _produce(bootstrap)
    end = max(produced) + 1
    assert len(produced) == end  # every offset was acknowledged once

    latest: dict[bytes, int] = {}
    for offset in sorted(produced):
        latest[produced[offset][0]] = offset

    def cleaned() -> list[tuple[int, bytes, bytes | None]] | None:
        rows = _consume_confluent(bootstrap, end)
        return rows if len(rows) < len(produced) else None

    rows = wait_until(cleaned, timeout_s=CLEANED_DEADLINE_S)
    return Compacted(bootstrap, produced, end, latest, rows)


def _check_reader(topic: Compacted, rows: list[tuple[int, bytes, bytes | None]]) -> set[int]:
    """What every reader must get (the module docstring); returns the offsets compaction
    removed."""
    offsets = [offset for offset, _, _ in rows]
    assert offsets == sorted(set(offsets)) and offsets[-1] == topic.end - 1
    for offset, key, value in rows:
        assert topic.produced[offset] == (key, value), offset
    # The last record of every key is there: its latest value or its tombstone.
    seen = {key: offset for offset, key, _ in rows}
    assert seen == topic.latest
    assert all(topic.produced[topic.latest[key]][1] is None for key in DELETED)
    # Only superseded records are gone: each has a later record with its key.
    missing = set(topic.produced) - set(offsets)
    assert missing and all(topic.latest[topic.produced[o][0]] > o for o in missing)
    return missing


def test_python_clients_read_the_compacted_topic(cluster: UpProcess, compacted: Compacted) -> None:
    assert _empty_kept_batches(cluster) >= 1
    readers = {
        "confluent-kafka": compacted.confluent_rows,
        "kafka-python": _consume_kafka_python(compacted.bootstrap, compacted.end),
        "aiokafka": _consume_aiokafka(compacted.bootstrap, compacted.end),
    }
    missing: set[int] = set()
    for rows in readers.values():
        missing = _check_reader(compacted, rows)
    # The leader's passes show on the metrics endpoint (followers compact on their own too).
    samples = scrape(cluster.metrics_url)
    assert total(samples, "raylog_log_cleaner_passes_total", topic=TOPIC) >= 1
    assert total(samples, "raylog_log_cleaner_records_removed_total", topic=TOPIC) >= len(missing)
    assert total(samples, "raylog_log_size_bytes", topic=TOPIC) > 0


def test_kafkajs_reads_the_compacted_topic(kafkajs: Path, compacted: Compacted) -> None:
    """Skipped, and reported as skipped, where Node.js is not installed."""
    _check_reader(compacted, _consume_kafkajs(kafkajs, compacted.bootstrap, compacted.end))
