"""A log's producer-state snapshot files (Kafka's ``<offset>.snapshot``), bytes opaque here.

A replica writes the state of its idempotent producers and transactions at its log end now
and then (``raylog.actors.replication.producer_snapshot`` owns the bytes), so that a restart
reads only the batch headers after the newest one. This module owns the files:

- named by the offset the state was taken at, 20 digits: ``00000000000000001234.snapshot``;
  written whole and atomically (temp file, fsync, rename, fsync of the directory);
- a truncation at ``offset`` deletes those above it (the state at ``offset`` holds only
  batches below it, which stay); a full truncation deletes all;
- those below the log start offset are deleted when it moves (their tail is gone), and those
  above the log end when recovery cut the tail;
- at most ``keep`` are kept, the newest (Kafka keeps the last few as well);
- one larger than ``MAX_SNAPSHOT_BYTES`` is not read (the reader falls back to an older one).

Every function raises OSError; the Log wraps it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from raylog.storage.log.segment import fsync_directory, segment_name, write_file_atomically

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_KEPT_DEFAULT = 3
# A snapshot holds a few dozen bytes per producer and per aborted transaction.
MAX_SNAPSHOT_BYTES = 256 << 20

_SNAPSHOT_FILE = re.compile(r"^(\d{20})\.snapshot$")


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / (segment_name(offset) + SNAPSHOT_SUFFIX)


def list_offsets(directory: Path) -> list[int]:
    """The offsets of the snapshots in ``directory``, oldest first."""
    offsets = []
    for entry in os.listdir(directory):
        m = _SNAPSHOT_FILE.match(entry)
        if m:
            offsets.append(int(m.group(1)))
    return sorted(offsets)


def write(directory: Path, offset: int, data: bytes, keep: int) -> None:
    """Store the snapshot at ``offset`` (replacing one there), then delete all but the
    ``keep`` newest."""
    write_file_atomically(snapshot_path(directory, offset), data)
    offsets = list_offsets(directory)
    for old in offsets[: max(0, len(offsets) - keep)]:
        snapshot_path(directory, old).unlink(missing_ok=True)
    fsync_directory(directory)


def read(directory: Path, offset: int) -> bytes | None:
    """The bytes of the snapshot at ``offset``; None when it is missing or too large."""
    path = snapshot_path(directory, offset)
    try:
        if path.stat().st_size > MAX_SNAPSHOT_BYTES:
            return None
        return path.read_bytes()
    except FileNotFoundError:
        return None


def delete_outside(directory: Path, start_offset: int, end_offset: int | None) -> int:
    """Delete the snapshots below ``start_offset`` or above ``end_offset`` (None: no upper
    bound); returns how many."""
    gone = [
        o
        for o in list_offsets(directory)
        if o < start_offset or (end_offset is not None and o > end_offset)
    ]
    for offset in gone:
        snapshot_path(directory, offset).unlink(missing_ok=True)
    if gone:
        fsync_directory(directory)
    return len(gone)


def delete(directory: Path, offset: int) -> None:
    """Delete the snapshot at ``offset`` (one that does not load)."""
    snapshot_path(directory, offset).unlink(missing_ok=True)
    fsync_directory(directory)
