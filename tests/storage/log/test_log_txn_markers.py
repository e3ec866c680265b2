"""Recovery of transaction state: a replica rebuilds its open transactions, aborted list and
LSO from ``Log.producer_batch_headers`` after a restart.

Proves the header walk gives each transaction marker's type and coordinator epoch (reading a
marker's one record, also when the marker straddles the walk's read chunk), skips batches
without a producer, and that a ``PartitionReplica`` built from it after a reopen holds exactly
the transaction state the log implies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raylog.actors.replica_port import batch_meta
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.txn_state import AbortedTxn
from raylog.storage.batch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    EndTxnMarker,
    Record,
    build_batch,
    end_txn_marker_record,
)
from raylog.storage.log import Log, LogConfig, reads

SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=256)


def _data(pid: int, seq: int, size: int = 40) -> bytes:
    records = [Record(None, b"v" * size, 1_000)]
    return build_batch(
        records, producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=pid >= 0
    )


def _marker(pid: int, commit: bool, coordinator_epoch: int) -> bytes:
    record = end_txn_marker_record(commit, coordinator_epoch, 2_000)
    return build_batch(
        [record], producer_id=pid, producer_epoch=0, transactional=True, control=True
    )


def _write(log: Log) -> None:
    # 0 plain; 1..6 producer 5's transactions; producer 6's stays open from offset 4.
    for data in (
        _data(-1, -1),
        _data(5, 0),
        _data(5, 1),
        _marker(5, False, 3),  # 3: ABORT of [1, 3]
        _data(6, 0),
        _data(5, 2),
        _marker(5, True, 4),  # 6: COMMIT of [5, 6]
    ):
        log.append(data, 1, validated=True)  # markers: the replica writes them
    log.flush()


@pytest.mark.parametrize("chunk_bytes", [reads.HEADER_SCAN_CHUNK_BYTES, 150])
def test_restart_rebuilds_markers_from_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_bytes: int
) -> None:
    monkeypatch.setattr(reads, "HEADER_SCAN_CHUNK_BYTES", chunk_bytes)
    with Log.open(tmp_path / "t-0", SMALL) as log:
        _write(log)
    with Log.open(tmp_path / "t-0", SMALL) as log:
        scanned = list(log.producer_batch_headers())
        end = log.log_end_offset
    assert [h.base_offset for h, _ in scanned] == [1, 2, 3, 4, 5, 6]
    assert [m for _, m in scanned] == [
        None,
        None,
        EndTxnMarker(CONTROL_ABORT, 3),
        None,
        None,
        EndTxnMarker(CONTROL_COMMIT, 4),
    ]
    replica = PartitionReplica(
        0,
        log_end_offset=end,
        epoch_cache=[(1, 0)],
        high_watermark=end,
        producer_batches=(batch_meta(h, m) for h, m in scanned),
    )
    assert replica.txns.aborted == [AbortedTxn(5, 1, 3, 4)]
    assert replica.txns.open_spans() == {6: 4}
    assert replica.last_stable_offset == 4
    assert replica.txns.entry(5).coordinator_epoch == 4
