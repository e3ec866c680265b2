"""Admin APIs through the gateway, driven by the clients' own admin classes on `raylog up`.

On the session's shared embedded cluster (``raylog up``, three brokers in racks a, b, c).
Proves:

- confluent-kafka's AdminClient creates an RF=3 topic with configs through any broker's gateway
  (the request reaches the active controller); Metadata then lists three replicas per partition,
  and DescribeConfigs and ``raylog topics describe`` show the configs;
- AlterConfigs replaces the overrides and IncrementalAlterConfigs patches them, each seen
  afterwards through DescribeConfigs and the CLI; the topic's replicas (the new configs applied
  in place) then take acks=all writes and stay fully replicated;
- duplicate topic, replication factor above the brokers, a bad config value: Kafka's errors
  (TOPIC_ALREADY_EXISTS, INVALID_REPLICATION_FACTOR, INVALID_CONFIG) with messages;
- broker configs: ``auto.create.topics.enable`` is false, read-only, and a producer writing to
  a topic that does not exist gets UNKNOWN_TOPIC (nothing is created);
- CreatePartitions grows a topic (Metadata lists the new partitions, placed on three brokers)
  and refuses to shrink one; ElectLeaders (preferred) answers ELECTION_NOT_NEEDED for a
  partition its preferred replica already leads;
- DeleteTopics: Metadata stops listing the topic and producing to it fails;
- kafka-python's KafkaAdminClient does the same round: create with configs, describe,
  alter (it uses IncrementalAlterConfigs), errors, delete;
- a topic created with cleanup.policy=delete,compact describes it as compact,delete with the
  compaction keys (a double among them); its replicas take keyed records (also tombstones) and
  refuse a record without a key with INVALID_RECORD, from confluent-kafka and from kafka-python
  with gzip and lz4 batches; SUBTRACT compact lifts the refusal in place, APPEND brings it back.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import ElectionType, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from support.cluster import UpProcess
from support.waiting import wait_until

pytestmark = pytest.mark.slow

TIMEOUT_S = 60.0
PRODUCE_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def up(shared_up: UpProcess) -> UpProcess:
    return shared_up


@pytest.fixture(scope="module")
def admin(up: UpProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": up.bootstrap})


def _error(future: Any) -> KafkaError:
    with pytest.raises(KafkaException) as caught:
        future.result(timeout=TIMEOUT_S)
    return caught.value.args[0]


def _topic_configs(admin: AdminClient, name: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ResourceType.TOPIC, name)
    return admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)


def _cli_configs(up: UpProcess, name: str) -> str:
    out = up.raylog("topics", "describe", name)
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if "Configs:" in line)
    return line.split("Configs:")[1].strip()


def test_create_rf3_topic_with_configs(up: UpProcess, admin: AdminClient) -> None:
    topic = NewTopic(
        "orders",
        num_partitions=2,
        replication_factor=3,
        config={"retention.ms": "3600000", "min.insync.replicas": "2"},
    )
    admin.create_topics([topic], operation_timeout=30)["orders"].result(timeout=TIMEOUT_S)
    listed = admin.list_topics("orders", timeout=TIMEOUT_S).topics["orders"]
    assert listed.error is None
    assert sorted(listed.partitions) == [0, 1]
    assert all(sorted(p.replicas) == [1, 2, 3] for p in listed.partitions.values())
    entries = _topic_configs(admin, "orders")
    assert entries["retention.ms"].value == "3600000"
    assert entries["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not entries["retention.ms"].is_default
    assert entries["segment.ms"].is_default and entries["segment.ms"].value == "604800000"
    assert _cli_configs(up, "orders") == "min.insync.replicas=2,retention.ms=3600000"


def test_create_errors(admin: AdminClient) -> None:
    admin.create_topics([NewTopic("dup", 1, 1)])["dup"].result(timeout=TIMEOUT_S)
    futures = admin.create_topics(
        [
            NewTopic("dup", 1, 1),
            NewTopic("too-many-replicas", 1, 5),
            NewTopic("bad-config", 1, 1, config={"retention.ms": "soon"}),
        ],
        operation_timeout=30,
    )
    dup = _error(futures["dup"])
    assert dup.code() == KafkaError.TOPIC_ALREADY_EXISTS and "already exists" in dup.str()
    rf = _error(futures["too-many-replicas"])
    assert rf.code() == KafkaError.INVALID_REPLICATION_FACTOR and "5" in rf.str()
    config = _error(futures["bad-config"])
    assert config.code() == KafkaError.INVALID_CONFIG and "retention.ms" in config.str()
    assert "too-many-replicas" not in admin.list_topics(timeout=TIMEOUT_S).topics


def test_alter_and_incrementally_alter(up: UpProcess, admin: AdminClient) -> None:
    admin.create_topics([NewTopic("tuned", 1, 3, config={"retention.ms": "1000"})])["tuned"].result(
        timeout=TIMEOUT_S
    )
    assert _produce_errors(up.bootstrap, "tuned") == []  # the leader's log holds its epoch
    # AlterConfigs replaces the whole set: retention.ms goes back to its default.
    replace = ConfigResource(ResourceType.TOPIC, "tuned", set_config={"segment.ms": "7000"})
    admin.alter_configs([replace])[replace].result(timeout=TIMEOUT_S)
    entries = _topic_configs(admin, "tuned")
    assert (entries["segment.ms"].value, entries["retention.ms"].is_default) == ("7000", True)
    assert _cli_configs(up, "tuned") == "segment.ms=7000"
    patch = ConfigResource(
        ResourceType.TOPIC,
        "tuned",
        incremental_configs=[
            ConfigEntry("retention.ms", "5000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ],
    )
    admin.incremental_alter_configs([patch])[patch].result(timeout=TIMEOUT_S)
    entries = _topic_configs(admin, "tuned")
    assert (entries["retention.ms"].value, entries["segment.ms"].is_default) == ("5000", True)
    assert _cli_configs(up, "tuned") == "retention.ms=5000"
    bad = ConfigResource(
        ResourceType.TOPIC,
        "tuned",
        incremental_configs=[
            ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND)
        ],
    )
    error = _error(admin.incremental_alter_configs([bad])[bad])
    assert error.code() == KafkaError.INVALID_CONFIG and "append" in error.str()
    # Each change was applied to the running replicas: writes with acks=all go on, and the ISR
    # stays whole.
    assert _produce_errors(up.bootstrap, "tuned") == []
    wait_until(
        lambda: _cli_isr(up, "tuned") == [1, 2, 3],
        timeout_s=TIMEOUT_S,
        message="the ISR of tuned-0 whole after the config changes",
    )
    assert _produce_errors(up.bootstrap, "tuned") == []


def test_create_partitions_and_elect_leaders(admin: AdminClient) -> None:
    admin.create_topics([NewTopic("growing", 1, 3)])["growing"].result(timeout=TIMEOUT_S)
    futures = admin.create_partitions([NewPartitions("growing", 3)], operation_timeout=30)
    futures["growing"].result(timeout=TIMEOUT_S)
    listed = admin.list_topics("growing", timeout=TIMEOUT_S).topics["growing"]
    assert sorted(listed.partitions) == [0, 1, 2]
    assert all(sorted(p.replicas) == [1, 2, 3] for p in listed.partitions.values())
    shrink = admin.create_partitions([NewPartitions("growing", 2)])["growing"]
    assert _error(shrink).code() == KafkaError.INVALID_PARTITIONS
    # A new topic's partitions are led by their preferred replicas: nothing to elect.
    future = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("growing", 0)])
    (outcome,) = future.result(timeout=TIMEOUT_S).values()
    assert outcome is not None and outcome.code() == KafkaError.ELECTION_NOT_NEEDED


def test_broker_configs_and_no_auto_creation(up: UpProcess, admin: AdminClient) -> None:
    resource = ConfigResource(ResourceType.BROKER, "2")
    entries = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    auto = entries["auto.create.topics.enable"]
    assert (auto.value, auto.is_read_only, auto.is_default) == ("false", True, True)
    assert entries["num.partitions"].value == "1"
    failed = _produce_errors(up.bootstrap, "never-created")
    assert [e.code() for e in failed] == [KafkaError.UNKNOWN_TOPIC_OR_PART]
    assert "never-created" not in admin.list_topics(timeout=TIMEOUT_S).topics


def _cli_isr(up: UpProcess, name: str) -> list[int]:
    done = up.raylog("topics", "describe", name, "--json")
    assert done.returncode == 0, done.stderr
    return sorted(json.loads(done.stdout)[0]["partitions"][0]["isr"])


def _produce_errors(bootstrap: str, topic: str, key: bytes | None = None) -> list[KafkaError]:
    # A topic missing from Metadata fails after topic.metadata.propagation.max.ms with the
    # broker's own UNKNOWN_TOPIC_OR_PART. A new topic's replica actors may take a while to
    # start on a loaded machine (NOT_LEADER_OR_FOLLOWER until then, retried by the client):
    # hence the long message timeout.
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "message.timeout.ms": int(PRODUCE_TIMEOUT_S * 1000),
            "topic.metadata.propagation.max.ms": 1000,
        }
    )
    errors: list[KafkaError] = []
    producer.produce(topic, b"v", key=key, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(PRODUCE_TIMEOUT_S + TIMEOUT_S) == 0
    return [e for e in errors if e is not None]


def test_delete_topic(up: UpProcess, admin: AdminClient) -> None:
    admin.create_topics([NewTopic("doomed", 1, 3)])["doomed"].result(timeout=TIMEOUT_S)
    assert _produce_errors(up.bootstrap, "doomed") == []
    admin.delete_topics(["doomed"], operation_timeout=30)["doomed"].result(timeout=TIMEOUT_S)
    assert "doomed" not in admin.list_topics(timeout=TIMEOUT_S).topics

    def refused() -> list[int]:
        # Another broker's metadata may list the topic until its next refresh, as in Kafka: a
        # producer that first sees it there fails with librdkafka's local _UNKNOWN_PARTITION
        # (-190) when the next metadata drops it. Once every broker's has, the broker's own
        # UNKNOWN_TOPIC_OR_PART comes back.
        codes = [e.code() for e in _produce_errors(up.bootstrap, "doomed")]
        assert codes in ([KafkaError.UNKNOWN_TOPIC_OR_PART], [KafkaError._UNKNOWN_PARTITION])
        return codes if codes == [KafkaError.UNKNOWN_TOPIC_OR_PART] else []

    wait_until(refused, timeout_s=TIMEOUT_S, message="UNKNOWN_TOPIC_OR_PART for the deleted topic")
    missing = _error(admin.delete_topics(["doomed"])["doomed"])
    assert missing.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_kafka_python_admin_client(up: UpProcess) -> None:
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.errors import InvalidReplicationFactorError, TopicAlreadyExistsError

    client = KafkaAdminClient(bootstrap_servers=up.bootstrap, request_timeout_ms=30000)
    try:
        spec = {"replication_factor": 3, "num_partitions": 1, "configs": {"retention.ms": "900"}}
        client.create_topics({"kp": spec}, timeout_ms=30000)
        with pytest.raises(TopicAlreadyExistsError):
            client.create_topics({"kp": spec}, timeout_ms=30000)
        with pytest.raises(InvalidReplicationFactorError):
            client.create_topics({"kp2": {**spec, "replication_factor": 4}}, timeout_ms=30000)
        resource = KConfigResource(ConfigResourceType.TOPIC, "kp")
        described = client.describe_configs([resource], config_filter="all")
        assert described["topic"]["kp"]["retention.ms"]["value"] == "900"
        client.alter_configs(
            [KConfigResource(ConfigResourceType.TOPIC, "kp", {"retention.ms": "1200"})]
        )
        described = client.describe_configs([resource], config_filter="all")
        assert described["topic"]["kp"]["retention.ms"]["value"] == "1200"
        assert _cli_configs(up, "kp") == "retention.ms=1200"
        client.delete_topics(["kp"], timeout_ms=30000)
        # Another broker's metadata may list it until its next refresh, as in Kafka.
        wait_until(lambda: "kp" not in client.list_topics(), timeout_s=30, message="kp deleted")
    finally:
        client.close()


def test_a_compacted_topic_refuses_records_without_a_key(up: UpProcess, admin: AdminClient) -> None:
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    configs = {"cleanup.policy": "delete,compact", "min.cleanable.dirty.ratio": "0.25"}
    admin.create_topics([NewTopic("keyed", 1, 3, config=configs)])["keyed"].result(
        timeout=TIMEOUT_S
    )
    entries = _topic_configs(admin, "keyed")
    assert entries["cleanup.policy"].value == "compact,delete"
    assert entries["min.cleanable.dirty.ratio"].value == "0.25"
    assert not entries["min.cleanable.dirty.ratio"].is_default
    assert (entries["delete.retention.ms"].value, entries["delete.retention.ms"].is_default) == (
        "86400000",
        True,
    )
    assert _produce_errors(up.bootstrap, "keyed", key=b"k") == []
    assert [e.code() for e in _produce_errors(up.bootstrap, "keyed")] == [KafkaError.INVALID_RECORD]

    for codec in ("gzip", "lz4"):  # the replica decompresses the batch to look at the keys
        producer = KafkaProducer(bootstrap_servers=up.bootstrap, acks="all", compression_type=codec)
        try:
            producer.send("keyed", key=b"k", value=b"v").get(timeout=TIMEOUT_S)
            producer.send("keyed", key=b"k", value=None).get(timeout=TIMEOUT_S)  # a tombstone
            with pytest.raises(InvalidRecordError):
                producer.send("keyed", value=b"no key").get(timeout=TIMEOUT_S)
        finally:
            producer.close(timeout=TIMEOUT_S)

    def patch(op: AlterConfigOpType) -> None:
        resource = ConfigResource(
            ResourceType.TOPIC,
            "keyed",
            incremental_configs=[
                ConfigEntry("cleanup.policy", "compact", incremental_operation=op)
            ],
        )
        admin.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT_S)

    # Brokers apply a config change to their running replicas after the controller stored it.
    patch(AlterConfigOpType.SUBTRACT)
    assert _topic_configs(admin, "keyed")["cleanup.policy"].value == "delete"
    wait_until(
        lambda: _produce_errors(up.bootstrap, "keyed") == [],
        timeout_s=TIMEOUT_S,
        interval_s=0.5,
        message="a record without a key accepted once compact is subtracted",
    )
    patch(AlterConfigOpType.APPEND)
    assert _topic_configs(admin, "keyed")["cleanup.policy"].value == "compact,delete"
    wait_until(
        lambda: (
            [e.code() for e in _produce_errors(up.bootstrap, "keyed")]
            == [KafkaError.INVALID_RECORD]
        ),
        timeout_s=TIMEOUT_S,
        interval_s=0.5,
        message="a record without a key refused again once compact is appended",
    )
