"""The first offset commit of a new group, on a cluster `raylog up` has just called ready.

Proves, on a `raylog up` of its own started for the test, a user's sequence once it says ready:
2,000 records produced with confluent-kafka (acks=all) to an RF=3 topic, then a consumer of a
new group commits explicit offsets synchronously, without subscribing. librdkafka retries an
OffsetCommit answered COORDINATOR_LOAD_IN_PROGRESS only twice, within a few hundred
milliseconds, and then hands the error to the application: the commit succeeds only if the
group's ``__consumer_offsets`` partition is served by then (`raylog up` creates the topic and
waits for its coordinators to load it before it says ready; a coordinator still loading holds
the request). The offsets read back (OffsetFetch) are the ones committed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from support.cluster import UpProcess, started_up
from support.embedded import produce_values

pytestmark = pytest.mark.slow

TOPIC = "first-commit"
PARTITIONS = 3
RECORDS = 2_000
CLIENT_TIMEOUT_S = 90.0


@pytest.fixture
def fresh_up(tmp_path: Path) -> Iterator[UpProcess]:
    """A `raylog up` of its own, started for this test."""
    attempts = itertools.count()
    up = started_up(lambda: tmp_path / f"data-{next(attempts)}")
    try:
        yield up
    finally:
        up.__exit__(None, None, None)  # stops it (SIGINT, then kill), by its PID


def test_a_new_groups_first_commit_succeeds_on_a_ready_cluster(fresh_up: UpProcess) -> None:
    up = fresh_up
    done = up.raylog(
        "topics", "create", TOPIC, "--partitions", str(PARTITIONS), "--replication-factor", "3"
    )
    assert done.returncode == 0, done.stderr
    values = [(i % PARTITIONS, f"v{i}".encode()) for i in range(RECORDS)]
    produce_values(up.bootstrap, TOPIC, values, timeout_s=CLIENT_TIMEOUT_S)

    consumer = Consumer(
        {
            "bootstrap.servers": up.bootstrap,
            "group.id": "first-commit-group",
            "enable.auto.commit": False,
        }
    )
    try:
        wanted = [TopicPartition(TOPIC, p, RECORDS // PARTITIONS) for p in range(PARTITIONS)]
        # Raises KafkaException (e.g. COORDINATOR_LOAD_IN_PROGRESS) if the commit fails.
        consumer.commit(offsets=wanted, asynchronous=False)
        committed = consumer.committed(
            [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=CLIENT_TIMEOUT_S
        )
    finally:
        consumer.close()
    assert {tp.partition: tp.offset for tp in committed} == {
        tp.partition: tp.offset for tp in wanted
    }
