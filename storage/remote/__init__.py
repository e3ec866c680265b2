"""Tiered storage (KIP-405): closed segments copied to the object store and read back from it.

Modules, one concern each:

- ``format.py``: the objects one closed local segment becomes, their keys and the manifest;
- ``metadata.py``: PURE rules of a partition's remote log metadata (states, fencing, tiling,
  orphans, the next offset to copy, retention over both tiers, which local segments may go);
- ``metadata_store.py``: that metadata in the object store, changed by compare-and-swap;
- ``copier.py``: copying one closed segment, deleting remote segments, cleaning up orphans;
- ``reader.py``: reading batches (and aborted transactions, the producer snapshot) of a
  remote segment by byte range, CRC-checked;
- ``cache.py``: the byte-bounded LRU cache of remote bytes the readers of a process share.

Everything here is synchronous and does its I/O through the
:class:`~raylog.storage.objectstore.ObjectStore` interface, so a replica calls it from a thread.
"""

from raylog.storage.remote.cache import ByteLRU, process_cache
from raylog.storage.remote.copier import (
    clean_up,
    copy_segment,
    delete_segments,
    move_log_start,
)
from raylog.storage.remote.format import Manifest, RemotePartition
from raylog.storage.remote.metadata import (
    CopyPlan,
    RemoteLogMetadata,
    RemoteSegment,
    SegmentState,
)
from raylog.storage.remote.reader import RemoteReader

__all__ = [
    "ByteLRU",
    "CopyPlan",
    "Manifest",
    "RemoteLogMetadata",
    "RemotePartition",
    "RemoteReader",
    "RemoteSegment",
    "SegmentState",
    "clean_up",
    "copy_segment",
    "delete_segments",
    "move_log_start",
    "process_cache",
]
