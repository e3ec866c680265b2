"""DeleteRecords through the gateway, driven by the clients' own admin classes on `raylog up`.

On the session's shared embedded cluster (three brokers). Proves, on an RF=3 topic:

- confluent-kafka's ``AdminClient.delete_records`` moves the low watermark to an offset inside a
  batch of records and answers it; a consumer from ``earliest`` then starts there, and
  ``get_watermark_offsets`` reports it;
- kafka-python's ``KafkaAdminClient.delete_records`` moves it further, and -1 (confluent's
  OFFSET_END) moves it to the high watermark;
- every replica's log starts there: leadership is moved to each replica in turn (a re-ordering
  reassignment and a preferred election) and the new leader reports the same low watermark;
- errors, as Kafka gives them (on one-replica topics): an offset above the high watermark is
  OFFSET_OUT_OF_RANGE, a compacted topic POLICY_VIOLATION, a request sent to a broker that does
  not lead the partition NOT_LEADER_OR_FOLLOWER, an unknown topic UNKNOWN_TOPIC_OR_PARTITION;
- a follower that was down while the log start moved past its log end inside one batch comes
  back: it starts its log over at the leader's log start, takes that whole batch, rejoins the
  ISR, and as leader serves from the same low watermark (last: it stops and starts a broker).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from support.cluster import UpProcess
from support.waiting import wait_until

from raylog.storage.log import LOG_START_OFFSET_CHECKPOINT

pytestmark = pytest.mark.slow

TIMEOUT_S = 60.0
RECORDS = 100  # in batches of 4 (linger), so that offsets inside a batch exist
TOPIC = "trimmed"


@pytest.fixture(scope="module")
def up(shared_up: UpProcess) -> UpProcess:
    return shared_up


@pytest.fixture
def admin(up: UpProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": up.bootstrap, "client.id": "delete-records"})


def _produce(bootstrap: str, topic: str, count: int, **extra: Any) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "batch.num.messages": 4,
            "linger.ms": 50,
            "message.timeout.ms": 120_000,
            **extra,
        }
    )
    failed: list[KafkaError] = []
    for i in range(count):
        producer.produce(
            topic,
            key=b"k%d" % i,
            value=b"v%d" % i,
            on_delivery=lambda e, _m: e and failed.append(e),
        )
    assert producer.flush(120) == 0
    assert failed == []


def _describe(up: UpProcess, topic: str) -> dict[str, Any]:
    done = up.raylog("topics", "describe", topic, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)[0]["partitions"][0]  # type: ignore[no-any-return]


def _low_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)
        return low  # type: ignore[no-any-return]
    finally:
        consumer.close()


def _low_watermark_when_served(bootstrap: str, topic: str) -> int | None:
    """The low watermark, or None while the leader the metadata names does not serve yet (the
    controller's metadata says who leads before that replica has taken the command)."""
    try:
        return _low_watermark(bootstrap, topic)
    except KafkaException as exc:
        if exc.args[0].code() in (
            KafkaError.NOT_LEADER_FOR_PARTITION,
            KafkaError.LEADER_NOT_AVAILABLE,
        ):
            return None
        raise


def _first_offset_from_earliest(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        message = wait_until(
            lambda: consumer.poll(1.0), timeout_s=TIMEOUT_S, message="a record from earliest"
        )
        assert message.error() is None, message.error()
        return message.offset()  # type: ignore[no-any-return]
    finally:
        consumer.close()


def _delete(admin: AdminClient, topic: str, offset: int) -> Any:
    futures = admin.delete_records([TopicPartition(topic, 0, offset)], operation_timeout=30)
    (future,) = futures.values()
    return future.result(timeout=TIMEOUT_S)


def _delete_error(admin: AdminClient, topic: str, offset: int) -> KafkaError:
    with pytest.raises(KafkaException) as caught:
        _delete(admin, topic, offset)
    return caught.value.args[0]


def _lead(up: UpProcess, topic: str, broker: int) -> None:
    """Make ``broker`` the partition's leader: first in the replica list, then elected."""
    replicas = _describe(up, topic)["replicas"]
    order = [broker] + [b for b in replicas if b != broker]
    moved = up.raylog(
        "reassign", "--topic", topic, "--partition", "0",
        "--replicas", ",".join(map(str, order)), "--timeout", "60", timeout_s=120,
    )  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    wait_until(
        lambda: (
            up.raylog("leader-election", "--preferred", "--topic", topic).returncode == 0
            and _describe(up, topic)["leader"] == broker
        ),
        timeout_s=TIMEOUT_S,
        message=f"broker {broker} leads {topic}-0",
    )


def test_delete_records_moves_the_low_watermark_on_every_replica(
    up: UpProcess, admin: AdminClient
) -> None:
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTopicPartition

    created = admin.create_topics(
        [NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})], operation_timeout=30
    )
    created[TOPIC].result(timeout=TIMEOUT_S)
    _produce(up.bootstrap, TOPIC, RECORDS)
    assert _low_watermark(up.bootstrap, TOPIC) == 0

    deleted = _delete(admin, TOPIC, 41)  # inside a batch: Kafka's offsets need no alignment
    assert deleted.low_watermark == 41
    assert _low_watermark(up.bootstrap, TOPIC) == 41
    assert _first_offset_from_earliest(up.bootstrap, TOPIC) == 41

    client = KafkaAdminClient(bootstrap_servers=up.bootstrap, request_timeout_ms=30_000)
    try:
        answer = client.delete_records({KTopicPartition(TOPIC, 0): 60}, timeout_ms=30_000)
        assert answer[KTopicPartition(TOPIC, 0)]["low_watermark"] == 60
    finally:
        client.close()
    assert _first_offset_from_earliest(up.bootstrap, TOPIC) == 60

    # Each replica in turn leads, and reports the same log start (followers adopted it).
    for broker in _describe(up, TOPIC)["replicas"][::-1]:
        _lead(up, TOPIC, broker)
        low = wait_until(
            lambda: _low_watermark_when_served(up.bootstrap, TOPIC),
            timeout_s=TIMEOUT_S,
            message=f"broker {broker} serving {TOPIC}-0 as leader",
        )
        assert low == 60, f"broker {broker} as leader"

    # Behind a new leader, a new write, and then everything up to the high watermark.
    _produce(up.bootstrap, TOPIC, 3)
    assert _delete(admin, TOPIC, OFFSET_END).low_watermark == RECORDS + 3
    assert _low_watermark(up.bootstrap, TOPIC) == RECORDS + 3


def test_delete_records_errors(up: UpProcess, admin: AdminClient) -> None:
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTopicPartition
    from kafka.errors import NotLeaderForPartitionError, UnknownTopicOrPartitionError

    # One replica each (a replica is a process to start): the errors are the leader's.
    admin.create_topics([NewTopic("trim-errors", 1, 1)])["trim-errors"].result(timeout=TIMEOUT_S)
    compacted = NewTopic("trim-compacted", 1, 1, config={"cleanup.policy": "compact"})
    admin.create_topics([compacted])["trim-compacted"].result(timeout=TIMEOUT_S)
    _produce(up.bootstrap, "trim-errors", 10)
    _produce(up.bootstrap, "trim-compacted", 10)

    above = _delete_error(admin, "trim-errors", 11)
    assert above.code() == KafkaError.OFFSET_OUT_OF_RANGE
    policy = _delete_error(admin, "trim-compacted", 5)
    assert policy.code() == KafkaError.POLICY_VIOLATION
    assert _low_watermark(up.bootstrap, "trim-errors") == 0
    assert _low_watermark(up.bootstrap, "trim-compacted") == 0

    leader = _describe(up, "trim-errors")["leader"]
    other = next(b for b in (1, 2, 3) if b != leader)
    client = KafkaAdminClient(bootstrap_servers=up.bootstrap, request_timeout_ms=30_000)
    try:
        with pytest.raises(NotLeaderForPartitionError):
            client.delete_records({KTopicPartition("trim-errors", 0): 5}, partition_leader_id=other)
        with pytest.raises(UnknownTopicOrPartitionError):
            client.delete_records({KTopicPartition("never-made", 0): 5}, partition_leader_id=leader)
    finally:
        client.close()


def test_a_follower_behind_the_log_start_catches_up_inside_a_batch(
    up: UpProcess, admin: AdminClient
) -> None:
    from kafka import KafkaProducer

    topic = "trim-catchup"
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(timeout=TIMEOUT_S)
    _produce(up.bootstrap, topic, 20)
    before = _describe(up, topic)
    follower = next(b for b in before["replicas"] if b != before["leader"])
    assert up.raylog("brokers", "stop", str(follower)).returncode == 0
    try:
        wait_until(
            lambda: follower not in _describe(up, topic)["isr"],
            timeout_s=TIMEOUT_S,
            message=f"broker {follower} out of the ISR",
        )
        # Offsets 20-39 in one batch (one linger), and the log start inside it.
        producer = KafkaProducer(bootstrap_servers=up.bootstrap, linger_ms=2_000, acks="all")
        try:
            producer.partitions_for(topic)  # metadata first: all 20 then wait in one linger
            for i in range(20, 40):
                producer.send(topic, key=b"k%d" % i, value=b"v%d" % i)
            producer.flush(timeout=TIMEOUT_S)
        finally:
            producer.close()
        assert _delete(admin, topic, 30).low_watermark == 30
    finally:
        assert up.raylog("brokers", "start", str(follower)).returncode == 0
    wait_until(
        lambda: follower in _describe(up, topic)["isr"],
        timeout_s=TIMEOUT_S,
        message=f"broker {follower} back in the ISR",
    )
    # Its log was started over at 30, then restarted at the base offset of the batch holding 30.
    (partition_dir,) = up.data_dir.glob(f"**/broker-{follower}/{topic}-0")
    assert min(int(p.stem) for p in partition_dir.glob("*.log")) == 20
    assert (partition_dir / LOG_START_OFFSET_CHECKPOINT).read_text() == "0\n30\n"
    _lead(up, topic, follower)
    assert _low_watermark(up.bootstrap, topic) == 30
    assert _first_offset_from_earliest(up.bootstrap, topic) == 30
