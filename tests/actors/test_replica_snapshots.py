"""A replica's snapshots on a real Log (``actors/producer_snapshots.py``), without Ray.

What they prove: after a roll the taker writes one snapshot at the durable log end (and
checkpoints the high watermark first), not again until the next roll; a reopened log starts
from it, reading only the headers after it, to the state the whole log rebuilds; a corrupt
newest snapshot is deleted and the older one used; a snapshot above the starting high
watermark is passed over.
"""

from __future__ import annotations

from pathlib import Path

from support.log_data import SMALL

from raylog.actors.producer_snapshots import SnapshotTaker, start_state
from raylog.actors.replica_port import batch_meta
from raylog.actors.replication.ready import Ready
from raylog.actors.replication.replica_log import ReplicaLog
from raylog.storage.batch import Record, build_batch, end_txn_marker_record
from raylog.storage.log import Log


def _write(log: Log, first_seq: int, count: int) -> None:
    """Producer 3 idempotent, producer 4 transactional (an abort every fourth batch)."""
    for i in range(first_seq, first_seq + count):
        log.append(build_batch([Record(None, b"v" * 50, 1_000)], producer_id=3, base_sequence=i), 0)
        log.append(
            build_batch(
                [Record(None, b"t" * 50, 1_000)],
                producer_id=4,
                base_sequence=i,
                transactional=True,
            ),
            0,
        )
        if i % 4 == 3:
            marker = end_txn_marker_record(False, 2, 1_000)
            log.append(
                build_batch([marker], producer_id=4, transactional=True, control=True),
                0,
                validated=True,
            )
    log.flush()


def _replica_log(log: Log) -> tuple[ReplicaLog, int]:
    snapshot, tail = start_state(log)
    rl = ReplicaLog(
        log.log_start_offset,
        log.log_end_offset,
        [(0, 0)],
        log.high_watermark,
        tail,
        snapshot,
    )
    return rl, snapshot.offset if snapshot else -1


def _full(log: Log) -> ReplicaLog:
    headers = (batch_meta(h, m) for h, m in log.producer_batch_headers())
    return ReplicaLog(
        log.log_start_offset, log.log_end_offset, [(0, 0)], log.high_watermark, headers
    )


def _state(rl: ReplicaLog) -> tuple[object, ...]:
    return rl.producers.export(), rl.txns.export(), rl.last_stable_offset


def test_a_restart_starts_from_the_snapshot_taken_after_a_roll(tmp_path: Path) -> None:
    with Log.open(tmp_path / "t-0", SMALL) as log:
        _write(log, 0, 20)
        rl, offset = _replica_log(log)
        assert offset == -1
        rl.set_high_watermark(log.log_end_offset - 3, Ready())
        taker = SnapshotTaker(log)
        assert taker.due() and taker.take(rl)
        taker_offset = taker.last_offset
        assert taker_offset == log.log_end_offset
        assert log.high_watermark == rl.high_watermark  # checkpointed first
        assert not taker.due()
        _write(log, 20, 10)
    with Log.open(tmp_path / "t-0", SMALL) as log:
        restarted, offset = _replica_log(log)
        assert offset == taker_offset
        assert _state(restarted) == _state(_full(log))
        assert restarted.txns.aborted  # the aborted list came through the snapshot


def test_a_corrupt_snapshot_is_deleted_and_an_older_one_used(tmp_path: Path) -> None:
    with Log.open(tmp_path / "t-0", SMALL) as log:
        _write(log, 0, 10)
        rl, _ = _replica_log(log)
        log.write_producer_snapshot(log.log_end_offset, rl.snapshot() or b"")
        older = log.log_end_offset
        _write(log, 10, 10)
        log.write_producer_snapshot(log.log_end_offset, b"RLPS\x00\x01junk")
        newest = log.log_end_offset
    with Log.open(tmp_path / "t-0", SMALL) as log:
        restarted, offset = _replica_log(log)
        assert offset == older
        assert log.producer_snapshot_offsets() == [older]
        assert newest not in log.producer_snapshot_offsets()
        assert _state(restarted) == _state(_full(log))


def test_a_snapshot_above_the_starting_high_watermark_is_passed_over(tmp_path: Path) -> None:
    with Log.open(tmp_path / "t-0", SMALL) as log:
        _write(log, 0, 10)
        rl, _ = _replica_log(log)
        rl.set_high_watermark(log.log_end_offset, Ready())  # the checkpoint stays at 0
        log.write_producer_snapshot(log.log_end_offset, rl.snapshot() or b"")
    with Log.open(tmp_path / "t-0", SMALL) as log:
        restarted, offset = _replica_log(log)
        assert offset == -1
        assert _state(restarted) == _state(_full(log))
