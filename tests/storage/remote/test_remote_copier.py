"""Copying real closed segments to the object store and reading them back (storage/remote/
copier.py), on the local store and on moto's S3.

Proves: every closed segment of a real Log (batches of every codec, two leader epochs, an
aborted transaction) is copied so that every offset reads back byte for byte as the local
log serves it, with the aborted transactions and the producer snapshot; copies tile; a crash
at every step of a copy leaves every offset readable and a later copier removes what it left
and copies again; a fenced old leader cannot finish its copy and a newer leader's clean-up
removes its objects, as it aborts an S3 multipart upload a crashed copy left incomplete;
retention deletes remote segments whole; a copy reads the local log a
chunk at a time (the same objects however it is cut, memory bounded by a few chunks on a
large segment) and never uploads bytes that changed after it scanned them.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest
from conftest import copy_all
from support.cut_store import CutStore
from support.kafka_batches import kafka_batch

from raylog.storage import Log, LogConfig
from raylog.storage.errors import FencedLeaderEpochError, KafkaStorageError, ObjectStoreError
from raylog.storage.objectstore import ObjectStore
from raylog.storage.remote import (
    ByteLRU,
    RemotePartition,
    RemoteReader,
    clean_up,
    copy_segment,
    delete_segments,
    metadata,
)
from raylog.storage.remote import format as fmt
from raylog.storage.remote.metadata_store import read
from raylog.storage.s3store import S3ObjectStore


def assert_reads_back(store: ObjectStore, partition: RemotePartition, log: Log) -> None:
    """Every offset of every finished remote segment reads as the local log serves it."""
    reader = RemoteReader(store, ByteLRU())
    meta, _ = read(store, partition)
    finished = meta.finished()
    assert finished, "nothing was copied"
    for seg in finished:
        for offset in range(seg.base_offset, seg.end_offset + 1):
            assert b"".join(reader.read(partition, seg, offset, 1)) == log.read(offset, 1)
        whole = b"".join(reader.read(partition, seg, seg.base_offset, 1 << 20))
        assert whole == log.read(seg.base_offset, len(whole))
        assert whole[-1:] and seg.size_bytes == len(whole)


def segment_dirs(store: ObjectStore, partition: RemotePartition) -> set[str]:
    return {k[: k.rfind("/") + 1] for k in store.list(partition.segments_prefix)}


def finished_dirs(store: ObjectStore, partition: RemotePartition) -> set[str]:
    meta, _ = read(store, partition)
    return {partition.segment_prefix(s.base_offset, s.segment_id) for s in meta.segments}


def test_closed_segments_round_trip(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log
) -> None:
    made = copy_all(store, partition, tiered_log)
    closed = tiered_log.closed_segments()
    assert len(made) == len(closed) >= 5
    meta, _ = read(store, partition)
    metadata.check_tiling(meta)
    assert meta.finished()[0].base_offset == 0
    assert meta.finished()[-1].next_offset == closed[-1].next_offset
    assert {e for s in meta.finished() for e, _ in s.leader_epochs} == {1, 2}
    assert_reads_back(store, partition, tiered_log)
    reader = RemoteReader(store, ByteLRU())
    aborted = [
        txn
        for s in meta.finished()
        for txn in reader.aborted_txns(partition, s, s.base_offset, s.next_offset)
    ]
    assert aborted == tiered_log.aborted_txns(0, tiered_log.log_end_offset)
    assert len(aborted) == 1
    first = meta.finished()[0]
    assert reader.producer_snapshot(partition, first) == (
        first.next_offset,
        b"snapshot@%d" % first.next_offset,
    )
    assert segment_dirs(store, partition) == finished_dirs(store, partition)
    # Every closed segment is copied: all may go locally once past local retention.
    infos = tiered_log.closed_segments()
    assert metadata.local_segments_deletable(infos, 0, meta.finished()[-1].end_offset, 0, -1, 0)
    assert len(made) == metadata.local_segments_deletable(
        infos, 0, meta.finished()[-1].end_offset, 10**12, 0, -1
    )


def test_a_copy_refuses_to_leave_a_gap(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log
) -> None:
    closed = tiered_log.closed_segments()
    copy_segment(store, partition, closed[0], from_offset=0, leader_epoch=2)
    with pytest.raises(ValueError, match="gap"):
        copy_segment(store, partition, closed[2], from_offset=closed[2].base_offset, leader_epoch=2)


def _crash_after(calls: int) -> Callable[[], bool]:
    count = [0]

    def is_cut() -> bool:
        count[0] += 1
        return count[0] > calls

    return is_cut


def test_a_crash_at_every_step_loses_nothing_and_is_cleaned_up(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log
) -> None:
    closed = tiered_log.closed_segments()
    copy_segment(store, partition, closed[0], from_offset=0, leader_epoch=2)
    # A copy makes: read + CAS (start), one put per object, manifest, read + CAS (finish).
    steps = 0
    while True:  # bounded: a copy is a handful of calls
        cut = CutStore(store, _crash_after(steps))
        try:
            copy_segment(
                cut, partition, closed[1], from_offset=closed[1].base_offset, leader_epoch=2
            )
        except ObjectStoreError:
            meta, _ = read(store, partition)
            # The crashed copy is not served; the local segment is not deletable.
            assert [s.segment_id for s in meta.finished()] == [meta.finished()[0].segment_id]
            assert (
                metadata.local_segments_deletable(
                    closed, 0, meta.finished()[-1].end_offset, 10**12, 0, -1
                )
                == 1
            )
            clean_up(store, partition, leader_epoch=2)
            assert segment_dirs(store, partition) == finished_dirs(store, partition)
            assert len(read(store, partition)[0].segments) == 1
            steps += 1
            assert steps < 20
            continue
        break
    assert steps >= 6  # start, 4+ objects, manifest, finish were each a crash point
    assert len(read(store, partition)[0].finished()) == 2
    copy_all(store, partition, tiered_log)
    assert_reads_back(store, partition, tiered_log)


class _RacingStore(CutStore):
    """Runs ``race`` once, right after the first manifest is uploaded."""

    def __init__(self, inner: ObjectStore, race: Callable[[], None]) -> None:
        super().__init__(inner, lambda: False)
        self.race: Callable[[], None] | None = race

    def put(self, key: str, body: bytes) -> str:
        etag = super().put(key, body)
        if key.endswith("/manifest") and self.race is not None:
            race, self.race = self.race, None
            race()
        return etag


def test_a_fenced_leader_cannot_finish_and_its_objects_are_cleaned(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log
) -> None:
    closed = tiered_log.closed_segments()

    def newer_leader_copies() -> None:
        copy_segment(store, partition, closed[0], from_offset=0, leader_epoch=3)

    racing = _RacingStore(store, newer_leader_copies)
    with pytest.raises(FencedLeaderEpochError, match="epoch 2 is fenced"):
        copy_segment(racing, partition, closed[0], from_offset=0, leader_epoch=2)
    meta, _ = read(store, partition)
    assert meta.leader_epoch == 3 and [s.writer_epoch for s in meta.finished()] == [3]
    with pytest.raises(FencedLeaderEpochError):
        clean_up(store, partition, leader_epoch=2)
    clean_up(store, partition, leader_epoch=3)
    assert segment_dirs(store, partition) == finished_dirs(store, partition)
    assert len(segment_dirs(store, partition)) == 1


def test_objects_no_entry_names_are_swept(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log
) -> None:
    copy_all(store, partition, tiered_log)
    stray = partition.segment_prefix(0, "f" * 32) + "log"  # a fenced leader's late upload
    store.put(stray, b"late")
    assert clean_up(store, partition, leader_epoch=2) == 1
    assert store.get(stray) is None
    assert_reads_back(store, partition, tiered_log)


def test_retention_deletes_remote_segments_whole(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log
) -> None:
    copy_all(store, partition, tiered_log)
    meta, _ = read(store, partition)
    total = sum(s.size_bytes for s in meta.finished())
    limit = total - meta.finished()[0].size_bytes  # the oldest one is one too many
    gone = metadata.remote_segments_past_retention(meta, 0, -1, limit, 0)
    assert len(gone) == 1
    meta = delete_segments(store, partition, [s.segment_id for s in gone], leader_epoch=2)
    assert metadata.log_start_offset(meta) == gone[0].next_offset
    assert segment_dirs(store, partition) == finished_dirs(store, partition)
    assert_reads_back(store, partition, tiered_log)


@pytest.mark.parametrize("chunk_bytes", [64, 700, 1 << 20])  # under a batch, a few, all
def test_a_copy_scans_the_log_a_chunk_at_a_time(tiered_log: Log, chunk_bytes: int) -> None:
    """However the ``.log`` is cut into reads, a copy builds the same objects, and the log
    object streams the file's bytes from the first batch copied."""
    files = tiered_log.closed_segments()[1]
    middle = files.base_offset + 4  # inside the segment: the copy starts at its batch
    whole = fmt.build_segment(files, middle, "a" * 32, index_interval_bytes=256)
    built = fmt.build_segment(
        files, middle, "a" * 32, index_interval_bytes=256, chunk_bytes=chunk_bytes
    )
    assert built == whole
    data = b"".join(fmt.read_span(built.log, chunk_bytes))
    assert data == files.log_path.read_bytes()[built.log.start :]
    assert built.entry.base_offset <= middle < built.entry.next_offset
    assert data == tiered_log.read(built.entry.base_offset, len(data))


def test_a_log_that_changes_while_it_uploads_is_not_copied(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log
) -> None:
    files = tiered_log.closed_segments()[0]
    built = fmt.build_segment(files, 0, "b" * 32)
    with open(files.log_path, "r+b") as f:  # one byte of a record flipped after the scan
        f.seek(built.log.size - 3)
        byte = f.read(1)
        f.seek(built.log.size - 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(KafkaStorageError, match="changed while it was copied"):
        store.put_stream("seg/log", fmt.read_span(built.log, 100))
    assert store.get("seg/log") is None
    with pytest.raises(KafkaStorageError, match="CRC"):  # a new scan finds the damage
        copy_segment(store, partition, files, from_offset=0, leader_epoch=2)


def test_an_upload_a_crashed_copy_left_incomplete_is_aborted(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log, request: pytest.FixtureRequest
) -> None:
    copy_all(store, partition, tiered_log)
    if not isinstance(store, S3ObjectStore):  # no such state: a dead writer's temp file goes
        assert clean_up(store, partition, leader_epoch=2) == 0
        return
    client = boto3.client("s3", **request.getfixturevalue("s3_client_kwargs"))
    key = "cluster-1/" + partition.segment_prefix(0, "e" * 32) + "log"  # the store's prefix
    client.create_multipart_upload(Bucket=store.bucket, Key=key)  # then the copier died
    clean_up(store, partition, leader_epoch=2)  # the next leader's first round
    assert client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []
    assert_reads_back(store, partition, tiered_log)


def test_a_copy_holds_a_few_chunks_of_a_large_segment(
    tmp_path: Path, store: ObjectStore, partition: RemotePartition
) -> None:
    """A 48 MiB segment of 1 MiB batches is copied with at most a few 8 MiB chunks in
    memory (Python's allocations, traced), and reads back."""
    log = Log.open(tmp_path / "big-0", LogConfig(segment_bytes=48 << 20, max_message_bytes=2 << 20))
    try:
        for i in range(60):
            value = bytes([i]) * (1000 << 10)
            log.append(
                kafka_batch([{"key": None, "value": value, "timestamp": i, "headers": []}], 0), 1
            )
        files = log.closed_segments()[0]
        size = files.log_path.stat().st_size
        assert size > 40 << 20
        tracemalloc.start()
        try:
            copy_segment(store, partition, files, from_offset=0, leader_epoch=1)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 * fmt.CHUNK_BYTES < size, f"peak {peak >> 20} MiB copying {size >> 20}"
        [copied] = read(store, partition)[0].finished()
        key = partition.object_key(copied, fmt.LOG)
        assert store.get_range(key, size - 100, 100) == files.log_path.read_bytes()[-100:]
    finally:
        log.close()
