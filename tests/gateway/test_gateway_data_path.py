"""The data path on real Ray: Produce, Fetch and ListOffsets served by real ReplicaActors.

Three brokers in one test process, each a ``GatewayServer`` with a ``ReplicaBackend`` for its
broker id and all advertising their own loopback ports in Metadata (the real shape: clients send
each request to the gateway of the partition's leader). Topic ``t`` has three partitions, led by
brokers 0, 1 and 2; the test stands in for the controller (BecomeLeader / BecomeFollower and the
gateways' metadata). Everything else is real: Ray actors with their WALs on disk, TCP on
127.0.0.1, and unmodified clients.

Proves:
- confluent-kafka (librdkafka, read_committed by default) produces with acks=all in every codec
  (none, gzip, snappy, lz4, zstd; the stored batches carry that codec, so zstd was really used)
  to two partitions led by different brokers, and an assign + seek consumer reads every record
  exactly once, in order, with keys, values, headers and timestamps;
- kafka-python (``enable_idempotence=False``) with acks 0, 1 and all, KafkaConsumer with assign
  + seek, and ListOffsets: earliest, latest and by timestamp (``offsets_for_times``);
- aiokafka's producer and consumer, and kcat ``-P`` / ``-C``;
- a producer whose metadata went stale (leadership moved to another broker) gets
  NOT_LEADER_OR_FOLLOWER from the old leader's gateway, refreshes Metadata and delivers to the
  new leader, with nothing lost or duplicated;
- the raw protocol: errors 21, 3, 17 (``__consumer_offsets``), 6, 48 on Produce, an
  idempotent retry answered with the original offset; a failed acks=0 Produce closes the
  connection; OFFSET_OUT_OF_RANGE, fetch sessions declined (70, 71), the long poll honouring
  ``max_wait_ms`` and answering early when data arrives, ``max_bytes`` keeping whole batches
  (and, without Ray, the budget across partitions: whole batches, in request order, the first
  batch always).

kafka-python runs with ``enable_idempotence=False`` here: these gateways have no controller to
allocate producer ids (tests/e2e/test_idempotent_producer_live.py covers its idempotent default).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec
import pytest
import ray
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from support.gateway import HOST, read_frame
from support.waiting import wait_until

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.gateway.backend import Broker, PartitionState, TopicState
from raylog.gateway.replica_backend import ReplicaBackend
from raylog.gateway.routing import MetadataView
from raylog.gateway.server import GatewayServer
from raylog.storage import batch as rb
from raylog.storage import short_circuit

pytestmark = pytest.mark.slow

TOPIC = "t"
BROKERS = (0, 1, 2)
# partition -> (replicas, first leader, min.insync.replicas)
LAYOUT = {0: ((0, 1, 2), 0, 2), 1: ((1, 2, 0), 1, 2), 2: ((2, 0), 2, 1)}
CALL_TIMEOUT_S = 30.0
CLIENT_TIMEOUT_S = 30.0
BASE_TS = 1_700_000_000_000
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


class Cluster:
    """Replica actors for topic ``t`` plus one gateway per broker, in one background loop."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="gateways", daemon=True)
        self.views = {b: MetadataView(b, "raylog-data-path", controller_id=0) for b in BROKERS}
        self.servers = {b: GatewayServer(ReplicaBackend(self.views[b])) for b in BROKERS}
        self.ports: dict[int, int] = {}
        self.replicas: dict[tuple[int, int], Any] = {}
        self.leaders: dict[int, tuple[int, int]] = {}  # partition -> (leader, leader epoch)

    def start(self) -> None:
        for partition, (replicas, _, min_isr) in LAYOUT.items():
            config = ReplicaConfig(min_insync_replicas=min_isr, fetch_max_wait_ms=200)
            for rid in replicas:
                self.replicas[partition, rid] = ReplicaActor.options(  # type: ignore[attr-defined]
                    name=replica_actor_name(TOPIC, partition, rid), namespace=NAMESPACE
                ).remote(
                    TOPIC,
                    partition,
                    rid,
                    str(self.data_dir / f"p{partition}-r{rid}"),
                    {"min.insync.replicas": str(min_isr)},
                    config,
                )
        self._thread.start()
        for broker, server in self.servers.items():
            self.ports[broker] = self.call(server.start(HOST, 0))
        brokers = [Broker(b, HOST, self.ports[b], None) for b in BROKERS]
        for view in self.views.values():
            view.update(brokers=brokers)
        for partition, (_, leader, _) in LAYOUT.items():
            self.lead(partition, leader, 1)

    def call(self, coroutine: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout=timeout_s)

    def lead(self, partition: int, leader: int, epoch: int) -> None:
        """Do what the controller will: command the replicas, then publish the new metadata."""
        replicas = LAYOUT[partition][0]
        calls = [
            self.replicas[partition, leader].become_leader.remote(
                BecomeLeader(
                    controller_epoch=1,
                    leader_epoch=epoch,
                    partition_epoch=epoch,
                    isr=tuple(sorted(replicas)),
                    replicas=replicas,
                )
            )
        ]
        for rid in replicas:
            if rid != leader:
                calls.append(
                    self.replicas[partition, rid].become_follower.remote(
                        BecomeFollower(
                            controller_epoch=1,
                            leader_id=leader,
                            leader_epoch=epoch,
                            partition_epoch=epoch,
                        )
                    )
                )
        ray.get(calls, timeout=CALL_TIMEOUT_S)
        self.leaders[partition] = (leader, epoch)
        topics = {TOPIC: self.topic_state()}
        for view in self.views.values():
            view.update(topics=topics)

    def topic_state(self) -> TopicState:
        return TopicState(
            TOPIC,
            [
                PartitionState(
                    p,
                    leader=self.leaders[p][0],
                    leader_epoch=self.leaders[p][1],
                    replicas=list(replicas),
                    isr=sorted(replicas),
                    offline_replicas=[],
                )
                for p, (replicas, _, _) in LAYOUT.items()
                if p in self.leaders
            ],
        )

    def leader_replica(self, partition: int) -> Any:
        return self.replicas[partition, self.leaders[partition][0]]

    def high_watermark(self, partition: int) -> int:
        state = ray.get(self.leader_replica(partition).state.remote(), timeout=CALL_TIMEOUT_S)
        return int(state.high_watermark)

    def stored_headers(self, partition: int, start: int, end: int) -> list[rb.BatchHeader]:
        """Headers of the stored batches holding offsets [start, end), read from the leader."""
        headers: list[rb.BatchHeader] = []
        offset = start
        while offset < end:
            fetched = ray.get(
                self.leader_replica(partition).fetch.remote(offset, 1 << 20),
                timeout=CALL_TIMEOUT_S,
            )
            assert fetched.error_code == 0 and fetched.records, fetched
            for _, header in rb.iter_batches(fetched.records):
                if offset <= header.last_offset and header.base_offset < end:
                    headers.append(header)
                    offset = header.next_offset
        return headers

    def gateway(self, broker: int) -> str:
        return f"{HOST}:{self.ports[broker]}"

    @property
    def bootstrap(self) -> str:
        return self.gateway(0)

    def stop(self) -> None:
        for server in self.servers.values():
            self.call(server.stop())
            self.call(server.backend.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10.0)
        self.loop.close()
        for handle in self.replicas.values():
            ray.kill(handle)


@pytest.fixture(scope="module")
def cluster(ray_local: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("data-path"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


class _ListHandler(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _value(tag: str, i: int) -> bytes:
    # Compressible on purpose, so that every codec really shrinks the batches.
    return f"{tag}-{i:05d}-".encode() + b"raylog " * 40


# --- confluent-kafka (librdkafka) -------------------------------------------------------------


def test_confluent_kafka_every_codec_two_leaders(cluster: Cluster) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    partitions = (0, 1)  # led by brokers 0 and 1: two gateways
    starts = {p: cluster.high_watermark(p) for p in partitions}
    expected: dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes]], int]]] = {
        p: [] for p in partitions
    }
    ranges: dict[str, dict[int, tuple[int, int]]] = {}
    failures: list[Any] = []
    for codec in CODECS:
        before = {p: cluster.high_watermark(p) for p in partitions}
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "acks": "all",
                "compression.type": codec,
                "linger.ms": 5,
                "enable.idempotence": False,
            }
        )
        for i in range(40):
            p = partitions[i % 2]
            key = f"{codec}-key-{i}".encode()
            value = _value(codec, i)
            headers = [("codec", codec.encode()), ("i", str(i).encode())]
            ts = BASE_TS + i
            producer.produce(
                TOPIC,
                value=value,
                key=key,
                partition=p,
                headers=headers,
                timestamp=ts,
                on_delivery=lambda err, msg: failures.append(err) if err else None,
            )
            expected[p].append((key, value, headers, ts))
        assert producer.flush(CLIENT_TIMEOUT_S) == 0, "librdkafka did not deliver in time"
        assert not failures, failures
        ranges[codec] = {p: (before[p], cluster.high_watermark(p)) for p in partitions}

    # The codec librdkafka asked for is the codec stored: batches are kept as produced.
    stored = {
        (codec, p): [(h.compression, h.records_count) for h in cluster.stored_headers(p, *span)]
        for codec, by_partition in ranges.items()
        for p, span in by_partition.items()
    }
    assert all(sum(n for _, n in batches) == 20 for batches in stored.values()), stored
    # librdkafka enables lz4 only when FindCoordinator (10) is advertised (its "LZ4 feature"
    # uses that API as a proxy for a broker >= 0.8.2); until the group APIs land it silently
    # sends lz4 batches uncompressed.
    stored_codecs = dict(CODECS, lz4=CODECS["lz4"] if 10 in cluster.servers[0].api_versions else 0)
    assert {key: {c for c, _ in batches} for key, batches in stored.items()} == {
        (codec, p): {stored_codecs[codec]} for codec in CODECS for p in partitions
    }, stored

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "unused-assign-only",  # required by librdkafka; no group API is used
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, p, starts[p]) for p in partitions])
        got: dict[int, list[Any]] = {p: [] for p in partitions}
        total = sum(len(v) for v in expected.values())
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while sum(len(v) for v in got.values()) < total and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got[msg.partition()].append(
                (msg.key(), msg.value(), msg.headers(), msg.timestamp()[1], msg.offset())
            )
    finally:
        consumer.close()
    for p in partitions:
        assert [g[:4] for g in got[p]] == expected[p]
        assert [g[4] for g in got[p]] == list(range(starts[p], starts[p] + len(expected[p])))


def test_stale_leader_answers_6_and_the_producer_recovers(cluster: Cluster) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    partition = 2
    old_leader, epoch = cluster.leaders[partition]
    start = cluster.high_watermark(partition)
    delivered: list[tuple[Any, int]] = []
    # librdkafka's "msg" debug lines say which error each produce met: the proof that the
    # retry went through NOT_LEADER_OR_FOLLOWER and a metadata refresh.
    log_lines: list[str] = []
    logger = logging.getLogger("test.librdkafka.stale-leader")
    logger.addHandler(_ListHandler(log_lines))
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0, "debug": "msg"},
        logger=logger,
    )

    def produce(i: int) -> None:
        producer.produce(
            TOPIC,
            value=f"move-{i}".encode(),
            key=b"k",
            partition=partition,
            on_delivery=lambda err, msg: delivered.append((err, msg.offset())),
        )
        assert producer.flush(CLIENT_TIMEOUT_S) == 0

    produce(0)  # librdkafka now knows broker 2 leads partition 2
    new_leader = next(r for r in LAYOUT[partition][0] if r != old_leader)
    cluster.lead(partition, new_leader, epoch + 1)
    # The old leader's gateway now refuses: the producer's cached leader is stale.
    response = produce_raw(cluster.ports[old_leader], partition, _batch([b"raw"]), acks=-1)
    assert _produce_errors(response) == [6]
    produce(1)
    assert [err for err, _ in delivered] == [None, None]
    assert any("Not leader for partition" in line for line in log_lines), log_lines[-20:]
    assert cluster.leaders[partition][0] == new_leader
    assert cluster.high_watermark(partition) == start + 2

    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(TOPIC, partition, start)])
        values = []
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while len(values) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                values.append(msg.value())
    finally:
        consumer.close()
    assert values == [b"move-0", b"move-1"]


# --- kafka-python -------------------------------------------------------------------------------


def test_kafka_python_acks_and_list_offsets(cluster: Cluster) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    partition = 0
    tp = TopicPartition(TOPIC, partition)
    start = cluster.high_watermark(partition)
    expected = []
    ts0 = int(time.time() * 1000) + 10_000_000  # later than anything else in the log
    for n, acks in enumerate((0, 1, "all")):
        producer = KafkaProducer(
            bootstrap_servers=cluster.bootstrap,
            enable_idempotence=False,
            acks=acks,
            linger_ms=0,
            request_timeout_ms=int(CLIENT_TIMEOUT_S * 1000),
        )
        try:
            for i in range(10):
                ts = ts0 + 100 * (10 * n + i)
                key, value = f"kp-{acks}-{i}".encode(), _value(f"kp-{acks}", i)
                headers = [("acks", str(acks).encode())]
                metadata = producer.send(
                    TOPIC,
                    value=value,
                    key=key,
                    partition=partition,
                    headers=headers,
                    timestamp_ms=ts,
                ).get(timeout=CLIENT_TIMEOUT_S)
                if acks != 0:
                    assert metadata.offset == start + len(expected)
                expected.append((key, value, headers, ts))
        finally:
            producer.close(timeout=CLIENT_TIMEOUT_S)
        # acks=0 learns nothing back: wait for the appends to show before the next round.
        wait_until(
            lambda: cluster.high_watermark(partition) == start + len(expected),
            timeout_s=CALL_TIMEOUT_S,
            message="every record appended",
        )

    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap,
        enable_auto_commit=False,
        group_id=None,
        request_timeout_ms=int(CLIENT_TIMEOUT_S * 1000),
    )
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        got = []
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while len(got) < len(expected) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    got.append((r.offset, r.key, r.value, list(r.headers), r.timestamp))
        assert [g[0] for g in got] == list(range(start, start + len(expected)))
        assert [g[1:] for g in got] == expected

        end = start + len(expected)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: end}
        # kafka-python sends one record per batch here (linger 0, one send at a time), so
        # raylog's batch precision is record precision.
        for k in (0, 7, 15, 29):
            found = consumer.offsets_for_times({tp: expected[k][3]})[tp]
            assert (found.offset, found.timestamp) == (start + k, expected[k][3])
        between = consumer.offsets_for_times({tp: expected[4][3] + 1})[tp]
        assert between.offset == start + 5
        assert consumer.offsets_for_times({tp: expected[-1][3] + 1}) == {tp: None}
    finally:
        consumer.close()


# --- aiokafka and kcat ------------------------------------------------------------------------


def test_aiokafka_producer_and_consumer(cluster: Cluster) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    partition = 1
    start = cluster.high_watermark(partition)
    expected = [
        (f"aio-{i}".encode(), _value("aio", i), [("n", str(i).encode())], BASE_TS + 5_000 + i)
        for i in range(30)
    ]

    async def run() -> list[Any]:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
        await asyncio.wait_for(producer.start(), CLIENT_TIMEOUT_S)
        try:
            for key, value, headers, ts in expected:
                await asyncio.wait_for(
                    producer.send_and_wait(
                        TOPIC,
                        value=value,
                        key=key,
                        partition=partition,
                        headers=headers,
                        timestamp_ms=ts,
                    ),
                    CLIENT_TIMEOUT_S,
                )
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cluster.bootstrap, enable_auto_commit=False, group_id=None
        )
        await asyncio.wait_for(consumer.start(), CLIENT_TIMEOUT_S)
        tp = TopicPartition(TOPIC, partition)
        got: list[Any] = []
        try:
            consumer.assign([tp])
            consumer.seek(tp, start)
            async with asyncio.timeout(CLIENT_TIMEOUT_S):
                while len(got) < len(expected):
                    batches = await consumer.getmany(tp, timeout_ms=500)
                    for r in batches.get(tp, []):
                        got.append((r.offset, r.key, r.value, list(r.headers), r.timestamp))
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(run())
    assert [g[0] for g in got] == list(range(start, start + len(expected)))
    assert [g[1:] for g in got] == expected


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not on PATH")
def test_kcat_produce_and_consume(cluster: Cluster) -> None:
    kcat = shutil.which("kcat")
    assert kcat is not None
    partition = 1
    start = cluster.high_watermark(partition)
    lines = [f"kc{i}:value-{i}" for i in range(5)]
    subprocess.run(
        [
            kcat,
            "-b",
            cluster.bootstrap,
            "-P",
            "-t",
            TOPIC,
            "-p",
            str(partition),
            "-K:",
            "-H",
            "via=kcat",
        ],
        input="\n".join(lines).encode() + b"\n",
        timeout=CLIENT_TIMEOUT_S,
        check=True,
        capture_output=True,
    )
    result = subprocess.run(
        [
            kcat,
            "-b",
            cluster.bootstrap,
            "-C",
            "-t",
            TOPIC,
            "-p",
            str(partition),
            "-o",
            str(start),
            "-c",
            str(len(lines)),
            "-e",
            "-f",
            "%o %k:%s %h\\n",
        ],
        timeout=CLIENT_TIMEOUT_S,
        check=True,
        capture_output=True,
    )
    assert result.stdout.decode().splitlines() == [
        f"{start + i} {line} via=kcat" for i, line in enumerate(lines)
    ]


# --- the raw protocol ----------------------------------------------------------------------------


def _batch(values: list[bytes], **kwargs: Any) -> bytes:
    return rb.build_batch([rb.Record(b"k", v, BASE_TS + i) for i, v in enumerate(values)], **kwargs)


def _roundtrip(port: int, request: Any, version: int, correlation_id: int = 1) -> bytes:
    request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id="raw")
    with socket.create_connection((HOST, port), timeout=CLIENT_TIMEOUT_S) as sock:
        sock.sendall(bytes(request.encode(version=version, header=True, framed=True)))
        frame = read_frame(sock)
    assert struct.unpack(">i", frame[:4])[0] == correlation_id
    return frame[4:]


def _produce_request(
    partition: int,
    batch: bytes,
    *,
    acks: int = -1,
    topic: str = TOPIC,
    transactional_id: str | None = None,
) -> Any:
    return ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout_ms=10_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(
                        index=partition, records=batch
                    )
                ],
            )
        ],
    )


def _produce_frame(batch: bytes, correlation_id: int, *, acks: int, client_id: str) -> bytes:
    """A whole Produce v7 request frame for partition 0 of TOPIC."""
    request = _produce_request(0, batch, acks=acks)
    request.API_VERSION = 7
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(version=7, header=True, framed=True))


def produce_raw(port: int, partition: int, batch: bytes, **fields: Any) -> Any:
    """One Produce v7 round trip; ``fields``: :func:`_produce_request`'s keywords."""
    request = _produce_request(partition, batch, **fields)
    return ProduceResponse.decode(_roundtrip(port, request, 7), version=7)


def _produce_errors(response: Any) -> list[int]:
    return [p.error_code for t in response.responses for p in t.partition_responses]


def fetch_raw(
    port: int,
    partition: int,
    offset: int,
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 1 << 20,
    session_id: int = 0,
    session_epoch: int = -1,
    version: int = 11,
) -> Any:
    partition_request = FetchRequest.FetchTopic.FetchPartition(
        partition=partition,
        current_leader_epoch=-1,
        fetch_offset=offset,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=session_id,
        session_epoch=session_epoch,
        topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=[partition_request])],
        forgotten_topics_data=[],
        rack_id="",
    )
    return FetchResponse.decode(_roundtrip(port, request, version), version=version)


def test_raw_produce_errors(cluster: Cluster) -> None:
    port0 = cluster.ports[0]
    assert _produce_errors(produce_raw(port0, 0, _batch([b"x"]), acks=2)) == [21]
    assert _produce_errors(produce_raw(port0, 0, _batch([b"x"]), topic="missing")) == [3]
    internal = produce_raw(port0, 0, _batch([b"x"]), topic="__consumer_offsets")
    assert _produce_errors(internal) == [17], "clients cannot append to the internal topic"
    assert _produce_errors(produce_raw(port0, 9, _batch([b"x"]))) == [3]
    assert _produce_errors(produce_raw(port0, 1, _batch([b"x"]))) == [6]  # broker 1 leads p1
    txn = _batch([b"x"], producer_id=7, producer_epoch=0, base_sequence=0, transactional=True)
    # A transactional batch needs the request's transactional id (Kafka's answer: 53). With one,
    # the first batch of a transaction on a partition is verified with the transaction
    # coordinator first (KIP-890); this gateway has none: the retriable 19, nothing appended.
    before = cluster.high_watermark(0)
    assert _produce_errors(produce_raw(port0, 0, txn)) == [53]
    assert _produce_errors(produce_raw(port0, 0, txn, transactional_id="tx")) == [19]
    assert cluster.high_watermark(0) == before
    # An idempotent batch is accepted, and its retry answered with the original offset.
    idempotent = _batch([b"x"], producer_id=7, producer_epoch=0, base_sequence=0)
    first, retry = produce_raw(port0, 0, idempotent), produce_raw(port0, 0, idempotent)
    assert _produce_errors(first) == _produce_errors(retry) == [0]
    assert (
        first.responses[0].partition_responses[0].base_offset
        == retry.responses[0].partition_responses[0].base_offset
    )
    start = cluster.high_watermark(0)
    ok = produce_raw(port0, 0, _batch([b"a", b"b", b"c"]))
    assert _produce_errors(ok) == [0]
    assert ok.responses[0].partition_responses[0].base_offset == start
    assert cluster.high_watermark(0) == start + 3


@pytest.mark.parametrize("acks", [1, -1])
def test_pipelined_produce_requests_keep_their_order(cluster: Cluster, acks: int) -> None:
    # One connection, many requests in flight: appended in request order, as Kafka does. With
    # acks=all the gateway sends the next batch on the replica's channel before the previous
    # one is acknowledged, and order still holds.
    count = 30
    frames = [
        _produce_frame(
            _batch([f"order-{i}".encode()] * (1 + i % 3)), i, acks=acks, client_id="pipeline"
        )
        for i in range(count)
    ]
    leader = cluster.leader_replica(0)
    calls_before = ray.get(leader.channel_stats.remote(), timeout=CALL_TIMEOUT_S)["calls_in"]
    with socket.create_connection((HOST, cluster.ports[0]), timeout=CLIENT_TIMEOUT_S) as sock:
        sock.sendall(b"".join(frames))
        responses = [read_frame(sock) for _ in range(count)]
    calls_after = ray.get(leader.channel_stats.remote(), timeout=CALL_TIMEOUT_S)["calls_in"]
    # The gateway's channel to the leader carried (most of) these appends, not Ray calls.
    assert calls_after - calls_before >= count // 2, (calls_before, calls_after)
    assert [struct.unpack(">i", r[:4])[0] for r in responses] == list(range(count))
    decoded = [ProduceResponse.decode(r[4:], version=7) for r in responses]
    assert all(_produce_errors(d) == [0] for d in decoded)
    offsets = [d.responses[0].partition_responses[0].base_offset for d in decoded]
    sizes = [1 + i % 3 for i in range(count)]
    assert offsets == [offsets[0] + sum(sizes[:i]) for i in range(count)]


def test_large_batches_reach_the_leader_by_reference(cluster: Cluster) -> None:
    """Large requests are received into the gateway's shared arena, and the leader
    appends each batch from there (actors/transport/arena.py): answers keep their order, the stored
    bytes are the sent ones, and every block is free again once its request is answered."""
    server = cluster.servers[0]
    arenas = server.arenas
    assert arenas is not None and arenas.current is not None
    leader = cluster.leader_replica(0)
    count = 12
    rng = random.Random(5)
    # Larger than the receive scratch (256 KiB), so that each is received in place.
    sent = [_batch([rng.randbytes(1000) for _ in range(500 + 20 * i)]) for i in range(count)]
    frames = [
        _produce_frame(batch, i, acks=-1, client_id="by-reference") for i, batch in enumerate(sent)
    ]
    with socket.create_connection((HOST, cluster.ports[0]), timeout=CLIENT_TIMEOUT_S) as sock:
        # Until the gateway's channel to the leader is up and the leader opened the arena,
        # batches go in the calls: warm up with the first batch until one went by reference.
        def shared() -> int:
            stats = ray.get(leader.channel_stats.remote(), timeout=CALL_TIMEOUT_S)
            return int(stats["shared_produces"])

        def warm_up() -> bool:
            sock.sendall(frames[0])
            (response,) = _produce_errors(ProduceResponse.decode(read_frame(sock)[4:], version=7))
            assert response == 0
            return shared() > shared_before

        shared_before = shared()
        wait_until(warm_up, timeout_s=CALL_TIMEOUT_S)
        shared_before = shared()
        for frame in frames:  # pipelined
            sock.sendall(frame)
        responses = [read_frame(sock) for _ in range(count)]
    assert [struct.unpack(">i", r[:4])[0] for r in responses] == list(range(count))
    decoded = [ProduceResponse.decode(r[4:], version=7) for r in responses]
    assert all(_produce_errors(d) == [0] for d in decoded)
    offsets = [d.responses[0].partition_responses[0].base_offset for d in decoded]
    assert shared() - shared_before == count  # every one by reference
    for offset, batch in zip(offsets, sent, strict=True):
        fetched = ray.get(leader.fetch.remote(offset, 1), timeout=CALL_TIMEOUT_S)
        ((pos, header),) = list(rb.iter_batches(fetched.records))
        stored = fetched.records[pos : pos + header.size]
        assert header.base_offset == offset and len(stored) == len(batch)
        # The leader stamps the base offset and its epoch; everything else is the client's.
        assert stored[8:12] == batch[8:12] and stored[16:] == batch[16:]
    wait_until(lambda: arenas.current.allocated_bytes == 0, timeout_s=CALL_TIMEOUT_S)


def test_failed_acks_0_produce_closes_the_connection(cluster: Cluster) -> None:
    request = _produce_request(1, _batch([b"x"]), acks=0)  # p1 is led by broker 1, not 0
    request.API_VERSION = 7
    request.with_header(correlation_id=1, client_id="raw")
    rejected_before = cluster.servers[0].connections_rejected
    with socket.create_connection((HOST, cluster.ports[0]), timeout=CLIENT_TIMEOUT_S) as sock:
        sock.sendall(bytes(request.encode(version=7, header=True, framed=True)))
        assert sock.recv(1) == b""  # closed, no response
    assert cluster.servers[0].connections_rejected == rejected_before  # not a misbehaving client


def test_raw_fetch_rules_and_long_poll(cluster: Cluster) -> None:
    port0 = cluster.ports[0]
    produce_raw(port0, 0, _batch([b"one"]))
    produce_raw(port0, 0, _batch([b"two"]))
    hw = cluster.high_watermark(0)

    response = fetch_raw(port0, 0, hw + 1000)
    assert response.error_code == 0 and response.session_id == 0
    assert response.responses[0].partitions[0].error_code == 1  # OFFSET_OUT_OF_RANGE
    # Before v11 only leaders serve consumers; from v11 a follower does (KIP-392).
    assert fetch_raw(port0, 1, 0, version=10).responses[0].partitions[0].error_code == 6
    assert fetch_raw(port0, 1, 0).responses[0].partitions[0].error_code == 0
    assert fetch_raw(port0, 0, 0, session_id=42, session_epoch=5).error_code == 70
    assert fetch_raw(port0, 0, 0, session_epoch=3).error_code == 71
    closing = fetch_raw(port0, 0, 0, session_id=42, session_epoch=-1)  # a full fetch
    assert closing.error_code == 0 and closing.session_id == 0
    assert closing.responses[0].partitions[0].records

    # max_bytes 1 still returns one whole batch (KIP-74), and only one.
    part = fetch_raw(port0, 0, hw - 2, max_bytes=1).responses[0].partitions[0]
    assert part.error_code == 0 and part.high_watermark == hw and part.last_stable_offset == hw
    assert part.aborted_transactions is None and part.preferred_read_replica == -1
    headers = [h for _, h in rb.iter_batches(bytes(part.records))]
    assert [(h.base_offset, h.records_count) for h in headers] == [(hw - 2, 1)]

    # Nothing to read: the answer waits max_wait_ms, no longer than bounded.
    began = time.monotonic()
    part = fetch_raw(port0, 0, hw, max_wait_ms=400).responses[0].partitions[0]
    waited = time.monotonic() - began
    assert part.error_code == 0 and not part.records
    assert 0.35 <= waited < 5.0, waited

    # Data arriving during the wait answers at once, long before max_wait_ms.
    def produce_later() -> None:
        produce_raw(port0, 0, _batch([b"late"]))

    began = time.monotonic()
    future: Future[Any] = Future()

    def fetch_in_thread() -> None:
        future.set_result(fetch_raw(port0, 0, hw, max_wait_ms=20_000))

    fetcher = threading.Thread(target=fetch_in_thread)
    fetcher.start()
    produce_later()
    part = future.result(timeout=CLIENT_TIMEOUT_S).responses[0].partitions[0]
    fetcher.join(timeout=CLIENT_TIMEOUT_S)
    assert time.monotonic() - began < 10.0
    assert [h.base_offset for _, h in rb.iter_batches(bytes(part.records))] == [hw]


def test_fetches_are_read_short_circuit_and_fall_back_when_that_does_not_hold(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway shares the replicas' Ray node here: it reads the batches the leader locates
    from its segment files. A read that does not hold (file gone, cut, damaged, other offsets,
    or a replica on another node) is never served: the gateway asks the replica for the bytes."""
    port0 = cluster.ports[0]
    backend = cluster.servers[0].backend
    start = cluster.high_watermark(0)
    for i in range(3):
        produce_raw(port0, 0, _batch([b"short-circuit %d" % i] * (i + 1)))
    wanted = ray.get(cluster.leader_replica(0).fetch.remote(start, 1 << 20), timeout=CALL_TIMEOUT_S)
    before = dataclasses.replace(backend.read_stats)
    part = fetch_raw(port0, 0, start).responses[0].partitions[0]
    assert bytes(part.records) == wanted.records and len(wanted.records) > 0
    assert backend.read_stats.local_bytes - before.local_bytes == len(wanted.records)
    assert backend.read_stats.ray_bytes == before.ray_bytes, "no record bytes from the replica"

    # Bytes no longer in the page cache are read in a thread, not on the event loop. (Evicted
    # after the replica located them: its header walk reads small batches into the cache.)
    name = replica_actor_name(TOPIC, 0, cluster.leaders[0][0])
    answer = ray.get(
        cluster.leader_replica(0).fetch_extents.remote(start, 1 << 20), timeout=CALL_TIMEOUT_S
    )
    for path in {path for path, _, _ in answer.extents.runs}:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)  # clean pages, which the advice drops
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    assert bytes(cluster.call(backend.replicas.read_located(name, answer))) == wanted.records
    if short_circuit._nowait_supported:
        assert backend.read_stats.disk_reads == before.disk_reads + 1

    # A read that fails here goes to the replica for the bytes; the client sees no difference.
    def fail(*_: Any, **__: Any) -> bytearray:
        raise OSError("gone")

    with monkeypatch.context() as patch:
        patch.setattr(short_circuit, "read_runs", fail)
        part = fetch_raw(port0, 0, start).responses[0].partitions[0]
    assert bytes(part.records) == wanted.records
    assert backend.read_stats.fallbacks == before.fallbacks + 1
    assert backend.read_stats.ray_bytes == before.ray_bytes + len(wanted.records)

    # What the leader locates, made wrong every way: never served.
    runs = answer.extents.runs
    path, position, size = runs[0]
    first = rb.parse_header(short_circuit.read_runs([(path, position, rb.HEADER_SIZE)]), 0)
    damaged = bytearray(Path(path).read_bytes())
    damaged[position + first.size - 2] ^= 0x10  # in the first located batch's last record
    copy = tmp_path / "damaged.log"
    copy.write_bytes(damaged)
    broken = {
        "missing": ((path + ".gone", position, size), *runs[1:]),
        "cut": ((path, os.path.getsize(path) - size // 2, size), *runs[1:]),
        "other offsets": ((path, position + first.size, size - first.size), *runs[1:]),
        "bit flip": ((str(copy), position, size), *runs[1:]),
    }
    fallbacks = backend.read_stats.fallbacks
    for case, bad_runs in broken.items():
        outcome = msgspec.structs.replace(answer, extents=answer.extents._replace(runs=bad_runs))
        assert cluster.call(backend.replicas.read_located(name, outcome)) is None, case
    assert backend.read_stats.fallbacks == fallbacks + len(broken)
    assert bytes(cluster.call(backend.replicas.read_located(name, answer))) == wanted.records
    elsewhere = msgspec.structs.replace(answer, node_id="another-node")
    assert cluster.call(backend.replicas.read_located("replica:x:0:9", elsewhere)) is None
    remote = backend.replicas.remote_replicas
    assert "replica:x:0:9" in remote and name not in remote


def test_raw_list_offsets_errors(cluster: Cluster) -> None:
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=1,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(
                name=TOPIC,
                partitions=[
                    ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=p, timestamp=-1
                    )
                    for p in (0, 1, 7)
                ],
            )
        ],
    )
    response = ListOffsetsResponse.decode(_roundtrip(cluster.ports[0], request, 3), version=3)
    partitions = response.topics[0].partitions
    assert [(p.partition_index, p.error_code) for p in partitions] == [(0, 0), (1, 6), (7, 3)]
    assert partitions[0].offset == cluster.high_watermark(0)


# --- the fetch budget, without Ray ----------------------------------------------------------------


def test_fetch_budget_keeps_whole_batches_in_request_order() -> None:
    from raylog.gateway.handlers.fetch import _apply_budget

    a1, a2 = _batch([b"a" * 100]), _batch([b"b" * 100])
    c1 = _batch([b"c" * 100])
    size = len(a1)
    both = [a1 + a2, b"", c1]
    assert _apply_budget(both, 10 * size) == both  # within budget: untouched
    assert _apply_budget(both, 1) == [a1, b"", b""]  # the first batch always goes
    assert _apply_budget(both, 2 * size) == [a1 + a2, b"", b""]
    assert _apply_budget(both, 2 * size + size - 1) == [a1 + a2, b"", b""]
    assert _apply_budget([b"", a1 + a2, c1], size + 1) == [b"", a1, b""]


def _long_poll_run(min_bytes: int, arrivals: dict[int, list[bytes]], max_wait_s: float) -> Any:
    """``fetch._long_poll`` over two partitions whose replicas answer as a replica does: at
    once when they hold more than ``wait_for_bytes``, else when data arrives or the wait ends.
    ``arrivals[p]`` is appended to partition p's data one item per 10 ms."""
    from raylog.gateway.backend import FetchResult
    from raylog.gateway.handlers.fetch import _long_poll, _Wanted

    async def run() -> tuple[list[FetchResult], list[tuple[int, int]]]:
        data = {0: b"", 1: b""}
        changed = asyncio.Event()
        calls: list[tuple[int, int]] = []

        async def read(w: _Wanted, wait_ms: int, wait_for_bytes: int) -> FetchResult:
            calls.append((w.partition, wait_for_bytes))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait_ms / 1000
            while len(data[w.partition]) < wait_for_bytes and loop.time() < deadline:
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), deadline - loop.time())
            return FetchResult(0, 0, 0, 0, data[w.partition])

        async def feed() -> None:
            for p, items in arrivals.items():
                for item in items:
                    await asyncio.sleep(0.01)
                    data[p] += item
                    changed.set()

        wanted = [_Wanted(TOPIC, p, 0, 1 << 20, -1) for p in (0, 1)]
        results = [FetchResult(0, 0, 0, 0, b""), FetchResult(0, 0, 0, 0, b"")]
        feeder = asyncio.ensure_future(feed())
        deadline = asyncio.get_running_loop().time() + max_wait_s
        await asyncio.wait_for(_long_poll(wanted, results, read, min_bytes, deadline), 20)
        feeder.cancel()
        return results, calls

    return asyncio.run(run())


def test_long_poll_sums_partitions_toward_min_bytes() -> None:
    # Neither partition alone reaches min_bytes=10; together they do, and the poll ends then
    # (not at its 60 s max wait, which the 20 s bound in _long_poll_run would turn into a failure).
    results, calls = _long_poll_run(10, {0: [b"x" * 6], 1: [b"y" * 6]}, max_wait_s=60)
    assert [len(r.records) for r in results] == [6, 6]
    # p0 answered first with 6 bytes; re-issued, it waits for more than those 6 (not at once).
    assert calls == [(0, 1), (1, 1), (0, 7)]


def test_an_idle_partition_costs_one_call_per_long_poll() -> None:
    results, calls = _long_poll_run(1, {}, max_wait_s=0.3)
    assert [r.records for r in results] == [b"", b""]
    assert sorted(calls) == [(0, 1), (1, 1)]  # one waiting call each, no re-issue
