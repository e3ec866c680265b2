"""Idempotent producers against a real embedded cluster while the partition leader dies.

A `raylog up` subprocess (3 brokers), topic RF=3 with min.insync.replicas=2. kafka-python with its
default idempotent producer (InitProducerId, sequences, acks=all) and confluent-kafka with
``enable.idempotence=true`` produce N records each to partition 0; a third of the way in, the
broker leading it is hard-killed (its replica actors and broker actor, through Ray, in a
separate process: tests/support/kill_leader.py) while both keep producing. Then everything is read
back with an assigned consumer. The same again with the leader replica's log failing instead, as on
a full disk (its next append fails with EFBIG; the broker stays up): the clients get
KAFKA_STORAGE_ERROR, refresh their metadata and go on with the leader the controller elects.

Then the leader's gateway process alone is SIGKILLed while an idempotent producer and a consumer
have requests in flight: the supervisor starts a new gateway on the same port, the broker keeps
leading (no election), both clients reconnect, and the producer's records are each in the log
once, in order, as the consumer reads them.

Proves: every record of both producers is acknowledged; the log holds each exactly once (no
duplicate from the retries that crossed the failover), in send order, with no gap; and each
acknowledgement's offset is where the record really is (a retry answered as a duplicate gets
the original offset). One exception, librdkafka's own: when a request fails with an uncertain
outcome (its leader died) and a later one of the same producer succeeds, librdkafka delivers the
earlier records as "implicitly acked" with no offset (None; rd_kafka_dr_implicit_ack). Those
records must still be in the log once, in order, which the first checks prove.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from kafka import KafkaProducer
from support.cluster import UpProcess, cli_env
from support.waiting import wait_until

pytestmark = pytest.mark.slow

RECORDS = 300  # per producer
CLIENT_TIMEOUT_S = 120.0
KILL_TIMEOUT_S = 120.0


def _kill_leader(data_dir: Path, topic: str, mode: str) -> subprocess.Popen[str]:
    script = Path(__file__).resolve().parents[1] / "support" / "kill_leader.py"
    return subprocess.Popen(
        [sys.executable, str(script), str(data_dir), topic, "0", mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )


def _read_partition(bootstrap: str, topic: str, end_offset: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every record below ``end_offset``: assign + seek, no group."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    got: dict[int, bytes] = {}
    try:
        tp = TopicPartition(topic, 0, 0)
        consumer.assign([tp])

        def seeked() -> bool:
            try:
                consumer.seek(tp)
            except KafkaException:
                return False
            return True

        wait_until(seeked, timeout_s=CLIENT_TIMEOUT_S, message="consumer assigned")

        def all_read() -> bool:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is None:
                    got[msg.offset()] = msg.value()
            return len(got) >= end_offset

        wait_until(all_read, timeout_s=CLIENT_TIMEOUT_S, message="every record consumed")
    finally:
        consumer.close()
    return sorted(got.items())


@pytest.mark.parametrize(("mode", "done"), [("--kill", "killed:"), ("--fail-disk", "failed:")])
def test_idempotent_producers_lose_and_duplicate_nothing_across_a_failed_leader(
    shared_up: UpProcess, mode: str, done: str
) -> None:
    up = shared_up
    up.heal()  # the other case killed a broker: Ray restarts it; wait until it is back
    data_dir = up.data_dir
    topic = "idempotent" + mode.replace("--", "-")
    created = up.raylog(
        "topics", "create", topic, "--partitions", "1", "--replication-factor", "3",
        "--config", "min.insync.replicas=2",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    kp = KafkaProducer(bootstrap_servers=up.bootstrap, linger_ms=5, request_timeout_ms=10_000)
    assert kp.config["enable_idempotence"], "kafka-python's default must be idempotent"
    ck = Producer(
        {
            "bootstrap.servers": up.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": int(CLIENT_TIMEOUT_S * 1000),
        }
    )
    kp_futures: list[Any] = []
    ck_acked: dict[bytes, int | None] = {}
    ck_errors: list[str] = []

    def ck_delivered(err: Any, msg: Any) -> None:
        if err is not None:
            ck_errors.append(str(err))
        else:
            ck_acked[msg.value()] = msg.offset()

    def send(i: int) -> None:
        kp_futures.append(kp.send(topic, value=b"kp-%05d" % i, partition=0))
        ck.produce(topic, value=b"ck-%05d" % i, partition=0, on_delivery=ck_delivered)
        ck.poll(0)

    i = 0
    while i < RECORDS // 3:
        send(i)
        i += 1
    assert kp_futures[0].get(timeout=CLIENT_TIMEOUT_S).offset >= 0  # the producers work
    killer = _kill_leader(data_dir, topic, mode)
    # Keep producing while the kill lands: batches are in flight when the leader dies. The
    # poll is the pacing (bounded waits for delivery events); a third is kept for after.
    while i < 2 * RECORDS // 3 and killer.poll() is None:
        send(i)
        i += 1
        ck.poll(0.02)
    out, err = killer.communicate(timeout=KILL_TIMEOUT_S)
    assert killer.returncode == 0 and done in out, (out, err[-2000:])
    failed = json.loads(out.split(done, 1)[1].splitlines()[0])["leader"]
    assert i < RECORDS, "records are still produced after the leader died"
    while i < RECORDS:
        send(i)
        i += 1
    kp.flush(timeout=CLIENT_TIMEOUT_S)
    assert ck.flush(CLIENT_TIMEOUT_S) == 0 and not ck_errors, ck_errors[:3]
    kp_acked = {
        b"kp-%05d" % n: f.get(timeout=CLIENT_TIMEOUT_S).offset for n, f in enumerate(kp_futures)
    }
    kp.close(timeout=30)

    described = up.raylog("topics", "describe", topic, "--json")
    assert described.returncode == 0, described.stderr
    partition = json.loads(described.stdout)[0]["partitions"][0]
    assert partition["leader_epoch"] > 0, f"leader {failed} was never replaced: {partition}"
    log = _read_partition(up.bootstrap, topic, 2 * RECORDS)
    assert [offset for offset, _ in log] == list(range(2 * RECORDS)), "offsets are dense"
    for prefix, acked in ((b"kp-", kp_acked), (b"ck-", ck_acked)):
        values = [(offset, v) for offset, v in log if v.startswith(prefix)]
        assert [v for _, v in values] == [prefix + b"%05d" % n for n in range(RECORDS)], (
            f"{prefix!r}: duplicates, gaps or reordering"
        )
        real = {v: offset for offset, v in values}
        assert acked.keys() == real.keys(), f"{prefix!r}: every record is acknowledged"
        wrong = {
            v: (acked[v], offset)
            for v, offset in real.items()
            if acked[v] != offset and not (prefix == b"ck-" and acked[v] is None)
        }
        assert not wrong, f"{prefix!r}: acked offsets that are not the real ones: {wrong}"
    # Gone now rather than at the module's end: with its failed replica out of the ISR until the
    # broker re-creates it (60 s), the other case's heal() would wait for it.
    deleted = up.raylog("topics", "delete", topic)
    assert deleted.returncode == 0, deleted.stderr


def test_a_gateway_that_dies_alone_is_replaced_and_its_clients_recover(
    shared_up: UpProcess,
) -> None:
    up = shared_up
    up.heal()
    topic = "gateway-death"
    created = up.raylog(
        "topics", "create", topic, "--partitions", "1", "--replication-factor", "3",
        "--config", "min.insync.replicas=2",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr

    def partition_state() -> dict[str, Any]:
        described = up.raylog("topics", "describe", topic, "--json")
        assert described.returncode == 0, described.stderr
        return dict(json.loads(described.stdout)[0]["partitions"][0])

    before = partition_state()
    producer = Producer(
        {
            "bootstrap.servers": up.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": int(CLIENT_TIMEOUT_S * 1000),
        }
    )
    acked: dict[bytes, int | None] = {}
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked[msg.value()] = msg.offset()

    # A consumer fetching throughout: its fetches are in flight when the gateway dies.
    seen: list[bytes] = []
    stop = threading.Event()
    consumer = Consumer(
        {"bootstrap.servers": up.bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])

    def consume() -> None:
        deadline = time.monotonic() + 3 * CLIENT_TIMEOUT_S
        while not stop.is_set() and len(seen) < RECORDS and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.2):
                if msg.error() is None:
                    seen.append(msg.value())

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    i = 0
    while i < RECORDS // 3:
        producer.produce(topic, value=b"gw-%05d" % i, partition=0, on_delivery=delivered)
        producer.poll(0)
        i += 1
    assert producer.flush(CLIENT_TIMEOUT_S) == 0 and not errors, errors[:3]
    killer = _kill_leader(up.data_dir, topic, "--kill-gateway")
    while i < 2 * RECORDS // 3 and killer.poll() is None:
        producer.produce(topic, value=b"gw-%05d" % i, partition=0, on_delivery=delivered)
        i += 1
        producer.poll(0.02)
    out, err = killer.communicate(timeout=KILL_TIMEOUT_S)
    assert killer.returncode == 0 and "killed:" in out, (out, err[-2000:])
    while i < RECORDS:
        producer.produce(topic, value=b"gw-%05d" % i, partition=0, on_delivery=delivered)
        producer.poll(0)
        i += 1
    try:
        assert producer.flush(CLIENT_TIMEOUT_S) == 0 and not errors, errors[:3]
        reader.join(timeout=CLIENT_TIMEOUT_S)
    finally:
        stop.set()
        reader.join(timeout=CLIENT_TIMEOUT_S)
        consumer.close()
    after = partition_state()
    # The broker kept leading: only its gateway died, and a new one took its port.
    assert (after["leader"], after["leader_epoch"]) == (before["leader"], before["leader_epoch"])
    expected = [b"gw-%05d" % n for n in range(RECORDS)]
    assert seen == expected, "the consumer read every record once, in order, across the death"
    log = _read_partition(up.bootstrap, topic, RECORDS)
    assert [offset for offset, _ in log] == list(range(RECORDS)), "offsets are dense"
    assert [v for _, v in log] == expected, "duplicates, gaps or reordering"
    assert acked.keys() == set(expected), "every record is acknowledged"
    deleted = up.raylog("topics", "delete", topic)
    assert deleted.returncode == 0, deleted.stderr
