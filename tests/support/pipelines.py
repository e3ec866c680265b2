"""Helpers for the pipelines tests: producer-built batches and a topic on real replica actors.

- ``kafka_codecs()``: lets kafka-python's builder compress with every codec. kafka-python
  compresses through optional packages (python-snappy, lz4, zstandard) raylog does not depend
  on; where one is missing, its compressor is backed by pyarrow's bundled library for the
  same format (raw snappy block, LZ4 frame, zstd frame). kafka-python's own framing (xerial
  for snappy) and batch layout stay the producer's.
- ``kafka_batch()`` (from tests/support/kafka_batches.py): one batch as kafka-python's producer
  builds it.
- ``start_topic()``: three ReplicaActors per partition, a leader and two followers, as
  tests/actors/test_replica_ray.py sets them up (the test stands in for the controller);
  ``produce()`` sends batches with acks=all and returns the records with their offsets.
- ``start_trimmed_partition()``: a one-replica partition whose log start offset is above 0.
  ReplicaActor does not run retention itself yet, so the test applies it to the log on disk
  (``Log.enforce_retention``) before the actor opens that log.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import ray
from kafka import codec as kcodec
from kafka.record import default_records as kdr

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.storage.log import Log, LogConfig
from support.kafka_batches import kafka_batch

BASE_TS = 1_700_000_000_000

EVENTS = "events"
EVENTS_PARTITIONS = 2


@dataclass(frozen=True)
class ProducedTopic:
    topic: str
    partitions: int
    rows: list[dict[str, Any]]  # what readers must return, sorted by (partition, offset)
    catalog: dict[str, Any]  # where the partitions live, as StaticCatalog.from_json takes it


RF = 3
CALL_TIMEOUT_S = 30.0

CODECS = {
    "none": kdr.DefaultRecordBatch.CODEC_NONE,
    "gzip": kdr.DefaultRecordBatch.CODEC_GZIP,
    "snappy": kdr.DefaultRecordBatch.CODEC_SNAPPY,
    "lz4": kdr.DefaultRecordBatch.CODEC_LZ4,
    "zstd": kdr.DefaultRecordBatch.CODEC_ZSTD,
}


class _ArrowSnappy:
    """The one call kafka.codec makes of python-snappy, on pyarrow's snappy."""

    @staticmethod
    def compress(data: bytes) -> bytes:
        return pa.compress(data, codec="snappy", asbytes=True)


@contextlib.contextmanager
def kafka_codecs() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        if not kcodec.has_snappy():
            mp.setattr(kcodec, "snappy", _ArrowSnappy)
        if not kcodec.has_lz4():
            mp.setattr(kcodec, "has_lz4", lambda: True)
            mp.setattr(kdr, "lz4_encode", lambda d: pa.compress(d, codec="lz4", asbytes=True))
        if not kcodec.has_zstd():
            mp.setattr(kcodec, "has_zstd", lambda: True)
            mp.setattr(kdr, "zstd_encode", lambda d: pa.compress(d, codec="zstd", asbytes=True))
        yield mp


def make_records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Records with null keys and values, empty and repeated headers, out-of-order timestamps."""
    out = []
    for i in range(n):
        out.append(
            {
                "key": None if i % 7 == 3 else f"key-{seed}-{i}".encode(),
                "value": None if i % 11 == 5 else bytes([i % 256]) * (i % 300) + b"v",
                "timestamp": BASE_TS + 17 * i + 1000 * seed - (5 if i % 3 == 0 else 0),
                "headers": [("h", b"x" * (i % 4)), ("null", None)] if i % 2 else [],
            }
        )
    return out


def expected_rows(recs: list[dict[str, Any]], topic: str, partition: int, base: int) -> list[dict]:
    """Rows as the readers return them (timestamps as epoch ms, headers as dicts)."""
    return [
        {
            "key": r["key"],
            "value": r["value"],
            "topic": topic,
            "partition": partition,
            "offset": base + i,
            "timestamp": r["timestamp"],
            "timestampType": 0,
            "headers": [{"key": k, "value": v} for k, v in r["headers"]],
        }
        for i, r in enumerate(recs)
    ]


def catalog_json(topic: str, partitions: int, rf: int = RF) -> dict[str, Any]:
    """A StaticCatalog JSON: partition p is led by replica p % rf, all replicas in sync."""
    return {
        topic: [
            {"partition": p, "leader": p % rf, "isr": list(range(rf)), "replicas": list(range(rf))}
            for p in range(partitions)
        ]
    }


def _lead(replicas: dict[int, Any], leader: int, rf: int) -> None:
    everyone = tuple(range(rf))
    calls = [
        replicas[leader].become_leader.remote(
            BecomeLeader(
                controller_epoch=1,
                leader_epoch=1,
                partition_epoch=1,
                isr=everyone,
                replicas=everyone,
            )
        )
    ]
    for f in everyone:
        if f != leader:
            calls.append(
                replicas[f].become_follower.remote(
                    BecomeFollower(
                        controller_epoch=1, leader_id=leader, leader_epoch=1, partition_epoch=1
                    )
                )
            )
    ray.get(calls, timeout=CALL_TIMEOUT_S)


def start_topic(log_root: Path, topic: str, partitions: int) -> dict[int, dict[int, Any]]:
    """``{partition: {replica_id: handle}}``; partition p led by replica p % RF."""
    config = ReplicaConfig(min_insync_replicas=2, fetch_max_wait_ms=200)
    out: dict[int, dict[int, Any]] = {}
    for p in range(partitions):
        out[p] = {
            rid: ReplicaActor.options(  # type: ignore[attr-defined]
                name=replica_actor_name(topic, p, rid), namespace=NAMESPACE
            ).remote(
                topic,
                p,
                rid,
                str(log_root / f"{topic}-{p}-{rid}"),
                {"min.insync.replicas": "2"},
                config,
            )
            for rid in range(RF)
        }
    for p in range(partitions):
        _lead(out[p], p % RF, RF)
    return out


def produce(leader: Any, batches: list[bytes]) -> list[int]:
    """Produce with acks=all, all calls in flight; returns each batch's base offset."""
    refs = [leader.produce.remote(b, -1, 10_000) for b in batches]
    outcomes = ray.get(refs, timeout=CALL_TIMEOUT_S)
    for o in outcomes:
        assert o.error_code == 0, o
    return [o.base_offset for o in outcomes]


def start_trimmed_partition(log_dir: Path, topic: str, batches: list[bytes]) -> tuple[Any, int]:
    """A one-replica partition holding ``batches``, its first segments deleted by retention.

    Returns ``(leader handle, log start offset)``.
    """

    def trim(log: Log) -> None:
        log.enforce_retention(int(time.time() * 1000), log.high_watermark)
        assert log.log_start_offset > 0, "retention deleted nothing: bigger batches or segments"

    actor, log = start_partition_from_log(
        log_dir, topic, batches, LogConfig(segment_bytes=2048, retention_bytes=1), trim
    )
    return actor, log.log_start_offset


def start_partition_from_log(
    log_dir: Path,
    topic: str,
    batches: list[bytes],
    config: LogConfig,
    prepare: Callable[[Log], None],
    topic_config: dict[str, str] | None = None,
) -> tuple[Any, Log]:
    """A one-replica partition whose log holds ``batches``, all committed, then ``prepare``d
    (retention, compaction) before its replica actor starts; returns the leader handle and the
    (closed) log as ``prepare`` left it."""
    log = Log.open(log_dir, config)
    try:
        for b in batches:
            log.append(b, 0)  # epoch 0: the actor then leads in epoch 1
        log.checkpoint_high_watermark(log.log_end_offset)
        prepare(log)
    finally:
        log.close()
    actor = ReplicaActor.options(  # type: ignore[attr-defined]
        name=replica_actor_name(topic, 0, 0), namespace=NAMESPACE
    ).remote(
        topic,
        0,
        0,
        str(log_dir),
        {"min.insync.replicas": "1", **(topic_config or {})},
        ReplicaConfig(),
    )
    ray.get(
        actor.become_leader.remote(
            BecomeLeader(
                controller_epoch=1, leader_epoch=1, partition_epoch=1, isr=(0,), replicas=(0,)
            )
        ),
        timeout=CALL_TIMEOUT_S,
    )
    return actor, log


def produce_topic(
    replicas: dict[int, dict[int, Any]], topic: str, records_per_batch: int = 40
) -> list[dict[str, Any]]:
    """Produce one batch per codec to every partition (through its leader, acks=all).

    Returns the rows the readers must return, sorted by (partition, offset).
    """
    rows: list[dict[str, Any]] = []
    with kafka_codecs():
        for p, by_id in replicas.items():
            recs = [make_records(records_per_batch, seed=10 * p + i) for i in range(len(CODECS))]
            batches = [kafka_batch(r, c) for r, c in zip(recs, CODECS.values(), strict=True)]
            for r, base in zip(recs, produce(by_id[p % RF], batches), strict=True):
                rows += expected_rows(r, topic, p, base)
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows of a reader's Arrow table, timestamps as epoch ms, sorted by (partition, offset)."""
    column = table.column("timestamp")
    per_ms = {"s": 1, "ms": 1, "us": 1_000, "ns": 1_000_000}[column.type.unit]
    ts = [None if t is None else t // per_ms for t in column.cast(pa.int64()).to_pylist()]
    rows = table.drop_columns(["timestamp"]).to_pylist()
    for row, t in zip(rows, ts, strict=True):
        row["timestamp"] = t
    return sorted(rows, key=lambda r: (r["topic"], r["partition"], r["offset"]))


def stream_to_parquet(
    spark: Any,
    up: Any,
    topic: str,
    out: Path,
    checkpoint: Path,
    max_per_trigger: int,
    columns: tuple[str, ...] = ("partition", "offset", "key", "value"),
    **trigger: Any,
) -> Any:
    """Start ``spark.readStream.format("raylog")`` of ``topic`` on ``up`` from earliest, at most
    ``max_per_trigger`` records a micro-batch, writing ``columns`` (SQL expressions) to a
    parquet sink at ``out``; ``trigger`` as ``DataStreamWriter.trigger`` takes it."""
    df = (
        spark.readStream.format("raylog")
        .option("cluster", str(up.data_dir))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_per_trigger))
        .load()
    )
    return (
        df.selectExpr(*columns)
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )
