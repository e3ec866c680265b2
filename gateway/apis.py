"""The API versions raylog's gateway implements, and what it advertises in ApiVersions.

``TARGET_VERSIONS`` is docs/PROTOCOL.md section 1: the versions every supported client was run
against. ApiVersions' own flexible versions are answered specially (see
``handlers/api_versions.py``); the group admin APIs (15, 16, 42) are advertised up to flexible
versions, which the codec decodes and encodes like any other.

What is *advertised* is the target range of each API that has a handler registered, and nothing
else: a client never sees an API the gateway cannot answer. So the advertised table grows as
handler modules land, and this table caps each one at the measured range. Note that kafka-python
infers the broker's version from the advertised table (with only ApiVersions and Metadata it
guesses a very old broker); clients of a partial gateway pass ``api_version`` explicitly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from raylog.gateway import codec

__all__ = ["TARGET_VERSIONS", "VersionRange", "advertised_versions"]

VersionRange = tuple[int, int]  # (min_version, max_version), both inclusive

TARGET_VERSIONS: Mapping[int, VersionRange] = MappingProxyType(
    {
        0: (3, 7),  # Produce: >=3 means RecordBatch v2 only; zstd needs >=7 (and Fetch >=10)
        1: (4, 11),  # Fetch: v11 carries rack_id / preferred_read_replica (KIP-392)
        # ListOffsets: timestamps from v1; v4 leader epochs, v7 max timestamp (KIP-734), v8
        # earliest-local (KIP-405), v9 latest-tiered (KIP-1005). v7+ reads to kafka-python as a
        # Kafka 3.0 broker (InitProducerId v3 then required, and its consumers' session timeout
        # defaults to KIP-735's 45 s).
        2: (1, 9),
        3: (1, 5),  # Metadata: >=4 for older kcat builds
        # OffsetCommit: v7 carries a static member's group_instance_id (KIP-345); v5 drops
        # retention_time, v6 adds committed_leader_epoch. kafka-python does not infer the
        # broker's version from it; kafkajs sends <= 5, aiokafka <= 3.
        8: (2, 7),
        9: (1, 3),  # OffsetFetch
        10: (0, 2),  # FindCoordinator
        # JoinGroup: aiokafka knows {0, 1, 2, 5}. v9 (KIP-814 skip_assignment) would read to
        # kafka-python as a 3.2 broker (see docs/PROTOCOL.md on its version guess).
        11: (0, 5),
        12: (0, 3),  # Heartbeat
        13: (0, 3),  # LeaveGroup: v3 is KIP-345's batch of (member id, group_instance_id)
        14: (0, 3),  # SyncGroup: aiokafka knows {0, 1, 3}
        # Group admin: the codec's highest versions, which kafka-python sends; librdkafka sends
        # ListGroups <= 5, DescribeGroups <= 5 (after ConsumerGroupDescribe, not advertised),
        # DeleteGroups <= 2. Flexible: ListGroups 3+, DescribeGroups 5+, DeleteGroups 2.
        15: (0, 6),  # DescribeGroups: v6 answers an unknown group GROUP_ID_NOT_FOUND (KIP-1043)
        16: (0, 5),  # ListGroups: v4 states filter (KIP-518), v5 types filter (KIP-848)
        # SaslHandshake: librdkafka counts the broker as SASL-capable only if v0 is advertised,
        # but every supported client sends v1 (SaslAuthenticate follows). v0 would mean raw
        # SASL tokens outside Kafka's framing: handlers/sasl_handshake.py refuses it.
        17: (0, 1),
        18: (0, 2),  # ApiVersions
        19: (2, 4),  # CreateTopics: v4 = -1 defaults (KIP-464)
        20: (1, 3),  # DeleteTopics
        # DeleteRecords: v2 is flexible (Kafka's range is 0-2); kafka-python sends v2. It does
        # not infer the broker's version from it.
        21: (0, 2),
        22: (0, 4),  # InitProducerId: v3 KIP-360's epoch bump, v4 PRODUCER_FENCED (KIP-588)
        # AddPartitionsToTxn: v3 is flexible; v4+ is KIP-890's batched broker-to-broker form,
        # which kafka-python would read as a Kafka 3.6 broker. AddOffsetsToTxn and EndTxn: v2
        # answers PRODUCER_FENCED where v0-1 answer INVALID_PRODUCER_EPOCH (KIP-588), v3 is
        # flexible.
        24: (0, 3),
        25: (0, 3),
        26: (0, 3),
        # TxnOffsetCommit: v1 as v0, v2 adds committed_leader_epoch (KIP-320), v3 the member's
        # generation, member id and group_instance_id (KIP-447) and is flexible. kafka-python
        # does not infer the broker's version from it.
        28: (0, 3),
        # DescribeAcls, CreateAcls, DeleteAcls: v1 adds pattern types (KIP-290); librdkafka
        # sends up to v1. DescribeAcls v2 would read to kafka-python as a 2.5 broker (v3 as 3.3;
        # see docs/PROTOCOL.md on its version guess), so kafka-python sends v1 too.
        29: (0, 1),
        30: (0, 1),
        31: (0, 1),
        32: (0, 2),  # DescribeConfigs
        33: (0, 1),  # AlterConfigs
        36: (0, 2),  # SaslAuthenticate: v1 adds session_lifetime_ms (raylog: 0), v2 flexible
        # CreatePartitions, ElectLeaders: v2+ are flexible; librdkafka sends CreatePartitions v0
        # and ElectLeaders up to what the broker offers, kafka-python the highest both know.
        37: (0, 1),  # CreatePartitions
        42: (0, 2),  # DeleteGroups
        43: (0, 1),  # ElectLeaders: v1 adds election_type (preferred / unclean)
        44: (0, 0),  # IncrementalAlterConfigs
        47: (0, 0),  # OffsetDelete
        # Describe/AlterClientQuotas (KIP-546). DescribeClientQuotas from v1 only: kafka-python
        # reads a table offering its v0 as a Kafka 2.6 broker (see docs/PROTOCOL.md).
        48: (1, 1),
        49: (0, 1),
        # Describe/AlterUserScramCredentials (KIP-554): v0 is their only version, flexible.
        50: (0, 0),
        51: (0, 0),
        # DescribeTransactions, ListTransactions (KIP-664); ListTransactions v1 adds the
        # duration filter (KIP-994), v2 a transactional id pattern (not offered).
        65: (0, 0),
        66: (0, 1),
    }
)


def _check_table() -> None:
    # The codec must be able to decode and encode every version we could advertise.
    for api_key, (low, high) in TARGET_VERSIONS.items():
        if not 0 <= low <= high <= codec.max_version(api_key):
            raise RuntimeError(f"API {api_key}: versions {low}-{high} exceed the codec's specs")


_check_table()


def advertised_versions(registered: Iterable[int]) -> Mapping[int, VersionRange]:
    """The ApiVersions table for a gateway whose handlers cover the ``registered`` API keys."""
    table: dict[int, VersionRange] = {}
    for api_key in registered:
        if api_key not in TARGET_VERSIONS:
            raise ValueError(
                f"a handler is registered for API {api_key}, which has no target range"
            )
        table[api_key] = TARGET_VERSIONS[api_key]
    return MappingProxyType(dict(sorted(table.items())))
