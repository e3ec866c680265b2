"""KIP-392 follower fetching on `raylog up` (three brokers: 1 in rack a, 2 in rack b, 3 in c).

Topic ``near`` has one partition with replicas [1, 2, 3] (created with a manual assignment
through the admin API), so broker 1 (rack a) leads it and broker 2 is its follower in rack b.

Proves, on the wire:
- the leader answers a Fetch v11 from a rack-b client with ``preferred_read_replica`` = 2, no
  records and at once (no long poll), and serves a rack-a client (or one without a rack)
  itself;
- broker 2's gateway serves a Fetch v11 from its follower replica, records included, below its
  high watermark; it still answers Fetch v10 (no client metadata) and Produce with
  NOT_LEADER_OR_FOLLOWER;
and with a real client:
- a confluent-kafka consumer with ``client.rack=b`` reads every record, and its own statistics
  show Fetch requests sent to broker 2; without ``client.rack`` it never fetches from broker 2.

Without Ray, the Fetch handler passes ``rack_id`` to the backend from v11 only (None before),
and answers at once when a partition names a preferred read replica.

On the session's shared `raylog up` (tests/conftest.py), whose brokers sit in those racks.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from support.cluster import UpProcess
from support.waiting import wait_until

from raylog.gateway.backend import FetchResult, PartitionFetch
from raylog.gateway.handlers import HANDLERS, RequestContext, advertised_versions
from raylog.gateway.protocol import Connection, Request

pytestmark = pytest.mark.slow

TOPIC = "near"
RECORDS = 50
TIMEOUT_S = 60.0
LEADER, FOLLOWER = 1, 2  # brokers in racks a and b


@pytest.fixture(scope="module")
def up(shared_up: UpProcess) -> UpProcess:
    """The shared cluster with topic ``near`` (deleted by ``shared_up`` at the end)."""
    admin = AdminClient({"bootstrap.servers": shared_up.bootstrap})
    topic = NewTopic(TOPIC, num_partitions=1, replica_assignment=[[LEADER, FOLLOWER, 3]])
    admin.create_topics([topic], operation_timeout=30)[TOPIC].result(timeout=TIMEOUT_S)
    # The new topic's replica actors may take a while to start on a loaded machine; the
    # producer retries NOT_LEADER_OR_FOLLOWER meanwhile.
    producer = Producer(
        {"bootstrap.servers": shared_up.bootstrap, "acks": "all", "message.timeout.ms": 120000}
    )
    failed: list[Any] = []
    for i in range(RECORDS):
        producer.produce(
            TOPIC, str(i).encode(), on_delivery=lambda err, _m: err and failed.append(err)
        )
    assert producer.flush(180) == 0 and not failed, failed
    return shared_up


def _port(up: UpProcess, broker_id: int) -> int:
    return up.port + broker_id - 1


def _roundtrip(port: int, request: Any, version: int) -> bytes:
    request.API_VERSION = version
    request.with_header(correlation_id=5, client_id="raw")
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        sock.sendall(bytes(request.encode(version=version, header=True, framed=True)))
        size = struct.unpack(">i", _read(sock, 4))[0]
        frame = _read(sock, size)
    return frame[4:]


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


def _fetch(port: int, version: int, rack_id: str, max_wait_ms: int = 0) -> Any:
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=0,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=1 << 20,  # more than there is: only an early answer returns before the wait
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=[partition])],
        forgotten_topics_data=[],
        rack_id=rack_id,
    )
    (topic,) = FetchResponse.decode(_roundtrip(port, request, version), version=version).responses
    (answer,) = topic.partitions
    return answer


def test_brokers_and_leadership(up: UpProcess) -> None:
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)])
    response = MetadataResponse.decode(_roundtrip(up.port, request, 5), version=5)
    assert {b.node_id: b.rack for b in response.brokers} == {1: "a", 2: "b", 3: "c"}
    (partition,) = response.topics[0].partitions
    assert (partition.leader_id, partition.replica_nodes) == (LEADER, [1, 2, 3])


def test_leader_points_a_rack_b_client_at_the_follower(up: UpProcess) -> None:
    started = time.monotonic()
    answer = _fetch(_port(up, LEADER), 11, "b", max_wait_ms=5000)
    assert time.monotonic() - started < 4.0  # answered at once, not after the long poll
    assert (answer.error_code, answer.preferred_read_replica) == (0, FOLLOWER)
    assert not answer.records and answer.high_watermark == RECORDS
    for rack in ("a", ""):
        served = _fetch(_port(up, LEADER), 11, rack)
        assert (served.error_code, served.preferred_read_replica) == (0, -1)
        assert served.records


def test_follower_serves_v11_only(up: UpProcess) -> None:
    # The follower learns the high watermark from its next fetch from the leader.
    served = wait_until(
        lambda: (a := _fetch(_port(up, FOLLOWER), 11, "b")).high_watermark == RECORDS and a,
        timeout_s=TIMEOUT_S,
        interval_s=0.1,
        message="the follower's high watermark reaching the leader's",
    )
    assert (served.error_code, served.preferred_read_replica) == (0, -1)
    assert served.records
    assert _fetch(_port(up, FOLLOWER), 10, "").error_code == 6
    # A valid batch to write: the first stored batch just served (baseOffset 0, 12-byte
    # log overhead plus its batchLength).
    (length,) = struct.unpack_from(">i", served.records, 8)
    batch = served.records[: 12 + length]
    partition = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)
    produce = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=1000,
        topic_data=[ProduceRequest.TopicProduceData(name=TOPIC, partition_data=[partition])],
    )
    response = ProduceResponse.decode(_roundtrip(_port(up, FOLLOWER), produce, 7), version=7)
    assert response.responses[0].partition_responses[0].error_code == 6


def _consume_all(up: UpProcess, extra: dict[str, Any]) -> tuple[list[bytes], dict[int, int]]:
    """Every record from offset 0, and the Fetch requests the client sent to each broker."""
    stats: list[dict[str, Any]] = []
    consumer = Consumer(
        {
            "bootstrap.servers": up.bootstrap,
            "group.id": "unused",  # assign() only: no group requests are sent
            "enable.auto.commit": False,
            "statistics.interval.ms": 100,
            "stats_cb": lambda text: stats.append(json.loads(text)),
            **extra,
        }
    )
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        # One more statistics report after the last record.
        seen = len(stats)
        while len(stats) <= seen and time.monotonic() < deadline:
            consumer.poll(0.1)
    finally:
        consumer.close()
    assert stats, "no statistics from librdkafka"
    brokers = stats[-1]["brokers"].values()
    fetches = {b["nodeid"]: b["req"].get("Fetch", 0) for b in brokers if b["nodeid"] > 0}
    return values, fetches


def test_rack_b_consumer_reads_from_the_follower(up: UpProcess) -> None:
    values, fetches = _consume_all(up, {"client.rack": "b"})
    assert values == [str(i).encode() for i in range(RECORDS)]
    assert fetches.get(FOLLOWER, 0) > 0, fetches
    values, fetches = _consume_all(up, {})
    assert values == [str(i).encode() for i in range(RECORDS)]
    assert fetches.get(FOLLOWER, 0) == 0, fetches


class _PreferringBackend:
    """A backend whose partition 0 is always better read from broker 2; records the racks."""

    def __init__(self) -> None:
        self.racks: list[str | None] = []

    async def fetch(self, topic: str, partition: int, read: PartitionFetch) -> FetchResult:
        self.racks.append(read.rack_id)
        return FetchResult(0, 10, 10, 0, b"", preferred_read_replica=2)


@pytest.mark.parametrize(("version", "rack_sent"), [(10, None), (11, "b")])
def test_fetch_handler_answers_a_preferred_replica_at_once(
    version: int, rack_sent: str | None
) -> None:
    backend = _PreferringBackend()
    connection = Connection(advertised_versions())
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )  # fmt: skip
    request = FetchRequest(
        replica_id=-1, max_wait_ms=10_000, min_bytes=1 << 20, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=[partition])],
        forgotten_topics_data=[], rack_id="b",
    )  # fmt: skip
    request.API_VERSION = version
    request.with_header(correlation_id=1, client_id="t")
    connection.receive_data(bytes(request.encode(version=version, header=True, framed=True)))
    event = connection.next_event()
    assert isinstance(event, Request)
    context = RequestContext(backend, advertised_versions(), "test")  # type: ignore[arg-type]
    started = time.monotonic()
    response = asyncio.run(HANDLERS[1](context, event))
    assert time.monotonic() - started < 5.0  # not the 10 s long poll
    assert backend.racks == [rack_sent]
    assert response.responses[0].partitions[0].preferred_read_replica == 2
