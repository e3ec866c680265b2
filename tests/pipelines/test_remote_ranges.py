"""Reading tiered topics' remote segments straight from the object store
(pipelines/remote_ranges.py), without Ray: planning on hand-made metadata, reading on a real Log
copied to a local object store as a leader copies it.

Proves:
- planning lowers a tiered partition's log start to the remote log's first offset only where
  the tiers meet, and splits a range at the local log start into one remote range per remote
  segment below it and the rest as it was: the pieces tile the range exactly, whether the
  range, the local log start or a split point falls inside a segment; a gap between the tiers
  fails; topics without tiering are left alone;
- reading every remote range of a split read, then the rest from the log, returns exactly the
  records of the log from the same start to the same end (no record twice, none skipped, at
  both boundaries: a range starting mid-segment and the local log start mid-segment), with
  read_uncommitted and with read_committed (an aborted transaction spanning two remote
  segments and the local tier is left out, the committed one after it kept);
- the span checks: a batch past the segment's end, a gap between batches, a first batch that
  does not hold the wanted offset fail (RemoteSpanError); a corrupt byte fails its CRC;
- a remote segment deleted under a read is data loss: DataLossError, or with
  failOnDataLoss=false the rest of the range is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

from raylog.pipelines import records
from raylog.pipelines.catalog import PartitionInfo
from raylog.pipelines.reading import READ_COMMITTED, Bounds, DataLossError, OffsetRange
from raylog.pipelines.remote_ranges import (
    IN_LOCAL_TIER,
    RemoteLog,
    RemoteRange,
    RemoteSpanError,
    StoreLocation,
    Tiers,
    _remote_aborted,
    aborted_within,
    check_span,
    learn,
    read_remote,
)
from raylog.storage import Log, LogConfig
from raylog.storage.batch import Record, build_batch, end_txn_marker_record
from raylog.storage.errors import CorruptRemoteObjectError
from raylog.storage.localstore import LocalObjectStore
from raylog.storage.log import AbortedTxn
from raylog.storage.remote import (
    ByteLRU,
    RemotePartition,
    RemoteReader,
    RemoteSegment,
    SegmentState,
    copy_segment,
)
from raylog.storage.remote import format as fmt
from raylog.storage.remote.metadata_store import read as read_metadata

TOPIC = "t"
PID = 7
STORE = StoreLocation("/nowhere")


def _segment(base: int, end: int) -> RemoteSegment:
    return RemoteSegment(
        segment_id=f"s{base}",
        base_offset=base,
        end_offset=end,
        max_timestamp_ms=0,
        size_bytes=100,
        leader_epochs=((1, base),),
        state=SegmentState.COPY_FINISHED,
        writer_epoch=1,
    )


SEGMENTS = (_segment(10, 19), _segment(20, 29), _segment(30, 39))


def _tiers(local_start: int, segments: tuple[RemoteSegment, ...] = SEGMENTS, **kw: object) -> Tiers:
    return Tiers(STORE, {(TOPIC, 0): RemoteLog("id", local_start, segments, **kw)})  # type: ignore[arg-type]


def _spans(ranges: list[OffsetRange]) -> list[tuple[str, int, int]]:
    return [
        (r.segment.segment_id if isinstance(r, RemoteRange) else "local", r.start, r.end)
        for r in ranges
    ]


# -- planning ------------------------------------------------------------------------------------


def test_bounds_lowered_only_where_the_tiers_meet() -> None:
    bounds = {(TOPIC, 0): Bounds(35, 90, True), ("other", 0): Bounds(5, 9)}
    lowered = _tiers(35).bounds(bounds)
    assert lowered[(TOPIC, 0)] == Bounds(10, 90, True)
    assert lowered[("other", 0)] == Bounds(5, 9)
    # The remote log ends at 40, the local one starts at 45: nothing below 45 is readable.
    assert _tiers(45).bounds(bounds)[(TOPIC, 0)] == Bounds(35, 90, True)
    assert Tiers(STORE, {(TOPIC, 0): RemoteLog("id", 35, ())}).bounds(bounds) == bounds


@pytest.mark.parametrize(
    "start, end, local_start, want",
    [
        # From the remote log start to past the local log start (on a segment boundary).
        (10, 50, 30, [("s10", 10, 20), ("s20", 20, 30), ("local", 30, 50)]),
        # Starting and ending mid-segment; the local log start inside a segment.
        (13, 50, 35, [("s10", 13, 20), ("s20", 20, 30), ("s30", 30, 35), ("local", 35, 50)]),
        # Ending below the local log start, mid-segment.
        (12, 25, 35, [("s10", 12, 20), ("s20", 20, 25)]),
        # Wholly in one segment.
        (21, 23, 35, [("s20", 21, 23)]),
        # At or above the local log start: untouched.
        (35, 50, 35, [("local", 35, 50)]),
    ],
)
def test_split_tiles_the_range_exactly(
    start: int, end: int, local_start: int, want: list[tuple[str, int, int]]
) -> None:
    r = OffsetRange(TOPIC, 0, start, end, (1, 2))
    got = _tiers(local_start).split([r])
    assert _spans(got) == want
    remote = [g for g in got if isinstance(g, RemoteRange)]
    assert all(g.replica_ids == () and g.topic_id == "id" and g.store == STORE for g in remote)
    assert [g.replica_ids for g in got if not isinstance(g, RemoteRange)] in ([], [(1, 2)])


def test_split_leaves_untiered_partitions_and_fails_on_a_gap() -> None:
    other = OffsetRange("other", 0, 0, 50, (1,))
    assert _tiers(30).split([other]) == [other]
    gap = (SEGMENTS[0], SEGMENTS[2])  # 20..29 is missing
    with pytest.raises(ValueError, match="in no remote segment"):
        _tiers(35, gap).split([OffsetRange(TOPIC, 0, 10, 40, (1,))])


def test_aborted_transactions_go_to_the_ranges_they_overlap() -> None:
    aborted = ((7, 12, 24), (8, 31, IN_LOCAL_TIER), (9, 5, 9))
    assert aborted_within(aborted, 10, 20) == ((7, 12),)
    assert aborted_within(aborted, 25, 30) == ()
    assert aborted_within(aborted, 30, 35) == ((8, 31),)
    got = _tiers(35, aborted=aborted).split([OffsetRange(TOPIC, 0, 10, 35, (1,))])
    assert [g.aborted_transactions for g in got] == [((7, 12),), ((7, 12),), ((8, 31),)]  # type: ignore[attr-defined]


# -- reading a real copied log -----------------------------------------------------------------


def _batch(i: int, **txn: object) -> bytes:
    recs = [Record(b"k%d" % i, b"v%d-%d" % (i, j) + bytes(40), 1_000 + i) for j in range(3)]
    return build_batch(recs, **txn)  # type: ignore[arg-type]


def _marker(commit: bool, seq_epoch: int = 0) -> bytes:
    return build_batch(
        [end_txn_marker_record(commit, 3, 2_000)],
        producer_id=PID,
        producer_epoch=seq_epoch,
        transactional=True,
        control=True,
    )


class Copied:
    """A log of ~160 offsets in segments of 2 KiB, copied to a local object store: plain
    batches, a transaction of PID aborted across segments, one of PID committed, more plain
    batches. ``aborted``: that transaction as (pid, first, last)."""

    def __init__(self, root: Path) -> None:
        self.log = Log.open(root / "log", LogConfig(segment_bytes=2048, index_interval_bytes=256))
        self.store = LocalObjectStore(root / "store")
        self.partition = RemotePartition("topicid", 0)
        for i in range(12):
            self.log.append(_batch(i), 1)
        txn = {"producer_id": PID, "producer_epoch": 0, "transactional": True}
        first = self.log.append(_batch(100, base_sequence=0, **txn), 1, validated=True).base_offset
        for i in range(12, 24):
            self.log.append(_batch(i), 1)
        self.log.append(_batch(101, base_sequence=1, **txn), 1, validated=True)
        last = self.log.append(_marker(False), 1, validated=True).last_offset
        self.log.append_aborted_txn(AbortedTxn(PID, first, last, last + 1))
        self.aborted = ((PID, first, last),)
        self.log.append(_batch(102, base_sequence=2, **txn), 1, validated=True)
        self.log.append(_marker(True), 1, validated=True)
        for i in range(24, 40):
            self.log.append(_batch(i), 1)
        self.log.flush()
        closed = self.log.closed_segments()
        for files in closed:
            copy_segment(
                self.store,
                self.partition,
                files,
                from_offset=files.base_offset,
                leader_epoch=1,
                index_interval_bytes=256,
            )
        self.segments = tuple(read_metadata(self.store, self.partition)[0].finished())
        assert len(self.segments) >= 4

    def rows(self, start: int, end: int, read_committed: bool = False) -> list[tuple[int, bytes]]:
        """(offset, value) of the log's records in [start, end), read locally."""
        data = self.log.read(0, 1 << 24)
        cols = records.new_columns()
        aborted = records.AbortedTransactions((p, f) for p, f, _ in self.aborted)
        records.decode_into(data, cols, start, end, aborted=aborted if read_committed else None)
        return _pairs(records.to_arrow(cols, TOPIC, 0, False))


def _pairs(batch: pa.RecordBatch | pa.Table) -> list[tuple[int, bytes]]:
    return list(
        zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True)
    )


@pytest.fixture
def copied(tmp_path: Path) -> Iterator[Copied]:
    c = Copied(tmp_path)
    yield c
    c.log.close()


def _read(
    copied: Copied, ranges: list[OffsetRange], read_committed: bool, **kw: object
) -> list[tuple[int, bytes]]:
    """Every range's rows: remote ones from the store, the rest from the log."""
    reader = RemoteReader(copied.store, ByteLRU())
    out: list[tuple[int, bytes]] = []
    for r in ranges:
        if isinstance(r, RemoteRange):
            level = READ_COMMITTED if read_committed else 0
            for batch in read_remote(r, reader=reader, isolation_level=level, max_bytes=700, **kw):  # type: ignore[arg-type]
                out += _pairs(batch)
        else:
            out += copied.rows(r.start, r.end, read_committed)
    return out


@pytest.mark.parametrize("read_committed", [False, True])
@pytest.mark.parametrize("local_start_at", ["mid-segment", "segment base"])
def test_split_read_returns_exactly_the_logs_records(
    copied: Copied, read_committed: bool, local_start_at: str
) -> None:
    segs = copied.segments
    aborted = copied.aborted  # begins in the second segment, its marker ends the third
    if local_start_at == "mid-segment":
        local_start = segs[2].base_offset + 2
    else:  # the marker only in the local tier, as the leader's answer names it (learn)
        local_start = segs[2].base_offset
        aborted = tuple((pid, first, IN_LOCAL_TIER) for pid, first, _ in aborted)
    remote = RemoteLog("topicid", local_start, segs, aborted if read_committed else ())
    tiers = Tiers(STORE, {(TOPIC, 0): remote})
    end = copied.log.log_end_offset
    for start in (segs[0].base_offset, segs[0].base_offset + 4, segs[1].base_offset + 1):
        ranges = tiers.split([OffsetRange(TOPIC, 0, start, end, (0,))])
        assert sum(isinstance(r, RemoteRange) for r in ranges) >= 1
        got = _read(copied, ranges, read_committed)
        want = copied.rows(start, end, read_committed)
        assert got == want
        assert [o for o, _ in got] == sorted({o for o, _ in got})  # none twice
    if read_committed:  # the aborted transaction's records are gone, the committed one's kept
        values = {v for _, v in copied.rows(0, end, True)}
        assert not any(v.startswith((b"v100-", b"v101-")) for v in values)
        assert any(v.startswith(b"v102-") for v in values)


def _header_batch(base: int, count: int) -> bytes:
    recs = [Record(None, b"x", 0) for _ in range(count)]
    return build_batch(recs, base_offset=base)


def test_span_checks() -> None:
    seg = _segment(10, 19)
    assert check_span([_header_batch(10, 3), _header_batch(13, 2)], seg, 11, None) == 15
    assert check_span([_header_batch(15, 5)], seg, 15, 15) == 20
    with pytest.raises(RemoteSpanError, match="past remote segment"):
        check_span([_header_batch(18, 3)], seg, 18, None)
    with pytest.raises(RemoteSpanError, match="due"):
        check_span([_header_batch(10, 3), _header_batch(14, 2)], seg, 10, None)
    with pytest.raises(RemoteSpanError, match="began with"):
        check_span([_header_batch(13, 2)], seg, 12, None)
    with pytest.raises(RemoteSpanError, match="due"):
        check_span([_header_batch(16, 2)], seg, 16, 15)
    with pytest.raises(RemoteSpanError, match="no batch"):
        check_span([], seg, 16, None)


def _whole(copied: Copied, segment: RemoteSegment) -> RemoteRange:
    """All of ``segment``, as a remote range of the copied partition."""
    return RemoteRange(
        TOPIC,
        0,
        segment.base_offset,
        segment.next_offset,
        (),
        store=STORE,
        topic_id=copied.partition.topic_id,
        segment=segment,
    )


def test_a_segment_entry_that_lies_about_its_end_serves_nothing(copied: Copied) -> None:
    seg = copied.segments[0]
    short = msgspec.structs.replace(seg, end_offset=seg.end_offset - 1)
    r = _whole(copied, short)
    # The manifest names another segment than the entry (RemoteReader's check).
    with pytest.raises(CorruptRemoteObjectError, match="another segment"):
        _read(copied, [r], False)


def test_a_corrupt_batch_fails_its_crc(copied: Copied) -> None:
    seg = copied.segments[1]
    key = copied.partition.object_key(seg, fmt.LOG)
    data = bytearray(copied.store.get(key).body)  # type: ignore[union-attr]
    data[-3] ^= 0x10
    copied.store.put(key, bytes(data))
    rr = _whole(copied, seg)
    with pytest.raises(CorruptRemoteObjectError, match="CRC"):
        _read(copied, [rr], False)


def test_a_deleted_segment_is_data_loss(copied: Copied) -> None:
    seg = copied.segments[1]
    for key in copied.store.list(copied.partition.segment_prefix(seg.base_offset, seg.segment_id)):
        copied.store.delete(key)
    rr = _whole(copied, seg)
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        _read(copied, [rr], False)
    assert _read(copied, [rr], False, fail_on_data_loss=False) == []


def test_learn_reads_the_remote_metadata_and_the_aborted_txn_indexes(copied: Copied) -> None:
    segs = copied.segments
    info = PartitionInfo(TOPIC, 0, 0, (0,), (0,), remote_topic_id=copied.partition.topic_id)
    plain = PartitionInfo("plain", 0, 0, (0,), (0,))
    local_start = segs[2].base_offset + 2
    bounds = {(TOPIC, 0): Bounds(local_start, 200), ("plain", 0): Bounds(0, 9)}
    tiers = learn([info, plain], bounds, location=STORE, store=copied.store)
    assert tiers.store == STORE and list(tiers.logs) == [(TOPIC, 0)]
    assert tiers.logs[(TOPIC, 0)] == RemoteLog(copied.partition.topic_id, local_start, segs)
    # Below a local log start past the ABORT marker, the remote indexes name the transaction.
    past = RemoteLog("id", segs[-1].next_offset, segs)
    assert _remote_aborted(RemoteReader(copied.store), copied.partition, past) == copied.aborted
    # Below the segment holding it, the marker is in the local tier: none of them names it.
    below = RemoteLog("id", segs[2].base_offset, segs)
    assert _remote_aborted(RemoteReader(copied.store), copied.partition, below) == ()
