"""Transactions through unmodified clients on a real embedded cluster (`raylog up`, 3 brokers).

Each client runs a committed, an aborted and a second committed transaction over the three
partitions of an RF=3 topic (min.insync.replicas=2), then reads everything back. Ordering makes
the read_committed checks exact without waiting for something not to happen: in every partition
the aborted records lie between the two committed transactions, so a reader that has the last
transaction's records has already passed them.

Proves:
- confluent-kafka, kafka-python, aiokafka and kafkajs transactional producers commit and abort
  (InitProducerId with a transactional id, AddPartitionsToTxn, EndTxn, markers); a
  read_committed consumer gets exactly the committed records, in order per partition, and a
  read_uncommitted one every record;
- consume-transform-produce: confluent-kafka's ``send_offsets_to_transaction``
  (AddOffsetsToTxn, TxnOffsetCommit) moves the group's committed offsets with a committed
  transaction and leaves them where they were with an aborted one;
- a second producer with the same transactional.id fences the first: the first's commit fails
  with a fatal fencing error and its records stay invisible to read_committed readers;
- kafka-python's admin client lists and describes transactions (KIP-664) as they stand.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from kafka import KafkaAdminClient, KafkaProducer
from support.cluster import UpProcess, create_durable_topic
from support.waiting import wait_until

pytestmark = pytest.mark.slow

TOPIC = "txn-orders"
PARTITIONS = 3
CLIENT_TIMEOUT_S = 90.0
KAFKAJS = Path(__file__).resolve().parent / "kafkajs"
OUTCOMES = ("commit", "abort", "commit-after")


@pytest.fixture(scope="module")
def up(shared_up: UpProcess) -> Iterator[UpProcess]:
    create_durable_topic(shared_up, TOPIC, PARTITIONS)
    yield shared_up


def _values(client: str, outcome: str) -> list[bytes]:
    return [f"{client}-{outcome}-{i}".encode() for i in range(6)]


def _committed(client: str) -> list[bytes]:
    return _values(client, "commit") + _values(client, "commit-after")


def _read(up: UpProcess, isolation: str, prefix: bytes, count: int) -> dict[int, list[bytes]]:
    """The records whose value starts with ``prefix``, per partition in offset order, once
    ``count`` of them are read (assign from offset 0, no group)."""
    consumer = Consumer(
        {
            "bootstrap.servers": up.bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])

        def enough() -> bool:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                if msg.error() is None and msg.value().startswith(prefix):
                    got[msg.partition()].append(msg.value())
            return sum(map(len, got.values())) >= count

        wait_until(enough, timeout_s=CLIENT_TIMEOUT_S, message=f"{count} {prefix!r} records")
    finally:
        consumer.close()
    return got


def _by_partition(values: list[bytes]) -> dict[int, list[bytes]]:
    """Where the producers put each value: value i of a transaction goes to partition i % 3."""
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for value in values:
        out[int(value.rsplit(b"-", 1)[1]) % PARTITIONS].append(value)
    return out


def _check_reads(up: UpProcess, client: str) -> None:
    prefix = f"{client}-".encode()
    committed = _committed(client)
    assert _read(up, "read_committed", prefix, len(committed)) == _by_partition(committed)
    every = [v for outcome in OUTCOMES for v in _values(client, outcome)]
    assert _read(up, "read_uncommitted", prefix, len(every)) == _by_partition(every)


def _confluent_producer(up: UpProcess, transactional_id: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": up.bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 5,
            "transaction.timeout.ms": int(CLIENT_TIMEOUT_S * 1000),
        }
    )
    producer.init_transactions(CLIENT_TIMEOUT_S)
    return producer


def test_confluent_kafka_commits_and_aborts(up: UpProcess) -> None:
    producer = _confluent_producer(up, "ck-txn")
    for outcome in OUTCOMES:
        producer.begin_transaction()
        for i, value in enumerate(_values("ck", outcome)):
            producer.produce(TOPIC, value=value, partition=i % PARTITIONS)
        producer.flush(CLIENT_TIMEOUT_S)  # the records reach the log before the abort
        if outcome == "abort":
            producer.abort_transaction(CLIENT_TIMEOUT_S)
        else:
            producer.commit_transaction(CLIENT_TIMEOUT_S)
    _check_reads(up, "ck")


def test_kafka_python_commits_and_aborts(up: UpProcess) -> None:
    producer = KafkaProducer(bootstrap_servers=up.bootstrap, transactional_id="kp-txn")
    try:
        producer.init_transactions()
        for outcome in OUTCOMES:
            producer.begin_transaction()
            for i, value in enumerate(_values("kp", outcome)):
                producer.send(TOPIC, value=value, partition=i % PARTITIONS)
            producer.flush()
            if outcome == "abort":
                producer.abort_transaction()
            else:
                producer.commit_transaction()
    finally:
        producer.close()
    _check_reads(up, "kp")


def test_aiokafka_commits_and_aborts(up: UpProcess) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=up.bootstrap, transactional_id="aio-txn")
        await producer.start()
        try:
            for outcome in OUTCOMES:
                await producer.begin_transaction()
                sent = [
                    await producer.send(TOPIC, value=value, partition=i % PARTITIONS)
                    for i, value in enumerate(_values("aio", outcome))
                ]
                await asyncio.gather(*sent)
                if outcome == "abort":
                    await producer.abort_transaction()
                else:
                    await producer.commit_transaction()
        finally:
            await producer.stop()

    asyncio.run(asyncio.wait_for(run(), CLIENT_TIMEOUT_S))
    _check_reads(up, "aio")


def test_kafkajs_commits_and_aborts(kafkajs: Path, up: UpProcess) -> None:
    run = subprocess.run(
        [str(kafkajs), "transactions.mjs", up.bootstrap, TOPIC],
        cwd=KAFKAJS,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S * 2,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(out["received"]) == sorted(out["committed"])
    assert len(out["committed"]) == 12 and not any("-abort-" in v for v in out["received"])


def _group_offsets(up: UpProcess, group: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": up.bootstrap, "group.id": group})
    try:
        wanted = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        return {tp.partition: tp.offset for tp in consumer.committed(wanted, CLIENT_TIMEOUT_S)}
    finally:
        consumer.close()


def test_consume_transform_produce_moves_offsets_only_with_committed_transactions(
    up: UpProcess,
) -> None:
    source = _confluent_producer(up, "ctp-source")
    source.begin_transaction()
    for i, value in enumerate(_values("ctp", "commit")):
        source.produce(TOPIC, value=value, partition=i % PARTITIONS)
    source.commit_transaction(CLIENT_TIMEOUT_S)
    group = "ctp-group"
    consumer = Consumer(
        {
            "bootstrap.servers": up.bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer = _confluent_producer(up, "ctp-transform")
    try:
        consumer.subscribe([TOPIC])
        seen: list[Any] = []

        def consumed_some() -> bool:
            seen.extend(m for m in consumer.consume(50, 0.5) if m.error() is None)
            return len(seen) >= 3

        wait_until(consumed_some, timeout_s=CLIENT_TIMEOUT_S, message="records to transform")
        positions = consumer.position(consumer.assignment())
        moved = {tp.partition: tp.offset for tp in positions if tp.offset >= 0}
        # An aborted transaction leaves the group's offsets where they were...
        producer.begin_transaction()
        producer.produce(TOPIC, value=b"ctp-out-aborted", partition=0)
        producer.send_offsets_to_transaction(
            positions, consumer.consumer_group_metadata(), CLIENT_TIMEOUT_S
        )
        producer.abort_transaction(CLIENT_TIMEOUT_S)
        assert all(offset < 0 for offset in _group_offsets(up, group).values())
        # ...a committed one moves them.
        producer.begin_transaction()
        producer.produce(TOPIC, value=b"ctp-out-committed", partition=0)
        producer.send_offsets_to_transaction(
            positions, consumer.consumer_group_metadata(), CLIENT_TIMEOUT_S
        )
        producer.commit_transaction(CLIENT_TIMEOUT_S)
        offsets = _group_offsets(up, group)
        assert moved and {p: offsets[p] for p in moved} == moved
    finally:
        consumer.close()


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(
    up: UpProcess,
) -> None:
    zombie = _confluent_producer(up, "fenced-txn")
    zombie.begin_transaction()
    zombie.produce(TOPIC, value=b"fence-zombie-0", partition=0)
    zombie.flush(CLIENT_TIMEOUT_S)
    successor = _confluent_producer(up, "fenced-txn")  # aborts the zombie's transaction
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(CLIENT_TIMEOUT_S)
    assert raised.value.args[0].fatal(), raised.value
    successor.begin_transaction()
    successor.produce(TOPIC, value=b"fence-successor-0", partition=0)
    successor.commit_transaction(CLIENT_TIMEOUT_S)
    got = _read(up, "read_committed", b"fence-", 1)
    assert got[0] == [b"fence-successor-0"]
    admin = KafkaAdminClient(bootstrap_servers=up.bootstrap)
    try:
        described = admin.describe_transactions(["fenced-txn"])["fenced-txn"]
        listed = {t.transactional_id: t for ts in admin.list_transactions().values() for t in ts}
    finally:
        admin.close()
    # Epochs: the zombie's 0, the fence's 1 (its transaction aborted), the successor's 2.
    assert (described.state.value, described.producer_epoch) == ("CompleteCommit", 2)
    assert listed["fenced-txn"].producer_id == described.producer_id
