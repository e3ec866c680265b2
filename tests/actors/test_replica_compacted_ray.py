"""A ReplicaActor of a compacted topic (cleanup.policy includes compact) refuses keyless records.

Proves, on real Ray with one replica leading:
- a batch whose records all have keys is appended, tombstones (null values) included;
- a batch with one record without a key gets INVALID_RECORD (87) with Kafka's message naming the
  partition, and nothing of it is appended; also when the batch is gzip- or lz4-compressed
  (the check decompresses it);
- records that do not decode (a compressed body that does not decompress) get CORRUPT_MESSAGE;
- reconfigure applies the policy in place: keyless records are accepted under delete and
  refused again under compact,delete.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from kafka.record.default_records import DefaultRecordBatch
from support.kafka_batches import kafka_batch

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.storage import batch as rb
from raylog.storage.errors import CorruptRecordError, InvalidRecordError

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 30.0
TOPIC = "compacted"
TS = 1_700_000_000_000


@pytest.fixture
def leader(ray_local: Path, tmp_path: Path) -> Iterator[Any]:
    replica = ReplicaActor.options(  # type: ignore[attr-defined]
        name=replica_actor_name(TOPIC, 0, 0), namespace=NAMESPACE
    ).remote(TOPIC, 0, 0, str(tmp_path / TOPIC), {"cleanup.policy": "compact"}, ReplicaConfig())
    try:
        ray.get(
            replica.become_leader.remote(BecomeLeader(1, 1, 1, (0,), (0,))),
            timeout=CALL_TIMEOUT_S,
        )
        yield replica
    finally:
        ray.kill(replica, no_restart=True)


def _batch(keys: list[bytes | None], codec: int = DefaultRecordBatch.CODEC_NONE) -> bytes:
    """One batch with these keys, values ``v<i>`` but a tombstone (null value) at 2."""
    recs = [
        {"key": key, "value": None if i == 2 else b"v%d" % i, "timestamp": TS + i, "headers": []}
        for i, key in enumerate(keys)
    ]
    return kafka_batch(recs, codec)


def _produce(replica: Any, batch: bytes) -> Any:
    return ray.get(replica.produce.remote(batch, -1, 10_000), timeout=CALL_TIMEOUT_S)


def _log_end_offset(replica: Any) -> int:
    return ray.get(replica.state.remote(), timeout=CALL_TIMEOUT_S).log_end_offset


def _reconfigure(replica: Any, policy: str) -> None:
    changed = replica.reconfigure.remote({"cleanup.policy": policy}, ReplicaConfig())
    assert ray.get(changed, timeout=CALL_TIMEOUT_S) is True


def test_keyed_records_are_appended_and_a_keyless_one_refuses_the_batch(leader: Any) -> None:
    assert _produce(leader, _batch([b"a", b"b", b"c"])).error_code == 0  # c is a tombstone
    assert _log_end_offset(leader) == 3
    for codec in (
        DefaultRecordBatch.CODEC_NONE,
        DefaultRecordBatch.CODEC_GZIP,
        DefaultRecordBatch.CODEC_LZ4,
    ):
        outcome = _produce(leader, _batch([b"a", None, b"c"], codec))
        assert outcome.error_code == InvalidRecordError.error_code, (codec, outcome)
        assert outcome.base_offset == -1
        assert outcome.message == (
            f"Compacted topic cannot accept message without key in topic partition {TOPIC}-0 "
            "(record 1 of the batch)."
        )
    assert _log_end_offset(leader) == 3  # nothing of the refused batches was appended
    assert (
        _produce(leader, _batch([b"d", b"e", b"f"], DefaultRecordBatch.CODEC_GZIP)).error_code == 0
    )
    assert _log_end_offset(leader) == 6


def test_records_that_do_not_decode_are_corrupt(leader: Any) -> None:
    # A valid batch frame and CRC around a body that claims gzip but is not.
    bad = bytearray(rb.build_batch([rb.Record(b"k", b"v", 1_700_000_000_000)]))
    bad[rb.ATTRIBUTES_POS + 1] |= DefaultRecordBatch.CODEC_GZIP  # attributes: int16, big-endian
    struct.pack_into(">I", bad, rb.CRC_POS, rb.compute_crc(bad, 0, len(bad)))
    outcome = _produce(leader, bytes(bad))
    assert outcome.error_code == CorruptRecordError.error_code, outcome
    assert _log_end_offset(leader) == 0


def test_reconfigure_applies_the_policy_in_place(leader: Any) -> None:
    keyless = _batch([None])
    assert _produce(leader, keyless).error_code == InvalidRecordError.error_code
    _reconfigure(leader, "delete")
    assert _produce(leader, keyless).error_code == 0
    _reconfigure(leader, "compact,delete")
    assert _produce(leader, keyless).error_code == InvalidRecordError.error_code
    assert _log_end_offset(leader) == 1
