"""ACLs on a live `raylog up` whose gateways run Kafka's StandardAuthorizer: `raylog acls` and the
clients' admin classes manage the same ACLs, and the gateways apply a change within a poll.

On a one-broker cluster of its own, started with ``authorizer.class.name`` set and
``allow.everyone.if.no.acl.found=true`` (the clients here connect without SASL, as
``User:ANONYMOUS``, which may then manage ACLs while no ACL names the cluster). Proves:

- `raylog acls add` (PREFIXED, two operations) creates ACLs that kafka-python's
  KafkaAdminClient and confluent-kafka's AdminClient (both v1) describe
  alike, and that `raylog acls list --json` lists with theirs;
- both clients create ACLs through the gateway, a CLUSTER ACL not named kafka-cluster is refused
  (INVALID_REQUEST), and both delete by filter (DeleteAcls), answering the ACLs deleted;
- a DENY of WRITE on a topic, added by the CLI, stops an anonymous producer's writes to it
  (TOPIC_AUTHORIZATION_FAILED) and not to another topic; `raylog acls remove` of it lets them
  through again: the gateways see both changes from the metadata they poll.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AclBinding, AclBindingFilter, AdminClient, NewTopic
from kafka import KafkaProducer
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from kafka.errors import TopicAuthorizationFailedError
from support.cluster import UpProcess, started_up
from support.waiting import wait_until

from raylog.actors.control.acls import STANDARD_AUTHORIZER

pytestmark = pytest.mark.slow

TIMEOUT_S = 60.0
PROPAGATION_DEADLINE_S = 30.0  # gateways poll every 200 ms; generous for a loaded machine
CONFIGS = (
    *("--broker-config", f"authorizer.class.name={STANDARD_AUTHORIZER}"),
    *("--broker-config", "allow.everyone.if.no.acl.found=true"),
    *("--broker-config", "default.replication.factor=1"),
    *("--broker-config", "offsets.topic.replication.factor=1"),
)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    cluster = started_up(lambda: Path(tmp_path_factory.mktemp("acls")), *CONFIGS, brokers=1)
    try:
        yield cluster
    finally:
        cluster.__exit__(None, None, None)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def cli_listed(up: UpProcess) -> set[tuple[str, ...]]:
    rows = json.loads(ok(up.raylog("acls", "list", "--json")))
    return {
        (r["resource_type"], r["resource_name"], r["pattern_type"], r["principal"], r["operation"])
        for r in rows
    }


def kp_listed(kp: KafkaAdminClient) -> set[tuple[str, ...]]:
    everything = ACLFilter(
        principal=None,
        host=None,
        operation=ACLOperation.ANY,
        permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY),
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


def ck_listed(admin: AdminClient) -> set[tuple[str, ...]]:
    everything = AclBindingFilter("ANY", None, "ANY", None, None, "ANY", "ANY")
    found = admin.describe_acls(everything, request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    return {
        (
            b.restype.name,
            b.name,
            b.resource_pattern_type.name,
            b.principal,
            b.operation.name,
        )
        for b in found
    }


def test_cli_and_both_clients_manage_the_same_acls(up: UpProcess) -> None:
    ok(up.raylog("acls", "add", "--principal", "User:bob", "--operation", "READ",
                 "--operation", "DESCRIBE", "--topic", "orders-", "--prefixed"))  # fmt: skip
    kp = KafkaAdminClient(bootstrap_servers=up.bootstrap, request_timeout_ms=30_000)
    admin = AdminClient({"bootstrap.servers": up.bootstrap})
    try:
        carol = ACL(
            principal="User:carol",
            host="*",
            operation=ACLOperation.READ,
            permission_type=ACLPermissionType.ALLOW,
            resource_pattern=ResourcePattern(
                ResourceType.GROUP, "billing", ACLResourcePatternType.LITERAL
            ),
        )
        created = kp.create_acls([carol])
        assert (len(created["succeeded"]), created["failed"]) == (1, [])
        dave = AclBinding("TOPIC", "ledger", "LITERAL", "User:dave", "*", "WRITE", "ALLOW")
        # A CLUSTER ACL must name kafka-cluster (Kafka's check, on the broker); confluent-kafka
        # calls resource type 4 BROKER.
        bad = AclBinding("BROKER", "other", "LITERAL", "User:dave", "*", "ALTER", "ALLOW")
        futures = admin.create_acls([dave, bad], request_timeout=TIMEOUT_S)
        futures[dave].result(timeout=TIMEOUT_S)
        with pytest.raises(KafkaException) as refused:
            futures[bad].result(timeout=TIMEOUT_S)
        assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST

        expected = {
            ("TOPIC", "orders-", "PREFIXED", "User:bob", "READ"),
            ("TOPIC", "orders-", "PREFIXED", "User:bob", "DESCRIBE"),
            ("GROUP", "billing", "LITERAL", "User:carol", "READ"),
            ("TOPIC", "ledger", "LITERAL", "User:dave", "WRITE"),
        }
        assert cli_listed(up) == expected
        assert kp_listed(kp) == expected
        assert ck_listed(admin) == expected

        carol_filter = ACLFilter(
            principal="User:carol",
            host=None,
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(
                ResourceType.ANY, None, ACLResourcePatternType.ANY
            ),
        )
        [(_, deleted, error)] = kp.delete_acls([carol_filter])
        assert error.errno == 0 and [a.principal for a in deleted] == ["User:carol"]
        dave_filter = AclBindingFilter("TOPIC", "ledger", "MATCH", None, None, "ANY", "ANY")
        gone = admin.delete_acls([dave_filter], request_timeout=TIMEOUT_S)[dave_filter]
        assert [b.principal for b in gone.result(timeout=TIMEOUT_S)] == ["User:dave"]
        out = ok(up.raylog("acls", "remove", "--topic", "orders-", "--prefixed"))
        assert "Removed 2 ACL(s)." in out
        assert cli_listed(up) == set() and ck_listed(admin) == set()
    finally:
        kp.close()


def send(producer: KafkaProducer, topic: str) -> Any:
    return producer.send(topic, b"v").get(timeout=TIMEOUT_S)


def sends(producer: KafkaProducer, topic: str) -> bool:
    """Whether a record is written to ``topic`` (False: TOPIC_AUTHORIZATION_FAILED)."""
    try:
        send(producer, topic)
    except TopicAuthorizationFailedError:
        return False
    return True


def test_a_deny_acl_stops_writes_until_it_is_removed(up: UpProcess) -> None:
    admin = AdminClient({"bootstrap.servers": up.bootstrap})
    topics = [NewTopic(t, num_partitions=1, replication_factor=1) for t in ("secret", "open")]
    for future in admin.create_topics(topics, operation_timeout=30).values():
        future.result(timeout=TIMEOUT_S)
    producer = KafkaProducer(
        bootstrap_servers=up.bootstrap,
        max_block_ms=5_000,
        # Retries ride out the new topics' replicas starting; an authorization failure is not
        # retried.
        delivery_timeout_ms=30_000,
        enable_idempotence=False,
        metadata_max_age_ms=1_000,
    )
    try:
        send(producer, "secret")
        deny = ("--principal", "User:ANONYMOUS", "--operation", "WRITE", "--deny")
        ok(up.raylog("acls", "add", *deny, "--topic", "secret"))
        wait_until(  # until the gateway's authorizer holds the ACL
            lambda: not sends(producer, "secret"),
            timeout_s=PROPAGATION_DEADLINE_S,
            interval_s=0.2,
            message="the DENY ACL taking effect",
        )
        send(producer, "open")
        ok(up.raylog("acls", "remove", *deny, "--topic", "secret"))
        wait_until(
            lambda: sends(producer, "secret"),
            timeout_s=PROPAGATION_DEADLINE_S,
            interval_s=0.2,
            message="the removed DENY ACL leaving effect",
        )
    finally:
        producer.close(timeout=10)
