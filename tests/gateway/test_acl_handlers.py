"""The ACL APIs and Kafka's authorization of the admin and data APIs, at the handler layer.

Requests are encoded by kafka-python, go through a real ``Connection`` and the registered
handler with a RequestContext carrying a session (the principal) and the gateway's
``Authorization``; the backend is ``AdminMemory`` (a real ClusterMetadata changed by the
controller's pure functions) plus in-memory data calls that are recorded.

Proves:
- CreateAcls / DescribeAcls / DeleteAcls (v0-1): SECURITY_DISABLED (54) without an authorizer;
  CLUSTER_AUTHORIZATION_FAILED (31) without ALTER (create, delete) / DESCRIBE (describe) on the
  cluster, and nothing changed; with it, per-creation results (42 for a MATCH pattern), the
  ACLs described grouped by resource pattern, the ACLs each filter deleted;
- each API refused answers Kafka's code and changes nothing (no backend call), and works once
  allowed: Produce WRITE, Fetch READ, ListOffsets DESCRIBE, DeleteRecords DELETE (29 per
  partition); Metadata leaves out topics without DESCRIBE, answers 29 for one named, and
  auto-creates only with CREATE on the cluster or the topic; CreateTopics CREATE, DeleteTopics
  DELETE, CreatePartitions ALTER (29); DescribeConfigs DESCRIBE_CONFIGS (implied by
  ALTER_CONFIGS), AlterConfigs and IncrementalAlterConfigs ALTER_CONFIGS (29 for a topic, 31 for
  a broker); ElectLeaders ALTER on the cluster (31, top-level and per partition);
  InitProducerId IDEMPOTENT_WRITE on the cluster or WRITE on some topic (31), a transactional
  id WRITE on it (53); Describe/AlterUserScramCredentials DESCRIBE / ALTER on the cluster (31);
- super users pass every check; a context without a session is User:ANONYMOUS from its peer's
  host; without an authorizer everything is allowed; ``Authorization`` swaps its authorizer when
  the polled ACLs change and stays None when ``authorizer.class.name`` is empty; with
  ``allow.everyone.if.no.acl.found=true`` in the broker configs it allows anyone (User:ANONYMOUS
  too) whatever no ACL names, and only what the ACLs grant where one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from support.admin_backend import AdminMemory, roundtrip
from support.authorization import ALICE, allow, as_alice

from raylog.actors.control import acls
from raylog.actors.control import metadata as md_
from raylog.actors.control.acls import AclOperation, PatternType, ResourceType
from raylog.gateway.authorization import Authorization
from raylog.gateway.backend import (
    DeleteRecordsResult,
    FetchResult,
    ListOffsetsResult,
    PartitionFetch,
    ProduceResult,
)
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers import RequestContext
from raylog.gateway.producer_ids import ProducerIdResult

Op = AclOperation
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
CLUSTER_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


@dataclass
class DataMemory(AdminMemory):
    """AdminMemory answering the data APIs, recording each call as (api, topic)."""

    data_calls: list[tuple[str, str]] = field(default_factory=list)

    async def produce(self, topic: str, partition: int, *args: Any, **kw: Any) -> ProduceResult:
        self.data_calls.append(("produce", topic))
        return ProduceResult(0, 10, -1, 0)

    async def fetch(self, topic: str, partition: int, read: PartitionFetch) -> FetchResult:
        self.data_calls.append(("fetch", topic))
        return FetchResult(0, 5, 5, 0, b"")

    async def list_offsets(self, topic: str, partition: int, *args: Any) -> ListOffsetsResult:
        self.data_calls.append(("list_offsets", topic))
        return ListOffsetsResult(0, -1, 5)

    async def delete_records(self, topic: str, partition: int, *args: Any) -> DeleteRecordsResult:
        self.data_calls.append(("delete_records", topic))
        return DeleteRecordsResult(0, 3)

    async def init_producer_id(self) -> ProducerIdResult:
        return ProducerIdResult(0, 1000, 0)


def with_topics(*names: str) -> DataMemory:
    backend = DataMemory()
    for name in names:
        backend.md = md_.new_topic(backend.md, name, f"id-{name}", 1, 1, {}, None)
    return backend


# --- the ACL APIs ---------------------------------------------------------------------------


def creation(name: str, op: AclOperation, pattern: int = LIT) -> Any:
    return CreateAclsRequest.AclCreation(
        resource_type=TOPIC,
        resource_name=name,
        resource_pattern_type=pattern,
        principal="User:bob",
        host="*",
        operation=op,
        permission_type=acls.AclPermissionType.ALLOW,
    )


def describe_all() -> Any:
    return DescribeAclsRequest(
        resource_type_filter=ResourceType.ANY,
        resource_name_filter=None,
        pattern_type_filter=PatternType.ANY,
        principal_filter=None,
        host_filter=None,
        operation=Op.ANY,
        permission_type=acls.AclPermissionType.ANY,
    )


def delete_filter(name: str | None, pattern: int = PatternType.ANY) -> Any:
    return DeleteAclsRequest.DeleteAclsFilter(
        resource_type_filter=TOPIC,
        resource_name_filter=name,
        pattern_type_filter=pattern,
        principal_filter=None,
        host_filter=None,
        operation=Op.ANY,
        permission_type=acls.AclPermissionType.ANY,
    )


def test_acl_apis_without_an_authorizer_are_security_disabled() -> None:
    backend = DataMemory()
    created = roundtrip(
        backend, CreateAclsRequest(creations=[creation("t", Op.READ)]), 1, CreateAclsResponse
    )
    assert [r.error_code for r in created.results] == [ErrorCode.SECURITY_DISABLED]
    described = roundtrip(backend, describe_all(), 1, DescribeAclsResponse)
    assert described.error_code == ErrorCode.SECURITY_DISABLED
    deleted = roundtrip(
        backend, DeleteAclsRequest(filters=[delete_filter(None)]), 1, DeleteAclsResponse
    )
    assert [r.error_code for r in deleted.filter_results] == [ErrorCode.SECURITY_DISABLED]
    assert backend.md.acls == ()


def test_acl_apis_need_alter_and_describe_on_the_cluster() -> None:
    backend = DataMemory()
    backend.md, _ = md_.create_acls(backend.md, allow(TOPIC, "kept", Op.READ))
    before = backend.md
    ctx = as_alice(allow(CLUSTER, acls.CLUSTER_NAME, Op.DESCRIBE))  # DESCRIBE is not ALTER
    request = CreateAclsRequest(creations=[creation("t", Op.READ)])
    created = roundtrip(backend, request, 1, CreateAclsResponse, **ctx)
    assert [r.error_code for r in created.results] == [CLUSTER_DENIED]
    deleted = roundtrip(
        backend, DeleteAclsRequest(filters=[delete_filter(None)]), 1, DeleteAclsResponse, **ctx
    )
    assert [(r.error_code, r.matching_acls) for r in deleted.filter_results] == [
        (CLUSTER_DENIED, [])
    ]
    assert backend.md is before
    described = roundtrip(backend, describe_all(), 1, DescribeAclsResponse, **ctx)
    assert described.error_code == 0  # DESCRIBE on the cluster is enough
    nothing = roundtrip(backend, describe_all(), 1, DescribeAclsResponse, **as_alice())
    assert (nothing.error_code, nothing.resources) == (CLUSTER_DENIED, [])


@pytest.mark.parametrize("version", [0, 1])
def test_create_describe_and_delete_acls(version: int) -> None:
    backend = DataMemory()
    ctx = as_alice(allow(CLUSTER, acls.CLUSTER_NAME, Op.ALTER))
    prefixed = PRE if version >= 1 else LIT  # v0 has no pattern types
    creations = [
        creation("orders", Op.READ),
        creation("orders", Op.WRITE),
        creation("ord", Op.DESCRIBE, prefixed),
        creation("bad", Op.READ, PatternType.MATCH),
    ]
    created = roundtrip(
        backend, CreateAclsRequest(creations=creations), version, CreateAclsResponse, **ctx
    )
    codes = [r.error_code for r in created.results]
    if version >= 1:
        assert codes == [0, 0, 0, ErrorCode.INVALID_REQUEST]
        assert "Invalid patternType MATCH" in created.results[3].error_message
    else:  # v0 carries no pattern type: every creation is LITERAL
        assert codes == [0, 0, 0, 0]
    described = roundtrip(backend, describe_all(), max(version, 1), DescribeAclsResponse, **ctx)
    by_resource = {
        (r.resource_name, r.pattern_type): sorted((a.operation, a.principal) for a in r.acls)
        for r in described.resources
    }
    assert by_resource[("orders", LIT)] == [(Op.READ, "User:bob"), (Op.WRITE, "User:bob")]
    # alice's ALTER on the cluster is in the context's authorizer only, not in the metadata.
    assert all(r.resource_type == TOPIC for r in described.resources)
    filters = [delete_filter("orders", LIT), delete_filter("orders", LIT)]
    deleted = roundtrip(
        backend, DeleteAclsRequest(filters=filters), version, DeleteAclsResponse, **ctx
    )
    first, second = deleted.filter_results
    assert sorted(a.operation for a in first.matching_acls) == [Op.READ, Op.WRITE]
    assert (second.error_code, second.matching_acls) == (0, [])  # reported once
    assert {a.resource_name for a in backend.md.acls} == {"ord"} | (
        {"bad"} if version == 0 else set()
    )


def test_describe_acls_refuses_unknown_codes() -> None:
    backend = DataMemory()
    request = describe_all()
    request.operation = 99
    ctx = as_alice(allow(CLUSTER, acls.CLUSTER_NAME, Op.ALL))
    described = roundtrip(backend, request, 1, DescribeAclsResponse, **ctx)
    assert described.error_code == ErrorCode.INVALID_REQUEST


# --- the data path ----------------------------------------------------------------------------


def produce(backend: DataMemory, ctx: dict[str, Any]) -> dict[str, int]:
    data = ProduceRequest.TopicProduceData
    request = ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout_ms=1000,
        topic_data=[
            data(name=n, partition_data=[data.PartitionProduceData(index=0, records=b"x")])
            for n in ("orders", "events")
        ],
    )
    response = roundtrip(backend, request, 7, ProduceResponse, **ctx)
    return {t.name: t.partition_responses[0].error_code for t in response.responses}


def test_produce_needs_write_on_the_topic() -> None:
    backend = with_topics("orders", "events")
    assert produce(backend, as_alice(allow(TOPIC, "orders", Op.WRITE))) == {
        "orders": 0,
        "events": TOPIC_DENIED,
    }
    assert backend.data_calls == [("produce", "orders")]
    assert produce(backend, as_alice(super_users=[ALICE])) == {"orders": 0, "events": 0}


def fetch_request() -> Any:
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=0,
        log_start_offset=-1,
        partition_max_bytes=1000,
    )
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=10_000,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=n, partitions=[partition]) for n in ("a", "b")],
        forgotten_topics_data=[],
        rack_id="",
    )


def test_fetch_needs_read_on_the_topic() -> None:
    backend = with_topics("a", "b")
    ctx = as_alice(allow(TOPIC, "a", Op.READ), allow(TOPIC, "b", Op.DESCRIBE))
    response = roundtrip(backend, fetch_request(), 11, FetchResponse, **ctx)
    codes = {t.topic: t.partitions[0].error_code for t in response.responses}
    assert codes == {"a": 0, "b": TOPIC_DENIED}
    assert backend.data_calls == [("fetch", "a")]


def test_list_offsets_needs_describe_and_delete_records_delete() -> None:
    backend = with_topics("a", "b")
    listed = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[
            listed(
                name=n, partitions=[listed.ListOffsetsPartition(partition_index=0, timestamp=-1)]
            )
            for n in ("a", "b")
        ],
    )
    ctx = as_alice(allow(TOPIC, "a", Op.READ))  # READ implies DESCRIBE
    response = roundtrip(backend, request, 2, ListOffsetsResponse, **ctx)
    assert {t.name: t.partitions[0].error_code for t in response.topics} == {
        "a": 0,
        "b": TOPIC_DENIED,
    }
    deleting = DeleteRecordsRequest.DeleteRecordsTopic
    request = DeleteRecordsRequest(
        topics=[
            deleting(
                name=n, partitions=[deleting.DeleteRecordsPartition(partition_index=0, offset=3)]
            )
            for n in ("a", "b")
        ],
        timeout_ms=1000,
    )
    ctx = as_alice(allow(TOPIC, "b", Op.DELETE))
    response = roundtrip(backend, request, 2, DeleteRecordsResponse, **ctx)
    assert {t.name: t.partitions[0].error_code for t in response.topics} == {
        "a": TOPIC_DENIED,
        "b": 0,
    }
    assert backend.data_calls == [("list_offsets", "a"), ("delete_records", "b")]


def metadata(backend: DataMemory, names: list[str] | None, ctx: dict[str, Any]) -> dict[str, int]:
    topics = (
        None if names is None else [MetadataRequest.MetadataRequestTopic(name=n) for n in names]
    )
    request = MetadataRequest(topics=topics, allow_auto_topic_creation=True)
    response = roundtrip(backend, request, 5, MetadataResponse, **ctx)
    return {t.name: t.error_code for t in response.topics}


def test_metadata_hides_and_refuses_topics_without_describe() -> None:
    backend = with_topics("orders", "events", "secret")
    ctx = as_alice(allow(TOPIC, "orders", Op.READ), allow(TOPIC, "ev", Op.DESCRIBE, pattern=PRE))
    assert metadata(backend, None, ctx) == {"events": 0, "orders": 0}
    assert metadata(backend, ["secret", "orders", "unknown"], ctx) == {
        "secret": TOPIC_DENIED,
        "orders": 0,
        "unknown": TOPIC_DENIED,  # no DESCRIBE: not told whether it exists
    }


def test_metadata_auto_creates_only_with_create() -> None:
    backend = with_topics()
    backend.broker_overrides = {"auto.create.topics.enable": "true"}
    described = allow(TOPIC, "new", Op.DESCRIBE, pattern=PRE)
    assert metadata(backend, ["new-a"], as_alice(described)) == {"new-a": TOPIC_DENIED}
    assert "new-a" not in backend.md.topics
    by_topic = as_alice(described, allow(TOPIC, "new-a", Op.CREATE))
    assert metadata(backend, ["new-a"], by_topic) == {"new-a": ErrorCode.LEADER_NOT_AVAILABLE}
    by_cluster = as_alice(described, allow(CLUSTER, acls.CLUSTER_NAME, Op.CREATE))
    assert metadata(backend, ["new-b"], by_cluster) == {"new-b": ErrorCode.LEADER_NOT_AVAILABLE}
    assert {"new-a", "new-b"} <= set(backend.md.topics)


# --- topic and cluster admin ------------------------------------------------------------------


def create_topics(backend: DataMemory, ctx: dict[str, Any], *names: str) -> dict[str, int]:
    topics = [
        CreateTopicsRequest.CreatableTopic(
            name=n, num_partitions=1, replication_factor=1, assignments=[], configs=[]
        )
        for n in names
    ]
    request = CreateTopicsRequest(topics=topics, timeout_ms=0, validate_only=False)
    response = roundtrip(backend, request, 4, CreateTopicsResponse, **ctx)
    return {t.name: t.error_code for t in response.topics}


def test_create_delete_and_grow_topics_need_create_delete_and_alter() -> None:
    backend = with_topics()
    ctx = as_alice(allow(TOPIC, "team-", Op.CREATE, Op.DELETE, pattern=PRE))
    assert create_topics(backend, ctx, "team-a", "other") == {"team-a": 0, "other": TOPIC_DENIED}
    assert set(backend.md.topics) == {"team-a"}
    cluster_create = as_alice(allow(CLUSTER, acls.CLUSTER_NAME, Op.CREATE))
    assert create_topics(backend, cluster_create, "other") == {"other": 0}

    request = CreatePartitionsRequest(
        topics=[
            CreatePartitionsRequest.CreatePartitionsTopic(name="team-a", count=2, assignments=None)
        ],
        timeout_ms=0,
        validate_only=False,
    )
    grown = roundtrip(backend, request, 1, CreatePartitionsResponse, **ctx)
    assert [r.error_code for r in grown.results] == [TOPIC_DENIED]  # CREATE is not ALTER
    assert len(backend.md.topics["team-a"].partitions) == 1
    altering = as_alice(allow(TOPIC, "team-a", Op.ALTER))
    grown = roundtrip(backend, request, 1, CreatePartitionsResponse, **altering)
    assert [r.error_code for r in grown.results] == [0]

    request = DeleteTopicsRequest(topic_names=["team-a", "other"], timeout_ms=0)
    deleted = roundtrip(backend, request, 3, DeleteTopicsResponse, **ctx)
    assert {r.name: r.error_code for r in deleted.responses} == {
        "team-a": 0,
        "other": TOPIC_DENIED,
    }
    assert set(backend.md.topics) == {"other"}


def test_configs_need_describe_configs_and_alter_configs() -> None:
    backend = with_topics("a", "b")
    resource = DescribeConfigsRequest.DescribeConfigsResource
    request = DescribeConfigsRequest(
        resources=[
            resource(resource_type=2, resource_name="a", configuration_keys=None),
            resource(resource_type=2, resource_name="b", configuration_keys=None),
            resource(resource_type=4, resource_name="1", configuration_keys=None),
        ],
        include_synonyms=False,
    )
    ctx = as_alice(allow(TOPIC, "a", Op.ALTER_CONFIGS))  # implies DESCRIBE_CONFIGS
    described = roundtrip(backend, request, 1, DescribeConfigsResponse, **ctx)
    assert [r.error_code for r in described.results] == [0, TOPIC_DENIED, CLUSTER_DENIED]
    assert not described.results[1].configs

    altering = AlterConfigsRequest.AlterConfigsResource
    entry = altering.AlterableConfig(name="retention.ms", value="1000")
    request = AlterConfigsRequest(
        resources=[
            altering(resource_type=2, resource_name="a", configs=[entry]),
            altering(resource_type=2, resource_name="b", configs=[entry]),
            altering(resource_type=4, resource_name="1", configs=[]),
        ],
        validate_only=False,
    )
    altered = roundtrip(backend, request, 1, AlterConfigsResponse, **ctx)
    assert [r.error_code for r in altered.responses] == [0, TOPIC_DENIED, CLUSTER_DENIED]
    assert backend.md.topics["a"].configs == {"retention.ms": "1000"}
    assert backend.md.topics["b"].configs == {}

    incremental = IncrementalAlterConfigsRequest.AlterConfigsResource
    op = incremental.AlterableConfig(name="retention.ms", config_operation=0, value="2000")
    request = IncrementalAlterConfigsRequest(
        resources=[
            incremental(resource_type=2, resource_name="a", configs=[op]),
            incremental(resource_type=2, resource_name="b", configs=[op]),
        ],
        validate_only=False,
    )
    altered = roundtrip(backend, request, 0, IncrementalAlterConfigsResponse, **ctx)
    assert [r.error_code for r in altered.responses] == [0, TOPIC_DENIED]
    assert backend.md.topics["b"].configs == {}


def test_elect_leaders_needs_alter_on_the_cluster() -> None:
    backend = with_topics("a")
    before = backend.md
    partitions = [ElectLeadersRequest.TopicPartitions(topic="a", partitions=[0])]
    request = ElectLeadersRequest(election_type=0, topic_partitions=partitions, timeout_ms=1000)
    ctx = as_alice(allow(TOPIC, "a", Op.ALL))
    response = roundtrip(backend, request, 1, ElectLeadersResponse, **ctx)
    assert response.error_code == CLUSTER_DENIED
    [topic] = response.replica_election_results
    assert [p.error_code for p in topic.partition_result] == [CLUSTER_DENIED]
    assert backend.md is before
    ctx = as_alice(allow(CLUSTER, acls.CLUSTER_NAME, Op.ALTER))
    response = roundtrip(backend, request, 1, ElectLeadersResponse, **ctx)
    assert response.error_code == 0


def init_producer_id(backend: DataMemory, ctx: dict[str, Any], txn: str | None = None) -> int:
    request = InitProducerIdRequest(transactional_id=txn, transaction_timeout_ms=60_000)
    return roundtrip(backend, request, 1, InitProducerIdResponse, **ctx).error_code


def test_init_producer_id_needs_idempotent_write_or_write_on_some_topic() -> None:
    backend = with_topics()
    assert init_producer_id(backend, as_alice(allow(TOPIC, "a", Op.READ))) == CLUSTER_DENIED
    assert init_producer_id(backend, as_alice(allow(TOPIC, "a", Op.WRITE))) == 0
    assert init_producer_id(backend, as_alice(allow(TOPIC, "a-", Op.WRITE, pattern=PRE))) == 0
    idempotent = as_alice(allow(CLUSTER, acls.CLUSTER_NAME, Op.IDEMPOTENT_WRITE))
    assert init_producer_id(backend, idempotent) == 0
    assert (
        init_producer_id(backend, idempotent, "txn")
        == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )
    transactional = as_alice(allow(ResourceType.TRANSACTIONAL_ID, "txn", Op.WRITE))
    assert (
        init_producer_id(backend, transactional, "txn") == ErrorCode.COORDINATOR_NOT_AVAILABLE
    )  # allowed: on to the coordinator (none in this test)


def test_scram_apis_need_describe_and_alter_on_the_cluster() -> None:
    backend = with_topics()
    describe = DescribeUserScramCredentialsRequest(users=None)
    ctx = as_alice(allow(TOPIC, "*", Op.ALL))
    described = roundtrip(backend, describe, 0, DescribeUserScramCredentialsResponse, **ctx)
    assert described.error_code == CLUSTER_DENIED
    deletion = AlterUserScramCredentialsRequest.ScramCredentialDeletion(name="bob", mechanism=1)
    request = AlterUserScramCredentialsRequest(deletions=[deletion], upsertions=[])
    altered = roundtrip(backend, request, 0, AlterUserScramCredentialsResponse, **ctx)
    assert [(r.user, r.error_code) for r in altered.results] == [("bob", CLUSTER_DENIED)]
    ctx = as_alice(allow(CLUSTER, acls.CLUSTER_NAME, Op.ALTER))  # implies DESCRIBE
    described = roundtrip(backend, describe, 0, DescribeUserScramCredentialsResponse, **ctx)
    assert described.error_code == 0
    altered = roundtrip(backend, request, 0, AlterUserScramCredentialsResponse, **ctx)
    assert [r.error_code for r in altered.results] == [ErrorCode.RESOURCE_NOT_FOUND]


# --- the gateway's Authorization --------------------------------------------------------------


def test_authorization_swaps_its_authorizer_when_the_acls_change() -> None:
    off = Authorization.from_broker_configs({})
    off.update(tuple(allow(TOPIC, "a", Op.READ)))
    assert off.authorizer is None
    on = Authorization.from_broker_configs(
        {"authorizer.class.name": acls.STANDARD_AUTHORIZER, "super.users": "User:admin"}
    )
    first = on.authorizer
    assert first is not None and not first.authorize(ALICE, "h", Op.READ, TOPIC, "a")
    assert first.authorize("User:admin", "h", Op.ALTER, CLUSTER, acls.CLUSTER_NAME)
    bindings = tuple(allow(TOPIC, "a", Op.READ))
    on.update(bindings)
    second = on.authorizer
    assert second is not first and second is not None
    assert second.authorize(ALICE, "h", Op.READ, TOPIC, "a")
    on.update(bindings)
    assert on.authorizer is second  # unchanged ACLs: the same authorizer


def test_authorization_allows_everyone_where_no_acl_names_the_resource_when_configured() -> None:
    configs = {"authorizer.class.name": acls.STANDARD_AUTHORIZER}
    strict = Authorization.from_broker_configs(configs)
    lenient = Authorization.from_broker_configs(
        {**configs, "allow.everyone.if.no.acl.found": "true"}
    )
    bindings = tuple(allow(TOPIC, "named", Op.READ))
    for authorization in (strict, lenient):
        authorization.update(bindings)
    assert strict.authorizer is not None and lenient.authorizer is not None
    anonymous = "User:ANONYMOUS"
    assert not strict.authorizer.authorize(anonymous, "h", Op.ALTER, CLUSTER, acls.CLUSTER_NAME)
    assert lenient.authorizer.authorize(anonymous, "h", Op.ALTER, CLUSTER, acls.CLUSTER_NAME)
    assert lenient.authorizer.authorize(anonymous, "h", Op.WRITE, TOPIC, "unnamed")
    # An ACL names the topic: only what it grants, to whom it grants it.
    assert not lenient.authorizer.authorize(anonymous, "h", Op.READ, TOPIC, "named")
    assert lenient.authorizer.authorize(ALICE, "h", Op.READ, TOPIC, "named")


def test_a_context_without_a_session_is_anonymous_from_the_peer_host() -> None:
    def anonymous_on(host: str) -> list[acls.AclBinding]:
        return [acls.binding(TOPIC, "t", LIT, "User:ANONYMOUS", host, Op.READ, 3)]

    for host, allowed in (("127.0.0.1", True), ("10.0.0.9", False)):
        authorization = Authorization(True, bindings=anonymous_on(host))
        context = RequestContext(DataMemory(), {}, "127.0.0.1:5000", authorization=authorization)
        assert (context.principal, context.client_host) == ("User:ANONYMOUS", "127.0.0.1")
        assert context.authorized(Op.READ, TOPIC, "t") is allowed
    assert RequestContext(DataMemory(), {}, "p:1").authorized(Op.ALL, CLUSTER, "kafka-cluster")
