"""Describe/AlterClientQuotas (48, 49) at the gateway's unit layer (with their authorization:
DESCRIBE_CONFIGS / ALTER_CONFIGS on the cluster), and quotas enforced on a live
gateway (real server and sockets, in-memory backend, no Ray).

Proves: entries with Kafka's wire shapes (a null name is the default entity) are stored and
described back, with per-entry errors and validate_only; a bad filter is the response's error;
over TCP, kafka-python's admin transport sends both APIs at the advertised versions; and two
kafka-python producers with different client ids produce through one gateway where one client id
has a low producer_byte_rate: that one's responses carry throttle_time_ms > 0 (its
``throttle-time-max`` metric), the other's are all 0, and the gateway's measurements say so;
a throttled connection's next request is not read before its throttle time has passed; a Fetch
over its consumer_byte_rate is answered with its throttle time and no data.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from support.admin_backend import AdminMemory, roundtrip
from support.authorization import allow, as_alice
from support.gateway import InMemoryBackend, LiveGateway, api_versions_v0_frame, read_frame
from support.kafka_batches import kafka_batch

from raylog.actors.control import metadata as md_
from raylog.actors.control.acls import CLUSTER_NAME, AclOperation, ResourceType
from raylog.gateway.backend import (
    ClientQuotaEntry,
    FetchResult,
    PartitionFetch,
    PartitionState,
    ProduceResult,
    TopicState,
)
from raylog.gateway.errors import ErrorCode
from raylog.gateway.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, ClientQuotas

_AEntry = AlterClientQuotasRequest.EntryData
_Component = DescribeClientQuotasRequest.ComponentData


def alter_request(
    entries: list[tuple[dict[str, str | None], dict[str, float | None]]], validate_only=False
):
    return AlterClientQuotasRequest(
        entries=[
            _AEntry(
                entity=[
                    _AEntry.EntityData(entity_type=t, entity_name=n) for t, n in entity.items()
                ],
                ops=[
                    _AEntry.OpData(key=k, value=v or 0.0, remove=v is None) for k, v in ops.items()
                ],
            )
            for entity, ops in entries
        ],
        validate_only=validate_only,
    )


def describe_request(components: list[tuple[str, int, str | None]], strict: bool = False):
    return DescribeClientQuotasRequest(
        components=[_Component(entity_type=t, match_type=m, match=s) for t, m, s in components],
        strict=strict,
    )


def described(response: Any) -> list[tuple[dict[str, str | None], dict[str, float]]]:
    return [
        (
            {e.entity_type: e.entity_name for e in entry.entity},
            {v.key: v.value for v in entry.values},
        )
        for entry in response.entries
    ]


@pytest.mark.parametrize("version", [0, 1])
def test_alter_and_describe(version: int) -> None:
    backend = AdminMemory()
    request = alter_request(
        [
            ({"user": "alice", "client-id": None}, {"producer_byte_rate": 1024}),
            ({"client-id": "app"}, {"consumer_byte_rate": 2048, "request_percentage": 50}),
            ({"user": "bob"}, {"producer_byte_rate": -1}),
            ({"ip": "127.0.0.1"}, {"producer_byte_rate": 1}),
        ]
    )
    response = roundtrip(backend, request, version, AlterClientQuotasResponse)
    codes = [(e.error_code, e.error_message) for e in response.entries]
    assert codes[:2] == [(0, None), (0, None)]
    assert codes[2] == (42, "Quota producer_byte_rate must be greater than 0")
    assert codes[3][0] == 35
    assert [(e.entity_type, e.entity_name) for e in response.entries[0].entity] == [
        ("user", "alice"),
        ("client-id", None),
    ]
    found = roundtrip(backend, describe_request([]), 1, DescribeClientQuotasResponse)
    assert found.error_code == 0
    assert described(found) == [
        ({"client-id": "app"}, {"consumer_byte_rate": 2048.0, "request_percentage": 50.0}),
        ({"user": "alice", "client-id": None}, {"producer_byte_rate": 1024.0}),
    ]
    only_alice = describe_request([("user", 0, "alice")], strict=True)
    assert described(roundtrip(backend, only_alice, 1, DescribeClientQuotasResponse)) == []
    defaults = describe_request([("user", 0, "alice"), ("client-id", 1, None)], strict=True)
    assert len(described(roundtrip(backend, defaults, 1, DescribeClientQuotasResponse))) == 1
    # Removing the last value removes the entity; validate_only changes nothing.
    remove = alter_request([({"client-id": "app"}, {"producer_byte_rate": 5})], True)
    roundtrip(backend, remove, version, AlterClientQuotasResponse)
    remove = alter_request(
        [({"client-id": "app"}, {"consumer_byte_rate": None, "request_percentage": None})]
    )
    roundtrip(backend, remove, version, AlterClientQuotasResponse)
    assert [(q.user, q.client_id) for q in backend.md.client_quotas] == [("alice", "<default>")]


def test_a_bad_filter_is_the_responses_error() -> None:
    bad = describe_request([("user", 0, None)])
    response = roundtrip(AdminMemory(), bad, 1, DescribeClientQuotasResponse)
    assert response.error_code == 42 and response.entries is None
    assert "MATCH_TYPE_EXACT" in response.error_message


# --- on a live gateway ---------------------------------------------------------------------

TOPIC = "q"


@dataclass
class QuotaBackend(InMemoryBackend):
    """One topic with one partition that keeps nothing, and the client quotas of a
    ClusterMetadata, handed to the gateway's quotas as the actor's metadata poll does."""

    quotas: ClientQuotas | None = field(default_factory=ClientQuotas)
    md: md_.ClusterMetadata = field(default_factory=lambda: md_.ClusterMetadata(cluster_id="t"))
    appended: int = 0

    def __post_init__(self) -> None:
        self.topic_states[TOPIC] = TopicState(TOPIC, [PartitionState(0, 1, 0, [1], [1], [])])

    async def produce(
        self, topic: str, partition: int, records: Any, acks: int, timeout_ms: int, on_sent=None
    ) -> ProduceResult:
        base = self.appended
        self.appended += 1
        return ProduceResult(0, base, -1, 0)

    async def fetch(self, topic: str, partition: int, read: PartitionFetch) -> FetchResult:
        return FetchResult(0, self.appended, self.appended, 0, b"")

    # As AdminMemory's: over ``md``, handing the result to ``quotas``.
    alter_client_quotas = AdminMemory.alter_client_quotas
    describe_client_quotas = AdminMemory.describe_client_quotas


@pytest.fixture
def live() -> Iterator[LiveGateway]:
    backend = QuotaBackend()
    gateway = LiveGateway(backend, quotas=backend.quotas)
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


def throttle_time_max(producer: KafkaProducer) -> float:
    found: Mapping[str, Mapping[str, float]] = producer.metrics()
    return max(
        (v for group in found.values() for k, v in group.items() if k == "throttle-time-max"),
        default=0.0,
    )


def produce(bootstrap: str, client_id: str, count: int, size: int) -> KafkaProducer:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        enable_idempotence=False,
        acks=1,
        linger_ms=0,
    )
    for _ in range(count):
        producer.send(TOPIC, b"x" * size).get(timeout=30)
    return producer


def test_only_the_client_over_its_producer_byte_rate_is_throttled(live: LiveGateway) -> None:
    admin = KafkaAdminClient(bootstrap_servers=live.bootstrap, client_id="admin")
    try:
        # 10 kB/s for client id "slow": 100 kB are free in the first 10 s (11 samples of 1 s),
        # so ~110 kB in a few seconds is throttled for a few hundred ms at a time.
        request = alter_request([({"client-id": "slow"}, {PRODUCER_BYTE_RATE: 10_000})])
        response = admin._manager.run(admin._manager.send, request)
        assert [e.error_code for e in response.entries] == [0]
        response = admin._manager.run(admin._manager.send, describe_request([]))
        assert described(response) == [({"client-id": "slow"}, {PRODUCER_BYTE_RATE: 10_000.0})]
    finally:
        admin.close()
    slow = produce(live.bootstrap, "slow", 55, 2_000)
    fast = produce(live.bootstrap, "fast", 55, 2_000)
    try:
        assert throttle_time_max(slow) > 0
        assert throttle_time_max(fast) == 0
    finally:
        slow.close()
        fast.close()
    rows = live.server.quotas.metrics(int(time.monotonic() * 1000))[PRODUCER_BYTE_RATE]
    by_client = {r["client_id"]: r for r in rows}
    assert by_client["slow"]["throttled"] > 0 and by_client["slow"]["quota"] == 10_000
    assert by_client["fast"]["throttled"] == 0 and by_client["fast"]["quota"] is None


def test_a_throttled_connection_is_muted_for_the_throttle_time(live: LiveGateway) -> None:
    # KIP-219: the response goes out at once, then nothing more is read from the connection for
    # throttle_time_ms. A lower bound only: the next request's answer cannot come sooner.
    batch = kafka_batch(
        [{"key": None, "value": b"m" * 10_000, "timestamp": 0, "headers": []}], codec=0
    )
    # The batch is 10.3 x the quota: over the first 10 s, 3 % above it, throttled ~300 ms.
    quota = round(len(batch) / 10.3)
    backend = live.backend
    assert isinstance(backend, QuotaBackend)
    live.call(
        backend.alter_client_quotas(
            [ClientQuotaEntry([("client-id", "raw")], [(PRODUCER_BYTE_RATE, quota, False)])], False
        )
    )
    produce = ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout_ms=5_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=TOPIC,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)
                ],
            )
        ],
    )
    produce.API_VERSION = 7
    produce.with_header(correlation_id=1, client_id="raw")
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(bytes(produce.encode(version=7, header=True, framed=True)))
        answer = ProduceResponse.decode(read_frame(sock)[4:], version=7)
        answered = time.monotonic()
        assert answer.throttle_time_ms >= 100
        sock.sendall(api_versions_v0_frame(2, client_id="raw"))
        read_frame(sock)
        waited_ms = (time.monotonic() - answered) * 1000
    assert waited_ms >= answer.throttle_time_ms * 0.8


def test_quota_apis_need_describe_configs_and_alter_configs_on_the_cluster() -> None:
    backend = AdminMemory()
    request = alter_request([({"client-id": "app"}, {"producer_byte_rate": 1024})])
    denied = roundtrip(backend, request, 1, AlterClientQuotasResponse, **as_alice())
    assert [e.error_code for e in denied.entries] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
    assert backend.md.client_quotas == ()
    refused = roundtrip(
        backend, describe_request([]), 1, DescribeClientQuotasResponse, **as_alice()
    )
    assert refused.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    alter_configs = as_alice(allow(ResourceType.CLUSTER, CLUSTER_NAME, AclOperation.ALTER_CONFIGS))
    done = roundtrip(backend, request, 1, AlterClientQuotasResponse, **alter_configs)
    assert [e.error_code for e in done.entries] == [0]
    # ALTER_CONFIGS implies DESCRIBE_CONFIGS, as in Kafka.
    found = roundtrip(
        backend, describe_request([]), 1, DescribeClientQuotasResponse, **alter_configs
    )
    assert described(found) == [({"client-id": "app"}, {"producer_byte_rate": 1024.0})]


@dataclass
class FetchingBackend(QuotaBackend):
    """QuotaBackend whose partition always answers a Fetch with ``data``."""

    data: bytes = b"f" * 5_000

    async def fetch(self, topic: str, partition: int, read: PartitionFetch) -> FetchResult:
        return FetchResult(0, 1, 1, 0, self.data)


def test_a_fetch_over_the_consumer_byte_rate_gets_its_throttle_time_and_no_data() -> None:
    # As Kafka's handleFetchRequest: the throttled response is empty and its bytes do not count.
    backend = FetchingBackend()
    assert backend.quotas is not None
    backend.quotas.update([((None, "t"), {CONSUMER_BYTE_RATE: 800.0})])  # 8 kB per first 10 s
    topics = [
        FetchRequest.FetchTopic(
            topic=TOPIC,
            partitions=[
                FetchRequest.FetchTopic.FetchPartition(
                    partition=0,
                    current_leader_epoch=-1,
                    fetch_offset=0,
                    log_start_offset=-1,
                    partition_max_bytes=1 << 20,
                )
            ],
        )
    ]

    def fetch() -> Any:
        request = FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=topics,
            forgotten_topics_data=[],
            rack_id="",
        )
        return roundtrip(backend, request, 11, FetchResponse, quotas=backend.quotas)

    first = fetch()  # 5 kB: within 8 kB
    assert first.throttle_time_ms == 0
    assert len(first.responses[0].partitions[0].records) == 5_000
    # 10 kB: 1000 B/s over 10 s (plus the time between the two), (1000 - 800) / 800 x 10 s.
    second = fetch()
    assert 2_000 < second.throttle_time_ms <= 2_500
    assert second.responses == []
    rows = backend.quotas.metrics(0)[CONSUMER_BYTE_RATE]
    assert [(r["client_id"], r["total"], r["throttled"]) for r in rows] == [("t", 5_000, 1)]
