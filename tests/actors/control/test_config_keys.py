"""The config registry follows Kafka's names, defaults and validation, and refuses loudly.

Proves: defaults are Kafka's (or raylog's documented ones), values are parsed and normalised the
way Kafka parses them (doubles as Java reads and writes them), every bad value and unknown key
raises INVALID_CONFIG naming key and value, DescribeConfigs rows say which values are defaults
and give each key's Kafka type, cleanup.policy takes compact, delete and both in one stored
spelling, and the cross-key rules (compaction lags, broker session, tiered storage) hold. A
replica's log settings and flush policy come from the registry's parsing, with its errors.
"""

from __future__ import annotations

import pytest

from raylog.actors.control import config_keys
from raylog.actors.control.config_keys import BROKER_CONFIGS, broker_config
from raylog.actors.control.config_registry import SOURCE_DEFAULT_CONFIG, SOURCE_TOPIC_CONFIG
from raylog.actors.replication.ready import ReplicaConfig
from raylog.storage.errors import InvalidConfigError
from raylog.storage.log import MAX_BATCH_BYTES, LogConfig


def test_topic_defaults() -> None:
    c = config_keys.effective({})
    assert c.min_insync_replicas == 1
    assert c.unclean_leader_election_enable is False
    assert c.replication_mode == "pull"
    assert c.retention_ms == 604800000
    assert c.retention_bytes == -1
    assert c.segment_bytes == 1073741824
    assert c.segment_ms == 604800000
    assert c.max_message_bytes == 1048588
    assert c.message_timestamp_type == "CreateTime"
    assert c.flush_messages == 1  # raylog: fsync every append (Kafka: Long.MAX_VALUE)
    assert c.flush_ms == 2**63 - 1
    assert c.cleanup_policy == "delete"
    assert (c.delete, c.compact) == (True, False)
    assert c.delete_retention_ms == 86400000
    assert c.min_cleanable_dirty_ratio == 0.5
    assert c.min_compaction_lag_ms == 0
    assert c.max_compaction_lag_ms == 2**63 - 1
    assert c.remote_storage_enable is False
    assert (c.local_retention_ms, c.local_retention_bytes) == (-2, -2)  # follow the totals


def test_broker_defaults() -> None:
    b = broker_config()
    assert b.auto_create_topics_enable is False
    assert b.default_replication_factor == 1
    assert b.num_partitions == 1
    assert b.offsets_topic_num_partitions == 3
    assert b.auto_leader_rebalance_enable is True
    assert b.leader_imbalance_per_broker_percentage == 10
    assert b.leader_imbalance_check_interval_seconds == 30  # raylog: see its note
    assert b.broker_heartbeat_interval_ms == 2000
    assert b.broker_session_timeout_ms == 9000
    assert b.replica_lag_time_max_ms == 30000
    assert b.replica_fetch_max_bytes == 10 << 20  # raylog: see its note


def test_replica_fetch_max_bytes_is_bounded_by_what_one_channel_frame_carries() -> None:
    assert broker_config({"replica.fetch.max.bytes": str(64 << 20)}).replica_fetch_max_bytes == (
        64 << 20
    )
    for bad in (str((64 << 20) + 1), "0", "-1", "ten"):
        with pytest.raises(InvalidConfigError, match=r"replica\.fetch\.max\.bytes"):
            broker_config({"replica.fetch.max.bytes": bad})
    with pytest.raises(InvalidConfigError, match=r"replica\.fetch\.max\.bytes"):
        ReplicaConfig(fetch_max_bytes=(64 << 20) + 1).validate()
    ReplicaConfig(fetch_max_bytes=64 << 20).validate()


def test_values_are_parsed_like_kafka_and_normalised() -> None:
    got = config_keys.validate(
        {
            "unclean.leader.election.enable": " TRUE ",
            "min.insync.replicas": "+2",
            "retention.ms": "-1",
            "cleanup.policy": " delete ",
            "replication.mode": "push",
        }
    )
    assert got == {
        "cleanup.policy": "delete",
        "min.insync.replicas": "2",
        "replication.mode": "push",
        "retention.ms": "-1",
        "unclean.leader.election.enable": "true",
    }
    assert list(got) == sorted(got)
    c = config_keys.effective(got)
    assert c.unclean_leader_election_enable is True
    assert c.min_insync_replicas == 2
    assert c.retention_ms == -1


def test_min_insync_replicas_above_any_replication_factor_is_allowed() -> None:
    # Kafka creates such a topic; acks=all produce then fails with NOT_ENOUGH_REPLICAS.
    assert config_keys.effective({"min.insync.replicas": "5"}).min_insync_replicas == 5


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("min.insync.replicas", "0"),
        ("min.insync.replicas", "1.5"),
        ("min.insync.replicas", "2147483648"),  # above int32
        ("unclean.leader.election.enable", "yes"),
        ("replication.mode", "PULL"),  # choices are case-sensitive, as Kafka's ValidString
        ("retention.ms", "-2"),
        ("retention.ms", "1_000"),  # Python's int() would take it, Java's parseLong would not
        ("retention.bytes", "-5"),
        ("segment.bytes", "13"),
        ("segment.ms", "0"),
        ("max.message.bytes", "-1"),
        ("max.message.bytes", str(MAX_BATCH_BYTES + 1)),  # raylog: see its note
        ("message.timestamp.type", "WallClock"),
        ("flush.messages", "0"),
        ("flush.ms", "-1"),
        ("cleanup.policy", "shred"),
        ("cleanup.policy", "compact,shred"),
        ("cleanup.policy", "Compact"),
        ("cleanup.policy", " , "),
        ("cleanup.policy", ""),
        ("delete.retention.ms", "-1"),
        ("min.cleanable.dirty.ratio", "1.01"),
        ("min.cleanable.dirty.ratio", "-0.1"),
        ("min.cleanable.dirty.ratio", "NaN"),
        ("min.cleanable.dirty.ratio", "Infinity"),
        ("min.cleanable.dirty.ratio", "inf"),
        ("min.cleanable.dirty.ratio", "1e999"),  # Java reads Infinity
        ("min.cleanable.dirty.ratio", "0x1p-1"),  # Java's hexadecimal form: not taken
        ("min.cleanable.dirty.ratio", "0_5"),  # Python's float() would take it
        ("min.cleanable.dirty.ratio", "half"),
        ("min.cleanable.dirty.ratio", "."),
        ("min.compaction.lag.ms", "-1"),
        ("max.compaction.lag.ms", "0"),
    ],
)
def test_bad_values_name_key_and_value(key: str, value: str) -> None:
    with pytest.raises(InvalidConfigError) as e:
        config_keys.validate({key: value})
    assert e.value.error_code == 40
    assert key in str(e.value)
    assert repr(value) in str(e.value)


def test_log_config_and_flush_policy_come_from_the_registry() -> None:
    overrides = {
        "segment.bytes": " 1048576 ",
        "cleanup.policy": "delete, compact",
        "min.cleanable.dirty.ratio": "1",
        "retention.ms": "-1",
        "min.insync.replicas": "2",  # not the log's: ignored by it
    }
    assert config_keys.log_config(overrides) == LogConfig(
        segment_bytes=1048576,
        cleanup_policy="compact,delete",
        min_cleanable_dirty_ratio=1.0,
        retention_ms=-1,
    )
    assert config_keys.log_config({}) == LogConfig()
    assert config_keys.flush_policy({}) == (1, 2**63 - 1)
    assert config_keys.flush_policy({"flush.messages": "10", "flush.ms": "500"}) == (10, 500)


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("segment.bytes", "1", "value must be at least 14"),
        ("flush.messages", "lots", "expected a decimal integer (long)"),
        ("max.message.bytes", str(1 << 30), f"value must be at most {MAX_BATCH_BYTES}"),
        ("retention.ms", "1_000", "expected a decimal integer (long)"),
    ],
)
def test_log_config_and_flush_policy_refuse_a_bad_value_with_the_registrys_message(
    key: str, value: str, why: str
) -> None:
    message = f"Invalid value {value!r} for configuration {key}: {why}"
    for parse in (config_keys.log_config, config_keys.flush_policy):
        with pytest.raises(InvalidConfigError) as e:
            parse({key: value})
        assert str(e.value) == message
    with pytest.raises(InvalidConfigError, match=r"Unknown configuration flush\.message "):
        config_keys.log_config({"flush.message": "1"})


@pytest.mark.parametrize(
    ("given", "stored", "compact", "delete"),
    [
        ("delete", "delete", False, True),
        ("compact", "compact", True, False),
        ("compact,delete", "compact,delete", True, True),
        (" delete , compact ", "compact,delete", True, True),
        ("compact,compact", "compact", True, False),
        ("delete,,compact,", "compact,delete", True, True),
    ],
)
def test_cleanup_policy_takes_compact_delete_and_both(
    given: str, stored: str, compact: bool, delete: bool
) -> None:
    assert config_keys.validate({"cleanup.policy": given}) == {"cleanup.policy": stored}
    c = config_keys.effective({"cleanup.policy": given})
    assert (c.cleanup_policy, c.compact, c.delete) == (stored, compact, delete)


def test_an_empty_cleanup_policy_is_refused_with_a_clear_message() -> None:
    with pytest.raises(InvalidConfigError, match="expected at least one of compact, delete"):
        config_keys.validate({"cleanup.policy": " , "})


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("0.5", "0.5"),
        (" 0.50 ", "0.5"),
        ("1", "1.0"),
        ("0", "0.0"),
        ("1e-1", "0.1"),
        ("+.25", "0.25"),
        ("0.75d", "0.75"),  # Java's parseDouble takes a type suffix
        ("0.0001", "1.0E-4"),  # and toString writes below 1e-3 in E notation
        ("1.5E-5", "1.5E-5"),
    ],
)
def test_doubles_are_read_and_written_as_java_does(given: str, stored: str) -> None:
    got = config_keys.validate({"min.cleanable.dirty.ratio": given})
    assert got == {"min.cleanable.dirty.ratio": stored}
    assert config_keys.effective(got).min_cleanable_dirty_ratio == float(stored)


def test_min_compaction_lag_must_not_exceed_max() -> None:
    ok = {"min.compaction.lag.ms": "60000", "max.compaction.lag.ms": "60000"}
    assert config_keys.validate(ok) == ok
    # Checked on the whole resulting set: also when a patch sets only one of the two.
    message = (
        r"conflict topic config setting min\.compaction\.lag\.ms \(60000\) > "
        r"max\.compaction\.lag\.ms \(1000\)"
    )
    with pytest.raises(InvalidConfigError, match=message) as e:
        config_keys.validate({"min.compaction.lag.ms": "60000", "max.compaction.lag.ms": "1000"})
    assert e.value.error_code == 40
    with pytest.raises(InvalidConfigError, match=message):
        config_keys.apply_incremental(
            {"min.compaction.lag.ms": "60000"}, {"max.compaction.lag.ms": "1000"}
        )


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"cleanup.policy": "compact"}, "unsupported for the compacted topics"),
        ({"cleanup.policy": "compact,delete"}, "unsupported for the compacted topics"),
        ({"local.retention.ms": "604800001"}, "not be more than retention.ms"),
        ({"retention.ms": "1000", "local.retention.ms": "-1"}, "must not be -1"),
        ({"retention.bytes": "1000", "local.retention.bytes": "1001"}, "retention.bytes"),
        ({"local.retention.bytes": "-3"}, "at least -2"),
    ],
)
def test_tiered_storage_rules_are_kafkas(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        config_keys.validate({"remote.storage.enable": "true", **overrides})


def test_tiered_storage_accepts_kafkas_valid_combinations() -> None:
    for overrides in (
        {},
        {"local.retention.ms": "1000", "local.retention.bytes": "1"},
        {"retention.ms": "-1", "local.retention.ms": "-1"},  # unlimited total: anything goes
        {"retention.bytes": "500", "local.retention.bytes": "500"},
    ):
        assert config_keys.effective({"remote.storage.enable": "true", **overrides})
    # Without remote storage the local keys are not checked against the totals, as in Kafka,
    # and a compacted topic is fine.
    assert config_keys.validate({"cleanup.policy": "compact", "local.retention.ms": "9"})


def test_unknown_keys_are_refused() -> None:
    for key in ("compression.type", "replica.lag.time.max.ms", "min.insync.replica"):
        with pytest.raises(InvalidConfigError, match=key.replace(".", r"\.")):
            config_keys.validate({key: "1"})


def test_describe_marks_defaults_and_overrides() -> None:
    rows = {r.name: r for r in config_keys.describe({"retention.ms": "-1"})}
    assert set(rows) == set(config_keys.TOPIC_CONFIGS.defs)
    assert rows["retention.ms"].value == "-1"
    assert rows["retention.ms"].is_default is False
    assert rows["retention.ms"].source == SOURCE_TOPIC_CONFIG
    assert rows["retention.ms"].config_type == 5  # LONG
    assert rows["min.insync.replicas"].value == "1"
    assert rows["min.insync.replicas"].is_default is True
    assert rows["min.insync.replicas"].source == SOURCE_DEFAULT_CONFIG
    assert rows["cleanup.policy"].config_type == 7  # LIST
    only = config_keys.describe({}, ["segment.bytes"])
    assert [r.name for r in only] == ["segment.bytes"]
    with pytest.raises(InvalidConfigError):
        config_keys.describe({}, ["no.such.key"])


def test_describe_rows_of_the_compaction_keys() -> None:
    overrides = {"cleanup.policy": "delete,compact", "min.cleanable.dirty.ratio": "0.25"}
    rows = {r.name: r for r in config_keys.describe(overrides)}
    expected = {  # value, is_default, source, config_type (Kafka's ConfigEntry.ConfigType)
        "cleanup.policy": ("compact,delete", False, SOURCE_TOPIC_CONFIG, 7),  # LIST
        "min.cleanable.dirty.ratio": ("0.25", False, SOURCE_TOPIC_CONFIG, 6),  # DOUBLE
        "delete.retention.ms": ("86400000", True, SOURCE_DEFAULT_CONFIG, 5),  # LONG
        "min.compaction.lag.ms": ("0", True, SOURCE_DEFAULT_CONFIG, 5),
        "max.compaction.lag.ms": ("9223372036854775807", True, SOURCE_DEFAULT_CONFIG, 5),
    }
    for key, want in expected.items():
        r = rows[key]
        assert (r.value, r.is_default, r.source, r.config_type) == want, key
        assert r.documentation


def test_incremental_alter_sets_and_deletes() -> None:
    current = {"retention.ms": "1000", "min.insync.replicas": "2"}
    got = config_keys.apply_incremental(
        current, {"segment.ms": "60000"}, delete_configs=["retention.ms", "flush.ms"]
    )
    assert got == {"min.insync.replicas": "2", "segment.ms": "60000"}
    with pytest.raises(InvalidConfigError):
        config_keys.apply_incremental(current, delete_configs=["bogus"])


def test_broker_session_must_outlive_two_heartbeats() -> None:
    assert broker_config({"broker.session.timeout.ms": "4000"}).broker_session_timeout_ms == 4000
    with pytest.raises(InvalidConfigError, match=r"broker\.session\.timeout\.ms"):
        broker_config({"broker.session.timeout.ms": "3999"})
    with pytest.raises(InvalidConfigError, match=r"broker\.session\.timeout\.ms"):
        broker_config({"broker.heartbeat.interval.ms": "5000"})


def test_broker_config_validation_style_matches() -> None:
    with pytest.raises(InvalidConfigError, match=r"leader\.imbalance\.per\.broker\.percentage"):
        BROKER_CONFIGS.validate({"leader.imbalance.per.broker.percentage": "101"})
    with pytest.raises(InvalidConfigError, match=r"min\.insync\.replicas"):
        BROKER_CONFIGS.validate({"min.insync.replicas": "1"})  # a topic key, not a broker one
    assert BROKER_CONFIGS.validate({"auto.create.topics.enable": "True"}) == {
        "auto.create.topics.enable": "true"
    }
