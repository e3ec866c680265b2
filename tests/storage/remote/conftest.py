"""Fixtures of the tiered-storage tests: ``tiered_log``, a real Log with closed segments of
batches in every codec, two leader epochs and an aborted transaction; ``partition``, where a
test's partition lives in the store; and ``copy_all``, which copies every closed segment
the way a leader does (plan, copy, repeat)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka.record import default_records as kdr
from support.kafka_batches import kafka_batch

from raylog.storage import Log, LogConfig
from raylog.storage.batch import Record, build_batch, end_txn_marker_record
from raylog.storage.log import AbortedTxn
from raylog.storage.objectstore import ObjectStore
from raylog.storage.remote import RemotePartition, RemoteSegment, copy_segment, metadata
from raylog.storage.remote.metadata_store import read

TIERED = LogConfig(segment_bytes=2048, index_interval_bytes=256)
CODECS = (
    kdr.DefaultRecordBatch.CODEC_NONE,
    kdr.DefaultRecordBatch.CODEC_GZIP,
    kdr.DefaultRecordBatch.CODEC_SNAPPY,
    kdr.DefaultRecordBatch.CODEC_LZ4,
    kdr.DefaultRecordBatch.CODEC_ZSTD,
)
PRODUCER_ID = 7


def _records(n: int, tag: int) -> list[dict[str, object]]:
    return [
        {
            "key": b"k%d" % i,
            "value": bytes([tag % 256]) * 60,
            "timestamp": 1_000 + tag,
            "headers": [],
        }
        for i in range(n)
    ]


def write_tiered_log(directory: Path) -> Log:
    """A log of 40 batches (every codec in turn) under epoch 1, an aborted transaction, then
    40 more under epoch 2; segments of 2 KiB, so most are closed."""
    log = Log.open(directory, TIERED)
    for i in range(40):
        log.append(kafka_batch(_records(3, i), CODECS[i % len(CODECS)]), 1)
    first = log.log_end_offset
    for seq in range(2):
        data = build_batch(
            [Record(None, b"txn", 1_100)],
            producer_id=PRODUCER_ID,
            producer_epoch=0,
            base_sequence=seq,
            transactional=True,
        )
        log.append(data, 1, validated=True)
    marker = build_batch(
        [end_txn_marker_record(False, 3, 1_200)],
        producer_id=PRODUCER_ID,
        producer_epoch=0,
        transactional=True,
        control=True,
    )
    info = log.append(marker, 1, validated=True)  # the replica writes markers
    log.append_aborted_txn(AbortedTxn(PRODUCER_ID, first, info.last_offset, info.last_offset + 1))
    for i in range(40, 80):
        log.append(kafka_batch(_records(2, i), CODECS[i % len(CODECS)]), 2)
    log.flush()
    return log


@pytest.fixture
def tiered_log(tmp_path: Path) -> Iterator[Log]:
    log = write_tiered_log(tmp_path / "topic-0")
    yield log
    log.close()


@pytest.fixture
def partition() -> RemotePartition:
    return RemotePartition("0f3c9c1e6a0b4c8e9d2f7a1b3c5d7e9f", 0)


CopyAll = Callable[..., list[RemoteSegment]]


def copy_all(
    store: ObjectStore, partition: RemotePartition, log: Log, leader_epoch: int = 2
) -> list[RemoteSegment]:
    """Copy every closed segment of ``log`` as its leader would; returns the copies made."""
    made = []
    closed = log.closed_segments()
    for _ in range(len(closed) + 1):  # bounded: each round copies one segment or stops
        meta, _ = read(store, partition)
        plan = metadata.plan_copy(
            meta,
            log.epoch_entries,
            log.log_end_offset,
            log.log_start_offset,
            closed,
            log.log_end_offset,
        )
        if plan is None:
            return made
        files = closed[plan.segment]
        made.append(
            copy_segment(
                store,
                partition,
                files,
                from_offset=plan.from_offset,
                leader_epoch=leader_epoch,
                index_interval_bytes=TIERED.index_interval_bytes,
                producer_snapshot=(files.next_offset, b"snapshot@%d" % files.next_offset),
            )
        )
    raise AssertionError("copy_all did not converge")
