"""The gateway's routing decisions (gateway/routing.py), pure, and the listener that waits.

Proves:
- a view that has not been given the cluster's topics is not current, and every partition
  routed through it is LEADER_NOT_AVAILABLE (5), never UNKNOWN_TOPIC_OR_PARTITION (3): a
  starting broker never tells a client that an existing topic does not exist (issue 31);
- once given topics (even none) the view is current: an absent partition is 3, one led
  elsewhere NOT_LEADER_OR_FOLLOWER (6), one led here 0; a view built with topics is current;
- ``partition_leader`` (where transaction markers go): 5 before the view is current, 3 for an
  absent partition, 5 for a leaderless one, else the leader;
- a ``GatewayServer`` started with ``serve=False`` holds its port but refuses connections
  until ``start_serving``, and then answers requests.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from support.gateway import HOST, InMemoryBackend, raw_api_versions_roundtrip, sample_topics

from raylog.gateway.errors import ErrorCode
from raylog.gateway.routing import MetadataView, leader_error, partition_leader, replica_error
from raylog.gateway.server import GatewayServer

THIS_BROKER = 2


def test_a_view_without_topics_yet_answers_leader_not_available_for_every_partition() -> None:
    view = MetadataView(THIS_BROKER, "c")
    assert not view.current
    view.update(controller_id=1)  # brokers or a controller alone do not make it current
    assert not view.current
    for topic, partition in (("orders", 0), ("events", 1), ("no-such-topic", 0)):
        assert leader_error(view, topic, partition) == ErrorCode.LEADER_NOT_AVAILABLE
        assert replica_error(view, topic, partition) == ErrorCode.LEADER_NOT_AVAILABLE
        assert partition_leader(view, topic, partition) == (ErrorCode.LEADER_NOT_AVAILABLE, -1)


def test_a_current_view_routes_by_its_topics() -> None:
    view = MetadataView(THIS_BROKER, "c")
    view.update(topics={})
    assert view.current  # a cluster without topics is known too
    assert leader_error(view, "orders", 0) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    view.update(topics=sample_topics())
    # orders: partition p led by broker 1 + p % 3; events 1 leaderless, replicas [1, 3].
    assert leader_error(view, "orders", 1) == ErrorCode.NONE
    assert leader_error(view, "orders", 0) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert leader_error(view, "orders", 3) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert leader_error(view, "no-such-topic", 0) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert replica_error(view, "orders", 0) == ErrorCode.NONE  # a follower here
    assert replica_error(view, "events", 1) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert MetadataView(THIS_BROKER, "c", topics=sample_topics()).current


def test_partition_leader_once_current() -> None:
    view = MetadataView(THIS_BROKER, "c", topics=sample_topics())
    assert partition_leader(view, "orders", 2) == (ErrorCode.NONE, 3)
    assert partition_leader(view, "events", 1) == (ErrorCode.LEADER_NOT_AVAILABLE, -1)
    assert partition_leader(view, "gone", 0) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(5.0)
        try:
            sock.connect((HOST, port))
        except ConnectionRefusedError:
            return True
    return False


def test_a_server_bound_without_serving_refuses_connections_until_it_serves() -> None:
    async def scenario() -> None:
        server = GatewayServer(InMemoryBackend())
        port = await server.start(HOST, 0, serve=False)
        try:
            assert not server.serving
            assert await asyncio.to_thread(_refused, port)
            with socket.socket() as other, pytest.raises(OSError):
                other.bind((HOST, port))  # the port is held all the same
            await server.start_serving()
            await server.start_serving()  # idempotent
            assert server.serving
            answer = await asyncio.to_thread(raw_api_versions_roundtrip, port)
            assert answer[:4] == (7).to_bytes(4, "big")  # the correlation id: answered
        finally:
            await server.stop()

    asyncio.run(scenario())
