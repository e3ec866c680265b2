"""CreateTopics through the gateway's handler and ``ControllerAdmin`` against real controllers
and brokers on Ray (``support.controller_cluster``): Kafka's timeout semantics.

Proves:
- ``timeout_ms`` <= 0: NONE as soon as the controller committed the topic, before its replicas
  serve;
- ``timeout_ms`` > 0: NONE only once every partition's leader serves: at the answer the
  controller's readiness is done and an acks=all produce to every partition succeeds at once;
- a ``timeout_ms`` too short for replicas to start: not a failure (Kafka's CreateTopics
  succeeds once the topic is created): NONE once this broker's metadata shows the topic, else
  REQUEST_TIMED_OUT saying it is not there yet; either way the topic stays, and its creation
  goes on until every partition serves;
- no active controller to be found after the topic was created (a failover on a loaded
  machine): still NONE once every partition serves, not NOT_CONTROLLER.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from support.admin_backend import answer
from support.controller_cluster import ControllerCluster, cluster_fixture
from support.waiting import wait_until

from raylog.gateway.actor import client_view
from raylog.gateway.admin import ControllerAdmin
from raylog.gateway.errors import ErrorCode
from raylog.gateway.routing import MetadataView

pytestmark = pytest.mark.slow

PREFIX = "create-topics-test"
# Heartbeats every 100 ms carry role commands fast; the session is Kafka's default (9 s): a
# 3 s one lapsed a broker's lease while a wide creation's replica processes started on 2 cores.
BROKER_CONFIGS = {"broker.heartbeat.interval.ms": "100", "broker.session.timeout.ms": "9000"}
VIEW_POLL_S = 0.05
SERVE_WAIT_S = 120.0


@pytest.fixture(scope="module")
def cluster(
    ray_local: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerCluster]:
    root = tmp_path_factory.mktemp("create-topics")
    yield from cluster_fixture(ControllerCluster(root, PREFIX, BROKER_CONFIGS))


class Locator:
    """The active controller, as the gateway actor finds it; with ``gap`` set, none is found
    ``gap`` times in a row after the first lookup (as during a failover)."""

    def __init__(self, cluster: ControllerCluster, gap: int = 0) -> None:
        self.cluster = cluster
        self.gap = gap
        self.lookups = 0

    async def active_controller(self, refresh: bool = False) -> Any:
        self.lookups += 1
        if 1 < self.lookups <= 1 + self.gap:
            return None
        return await asyncio.to_thread(self.cluster.active)


@contextlib.asynccontextmanager
async def gateway_admin(cluster: ControllerCluster, gap: int = 0) -> AsyncIterator[ControllerAdmin]:
    """A ControllerAdmin whose metadata view follows the controller's, as a gateway's does."""
    view = MetadataView(1, "c")

    async def follow() -> None:
        while True:  # cancelled at the end
            md = await asyncio.to_thread(cluster.call, "metadata")
            brokers, topics = client_view(md)
            view.update(brokers=brokers, topics=topics)
            await asyncio.sleep(VIEW_POLL_S)

    task = asyncio.create_task(follow())
    try:
        yield ControllerAdmin(view, Locator(cluster, gap))
    finally:
        task.cancel()


def create(
    cluster: ControllerCluster, name: str, partitions: int, timeout_ms: int, gap: int = 0
) -> Any:
    async def run() -> Any:
        async with gateway_admin(cluster, gap) as admin:
            topic = CreateTopicsRequest.CreatableTopic(
                name=name,
                num_partitions=partitions,
                replication_factor=3,
                assignments=[],
                configs=[],
            )
            request = CreateTopicsRequest(
                topics=[topic], timeout_ms=timeout_ms, validate_only=False
            )
            response = await answer(admin, request, 4, CreateTopicsResponse)
            return response.topics[0]

    return asyncio.run(run())


def readiness(cluster: ControllerCluster, name: str, wait_ms: int = 0) -> Any:
    return cluster.call("topic_readiness", name, wait_ms)


def test_timeout_zero_answers_once_committed(cluster: ControllerCluster) -> None:
    result = create(cluster, "committed", 3, 0)
    assert (result.name, result.error_code) == ("committed", ErrorCode.NONE)
    assert "committed" in cluster.call("metadata").topics
    assert not readiness(cluster, "committed").done, "answered before the replicas serve"
    wait_until(
        lambda: readiness(cluster, "committed", 5_000).done,
        timeout_s=SERVE_WAIT_S,
        message="committed serves",
    )


def test_a_timeout_answers_once_every_leader_serves(cluster: ControllerCluster) -> None:
    result = create(cluster, "serving", 4, 120_000)
    assert result.error_code == ErrorCode.NONE, result.error_message
    assert readiness(cluster, "serving").done
    for p in range(4):
        outcome = cluster.produce("serving", p, partition=p)
        assert outcome.error_code == 0, f"partition {p}: {outcome}"


def test_a_short_timeout_is_no_failure_and_the_creation_goes_on(cluster: ControllerCluster) -> None:
    result = create(cluster, "pending", 3, 1)
    assert result.error_code in (ErrorCode.NONE, ErrorCode.REQUEST_TIMED_OUT), result
    if result.error_code == ErrorCode.REQUEST_TIMED_OUT:
        assert "not in this broker's metadata" in result.error_message
    assert "pending" in cluster.call("metadata").topics
    wait_until(
        lambda: readiness(cluster, "pending", 5_000).done,
        timeout_s=SERVE_WAIT_S,
        message="pending serves",
    )
    assert cluster.produce("pending", 0).error_code == 0


def test_no_controller_found_while_waiting_is_no_failure(cluster: ControllerCluster) -> None:
    """The topic is created (the first lookup), then no controller is found for the next 10
    (2 s of asking again): the answer is NONE once every partition serves."""
    result = create(cluster, "failover", 2, 120_000, gap=10)
    assert result.error_code == ErrorCode.NONE, result.error_message
    assert readiness(cluster, "failover").done
