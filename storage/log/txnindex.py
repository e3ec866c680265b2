"""The aborted-transaction index of a segment (``.txnindex``, Kafka's TransactionIndex).

One entry per aborted transaction whose ABORT marker lies in the segment, in marker order,
34 bytes big-endian, Kafka's layout (AbortedTxn):

| field              | type  | meaning                                                      |
|--------------------|-------|--------------------------------------------------------------|
| version            | int16 | 0                                                            |
| producer_id        | int64 |                                                              |
| first_offset       | int64 | the transaction's first offset (maybe in an earlier segment) |
| last_offset        | int64 | the ABORT marker's offset                                    |
| last_stable_offset | int64 | the LSO when the marker was written: the first offset of the |
|                    |       | oldest other transaction open then, else last_offset + 1     |

The file is created with its first entry (a segment without one has none, as in Kafka) and
appended to as markers are written; it is fsync'd when its segment rolls. What is on disk is
checked when read (:func:`read_entries`): a torn tail (a partial entry) is ignored, and an
entry out of its segment's offsets or out of order makes the file bad (the whole file is
ignored: the replica rebuilds it from the log when it starts, see :meth:`Log.restore_aborted_txns`).

A read_committed fetch collects the aborted transactions overlapping what it returns
(:func:`collect`, Kafka's collectAbortedTxns): the segments' entries from the segment holding
the fetch offset on, until an entry's last_stable_offset reaches the upper bound: no
transaction begun below the bound can end after that marker.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from raylog.storage.log.segment import (
    TXNINDEX_SUFFIX,
    Segment,
    fsync_directory,
    pread_exact,
    pwrite_all,
    write_file_atomically,
)
from raylog.storage.log.segment_list import SegmentList

logger = logging.getLogger(__name__)

TXNINDEX_VERSION = 0
ENTRY = struct.Struct(">hqqqq")
ENTRY_BYTES = ENTRY.size  # 34
# A segment's index is read whole: at most this many entries (34 MiB) are believed.
MAX_ENTRIES = 1 << 20


class AbortedTxn(NamedTuple):
    """An aborted transaction's span, as a ``.txnindex`` entry holds it."""

    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int  # see the module docstring


def encode(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(ENTRY.pack(TXNINDEX_VERSION, *entry) for entry in entries)


def read_entries(path: Path, base_offset: int) -> list[AbortedTxn] | None:
    """The entries of the index at ``path`` of the segment at ``base_offset``, as stored; []
    when the file is missing; None when it is bad (see the module docstring). A partial entry
    at the end (a torn write) is ignored."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        size = os.fstat(fd).st_size
        whole = size - size % ENTRY_BYTES
        if whole > MAX_ENTRIES * ENTRY_BYTES:
            return None
        data = pread_exact(fd, whole, 0)
    finally:
        os.close(fd)
    entries: list[AbortedTxn] = []
    for version, *fields in ENTRY.iter_unpack(data):
        entry = AbortedTxn(*fields)
        if (
            version != TXNINDEX_VERSION
            or entry.producer_id < 0
            or entry.last_offset < base_offset
            or not 0 <= entry.first_offset <= entry.last_offset
            or entry.last_stable_offset < 0
            or (entries and entry.last_offset <= entries[-1].last_offset)
        ):
            return None
        entries.append(entry)
    return entries


def segment_entries(seg: Segment) -> list[AbortedTxn]:
    """The entries of ``seg``'s index for batches it holds (entries at or past its end, left
    by a cut tail, do not count; a bad file counts as empty, with a warning), and the count
    noted in ``seg.txn_entries``."""
    entries = read_entries(seg.txnindex_path, seg.base_offset)
    if entries is None:
        logger.warning("ignoring bad aborted-transaction index %s", seg.txnindex_path)
        entries = []
    entries = [e for e in entries if e.last_offset < seg.next_offset]
    seg.txn_entries = len(entries)
    return entries


def append_entry(path: Path, entry: AbortedTxn, at_entry: int) -> None:
    """Write ``entry`` as entry number ``at_entry`` (the count of valid entries: a torn tail
    is overwritten), creating the file; not fsync'd (a roll does). Raises OSError."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        pos = at_entry * ENTRY_BYTES
        pwrite_all(fd, [encode([entry])], pos)
        os.ftruncate(fd, pos + ENTRY_BYTES)
    finally:
        os.close(fd)


def write_entries(path: Path, entries: list[AbortedTxn]) -> None:
    """Replace the index by ``entries`` (atomically, fsync'd; the file goes when there are
    none). The caller fsyncs the directory. Raises OSError."""
    if entries:
        write_file_atomically(path, encode(entries))
    else:
        path.unlink(missing_ok=True)


def collect(
    entries: Iterable[AbortedTxn], start_offset: int, upper_offset: int, found: list[AbortedTxn]
) -> bool:
    """Add to ``found`` the entries overlapping [start_offset, upper_offset) (marker at or
    above the start, first offset below the bound); True when the search is complete: an
    entry's last_stable_offset reached the bound (Kafka's TxnIndexSearchResult.isComplete)."""
    for entry in entries:
        if entry.last_offset >= start_offset and entry.first_offset < upper_offset:
            found.append(entry)
        if entry.last_stable_offset >= upper_offset:
            return True
    return False


# --- a log's indexes (under the Log's lock) ------------------------------------------------------


def append_aborted(segments: SegmentList, entry: AbortedTxn) -> None:
    """Add ``entry`` to the index of the segment holding its marker (the active one, as the
    marker was just appended); after the last entry there. Raises OSError."""
    seg = segments[segments.index_of(entry.last_offset)]
    if seg.txn_entries is None:
        segment_entries(seg)
    assert seg.txn_entries is not None
    append_entry(seg.txnindex_path, entry, seg.txn_entries)
    seg.txn_entries += 1


def collect_aborted(
    segments: SegmentList, start_offset: int, upper_offset: int
) -> list[AbortedTxn]:
    """The aborted transactions overlapping [start_offset, upper_offset), from the indexes of
    the segment holding ``start_offset`` and the later ones, until the search is complete
    (see :func:`collect`). Raises OSError."""
    found: list[AbortedTxn] = []
    for i in range(max(0, segments.index_of(start_offset)), len(segments)):
        seg = segments[i]
        if seg.txn_entries == 0:
            continue  # known to have none: no file to read
        if collect(segment_entries(seg), start_offset, upper_offset, found):
            break
    return found


def truncate(seg: Segment) -> None:
    """Drop the entries of ``seg``'s index at or past its end (after a cut of its tail).
    Raises OSError."""
    stored = read_entries(seg.txnindex_path, seg.base_offset)
    kept = segment_entries(seg)
    if stored != kept:
        write_entries(seg.txnindex_path, kept)


def restore(segments: SegmentList, from_offset: int, entries: Iterable[AbortedTxn]) -> int:
    """Make the indexes hold exactly ``entries`` (in marker order) for markers at or above
    ``from_offset``, keeping those below it; returns how many files were rewritten (only those
    that differ). Raises OSError."""
    first = max(0, segments.index_of(from_offset))
    wanted: dict[int, list[AbortedTxn]] = {}
    for entry in entries:
        if entry.last_offset >= from_offset:
            wanted.setdefault(segments.index_of(entry.last_offset), []).append(entry)
    rewritten = 0
    for i in range(first, len(segments)):
        seg = segments[i]
        stored = read_entries(seg.txnindex_path, seg.base_offset)
        kept = [e for e in stored or () if e.last_offset < from_offset]
        want = kept + wanted.get(i, [])
        if stored != want:
            write_entries(seg.txnindex_path, want)
            rewritten += 1
        seg.txn_entries = len(want)
    if rewritten:
        fsync_directory(segments.directory)
    return rewritten


__all__ = [
    "ENTRY_BYTES",
    "TXNINDEX_SUFFIX",
    "AbortedTxn",
    "append_aborted",
    "append_entry",
    "collect",
    "collect_aborted",
    "encode",
    "read_entries",
    "restore",
    "segment_entries",
    "truncate",
    "write_entries",
]
