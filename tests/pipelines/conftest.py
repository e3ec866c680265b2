"""Fixtures of the pipelines tests: a produced topic on real replica actors (Ray Data tests),
and the session's shared embedded cluster plus one Spark session (Spark and streaming tests).

``events_topic`` (module): a 2-partition RF=3 topic (leaders 0 and 1, every replica in sync)
with one kafka-python-built batch per codec in each partition, produced with acks=all; its six
replica actors end with the module.

Nothing here imports Ray at module level: pytest loads this file before the root conftest's
``pytest_configure`` sets the Ray environment when tests/pipelines is named on the command line,
and Ray reads that environment when it is imported.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from support.pipelines import ProducedTopic


@pytest.fixture(scope="module")
def events_topic(
    ray_local: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProducedTopic]:
    import ray
    from support.pipelines import (
        EVENTS,
        EVENTS_PARTITIONS,
        ProducedTopic,
        catalog_json,
        produce_topic,
        start_topic,
    )

    replicas = start_topic(tmp_path_factory.mktemp("pipeline-logs"), EVENTS, EVENTS_PARTITIONS)
    rows = produce_topic(replicas, EVENTS)
    # The handles keep the (non-detached) replica actors alive until the module ends.
    yield ProducedTopic(EVENTS, EVENTS_PARTITIONS, rows, catalog_json(EVENTS, EVENTS_PARTITIONS))
    for by_id in replicas.values():
        for handle in by_id.values():
            ray.kill(handle)


@pytest.fixture(scope="module")
def embedded(shared_up: Any) -> Any:
    """The session's shared `raylog up` (3 brokers), healed for this module (tests/conftest.py).

    A module that kills a broker does so last; the next module's ``heal()`` starts it again.
    """
    return shared_up


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """Spark local[2], the ``raylog`` format registered (one session for the whole run)."""
    from support.embedded import spark_session

    with spark_session("raylog-pipelines-test") as session:
        yield session
