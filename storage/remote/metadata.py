"""Pure rules of a partition's remote log metadata (KIP-405's RemoteLogSegmentMetadata): no I/O.

One object per partition (:mod:`raylog.storage.remote.metadata_store` reads it and replaces it
only by compare-and-swap) lists the partition's remote segments, oldest first. Each entry:
segment id (a uuid: a segment's objects live under it, so a crashed copy's leftovers never
collide with a later copy), base and end offset (inclusive, Kafka's endOffset), max timestamp,
size of its ``.log`` object, the leader epochs it spans (Kafka's segmentLeaderEpochs: each
epoch and the first offset of the segment under it), its state and the leader epoch of the
writer that recorded that state.

States (Kafka's RemoteLogSegmentState):

- ``COPY_STARTED``   recorded before the first object is uploaded; never read from;
- ``COPY_FINISHED``  recorded after every object is uploaded; the only state served;
- ``DELETE_STARTED`` recorded before the objects are deleted (retention, an orphan, a
  segment outside the leader's lineage); the entry goes once its objects are gone.

Rules, each a function here:

- fencing: the object records the highest writer epoch seen; a writer with a lower one is
  fenced (:class:`~raylog.storage.errors.FencedLeaderEpochError`), so an old leader can
  neither finish a copy nor delete anything once a newer one wrote;
- tiling: the ``COPY_FINISHED`` segments cover consecutive offsets, without overlap or gap
  (a copy starts at the next offset to copy; retention removes from the head only);
- orphans: one copier per partition runs at a time (the leader's), so when a copy starts,
  every ``COPY_STARTED`` entry is a copy that crashed or was fenced: it becomes
  ``DELETE_STARTED``;
- the next offset to copy (Kafka's findHighestRemoteOffset): walk the leader's epoch lineage
  from its latest epoch down; the first epoch with copied offsets gives the highest copied
  offset, capped by where that epoch ends in the leader's lineage. Finished segments above it
  (copied by a leader whose log diverged, after an unclean election) are not in the lineage
  and are deleted when the next copy starts;
- retention over both tiers (retention.ms / retention.bytes, the local-only bytes counted);
- DeleteRecords: the object also records the partition's log start offset once DeleteRecords
  moved it (:func:`move_log_start`); nothing below it is served, and the segments wholly below
  it are deleted;
- which local segments may go: copied, and past local.retention.ms / local.retention.bytes.

Bounds: at most ``MAX_SEGMENTS`` entries (:class:`~raylog.storage.errors.KafkaStorageError`
past it: retention must run first) and ``MAX_METADATA_BYTES`` encoded.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from typing import NamedTuple

import crc32c
import msgspec

from raylog.storage.errors import (
    CorruptRemoteObjectError,
    FencedLeaderEpochError,
    KafkaStorageError,
)
from raylog.storage.log.epochs import EpochEntry
from raylog.storage.log.segment_list import ClosedSegment

METADATA_VERSION = 1
# A partition's remote log lists at most this many segments: 1 GiB segments make 100 TiB.
MAX_SEGMENTS = 100_000
MAX_METADATA_BYTES = 64 << 20
MAX_EPOCHS_PER_SEGMENT = 10_000

# local.retention.ms / local.retention.bytes: -2 follows retention.ms / retention.bytes.
LOCAL_RETENTION_FOLLOWS_TOTAL = -2


class SegmentState(enum.StrEnum):
    COPY_STARTED = "COPY_STARTED"
    COPY_FINISHED = "COPY_FINISHED"
    DELETE_STARTED = "DELETE_STARTED"


class RemoteSegment(msgspec.Struct, frozen=True, kw_only=True):
    """One remote segment's entry (see the module docstring)."""

    segment_id: str
    base_offset: int
    end_offset: int  # the last offset it holds (inclusive)
    max_timestamp_ms: int
    size_bytes: int  # of its .log object
    leader_epochs: tuple[tuple[int, int], ...]  # (epoch, first offset under it), ascending
    state: SegmentState
    writer_epoch: int  # leader epoch of the writer that recorded ``state``

    @property
    def next_offset(self) -> int:
        return self.end_offset + 1


class RemoteLogMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """A partition's remote log: the highest writer epoch seen and the segments, oldest
    first (by base offset, then by when they were recorded)."""

    version: int = METADATA_VERSION
    leader_epoch: int = -1
    segments: tuple[RemoteSegment, ...] = ()
    # The partition's log start offset as DeleteRecords moved it (Kafka's logStartOffset when it
    # lies in the remote tier); -1: never moved. Offsets below it are not served.
    log_start_offset: int = -1

    def finished(self) -> list[RemoteSegment]:
        """The segments served: ``COPY_FINISHED``, in offset order."""
        return [s for s in self.segments if s.state == SegmentState.COPY_FINISHED]

    def find(self, segment_id: str) -> RemoteSegment | None:
        return next((s for s in self.segments if s.segment_id == segment_id), None)


EMPTY = RemoteLogMetadata()

_CRC = 4  # the encoded object: CRC-32C (big-endian) of the JSON that follows, then the JSON
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RemoteLogMetadata)


def encode(meta: RemoteLogMetadata) -> bytes:
    body = _encoder.encode(meta)
    data = crc32c.crc32c(body).to_bytes(_CRC, "big") + body
    if len(data) > MAX_METADATA_BYTES:
        raise KafkaStorageError(
            f"remote log metadata of {len(meta.segments)} segments is {len(data)} bytes, "
            f"above {MAX_METADATA_BYTES}"
        )
    return data


def decode(data: bytes, what: str = "remote log metadata") -> RemoteLogMetadata:
    """The metadata in ``data``; CorruptRemoteObjectError when its CRC or shape is wrong."""
    if len(data) < _CRC or crc32c.crc32c(data[_CRC:]) != int.from_bytes(data[:_CRC], "big"):
        raise CorruptRemoteObjectError(f"{what}: CRC-32C mismatch")
    try:
        meta = _decoder.decode(data[_CRC:])
    except msgspec.DecodeError as exc:
        raise CorruptRemoteObjectError(f"{what}: {exc}") from exc
    if meta.version != METADATA_VERSION:
        raise CorruptRemoteObjectError(f"{what}: version {meta.version} unknown")
    return meta


# -- writes: each returns the new metadata or raises ----------------------------------------


def check_writer(meta: RemoteLogMetadata, writer_epoch: int) -> None:
    """Fence a writer whose leader epoch is below the highest one recorded."""
    if writer_epoch < meta.leader_epoch:
        raise FencedLeaderEpochError(
            f"remote log writer at leader epoch {writer_epoch} is fenced: "
            f"leader epoch {meta.leader_epoch} wrote the remote log metadata"
        )


def start_copy(
    meta: RemoteLogMetadata, segment: RemoteSegment, writer_epoch: int
) -> RemoteLogMetadata:
    """Record ``segment`` as ``COPY_STARTED``: every other ``COPY_STARTED`` entry becomes an
    orphan and every finished segment at or above its base offset (outside the lineage of
    the leader that computed that base offset with :func:`next_copy_offset`) is deleted.

    The segment must start where the finished segments below it end (tiling); the first
    copy, or one after retention removed everything, may start anywhere.
    """
    check_writer(meta, writer_epoch)
    if segment.state != SegmentState.COPY_STARTED or segment.end_offset < segment.base_offset:
        raise ValueError(f"not a segment to start copying: {segment}")
    if meta.find(segment.segment_id) is not None:
        raise ValueError(f"segment id {segment.segment_id} already listed")
    kept: list[RemoteSegment] = []
    for s in meta.segments:
        stale = s.state == SegmentState.COPY_STARTED or (
            s.state == SegmentState.COPY_FINISHED and s.end_offset >= segment.base_offset
        )
        kept.append(_with(s, SegmentState.DELETE_STARTED, writer_epoch) if stale else s)
    below = [s for s in kept if s.state == SegmentState.COPY_FINISHED]
    if below and below[-1].next_offset != segment.base_offset:
        raise ValueError(
            f"a copy from offset {segment.base_offset} leaves a gap: the remote log ends at "
            f"offset {below[-1].end_offset}"
        )
    return _replace(meta, writer_epoch, [*kept, _with(segment, segment.state, writer_epoch)])


def finish_copy(meta: RemoteLogMetadata, segment_id: str, writer_epoch: int) -> RemoteLogMetadata:
    """Mark a started copy ``COPY_FINISHED``. Raises FencedLeaderEpochError when a newer
    leader wrote meanwhile, and KafkaStorageError when the entry is no longer a started copy
    (another writer of this epoch declared it an orphan)."""
    check_writer(meta, writer_epoch)
    entry = meta.find(segment_id)
    if entry is None or entry.state != SegmentState.COPY_STARTED:
        state = "gone" if entry is None else entry.state
        raise KafkaStorageError(f"remote segment {segment_id} is {state}, not COPY_STARTED")
    return _transition(meta, [segment_id], SegmentState.COPY_FINISHED, writer_epoch)


def start_delete(
    meta: RemoteLogMetadata, segment_ids: Sequence[str], writer_epoch: int
) -> RemoteLogMetadata:
    """Mark segments ``DELETE_STARTED`` (retention, orphans): from now on they are not read."""
    check_writer(meta, writer_epoch)
    return _transition(meta, segment_ids, SegmentState.DELETE_STARTED, writer_epoch)


def forget(
    meta: RemoteLogMetadata, segment_ids: Sequence[str], writer_epoch: int
) -> RemoteLogMetadata:
    """Drop ``DELETE_STARTED`` entries whose objects are gone."""
    check_writer(meta, writer_epoch)
    gone = set(segment_ids)
    for s in meta.segments:
        if s.segment_id in gone and s.state != SegmentState.DELETE_STARTED:
            raise ValueError(f"remote segment {s.segment_id} is {s.state}, not DELETE_STARTED")
    return _replace(meta, writer_epoch, [s for s in meta.segments if s.segment_id not in gone])


def move_log_start(meta: RemoteLogMetadata, offset: int, writer_epoch: int) -> RemoteLogMetadata:
    """DeleteRecords: the partition's log start moves up to ``offset`` (never down); finished
    segments wholly below it become ``DELETE_STARTED``, so a copy after it may start past
    them (the gap lies below the log start), and none of them is read again."""
    check_writer(meta, writer_epoch)
    start = max(meta.log_start_offset, offset)
    segments = [
        _with(s, SegmentState.DELETE_STARTED, writer_epoch)
        if s.state == SegmentState.COPY_FINISHED and s.end_offset < start
        else s
        for s in meta.segments
    ]
    return _replace(meta, writer_epoch, segments, log_start_offset=start)


def _with(s: RemoteSegment, state: SegmentState, writer_epoch: int) -> RemoteSegment:
    return msgspec.structs.replace(s, state=state, writer_epoch=writer_epoch)


def _transition(
    meta: RemoteLogMetadata, ids: Sequence[str], state: SegmentState, writer_epoch: int
) -> RemoteLogMetadata:
    wanted = set(ids)
    segments = [
        _with(s, state, writer_epoch) if s.segment_id in wanted else s for s in meta.segments
    ]
    return _replace(meta, writer_epoch, segments)


def _replace(
    meta: RemoteLogMetadata,
    writer_epoch: int,
    segments: list[RemoteSegment],
    log_start_offset: int | None = None,
) -> RemoteLogMetadata:
    if len(segments) > MAX_SEGMENTS:
        raise KafkaStorageError(
            f"remote log metadata would list {len(segments)} segments, above {MAX_SEGMENTS}: "
            "retention must delete remote segments before more are copied"
        )
    segments.sort(key=lambda s: s.base_offset)  # stable: equal bases keep their order
    out = RemoteLogMetadata(
        leader_epoch=max(meta.leader_epoch, writer_epoch),
        segments=tuple(segments),
        log_start_offset=meta.log_start_offset if log_start_offset is None else log_start_offset,
    )
    check_tiling(out)
    return out


def check_tiling(meta: RemoteLogMetadata) -> None:
    """Raise ValueError unless the finished segments cover consecutive offsets."""
    finished = meta.finished()
    for prev, nxt in itertools.pairwise(finished):
        if prev.next_offset != nxt.base_offset:
            raise ValueError(
                f"remote segments {prev.segment_id} (to {prev.end_offset}) and "
                f"{nxt.segment_id} (from {nxt.base_offset}) do not tile"
            )


# -- reads and decisions ----------------------------------------------------------------------


def orphaned_copies(meta: RemoteLogMetadata, in_flight: str | None = None) -> list[RemoteSegment]:
    """The ``COPY_STARTED`` entries that are orphans: all but the copy the caller (the one
    copier of the partition) has in flight."""
    return [
        s
        for s in meta.segments
        if s.state == SegmentState.COPY_STARTED and s.segment_id != in_flight
    ]


def pending_deletes(meta: RemoteLogMetadata) -> list[RemoteSegment]:
    """Entries whose objects are to be deleted: the ``DELETE_STARTED`` ones."""
    return [s for s in meta.segments if s.state == SegmentState.DELETE_STARTED]


def segment_for_offset(meta: RemoteLogMetadata, offset: int) -> RemoteSegment | None:
    """The finished segment holding ``offset``, None when no remote segment does or the
    offset lies below the log start DeleteRecords set."""
    if offset < meta.log_start_offset:
        return None
    for s in meta.finished():
        if s.base_offset <= offset <= s.end_offset:
            return s
    return None


def served(meta: RemoteLogMetadata) -> list[RemoteSegment]:
    """The finished segments that hold an offset at or above the log start DeleteRecords set,
    in offset order."""
    return [s for s in meta.finished() if s.end_offset >= meta.log_start_offset]


def log_start_offset(meta: RemoteLogMetadata) -> int | None:
    """The first offset served remotely (the first segment's, or the log start DeleteRecords
    set inside it), None when nothing is."""
    segments = served(meta)
    return max(segments[0].base_offset, meta.log_start_offset) if segments else None


def epochs_spanned(
    epochs: Sequence[tuple[int, int]], base_offset: int, end_offset: int
) -> tuple[tuple[int, int], ...]:
    """The (epoch, first offset) entries of a run of batches whose epochs are given as
    (epoch, base offset) per batch in order: one entry per epoch change."""
    out: list[tuple[int, int]] = []
    for epoch, start in epochs:
        if start > end_offset:
            break
        if not out or epoch != out[-1][0]:
            out.append((epoch, max(start, base_offset)))
    if len(out) > MAX_EPOCHS_PER_SEGMENT:
        raise KafkaStorageError(f"a segment spans {len(out)} leader epochs")
    return tuple(out)


def highest_offset_for_epoch(meta: RemoteLogMetadata, epoch: int) -> int | None:
    """The highest offset copied under ``epoch`` (Kafka's highestOffsetForEpoch)."""
    highest: int | None = None
    for s in meta.finished():
        for i, (e, _) in enumerate(s.leader_epochs):
            if e != epoch:
                continue
            last = s.leader_epochs[i + 1][1] - 1 if i + 1 < len(s.leader_epochs) else s.end_offset
            highest = last if highest is None else max(highest, last)
    return highest


class CopyFrom(NamedTuple):
    """Where a leader's next copy starts: ``offset`` (None: nothing of its lineage is
    remote, start at the local log start offset) and the epoch that decided it."""

    offset: int | None
    epoch: int


def next_copy_offset(
    meta: RemoteLogMetadata, lineage: Sequence[EpochEntry], log_end_offset: int
) -> CopyFrom:
    """Kafka's findHighestRemoteOffset, plus one: see the module docstring.

    ``lineage`` is the leader's epoch cache (oldest first), ``log_end_offset`` its log end.
    """
    for i in range(len(lineage) - 1, -1, -1):
        epoch = lineage[i].epoch
        highest = highest_offset_for_epoch(meta, epoch)
        if highest is None:
            continue
        # Where ``epoch`` ends in the leader's lineage (LeaderEpochFileCache.endOffsetFor).
        end = lineage[i + 1].start_offset if i + 1 < len(lineage) else log_end_offset
        return CopyFrom(min(highest + 1, end), epoch)
    return CopyFrom(None, -1)


class CopyPlan(NamedTuple):
    """The next copy: the closed local segment (its index in the list given) and the offset
    the copy starts at."""

    segment: int
    from_offset: int


def plan_copy(
    meta: RemoteLogMetadata,
    lineage: Sequence[EpochEntry],
    log_end_offset: int,
    local_log_start_offset: int,
    closed: Sequence[ClosedSegment],
    last_stable_offset: int,
) -> CopyPlan | None:
    """Which closed local segment a leader copies next, from which offset; None when there
    is none yet. As Kafka, only a segment wholly below the last stable offset is copied.
    Raises KafkaStorageError when the next offset to copy is below the local log start (those
    offsets are neither remote nor local: the lineage lost them)."""
    start = next_copy_offset(meta, lineage, log_end_offset).offset
    if start is None:
        start = local_log_start_offset
    if start < local_log_start_offset:
        raise KafkaStorageError(
            f"remote log ends at offset {start - 1} but the local log starts at "
            f"{local_log_start_offset}: offsets in between are in neither tier"
        )
    for i, s in enumerate(closed):
        if start < s.next_offset:
            return CopyPlan(i, start) if s.next_offset <= last_stable_offset else None
    return None


def effective_local_retention(local: int, total: int) -> int:
    """local.retention.ms / local.retention.bytes in force: -2 follows the total one."""
    return total if local == LOCAL_RETENTION_FOLLOWS_TOTAL else local


def remote_segments_past_retention(
    meta: RemoteLogMetadata,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    local_only_bytes: int,
    log_start_offset: int = 0,
) -> list[RemoteSegment]:
    """Finished remote segments that retention deletes, oldest first (Kafka's RLM retention):
    while the oldest is past retention.ms (by its max timestamp), or the partition's size
    over BOTH tiers without it (remote segments plus ``local_only_bytes``, the local bytes
    not copied yet) is still at least retention.bytes, or it lies wholly below the log start
    offset (DeleteRecords). -1 disables either limit."""
    finished = meta.finished()
    total = sum(s.size_bytes for s in finished) + local_only_bytes
    out: list[RemoteSegment] = []
    for s in finished:
        expired = retention_ms >= 0 and now_ms - s.max_timestamp_ms > retention_ms
        oversized = retention_bytes >= 0 and total - s.size_bytes >= retention_bytes
        if not (expired or oversized or s.end_offset < log_start_offset):
            break
        out.append(s)
        total -= s.size_bytes
    return out


def local_segments_deletable(
    closed: Sequence[ClosedSegment],
    active_size_bytes: int,
    highest_copied_offset: int | None,
    now_ms: int,
    local_retention_ms: int,
    local_retention_bytes: int,
) -> int:
    """How many of the oldest closed local segments may be deleted: each wholly copied
    (its last offset at or below ``highest_copied_offset``) AND past local retention
    (local.retention.ms by its max timestamp, or the local size without it still at least
    local.retention.bytes; the effective values, see :func:`effective_local_retention`)."""
    if highest_copied_offset is None:
        return 0
    total = sum(s.size_bytes for s in closed) + active_size_bytes
    count = 0
    for s in closed:
        if s.next_offset - 1 > highest_copied_offset:
            break
        expired = local_retention_ms >= 0 and now_ms - s.max_timestamp_ms > local_retention_ms
        oversized = local_retention_bytes >= 0 and total - s.size_bytes >= local_retention_bytes
        if not (expired or oversized):
            break
        count += 1
        total -= s.size_bytes
    return count
