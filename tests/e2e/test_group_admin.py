"""Group admin APIs with real admin clients against a real embedded cluster (`raylog up`).

Proves, on the session's shared 3-broker cluster and one 3-partition RF=3 topic:

(a) kafka-python ``KafkaAdminClient`` (3.0 names: ``list_groups``, ``describe_groups``,
    ``delete_groups``, ``delete_group_offsets``): a Stable group (a live confluent-kafka
    consumer) is listed from the broker that coordinates it with its state, described with its
    member's client id, host and assignment, refused deletion (NON_EMPTY_GROUP) and refused the
    deletion of its subscribed topic's offsets (GROUP_SUBSCRIBED_TO_TOPIC); once the consumer
    leaves it is Empty, its offsets can be deleted, it can be deleted, it is no longer listed
    and is described as not found (DescribeGroups v6); an unknown group is GROUP_ID_NOT_FOUND.
(b) confluent-kafka ``AdminClient`` (``list_consumer_groups`` with and without a state filter,
    ``describe_consumer_groups``, ``delete_consumer_groups``): the same story through librdkafka
    (ListGroups v5, DescribeGroups v5 after its ConsumerGroupDescribe probe falls back,
    DeleteGroups v2). confluent-kafka 2.16's Python API has no ``delete_consumer_group_offsets``,
    so OffsetDelete is driven by kafka-python only.
(c) deletion is durable (last: it kills a broker): a deleted group and offsets deleted with
    OffsetDelete stay gone after the coordinator's broker is killed (``raylog brokers kill``) and
    the new coordinator replays ``__consumer_offsets``, and again after it is started and leads
    the partition again, while a group of the same partition keeps its other offsets.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.cluster import UpProcess
from support.waiting import wait_until

from raylog.gateway.internal_topic import partition_for

pytestmark = pytest.mark.slow

TOPIC = "admin-grouped"
PARTITIONS = 3
RECORDS = 30
OFFSETS_PARTITIONS = 3  # offsets.topic.num.partitions in raylog
CLIENT_TIMEOUT_S = 90.0
FAILOVER_TIMEOUT_S = 120.0
NO_OFFSET = -1001  # librdkafka's "no committed offset"


@pytest.fixture(scope="module")
def cluster(shared_up: UpProcess) -> UpProcess:
    """The session's shared cluster (tests/conftest.py) with this module's topic."""
    up = shared_up
    ok(up.raylog(
        "topics", "create", TOPIC, "--partitions", str(PARTITIONS),
        "--replication-factor", "3",
    ))  # fmt: skip
    producer = Producer({"bootstrap.servers": up.bootstrap, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=f"v{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    return up


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# --- helpers -------------------------------------------------------------------------------------


def member(bootstrap: str, group: str) -> Consumer:
    """A confluent-kafka consumer that has joined ``group`` and holds an assignment (librdkafka
    heartbeats from its own thread, so the group stays Stable while the test goes on)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": f"{group}-member",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000,
        }
    )
    consumer.subscribe([TOPIC])

    def assigned() -> bool:
        message = consumer.poll(0.2)
        assert message is None or message.error() is None, message.error()
        return len(consumer.assignment()) == PARTITIONS

    wait_until(assigned, timeout_s=CLIENT_TIMEOUT_S, interval_s=0, message=f"{group} assigned")
    consumer.commit(
        offsets=[TopicPartition(TOPIC, p, 5) for p in range(PARTITIONS)], asynchronous=False
    )
    return consumer


def simple_commit(bootstrap: str, group: str, offsets: dict[int, int]) -> None:
    """Commit without joining (assign(), generation -1): the group exists only by its offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(
            offsets=[TopicPartition(TOPIC, p, o) for p, o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def committed(bootstrap: str, group: str) -> dict[int, int] | None:
    """The group's committed offsets (NO_OFFSET where none); None while no coordinator answers."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed(
            [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10
        )
        return {tp.partition: tp.offset for tp in found}
    except KafkaException:  # the coordinator is moving or loading
        return None
    finally:
        consumer.close()


def kafka_python_admin(bootstrap: str) -> Any:
    from kafka import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)


def confluent_admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def kp_list(admin: Any, **filters: Any) -> list[dict[str, Any]]:
    """kafka-python's ``list_groups`` (every broker), once no broker is still loading its
    ``__consumer_offsets`` partitions: until then one answers COORDINATOR_LOAD_IN_PROGRESS, as
    Kafka does, and kafka-python raises it rather than retrying."""
    from kafka.errors import CoordinatorLoadInProgressError

    def attempt() -> tuple[list[dict[str, Any]]] | None:
        try:
            return (admin.list_groups(**filters),)
        except CoordinatorLoadInProgressError:
            return None

    return wait_until(attempt, timeout_s=CLIENT_TIMEOUT_S, interval_s=0.5, message="ListGroups")[0]


def ck_list(admin: AdminClient, **filters: Any) -> list[Any]:
    """confluent-kafka's ``list_consumer_groups`` once every broker answers without an error
    (librdkafka reports a loading broker's COORDINATOR_LOAD_IN_PROGRESS in ``errors``)."""

    def attempt() -> tuple[list[Any]] | None:
        result = admin.list_consumer_groups(request_timeout=30, **filters).result()
        return None if result.errors else (result.valid,)

    return wait_until(attempt, timeout_s=CLIENT_TIMEOUT_S, interval_s=0.5, message="ListGroups")[0]


def offsets_partition(up: UpProcess, partition: int) -> dict[str, Any]:
    [topic] = json.loads(ok(up.raylog("topics", "describe", "__consumer_offsets", "--json")))
    [found] = [p for p in topic["partitions"] if p["partition"] == partition]
    return found  # type: ignore[no-any-return]


def group_in(partition: int, prefix: str) -> str:
    return next(
        f"{prefix}-{i}"
        for i in range(1000)
        if partition_for(f"{prefix}-{i}", OFFSETS_PARTITIONS) == partition
    )


# --- (a) kafka-python ----------------------------------------------------------------------------


def test_kafka_python_admin_lists_describes_and_deletes(cluster: UpProcess) -> None:
    from kafka.errors import GroupIdNotFoundError, GroupSubscribedToTopicError, NoError
    from kafka.structs import TopicPartition as KpTopicPartition

    group = "kp-admin"
    consumer = member(cluster.bootstrap, group)
    admin = kafka_python_admin(cluster.bootstrap)
    try:
        listed = {g["group_id"]: g for g in kp_list(admin)}  # asks every broker
        assert listed[group]["protocol_type"] == "consumer"
        assert listed[group]["group_state"] == "Stable"
        stable = [g["group_id"] for g in kp_list(admin, states_filter=["Stable"])]
        assert group in stable
        assert group not in [g["group_id"] for g in kp_list(admin, states_filter=["Empty"])]

        described = admin.describe_groups([group])[group]
        assert described["error"] is None
        assert (described["group_state"], described["protocol_type"]) == ("Stable", "consumer")
        assert described["protocol_data"] == "range"  # librdkafka's first assignor
        [m] = described["members"]
        assert m["client_id"] == f"{group}-member" and m["client_host"] == "/127.0.0.1"
        assignment = m["member_assignment"]
        assigned = {
            (a["topic"], p) for a in assignment["assigned_partitions"] for p in a["partitions"]
        }
        assert assigned == {(TOPIC, p) for p in range(PARTITIONS)}

        assert admin.delete_groups([group]) == {group: "NonEmptyGroupError"}
        refused = admin.delete_group_offsets(group, [KpTopicPartition(TOPIC, 0)])
        assert refused == {KpTopicPartition(TOPIC, 0): GroupSubscribedToTopicError}

        consumer.close()  # LeaveGroup: the group is Empty, with its offsets
        consumer = None
        wait_until(
            lambda: admin.describe_groups([group])[group]["group_state"] == "Empty",
            timeout_s=CLIENT_TIMEOUT_S,
            interval_s=0.2,
            message="the group Empty",
        )
        removed = admin.delete_group_offsets(group, [KpTopicPartition(TOPIC, 0)])
        assert removed == {KpTopicPartition(TOPIC, 0): NoError}
        assert committed(cluster.bootstrap, group) == {0: NO_OFFSET, 1: 5, 2: 5}

        assert admin.delete_groups([group, "kp-never"]) == {
            group: "OK",
            "kp-never": "GroupIdNotFoundError",
        }
        assert group not in [g["group_id"] for g in kp_list(admin)]
        gone = admin.describe_groups([group])[group]  # DescribeGroups v6: not found
        assert gone["group_state"] == "Dead" and GroupIdNotFoundError.__name__ in gone["error"]
        assert committed(cluster.bootstrap, group) == dict.fromkeys(range(PARTITIONS), NO_OFFSET)
    finally:
        if consumer is not None:
            consumer.close()
        admin.close()


# --- (b) confluent-kafka -------------------------------------------------------------------------


def test_confluent_admin_lists_describes_and_deletes(cluster: UpProcess) -> None:
    group = "ck-admin"
    consumer = member(cluster.bootstrap, group)
    admin = confluent_admin(cluster.bootstrap)
    try:
        listing = {g.group_id: g for g in ck_list(admin)}[group]
        assert listing.state == ConsumerGroupState.STABLE
        assert not listing.is_simple_consumer_group
        empty_only = ck_list(admin, states={ConsumerGroupState.EMPTY})
        assert group not in [g.group_id for g in empty_only]

        description = admin.describe_consumer_groups([group], request_timeout=30)[group].result()
        assert description.state == ConsumerGroupState.STABLE
        assert not description.is_simple_consumer_group
        assert description.partition_assignor == "range"
        [m] = description.members
        assert m.client_id == f"{group}-member" and m.host == "/127.0.0.1"
        assert {(tp.topic, tp.partition) for tp in m.assignment.topic_partitions} == {
            (TOPIC, p) for p in range(PARTITIONS)
        }
        assert description.coordinator is not None

        refused = admin.delete_consumer_groups([group], request_timeout=30)[group]
        with pytest.raises(KafkaException, match="NON_EMPTY_GROUP"):
            refused.result()

        consumer.close()
        consumer = None
        wait_until(
            lambda: (
                admin.describe_consumer_groups([group])[group].result().state
                == ConsumerGroupState.EMPTY
            ),
            timeout_s=CLIENT_TIMEOUT_S,
            interval_s=0.2,
            message="the group Empty",
        )
        assert admin.delete_consumer_groups([group], request_timeout=30)[group].result() is None
        assert group not in [g.group_id for g in ck_list(admin)]
        dead = admin.describe_consumer_groups([group], request_timeout=30)[group].result()
        assert dead.state == ConsumerGroupState.DEAD and dead.members == []
        unknown = admin.delete_consumer_groups(["ck-never"], request_timeout=30)["ck-never"]
        with pytest.raises(KafkaException, match="GROUP_ID_NOT_FOUND"):
            unknown.result()
        assert committed(cluster.bootstrap, group) == dict.fromkeys(range(PARTITIONS), NO_OFFSET)
    finally:
        if consumer is not None:
            consumer.close()


# --- (c) durable across a coordinator failover and restart ---------------------------------------


def test_deletions_survive_the_coordinators_restart(cluster: UpProcess) -> None:
    from kafka.errors import NoError
    from kafka.structs import TopicPartition as KpTopicPartition

    partition = 0
    gone, kept = group_in(partition, "gone"), group_in(partition, "kept")
    simple_commit(cluster.bootstrap, gone, {0: 3, 1: 4, 2: 5})
    simple_commit(cluster.bootstrap, kept, {0: 6, 1: 7, 2: 8})
    kept_after = {0: 6, 1: NO_OFFSET, 2: 8}

    admin = confluent_admin(cluster.bootstrap)
    listing = {g.group_id: g for g in ck_list(admin)}
    assert listing[gone].is_simple_consumer_group  # no protocol type: offsets only
    assert admin.delete_consumer_groups([gone], request_timeout=30)[gone].result() is None
    kp_admin = kafka_python_admin(cluster.bootstrap)
    try:
        removed = kp_admin.delete_group_offsets(kept, [KpTopicPartition(TOPIC, 1)])
    finally:
        kp_admin.close()
    assert removed == {KpTopicPartition(TOPIC, 1): NoError}
    assert committed(cluster.bootstrap, gone) == dict.fromkeys(range(PARTITIONS), NO_OFFSET)
    assert committed(cluster.bootstrap, kept) == kept_after

    # 1. Kill the coordinator: another broker leads the partition and replays it.
    state = offsets_partition(cluster, partition)
    old = state["leader"]
    killed_at = time.monotonic()
    ok(cluster.raylog("brokers", "kill", str(old)))
    wait_until(
        lambda: offsets_partition(cluster, partition)["leader"] not in (old, -1),
        timeout_s=FAILOVER_TIMEOUT_S,
        interval_s=0.5,
        message="a new coordinator",
    )
    wait_until(
        lambda: committed(cluster.bootstrap, kept) == kept_after,
        timeout_s=FAILOVER_TIMEOUT_S,
        interval_s=0.5,
        message="the kept group's offsets from the new coordinator",
    )
    print(f"coordinator failover: offsets back {time.monotonic() - killed_at:.1f} s after kill")
    assert committed(cluster.bootstrap, gone) == dict.fromkeys(range(PARTITIONS), NO_OFFSET)
    # ListGroups of the new coordinator alone (the killed broker cannot answer one).
    new = offsets_partition(cluster, partition)["leader"]
    kp_admin = kafka_python_admin(cluster.bootstrap)
    try:
        listed = [g["group_id"] for g in kp_list(kp_admin, broker_ids=[new])]
    finally:
        kp_admin.close()
    assert kept in listed and gone not in listed

    # 2. Start it again and give it the partition back: it replays its own copy of the log.
    ok(cluster.raylog("brokers", "start", str(old)))
    wait_until(
        lambda: old in offsets_partition(cluster, partition)["isr"],
        timeout_s=FAILOVER_TIMEOUT_S,
        interval_s=0.5,
        message=f"broker {old} back in the ISR",
    )
    preferred = offsets_partition(cluster, partition)["replicas"][0]

    def preferred_leads() -> bool:
        if offsets_partition(cluster, partition)["leader"] == preferred:
            return True
        cluster.raylog(
            "leader-election", "--preferred", "--topic", "__consumer_offsets",
            "--partition", str(partition),
        )  # fmt: skip
        return False

    wait_until(
        preferred_leads,
        timeout_s=FAILOVER_TIMEOUT_S,
        interval_s=1.0,
        message=f"broker {preferred} leading again",
    )
    wait_until(
        lambda: committed(cluster.bootstrap, kept) == kept_after,
        timeout_s=FAILOVER_TIMEOUT_S,
        interval_s=0.5,
        message="the kept group's offsets after the restart",
    )
    assert committed(cluster.bootstrap, gone) == dict.fromkeys(range(PARTITIONS), NO_OFFSET)
    final = [g.group_id for g in ck_list(admin)]
    assert kept in final and gone not in final
