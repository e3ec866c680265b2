"""Consumer groups through the gateway, with real clients against a real embedded cluster.

Proves, on the session's shared `raylog up` cluster (3 brokers) and one 4-partition RF=1 topic:

(a) kafka-python: two KafkaConsumers of one group split the 4 partitions between them; when one
    closes, the other is given all 4.
(b) confluent-kafka: a consumer commits part-way and closes; a new consumer of the same group
    resumes from the committed offsets: every record is seen exactly once across the two.
(c) aiokafka: a group consumer reads every record and commits; OffsetFetch returns the ends.
(d) confluent-kafka static membership (KIP-345, ``group.instance.id``): of two static members,
    one is closed (no LeaveGroup) and a new consumer with its instance id starts within the
    session timeout: it gets the same partitions under a new member id and the other member
    sees no revoke or assign; DescribeGroups names both instance ids. Once the new consumer is
    closed too, its (shorter) session expires and the other member is given every partition.

Committed offsets through a failover of their coordinator (another broker loads the group's
``__consumer_offsets`` partition) are test_group_admin.py's (c), which kills that broker.

Also: ``__consumer_offsets`` exists once a group request was made (the first FindCoordinator
creates it), is internal in Metadata, and has Kafka's configs (compacted, 100 MiB segments).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition
from support.cluster import UpProcess
from support.embedded import produce_values
from support.waiting import wait_until

pytestmark = pytest.mark.slow

TOPIC = "grouped"
PARTITIONS = 4
RECORDS = 40
CLIENT_TIMEOUT_S = 90.0
RESUME_GROUP = "resume-group"


@pytest.fixture(scope="module")
def cluster(shared_up: UpProcess) -> UpProcess:
    """The session's shared cluster (tests/conftest.py) with this module's topic: one replica
    per partition, as no broker fails here (each replica is a process to start)."""
    done = shared_up.raylog(
        "topics", "create", TOPIC, "--partitions", str(PARTITIONS), "--replication-factor", "1"
    )
    assert done.returncode == 0, done.stderr
    _produce(shared_up.bootstrap)
    return shared_up


def _produce(bootstrap: str) -> None:
    values = [(i % PARTITIONS, f"v{i}".encode()) for i in range(RECORDS)]
    produce_values(bootstrap, TOPIC, values, timeout_s=CLIENT_TIMEOUT_S)


def _all_values() -> set[bytes]:
    return {f"v{i}".encode() for i in range(RECORDS)}


# --- (a) kafka-python: two members, then one --------------------------------------------------


class _PollingConsumer:
    """A kafka-python KafkaConsumer polled in its own thread (group joins block in poll)."""

    def __init__(self, bootstrap: str, group: str) -> None:
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(
            TOPIC,
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1_000,
            max_poll_interval_ms=60_000,
        )
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.assigned: set[int] = set()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.consumer.poll(timeout_ms=200)
                with self.lock:
                    self.assigned = {tp.partition for tp in self.consumer.assignment()}
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def partitions(self) -> set[int]:
        with self.lock:
            return set(self.assigned)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=CLIENT_TIMEOUT_S)
        assert not self.thread.is_alive()
        self.consumer.close()  # LeaveGroup
        assert not self.errors, self.errors


def test_kafka_python_group_splits_partitions_then_one_takes_all(cluster: UpProcess) -> None:
    first = _PollingConsumer(cluster.bootstrap, "kp-group")
    second = _PollingConsumer(cluster.bootstrap, "kp-group")
    try:

        def split() -> bool:
            a, b = first.partitions(), second.partitions()
            assert not first.errors and not second.errors, (first.errors, second.errors)
            return bool(a) and bool(b) and not (a & b) and (a | b) == set(range(PARTITIONS))

        wait_until(split, timeout_s=CLIENT_TIMEOUT_S, message="both members assigned")
        second.close()
        wait_until(
            lambda: first.partitions() == set(range(PARTITIONS)),
            timeout_s=CLIENT_TIMEOUT_S,
            message="the remaining member assigned every partition",
        )
    finally:
        for c in (first, second):
            if c.thread.is_alive():
                c.close()


# --- (b) confluent-kafka: commit, close, resume -----------------------------------------------


def _confluent_consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000,
        }
    )


def _consume(consumer: Consumer, count: int) -> list[tuple[int, int, bytes]]:
    got: list[tuple[int, int, bytes]] = []

    def more() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None:
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.offset(), msg.value()))
        return len(got) >= count

    wait_until(more, timeout_s=CLIENT_TIMEOUT_S, interval_s=0, message=f"{count} records")
    return got


def test_confluent_commit_close_and_resume(cluster: UpProcess) -> None:
    first = _confluent_consumer(cluster.bootstrap, RESUME_GROUP)
    first.subscribe([TOPIC])
    before = _consume(first, RECORDS // 2)
    first.commit(asynchronous=False)
    committed = first.committed(
        [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=CLIENT_TIMEOUT_S
    )
    first.close()
    expected = {p: -1001 for p in range(PARTITIONS)}  # librdkafka's "no offset"
    for partition, offset, _ in before:
        expected[partition] = max(expected[partition], offset + 1)
    assert {tp.partition: tp.offset for tp in committed} == expected

    second = _confluent_consumer(cluster.bootstrap, RESUME_GROUP)
    second.subscribe([TOPIC])
    try:
        after = _consume(second, RECORDS - len(before))
        extra = second.poll(2.0)  # nothing beyond: no record twice
        assert extra is None, (extra.partition(), extra.offset())
        second.commit(asynchronous=False)
    finally:
        second.close()
    values = [v for _, _, v in before + after]
    assert sorted(values) == sorted(_all_values())


def _committed(bootstrap: str, group: str) -> dict[int, int]:
    consumer = _confluent_consumer(bootstrap, group)
    try:
        found = consumer.committed(
            [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10
        )
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


def _committed_or_none(bootstrap: str, group: str) -> dict[int, int] | None:
    try:
        return _committed(bootstrap, group)
    except Exception:  # KafkaException while the coordinator is created, loads or moves
        return None


def test_offsets_topic_is_internal_and_created_once(cluster: UpProcess) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    # Any group request creates the topic (here FindCoordinator, from committed()).
    wait_until(
        lambda: _committed_or_none(cluster.bootstrap, "probe-group") is not None,
        timeout_s=CLIENT_TIMEOUT_S,
        interval_s=0.5,
        message="a coordinator for a new group",
    )
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        topics = {t["name"]: t for t in admin.describe_topics(["__consumer_offsets"])}
        resource = ConfigResource(ConfigResourceType.TOPIC, "__consumer_offsets")
        described = admin.describe_configs([resource])  # the overrides only
    finally:
        admin.close()
    overrides = {k: c["value"] for k, c in described["topic"]["__consumer_offsets"].items()}
    assert overrides == {"cleanup.policy": "compact", "segment.bytes": "104857600"}
    offsets = topics["__consumer_offsets"]
    assert offsets["is_internal"] is True
    assert len(offsets["partitions"]) == 3  # offsets.topic.num.partitions in raylog
    assert all(len(p["replica_nodes"]) == 3 for p in offsets["partitions"])


# --- (c) aiokafka -------------------------------------------------------------------------------


def test_aiokafka_group_consume_and_commit(cluster: UpProcess) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTP

    async def run() -> tuple[set[bytes], dict[int, int]]:
        consumer = AIOKafkaConsumer(
            TOPIC,
            bootstrap_servers=cluster.bootstrap,
            group_id="aio-group",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            seen: set[bytes] = set()
            async with asyncio.timeout(CLIENT_TIMEOUT_S):
                while len(seen) < RECORDS:
                    batches = await consumer.getmany(timeout_ms=500)
                    for records in batches.values():
                        seen.update(r.value for r in records)
            await consumer.commit()
            committed = {p: await consumer.committed(AioTP(TOPIC, p)) for p in range(PARTITIONS)}
        finally:
            await consumer.stop()
        return seen, committed

    seen, committed = asyncio.run(run())
    assert seen == _all_values()
    assert committed == dict.fromkeys(range(PARTITIONS), RECORDS // PARTITIONS)


# --- (d) confluent-kafka static membership -----------------------------------------------------

STATIC_GROUP = "static-group"


class _StaticMember:
    """A confluent-kafka consumer with ``group.instance.id``; it records its rebalance callbacks
    (polled from the test's thread: callbacks run inside poll())."""

    def __init__(self, bootstrap: str, instance: str, session_timeout_ms: int) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": STATIC_GROUP,
                "group.instance.id": instance,
                "session.timeout.ms": session_timeout_ms,
                "heartbeat.interval.ms": 1_000,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self.callbacks: list[tuple[str, frozenset[int]]] = []
        self.consumer.subscribe(
            [TOPIC],
            on_assign=lambda _c, tps: self._record("assign", tps),
            on_revoke=lambda _c, tps: self._record("revoke", tps),
        )

    def _record(self, kind: str, partitions: list[TopicPartition]) -> None:
        self.callbacks.append((kind, frozenset(tp.partition for tp in partitions)))

    def poll(self) -> None:
        msg = self.consumer.poll(0.1)
        assert msg is None or msg.error() is None, msg.error()

    def partitions(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}


def _poll_until(members: list[_StaticMember], done: Callable[[], bool], message: str) -> None:
    def polled() -> bool:
        for member in members:
            member.poll()
        return done()

    wait_until(polled, timeout_s=CLIENT_TIMEOUT_S, interval_s=0, message=message)


def _described_instances(bootstrap: str) -> dict[str, str | None]:
    """member id -> group.instance.id, from DescribeGroups through confluent's AdminClient."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.describe_consumer_groups([STATIC_GROUP], request_timeout=30)[STATIC_GROUP]
    return {m.member_id: m.group_instance_id for m in found.result().members}


def test_confluent_static_member_restarts_without_a_rebalance(cluster: UpProcess) -> None:
    everything = set(range(PARTITIONS))
    first = _StaticMember(cluster.bootstrap, "static-a", session_timeout_ms=45_000)
    other = _StaticMember(cluster.bootstrap, "static-b", session_timeout_ms=45_000)
    members = [first, other]
    restarted: _StaticMember | None = None
    try:

        def split() -> bool:
            a, b = first.partitions(), other.partitions()
            return bool(a) and bool(b) and not (a & b) and (a | b) == everything

        _poll_until(members, split, "both static members assigned")
        kept, first_id = first.partitions(), first.consumer.memberid()
        seen_by_other = list(other.callbacks)
        first.consumer.close()  # a static member sends no LeaveGroup: its member stays
        members.remove(first)

        # The same instance restarts well within the 45 s session timeout, with a shorter one.
        restarted = _StaticMember(cluster.bootstrap, "static-a", session_timeout_ms=6_000)
        members.append(restarted)
        _poll_until(members, lambda: bool(restarted.partitions()), "the restarted member assigned")
        # In a rebalance the other member revokes before anyone is assigned (eager protocol):
        # none happened.
        assert restarted.partitions() == kept
        assert other.callbacks == seen_by_other, other.callbacks
        assert restarted.consumer.memberid() not in ("", first_id)
        assert sorted(_described_instances(cluster.bootstrap).items()) == sorted(
            [(restarted.consumer.memberid(), "static-a"), (other.consumer.memberid(), "static-b")]
        )

        # Closed again: its 6 s session expires, then the group rebalances without it.
        restarted.consumer.close()
        members.remove(restarted)
        _poll_until(members, lambda: other.partitions() == everything, "the other member given all")
        assert [kind for kind, _ in other.callbacks[len(seen_by_other) :]][:2] == [
            "revoke",
            "assign",
        ]
    finally:
        for member in members:
            member.consumer.close()
