"""Log.batch_headers: the header-only walk a replica rebuilds its producer state from.

Proves it yields every stored batch's header in log order across segments (also after a
reopen, i.e. recovery), jumps over bodies larger than its read chunk, and carries the
idempotent producer fields exactly as the producer wrote them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raylog.storage.batch import Record, build_batch
from raylog.storage.log import Log, LogConfig, reads

SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=256)


def _batch(i: int, size: int = 40) -> bytes:
    records = [Record(None, bytes([i % 256]) * size, 1_000 + i)] * (1 + i % 3)
    return build_batch(records, producer_id=9, producer_epoch=2, base_sequence=i * 10)


def test_batch_headers_walk_every_segment_in_order(tmp_path: Path) -> None:
    with Log.open(tmp_path / "t-0", SMALL) as log:
        infos = [log.append(_batch(i), 3) for i in range(30)]
        assert log.segment_count > 3
        log.flush()
        headers = list(log.batch_headers())
    assert [h.base_offset for h in headers] == [info.base_offset for info in infos]
    assert [(h.producer_id, h.producer_epoch, h.base_sequence) for h in headers] == [
        (9, 2, i * 10) for i in range(30)
    ]
    assert {h.partition_leader_epoch for h in headers} == {3}
    with Log.open(tmp_path / "t-0", SMALL) as reopened:
        assert list(reopened.batch_headers()) == headers


def test_batch_headers_jump_over_bodies_larger_than_a_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "HEADER_SCAN_CHUNK_BYTES", 100)
    with Log.open(tmp_path / "t-0", LogConfig()) as log:
        for i in range(5):
            log.append(_batch(i, size=500), 0)
        headers = list(log.batch_headers())
        assert [h.base_sequence for h in headers] == [0, 10, 20, 30, 40]
        assert headers[-1].next_offset == log.log_end_offset
