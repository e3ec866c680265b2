"""The pure rules of a partition's remote log metadata (storage/remote/metadata.py).

Proves: a writer below the recorded leader epoch is fenced and changes nothing; finished
segments tile (a copy leaving a gap is refused); starting a copy turns every other started
copy into an orphan and deletes finished segments outside the new leader's lineage; the next
offset to copy follows Kafka's findHighestRemoteOffset over the leader's epoch lineage; the
copy plan picks the closed segment holding it, only below the last stable offset; retention
counts both tiers; DeleteRecords moves the remote log start (never down) and deletes what
lies wholly below it; a local segment goes only when copied AND past local retention; the
metadata is bounded in entries and refuses corrupt bytes.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from raylog.storage.errors import (
    CorruptRemoteObjectError,
    FencedLeaderEpochError,
    KafkaStorageError,
)
from raylog.storage.log import ClosedSegment, EpochEntry
from raylog.storage.remote import metadata as m
from raylog.storage.remote.metadata import RemoteLogMetadata, RemoteSegment, SegmentState


def seg(
    sid: str,
    base: int,
    end: int,
    *,
    epochs: tuple[tuple[int, int], ...] | None = None,
    ts: int = 1_000,
    size: int = 100,
    state: SegmentState = SegmentState.COPY_STARTED,
) -> RemoteSegment:
    return RemoteSegment(
        segment_id=sid,
        base_offset=base,
        end_offset=end,
        max_timestamp_ms=ts,
        size_bytes=size,
        leader_epochs=epochs if epochs is not None else ((0, base),),
        state=state,
        writer_epoch=-1,
    )


def copied(meta: RemoteLogMetadata, s: RemoteSegment, epoch: int = 0) -> RemoteLogMetadata:
    return m.finish_copy(m.start_copy(meta, s, epoch), s.segment_id, epoch)


def states(meta: RemoteLogMetadata) -> dict[str, str]:
    return {s.segment_id: str(s.state) for s in meta.segments}


def test_a_copy_starts_then_finishes_and_only_finished_segments_are_served() -> None:
    meta = m.start_copy(m.EMPTY, seg("a", 0, 9), writer_epoch=3)
    assert meta.leader_epoch == 3 and m.segment_for_offset(meta, 5) is None
    meta = m.finish_copy(meta, "a", 3)
    assert m.segment_for_offset(meta, 5).segment_id == "a"  # type: ignore[union-attr]
    assert m.log_start_offset(meta) == 0
    assert m.decode(m.encode(meta)) == meta


def test_an_older_leader_is_fenced_and_changes_nothing() -> None:
    meta = m.start_copy(m.EMPTY, seg("a", 0, 9), writer_epoch=2)
    newer = m.start_copy(meta, seg("b", 0, 9), writer_epoch=3)  # "a" is an orphan now
    assert states(newer) == {"a": "DELETE_STARTED", "b": "COPY_STARTED"}
    with pytest.raises(FencedLeaderEpochError, match="epoch 2 is fenced"):
        m.finish_copy(newer, "a", 2)
    with pytest.raises(FencedLeaderEpochError):
        m.start_copy(newer, seg("c", 0, 9), writer_epoch=2)
    with pytest.raises(FencedLeaderEpochError):
        m.start_delete(newer, ["b"], 2)
    with pytest.raises(FencedLeaderEpochError):
        m.forget(newer, ["a"], 2)


def test_finishing_an_orphaned_copy_of_the_same_epoch_is_refused() -> None:
    meta = m.start_copy(m.EMPTY, seg("a", 0, 9), writer_epoch=2)
    meta = m.start_copy(meta, seg("b", 0, 9), writer_epoch=2)  # a restarted copier
    with pytest.raises(KafkaStorageError, match="not COPY_STARTED"):
        m.finish_copy(meta, "a", 2)
    assert [s.segment_id for s in m.orphaned_copies(meta, in_flight="b")] == []
    assert [s.segment_id for s in m.pending_deletes(meta)] == ["a"]


def test_finished_segments_tile_offsets() -> None:
    meta = copied(m.EMPTY, seg("a", 100, 199))
    with pytest.raises(ValueError, match="gap"):
        m.start_copy(meta, seg("b", 201, 300), 0)
    meta = copied(meta, seg("b", 200, 300))
    assert [s.segment_id for s in meta.finished()] == ["a", "b"]
    bad = msgspec.structs.replace(meta, segments=(*meta.segments, seg("c", 250, 400)))
    bad = msgspec.structs.replace(
        bad,
        segments=tuple(
            msgspec.structs.replace(s, state=SegmentState.COPY_FINISHED) for s in bad.segments
        ),
    )
    with pytest.raises(ValueError, match="do not tile"):
        m.check_tiling(bad)


def test_a_copy_below_the_remote_end_deletes_the_diverged_segments() -> None:
    meta = copied(copied(m.EMPTY, seg("a", 0, 99)), seg("b", 100, 199, epochs=((1, 100),)))
    with pytest.raises(ValueError, match="gap"):  # "b" leaves, 100..149 would be missing
        m.start_copy(copied(m.EMPTY, seg("a", 0, 99)), seg("x", 150, 160), 2)
    meta = m.start_copy(
        copied(copied(m.EMPTY, seg("a", 0, 99)), seg("b", 100, 199)), seg("c", 100, 120), 2
    )
    assert states(meta) == {"a": "COPY_FINISHED", "b": "DELETE_STARTED", "c": "COPY_STARTED"}


def test_forget_drops_only_pending_deletes() -> None:
    meta = m.start_delete(copied(m.EMPTY, seg("a", 0, 9)), ["a"], 0)
    assert m.segment_for_offset(meta, 3) is None  # no longer served
    assert m.forget(meta, ["a"], 0).segments == ()
    with pytest.raises(ValueError, match="not DELETE_STARTED"):
        m.forget(copied(m.EMPTY, seg("a", 0, 9)), ["a"], 0)


def test_next_copy_offset_follows_the_leaders_lineage() -> None:
    # Remote: epoch 0 on [0, 49], epoch 1 on [50, 99] (copied by the leader of epoch 1).
    meta = copied(m.EMPTY, seg("a", 0, 99, epochs=((0, 0), (1, 50))), epoch=1)
    assert m.highest_offset_for_epoch(meta, 0) == 49
    assert m.highest_offset_for_epoch(meta, 1) == 99
    assert m.highest_offset_for_epoch(meta, 5) is None
    lineage = [EpochEntry(0, 0), EpochEntry(1, 50), EpochEntry(2, 150)]
    assert m.next_copy_offset(meta, lineage, 200) == m.CopyFrom(100, 1)
    # A leader whose epoch 1 ended at 80 (it never had 80..99 of epoch 1): copy from 80.
    assert m.next_copy_offset(
        meta, [EpochEntry(0, 0), EpochEntry(1, 50), EpochEntry(3, 80)], 90
    ) == (m.CopyFrom(80, 1))
    # A leader that never had epoch 1: its lineage agrees up to where its epoch 0 ends.
    assert m.next_copy_offset(meta, [EpochEntry(0, 0), EpochEntry(4, 40)], 60) == m.CopyFrom(40, 0)
    assert m.next_copy_offset(meta, [EpochEntry(7, 0)], 10) == m.CopyFrom(None, -1)
    assert m.next_copy_offset(m.EMPTY, lineage, 200) == m.CopyFrom(None, -1)


def closed(*bounds: tuple[int, int], size: int = 100, ts: int = 1_000) -> list[ClosedSegment]:
    return [
        ClosedSegment(b, n, size, ts, Path(f"{b}.log"), Path(f"{b}.txnindex")) for b, n in bounds
    ]


def test_plan_copy_picks_the_segment_holding_the_next_offset_below_the_lso() -> None:
    local = closed((0, 100), (100, 200), (200, 300))
    lineage = [EpochEntry(0, 0)]
    assert m.plan_copy(m.EMPTY, lineage, 350, 0, local, 350) == m.CopyPlan(0, 0)
    assert m.plan_copy(m.EMPTY, lineage, 350, 30, local, 350) == m.CopyPlan(0, 30)
    meta = copied(m.EMPTY, seg("a", 0, 149))  # an old leader cut its segments elsewhere
    assert m.plan_copy(meta, lineage, 350, 0, local, 350) == m.CopyPlan(1, 150)
    assert m.plan_copy(meta, lineage, 350, 0, local, 199) is None  # not below the LSO yet
    meta = copied(meta, seg("b", 150, 299))
    assert m.plan_copy(meta, lineage, 350, 0, local, 350) is None  # all closed ones copied
    with pytest.raises(KafkaStorageError, match="in neither tier"):
        m.plan_copy(copied(m.EMPTY, seg("a", 0, 49)), lineage, 350, 100, local[1:], 350)


def test_retention_counts_both_tiers() -> None:
    meta = m.EMPTY
    for i in range(4):  # 4 remote segments of 100 bytes, timestamps 1000..1003
        meta = copied(meta, seg(f"s{i}", i * 10, i * 10 + 9, ts=1_000 + i))
    ids = lambda segs: [s.segment_id for s in segs]  # noqa: E731
    assert ids(m.remote_segments_past_retention(meta, 2_000, -1, -1, 0)) == []
    assert ids(m.remote_segments_past_retention(meta, 2_002, 1_000, -1, 0)) == ["s0", "s1"]
    # retention.bytes 300 over 400 remote + 0 local bytes: one goes (never below the limit,
    # as Kafka); with 100 local bytes not copied yet, two.
    assert ids(m.remote_segments_past_retention(meta, 0, -1, 350, 0)) == []
    assert ids(m.remote_segments_past_retention(meta, 0, -1, 300, 0)) == ["s0"]
    assert ids(m.remote_segments_past_retention(meta, 0, -1, 300, 100)) == ["s0", "s1"]
    # DeleteRecords moved the log start offset to 25: the wholly lower segments go.
    assert ids(m.remote_segments_past_retention(meta, 0, -1, -1, 0, log_start_offset=25)) == [
        "s0",
        "s1",
    ]


def test_a_local_segment_goes_only_when_copied_and_past_local_retention() -> None:
    local = closed((0, 100), (100, 200), (200, 300), ts=1_000)
    decide = m.local_segments_deletable
    assert decide(local, 50, None, 10_000, 0, -1) == 0  # nothing copied
    assert decide(local, 50, 199, 10_000, 0, -1) == 2  # copied up to 199, all expired
    assert decide(local, 50, 199, 1_500, 1_000, -1) == 0  # not past local.retention.ms
    assert decide(local, 50, 299, 0, -1, 250) == 1  # 350 bytes: one 100-byte segment goes
    assert decide(local, 50, 150, 10_000, 0, -1) == 1  # the second is only partly copied
    assert m.effective_local_retention(-2, 7_000) == 7_000
    assert m.effective_local_retention(500, 7_000) == 500


def test_delete_records_moves_the_remote_log_start_and_deletes_what_lies_below() -> None:
    """DeleteRecords: the log start never moves down; the finished segments wholly below it are
    deleted, the one holding it is kept but nothing below it is served; a later copy may start
    past a gap that lies below the log start; the log start survives encoding and other
    writes; an older leader is fenced."""
    meta = copied(copied(copied(m.EMPTY, seg("a", 0, 9)), seg("b", 10, 19)), seg("c", 20, 29))
    assert (m.log_start_offset(meta), meta.log_start_offset) == (0, -1)
    moved = m.move_log_start(meta, 15, writer_epoch=1)
    assert states(moved) == {"a": "DELETE_STARTED", "b": "COPY_FINISHED", "c": "COPY_FINISHED"}
    assert (moved.log_start_offset, m.log_start_offset(moved)) == (15, 15)
    assert m.segment_for_offset(moved, 14) is None
    assert m.segment_for_offset(moved, 15) == moved.find("b")
    assert m.move_log_start(moved, 12, writer_epoch=1).log_start_offset == 15  # never down
    with pytest.raises(FencedLeaderEpochError):
        m.move_log_start(moved, 20, writer_epoch=0)
    assert m.decode(m.encode(moved)) == moved
    kept = m.forget(moved, ["a"], writer_epoch=1)
    assert kept.log_start_offset == 15
    # Past the remote end (the local log start moves there too): everything remote goes, and
    # the next copy starts at the new start, past the gap.
    beyond = m.move_log_start(kept, 45, writer_epoch=1)
    assert m.log_start_offset(beyond) is None and not beyond.finished()
    after = copied(beyond, seg("d", 45, 59), epoch=1)
    assert [s.segment_id for s in after.finished()] == ["d"]
    assert m.log_start_offset(after) == 45
    # Retention deletes what lies wholly below the log start.
    gone = m.remote_segments_past_retention(moved, 2_000, -1, -1, 0, moved.log_start_offset)
    assert [s.segment_id for s in gone] == []  # "a" is already being deleted, "b" holds 15
    assert m.remote_segments_past_retention(after, 2_000, -1, -1, 0, 60) == after.finished()


def test_the_number_of_entries_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(m, "MAX_SEGMENTS", 3)
    meta = m.EMPTY
    for i in range(3):
        meta = copied(meta, seg(f"s{i}", i * 10, i * 10 + 9))
    with pytest.raises(KafkaStorageError, match="above 3"):
        m.start_copy(meta, seg("s3", 30, 39), 0)


def test_corrupt_metadata_is_refused() -> None:
    data = bytearray(m.encode(copied(m.EMPTY, seg("a", 0, 9))))
    data[10] ^= 0x20
    with pytest.raises(CorruptRemoteObjectError, match="CRC"):
        m.decode(bytes(data))
    with pytest.raises(CorruptRemoteObjectError):
        m.decode(b"\x00")


def test_epochs_spanned_keeps_one_entry_per_epoch_change() -> None:
    per_batch = [(3, 10), (3, 12), (4, 15), (4, 18), (6, 20)]
    assert m.epochs_spanned(per_batch, 10, 21) == ((3, 10), (4, 15), (6, 20))
