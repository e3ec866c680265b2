"""The leader's check of a produced batch's records, per codec; print one JSON document.

Before a leader appends a client batch it checks what Kafka's LogValidator checks: the records
decompress (within their bound) and parse, headers included (``storage.batch``'s
``check_client_records``; the walk is ``storage/_record_scan.c``). This measures that check
on batches of 1,000 records of about 1 KB of text-like values (words from a small vocabulary,
so that the codecs compress them about as they compress JSON), as kafka-python's producer
builds them, beside the CRC-32C check every batch already gets, in this process: the median of
five runs of the mean time per call.

    .venv/bin/python benchmarks/produce_check.py

JSON fields: ``python``, ``scanner_built`` (whether the C walk was built; without it the walk
is Python), ``records_mib`` (the uncompressed records of one batch) and, per codec,
``batch_bytes``, ``check_ms``, ``crc_ms`` and ``check_mib_per_s`` (records per second of
check).
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.kafka_batches import kafka_batch

from raylog.storage import batch as rb
from raylog.storage import records
from raylog.storage.compression import CODEC_NAMES

RECORDS = 1000
WORDS_PER_VALUE = 110
RUNS = 5
CALLS = 20


def _mean_ms(call: Callable[[], object]) -> float:
    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        runs.append((time.perf_counter() - start) / CALLS * 1000)
    return statistics.median(runs)


def main() -> None:
    rnd = random.Random(7)
    words = [bytes(rnd.choice(b"abcdefghijklmnop") for _ in range(8)) for _ in range(300)]
    recs = [
        {
            "key": str(i).encode(),
            "value": b" ".join(rnd.choice(words) for _ in range(WORDS_PER_VALUE)),
            "timestamp": 1_700_000_000_000 + i,
            "headers": [],
        }
        for i in range(RECORDS)
    ]
    raw_mib = sum(len(r["value"]) + len(r["key"]) for r in recs) / (1 << 20)
    out: dict[str, object] = {
        "python": platform.python_version(),
        "scanner_built": records._record_scan is not None,
        "records_mib": round(raw_mib, 3),
    }
    for codec, name in CODEC_NAMES.items():
        batch = kafka_batch(recs, codec)
        header = rb.validate_client_batch(batch, 64 << 20)
        check_ms = _mean_ms(lambda b=batch, h=header: rb.check_client_records(b, h))
        crc_ms = _mean_ms(lambda b=batch, h=header: rb.verify_crc(b, 0, h))
        out[name] = {
            "batch_bytes": len(batch),
            "check_ms": round(check_ms, 3),
            "crc_ms": round(crc_ms, 3),
            "check_mib_per_s": round(raw_mib / (check_ms / 1000)),
        }
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
