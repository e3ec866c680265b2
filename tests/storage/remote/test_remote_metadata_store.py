"""The remote log metadata in the object store (storage/remote/metadata_store.py), on the local
store and moto's S3.

Proves: two writers racing on the metadata object never overwrite each other (the loser of the
compare-and-swap re-reads and re-applies its change, so both land); a writer fenced by the
winner's newer leader epoch writes nothing; the rounds are bounded; a corrupt object is
reported; a reader holding the metadata is sent it again only once its ETag changed.
"""

from __future__ import annotations

import msgspec
import pytest
from support.cut_store import CutStore

from raylog.storage.errors import (
    CorruptRemoteObjectError,
    FencedLeaderEpochError,
    KafkaStorageError,
)
from raylog.storage.objectstore import UNCHANGED, ObjectStore, StoredObject
from raylog.storage.remote import RemotePartition, RemoteSegment, SegmentState, metadata
from raylog.storage.remote import metadata_store as ms


def seg(sid: str, base: int, end: int) -> RemoteSegment:
    return RemoteSegment(
        segment_id=sid,
        base_offset=base,
        end_offset=end,
        max_timestamp_ms=0,
        size_bytes=10,
        leader_epochs=((0, base),),
        state=SegmentState.COPY_STARTED,
        writer_epoch=-1,
    )


def test_a_lost_race_is_reapplied(store: ObjectStore, partition: RemotePartition) -> None:
    ms.update(store, partition, lambda m: metadata.start_copy(m, seg("a", 0, 9), 1))
    applied = [0]

    def finish_a_while_b_starts(m: metadata.RemoteLogMetadata) -> metadata.RemoteLogMetadata:
        applied[0] += 1
        if applied[0] == 1:  # another writer of the same epoch wins this round
            ms.update(store, partition, lambda n: metadata.start_delete(n, ["a"], 1))
        return metadata.start_copy(m, seg("b", 0, 9), 1)

    written = ms.update(store, partition, finish_a_while_b_starts)
    assert applied[0] == 2
    assert ms.read(store, partition)[0] == written
    assert {s.segment_id: s.state for s in written.segments} == {
        "a": SegmentState.DELETE_STARTED,
        "b": SegmentState.COPY_STARTED,
    }


def test_a_writer_fenced_by_the_winner_writes_nothing(
    store: ObjectStore, partition: RemotePartition
) -> None:
    ms.update(store, partition, lambda m: metadata.start_copy(m, seg("a", 0, 9), 1))
    calls = [0]

    def old_leader_finishes(m: metadata.RemoteLogMetadata) -> metadata.RemoteLogMetadata:
        calls[0] += 1
        if calls[0] == 1:  # a newer leader takes over in between
            ms.update(store, partition, lambda n: metadata.start_copy(n, seg("b", 0, 9), 2))
        return metadata.finish_copy(m, "a", 1)

    with pytest.raises(FencedLeaderEpochError):
        ms.update(store, partition, old_leader_finishes)
    meta, before_etag = ms.read(store, partition)
    assert meta.leader_epoch == 2 and meta.finished() == []
    assert before_etag is not None


def test_the_rounds_are_bounded(
    store: ObjectStore, partition: RemotePartition, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ms, "CAS_ATTEMPTS_MAX", 3)
    ms.update(store, partition, lambda m: m)

    def always_loses(m: metadata.RemoteLogMetadata) -> metadata.RemoteLogMetadata:
        # Someone else writes each time (new content: S3's ETag is the content's MD5).
        bumped = msgspec.structs.replace(m, leader_epoch=m.leader_epoch + 1)
        store.put(partition.metadata_key, metadata.encode(bumped))
        return m

    with pytest.raises(KafkaStorageError, match="lost 3 compare-and-swap rounds"):
        ms.update(store, partition, always_loses)


def test_a_corrupt_metadata_object_is_reported(
    store: ObjectStore, partition: RemotePartition
) -> None:
    store.put(partition.metadata_key, b"\x00\x00\x00\x00{}")
    with pytest.raises(CorruptRemoteObjectError):
        ms.read(store, partition)


class _Counting(CutStore):
    """Counts the bodies the store sends back (a full GET; not an unchanged answer)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner, lambda: False)
        self.bodies = 0

    def get_unless(self, key: str, etag: str) -> StoredObject | None:
        found = self.inner.get_unless(key, etag)
        self.bodies += found is not None and found is not UNCHANGED
        return found


def test_a_reader_holding_the_metadata_gets_it_again_only_once_changed(
    store: ObjectStore, partition: RemotePartition
) -> None:
    counting = _Counting(store)
    assert ms.read_newer(counting, partition, (metadata.EMPTY, None)) == (metadata.EMPTY, None)
    ms.update(store, partition, lambda m: metadata.start_copy(m, seg("a", 0, 9), 1))
    held = ms.read_newer(counting, partition, (metadata.EMPTY, None))
    assert held == ms.read(store, partition) and held[1] is not None
    assert ms.read_newer(counting, partition, held) is held  # unchanged: nothing sent
    assert counting.bodies == 0
    written = ms.update(store, partition, lambda m: metadata.finish_copy(m, "a", 1))
    newer = ms.read_newer(counting, partition, held)
    assert newer[0] == written and newer[1] != held[1] and counting.bodies == 1
    store.delete(partition.metadata_key)
    assert ms.read_newer(counting, partition, newer) == (metadata.EMPTY, None)
