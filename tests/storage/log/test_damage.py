"""A log's damage (recovery.py step 5, log.py): a read that meets a batch failing its CRC-32C
records where the damage starts and never serves it; the next open cuts the log there (epochs
and HW with it) and reports the damage until the log ends at the repair offset again; a tail
cut below the checkpointed high watermark is damage too; a damaged first header drops the
whole segment; and the damage checkpoint survives a second open before the repair."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.log_data import SMALL, batch, fill, fill_and_flip_a_bit_in_the_first_segment

from raylog.storage import Log, LogConfig
from raylog.storage import batch as rb
from raylog.storage.log import DAMAGE_CHECKPOINT, Damage, DamagedBatchError


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))


def test_damage_merges_to_the_lower_cut_and_the_higher_repair() -> None:
    assert Damage(10, 20).merged(None) == Damage(10, 20)
    assert Damage(10, 20).merged(Damage(5, 15)) == Damage(5, 20)
    assert Damage(10, 20).merged(Damage(12, 30)) == Damage(10, 30)


def test_a_read_records_damage_in_an_inactive_segment_and_the_next_open_cuts_it(
    log_dir: Path,
) -> None:
    fill_and_flip_a_bit_in_the_first_segment(log_dir)
    with Log.open(log_dir, SMALL) as log:
        assert log.damage is None  # inactive segments pass recovery's cheap checks
        end = log.log_end_offset
        log.checkpoint_high_watermark(end)
        first = log.read(0, 1)
        with pytest.raises(DamagedBatchError, match="CRC") as caught:
            log.read(0, 1 << 20)
        damaged = caught.value.offset
        assert 0 < damaged < end
        assert log.damage == Damage(damaged, end)
        assert not log.clear_damage(), "the damaged batch is still in the log"
    assert (log_dir / DAMAGE_CHECKPOINT).exists()
    with Log.open(log_dir, SMALL) as log:
        assert log.log_end_offset == damaged
        assert log.high_watermark == damaged
        assert log.damage == Damage(damaged, end)
        assert log.read(0, 1) == first
        assert not log.clear_damage(), "committed records below the repair offset are missing"
    with Log.open(log_dir, SMALL) as log:  # a second open before the repair keeps it
        assert log.damage == Damage(damaged, end)
        fill(log, end - damaged, n=1)  # what a follower fetches back from its leader
        assert log.clear_damage()
        assert log.damage is None
    assert not (log_dir / DAMAGE_CHECKPOINT).exists()


def test_a_tail_cut_below_the_checkpointed_high_watermark_is_damage(log_dir: Path) -> None:
    config = LogConfig(index_interval_bytes=256)  # one segment: the active one
    with Log.open(log_dir, config) as log:
        fill(log, 20, epoch=1)
        fill(log, 10, epoch=2)
        log.checkpoint_high_watermark(log.log_end_offset)
        hw = log.log_end_offset
        whole = log.read(0, 1 << 20)
    pos, header = list(rb.iter_batches(whole))[5]
    _flip(sorted(log_dir.glob("*.log"))[0], pos + 70)
    with Log.open(log_dir, config) as log:
        assert log.log_end_offset == header.base_offset
        assert log.damage == Damage(header.base_offset, hw)
        assert [tuple(e) for e in log.epoch_entries] == [(1, 0)]
        assert log.high_watermark == header.base_offset
    with Log.open(log_dir, config) as log:  # the HW checkpoint may be rewritten lower meanwhile
        log.checkpoint_high_watermark(log.log_end_offset)
    with Log.open(log_dir, config) as log:
        assert log.damage == Damage(header.base_offset, hw)


def test_a_tail_cut_above_the_high_watermark_is_no_damage(log_dir: Path) -> None:
    config = LogConfig(index_interval_bytes=256)
    with Log.open(log_dir, config) as log:
        fill(log, 20)
        log.checkpoint_high_watermark(10)
        whole = log.read(0, 1 << 20)
    pos, _ = list(rb.iter_batches(whole))[15]
    _flip(sorted(log_dir.glob("*.log"))[0], pos + 70)
    with Log.open(log_dir, config) as log:
        assert log.damage is None


def test_a_damaged_first_header_drops_its_whole_segment(log_dir: Path) -> None:
    with Log.open(log_dir, SMALL) as log:
        fill(log, 30)
        log.checkpoint_high_watermark(log.log_end_offset)
        second = sorted(log_dir.glob("*.log"))[1]
        base = int(second.stem)
        assert log.read(0, 1)
    _flip(second, 16)  # the magic byte of its first batch
    with Log.open(log_dir, SMALL) as log:
        with pytest.raises(DamagedBatchError, match="header") as caught:
            log.read(base, 1)
        assert caught.value.offset == base
    with Log.open(log_dir, SMALL) as log:
        assert log.log_end_offset == base
        log.append(batch(), 0)  # goes on from there
        assert log.read(base, 1 << 20)
