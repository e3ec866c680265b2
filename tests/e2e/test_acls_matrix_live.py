"""Kafka's ACL matrix on a live `raylog up`: each API a SASL user drives through a real client is
refused without its permission, changes nothing, and works once `raylog acls add` grants it.

On the session's security cluster (tests/support/secure_cluster.py; shared with
test_client_security.py): two brokers, the StandardAuthorizer, ``super.users=User:admin``; the
clients use its SASL_PLAINTEXT listener on loopback, as the super user ``admin`` and as
``alice``, a SCRAM-SHA-512 user this module creates. alice may DESCRIBE the groups named
``alice-*`` (so her consumers find their coordinator) and nothing else until a test grants it.
Every topic has one replica; the module deletes its topics at the end. Each test drives one
API as alice with confluent-kafka (a raw ListOffsets request through kafka-python's client, as
the clients' own list_offsets stop at Metadata; Produce, Fetch and DeleteRecords with DESCRIBE
on the topic granted first, for the same reason):
Kafka's error first (TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED,
CLUSTER_AUTHORIZATION_FAILED) with admin seeing nothing changed (no record written, no topic
created or deleted, configs, partitions, committed offsets, records and groups as they were),
then the ACL added with `raylog acls add`, retried until the gateway has it (a deadline), and
the change seen by admin. Proves:

- Produce WRITE, Fetch READ, ListOffsets DESCRIBE, Metadata DESCRIBE (a topic alice may not
  describe is left out of the list of all topics), CreateTopics CREATE on the topic or on the
  cluster, DeleteTopics DELETE, CreatePartitions ALTER, DescribeConfigs DESCRIBE_CONFIGS (topic;
  CLUSTER_AUTHORIZATION_FAILED for a broker), AlterConfigs and IncrementalAlterConfigs
  ALTER_CONFIGS, DeleteRecords DELETE, ElectLeaders ALTER on the cluster (one replica: the
  election allowed finds nothing to elect, the one refused moves nothing); JoinGroup and
  OffsetCommit READ on the group and OffsetCommit READ on the topic; DescribeGroups and
  ListGroups DESCRIBE on the group; DeleteGroups DELETE on the group;
- a literal DENY beats a prefixed ALLOW, and a prefixed ALLOW covers topics created after it;
- the cluster-wide grants are revoked with `raylog acls remove` and refused again;
- ACLs of other principals managed by three tools at once: `raylog acls add` (PREFIXED, two
  operations) creates ACLs that kafka-python's KafkaAdminClient and confluent-kafka's
  AdminClient (both v1, as admin) describe alike, and that `raylog acls list --json` lists with
  theirs (beside the ACLs the cluster held before); both clients create ACLs through the
  gateway, a CLUSTER ACL not named kafka-cluster is refused (INVALID_REQUEST), and both delete
  by filter (DeleteAcls), answering the ACLs deleted.

A DENY added and removed with the CLI stopping and then letting through a producer's writes is
test_client_security.py's (for a SCRAM user); ``allow.everyone.if.no.acl.found`` is
tests/actors/control/test_acls.py's and tests/gateway/test_acl_handlers.py's.
"""

from __future__ import annotations

import functools
import json
import subprocess
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    ElectionType,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KResourceType
from kafka.protocol.consumer import ListOffsetsRequest
from support.cluster import UpProcess
from support.secure_cluster import SUPER_PASSWORD, SUPER_USER, SecureCluster, create_user
from support.waiting import wait_until

pytestmark = pytest.mark.slow

TIMEOUT_S = 30.0
GRANT_DEADLINE_S = 30.0  # gateways poll the metadata every 200 ms; generous for a loaded machine
POLL_S = 0.2
TOPIC_DENIED = KafkaError.TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED = KafkaError.GROUP_AUTHORIZATION_FAILED
CLUSTER_DENIED = KafkaError.CLUSTER_AUTHORIZATION_FAILED
PASSWORDS = {SUPER_USER: SUPER_PASSWORD, "alice": "alice-Matrix-Passw0rd"}


@dataclass
class Live:
    up: UpProcess
    sasl: str  # the SASL_PLAINTEXT bootstrap server

    @cached_property
    def admin(self) -> AdminClient:
        """As User:admin, a super user."""
        return AdminClient(self.config(SUPER_USER))

    def config(self, user: str) -> dict[str, str]:
        return {
            "bootstrap.servers": self.sasl,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": PASSWORDS[user],
        }

    def alice(self) -> AdminClient:
        return AdminClient(self.config("alice"))

    def kafka_python(self, user: str) -> KafkaAdminClient:
        """kafka-python's admin client as ``user``."""
        return KafkaAdminClient(
            bootstrap_servers=self.sasl,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username=user,
            sasl_plain_password=PASSWORDS[user],
            request_timeout_ms=int(TIMEOUT_S * 1000),
        )

    def acls(self, verb: str, *acl: str) -> None:
        """``raylog acls VERB --principal User:alice ACL``."""
        ok(self.up.raylog("acls", verb, "--principal", "User:alice", *acl))


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def live(secure_cluster: SecureCluster) -> Iterator[Live]:
    up = secure_cluster.up
    before = up.topics()
    create_user(up, "alice", PASSWORDS["alice"], "SCRAM-SHA-512")
    live = Live(up, secure_cluster.sasl_plaintext)
    live.acls("add", "--operation", "DESCRIBE", "--group", "alice-", "--prefixed")
    yield live
    # The next module on the cluster does not hold this one's replicas (a process each).
    created = sorted(up.topics() - before - {"__consumer_offsets", "__transaction_state"})
    if created:
        ok(up.raylog("topics", "delete", *created))


# --- outcomes ---------------------------------------------------------------------------------


def outcome(future: Future[Any]) -> KafkaError | None:
    """The future's Kafka error, None when it succeeded."""
    try:
        future.result(timeout=TIMEOUT_S)
    except KafkaException as exc:
        return exc.args[0]  # type: ignore[no-any-return]
    return None


def only(futures: dict[Any, Future[Any]]) -> Future[Any]:
    [future] = futures.values()
    return future


def refused(api: str, attempt: Callable[[], KafkaError | None], code: int) -> None:
    error = attempt()
    assert error is not None and error.code() == code, f"{api}: {error}"


def granted(
    live: Live, api: str, attempt: Callable[[], KafkaError | None], code: int, *acl: str
) -> None:
    """Add alice's ``acl`` with `raylog acls add`, then retry ``attempt`` until it succeeds (the
    gateway has the ACL); until then it may fail only with ``code``."""
    live.acls("add", *acl)

    def allowed() -> bool:
        error = attempt()
        assert error is None or error.code() == code, f"{api} once granted {acl}: {error}"
        return error is None

    wait_until(allowed, timeout_s=GRANT_DEADLINE_S, interval_s=POLL_S, message=f"{api} {acl}")


def revoked(
    live: Live, api: str, attempt: Callable[[], KafkaError | None], code: int, *acl: str
) -> None:
    """Remove alice's ``acl`` with `raylog acls remove`; wait until ``attempt`` fails with
    ``code`` again."""
    live.acls("remove", *acl)

    def refused_again() -> bool:
        error = attempt()
        return error is not None and error.code() == code

    wait_until(refused_again, timeout_s=GRANT_DEADLINE_S, interval_s=POLL_S, message=f"{api} off")


# --- what admin sees --------------------------------------------------------------------------


def make_topic(live: Live, name: str, records: int = 0, partitions: int = 1) -> None:
    new = NewTopic(name, num_partitions=partitions, replication_factor=1)
    assert outcome(only(live.admin.create_topics([new], operation_timeout=TIMEOUT_S))) is None
    if records:
        values = (f"admin-{i}" for i in range(records))
        assert produce(live.config(SUPER_USER), name, *values) is None


def produce(config: dict[str, str], topic: str, *values: str) -> KafkaError | None:
    """Produce ``values`` (acks=all); the first delivery error, None when all were written."""
    producer = Producer({**config, "acks": "all", "message.timeout.ms": int(TIMEOUT_S * 1000)})
    errors: list[KafkaError] = []
    for value in values:
        producer.produce(topic, value.encode(), on_delivery=lambda e, _m: e and errors.append(e))
    assert producer.flush(TIMEOUT_S) == 0
    return errors[0] if errors else None


def offsets(live: Live, topic: str) -> tuple[int, int]:
    """Partition 0's (log start offset, end offset), as admin lists them."""
    tp = TopicPartition(topic, 0)
    specs = {tp: OffsetSpec.earliest()}
    start = only(live.admin.list_offsets(specs)).result(timeout=TIMEOUT_S).offset
    specs = {tp: OffsetSpec.latest()}
    end = only(live.admin.list_offsets(specs)).result(timeout=TIMEOUT_S).offset
    return start, end


def topics(live: Live, config: dict[str, str] | None = None) -> set[str]:
    client = live.admin if config is None else AdminClient(config)
    return set(client.list_topics(timeout=TIMEOUT_S).topics)


def partition_count(live: Live, topic: str) -> int:
    return len(live.admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions)


def topic_config(live: Live, topic: str, key: str) -> str:
    resource = ConfigResource("TOPIC", topic)
    described = only(live.admin.describe_configs([resource])).result(timeout=TIMEOUT_S)
    return described[key].value  # type: ignore[no-any-return]


def committed(live: Live, group: str, topic: str) -> int:
    """The group's committed offset of the topic's partition 0 (negative: none)."""
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])
    answer = only(live.admin.list_consumer_group_offsets([request])).result(timeout=TIMEOUT_S)
    return answer.topic_partitions[0].offset  # type: ignore[no-any-return]


def read_all(config: dict[str, str], topic: str, count: int) -> list[str] | KafkaError:
    """The first ``count`` values of partition 0 read with assign (no group join), or the
    Fetch's error."""
    consumer = Consumer({**config, "group.id": "alice-readers", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    read: list[str] = []
    failed: list[KafkaError] = []

    def done() -> bool:
        message = consumer.poll(POLL_S)
        if message is not None and message.error() is not None:
            failed.append(message.error())
        elif message is not None:
            read.append(message.value().decode())
        return bool(failed) or len(read) >= count

    try:
        wait_until(done, timeout_s=TIMEOUT_S, interval_s=0, message=f"{count} records of {topic}")
    finally:
        consumer.close()
    return failed[0] if failed else read


# --- the data APIs ----------------------------------------------------------------------------


def describable(live: Live, topic: str) -> None:
    """Let alice DESCRIBE the topic, and wait until its Metadata shows it: the clients ask
    Metadata for a partition's leader before they send the request under test."""
    live.acls("add", "--operation", "DESCRIBE", "--topic", topic)
    alice = live.config("alice")
    wait_until(lambda: topic in topics(live, alice), timeout_s=GRANT_DEADLINE_S,
               interval_s=POLL_S, message=f"alice's DESCRIBE of {topic}")  # fmt: skip


def test_produce_needs_write_on_the_topic(live: Live) -> None:
    make_topic(live, "produce-t", records=1)
    describable(live, "produce-t")
    alice = live.config("alice")
    refused("Produce", lambda: produce(alice, "produce-t", "refused"), TOPIC_DENIED)
    assert offsets(live, "produce-t") == (0, 1)
    granted(live, "Produce", lambda: produce(alice, "produce-t", "written"), TOPIC_DENIED,
            "--operation", "WRITE", "--topic", "produce-t")  # fmt: skip
    assert read_all(live.config(SUPER_USER), "produce-t", 2) == ["admin-0", "written"]


def test_fetch_needs_read_on_the_topic(live: Live) -> None:
    make_topic(live, "fetch-t", records=3)
    describable(live, "fetch-t")
    alice = live.config("alice")

    def fetch() -> KafkaError | None:
        read = read_all(alice, "fetch-t", 3)
        if isinstance(read, KafkaError):
            return read
        assert read == ["admin-0", "admin-1", "admin-2"]
        return None

    refused("Fetch", fetch, TOPIC_DENIED)
    granted(live, "Fetch", fetch, TOPIC_DENIED, "--operation", "READ", "--topic", "fetch-t")


def test_list_offsets_needs_describe_on_the_topic(live: Live) -> None:
    make_topic(live, "offsets-t", records=2)
    kp = live.kafka_python("alice")
    alice = live.alice()
    listed = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[
            listed(
                name="offsets-t",
                partitions=[listed.ListOffsetsPartition(partition_index=0, timestamp=-1)],
            )
        ],
    )

    # The partition's leader: another broker would answer NOT_LEADER_OR_FOLLOWER.
    leader = live.admin.list_topics("offsets-t", timeout=TIMEOUT_S).topics["offsets-t"]
    to_leader = functools.partial(kp._manager.send, node_id=leader.partitions[0].leader)

    def list_offsets() -> KafkaError | None:
        # The request itself, to the broker: the clients' own list_offsets stop at Metadata,
        # which hides the topic from alice just as well.
        [topic] = kp._manager.run(to_leader, request).topics
        [partition] = topic.partitions
        if partition.error_code:
            return KafkaError(partition.error_code)
        assert partition.offset == 2
        tp = TopicPartition("offsets-t", 0)

        def by_confluent() -> int | None:
            try:
                latest = only(alice.list_offsets({tp: OffsetSpec.latest()}))
                return int(latest.result(timeout=TIMEOUT_S).offset)
            except KafkaException as exc:
                # alice's client looks the leader up in Metadata, which may come from a gateway
                # whose ACL view is a moment behind the leader's: no leader known for it yet.
                if exc.args[0].code() != KafkaError._NOENT:
                    raise
                return None

        offset = wait_until(
            by_confluent, timeout_s=GRANT_DEADLINE_S, interval_s=POLL_S, message="confluent"
        )
        assert offset == 2
        return None

    try:
        refused("ListOffsets", list_offsets, TOPIC_DENIED)
        granted(live, "ListOffsets", list_offsets, TOPIC_DENIED,
                "--operation", "DESCRIBE", "--topic", "offsets-t")  # fmt: skip
    finally:
        kp.close()


def test_metadata_leaves_out_topics_alice_may_not_describe(live: Live) -> None:
    make_topic(live, "visible-t")
    make_topic(live, "hidden-t")
    alice = live.config("alice")

    def listed() -> KafkaError | None:
        seen = topics(live, alice)
        assert "hidden-t" not in seen
        return None if "visible-t" in seen else KafkaError(TOPIC_DENIED)

    refused("Metadata", listed, TOPIC_DENIED)
    named = AdminClient(alice).list_topics("hidden-t", timeout=TIMEOUT_S).topics["hidden-t"]
    assert named.error is not None and named.error.code() == TOPIC_DENIED
    granted(live, "Metadata", listed, TOPIC_DENIED,
            "--operation", "DESCRIBE", "--topic", "visible-t")  # fmt: skip


def test_delete_records_needs_delete_on_the_topic(live: Live) -> None:
    make_topic(live, "trimmed-t", records=5)
    describable(live, "trimmed-t")
    alice = live.alice()

    def delete_records() -> KafkaError | None:
        return outcome(only(alice.delete_records([TopicPartition("trimmed-t", 0, 3)])))

    refused("DeleteRecords", delete_records, TOPIC_DENIED)
    assert offsets(live, "trimmed-t") == (0, 5)
    granted(live, "DeleteRecords", delete_records, TOPIC_DENIED,
            "--operation", "DELETE", "--topic", "trimmed-t")  # fmt: skip
    assert offsets(live, "trimmed-t") == (3, 5)


# --- topic and cluster admin ------------------------------------------------------------------


def create(alice: AdminClient, name: str, validate_only: bool = False) -> KafkaError | None:
    new = NewTopic(name, num_partitions=1, replication_factor=1)
    futures = alice.create_topics([new], operation_timeout=TIMEOUT_S, validate_only=validate_only)
    return outcome(only(futures))


def test_create_topics_needs_create_on_the_topic_or_the_cluster(live: Live) -> None:
    alice = live.alice()
    refused("CreateTopics", lambda: create(alice, "made-t"), TOPIC_DENIED)
    assert "made-t" not in topics(live)
    granted(live, "CreateTopics", lambda: create(alice, "made-t"), TOPIC_DENIED,
            "--operation", "CREATE", "--topic", "made-t")  # fmt: skip
    assert "made-t" in topics(live)
    refused("CreateTopics", lambda: create(alice, "made-on-cluster-t"), TOPIC_DENIED)
    assert "made-on-cluster-t" not in topics(live)
    cluster_create = ("--operation", "CREATE", "--cluster")
    granted(live, "CreateTopics", lambda: create(alice, "made-on-cluster-t"), TOPIC_DENIED,
            *cluster_create)  # fmt: skip
    assert "made-on-cluster-t" in topics(live)
    revoked(live, "CreateTopics", lambda: create(alice, "never-t", validate_only=True),
            TOPIC_DENIED, *cluster_create)  # fmt: skip


def test_delete_topics_needs_delete_on_the_topic(live: Live) -> None:
    make_topic(live, "doomed-t")
    alice = live.alice()

    def delete() -> KafkaError | None:
        return outcome(only(alice.delete_topics(["doomed-t"], operation_timeout=TIMEOUT_S)))

    refused("DeleteTopics", delete, TOPIC_DENIED)
    assert "doomed-t" in topics(live)
    granted(live, "DeleteTopics", delete, TOPIC_DENIED,
            "--operation", "DELETE", "--topic", "doomed-t")  # fmt: skip
    wait_until(lambda: "doomed-t" not in topics(live), timeout_s=TIMEOUT_S, interval_s=POLL_S,
               message="doomed-t deleted")  # fmt: skip


def test_create_partitions_needs_alter_on_the_topic(live: Live) -> None:
    make_topic(live, "grown-t")
    alice = live.alice()

    def grow() -> KafkaError | None:
        new = NewPartitions("grown-t", 2)
        return outcome(only(alice.create_partitions([new], operation_timeout=TIMEOUT_S)))

    refused("CreatePartitions", grow, TOPIC_DENIED)
    assert partition_count(live, "grown-t") == 1
    granted(live, "CreatePartitions", grow, TOPIC_DENIED,
            "--operation", "ALTER", "--topic", "grown-t")  # fmt: skip
    wait_until(lambda: partition_count(live, "grown-t") == 2, timeout_s=TIMEOUT_S,
               interval_s=POLL_S, message="grown-t's second partition")  # fmt: skip


def test_describe_configs_needs_describe_configs(live: Live) -> None:
    make_topic(live, "described-t")
    alice = live.alice()

    def describe(resource: ConfigResource) -> KafkaError | None:
        return outcome(only(alice.describe_configs([resource])))

    broker_id = min(live.admin.list_topics(timeout=TIMEOUT_S).brokers)
    broker = ConfigResource("BROKER", str(broker_id))
    refused("DescribeConfigs of a broker", lambda: describe(broker), CLUSTER_DENIED)
    topic = ConfigResource("TOPIC", "described-t")
    refused("DescribeConfigs", lambda: describe(topic), TOPIC_DENIED)
    granted(live, "DescribeConfigs", lambda: describe(topic), TOPIC_DENIED,
            "--operation", "DESCRIBE_CONFIGS", "--topic", "described-t")  # fmt: skip


def alter_configs(alice: AdminClient, topic: str, value: str) -> KafkaError | None:
    resource = ConfigResource("TOPIC", topic, set_config={"retention.ms": value})
    with warnings.catch_warnings():  # AlterConfigs is the API under test, deprecated or not
        warnings.simplefilter("ignore", DeprecationWarning)
        return outcome(only(alice.alter_configs([resource])))


def incremental_alter_configs(alice: AdminClient, topic: str, value: str) -> KafkaError | None:
    entry = ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("TOPIC", topic, incremental_configs=[entry])
    return outcome(only(alice.incremental_alter_configs([resource])))


@pytest.mark.parametrize(
    "api", [alter_configs, incremental_alter_configs], ids=["AlterConfigs", "Incremental"]
)
def test_altering_configs_needs_alter_configs(live: Live, api: Callable[..., Any]) -> None:
    topic = f"altered-{api.__name__}"
    make_topic(live, topic)
    alice = live.alice()
    before = topic_config(live, topic, "retention.ms")
    refused(api.__name__, lambda: api(alice, topic, "4321000"), TOPIC_DENIED)
    assert topic_config(live, topic, "retention.ms") == before != "4321000"
    granted(live, api.__name__, lambda: api(alice, topic, "4321000"), TOPIC_DENIED,
            "--operation", "ALTER_CONFIGS", "--topic", topic)  # fmt: skip
    assert topic_config(live, topic, "retention.ms") == "4321000"


def test_elect_leaders_needs_alter_on_the_cluster(live: Live) -> None:
    make_topic(live, "elected-t", records=1)
    alice = live.alice()
    tp = TopicPartition("elected-t", 0)

    def elect() -> KafkaError | None:
        future = alice.elect_leaders(ElectionType.PREFERRED, [tp])  # (its kwargs fail in 2.16)
        try:
            results = future.result(timeout=TIMEOUT_S)
        except KafkaException as exc:
            return exc.args[0]  # type: ignore[no-any-return]
        # One replica, already the leader (the preferred one): nothing to elect.
        assert results[tp] is None or results[tp].code() == KafkaError.ELECTION_NOT_NEEDED
        return None

    leader = live.admin.list_topics("elected-t", timeout=TIMEOUT_S).topics["elected-t"]
    refused("ElectLeaders", elect, CLUSTER_DENIED)
    again = live.admin.list_topics("elected-t", timeout=TIMEOUT_S).topics["elected-t"]
    assert again.partitions[0].leader == leader.partitions[0].leader
    alter_cluster = ("--operation", "ALTER", "--cluster")
    granted(live, "ElectLeaders", elect, CLUSTER_DENIED, *alter_cluster)
    # ALTER on the cluster implies DESCRIBE on it, which lists every group: taken back.
    revoked(live, "ElectLeaders", elect, CLUSTER_DENIED, *alter_cluster)


# --- groups -----------------------------------------------------------------------------------


def test_joining_a_group_and_committing_need_read_on_the_group_and_the_topic(live: Live) -> None:
    make_topic(live, "joined-t", records=2)
    live.acls("add", "--operation", "READ", "--topic", "joined-t")
    make_topic(live, "unread-t", records=1)
    group = "alice-joiners"
    consumer = Consumer(
        {
            **live.config("alice"),
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )

    def join_and_commit() -> KafkaError | None:
        # The next record or error: JoinGroup's answer, or the records once joined.
        message = wait_until(lambda: consumer.poll(POLL_S), timeout_s=TIMEOUT_S, interval_s=0,
                             message="a record or JoinGroup's error")  # fmt: skip
        if message.error() is not None:
            return message.error()  # type: ignore[no-any-return]
        assert message.topic() == "joined-t"
        consumer.commit(message=message, asynchronous=False)
        return None

    def commit_unread() -> KafkaError | None:
        try:
            [answer] = consumer.commit(
                offsets=[TopicPartition("unread-t", 0, 1)], asynchronous=False
            )
        except KafkaException as exc:
            return exc.args[0]  # type: ignore[no-any-return]
        return answer.error  # type: ignore[no-any-return]

    try:
        consumer.subscribe(["joined-t"])
        refused("JoinGroup", join_and_commit, GROUP_DENIED)
        assert committed(live, group, "joined-t") < 0
        granted(live, "JoinGroup and OffsetCommit", join_and_commit, GROUP_DENIED,
                "--operation", "READ", "--group", group)  # fmt: skip
        assert committed(live, group, "joined-t") == 1
        refused("OffsetCommit of a topic alice may not read", commit_unread, TOPIC_DENIED)
        assert committed(live, group, "unread-t") < 0
    finally:
        consumer.close()


def admins_group(live: Live, group: str, topic: str) -> None:
    """A group of admin's, empty, with an offset of ``topic`` committed."""
    make_topic(live, topic, records=1)
    consumer = Consumer({**live.config(SUPER_USER), "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    finally:
        consumer.close()
    assert committed(live, group, topic) == 1


def test_describe_and_list_groups_need_describe_on_the_group(live: Live) -> None:
    admins_group(live, "admins-described", "described-g-t")
    alice = live.alice()

    def describe() -> KafkaError | None:
        return outcome(only(alice.describe_consumer_groups(["admins-described"])))

    def listed() -> KafkaError | None:
        groups = alice.list_consumer_groups(request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
        seen = {g.group_id for g in groups.valid}
        return None if "admins-described" in seen else KafkaError(GROUP_DENIED)

    refused("DescribeGroups", describe, GROUP_DENIED)
    refused("ListGroups", listed, GROUP_DENIED)
    granted(live, "DescribeGroups", describe, GROUP_DENIED,
            "--operation", "DESCRIBE", "--group", "admins-described")  # fmt: skip
    assert listed() is None


def test_delete_groups_needs_delete_on_the_group(live: Live) -> None:
    group = "alice-deleted"  # alice may DESCRIBE it: FindCoordinator passes, DeleteGroups decides
    admins_group(live, group, "deleted-g-t")
    alice = live.alice()

    def delete() -> KafkaError | None:
        return outcome(only(alice.delete_consumer_groups([group], request_timeout=TIMEOUT_S)))

    refused("DeleteGroups", delete, GROUP_DENIED)
    assert committed(live, group, "deleted-g-t") == 1
    granted(live, "DeleteGroups", delete, GROUP_DENIED, "--operation", "DELETE", "--group", group)
    assert committed(live, group, "deleted-g-t") < 0


# --- how ACLs combine -------------------------------------------------------------------------


def test_a_literal_deny_beats_a_prefixed_allow(live: Live) -> None:
    make_topic(live, "team-open")
    make_topic(live, "team-secret", records=1)
    alice = live.config("alice")
    # The DENY first: a gateway that has the ALLOW has it too (one metadata history).
    live.acls("add", "--operation", "WRITE", "--deny", "--topic", "team-secret")
    granted(live, "Produce", lambda: produce(alice, "team-open", "open"), TOPIC_DENIED,
            "--operation", "WRITE", "--operation", "DESCRIBE", "--topic", "team-",
            "--prefixed")  # fmt: skip
    refused("Produce denied", lambda: produce(alice, "team-secret", "denied"), TOPIC_DENIED)
    assert offsets(live, "team-secret") == (0, 1)


def test_a_prefixed_allow_covers_topics_created_after_it(live: Live) -> None:
    alice = live.config("alice")
    live.acls("add", "--operation", "CREATE", "--operation", "WRITE", "--operation", "READ",
              "--topic", "fresh-", "--prefixed")  # fmt: skip
    wait_until(
        lambda: create(live.alice(), "fresh-by-alice") is None,
        timeout_s=GRANT_DEADLINE_S,
        interval_s=POLL_S,
        message="the prefixed CREATE",
    )
    make_topic(live, "fresh-by-admin")
    for topic in ("fresh-by-alice", "fresh-by-admin"):
        assert produce(alice, topic, f"{topic}-0") is None
        assert read_all(alice, topic, 1) == [f"{topic}-0"]


# --- managing ACLs ----------------------------------------------------------------------------

Listed = set[tuple[str, ...]]  # (resource type, name, pattern type, principal, operation)


def others(listed: Listed, held: Listed) -> Listed:
    """The ACLs listed but alice's (the ones this module grants her) and those ``held`` (the
    cluster's before the test: the other module's on it)."""
    return {acl for acl in listed - held if acl[3] != "User:alice"}


def cli_listed(live: Live) -> Listed:
    rows = json.loads(ok(live.up.raylog("acls", "list", "--json")))
    return {
        (r["resource_type"], r["resource_name"], r["pattern_type"], r["principal"], r["operation"])
        for r in rows
    }


def kp_listed(kp: KafkaAdminClient) -> Listed:
    everything = ACLFilter(
        principal=None,
        host=None,
        operation=ACLOperation.ANY,
        permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(KResourceType.ANY, None, ACLResourcePatternType.ANY),
    )
    found, error = kp.describe_acls(everything)
    assert error.errno == 0
    return {
        (
            a.resource_pattern.resource_type.name,
            a.resource_pattern.resource_name,
            a.resource_pattern.pattern_type.name,
            a.principal,
            a.operation.name,
        )
        for a in found
    }


def ck_listed(admin: AdminClient) -> Listed:
    everything = AclBindingFilter("ANY", None, "ANY", None, None, "ANY", "ANY")
    found = admin.describe_acls(everything, request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    return {
        (b.restype.name, b.name, b.resource_pattern_type.name, b.principal, b.operation.name)
        for b in found
    }


def test_cli_and_both_clients_manage_the_same_acls(live: Live) -> None:
    held = cli_listed(live)
    ok(live.up.raylog("acls", "add", "--principal", "User:bob", "--operation", "READ",
                      "--operation", "DESCRIBE", "--topic", "orders-", "--prefixed"))  # fmt: skip
    kp = live.kafka_python(SUPER_USER)
    admin = live.admin
    try:
        grace = ACL(
            principal="User:grace",
            host="*",
            operation=ACLOperation.READ,
            permission_type=ACLPermissionType.ALLOW,
            resource_pattern=ResourcePattern(
                KResourceType.GROUP, "billing", ACLResourcePatternType.LITERAL
            ),
        )
        created = kp.create_acls([grace])
        assert (len(created["succeeded"]), created["failed"]) == (1, [])
        dave = AclBinding("TOPIC", "ledger", "LITERAL", "User:dave", "*", "WRITE", "ALLOW")
        # A CLUSTER ACL must name kafka-cluster (Kafka's check, on the broker); confluent-kafka
        # calls resource type 4 BROKER.
        bad = AclBinding("BROKER", "other", "LITERAL", "User:dave", "*", "ALTER", "ALLOW")
        futures = admin.create_acls([dave, bad], request_timeout=TIMEOUT_S)
        futures[dave].result(timeout=TIMEOUT_S)
        with pytest.raises(KafkaException) as bad_refused:
            futures[bad].result(timeout=TIMEOUT_S)
        assert bad_refused.value.args[0].code() == KafkaError.INVALID_REQUEST

        expected = {
            ("TOPIC", "orders-", "PREFIXED", "User:bob", "READ"),
            ("TOPIC", "orders-", "PREFIXED", "User:bob", "DESCRIBE"),
            ("GROUP", "billing", "LITERAL", "User:grace", "READ"),
            ("TOPIC", "ledger", "LITERAL", "User:dave", "WRITE"),
        }
        assert others(cli_listed(live), held) == expected
        assert others(kp_listed(kp), held) == expected
        assert others(ck_listed(admin), held) == expected

        grace_filter = ACLFilter(
            principal="User:grace",
            host=None,
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(
                KResourceType.ANY, None, ACLResourcePatternType.ANY
            ),
        )
        [(_, deleted, error)] = kp.delete_acls([grace_filter])
        assert error.errno == 0 and [a.principal for a in deleted] == ["User:grace"]
        dave_filter = AclBindingFilter("TOPIC", "ledger", "MATCH", None, None, "ANY", "ANY")
        gone = admin.delete_acls([dave_filter], request_timeout=TIMEOUT_S)[dave_filter]
        assert [b.principal for b in gone.result(timeout=TIMEOUT_S)] == ["User:dave"]
        out = ok(live.up.raylog("acls", "remove", "--topic", "orders-", "--prefixed"))
        assert "Removed 2 ACL(s)." in out
        assert others(cli_listed(live), held) == set() == others(ck_listed(admin), held)
    finally:
        kp.close()
