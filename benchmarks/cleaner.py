"""Log compaction: how fast one cleaning pass goes, and what it costs in memory.

Builds a log (real files, fsync'd) of ``--mib`` MiB of keyed records in batches of
``--per-batch`` records, ``--keys`` distinct keys written round-robin (so nearly every record
is superseded), then runs one ``Log.clean`` pass over it and reports:

- MiB of log and records cleaned per second of wall time and per CPU-second (the pass runs in
  one thread: decoding every record is Python work);
- bytes before and after, records removed;
- how much the process's resident memory grew during the pass (the offset map, buffers);
- how late this process's asyncio event loop wakes up from a 1 ms sleep while a pass runs:
  idle, with the rewrite in a thread of this process (it holds the GIL), and with it in a
  child process (``raylog.storage.cleaner_process``, what replicas do).

Shapes: ``value100`` (100-byte values, uncompressed), ``value1000`` and ``value100_lz4``.

    .venv/bin/python benchmarks/cleaner.py [--mib 64] [--keys 10000] [--per-batch 100]

Prints one JSON document: ``shapes``, per shape ``records``, ``mib_before``, ``mib_after``,
``records_removed``, ``wall_s``, ``mib_per_s``, ``mib_per_cpu_s``, ``records_per_cpu_s`` and
``rss_growth_mib``; ``event_loop_lag_during_a_pass`` with ``idle``, ``pass_in_thread`` and
``pass_in_child``, each ``samples``, ``p50_ms`` and ``p99_ms`` (how late past 1 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from raylog.storage import batch as rb
from raylog.storage.cleaner_process import run_in_child
from raylog.storage.compression import CODEC_LZ4, compress
from raylog.storage.log import Log, LogConfig

BASE_TS = 1_700_000_000_000
_HOUR_MS = 3_600_000


def _batch(
    first: int, count: int, keys: int, value_bytes: int, codec: int, ts: int = BASE_TS
) -> bytes:
    records = [
        rb.Record(b"key-%08d" % ((first + i) % keys), os.urandom(value_bytes), ts + i)
        for i in range(count)
    ]
    plain = bytearray(rb.build_batch(records))
    if not codec:
        return bytes(plain)
    body = compress(codec, bytes(plain[rb.HEADER_SIZE :]))
    buf = bytearray(plain[: rb.HEADER_SIZE] + body)
    rb.HEADER.pack_into(
        buf,
        0,
        0,
        len(buf) - rb.LOG_OVERHEAD,
        -1,
        rb.MAGIC,
        0,
        codec,
        count - 1,
        ts,
        ts + count - 1,
        -1,
        -1,
        -1,
        count,
    )
    buf[rb.CRC_POS : rb.CRC_POS + 4] = rb.compute_crc(buf, 0, len(buf)).to_bytes(4, "big")
    return bytes(buf)


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_shape(
    root: Path, mib: int, keys: int, per_batch: int, value_bytes: int, codec: int
) -> dict:
    directory = root / f"log-{value_bytes}-{codec}"
    first = _build(directory, mib, keys, per_batch, value_bytes, codec)
    log = Log.open(directory, LogConfig(segment_bytes=16 << 20, cleanup_policy="compact"))
    try:
        rss0 = _rss_mib()
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        result = log.clean(BASE_TS + 3 * _HOUR_MS, log.high_watermark, force=True)
        wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
        rss = _rss_mib() - rss0
    finally:
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
    assert result is not None
    mib_in = result.bytes_before / (1 << 20)
    return {
        "records": first,
        "mib_before": round(mib_in, 1),
        "mib_after": round(result.bytes_after / (1 << 20), 2),
        "records_removed": result.records_removed,
        "wall_s": round(wall, 2),
        "mib_per_s": round(mib_in / wall, 1),
        "mib_per_cpu_s": round(mib_in / cpu, 1),
        "records_per_cpu_s": round(first / cpu),
        "rss_growth_mib": round(rss, 1),
    }


def _build(
    directory: Path, mib: int, keys: int, per_batch: int, value_bytes: int, codec: int
) -> int:
    """A compacted log of ``mib`` MiB, everything but its last record cleanable; returns the
    number of records."""
    config = LogConfig(
        segment_bytes=16 << 20,
        segment_ms=_HOUR_MS,
        cleanup_policy="compact",
    )
    with Log.open(directory, config) as log:
        written = 0
        first = 0
        while written < mib << 20:
            data = _batch(first, per_batch, keys, value_bytes, codec)
            log.append(data, 0)
            written += len(data)
            first += per_batch
        # A record an hour later rolls a new active segment: everything before is cleanable.
        log.append(_batch(first, 1, keys, value_bytes, codec, BASE_TS + 2 * _HOUR_MS), 0)
        log.flush()
        log.checkpoint_high_watermark(log.log_end_offset)
    return first


async def _lag_while(busy: threading.Thread | None, seconds: float) -> dict[str, float]:
    """How late a 1 ms asyncio.sleep wakes up (ms) while ``busy`` runs (or for ``seconds``)."""
    lates: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and (busy is None or busy.is_alive()):
        start = time.perf_counter()
        await asyncio.sleep(0.001)
        lates.append((time.perf_counter() - start) * 1000 - 1.0)
    lates.sort()
    return {
        "samples": len(lates),
        "p50_ms": round(lates[len(lates) // 2], 2),
        "p99_ms": round(lates[int(len(lates) * 0.99)], 2),
    }


def loop_lag(root: Path, mib: int, keys: int, per_batch: int) -> dict[str, Any]:
    """Event-loop wake-up lag of this process while a pass runs in one of its threads (the
    rewrite inline: it holds the GIL) and while the rewrite runs in a child process (what a
    replica does)."""
    out: dict[str, Any] = {}
    for name, runner in (("idle", None), ("pass_in_thread", None), ("pass_in_child", run_in_child)):
        directory = root / f"lag-{name}"
        _build(directory, mib, keys, per_batch, 100, 0)
        log = Log.open(directory, LogConfig(segment_bytes=16 << 20, cleanup_policy="compact"))
        try:
            thread = None
            if name != "idle":
                thread = threading.Thread(
                    target=log.clean,
                    args=(BASE_TS + 3 * _HOUR_MS, log.high_watermark),
                    kwargs={"force": True, "runner": runner},
                )
                thread.start()
            out[name] = asyncio.run(_lag_while(thread, 2.0 if thread is None else 600.0))
            if thread is not None:
                thread.join()
        finally:
            log.close()
            shutil.rmtree(directory, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--per-batch", type=int, default=100)
    parser.add_argument("--dir", default=None, help="where the logs go (default: a temp dir)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="raylog-cleaner-", dir=args.dir))
    shapes: dict[str, Any] = {}
    try:
        for name, value_bytes, codec in (
            ("value100", 100, 0),
            ("value1000", 1000, 0),
            ("value100_lz4", 100, CODEC_LZ4),
        ):
            shapes[name] = run_shape(root, args.mib, args.keys, args.per_batch, value_bytes, codec)
        lag = loop_lag(root, args.mib, args.keys, args.per_batch)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "benchmark": "cleaner",
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "mib": args.mib,
                "keys": args.keys,
                "per_batch": args.per_batch,
                "shapes": shapes,
                "event_loop_lag_during_a_pass": lag,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
