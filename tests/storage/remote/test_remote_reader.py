"""Reading remote segments (storage/remote/reader.py), on the local store and moto's S3.

Proves: a flipped byte in a remote batch, index or manifest is detected by its CRC-32C and
reported (CorruptRemoteObjectError, KAFKA_STORAGE_ERROR), never served, and not kept in the
cache (once the object is whole again it reads); so is a truncated log object; reads respect
max_bytes and max_offset as a local read does; a segment deleted under a read answers
OffsetOutOfRange; repeated reads come from the cache, whose bytes stay within its bound.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import copy_all
from support.cut_store import CutStore

from raylog.storage import Log
from raylog.storage.errors import CorruptRemoteObjectError, OffsetOutOfRangeError
from raylog.storage.objectstore import ObjectStore
from raylog.storage.remote import ByteLRU, RemotePartition, RemoteReader, RemoteSegment
from raylog.storage.remote import format as fmt
from raylog.storage.remote.metadata_store import read


def _copied(store: ObjectStore, partition: RemotePartition, log: Log) -> list[RemoteSegment]:
    copy_all(store, partition, log)
    return read(store, partition)[0].finished()


def _flip(store: ObjectStore, key: str, at: Callable[[int], int]) -> bytes:
    """Flip one bit of ``key`` at ``at(size)``; returns the original bytes."""
    original = store.get(key).body  # type: ignore[union-attr]
    data = bytearray(original)
    data[at(len(data))] ^= 0x04
    store.put(key, bytes(data))
    return original


@pytest.mark.parametrize(
    "name, at",
    [
        (fmt.LOG, lambda size: size - 5),  # inside the last batch's records
        (fmt.INDEX, lambda size: 1),
        (fmt.MANIFEST, lambda size: size // 2),
    ],
)
def test_a_corrupt_object_is_reported_never_served(
    store: ObjectStore,
    partition: RemotePartition,
    tiered_log: Log,
    name: str,
    at: Callable[[int], int],
) -> None:
    seg = _copied(store, partition, tiered_log)[0]
    reader = RemoteReader(store, ByteLRU())
    key = partition.object_key(seg, name)
    original = _flip(store, key, at)
    with pytest.raises(CorruptRemoteObjectError, match="CRC") as caught:
        reader.read(partition, seg, seg.base_offset, 1 << 20)
    assert caught.value.error_code == 56
    store.put(key, original)  # repaired: the corrupt bytes were not cached
    whole = b"".join(reader.read(partition, seg, seg.base_offset, 1 << 20))
    assert whole == tiered_log.read(seg.base_offset, len(whole))


def test_a_truncated_log_object_is_reported(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log
) -> None:
    seg = _copied(store, partition, tiered_log)[0]
    key = partition.object_key(seg, fmt.LOG)
    store.put(key, store.get(key).body[:-10])  # type: ignore[union-attr]
    with pytest.raises(CorruptRemoteObjectError):
        RemoteReader(store, ByteLRU()).read(partition, seg, seg.base_offset, 1 << 20)


def test_reads_respect_max_bytes_and_max_offset(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log
) -> None:
    seg = _copied(store, partition, tiered_log)[1]
    reader = RemoteReader(store, ByteLRU())
    one = reader.read(partition, seg, seg.base_offset + 1, 0)
    assert len(one) == 1  # at least one batch, whatever max_bytes
    assert b"".join(one) == tiered_log.read(seg.base_offset + 1, 0)
    some = reader.read(partition, seg, seg.base_offset, 500)
    assert sum(map(len, some)) <= 500 and len(some) >= 1
    assert reader.read(partition, seg, seg.base_offset, 1 << 20, max_offset=seg.base_offset) == []
    with pytest.raises(OffsetOutOfRangeError):
        reader.read(partition, seg, seg.end_offset + 1, 100)


def test_a_deleted_segment_reads_as_out_of_range(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log
) -> None:
    seg = _copied(store, partition, tiered_log)[0]
    for key in store.list(partition.segment_prefix(seg.base_offset, seg.segment_id)):
        store.delete(key)
    with pytest.raises(OffsetOutOfRangeError, match="gone"):
        RemoteReader(store, ByteLRU()).read(partition, seg, seg.base_offset, 100)


def test_repeated_reads_come_from_the_bounded_cache(
    store: ObjectStore, partition: RemotePartition, tiered_log: Log
) -> None:
    segments = _copied(store, partition, tiered_log)
    calls = [0]

    def count() -> bool:
        calls[0] += 1
        return False

    cache = ByteLRU(max_bytes=8 << 10)  # smaller than the segments together
    reader = RemoteReader(CutStore(store, count), cache)
    for seg in segments:
        reader.read(partition, seg, seg.base_offset, 1 << 20)
        assert cache.size_bytes <= cache.max_bytes
    last = segments[-1]
    before = calls[0]
    again = reader.read(partition, last, last.base_offset, 1 << 20)
    assert calls[0] == before  # the most recent segment is still cached whole
    assert b"".join(again) == tiered_log.read(last.base_offset, 1 << 20)[: len(b"".join(again))]
    reader.read(partition, segments[0], segments[0].base_offset, 1 << 20)
    assert calls[0] > before  # the oldest was evicted
