"""The one registry of raylog's configuration keys: topic configs and broker configs.

This module owns every configuration key raylog accepts, with Kafka's names, types, defaults and
validation rules, and turns the ``dict[str, str]`` of overrides that travels in CreateTopics,
AlterConfigs and the cluster metadata into:

- :func:`validate` — the same overrides, checked and normalised (what the metadata stores);
- :func:`effective` — a typed :class:`TopicConfig` with every key resolved;
- :func:`log_config` and :func:`flush_policy` — the parts of it a replica's log and its flushes
  apply (the only place the log's keys are parsed);
- :func:`describe` — one :class:`ConfigEntry` per key for DescribeConfigs.

:data:`BROKER_CONFIGS` does the same for the broker-level keys (:class:`BrokerConfig`).

Where raylog's default differs from Kafka's, the definition's ``note`` says why.
Rules followed from Kafka:

- values are parsed, checked and stored as ``config_registry.py`` says;
- ``min.insync.replicas`` may exceed the replication factor: Kafka creates such a topic and then
  fails acks=all produce requests with NOT_ENOUGH_REPLICAS, so raylog does the same;
- ``min.compaction.lag.ms`` must not exceed ``max.compaction.lag.ms`` (Kafka's
  ``LogConfig.validateValues``, with its message);
- with ``remote.storage.enable=true``: no ``compact`` in ``cleanup.policy``, and
  ``local.retention.ms`` / ``local.retention.bytes`` (-2: follow the total) within
  ``retention.ms`` / ``retention.bytes`` (Kafka's validateValues, with its messages);
- topic configs Kafka has but raylog does not implement (``compression.type``,
  ``file.delete.delay.ms``, ...) are unknown keys here, refused rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import msgspec

from raylog.actors.control.config_registry import (
    INT32_MAX,
    INT64_MAX,
    ConfigDef,
    ConfigEntry,
    ConfigRegistry,
    invalid,
)
from raylog.actors.control.security_config_keys import (
    SECURITY_CONFIG_DEFS,
    check_authorizer,
    check_listeners,
)
from raylog.actors.replication.ready import REPLICA_FETCH_BYTES_DEFAULT, REPLICA_FETCH_BYTES_MAX
from raylog.storage.errors import InvalidConfigError
from raylog.storage.log import MAX_BATCH_BYTES, LogConfig, cleanup_policies

# --- topic configs ----------------------------------------------------------------------------


class TopicConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Every topic config resolved to its typed value (see TOPIC_CONFIG_DEFS for meanings)."""

    min_insync_replicas: int
    unclean_leader_election_enable: bool
    replication_mode: str  # "pull" | "push"
    retention_ms: int  # -1 = keep forever
    retention_bytes: int  # -1 = no size limit
    segment_bytes: int
    segment_ms: int
    max_message_bytes: int
    message_timestamp_type: str  # "CreateTime" | "LogAppendTime"
    flush_messages: int
    flush_ms: int
    cleanup_policy: str  # "delete" | "compact" | "compact,delete"
    delete_retention_ms: int
    min_cleanable_dirty_ratio: float
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int
    remote_storage_enable: bool
    local_retention_ms: int  # -2 = follow retention.ms
    local_retention_bytes: int  # -2 = follow retention.bytes

    @property
    def compact(self) -> bool:
        """The log cleaner compacts the topic (and produce refuses records without a key)."""
        return "compact" in cleanup_policies(self.cleanup_policy)

    @property
    def delete(self) -> bool:
        """Retention deletes old segments (retention.ms / retention.bytes)."""
        return "delete" in cleanup_policies(self.cleanup_policy)


TOPIC_CONFIG_DEFS: tuple[ConfigDef, ...] = (
    ConfigDef(
        name="min.insync.replicas",
        type="int",
        default="1",
        minimum=1,
        doc="The fewest ISR members an acks=all produce needs; fewer fails with "
        "NOT_ENOUGH_REPLICAS. May exceed the replication factor (then acks=all always fails).",
    ),
    ConfigDef(
        name="unclean.leader.election.enable",
        type="boolean",
        default="false",
        doc="Elect a replica outside the ISR when no ISR member is alive, losing committed "
        "records, rather than leaving the partition offline.",
    ),
    ConfigDef(
        name="replication.mode",
        type="string",
        default="pull",
        choices=("pull", "push"),
        doc="raylog only: pull (followers long-poll the leader, as Kafka) or push (the leader "
        "sends each batch to its followers).",
    ),
    ConfigDef(
        name="retention.ms",
        type="long",
        default="604800000",
        minimum=-1,
        doc="How long a closed segment is kept; -1 keeps segments forever.",
    ),
    ConfigDef(
        name="retention.bytes",
        type="long",
        default="-1",
        minimum=-1,
        doc="The most bytes a partition keeps before deleting old segments; -1 means no limit.",
    ),
    ConfigDef(
        name="segment.bytes",
        type="int",
        default="1073741824",
        minimum=14,  # Kafka's minimum: the size of the smallest legacy record
        doc="The size at which a segment is rolled.",
    ),
    ConfigDef(
        name="segment.ms",
        type="long",
        default="604800000",
        minimum=1,
        doc="The age at which a segment is rolled even when not full.",
    ),
    ConfigDef(
        name="max.message.bytes",
        type="int",
        default="1048588",
        minimum=0,
        maximum=MAX_BATCH_BYTES,
        doc="The largest record batch (after compression) the topic accepts.",
        note="Kafka takes any int. A raylog log holds at most 64 MiB per batch (recovery reads "
        "a batch whole into memory), so a larger value is refused here rather than by every "
        "replica's log.",
    ),
    ConfigDef(
        name="message.timestamp.type",
        type="string",
        default="CreateTime",
        choices=("CreateTime", "LogAppendTime"),
        doc="Whether record timestamps are the producer's (CreateTime) or the leader's append "
        "time (LogAppendTime).",
    ),
    ConfigDef(
        name="flush.messages",
        type="long",
        default="1",
        minimum=1,
        doc="fsync the log after this many appended records; 1 = before each append is acked.",
        note="Kafka's default is Long.MAX_VALUE (leave flushing to the OS and rely on "
        "replication). raylog's replicas often share one machine and one power supply in the "
        "embedded cluster, so replication alone does not protect an acknowledged write there; "
        "group-committed fsync of every append keeps acks durable at a small cost.",
    ),
    ConfigDef(
        name="flush.ms",
        type="long",
        default=str(INT64_MAX),
        minimum=0,
        doc="With flush.messages above 1: fsync once the oldest unflushed append is this old, "
        "also when no further append comes.",
    ),
    ConfigDef(
        name="cleanup.policy",
        type="list",
        default="delete",
        choices=("compact", "delete"),
        doc="delete: drop old segments by retention.ms / retention.bytes. compact: the log "
        "cleaner keeps the latest record of each key, and produce refuses records without a key "
        "(INVALID_RECORD). compact,delete (either order): both.",
        note="Kafka takes an empty list too (neither retention nor compaction); raylog refuses "
        "it, so that a topic always says how it is cleaned.",
    ),
    ConfigDef(
        name="delete.retention.ms",
        type="long",
        default="86400000",
        minimum=0,
        doc="Compacted topics: how long a tombstone (a record with a null value) stays after "
        "the log cleaner first keeps it, so that a consumer reading from the start sees the "
        "delete.",
    ),
    ConfigDef(
        name="min.cleanable.dirty.ratio",
        type="double",
        default="0.5",
        minimum=0,
        maximum=1,
        doc="Compacted topics: the log cleaner cleans a partition once the part of its log not "
        "yet cleaned is at least this share of the log.",
    ),
    ConfigDef(
        name="min.compaction.lag.ms",
        type="long",
        default="0",
        minimum=0,
        doc="Compacted topics: the least time a record stays uncompacted after it is appended.",
    ),
    ConfigDef(
        name="max.compaction.lag.ms",
        type="long",
        default=str(INT64_MAX),
        minimum=1,
        doc="Compacted topics: the longest a record may stay uncompacted; a partition holding "
        "one this old is cleaned whatever its dirty ratio.",
    ),
    ConfigDef(
        name="remote.storage.enable",
        type="boolean",
        default="false",
        doc="Tiered storage (KIP-405): copy closed segments to the object store and serve "
        "offsets below the local log start from there. Refused for compacted topics.",
        note="Not built: DeleteRecords below the local log start; a follower behind its "
        "leader's local log start restarts there instead of rebuilding from remote segments.",
    ),
    ConfigDef(
        name="local.retention.ms",
        type="long",
        default="-2",
        minimum=-2,
        doc="With remote.storage.enable: how long a copied segment stays on local disk; -2 "
        "follows retention.ms. At most retention.ms.",
    ),
    ConfigDef(
        name="local.retention.bytes",
        type="long",
        default="-2",
        minimum=-2,
        doc="With remote.storage.enable: the most bytes a partition keeps on local disk; -2 "
        "follows retention.bytes. At most retention.bytes.",
    ),
)


def _resolved_int(reg: ConfigRegistry, given: Mapping[str, str], key: str) -> int:
    """An int or long key of validated overrides, else its default."""
    return int(given.get(key, reg.defs[key].default))


def _compaction_lags_in_order(reg: ConfigRegistry, given: Mapping[str, str]) -> None:
    # Kafka's LogConfig.validateValues, with its message.
    low = _resolved_int(reg, given, "min.compaction.lag.ms")
    high = _resolved_int(reg, given, "max.compaction.lag.ms")
    if low > high:
        raise InvalidConfigError(
            f"conflict topic config setting min.compaction.lag.ms ({low}) > "
            f"max.compaction.lag.ms ({high})"
        )


def _remote_storage_rules(reg: ConfigRegistry, given: Mapping[str, str]) -> None:
    """Kafka's LogConfig.validateValues for a topic with remote.storage.enable=true: no
    compaction, and local retention within total retention (-2 follows it)."""
    if given.get("remote.storage.enable", reg.defs["remote.storage.enable"].default) != "true":
        return
    policy = given.get("cleanup.policy", reg.defs["cleanup.policy"].default)
    if "compact" in cleanup_policies(policy):
        raise invalid(
            "cleanup.policy", policy, "Remote log storage is unsupported for the compacted topics"
        )
    for local_key, total_key in (
        ("local.retention.ms", "retention.ms"),
        ("local.retention.bytes", "retention.bytes"),
    ):
        local, total = _resolved_int(reg, given, local_key), _resolved_int(reg, given, total_key)
        if total == -1 or local == -2:
            continue
        if local == -1:
            raise invalid(
                local_key, local, f"Value must not be -1 as {total_key} value is set as {total}."
            )
        if local > total:
            raise invalid(
                local_key, local, f"Value must not be more than {total_key} property value: {total}"
            )


TOPIC_CONFIGS = ConfigRegistry(
    TOPIC_CONFIG_DEFS, TopicConfig, checks=(_compaction_lags_in_order, _remote_storage_rules)
)


def validate(overrides: Mapping[str, str]) -> dict[str, str]:
    """Check topic config overrides; return them normalised (raises InvalidConfigError)."""
    return TOPIC_CONFIGS.validate(overrides)


def effective(overrides: Mapping[str, str]) -> TopicConfig:
    """The typed topic config: overrides over the registry defaults."""
    return TOPIC_CONFIGS.effective(overrides)


class FlushPolicy(NamedTuple):
    """When a replica fsyncs its log: after ``messages`` unflushed records (1: before each
    append counts), or once the oldest unflushed append is ``interval_ms`` old."""

    messages: int  # flush.messages
    interval_ms: int  # flush.ms


def log_config(overrides: Mapping[str, str]) -> LogConfig:
    """The settings a replica's log applies, from a topic's overrides over the defaults
    (raises InvalidConfigError, as :func:`validate` does, for a bad key or value)."""
    c = effective(overrides)
    return LogConfig(
        segment_bytes=c.segment_bytes,
        segment_ms=c.segment_ms,
        retention_ms=c.retention_ms,
        retention_bytes=c.retention_bytes,
        max_message_bytes=c.max_message_bytes,
        message_timestamp_type=c.message_timestamp_type,
        cleanup_policy=c.cleanup_policy,
        delete_retention_ms=c.delete_retention_ms,
        min_cleanable_dirty_ratio=c.min_cleanable_dirty_ratio,
        min_compaction_lag_ms=c.min_compaction_lag_ms,
        max_compaction_lag_ms=c.max_compaction_lag_ms,
    )


def flush_policy(overrides: Mapping[str, str]) -> FlushPolicy:
    """flush.messages and flush.ms of a topic's overrides over the defaults (raises
    InvalidConfigError for a bad key or value)."""
    c = effective(overrides)
    return FlushPolicy(messages=c.flush_messages, interval_ms=c.flush_ms)


def describe(overrides: Mapping[str, str], keys: Iterable[str] | None = None) -> list[ConfigEntry]:
    """DescribeConfigs rows of a topic: each key, its value, is_default and source."""
    return TOPIC_CONFIGS.describe(overrides, keys)


def apply_incremental(
    current: Mapping[str, str],
    set_configs: Mapping[str, str] | None = None,
    delete_configs: Iterable[str] = (),
) -> dict[str, str]:
    """IncrementalAlterConfigs on a topic's overrides; returns the validated result."""
    return TOPIC_CONFIGS.apply_incremental(current, set_configs, delete_configs)


# --- broker configs ---------------------------------------------------------------------------


class BrokerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Every broker-level config resolved to its typed value (see BROKER_CONFIG_DEFS)."""

    auto_create_topics_enable: bool
    default_replication_factor: int
    num_partitions: int
    offsets_topic_num_partitions: int
    offsets_topic_replication_factor: int
    offsets_retention_minutes: int
    offsets_retention_check_interval_ms: int
    group_initial_rebalance_delay_ms: int
    transaction_state_log_num_partitions: int
    transaction_state_log_replication_factor: int
    transaction_state_log_min_isr: int
    transaction_max_timeout_ms: int
    transactional_id_expiration_ms: int
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int
    transaction_remove_expired_transaction_cleanup_interval_ms: int
    auto_leader_rebalance_enable: bool
    leader_imbalance_per_broker_percentage: int
    leader_imbalance_check_interval_seconds: int
    broker_heartbeat_interval_ms: int
    broker_session_timeout_ms: int
    replica_lag_time_max_ms: int
    replica_fetch_max_bytes: int
    log_retention_check_interval_ms: int
    remote_log_manager_task_interval_ms: int
    log_cleaner_backoff_ms: int
    leader_replication_throttled_rate: int
    replica_balancer_enable: bool
    replica_balancer_check_interval_ms: int
    replica_balancer_throttle_bytes_per_second: int
    replica_balancer_heal_broker_failure_threshold_ms: int
    replica_balancer_bytes_threshold: float
    replica_balancer_bytes_min_gap: int
    autoscaler_request_timeout_ms: int
    replica_offline_retry_backoff_ms: int
    listeners: str
    advertised_listeners: str
    listener_security_protocol_map: str
    allow_insecure_network_listeners: bool
    sasl_enabled_mechanisms: str
    connection_failed_authentication_delay_ms: int
    ssl_keystore_type: str
    ssl_keystore_location: str
    ssl_key_password: str
    ssl_truststore_type: str
    ssl_truststore_location: str
    ssl_client_auth: str
    ssl_principal_mapping_rules: str
    authorizer_class_name: str
    super_users: str
    allow_everyone_if_no_acl_found: bool
    quota_window_num: int
    quota_window_size_seconds: int


BROKER_CONFIG_DEFS: tuple[ConfigDef, ...] = (
    ConfigDef(
        name="auto.create.topics.enable",
        type="boolean",
        default="false",
        doc="Create a topic when a client asks for metadata of an unknown one.",
        note="Kafka's default is true. Each replica is a Ray actor (~52 MiB, ~0.65 s of CPU to "
        "start), so a typo in a topic name must not silently cost a process per replica.",
    ),
    ConfigDef(
        name="default.replication.factor",
        type="int",
        default="1",
        minimum=1,
        maximum=INT32_MAX,
        doc="The replication factor of topics created without one (auto-created, or "
        "CreateTopics with replication factor -1).",
    ),
    ConfigDef(
        name="num.partitions",
        type="int",
        default="1",
        minimum=1,
        doc="The partition count of topics created without one.",
    ),
    ConfigDef(
        name="offsets.topic.num.partitions",
        type="int",
        default="3",
        minimum=1,
        doc="Partitions of __consumer_offsets; fixed once the topic exists.",
        note="Kafka's default is 50. A raylog replica is a Ray actor costing ~52 MiB, so 50 "
        "partitions x RF 3 would take ~7.6 GiB before any user topic exists.",
    ),
    ConfigDef(
        name="offsets.topic.replication.factor",
        type="int",
        default="3",
        minimum=1,
        maximum=32767,
        doc="Replication factor of __consumer_offsets (capped by the brokers present when it is "
        "created).",
    ),
    ConfigDef(
        name="offsets.retention.minutes",
        type="int",
        default="10080",
        minimum=1,
        doc="Committed offsets of a group that has been empty this long (a group that never "
        "joins: since each offset's commit) are deleted (KIP-211).",
        note="Kafka also expires, in a Stable consumer group, the offsets of topics no member "
        "subscribes to; raylog keeps those.",
    ),
    ConfigDef(
        name="offsets.retention.check.interval.ms",
        type="long",
        default="600000",
        minimum=1,
        doc="How often each group coordinator looks for expired offsets.",
    ),
    ConfigDef(
        name="group.initial.rebalance.delay.ms",
        type="int",
        default="3000",
        minimum=0,
        doc="How long the first rebalance of an empty consumer group waits for more members, "
        "extended by as much while new ones arrive (within the rebalance timeout); 0 completes "
        "it as soon as every member has joined.",
    ),
    ConfigDef(
        name="transaction.state.log.num.partitions",
        type="int",
        default="3",
        minimum=1,
        doc="Partitions of __transaction_state; fixed once the topic exists.",
        note="Kafka's default is 50; raylog's is small for the reason offsets.topic.num.partitions "
        "gives.",
    ),
    ConfigDef(
        name="transaction.state.log.replication.factor",
        type="int",
        default="3",
        minimum=1,
        maximum=32767,
        doc="Replication factor of __transaction_state (capped by the brokers present when it is "
        "created).",
    ),
    ConfigDef(
        name="transaction.state.log.min.isr",
        type="int",
        default="2",
        minimum=1,
        doc="min.insync.replicas of __transaction_state (capped by its replication factor).",
    ),
    ConfigDef(
        name="transaction.max.timeout.ms",
        type="int",
        default="900000",
        minimum=1,
        doc="The longest transaction.timeout.ms a producer may ask for; InitProducerId with a "
        "longer one gets INVALID_TRANSACTION_TIMEOUT.",
    ),
    ConfigDef(
        name="transactional.id.expiration.ms",
        type="int",
        default="604800000",
        minimum=1,
        doc="A transactional id whose producer sent nothing for this long is forgotten.",
    ),
    ConfigDef(
        name="transaction.abort.timed.out.transaction.cleanup.interval.ms",
        type="int",
        default="10000",
        minimum=1,
        doc="How often transaction coordinators abort transactions past their timeout.",
    ),
    ConfigDef(
        name="transaction.remove.expired.transaction.cleanup.interval.ms",
        type="int",
        default="3600000",
        minimum=1,
        doc="How often transaction coordinators forget expired transactional ids.",
    ),
    ConfigDef(
        name="auto.leader.rebalance.enable",
        type="boolean",
        default="true",
        doc="Move leadership back to preferred replicas when a broker's imbalance exceeds "
        "leader.imbalance.per.broker.percentage.",
    ),
    ConfigDef(
        name="leader.imbalance.per.broker.percentage",
        type="int",
        default="10",
        minimum=0,
        maximum=100,
        doc="Percent of a broker's preferred partitions it may fail to lead before a rebalance.",
    ),
    ConfigDef(
        name="leader.imbalance.check.interval.seconds",
        type="long",
        default="30",
        minimum=1,
        doc="How often the controller checks leader imbalance.",
        note="Kafka's default is 300. After `raylog up` restarts, the broker stopped last leads "
        "every partition until this check runs; a check is one pure pass over the metadata and, "
        "when it elects, one metadata write and one push round (milliseconds), so raylog "
        "does not leave a laptop cluster skewed for five minutes.",
    ),
    ConfigDef(
        name="broker.heartbeat.interval.ms",
        type="int",
        default="2000",
        minimum=1,
        doc="How often a broker heartbeats the controller.",
    ),
    ConfigDef(
        name="broker.session.timeout.ms",
        type="int",
        default="9000",
        minimum=1,
        doc="A broker not heard from for this long is fenced (judged by the controller's "
        "monotonic clock). Must be at least twice broker.heartbeat.interval.ms.",
    ),
    ConfigDef(
        name="replica.lag.time.max.ms",
        type="long",
        default="30000",
        minimum=1,
        doc="A follower that has not caught up to the leader's log end for this long leaves "
        "the ISR.",
    ),
    ConfigDef(
        name="replica.fetch.max.bytes",
        type="int",
        default=str(REPLICA_FETCH_BYTES_DEFAULT),
        minimum=1,
        maximum=REPLICA_FETCH_BYTES_MAX,
        doc="The most a follower's fetch of one partition takes from its leader (at least one "
        "whole batch, however large).",
        note="Kafka's default is 1 MiB per partition within 10 MiB per response "
        "(replica.fetch.response.max.bytes). A raylog follower fetches each partition on its "
        "own, and fsyncs every fetch before the next: at 1 MiB it moved one ~1 MB client batch "
        "per fsync, which capped a partition's RF=3 acks=all produce. So its fetch takes up to "
        "Kafka's response limit, and at most 64 MiB.",
    ),
    ConfigDef(
        name="log.retention.check.interval.ms",
        type="long",
        default="300000",
        minimum=1,
        doc="How often each replica deletes segments past retention.ms / retention.bytes.",
    ),
    ConfigDef(
        name="remote.log.manager.task.interval.ms",
        type="long",
        default="30000",
        minimum=1,
        doc="Tiered storage: how often each replica of a topic with remote.storage.enable copies "
        "closed segments (the leader), applies remote retention and deletes copied local "
        "segments past local retention.",
    ),
    ConfigDef(
        name="log.cleaner.backoff.ms",
        type="long",
        default="15000",
        minimum=1,
        doc="How often each replica of a compacted topic checks whether a cleaning pass is due "
        "(min.cleanable.dirty.ratio, max.compaction.lag.ms, a tombstone's delete horizon).",
    ),
    ConfigDef(
        name="leader.replication.throttled.rate",
        type="long",
        default="9223372036854775807",
        minimum=1,
        doc="Bytes per second a leader sends to the replicas a reassignment adds while they "
        "catch up (followers already in the ISR are never throttled). `raylog reassign "
        "--throttle` sets it for the duration of the reassignments.",
        note="Kafka applies it to the replicas listed in leader.replication.throttled.replicas "
        "and pairs it with follower.replication.throttled.rate; raylog throttles exactly the "
        "adding replicas of partitions being reassigned, on the leader side only.",
    ),
    ConfigDef(
        name="replica.balancer.enable",
        type="boolean",
        default="false",
        doc="Continuous balancing: the controller moves replicas (throttled reassignments, "
        "rack-aware, one at a time per broker) until every broker that takes replicas holds "
        "within one of the same number, pausing while any partition is under-replicated or "
        "offline or another reassignment runs. `raylog up --address` turns it on unless set.",
        note="Kafka has no such config: Cruise Control or Confluent's Self-Balancing Clusters "
        "do this beside it. raylog balances replica counts, then bytes by swaps "
        "(replica.balancer.bytes.*); leaders follow through auto.leader.rebalance.enable.",
    ),
    ConfigDef(
        name="replica.balancer.check.interval.ms",
        type="long",
        default="10000",
        minimum=100,
        doc="How often the balancer looks for moves (a pass over the metadata).",
    ),
    ConfigDef(
        name="replica.balancer.throttle.bytes.per.second",
        type="long",
        default="10485760",
        minimum=1,
        doc="leader.replication.throttled.rate for the balancer's moves while they run.",
    ),
    ConfigDef(
        name="replica.balancer.heal.broker.failure.threshold.ms",
        type="long",
        default="900000",
        minimum=0,
        doc="A broker fenced this long (its node gone, its process dead) is lost: the balancer "
        "re-creates its replicas on the other brokers, restoring each partition's replication "
        "factor. A broker stopped on purpose for longer counts too: turn the balancer off "
        "for long maintenance.",
        note="Redpanda's partition_autobalancing_node_availability_timeout_sec (900 s) and "
        "Confluent's confluent.balancer.heal.broker.failure.threshold.ms do the same.",
    ),
    ConfigDef(
        name="replica.balancer.bytes.threshold",
        type="double",
        default="1.1",
        minimum=1,
        doc="Once replica counts are even, the balancer swaps a replica of the broker holding "
        "the most bytes for a smaller one of the broker holding the fewest while the first "
        "holds more than this times the average (and replica.balancer.bytes.min.gap more than "
        "the other).",
        note="Cruise Control's disk.balance.threshold (1.10) plays the same part.",
    ),
    ConfigDef(
        name="replica.balancer.bytes.min.gap",
        type="long",
        default="67108864",
        minimum=0,
        doc="Bytes between the fullest and the emptiest broker below which the balancer moves "
        "nothing for bytes (a swap copies data: not worth it for small logs).",
    ),
    ConfigDef(
        name="autoscaler.request.timeout.ms",
        type="long",
        default="600000",
        minimum=0,
        doc="Where Ray's autoscaler runs: a topic whose replicas do not fit the brokers present "
        "(too few for its replication factor, or too little free memory) makes the controller "
        "ask the autoscaler for the raylog nodes it needs, and the request stands this long; "
        "CreateTopics and `raylog topics create` try again until their own timeout. 0: never "
        "ask, refuse at once (as where no autoscaler runs).",
        note="Kafka has no such config: its brokers are not started for it.",
    ),
    ConfigDef(
        name="replica.offline.retry.backoff.ms",
        type="long",
        default="60000",
        minimum=1,
        doc="How long a replica whose log failed (a full disk, an I/O error) stays offline "
        "before its broker re-creates it from its log; it goes offline again if the log "
        "still fails.",
        note="Kafka has no such setting: a failed log directory stays offline until the broker "
        "restarts. Each raylog replica has a log directory and a process of its own, so its "
        "broker retries it alone, and a disk that was full comes back without a restart.",
    ),
    *SECURITY_CONFIG_DEFS,
)


def _session_outlives_heartbeats(reg: ConfigRegistry, given: Mapping[str, str]) -> None:
    # A session must survive one lost heartbeat, else a single delayed message fences a healthy
    # broker and moves its leaders (the lease rule: lease >= 2 x renew).
    session = _resolved_int(reg, given, "broker.session.timeout.ms")
    heartbeat = _resolved_int(reg, given, "broker.heartbeat.interval.ms")
    if session < 2 * heartbeat:
        raise invalid(
            "broker.session.timeout.ms",
            str(session),
            f"must be at least 2 x broker.heartbeat.interval.ms ({heartbeat})",
        )


BROKER_CONFIGS = ConfigRegistry(
    BROKER_CONFIG_DEFS,
    BrokerConfig,
    checks=(_session_outlives_heartbeats, check_listeners, check_authorizer),
)


def broker_config(overrides: Mapping[str, str] | None = None) -> BrokerConfig:
    """The typed broker config: overrides (e.g. from ``raylog up``) over the defaults."""
    return BROKER_CONFIGS.effective(overrides or {})
