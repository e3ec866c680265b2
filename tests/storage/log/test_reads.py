"""Reads of the Log: whole batches at every boundary and budget (against a reference), across
segments and index lookups, by timestamp, concurrently with appends and rolls, and the extents
a short-circuit reader reads the same batches from (headers only, CRCs left to the reader,
absolute paths)."""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

import pytest
from support.log_data import (
    SMALL,
    batch,
    fill,
    fill_and_flip_a_bit_in_the_first_segment,
    offsets,
    pread,
)

from raylog.storage import Log, LogConfig
from raylog.storage import batch as rb
from raylog.storage.errors import CorruptRecordError, KafkaStorageError, OffsetOutOfRangeError


def test_read_boundaries(small_log: Log) -> None:
    fill(small_log, 3, n=2)  # batches [0,1] [2,3] [4,5]
    leo = small_log.log_end_offset
    assert small_log.read(leo, 1000) == b""
    with pytest.raises(OffsetOutOfRangeError):
        small_log.read(leo + 1, 1000)
    with pytest.raises(OffsetOutOfRangeError):
        small_log.read(-1, 1000)
    # The batch holding the offset comes first, even when it starts before it.
    assert offsets(small_log.read(3, 1 << 20)) == [(2, 3), (4, 5)]
    # At least one batch, even when larger than max_bytes.
    assert offsets(small_log.read(0, 1)) == [(0, 1)]
    assert offsets(small_log.read(0, 0)) == [(0, 1)]
    one = len(small_log.read(0, 1))
    assert offsets(small_log.read(0, 2 * one)) == [(0, 1), (2, 3)]
    assert offsets(small_log.read(0, 2 * one - 1)) == [(0, 1)]
    # max_offset (the high watermark): never a batch whose last offset reaches it.
    assert offsets(small_log.read(0, 1 << 20, max_offset=4)) == [(0, 1), (2, 3)]
    assert offsets(small_log.read(0, 1 << 20, max_offset=5)) == [(0, 1), (2, 3)]
    assert small_log.read(4, 1 << 20, max_offset=4) == b""
    assert small_log.read(2, 1 << 20, max_offset=3) == b""
    assert offsets(small_log.read(0, 1 << 20, max_offset=100)) == [(0, 1), (2, 3), (4, 5)]


def test_multi_segment_reads_and_index_lookups(small_log: Log) -> None:
    fill(small_log, 60, n=3)
    assert small_log.segment_count > 10
    leo = small_log.log_end_offset
    everything = small_log.read(0, 1 << 30)
    assert offsets(everything) == [(i, i + 2) for i in range(0, leo, 3)]
    for offset in range(leo):
        got = offsets(small_log.read(offset, 1))
        first = offset - offset % 3
        assert got == [(first, first + 2)], offset
    # Index files of inactive segments use Kafka's entry sizes and point at batch starts.
    index_files = sorted(small_log.directory.glob("*.index"))
    assert index_files[0].name == "00000000000000000000.index"
    data = index_files[0].read_bytes()
    assert data and len(data) % 8 == 0
    assert len(sorted(small_log.directory.glob("*.timeindex"))[0].read_bytes()) % 12 == 0


def test_offset_for_timestamp(small_log: Log) -> None:
    for i in range(30):
        small_log.append(batch(2, ts=10_000 + 100 * i), 0)  # batch i: ts 10000+100i, +1
    assert small_log.offset_for_timestamp(0) == (10_001, 0)
    assert small_log.offset_for_timestamp(10_001) == (10_001, 0)
    assert small_log.offset_for_timestamp(10_002) == (10_101, 2)
    assert small_log.offset_for_timestamp(12_050) == (12_101, 42)
    assert small_log.offset_for_timestamp(12_901) == (12_901, 58)
    assert small_log.offset_for_timestamp(12_902) is None
    assert small_log.offset_for_timestamp(-1) == (-1, 60)
    assert small_log.offset_for_timestamp(-2) == (-1, 0)


def test_max_timestamp_batch_is_the_first_with_the_largest_timestamp(small_log: Log) -> None:
    """ListOffsets -3 (KIP-734): the first batch, above the log start, whose maxTimestamp is
    the log's largest, across segments and wherever it lies; a largest timestamp in a batch
    below the log start does not count."""
    assert small_log.max_timestamp_batch() is None
    stamps = [5_000, 9_000, 7_000, 9_000, 8_000] + [6_000] * 20 + [8_500]
    for ts in stamps:
        small_log.append(batch(2, ts=ts), 0)  # maxTimestamp ts + 1
    assert small_log.segment_count > 3
    assert small_log.max_timestamp_batch() == (9_001, 2)  # the first of two
    end = small_log.log_end_offset
    small_log.advance_log_start(3, end)  # inside the batch at 2, which still counts
    assert small_log.max_timestamp_batch() == (9_001, 3)
    small_log.advance_log_start(4, end)  # past it: the second one
    assert small_log.max_timestamp_batch() == (9_001, 6)
    small_log.advance_log_start(8, end)  # past both: the next largest, in a later segment
    assert small_log.max_timestamp_batch() == (8_501, 50)


def test_concurrent_reads_during_appends_and_rolls(small_log: Log) -> None:
    stop = threading.Event()
    failures: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                end = small_log.log_end_offset
                data = small_log.read(0, 1 << 20, max_offset=end)
                spans = offsets(data)
                expected = 0
                for base, last in spans:
                    assert base == expected
                    expected = last + 1
                assert expected <= end
        except BaseException as exc:
            failures.append(exc)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    fill(small_log, 150)
    stop.set()
    for t in readers:
        t.join(10)
    assert not failures
    assert small_log.segment_count > 10


def test_reads_match_a_reference_for_every_offset_and_budget(log_dir: Path) -> None:
    # Uneven batches and a small index interval: the index often points at batches before
    # the wanted one, which a read must skip without spending its byte budget on them.
    config = LogConfig(segment_bytes=700, index_interval_bytes=128)
    with Log.open(log_dir, config) as log:
        for i, n in enumerate([1, 1, 3, 2, 2, 5, 1, 4, 2, 3, 1, 1, 2, 6, 1]):
            log.append(batch(n=n, size=10 + 7 * i, tag=i), 0)
        everything = log.read(0, 1 << 20)
        spans = [(h, everything[p : p + h.size]) for p, h in rb.iter_batches(everything)]
        leo = log.log_end_offset
        runs_across_segments = 0
        for offset in range(leo + 1):
            for max_bytes in [*range(0, 400, 23), 1 << 20]:
                for max_offset in (None, offset, offset + 1, offset + 4, leo):
                    limit = leo if max_offset is None else min(max_offset, leo)
                    expected: list[bytes] = []
                    for h, data in spans:
                        if h.last_offset < offset:
                            continue
                        total = sum(len(d) for d in expected)
                        if h.last_offset >= limit or (expected and total + h.size > max_bytes):
                            break
                        expected.append(data)
                    got = log.read(offset, max_bytes, max_offset)
                    assert got == b"".join(expected), (offset, max_bytes, max_offset)
                    # The same batches one by one, as a replica's fetch answer takes them.
                    each = log.read_batches(offset, max_bytes, max_offset)
                    assert [bytes(b) for b in each] == expected, (offset, max_bytes, max_offset)
                    # The same batches where they lie on disk, in as few runs as they allow.
                    extents = log.read_extents(offset, max_bytes, max_offset)
                    assert b"".join(pread(*run) for run in extents.runs) == got
                    for (path, pos, size), (next_path, next_pos, _) in itertools.pairwise(
                        extents.runs
                    ):
                        assert (path, pos + size) != (next_path, next_pos)
                    spanned = offsets(got)
                    assert (extents.first_offset, extents.next_offset) == (
                        (spanned[0][0], spanned[-1][1] + 1) if spanned else (-1, -1)
                    )
                    runs_across_segments += len(extents.runs) > 1
        assert runs_across_segments


def test_extents_of_batches_larger_than_the_header_window_match_reads(log_dir: Path) -> None:
    # read_extents walks headers through a 16 KiB window: batches on both sides of its size,
    # so headers fall inside, at the edge of and beyond a window.
    config = LogConfig(segment_bytes=96 << 10, index_interval_bytes=4096)
    sizes = [100, 20_000, 5, 40_000, 16_300, 3, 9_000, 60_000, 1, 16_384, 200, 33_000]
    with Log.open(log_dir, config) as log:
        for i, size in enumerate(sizes * 2):
            log.append(batch(n=1 + i % 3, size=size, tag=i), 0)
        leo = log.log_end_offset
        for offset in range(leo + 1):
            for max_bytes in (0, 15_000, 70_000, 1 << 20):
                got = log.read(offset, max_bytes)
                extents = log.read_extents(offset, max_bytes)
                assert b"".join(pread(*run) for run in extents.runs) == got, (offset, max_bytes)
                spanned = offsets(got)
                assert (extents.first_offset, extents.next_offset) == (
                    (spanned[0][0], spanned[-1][1] + 1) if spanned else (-1, -1)
                )
        assert len({path for path, _, _ in log.read_extents(0, 1 << 30).runs}) > 2


def test_extents_leave_the_crc_to_the_reader(log_dir: Path) -> None:
    fill_and_flip_a_bit_in_the_first_segment(log_dir)
    with Log.open(log_dir, SMALL) as log:
        with pytest.raises(KafkaStorageError, match="CRC"):
            log.read(0, 1 << 20)
        extents = log.read_extents(0, 1 << 20)  # headers only: located all the same
        located = b"".join(pread(*run) for run in extents.runs)
    with pytest.raises(CorruptRecordError, match="CRC"):
        list(rb.iter_batches(located))


def test_extents_name_files_by_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with Log.open(Path("relative") / "topic-0", SMALL) as log:
        fill(log, 3)
        extents = log.read_extents(0, 1 << 20)
    monkeypatch.chdir("/")  # a reader elsewhere
    assert extents.runs and all(os.path.isabs(path) for path, _, _ in extents.runs)
    assert offsets(b"".join(pread(*run) for run in extents.runs)) == [(0, 1), (2, 3), (4, 5)]
