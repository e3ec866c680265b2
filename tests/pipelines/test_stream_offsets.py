"""The streaming source's offset decisions, without Ray or Spark (raylog.pipelines.stream_offsets).

Proves: offsets round-trip through Spark's JSON form; the initial offset resolves earliest,
latest and per-partition -2/-1; the next end is the high watermark, never moves back, respects
the Trigger.AvailableNow target and spreads maxOffsetsPerTrigger over partitions by backlog
(exactly the limit, every partition with backlog progressing when the limit allows); a
partition created while the query runs starts from 0; offsets below the log start fail naming
topic, partition and offsets, or are skipped with failOnDataLoss off; a vanished partition or
an offset that went back is data loss too; ranges split for minPartitions.
"""

from __future__ import annotations

import pytest

from raylog.pipelines import stream_offsets as so
from raylog.pipelines.catalog import PartitionInfo
from raylog.pipelines.reading import EARLIEST, LATEST, Bounds, DataLossError, OffsetRange


def _info(p: int, topic: str = "t") -> PartitionInfo:
    return PartitionInfo(topic, p, leader_id=1, isr=(1, 2, 3), replica_ids=(1, 2, 3))


BOUNDS = {("t", 0): Bounds(10, 100), ("t", 1): Bounds(0, 40)}
INFOS = {tp: _info(tp[1]) for tp in BOUNDS}


def test_json_form_round_trips_with_string_partitions() -> None:
    positions = {("t", 0): 5, ("t", 1): 7, ("u", 10): 0}
    form = so.to_json(positions)
    assert form == {"t": {"0": 5, "1": 7}, "u": {"10": 0}}
    assert so.from_json(form) == positions
    with pytest.raises(ValueError, match="stream offset"):
        so.from_json({"t": {"x": 1}})


def test_initial_offsets() -> None:
    infos = list(INFOS.values())
    assert so.initial(infos, BOUNDS, EARLIEST) == {("t", 0): 10, ("t", 1): 0}
    assert so.initial(infos, BOUNDS, LATEST) == {("t", 0): 100, ("t", 1): 40}
    assert so.initial(infos, BOUNDS, {"t": {0: -1, 1: 3}}) == {("t", 0): 100, ("t", 1): 3}
    assert so.initial(infos, BOUNDS, {"t": {1: -1}}) == {("t", 0): 10, ("t", 1): 40}


def test_latest_is_the_high_watermark_and_never_moves_back() -> None:
    assert so.latest({("t", 0): 10, ("t", 1): 0}, BOUNDS) == {("t", 0): 100, ("t", 1): 40}
    # A new leader may report an older HW for a while: the end stays where it was.
    assert so.latest({("t", 0): 120, ("t", 1): 0}, BOUNDS) == {("t", 0): 120, ("t", 1): 40}


def test_new_partitions_start_from_zero_and_gone_ones_keep_their_offset() -> None:
    end = so.latest({("t", 0): 10, ("old", 0): 5}, BOUNDS)
    assert end == {("t", 0): 100, ("t", 1): 40, ("old", 0): 5}


def test_available_now_target_caps_and_excludes_later_partitions() -> None:
    start = {("t", 0): 10}
    end = so.latest(start, BOUNDS, target={("t", 0): 50})
    assert end == {("t", 0): 50, ("t", 1): 0}


@pytest.mark.parametrize("max_rows", [1, 3, 7, 50, 129, 130, 1000])
def test_max_rows_spreads_by_backlog(max_rows: int) -> None:
    start = {("t", 0): 10, ("t", 1): 0}
    end = so.latest(start, BOUNDS, max_rows=max_rows)
    taken = {tp: end[tp] - start[tp] for tp in start}
    assert sum(taken.values()) == min(max_rows, 90 + 40)
    assert all(0 <= taken[tp] <= BOUNDS[tp].high_watermark - start[tp] for tp in start)
    if max_rows >= 2:
        assert all(n > 0 for n in taken.values())
    if max_rows == 130:
        assert taken == {("t", 0): 90, ("t", 1): 40}
    with pytest.raises(ValueError, match="positive"):
        so.latest({("t", 0): 0}, {("t", 0): Bounds(0, 5)}, max_rows=0)


def test_ranges_of_a_micro_batch() -> None:
    start = {("t", 0): 10, ("t", 1): 40}
    end = {("t", 0): 60, ("t", 1): 40, ("t", 2): 5}
    infos = {**INFOS, ("t", 2): _info(2)}
    bounds = {**BOUNDS, ("t", 2): Bounds(0, 5)}
    got = so.ranges(start, end, infos, bounds)
    assert got == [
        OffsetRange("t", 0, 10, 60, (2, 3, 1)),
        OffsetRange("t", 2, 0, 5, (2, 3, 1)),
    ]
    split = so.ranges(start, end, infos, bounds, min_partitions=4)
    assert len(split) == 4
    assert sum(r.size for r in split) == 55


def test_offsets_below_the_log_start_fail_or_are_skipped() -> None:
    start, end = {("t", 0): 3}, {("t", 0): 60}
    with pytest.raises(DataLossError, match=r"t-0: offsets 3\.\.9 .*log start offset 10"):
        so.ranges(start, end, INFOS, BOUNDS)
    assert so.ranges(start, end, INFOS, BOUNDS, fail_on_data_loss=False) == [
        OffsetRange("t", 0, 10, 60, (2, 3, 1))
    ]
    # The whole micro-batch below the log start: nothing to read.
    assert so.ranges(start, {("t", 0): 8}, INFOS, BOUNDS, fail_on_data_loss=False) == []


def test_gone_partition_and_offsets_going_back_are_data_loss() -> None:
    start, end = {("gone", 0): 3, ("t", 0): 50}, {("gone", 0): 9, ("t", 0): 40}
    with pytest.raises(DataLossError, match="gone-0: the partition is gone"):
        so.ranges(start, end, INFOS, BOUNDS)
    with pytest.raises(DataLossError, match="went back from 50 to 40"):
        so.ranges({("t", 0): 50}, {("t", 0): 40}, INFOS, BOUNDS)
    assert so.ranges(start, end, INFOS, BOUNDS, fail_on_data_loss=False) == []
