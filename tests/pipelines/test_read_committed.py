"""Kafka's isolation.level in the pipelines, on the shared embedded cluster (`raylog up`) with
transactions written by confluent-kafka's transactional producer through the gateway.

A 2-partition topic holds, in every partition: a committed transaction, an aborted one, a
second committed one, then plain (non-transactional) records. Proves:
- Spark (``kafka.isolation.level``) and Ray Data (``isolation_level``) with read_committed
  yield exactly the committed and plain records, per partition in offset order; with
  read_uncommitted (Spark's default, not given) every data record; in neither mode is a
  transaction marker a row (the rows are exactly the values produced);
- with a transaction still open (its records flushed to the log, then plain records after
  it), a read_committed read ends at each partition's last stable offset: neither the open
  transaction's records nor the plain ones after them are read, while read_uncommitted reads
  them all. Spark reads the replicas short-circuit (same node), Ray Data's tasks too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow.parquet as pq
import pytest
from support.embedded import cluster_action, create_topic, produce_values
from support.pipelines import table_rows

# Slow: a whole embedded cluster and Spark.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOPIC = "txn-pipe"
PARTITIONS = 2
PER_TXN = 6  # values i go to partition i % PARTITIONS
CLIENT_TIMEOUT_S = 90.0
OPEN_TXN_TIMEOUT_MS = 300_000  # the open transaction outlives the reads; the test aborts it


def _values(tag: str) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(PER_TXN)]


def _by_partition(*groups: list[bytes]) -> dict[int, list[bytes]]:
    """Values per partition in the order they were produced (offset order)."""
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for values in groups:
        for value in values:
            out[int(value.rsplit(b"-", 1)[1]) % PARTITIONS].append(value)
    return out


def _producer(up: Any, transactional_id: str, timeout_ms: int = 60_000) -> Any:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": up.bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 5,
            "transaction.timeout.ms": timeout_ms,
        }
    )
    producer.init_transactions(CLIENT_TIMEOUT_S)
    return producer


def _send(producer: Any, values: list[bytes]) -> None:
    for i, value in enumerate(values):
        producer.produce(TOPIC, value=value, partition=i % PARTITIONS)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0  # in the log before the transaction ends


def _plain(up: Any, tag: str) -> list[bytes]:
    values = _values(tag)
    produce_values(up.bootstrap, TOPIC, [(i % PARTITIONS, v) for i, v in enumerate(values)])
    return values


@pytest.fixture(scope="module")
def written(embedded: Any) -> Iterator[dict[str, list[bytes]]]:
    create_topic(embedded, TOPIC, PARTITIONS)
    producer = _producer(embedded, "txn-pipe-writer")
    for tag in ("commit", "abort", "commit-after"):
        producer.begin_transaction()
        _send(producer, _values(tag))
        if tag == "abort":
            producer.abort_transaction(CLIENT_TIMEOUT_S)
        else:
            producer.commit_transaction(CLIENT_TIMEOUT_S)
    plain = _plain(embedded, "plain")
    yield {
        "committed": _values("commit") + _values("commit-after") + plain,
        "every": _values("commit") + _values("abort") + _values("commit-after") + plain,
    }


def _values_read(table: Any) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for row in table_rows(table):
        out[row["partition"]].append(row["value"])
    return out


def test_spark_reads_committed_or_every_data_record(
    spark: Any, embedded: Any, written: dict[str, list[bytes]]
) -> None:
    def read(**options: str) -> dict[int, list[bytes]]:
        reader = spark.read.format("raylog").option("cluster", str(embedded.data_dir))
        reader = reader.option("subscribe", TOPIC)
        for k, v in options.items():
            reader = reader.option(k, v)
        return _values_read(reader.load().toArrow())

    assert read(**{"kafka.isolation.level": "read_committed"}) == _by_partition(
        written["committed"]
    )
    assert read() == _by_partition(written["every"])


def test_ray_data_stops_at_the_last_stable_offset(
    embedded: Any, written: dict[str, list[bytes]], tmp_path: Any
) -> None:
    committed_done, every_done = tmp_path / "committed.parquet", tmp_path / "every.parquet"
    committed_open, every_open = (
        tmp_path / "committed-open.parquet",
        tmp_path / "every-open.parquet",
    )
    # With every transaction ended.
    cluster_action(
        embedded.data_dir,
        "read-topic",
        TOPIC,
        f"{committed_done}+read_committed",
        f"{every_done}+read_uncommitted",
    )
    assert _values_read(pq.read_table(committed_done)) == _by_partition(written["committed"])
    assert _values_read(pq.read_table(every_done)) == _by_partition(written["every"])
    # With a transaction open in both partitions, and plain records after its first ones.
    producer = _producer(embedded, "txn-pipe-open", OPEN_TXN_TIMEOUT_MS)
    producer.begin_transaction()
    _send(producer, _values("open"))
    later = _plain(embedded, "later")
    try:
        cluster_action(
            embedded.data_dir,
            "read-topic",
            TOPIC,
            f"{committed_open}+read_committed",
            f"{every_open}+read_uncommitted",
        )
    finally:
        producer.abort_transaction(CLIENT_TIMEOUT_S)
    assert _values_read(pq.read_table(committed_open)) == _by_partition(written["committed"])
    every = written["every"] + _values("open") + later
    assert _values_read(pq.read_table(every_open)) == _by_partition(every)
