"""Mirrored consumer-group offsets over a cross-cluster link from a Tansu source.

On the session's shared `raylog up` (the destination) and a Tansu broker (the source), driven
with `raylog links` and confluent-kafka as a user would.

Proves: a group the link's `--groups` regex matches has the offsets it committed at the source
committed on the destination, each capped at the mirror partition's high watermark (a source
offset beyond the mirror's end is written as that end); `links describe` shows the group
synced with its offsets count; a commit of those offsets on the destination while the link is
active is refused with INVALID_REQUEST; a group with a live member on the destination is
skipped (`skipped-active`, its destination offsets untouched while the source's move) and
synced once its member leaves; after `links disconnect` a consumer of the group on the
destination continues exactly where the source group was, and its commits succeed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from support.cluster import UpProcess
from support.tansu import tansu_broker
from support.waiting import wait_until

pytestmark = pytest.mark.slow

LINK = "tansu-groups"
TOPIC = "grp-events"
RECORDS = {0: 80, 1: 100}  # records produced to each source partition
SYNCED = "app-orders"  # committed at the source: p0 at 60, p1 beyond the end
BUSY = "app-busy"  # a member on the destination
WAIT_S = 90.0


def ok(done: Any) -> str:
    assert done.returncode == 0, done.stderr[-2000:]
    return str(done.stdout)


def commit(bootstrap: str, group: str, offsets: dict[int, int]) -> None:
    """A group's commit with no membership (assign-style), as a tool resetting offsets does."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(
            offsets=[TopicPartition(TOPIC, p, o) for p, o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def committed(bootstrap: str, group: str) -> dict[int, int]:
    """The group's committed offsets of TOPIC (OffsetFetch: no membership); -1001 for none."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = consumer.committed([TopicPartition(TOPIC, p) for p in RECORDS], timeout=20)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def group_view(up: UpProcess, group: str) -> dict[str, Any] | None:
    view = up.document("links", "describe", LINK)
    found = [g for g in view.get("groups", []) if g["group"] == group]
    return found[0] if found else None


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("tansu-groups")
    with tansu_broker(root, TOPIC, partitions=len(RECORDS)) as (bootstrap, _pid):
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for partition, count in RECORDS.items():
            for i in range(count):
                producer.produce(TOPIC, f"r{i}".encode(), partition=partition)
        assert producer.flush(60) == 0
        commit(bootstrap, SYNCED, {0: 60, 1: 500})
        yield bootstrap


@pytest.fixture(scope="module")
def up(shared_up: UpProcess, source: str) -> Iterator[UpProcess]:
    ok(
        shared_up.raylog(
            "links", "create", LINK, "--bootstrap", source, "--topics", TOPIC,
            "--groups", "app-.*",
            "--config", "link.groups.sync.interval.ms=500",
            "--config", "link.metadata.refresh.interval.ms=1000",
        )
    )  # fmt: skip
    try:
        wait_until(
            lambda: TOPIC in shared_up.topics(),
            timeout_s=WAIT_S,
            interval_s=0.5,
            message="mirror topic created",
        )
        yield shared_up
    finally:
        shared_up.raylog("links", "delete", LINK)


def test_offsets_are_mirrored_capped_at_the_mirror_end_and_read_only(up: UpProcess) -> None:
    expected = {0: 60, 1: RECORDS[1]}  # 500 lies beyond the mirror's end (its HW)
    wait_until(
        lambda: committed(up.bootstrap, SYNCED) == expected,
        timeout_s=WAIT_S,
        interval_s=1.0,
        message=f"{SYNCED}'s offsets mirrored",
    )
    view = group_view(up, SYNCED)
    assert view is not None and view["state"] == "synced" and view["offsets"] == 2, view
    assert view["last_sync_ms"] > 0
    with pytest.raises(KafkaException) as refused:
        commit(up.bootstrap, SYNCED, {0: 70})
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST, refused.value
    assert committed(up.bootstrap, SYNCED) == expected


def test_a_group_with_a_member_on_the_destination_is_skipped(up: UpProcess, source: str) -> None:
    member = Consumer(
        {
            "bootstrap.servers": up.bootstrap,
            "group.id": BUSY,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        member.subscribe([TOPIC])
        wait_until(
            lambda: member.poll(0.5) is not None or bool(member.assignment()),
            timeout_s=WAIT_S,
            interval_s=0.1,
            message=f"a member of {BUSY} assigned on the destination",
        )
        commit(source, BUSY, {0: 30, 1: 40})
        wait_until(
            lambda: (group_view(up, BUSY) or {}).get("state") == "skipped-active",
            timeout_s=WAIT_S,
            interval_s=0.5,
            message=f"{BUSY} skipped while it has a member",
        )
        assert committed(up.bootstrap, BUSY) == {0: -1001, 1: -1001}
    finally:
        member.close()  # leaves the group: Empty, so the next round syncs it
    wait_until(
        lambda: committed(up.bootstrap, BUSY) == {0: 30, 1: 40},
        timeout_s=WAIT_S,
        interval_s=1.0,
        message=f"{BUSY} synced once Empty",
    )


def test_after_disconnect_the_group_continues_where_the_source_was(up: UpProcess) -> None:
    wait_until(
        lambda: committed(up.bootstrap, SYNCED) == {0: 60, 1: RECORDS[1]},
        timeout_s=WAIT_S,
        interval_s=1.0,
        message=f"{SYNCED}'s offsets mirrored",
    )
    ok(up.raylog("links", "disconnect", LINK))
    producer = Producer({"bootstrap.servers": up.bootstrap, "acks": "all"})
    delivered: list[Any] = []

    def write() -> bool:  # the mirror is writable once the leaders learn the disconnect
        delivered.clear()
        producer.produce(TOPIC, b"local", partition=1, on_delivery=lambda e, m: delivered.append(e))
        producer.flush(30)
        return bool(delivered) and delivered[0] is None

    wait_until(write, timeout_s=WAIT_S, interval_s=0.5, message=f"{TOPIC} writable")
    consumer = Consumer(
        {
            "bootstrap.servers": up.bootstrap,
            "group.id": SYNCED,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",  # would restart at 0 had the offsets not been there
        }
    )
    first: dict[int, int] = {}
    try:
        consumer.subscribe([TOPIC])

        def both_read() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                first.setdefault(msg.partition(), msg.offset())
            return len(first) == 2

        wait_until(both_read, timeout_s=WAIT_S, interval_s=0.0, message="both partitions read")
        assert first == {0: 60, 1: RECORDS[1]}
        consumer.commit(offsets=[TopicPartition(TOPIC, 0, 61)], asynchronous=False)
    finally:
        consumer.close()
    assert committed(up.bootstrap, SYNCED)[0] == 61
