"""A replica's start-up: rebuilding producer state from the whole log, or from a snapshot.

Builds a log (real files, fsync'd) of ``--mib`` MiB of batches of ``--records`` records of
``--record-bytes`` bytes, from ``--producers`` idempotent producers taking turns, in segments
of ``--segment-mib`` MiB, then times, in the same run and on the same (page-cached) files:

- ``open``: ``Log.open`` (recovery: the last segment rescanned), the same for every case;
- ``full``: the state rebuild from every producer batch header (what a replica without a
  snapshot does, ``start_state`` finding none);
- ``snapshot_at_roll``: from a snapshot at the active segment's base offset (what the replica
  takes after a roll), replaying the active segment's headers;
- ``snapshot_at_end``: from a snapshot at the log end (nothing to replay).

Each rebuild is timed ``--repeats`` times (the best is reported) and checked to give the
state of the full rebuild. Everything runs in a temporary directory removed afterwards.

    .venv/bin/python benchmarks/replica_start.py [--mib 2048] [--producers 1000]

Prints one JSON document: the shape (``mib``, ``batches``, ``producers``, ``segments``),
``build_s``, ``open_s``, ``snapshot_bytes``, and per case ``rebuild_s`` and
``headers_replayed``; ``speedup_at_roll`` and ``speedup_at_end`` (full / snapshot).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from raylog.actors.producer_snapshots import start_state
from raylog.actors.replica_port import batch_meta
from raylog.actors.replication.replica_log import ReplicaLog
from raylog.storage import Log, LogConfig
from raylog.storage.batch import Record, build_batch


def build(directory: Path, args: argparse.Namespace) -> tuple[int, float]:
    """Write the log; returns its batch count and how long it took."""
    config = LogConfig(segment_bytes=args.segment_mib << 20)
    value = b"x" * args.record_bytes
    records = [Record(None, value, 1_000)] * args.records
    sequences = [0] * args.producers
    batches = 0
    began = time.perf_counter()
    with Log.open(directory, config) as log:
        while log.size_bytes < args.mib << 20:
            for _ in range(1000):
                pid = batches % args.producers
                data = build_batch(
                    records, producer_id=pid, producer_epoch=0, base_sequence=sequences[pid]
                )
                sequences[pid] += args.records
                log.append(data, 0, validated=True)
                batches += 1
            log.flush()
    return batches, time.perf_counter() - began


def rebuild(log: Log) -> tuple[ReplicaLog, float, int]:
    """The replica log a start builds, how long the rebuild took, headers replayed."""
    began = time.perf_counter()
    snapshot, tail = start_state(log)
    counted = []

    def counting(it: Any) -> Any:
        for meta in it:
            counted.append(1)
            yield meta

    rl = ReplicaLog(
        log.log_start_offset,
        log.log_end_offset,
        [(0, 0)],
        log.high_watermark,
        counting(tail),
        snapshot,
    )
    return rl, time.perf_counter() - began, len(counted)


def best(log: Log, repeats: int) -> tuple[ReplicaLog, float, int]:
    runs = [rebuild(log) for _ in range(repeats)]
    return runs[0][0], min(r[1] for r in runs), runs[0][2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--producers", type=int, default=1000)
    parser.add_argument("--records", type=int, default=1)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--segment-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where to put the temporary log")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="replica-start-", dir=args.dir))
    try:
        directory = root / "t-0"
        batches, build_s = build(directory, args)
        began = time.perf_counter()
        log = Log.open(directory, LogConfig(segment_bytes=args.segment_mib << 20))
        open_s = time.perf_counter() - began
        with log:
            full, full_s, full_headers = best(log, args.repeats)
            expected = (full.producers.export(), full.txns.export())
            # A snapshot at the last roll: the state of the batches below the active segment.
            roll_offset = log.active_segment_base_offset
            below = ReplicaLog(
                log.log_start_offset,
                roll_offset,
                [(0, 0)],
                0,
                (m for m in _metas(log) if m.base_offset < roll_offset),
            )
            data = below.snapshot()
            assert data is not None
            log.write_producer_snapshot(roll_offset, data)
            at_roll, roll_s, roll_headers = best(log, args.repeats)
            end_data = full.snapshot()
            assert end_data is not None
            log.write_producer_snapshot(log.log_end_offset, end_data)
            at_end, end_s, end_headers = best(log, args.repeats)
            for rl in (at_roll, at_end):
                assert (rl.producers.export(), rl.txns.export()) == expected
            result = {
                "machine": platform.machine(),
                "mib": args.mib,
                "batches": batches,
                "records_per_batch": args.records,
                "record_bytes": args.record_bytes,
                "producers": args.producers,
                "segments": log.segment_count,
                "build_s": round(build_s, 2),
                "open_s": round(open_s, 3),
                "snapshot_bytes": len(end_data),
                "full": {"rebuild_s": round(full_s, 3), "headers_replayed": full_headers},
                "snapshot_at_roll": {
                    "rebuild_s": round(roll_s, 3),
                    "headers_replayed": roll_headers,
                },
                "snapshot_at_end": {"rebuild_s": round(end_s, 4), "headers_replayed": end_headers},
                "speedup_at_roll": round(full_s / roll_s, 1),
                "speedup_at_end": round(full_s / end_s, 1),
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result, indent=2))


def _metas(log: Log) -> Any:
    return (batch_meta(h, m) for h, m in log.producer_batch_headers())


if __name__ == "__main__":
    main()
