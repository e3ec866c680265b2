"""Fixtures of the pipelines tests: a produced topic on real replica actors (Ray Data tests),
and a whole embedded cluster plus one Spark session (Spark and streaming tests), all shared.

``events_topic`` (session): a 2-partition RF=3 topic (leaders 0 and 1, every replica in sync)
with one kafka-python-built batch per codec in each partition, produced with acks=all. Starting
six actors costs seconds on a loaded 2-core machine, so the Spark and Ray Data modules share
it; both only read it.

Nothing here imports Ray at module level: pytest loads this file before the root conftest's
``pytest_configure`` sets the Ray environment when tests/pipelines is named on the command line,
and Ray reads that environment when it is imported.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

UP_ATTEMPTS_MAX = 3

if TYPE_CHECKING:
    from pipeline_support import ProducedTopic


@pytest.fixture(scope="session")
def events_topic(
    ray_local: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProducedTopic]:
    import ray
    from pipeline_support import (
        EVENTS,
        EVENTS_PARTITIONS,
        ProducedTopic,
        catalog_json,
        produce_topic,
        start_topic,
    )

    replicas = start_topic(tmp_path_factory.mktemp("pipeline-logs"), EVENTS, EVENTS_PARTITIONS)
    rows = produce_topic(replicas, EVENTS)
    # The handles keep the (non-detached) replica actors alive until the session ends.
    yield ProducedTopic(EVENTS, EVENTS_PARTITIONS, rows, catalog_json(EVENTS, EVENTS_PARTITIONS))
    for by_id in replicas.values():
        for handle in by_id.values():
            ray.kill(handle)


@pytest.fixture(scope="session")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One `raylog up` (3 brokers) shared by the modules that test against a whole cluster.

    A module that kills a broker does so last: Ray restarts the broker, so the cluster heals.
    """
    from cluster_support import UpProcess

    for attempt in range(UP_ATTEMPTS_MAX):
        up = UpProcess(tmp_path_factory.mktemp("raylog-up"))
        try:
            up.start()
            break
        except AssertionError as exc:
            # Ray gives its raylet a fixed 30 s to register; a loaded 2-core machine can
            # exceed that. That is the machine, not raylog: try again on a fresh data dir.
            if "Ray did not start" not in str(exc) or attempt == UP_ATTEMPTS_MAX - 1:
                raise
    try:
        yield up
    finally:
        up.__exit__(None, None, None)  # stops it (SIGINT, then kill), by its PID


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """Spark local[2], the ``raylog`` format registered (one session for the whole run)."""
    from embedded_support import spark_session

    with spark_session("raylog-pipelines-test") as session:
        yield session
