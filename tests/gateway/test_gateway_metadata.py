"""The Metadata handler (v1-5) against the in-memory backend, decoded by the client's codec.

Proves: every broker, the controller and (v2+) the cluster id come from the backend; a null
topic list means all topics and an empty one none; an unknown topic is error 3 with no
partitions and is never created; a leaderless partition, or one whose leader is not a live
broker, is error 5 with leader -1; replicas, ISR and (v5) offline replicas pass through.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from support.gateway import CLUSTER_ID, InMemoryBackend, sample_topics

from raylog.gateway.backend import Backend, PartitionState, TopicState
from raylog.gateway.handlers import HANDLERS, RequestContext, advertised_versions
from raylog.gateway.protocol import Connection, Request


def metadata(version: int, topics: list[str] | None, backend: InMemoryBackend) -> Any:
    request = MetadataRequest(
        topics=None
        if topics is None
        else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
        allow_auto_topic_creation=True,  # ignored: raylog never auto-creates
    )
    request.API_VERSION = version
    request.with_header(correlation_id=version, client_id="t")
    connection = Connection(advertised_versions())
    connection.receive_data(bytes(request.encode(version=version, header=True, framed=True)))
    event = connection.next_event()
    assert isinstance(event, Request)
    context = RequestContext(backend, advertised_versions(), "test")
    response = asyncio.run(HANDLERS[3](context, event))
    data = bytes(connection.send(event, response))
    assert int.from_bytes(data[4:8], "big") == version  # correlation id
    return MetadataResponse.decode(data[8:], version=version)


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_all_topics(version: int) -> None:
    backend = InMemoryBackend(port=9092, topic_states=sample_topics())
    response = metadata(version, None, backend)
    assert [(b.node_id, b.host, b.port, b.rack) for b in response.brokers] == [
        (1, "127.0.0.1", 9092, "rack-1"),
        (2, "127.0.0.1", 9092, "rack-2"),
        (3, "127.0.0.1", 9092, "rack-3"),
    ]
    assert response.controller_id == 1
    if version >= 2:
        assert response.cluster_id == CLUSTER_ID
    topics = {t.name: t for t in response.topics}
    assert set(topics) == {"orders", "events"}
    orders = topics["orders"]
    assert orders.error_code == 0
    assert [(p.partition_index, p.leader_id, p.error_code) for p in orders.partitions] == [
        (0, 1, 0),
        (1, 2, 0),
        (2, 3, 0),
    ]
    leaderless = topics["events"].partitions[1]
    assert (leaderless.error_code, leaderless.leader_id) == (5, -1)
    assert leaderless.replica_nodes == [1, 3] and leaderless.isr_nodes == []
    if version >= 5:
        assert leaderless.offline_replicas == [1, 3]


def test_named_unknown_and_empty() -> None:
    backend = InMemoryBackend(topic_states=sample_topics())
    response = metadata(4, ["nope", "orders", "nope"], backend)
    assert [(t.name, t.error_code, len(t.partitions)) for t in response.topics] == [
        ("nope", 3, 0),
        ("orders", 0, 3),
    ]
    assert "nope" not in backend.topic_states  # no auto-creation
    assert metadata(4, [], backend).topics == []


def test_leader_not_among_live_brokers_is_leaderless() -> None:
    gone = TopicState("t", [PartitionState(0, 9, 3, [9, 1], [9, 1], [])])
    response = metadata(5, ["t"], InMemoryBackend(topic_states={"t": gone}))
    partition = response.topics[0].partitions[0]
    assert (partition.error_code, partition.leader_id) == (5, -1)


def test_in_memory_backend_satisfies_the_protocol() -> None:
    assert isinstance(InMemoryBackend(), Backend)
