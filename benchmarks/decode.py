"""Reader-side record decoding: the reference decoder against the fast (vectorised) one.

Each shape is a fetch response's worth of v2 batches as kafka-python's producer builds them
(``DefaultRecordBatchBuilder``), decoded the way a reader decodes it:
``records.decode_into`` + ``records.to_arrow`` into one Arrow RecordBatch. Shapes:

- ``value100_key8``: 100-byte values, 8-byte keys, no headers (the Spark benchmark's shape);
- ``value100_key8_headers``: the same with two headers per record, read with headers;
- ``value100_key8_lz4``: the first shape, lz4-compressed (decompression included);
- ``value1000_key8``: 1000-byte values;
- ``batches_of_5``: 5 records per batch (a producer that does not linger).

Prints one JSON document: ``shapes``, per shape ``bytes``, ``reference_rows_per_cpu_s`` and
``fast_rows_per_cpu_s`` (best of ``--repeats``) and ``speedup`` (their ratio). CPU time
(``time.process_time``), not wall time, because on a shared machine wall time mostly measures
the other jobs.

    .venv/bin/python benchmarks/decode.py [--rows 50000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from kafka.record import default_records as kdr

from raylog.pipelines import records as R
from raylog.storage import batch as rb

BASE_TS = 1_700_000_000_000
END = (1 << 63) - 1


def build(rows: int, per_batch: int, value_bytes: int, headers: int, codec: int = 0) -> bytes:
    """``rows`` records in batches of ``per_batch``, as kafka-python's producer builds them."""
    out = bytearray()
    for base in range(0, rows, per_batch):
        builder = kdr.DefaultRecordBatchBuilder(
            magic=2,
            compression_type=codec,
            is_transactional=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=1 << 30,
        )
        for i in range(min(per_batch, rows - base)):
            n = base + i
            value = (b"%012d," % n) * (value_bytes // 13 + 1)
            hdrs = [("source", b"bench"), ("seq", b"%d" % n)][:headers]
            builder.append(i, BASE_TS + n, b"k%07d" % (n % 10**7), value[:value_bytes], hdrs)
        batch = bytearray(builder.build())
        rb.set_base_offset(batch, 0, base)
        out += batch
    return bytes(out)


def rows_per_s(decode: Callable[..., int], buf: bytes, headers: bool, repeats: int) -> float:
    best = float("inf")
    rows = 0
    for _ in range(repeats):
        start = time.process_time()
        cols = R.new_columns(headers)
        decode(buf, cols, 0, END)
        batch: pa.RecordBatch = R.to_arrow(cols, "bench", 0, headers)
        best = min(best, time.process_time() - start)
        rows = batch.num_rows
    return rows / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    lz4 = kdr.DefaultRecordBatch.CODEC_LZ4
    shapes: dict[str, tuple[bytes, bool]] = {
        "value100_key8": (build(args.rows, 1000, 100, 0), False),
        "value100_key8_headers": (build(args.rows, 1000, 100, 2), True),
        "value100_key8_lz4": (build(args.rows, 1000, 100, 0, lz4), False),
        "value1000_key8": (build(args.rows // 4, 250, 1000, 0), False),
        "batches_of_5": (build(args.rows // 4, 5, 100, 0), False),
    }
    results: dict[str, Any] = {}
    for name, (buf, headers) in shapes.items():
        ref = rows_per_s(R.decode_into_reference, buf, headers, args.repeats)
        fast = rows_per_s(R.decode_into, buf, headers, args.repeats)
        results[name] = {
            "bytes": len(buf),
            "reference_rows_per_cpu_s": round(ref),
            "fast_rows_per_cpu_s": round(fast),
            "speedup": round(fast / ref, 1),
        }
        print(f"[decode] {name}: {results[name]}", file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "python": platform.python_version(),
                "pyarrow": pa.__version__,
                "rows": args.rows,
                "repeats": args.repeats,
                "shapes": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
