"""A cross-cluster link (KIP-986) whose network to the source is slow and cut: Tansu (the
source) behind a fault-injecting TCP proxy (``support.tcp_proxy``; Tansu's Metadata advertises
the proxy, so the link's fetchers and the source's producer both go through it), mirrored into
the session's shared `raylog up` (the destination).

Proves: while an idempotent producer (confluent-kafka, enable.idempotence, acks=all) writes to
the source throughout, with 200 ms of delay each way, with the connection cut for seconds and
restored, three times (the link's partitions show the source error meanwhile), and with
connections reset in the middle of responses, every acknowledged record is on the mirror
exactly once, at its source partition and offset, in the order produced, and the mirror holds
exactly what the source holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support.cluster import UpProcess
from support.tansu import free_port, tansu_broker
from support.tcp_proxy import TcpProxy
from support.waiting import wait_until

pytestmark = pytest.mark.slow

LINK = "tansu-faulty"
TOPIC = "faults-orders"
PARTITIONS = 2
WAIT_S = 120.0
RECORDS_MAX = 20_000  # the producer's bound
PRODUCE_EVERY_S = 0.005
Row = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value
Delivered = tuple[int, int | None, bytes | None, bytes | None]  # offset None: not known


@pytest.fixture(scope="module")
def faulty_source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TcpProxy]:
    """Tansu with ``TOPIC``, reached (and advertised) through the proxy it yields."""
    root: Path = tmp_path_factory.mktemp("tansu-faults")
    port = free_port()
    proxy = TcpProxy(port).start()
    try:
        with tansu_broker(root, TOPIC, PARTITIONS, port=port, advertised_port=proxy.port):
            yield proxy
    finally:
        proxy.stop()


class Producing:
    """An idempotent producer writing ``TOPIC`` round robin in a thread until stopped; its
    acknowledged records (``delivered``) and failures (``errors``)."""

    def __init__(self, bootstrap: str) -> None:
        self.delivered: list[Delivered] = []
        self.errors: list[Any] = []
        self._stop = threading.Event()
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
            }
        )
        self._thread = threading.Thread(target=self._run, name="producing", daemon=True)
        self._thread.start()

    def _report(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.delivered.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    def _run(self) -> None:
        for i in range(RECORDS_MAX):  # bounded; ends when stopped
            if self._stop.wait(PRODUCE_EVERY_S):
                break
            self._producer.produce(
                TOPIC,
                key=f"k{i}".encode(),
                value=f"seq-{i:06d}".encode(),
                partition=i % PARTITIONS,
                on_delivery=self._report,
            )
            self._producer.poll(0)
        self._producer.flush(WAIT_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S + 10)
        assert not self._thread.is_alive(), "the producer did not flush"


def read_all(bootstrap: str, expected: int) -> list[Row]:
    """Every record of ``TOPIC`` on ``bootstrap`` from offset 0, once ``expected`` are read."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "faults-check", "enable.auto.commit": False}
    )
    rows: list[Row] = []
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])

        def done() -> bool:
            for msg in consumer.consume(500, timeout=1.0):
                if msg.error() is None:
                    rows.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
            return len(rows) >= expected

        wait_until(done, timeout_s=WAIT_S, interval_s=0.2, message=f"{expected} records read")
    finally:
        consumer.close()
    return sorted(rows)


def mirrored(up: UpProcess) -> list[dict[str, Any]]:
    return list(up.document("links", "describe", LINK)["partitions"])


def mirrored_end(up: UpProcess) -> int:
    # A partition is listed before its fetcher's first report, which carries its end.
    return sum(max(0, p.get("log_end_offset", -1)) for p in mirrored(up))


def grows(up: UpProcess, by: int = 20) -> None:
    start = mirrored_end(up)
    wait_until(
        lambda: mirrored_end(up) >= start + by,
        timeout_s=WAIT_S,
        interval_s=0.5,
        message=f"the mirror grew by {by} records",
    )


def test_every_acknowledged_record_mirrored_once_in_order_through_faults(
    shared_up: UpProcess, faulty_source: TcpProxy
) -> None:
    up, proxy = shared_up, faulty_source
    done = up.raylog("links", "create", LINK, "--bootstrap", proxy.address, "--topics", "faults-.*")
    assert done.returncode == 0, done.stderr[-2000:]
    try:
        producing = Producing(proxy.address)
        try:
            wait_until(
                lambda: TOPIC in up.topics() and len(mirrored(up)) == PARTITIONS,
                timeout_s=WAIT_S,
                interval_s=0.5,
                message="the mirror topic fetching",
            )
            grows(up)
            proxy.delay(0.2, 0.2)  # a slow network, each way
            grows(up)
            proxy.delay(0.0, 0.0)
            for _ in range(3):  # cut until the link shows it, then restored
                proxy.cut()
                wait_until(
                    lambda: any(p["error"].startswith("source:") for p in mirrored(up)),
                    timeout_s=WAIT_S,
                    interval_s=0.5,
                    message="the cut shown as a source error",
                )
                proxy.restore()
                grows(up)
            proxy.reset_mid_response(5, 200)  # Fetch answers with records are the large ones
            wait_until(lambda: proxy.resets >= 5, timeout_s=WAIT_S, message="five resets")
            grows(up)
        finally:
            producing.stop()
        assert not producing.errors, producing.errors[:5]
        delivered = producing.delivered
        source = read_all(proxy.address, len(delivered))
        mirror = read_all(up.bootstrap, len(source))
        # The mirror is the source, record for record at the same partitions and offsets ...
        assert mirror == source
        # ... every acknowledged record once, at its offset (a retry the source recognised as
        # a duplicate is acknowledged without one by librdkafka, or by Tansu with the batch's
        # base offset 0, so its records' offsets count from 0: below where they are; those are
        # checked by value) ...
        values = [r[3] for r in mirror]
        assert len(values) == len(set(values))
        at = {r[3]: r for r in mirror}
        for partition, offset, key, value in delivered:
            assert value in at, f"acknowledged record {value!r} not mirrored"
            assert at[value][0] == partition and at[value][2] == key
            assert offset is None or offset <= at[value][1]
        # ... in the order produced.
        for p in range(PARTITIONS):
            in_offset_order = [r[3] for r in mirror if r[0] == p]
            assert in_offset_order == sorted(in_offset_order)
        wait_until(
            lambda: all(p["error"] == "" and p["lag_records"] == 0 for p in mirrored(up)),
            timeout_s=WAIT_S,
            interval_s=0.5,
            message="every mirror partition caught up without error",
        )
    finally:
        up.raylog("links", "delete", LINK)
