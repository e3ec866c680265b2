"""A partition's remote log metadata in the object store: read it, change it by compare-and-swap.

The object (:attr:`RemotePartition.metadata_key`) is created with ``put_if_absent`` and replaced
only with ``put_if_match`` on the ETag read, so two writers never overwrite each other: the
loser re-reads and re-applies its change, which re-checks fencing and tiling
(:mod:`raylog.storage.remote.metadata`) against what the winner wrote. Bounded: at most
``CAS_ATTEMPTS_MAX`` rounds, then KafkaStorageError. Synchronous, for a replica's thread.
"""

from __future__ import annotations

from collections.abc import Callable

from raylog.storage.errors import KafkaStorageError, PreconditionFailedError
from raylog.storage.objectstore import UNCHANGED, ObjectStore
from raylog.storage.remote import metadata
from raylog.storage.remote.format import RemotePartition
from raylog.storage.remote.metadata import RemoteLogMetadata

CAS_ATTEMPTS_MAX = 16


def read(store: ObjectStore, partition: RemotePartition) -> tuple[RemoteLogMetadata, str | None]:
    """The partition's metadata and its ETag (the empty metadata and None when absent)."""
    key = partition.metadata_key
    found = store.get(key)
    if found is None:
        return metadata.EMPTY, None
    return metadata.decode(found.body, key), found.etag


def read_newer(
    store: ObjectStore, partition: RemotePartition, held: tuple[RemoteLogMetadata, str | None]
) -> tuple[RemoteLogMetadata, str | None]:
    """As :func:`read`, for a reader holding ``held`` (what :func:`read` or this returned):
    ``held`` itself while the object still has its ETag, which the store checks without
    sending the object again (a partition with months of segments has a large metadata
    object, and remote reads want it fresh every time)."""
    etag = held[1]
    if etag is None:
        return read(store, partition)
    key = partition.metadata_key
    found = store.get_unless(key, etag)
    if found is UNCHANGED:
        return held
    if found is None:
        return metadata.EMPTY, None
    return metadata.decode(found.body, key), found.etag


def update(
    store: ObjectStore,
    partition: RemotePartition,
    change: Callable[[RemoteLogMetadata], RemoteLogMetadata],
) -> RemoteLogMetadata:
    """Apply ``change`` to the current metadata and write the result by compare-and-swap,
    re-reading and re-applying on a lost race; returns what was written. Whatever ``change``
    raises (a fenced writer) propagates; nothing is written then."""
    key = partition.metadata_key
    for _ in range(CAS_ATTEMPTS_MAX):
        current, etag = read(store, partition)
        new = change(current)
        body = metadata.encode(new)
        try:
            if etag is None:
                store.put_if_absent(key, body)
            else:
                store.put_if_match(key, body, etag)
        except PreconditionFailedError:
            continue  # another writer won this round: re-read
        return new
    raise KafkaStorageError(f"{key}: lost {CAS_ATTEMPTS_MAX} compare-and-swap rounds in a row")
