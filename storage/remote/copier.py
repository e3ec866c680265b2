"""Copying closed local segments to the object store, and deleting remote segments.

One copy (:func:`copy_segment`), in this order, each step durable before the next:

  1. build the objects from the local files (:func:`format.build_segment`), under a new id
     (the ``log`` object is streamed from the local ``.log`` while it uploads, a chunk at a
     time: a copy's memory does not grow with segment.bytes);
  2. record the segment ``COPY_STARTED`` (compare-and-swap; fences an older leader, and turns
     any other started copy into an orphan: ``DELETE_STARTED``);
  3. upload the objects, the manifest last;
  4. record it ``COPY_FINISHED`` (compare-and-swap; fails if a newer leader wrote meanwhile).

A crash at any step leaves every offset readable: the local segment is deleted only once
step 4 is done and local retention passes it (:func:`metadata.local_segments_deletable`),
and readers use ``COPY_FINISHED`` segments only. What a crash leaves behind (a
``COPY_STARTED`` entry, objects under its id) is found by the next copier:
:func:`clean_up` deletes the objects of orphaned and ``DELETE_STARTED`` entries, then the
entries, and sweeps objects that no entry names (a fenced leader's uploads that went on
after a newer leader cleaned up). Deletion (:func:`delete_segments`, retention) has the same
shape: ``DELETE_STARTED`` first, then the objects, then the entry.

Synchronous functions over the :class:`~raylog.storage.objectstore.ObjectStore` interface, for
a replica to call from a thread; one copier per partition at a time (its leader's).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

import msgspec

from raylog.storage.errors import FencedLeaderEpochError
from raylog.storage.log.segment_list import ClosedSegment
from raylog.storage.objectstore import ObjectStore
from raylog.storage.remote import format as fmt
from raylog.storage.remote import metadata, metadata_store
from raylog.storage.remote.format import RemotePartition
from raylog.storage.remote.metadata import RemoteLogMetadata, RemoteSegment, SegmentState

logger = logging.getLogger(__name__)


def copy_segment(
    store: ObjectStore,
    partition: RemotePartition,
    files: ClosedSegment,
    *,
    from_offset: int,
    leader_epoch: int,
    index_interval_bytes: int = 4096,
    producer_snapshot: tuple[int, bytes] | None = None,
) -> RemoteSegment:
    """Copy the batches of ``files`` from the one holding ``from_offset`` (the next offset to
    copy, :func:`metadata.next_copy_offset`) as one remote segment; returns its finished
    entry. Raises FencedLeaderEpochError when a newer leader wrote the metadata, ValueError
    when the copy would not tile, KafkaStorageError / ObjectStoreError on I/O failures
    (the copy is then an orphan that :func:`clean_up` removes)."""
    built = fmt.build_segment(
        files,
        from_offset,
        uuid.uuid4().hex,
        index_interval_bytes=index_interval_bytes,
        producer_snapshot=producer_snapshot,
    )
    entry = built.entry
    metadata_store.update(store, partition, lambda m: metadata.start_copy(m, entry, leader_epoch))
    prefix = partition.segment_prefix(entry.base_offset, entry.segment_id)
    store.put_stream(prefix + fmt.LOG, fmt.read_span(built.log))
    for name, body in built.objects.items():
        store.put(prefix + name, body)
    store.put(prefix + fmt.MANIFEST, fmt.encode_manifest(built.manifest))
    try:
        metadata_store.update(
            store, partition, lambda m: metadata.finish_copy(m, entry.segment_id, leader_epoch)
        )
    except FencedLeaderEpochError:
        # The newer leader deletes this copy; deleting it here too keeps the store tidy
        # sooner (its sweep removes anything uploaded after its clean-up).
        _delete_objects(store, prefix)
        raise
    logger.info(
        "%s: copied offsets %d-%d as remote segment %s",
        partition.prefix,
        entry.base_offset,
        entry.end_offset,
        entry.segment_id,
    )
    return msgspec.structs.replace(
        entry, state=SegmentState.COPY_FINISHED, writer_epoch=leader_epoch
    )


def delete_segments(
    store: ObjectStore, partition: RemotePartition, segment_ids: Sequence[str], leader_epoch: int
) -> RemoteLogMetadata:
    """Delete remote segments (retention): mark them ``DELETE_STARTED``, delete their objects,
    drop their entries. Returns the metadata written last."""
    if not segment_ids:
        return metadata_store.read(store, partition)[0]
    meta = metadata_store.update(
        store, partition, lambda m: metadata.start_delete(m, segment_ids, leader_epoch)
    )
    return _finish_deletes(store, partition, meta, leader_epoch)


def move_log_start(
    store: ObjectStore, partition: RemotePartition, offset: int, leader_epoch: int
) -> RemoteLogMetadata:
    """DeleteRecords in the remote tier: record the partition's new log start (never lower),
    then delete the segments wholly below it. Returns the metadata written last."""
    meta = metadata_store.update(
        store, partition, lambda m: metadata.move_log_start(m, offset, leader_epoch)
    )
    return _finish_deletes(store, partition, meta, leader_epoch)


def clean_up(store: ObjectStore, partition: RemotePartition, leader_epoch: int) -> int:
    """Remove what crashed or fenced copies left: orphaned ``COPY_STARTED`` entries, pending
    deletes, objects no entry names, and incomplete uploads (a fenced leader's upload still
    going then fails, and its copy with it). Call it with no copy of this partition in flight
    here (the copier runs one at a time). Returns how many segment copies were removed."""
    meta, _ = metadata_store.read(store, partition)
    metadata.check_writer(meta, leader_epoch)
    aborted = store.abort_uploads(partition.segments_prefix)
    if aborted:
        logger.info("%s: %d incomplete uploads aborted", partition.prefix, aborted)
    orphaned = [s.segment_id for s in metadata.orphaned_copies(meta)]
    if orphaned:
        meta = metadata_store.update(
            store, partition, lambda m: metadata.start_delete(m, orphaned, leader_epoch)
        )
    removed = len(metadata.pending_deletes(meta))
    meta = _finish_deletes(store, partition, meta, leader_epoch)
    return removed + _sweep_unlisted(store, partition, leader_epoch)


def _finish_deletes(
    store: ObjectStore, partition: RemotePartition, meta: RemoteLogMetadata, leader_epoch: int
) -> RemoteLogMetadata:
    pending = metadata.pending_deletes(meta)
    for s in pending:
        _delete_objects(store, partition.segment_prefix(s.base_offset, s.segment_id))
    if not pending:
        return meta
    ids = [s.segment_id for s in pending]
    return metadata_store.update(store, partition, lambda m: metadata.forget(m, ids, leader_epoch))


def _sweep_unlisted(store: ObjectStore, partition: RemotePartition, leader_epoch: int) -> int:
    """Delete objects under the segments prefix that no entry names.

    Lists first, then reads the metadata: an object listed was uploaded after its entry was
    recorded, so an entry it belongs to is in the metadata read after the listing."""
    keys = store.list(partition.segments_prefix)
    meta, _ = metadata_store.read(store, partition)
    metadata.check_writer(meta, leader_epoch)
    listed = {partition.segment_prefix(s.base_offset, s.segment_id) for s in meta.segments}
    unlisted: dict[str, list[str]] = {}
    for key in keys:
        directory = key[: key.rfind("/") + 1]
        if directory not in listed:
            unlisted.setdefault(directory, []).append(key)
    for directory, members in unlisted.items():
        logger.info("%s: deleting unlisted remote objects %s", partition.prefix, directory)
        for key in members:
            store.delete(key)
    return len(unlisted)


def _delete_objects(store: ObjectStore, prefix: str) -> None:
    for key in store.list(prefix):
        store.delete(key)
