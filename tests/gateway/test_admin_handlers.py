"""The admin handlers and Metadata auto-creation against an in-memory admin backend.

``AdminMemory`` keeps a real ``ClusterMetadata`` (three brokers, racks a, b, c) and changes it
with the same pure functions the controller runs (``metadata``, ``placement``,
``config_keys``): it is the gateway's input, not a stand-in for the handlers under test.
Requests are encoded by kafka-python, go through a real ``Connection`` and the registered
handler, and the responses are decoded by kafka-python at the version asked.

Proves:
- CreateTopics: -1 counts take ``num.partitions`` / ``default.replication.factor``; manual
  assignments are placed as given; configs are stored normalised; Kafka's codes with messages
  naming the problem (36, 37, 38, 40, 17, 42 for a name given twice or counts plus an
  assignment, 39 for a gap in the assignment); ``validate_only`` creates nothing;
- DeleteTopics removes a topic; an unknown one is 3;
- DescribeConfigs v0-2: every topic key with is_default / source as Kafka reports them, key
  filters, synonyms; broker resources from the broker registry, read-only, answered only for
  this broker; unknown topics 3; unsupported types 42;
- AlterConfigs replaces the overrides (keys left out return to their defaults), bad values are
  40, broker resources 42; IncrementalAlterConfigs SET / DELETE / APPEND / SUBTRACT, list
  operations on a non-list key 40, duplicate keys 42; APPEND compact to cleanup.policy's
  default stores compact,delete; the group coordinator's set-these-configs path (DescribeConfigs
  then AlterConfigs) keeps the other overrides and writes nothing when they are set;
- CreatePartitions grows a topic (validate_only does not), fewer partitions is 37, manual
  assignments 42; ElectLeaders v0/v1 returns the controller's per-partition codes (84 when the
  preferred leader already leads), leaves out 84 when every partition was asked for;
- Metadata creates an unknown topic only when both the broker config and the request allow it,
  answering 5 (then the topic exists with the broker defaults), else 3;
- AlterUserScramCredentials v0 stores the keys of the client's salted password (RFC 5802's, as
  the SASL exchange derives them) and answers per user 33 / 91 / 92 / 93 with Kafka's rules;
  DescribeUserScramCredentials v0 answers Kafka's mechanism types and iterations only, 91 and 92
  per user; with no controller to ask, every user of an alter gets 41 and a describe's
  top-level error is 41; both are advertised at v0.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from support.admin_backend import AdminMemory, roundtrip, three_brokers

from raylog.actors.control import config_keys, config_registry, election, scram
from raylog.actors.control import metadata as md_
from raylog.gateway import sasl
from raylog.gateway.actor import _set_topic_configs
from raylog.gateway.admin import ControllerAdmin
from raylog.gateway.backend import (
    AdminBackend,
)
from raylog.gateway.handlers import advertised_versions
from raylog.gateway.handlers.incremental_alter_configs import (
    APPEND,
    DELETE,
    SET,
    SUBTRACT,
    ConfigOp,
    apply_ops,
)
from raylog.storage.errors import (
    InvalidConfigError,
    InvalidRequestError,
    RaylogError,
)

TOPIC, BROKER = 2, 4  # DescribeConfigs resource types


def test_the_in_memory_backend_is_an_admin_backend() -> None:
    assert isinstance(AdminMemory(), AdminBackend)


# --- CreateTopics ---------------------------------------------------------------------------


def _topic(name: str, partitions: int = 1, rf: int = 1, **kw: Any) -> Any:
    configs = [
        CreateTopicsRequest.CreatableTopic.CreatableTopicConfig(name=k, value=v)
        for k, v in kw.pop("configs", {}).items()
    ]
    assignments = [
        CreateTopicsRequest.CreatableTopic.CreatableReplicaAssignment(
            partition_index=i, broker_ids=ids
        )
        for i, ids in kw.pop("assignments", {}).items()
    ]
    return CreateTopicsRequest.CreatableTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=rf,
        assignments=assignments,
        configs=configs,
    )


def create(backend: AdminMemory, *topics: Any, version: int = 4, validate_only: bool = False):
    request = CreateTopicsRequest(topics=list(topics), timeout_ms=1000, validate_only=validate_only)
    response = roundtrip(backend, request, version, CreateTopicsResponse)
    return {t.name: (t.error_code, t.error_message) for t in response.topics}


@pytest.mark.parametrize("version", [2, 3, 4])
def test_create_with_configs_and_broker_defaults(version: int) -> None:
    backend = AdminMemory(
        broker_overrides={"num.partitions": "2", "default.replication.factor": "3"}
    )
    answer = create(
        backend,
        _topic("explicit", 3, 2, configs={"retention.ms": " 1000 ", "min.insync.replicas": "2"}),
        _topic("defaults", -1, -1),
        version=version,
    )
    assert answer == {"explicit": (0, None), "defaults": (0, None)}
    explicit = backend.md.topics["explicit"]
    assert [len(p.replicas) for p in explicit.partitions] == [2, 2, 2]
    assert explicit.configs == {"min.insync.replicas": "2", "retention.ms": "1000"}
    defaults = backend.md.topics["defaults"]
    assert [p.replicas for p in defaults.partitions] == [(1, 2, 3), (2, 3, 1)]


def test_create_with_a_manual_assignment() -> None:
    backend = AdminMemory()
    answer = create(backend, _topic("manual", -1, -1, assignments={1: [3, 1], 0: [2, 3]}))
    assert answer == {"manual": (0, None)}
    assert [p.replicas for p in backend.md.topics["manual"].partitions] == [(2, 3), (3, 1)]
    code, message = create(backend, _topic("both", 2, -1, assignments={0: [1]}))["both"]
    assert code == 42 and "Both cannot be used" in message
    code, message = create(backend, _topic("gap", -1, -1, assignments={0: [1], 2: [2]}))["gap"]
    assert code == 39 and "[0, 2]" in message
    code, message = create(backend, _topic("twice", -1, -1, assignments={0: [1, 1]}))["twice"]
    assert code == 39 and "twice" in message


def test_create_errors_name_the_problem() -> None:
    backend = AdminMemory()
    assert create(backend, _topic("t"))["t"] == (0, None)
    answer = create(
        backend,
        _topic("t"),
        _topic("rf", 1, 5),
        _topic("parts", 0, 1),
        _topic("cfg", configs={"retention.ms": "soon"}),
        _topic("unknown-cfg", configs={"no.such.key": "1"}),
        _topic("null-cfg", configs={"retention.ms": None}),
        _topic("bad/name"),
        _topic("dup"),
        _topic("dup"),
    )
    codes = {name: code for name, (code, _) in answer.items()}
    assert codes == {
        "t": 36,
        "rf": 38,
        "parts": 37,
        "cfg": 40,
        "unknown-cfg": 40,
        "null-cfg": 40,
        "bad/name": 17,
        "dup": 42,
    }
    assert "already exists" in answer["t"][1]
    assert "Replication factor 5" in answer["rf"][1]
    assert "retention.ms" in answer["cfg"][1] and "soon" in answer["cfg"][1]
    assert "no.such.key" in answer["unknown-cfg"][1]
    assert set(backend.md.topics) == {"t"}


def test_validate_only_creates_nothing() -> None:
    backend = AdminMemory()
    answer = create(backend, _topic("v", 2, 3), _topic("w", 1, 4), validate_only=True)
    assert answer["v"] == (0, None) and answer["w"][0] == 38
    assert backend.md.topics == {}


# --- DeleteTopics ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3])
def test_delete(version: int) -> None:
    backend = AdminMemory()
    create(backend, _topic("gone"))
    request = DeleteTopicsRequest(topic_names=["gone", "never"], timeout_ms=1000)
    response = roundtrip(backend, request, version, DeleteTopicsResponse)
    assert {r.name: r.error_code for r in response.responses} == {"gone": 0, "never": 3}
    assert backend.md.topics == {}


# --- DescribeConfigs ------------------------------------------------------------------------


def describe(
    backend: AdminMemory,
    resources: list[tuple[int, str, list[str] | None]],
    version: int = 2,
    synonyms: bool = False,
) -> list[Any]:
    request = DescribeConfigsRequest(
        resources=[
            DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=t, resource_name=n, configuration_keys=k
            )
            for t, n, k in resources
        ],
        include_synonyms=synonyms,
    )
    return roundtrip(backend, request, version, DescribeConfigsResponse).results


@pytest.mark.parametrize("version", [0, 1, 2])
def test_describe_topic_configs(version: int) -> None:
    backend = AdminMemory()
    create(backend, _topic("t", configs={"retention.ms": "1000"}))
    (result,) = describe(backend, [(TOPIC, "t", None)], version, synonyms=version > 0)
    assert result.error_code == 0
    entries = {c.name: c for c in result.configs}
    assert set(entries) == set(config_keys.TOPIC_CONFIGS.defs)
    retention, mode = entries["retention.ms"], entries["replication.mode"]
    assert (retention.value, retention.read_only) == ("1000", False)
    assert (mode.value, mode.read_only) == ("pull", False)
    if version == 0:
        assert (retention.is_default, mode.is_default) == (False, True)
    else:
        assert (retention.config_source, mode.config_source) == (1, 5)
        assert [(s.name, s.value, s.source) for s in retention.synonyms] == [
            ("retention.ms", "1000", 1)
        ]
    (filtered,) = describe(backend, [(TOPIC, "t", ["segment.ms", "no.such.key"])], version)
    assert [(c.name, c.value) for c in filtered.configs] == [("segment.ms", "604800000")]


def test_describe_broker_configs_and_errors() -> None:
    backend = AdminMemory(broker_overrides={"num.partitions": "4"})
    mine, empty, other, unknown, group = describe(
        backend,
        [(BROKER, "1", None), (BROKER, "", None), (BROKER, "2", None), (TOPIC, "nope", None),
         (3, "g", None)],
    )  # fmt: skip
    entries = {c.name: c for c in mine.configs}
    assert set(entries) == set(config_keys.BROKER_CONFIGS.defs)
    assert all(c.read_only for c in mine.configs)
    assert (entries["num.partitions"].value, entries["num.partitions"].config_source) == ("4", 4)
    auto = entries["auto.create.topics.enable"]
    assert (auto.value, auto.config_source) == ("false", 5)
    assert (empty.error_code, empty.configs) == (0, [])
    assert other.error_code == 42 and "expected 1" in other.error_message
    assert unknown.error_code == 3
    assert group.error_code == 42


# --- AlterConfigs and IncrementalAlterConfigs -----------------------------------------------


def alter(backend: AdminMemory, resources: list[tuple[int, str, dict[str, str | None]]]):
    request = AlterConfigsRequest(
        resources=[
            AlterConfigsRequest.AlterConfigsResource(
                resource_type=t,
                resource_name=n,
                configs=[
                    AlterConfigsRequest.AlterConfigsResource.AlterableConfig(name=k, value=v)
                    for k, v in configs.items()
                ],
            )
            for t, n, configs in resources
        ],
        validate_only=False,
    )
    response = roundtrip(backend, request, 1, AlterConfigsResponse)
    return [(r.error_code, r.error_message) for r in response.responses]


def test_alter_configs_replaces_the_overrides() -> None:
    backend = AdminMemory()
    create(backend, _topic("t", configs={"retention.ms": "1000"}))
    assert alter(backend, [(TOPIC, "t", {"min.insync.replicas": "2"})]) == [(0, None)]
    assert backend.md.topics["t"].configs == {"min.insync.replicas": "2"}
    (bad, broker, missing) = alter(
        backend,
        [(TOPIC, "t", {"min.insync.replicas": "0"}), (BROKER, "1", {"num.partitions": "2"}),
         (TOPIC, "nope", {})],
    )  # fmt: skip
    assert bad[0] == 40 and "min.insync.replicas" in bad[1]
    assert broker[0] == 42 and "static" in broker[1]
    assert missing[0] == 3
    assert backend.md.topics["t"].configs == {"min.insync.replicas": "2"}


def incremental(backend: AdminMemory, name: str, ops: list[tuple[str, int, str | None]]):
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    request = IncrementalAlterConfigsRequest(
        resources=[
            resource(
                resource_type=TOPIC,
                resource_name=name,
                configs=[
                    resource.AlterableConfig(name=k, config_operation=op, value=v)
                    for k, op, v in ops
                ],
            )
        ],
        validate_only=False,
    )
    (r,) = roundtrip(backend, request, 0, IncrementalAlterConfigsResponse).responses
    return r.error_code, r.error_message


def test_incremental_alter_configs() -> None:
    backend = AdminMemory()
    create(backend, _topic("t", configs={"retention.ms": "1000", "segment.ms": "5000"}))
    answer = incremental(backend, "t", [("retention.ms", DELETE, None), ("flush.ms", SET, "10")])
    assert answer == (0, None)
    assert backend.md.topics["t"].configs == {"flush.ms": "10", "segment.ms": "5000"}
    code, message = incremental(backend, "t", [("retention.ms", APPEND, "5")])
    assert code == 40 and "append is not allowed for config key: retention.ms" in message
    code, message = incremental(backend, "t", [("flush.ms", SET, "1"), ("flush.ms", DELETE, None)])
    assert code == 42 and "duplicate" in message
    assert incremental(backend, "nope", [("flush.ms", SET, "1")])[0] == 3
    assert backend.md.topics["t"].configs == {"flush.ms": "10", "segment.ms": "5000"}


def test_incremental_alter_configs_appends_to_and_subtracts_from_cleanup_policy() -> None:
    backend = AdminMemory()
    create(backend, _topic("t"))

    def policy_after(op: int, value: str) -> str | None:
        code, message = incremental(backend, "t", [("cleanup.policy", op, value)])
        assert code == 0, message
        return backend.md.topics["t"].configs.get("cleanup.policy")

    # APPEND starts from the default (delete); the stored list is sorted (Kafka keeps
    # "delete,compact", the same policy).
    assert policy_after(APPEND, "compact") == "compact,delete"
    assert policy_after(APPEND, "delete,compact") == "compact,delete"
    assert policy_after(SUBTRACT, "delete") == "compact"
    code, message = incremental(backend, "t", [("cleanup.policy", SUBTRACT, "compact")])
    assert code == 40 and "expected at least one of compact, delete" in message
    code, message = incremental(backend, "t", [("cleanup.policy", APPEND, "shred")])
    assert code == 40 and "shred" in message
    assert backend.md.topics["t"].configs == {"cleanup.policy": "compact"}


def test_set_topic_configs_keeps_the_other_overrides_and_writes_only_a_change() -> None:
    backend = AdminMemory()
    create(backend, _topic("legacy", configs={"retention.ms": "-1"}))
    compact = {"cleanup.policy": "compact"}
    asyncio.run(_set_topic_configs(backend, "legacy", compact))
    assert backend.md.topics["legacy"].configs == {
        "cleanup.policy": "compact",
        "retention.ms": "-1",
    }
    epoch = backend.md.metadata_epoch
    asyncio.run(_set_topic_configs(backend, "legacy", compact))
    assert backend.md.metadata_epoch == epoch
    with pytest.raises(RaylogError, match="configs of missing"):
        asyncio.run(_set_topic_configs(backend, "missing", compact))


class _ListStruct(msgspec.Struct, frozen=True, kw_only=True):
    a_list: str
    n: int


def test_apply_ops_on_lists() -> None:
    registry = config_registry.ConfigRegistry(
        [
            config_registry.ConfigDef(name="a.list", type="list", default="x,y", doc=""),
            config_registry.ConfigDef(name="n", type="int", default="1", doc=""),
        ],
        _ListStruct,
    )
    assert apply_ops(registry, {}, [ConfigOp("a.list", APPEND, "y,z")]) == {"a.list": "x,y,z"}
    assert apply_ops(registry, {"a.list": "x,z"}, [ConfigOp("a.list", SUBTRACT, "x")]) == {
        "a.list": "z"
    }
    with pytest.raises(InvalidConfigError, match=r"subtract is not allowed.*: n"):
        apply_ops(registry, {}, [ConfigOp("n", SUBTRACT, "1")])
    with pytest.raises(InvalidRequestError, match="Null value"):
        apply_ops(registry, {}, [ConfigOp("n", SET, None)])
    with pytest.raises(InvalidRequestError, match="Unknown config operation 9"):
        apply_ops(registry, {}, [ConfigOp("n", 9, "1")])


# --- Metadata auto-creation -----------------------------------------------------------------


def metadata(backend: AdminMemory, version: int, names: list[str], allow: bool = True) -> Any:
    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names],
        allow_auto_topic_creation=allow,
    )
    response = roundtrip(backend, request, version, MetadataResponse)
    return {t.name: t.error_code for t in response.topics}


def test_auto_creation_is_off_by_default() -> None:
    backend = AdminMemory()
    assert metadata(backend, 5, ["auto"]) == {"auto": 3}
    assert backend.md.topics == {}


@pytest.mark.parametrize(("version", "allow", "created"), [(1, False, True), (4, True, True),
                                                           (5, False, False)])  # fmt: skip
def test_auto_creation_needs_the_broker_and_the_request(
    version: int, allow: bool, created: bool
) -> None:
    backend = AdminMemory(
        broker_overrides={
            "auto.create.topics.enable": "true",
            "num.partitions": "2",
            "default.replication.factor": "2",
        }
    )
    # Before v4 the request cannot refuse: Kafka treats it as allowed.
    assert metadata(backend, version, ["auto"], allow) == {"auto": 5 if created else 3}
    if created:
        assert [len(p.replicas) for p in backend.md.topics["auto"].partitions] == [2, 2]
        assert metadata(backend, version, ["auto"], allow) == {"auto": 0}
    else:
        assert backend.md.topics == {}
    assert metadata(backend, 5, ["bad/name"]) == {"bad/name": 17}


# --- CreatePartitions and ElectLeaders ------------------------------------------------------


def grow(backend: AdminMemory, name: str, count: int, **kw: Any) -> tuple[int, str | None]:
    topic = CreatePartitionsRequest.CreatePartitionsTopic(
        name=name, count=count, assignments=kw.pop("assignments", None)
    )
    request = CreatePartitionsRequest(
        topics=[topic], timeout_ms=1000, validate_only=kw.pop("validate_only", False)
    )
    (result,) = roundtrip(backend, request, 1, CreatePartitionsResponse).results
    return result.error_code, result.error_message


def test_create_partitions() -> None:
    backend = AdminMemory()
    create(backend, _topic("t", 1, 3))
    assert grow(backend, "t", 3, validate_only=True) == (0, None)
    assert len(backend.md.topics["t"].partitions) == 1
    assert grow(backend, "t", 3) == (0, None)
    assert [len(p.replicas) for p in backend.md.topics["t"].partitions] == [3, 3, 3]
    code, message = grow(backend, "t", 2)
    assert code == 37 and "3 partitions" in message
    assigned = [CreatePartitionsRequest.CreatePartitionsTopic.CreatePartitionsAssignment(
        broker_ids=[1, 2, 3])]  # fmt: skip
    assert grow(backend, "t", 4, assignments=assigned)[0] == 42
    assert grow(backend, "nope", 2)[0] == 3


@pytest.mark.parametrize("version", [0, 1])
def test_elect_leaders(version: int) -> None:
    backend = AdminMemory()
    create(backend, _topic("t", -1, -1, assignments={0: [1, 2], 1: [2, 3]}))
    # Move partition 0's leadership away from its preferred replica (broker 1).
    p0 = backend.md.topics["t"].partitions[0]
    moved = msgspec.structs.replace(p0, leader=2, leader_epoch=p0.leader_epoch + 1)
    topic = backend.md.topics["t"]
    backend.md = msgspec.structs.replace(
        backend.md,
        topics={"t": msgspec.structs.replace(topic, partitions=(moved, topic.partitions[1]))},
    )
    request = ElectLeadersRequest(
        election_type=0,
        topic_partitions=[ElectLeadersRequest.TopicPartitions(topic="t", partitions=[0, 1, 7])],
        timeout_ms=1000,
    )
    response = roundtrip(backend, request, version, ElectLeadersResponse)
    codes = {
        (t.topic, p.partition_id): p.error_code
        for t in response.replica_election_results
        for p in t.partition_result
    }
    assert codes == {("t", 0): 0, ("t", 1): 84, ("t", 7): 3}
    assert backend.md.topics["t"].partitions[0].leader == 1
    everything = ElectLeadersRequest(election_type=0, topic_partitions=None, timeout_ms=1000)
    response = roundtrip(backend, everything, version, ElectLeadersResponse)
    assert response.replica_election_results == []  # nothing needed an election


def test_metadata_lists_fenced_brokers_and_failed_logs_as_offline_replicas() -> None:
    md = md_.create_topic(three_brokers(), "t", "id-t", [[1, 2, 3], [3, 1, 2]], {})
    md = election.set_offline_replicas(md, 1, {md_.TopicPartition("t", 0)}).metadata
    md = election.fence_broker(md, 3).metadata
    backend = AdminMemory(md=md)
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="t")])
    response = roundtrip(backend, request, 5, MetadataResponse)
    parts = {p.partition_index: p for p in response.topics[0].partitions}
    assert (parts[0].leader_id, list(parts[0].isr_nodes)) == (2, [2])
    assert list(parts[0].offline_replicas) == [1, 3]  # 1: its log failed; 3: fenced
    assert (parts[1].leader_id, list(parts[1].offline_replicas)) == (1, [3])


# --- Describe/AlterUserScramCredentials (KIP-554) ------------------------------------------------

SHA_256, SHA_512 = 1, 2  # Kafka's ScramMechanism types
_Upsertion = AlterUserScramCredentialsRequest.ScramCredentialUpsertion
_Deletion = AlterUserScramCredentialsRequest.ScramCredentialDeletion


def scram_upsertion(user: str, mechanism: int = SHA_256, iterations: int = 4096) -> Any:
    name = {SHA_256: scram.SCRAM_SHA_256, SHA_512: scram.SCRAM_SHA_512}.get(mechanism)
    salted = scram.salted_password(name or scram.SCRAM_SHA_256, "pw", b"salt" * 8, iterations)
    return _Upsertion(
        name=user, mechanism=mechanism, iterations=iterations, salt=b"salt" * 8,
        salted_password=salted,
    )  # fmt: skip


def alter_users(backend: Any, upsertions: list[Any], deletions: list[tuple[str, int]] = ()) -> Any:
    request = AlterUserScramCredentialsRequest(
        deletions=[_Deletion(name=u, mechanism=m) for u, m in deletions], upsertions=upsertions
    )
    response = roundtrip(backend, request, 0, AlterUserScramCredentialsResponse)
    return {r.user: r.error_code for r in response.results}


def describe_users(backend: Any, users: list[str] | None) -> Any:
    names = (
        None
        if users is None
        else [DescribeUserScramCredentialsRequest.UserName(name=u) for u in users]
    )
    return roundtrip(
        backend,
        DescribeUserScramCredentialsRequest(users=names),
        0,
        DescribeUserScramCredentialsResponse,
    )


def test_alter_user_scram_credentials_stores_the_keys_of_the_salted_password() -> None:
    backend = AdminMemory()
    ups = [scram_upsertion("alice"), scram_upsertion("bob", SHA_512, 8192)]
    assert alter_users(backend, ups) == {"alice": 0, "bob": 0}
    (alice,) = backend.md.scram_credentials["alice"]
    expected = sasl.scram_credential(scram.SCRAM_SHA_256, "pw", b"salt" * 8, 4096)
    assert (alice.mechanism, alice.stored_key, alice.server_key) == (
        expected.mechanism, expected.stored_key, expected.server_key
    )  # fmt: skip
    assert backend.md.scram_credentials["bob"][0].iterations == 8192
    refused = [
        scram_upsertion("carol", 0),  # UNKNOWN
        scram_upsertion("dave", 3),
        scram_upsertion("erin", SHA_256, 100),
        scram_upsertion(""),
        scram_upsertion("bob", SHA_256),  # bob is also deleted below
    ]
    codes = alter_users(backend, refused, [("bob", SHA_512), ("zoe", SHA_256)])
    assert codes == {"carol": 33, "dave": 33, "erin": 93, "": 93, "bob": 92, "zoe": 91}
    assert set(backend.md.scram_credentials) == {"alice", "bob"}
    assert alter_users(backend, [], [("bob", SHA_512)]) == {"bob": 0}
    assert set(backend.md.scram_credentials) == {"alice"}


def test_describe_user_scram_credentials() -> None:
    backend = AdminMemory()
    alter_users(backend, [scram_upsertion("alice"), scram_upsertion("bob", SHA_512, 8192)])
    alter_users(backend, [scram_upsertion("alice", SHA_512, 16384)])

    def table(response: Any) -> dict[str, Any]:
        assert response.error_code == 0 and response.error_message is None
        return {
            r.user: r.error_code or [(c.mechanism, c.iterations) for c in r.credential_infos]
            for r in response.results
        }

    everyone = {"alice": [(SHA_256, 4096), (SHA_512, 16384)], "bob": [(SHA_512, 8192)]}
    assert table(describe_users(backend, None)) == everyone
    assert table(describe_users(backend, [])) == everyone
    assert table(describe_users(backend, ["bob", "nobody", "alice", "alice"])) == {
        "bob": [(SHA_512, 8192)], "nobody": 91, "alice": 92
    }  # fmt: skip
    response = describe_users(backend, ["nobody"])
    assert "does not exist: nobody" in response.results[0].error_message


def test_scram_admin_without_a_controller_answers_not_controller() -> None:
    backend = ControllerAdmin(None, None)  # type: ignore[arg-type]
    codes = alter_users(backend, [scram_upsertion("alice"), scram_upsertion("bob")], [("c", 1)])
    assert codes == {"alice": 41, "bob": 41, "c": 41}
    response = describe_users(backend, None)
    assert (response.error_code, response.results) == (41, [])
    assert "controller" in response.error_message


def test_scram_apis_are_advertised_at_v0() -> None:
    assert advertised_versions()[50] == advertised_versions()[51] == (0, 0)
