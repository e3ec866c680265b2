"""Batches and logs for the Log's tests: a small segment size, batches tagged by key and
value, a log filled with them, the offsets a read spans, and the files of a log's directory."""

from __future__ import annotations

from pathlib import Path

from raylog.storage import Log, LogConfig
from raylog.storage import batch as rb
from raylog.storage.batch import Record, build_batch

SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=256)


def batch(n: int = 2, ts: int = 1_000, size: int = 40, tag: int = 0) -> bytes:
    return build_batch([Record(b"k%d" % tag, bytes([tag % 256]) * size, ts + i) for i in range(n)])


def offsets(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for _, h in rb.iter_batches(data)]


def fill(log: Log, count: int, n: int = 2, epoch: int = 0, ts: int = 1_000) -> None:
    for i in range(count):
        log.append(batch(n, ts + i * 10, tag=i), epoch)


def last_segment(directory: Path) -> Path:
    return sorted(directory.glob("*.log"))[-1]


def fill_and_flip_a_bit_in_the_first_segment(log_dir: Path) -> None:
    """30 batches in SMALL segments, then one bit flipped inside the first segment's last
    batch's records."""
    with Log.open(log_dir, SMALL) as log:
        fill(log, 30)
    first = sorted(log_dir.glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[len(data) - 3] ^= 0x01  # inside the last batch's records
    first.write_bytes(bytes(data))


def pread(path: str, position: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(position)
        data = f.read(size)
    assert len(data) == size
    return data
