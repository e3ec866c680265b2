"""A log's settings (:class:`LogConfig`) and the limits every log keeps.

The Kafka keys are parsed and validated in one place, the config registry
(``raylog.actors.control.config_keys.log_config``); the checks here are the log's own
invariants. The flush policy (flush.messages, flush.ms) is not here: the log's owner decides
when to call :meth:`~raylog.storage.log.Log.flush`.
"""

from __future__ import annotations

import msgspec

from raylog.storage.errors import InvalidConfigError

# Hard ceiling on one stored batch (leader or follower). Recovery never reads a batch larger
# than this into memory, so max.message.bytes cannot exceed it.
MAX_BATCH_BYTES = 64 << 20
# Relative offsets and positions in index entries are int32.
MAX_SEGMENT_BYTES = (1 << 31) - 1
MAX_RELATIVE_OFFSET = (1 << 31) - 1

DAY_MS = 24 * 60 * 60 * 1000
LONG_MAX = (1 << 63) - 1


def cleanup_policies(value: str) -> frozenset[str]:
    """The policies a cleanup.policy value names (a comma-separated list)."""
    return frozenset(p.strip() for p in value.split(",") if p.strip())


class LogConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Per-log settings, typed; each field is the Kafka topic config named in its comment."""

    segment_bytes: int = 1 << 30  # segment.bytes
    segment_ms: int = 7 * DAY_MS  # segment.ms
    retention_ms: int = 7 * DAY_MS  # retention.ms (-1: unlimited)
    retention_bytes: int = -1  # retention.bytes (-1: unlimited)
    max_message_bytes: int = 1048588  # max.message.bytes
    index_interval_bytes: int = 4096  # index.interval.bytes
    message_timestamp_type: str = "CreateTime"  # message.timestamp.type
    cleanup_policy: str = "delete"  # cleanup.policy: delete, compact or compact,delete
    delete_retention_ms: int = DAY_MS  # delete.retention.ms
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = LONG_MAX  # max.compaction.lag.ms

    def __post_init__(self) -> None:
        _check_range("segment.bytes", self.segment_bytes, 14, MAX_SEGMENT_BYTES)
        _check_range("segment.ms", self.segment_ms, 1, LONG_MAX)
        _check_range("retention.ms", self.retention_ms, -1, LONG_MAX)
        _check_range("retention.bytes", self.retention_bytes, -1, LONG_MAX)
        _check_range("max.message.bytes", self.max_message_bytes, 0, MAX_BATCH_BYTES)
        _check_range("index.interval.bytes", self.index_interval_bytes, 0, MAX_SEGMENT_BYTES)
        if self.message_timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise InvalidConfigError(
                f"message.timestamp.type={self.message_timestamp_type!r}: "
                "expected CreateTime or LogAppendTime"
            )
        policies = cleanup_policies(self.cleanup_policy)
        if not policies or not policies <= {"delete", "compact"}:
            raise InvalidConfigError(
                f"cleanup.policy={self.cleanup_policy!r}: expected delete, compact or both"
            )
        _check_range("delete.retention.ms", self.delete_retention_ms, 0, LONG_MAX)
        _check_range("min.compaction.lag.ms", self.min_compaction_lag_ms, 0, LONG_MAX)
        _check_range("max.compaction.lag.ms", self.max_compaction_lag_ms, 1, LONG_MAX)
        ratio = self.min_cleanable_dirty_ratio
        if not isinstance(ratio, float | int) or not 0.0 <= ratio <= 1.0:
            raise InvalidConfigError(f"min.cleanable.dirty.ratio={ratio!r}: must be in [0, 1]")

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def compact(self) -> bool:
        """cleanup.policy includes compact: the log cleaner keeps the latest record per key."""
        return "compact" in cleanup_policies(self.cleanup_policy)

    @property
    def delete(self) -> bool:
        """cleanup.policy includes delete: retention.ms / retention.bytes delete segments."""
        return "delete" in cleanup_policies(self.cleanup_policy)


def _check_range(key: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidConfigError(f"{key}={value!r}: must be an integer in [{low}, {high}]")
