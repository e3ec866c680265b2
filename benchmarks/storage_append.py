"""Append + fsync throughput and latency of raylog's Log against the raw disk, one writer.

For 16 KiB, 256 KiB and 1 MiB batches it measures, each for ``--seconds`` (in four
interleaved slices, so that both cases see the same disk conditions):

- ``raw``: os.write + os.fdatasync of the same bytes to a plain file (the hardware's ceiling);
- ``log``: Log.append then Log.flush per batch (a replica's durability at flush.messages=1
  with no other append to share the fsync).

It also measures CRC-32C speed (checked on every read). Everything runs in a temporary
directory that is removed afterwards.

    .venv/bin/python benchmarks/storage_append.py [--seconds 2] [--dir /path/on/the/disk/to/test]

Prints one JSON document: ``seconds_per_case``, ``machine``, ``crc32c_gb_per_s``, ``goal`` and
``results``, one per batch size: ``batch_bytes``, ``raw`` and ``log`` (each ``ops``,
``mb_per_s``, ``p50_ms`` and ``p99_ms`` per append; ``log`` also ``fsyncs_per_append``) and
``log_vs_raw`` (the ratio of their MB/s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import crc32c

from raylog.storage import Log, LogConfig
from raylog.storage.batch import Record, build_batch

SIZES = [16 << 10, 256 << 10, 1 << 20]
# Bound the disk used: files are rotated / segments deleted past these sizes.
RAW_FILE_BYTES_MAX = 256 << 20
LOG_SEGMENT_BYTES = 128 << 20
LOG_RETENTION_BYTES = 256 << 20
SLICES = 4


def make_batch(size: int) -> bytes:
    """One-record batch of exactly ``size`` bytes."""
    probe = build_batch([Record(None, b"", 0)])
    value_size = size - len(probe) - 4  # the value length varint grows by up to 3 bytes
    for extra in range(8):
        data = build_batch([Record(None, b"x" * (value_size + extra), 0)])
        if len(data) == size:
            return data
    return build_batch([Record(None, b"x" * value_size, 0)])


class Samples:
    """Measurements of one case, accumulated over interleaved slices."""

    def __init__(self) -> None:
        self.latencies_s: list[float] = []
        self.bytes = 0
        self.elapsed_s = 0.0
        self.fsyncs = 0
        self.appends = 0

    def summary(self) -> dict[str, Any]:
        result = summarize(self.latencies_s, self.bytes, self.elapsed_s)
        if self.appends:
            result["fsyncs_per_append"] = round(self.fsyncs / self.appends, 3)
        return result


def summarize(latencies_s: list[float], total_bytes: int, elapsed_s: float) -> dict[str, Any]:
    ordered = sorted(latencies_s)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "ops": len(ordered),
        "mb_per_s": round(total_bytes / elapsed_s / 1e6, 1),
        "p50_ms": round(statistics.median(ordered) * 1e3, 3),
        "p99_ms": round(p99 * 1e3, 3),
    }


def bench_raw(directory: Path, data: bytes, seconds: float, out: Samples) -> None:
    path = directory / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    latencies: list[float] = []
    written = 0
    file_bytes = 0
    start = time.perf_counter()
    deadline = start + seconds
    try:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            os.write(fd, data)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - t0)
            written += len(data)
            file_bytes += len(data)
            if file_bytes >= RAW_FILE_BYTES_MAX:  # rotate: appends stay appends
                os.close(fd)
                os.unlink(path)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
                file_bytes = 0
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    out.latencies_s += latencies
    out.bytes += written
    out.elapsed_s += elapsed


def bench_log(directory: Path, data: bytes, seconds: float, out: Samples) -> None:
    config = LogConfig(
        segment_bytes=LOG_SEGMENT_BYTES,
        retention_bytes=LOG_RETENTION_BYTES,
        retention_ms=-1,
        max_message_bytes=max(len(data), 1048588),
    )
    log_dir = directory / f"log-{len(data)}"
    log = Log.open(log_dir, config)
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        log.append(data, 0)
        log.flush()
        latencies.append(time.perf_counter() - t0)
        if len(latencies) % 32 == 0:
            log.enforce_retention(now_ms=0)
    elapsed = time.perf_counter() - start
    out.latencies_s += latencies
    out.bytes += len(latencies) * len(data)
    out.elapsed_s += elapsed
    out.fsyncs += log.stats.fsyncs
    out.appends += log.stats.appends
    log.close()
    shutil.rmtree(log_dir)


def bench_crc(size: int = 1 << 20, rounds: int = 200) -> float:
    buf = os.urandom(size)
    start = time.perf_counter()
    for _ in range(rounds):
        crc32c.crc32c(buf)
    return round(size * rounds / (time.perf_counter() - start) / 1e9, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of each case")
    parser.add_argument("--dir", default=None, help="parent of the temporary directory")
    args = parser.parse_args()
    if not 0 < args.seconds <= 60:
        parser.error("--seconds must be in (0, 60]")
    directory = Path(tempfile.mkdtemp(prefix="raylog-bench-", dir=args.dir))
    try:
        results = []
        for size in SIZES:
            data = make_batch(size)
            samples = {"raw": Samples(), "log": Samples()}
            # Interleave short slices so that both cases see the same (shared, noisy) disk
            # conditions rather than one case getting a quiet moment.
            slice_s = args.seconds / SLICES
            for _ in range(SLICES):
                bench_raw(directory, data, slice_s, samples["raw"])
                bench_log(directory, data, slice_s, samples["log"])
            raw, log = samples["raw"].summary(), samples["log"].summary()
            results.append(
                {
                    "batch_bytes": len(data),
                    "raw": raw,
                    "log": log,
                    "log_vs_raw": round(log["mb_per_s"] / raw["mb_per_s"], 3),
                }
            )
        document = {
            "benchmark": "storage_append",
            "seconds_per_case": args.seconds,
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "filesystem_dir": str(directory.parent),
            },
            "crc32c_gb_per_s": bench_crc(),
            "goal": "log_vs_raw >= 0.8 at 1 MiB",
            "results": results,
        }
        print(json.dumps(document, indent=2))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
