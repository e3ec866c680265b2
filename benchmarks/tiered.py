"""Tiered storage (KIP-405): copying while producing, remote reads, a Spark backfill from remote.

In one run, on one embedded cluster (`raylog up`, 3 brokers, its object store the directory in
its data dir that `raylog up` uses by default, remote.log.manager.task.interval.ms 1000):

1. produce: ``--produce-records`` records of 100 bytes (10-byte keys) at a steady rate
   (``--rate-mb-per-s``, acks=all, confluent-kafka through the gateway) to a 1-partition topic
   without tiering, then the same to one with remote.storage.enable (small segments and
   local.retention.bytes, so the copier works all along). The produce throughput of both runs
   (and each one's p99 delivery latency); for the tiered run, the copy throughput while
   producing: bytes of remote segments finished between the first and last produce, from the
   remote log metadata in the store, over that time (and the copier's rate over its whole
   run, catch-up included);
2. remote read: once most of the tiered topic is only in the object store, confluent-kafka
   reads ``--consume-records`` records from offset 0 of it (served from the object store by
   the leader) and of the untiered topic (from its local log);
3. backfill: ``--records`` records (default 10,000,000, the issue's figure) produced to a
   4-partition tiered topic; once most of it is remote, Spark (``local[2]``) reads every
   partition from earliest to its local log start, all of it from remote segments (the
   ``raylog`` source reads them straight from the store), to Spark's ``noop`` sink; beside it,
   Spark reads the same rows written once as Parquet into the same object store's directory,
   and the floor of any Python data source (``spark_read.py``'s: ready-made Arrow batches of
   the same shape, nothing read or decoded). One warm-up round, then ``--repeats`` rounds of
   the three readers.

Goals: tiering costs producers no more than 10% (tiered produce MiB/s >= 0.9 x untiered);
the Spark backfill at 0.5 x or better of the Parquet read. Prints one JSON document, last on
stdout; each goal with its target, the measured value and ``met``. The machine is shared:
figures are noisy.

    .venv/bin/python benchmarks/tiered.py [--records 10000000] [--produce-records 1000000]
        [--rate-mb-per-s 10] [--consume-records 500000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka_clients import CALL_TIMEOUT_S, MIB, confluent_consume, percentiles, rate
from spark_read import (
    KEY_BYTES,
    PARTITIONS,
    RAYLOG,
    TOPIC,
    VALUE_BYTES,
    floor_source,
    produce,
    raylog_up,
    spark_session,
    timed_rounds,
)

PLAIN, TIERED = "bench-plain", "bench-tiered"
TASK_INTERVAL_MS = 1000  # remote.log.manager.task.interval.ms of the cluster
SAMPLE_S = 0.5  # how often the copy progress is read from the store
TIERED_WAIT_S = 1800.0  # bound on waiting for the copier to leave most of a topic remote
REMOTE_FRACTION = 0.8  # "mostly remote": the local log start past this share of the records
SEGMENTS_PER_PARTITION = 40  # segment.bytes chosen so that a partition has about this many


def log(message: str) -> None:
    print(f"[tiered] {message}", file=sys.stderr, flush=True)


def segment_bytes(records: int, partitions: int) -> int:
    """segment.bytes for about SEGMENTS_PER_PARTITION segments a partition (256 KiB to 64 MiB)."""
    per_partition = records * (VALUE_BYTES + KEY_BYTES + 10) // partitions
    return max(256 << 10, min(64 << 20, per_partition // SEGMENTS_PER_PARTITION))


def create_topic(data_dir: Path, name: str, partitions: int, rf: int, *configs: str) -> None:
    flags = [a for c in configs for a in ("--config", c)]
    done = subprocess.run(
        [*RAYLOG, "topics", "create", name, "--partitions", str(partitions),
         "--replication-factor", str(rf), "--data-dir", str(data_dir), *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(done.stderr)


def tiered_configs(seg_bytes: int) -> tuple[str, ...]:
    return (
        "remote.storage.enable=true",
        f"segment.bytes={seg_bytes}",
        f"local.retention.bytes={seg_bytes}",
    )


def steady_produce(
    bootstrap: str, topic: str, records: int, rate_mb_per_s: float
) -> dict[str, float]:
    """``records`` records to partition 0 at ``rate_mb_per_s`` (key + value bytes), paced in
    slices of 10 ms, acks=all; the achieved rate and the delivery latency percentiles."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1 << 20}
    )
    producer.list_topics(topic, timeout=CALL_TIMEOUT_S)  # connect before the clock starts
    per_s = rate_mb_per_s * 1e6 / (VALUE_BYTES + KEY_BYTES)
    value = b"v" * VALUE_BYTES
    latencies: list[float] = []
    errors: list[str] = []

    def delivered(err: Any, _msg: Any, sent: float) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            latencies.append((time.perf_counter() - sent) * 1000)

    start = time.perf_counter()
    for i in range(records):
        due = start + i / per_s
        while time.perf_counter() < due:  # bounded: ``due`` is a fixed time
            producer.poll(max(0.0, min(0.01, due - time.perf_counter())))
        sent = time.perf_counter()
        while True:  # bounded: each poll delivers, or the flush below fails
            try:
                producer.produce(
                    topic,
                    key=b"%010d" % i,
                    value=value,
                    partition=0,
                    on_delivery=lambda err, msg, sent=sent: delivered(err, msg, sent),
                )
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300) or errors:
        raise RuntimeError(f"produce to {topic} failed: {errors[:3]}")
    out = rate(records, VALUE_BYTES + KEY_BYTES, time.perf_counter() - start)
    return {**out, **percentiles(latencies)}


class CopyProgress:
    """Samples the bytes of a topic's finished remote segments, every SAMPLE_S, from the remote
    log metadata in the store (as the pipelines read it), in a thread."""

    def __init__(self, data_dir: Path, topic: str) -> None:
        from raylog.pipelines import reading, remote_ranges
        from raylog.storage.remote import RemotePartition

        catalog = reading.controller_catalog()
        self.partitions = [
            RemotePartition(p.remote_topic_id, p.partition) for p in catalog.partitions(topic)
        ]
        self.store = remote_ranges.open_store(remote_ranges.store_location())
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def copied_bytes(self) -> int:
        from raylog.storage.remote import metadata_store

        return sum(
            s.size_bytes
            for p in self.partitions
            for s in metadata_store.read(self.store, p)[0].finished()
        )

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append((time.perf_counter(), self.copied_bytes()))

    def __enter__(self) -> CopyProgress:
        self.samples.append((time.perf_counter(), self.copied_bytes()))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def rate_between(self, begin: float, end: float) -> dict[str, float]:
        """MiB/s copied between two times (the samples nearest inside them)."""
        inside = [(t, b) for t, b in self.samples if begin <= t <= end] or self.samples[-1:]
        (t0, b0), (t1, b1) = inside[0], inside[-1]
        return {
            "copied_mib": round((b1 - b0) / MIB, 1),
            "mib_per_s": round((b1 - b0) / MIB / (t1 - t0), 2) if t1 > t0 else 0.0,
        }

    def whole_run(self) -> dict[str, float]:
        """MiB/s from the first sample that saw a copy to the last one that saw one more."""
        moved = [
            i for i in range(1, len(self.samples)) if self.samples[i][1] > self.samples[i - 1][1]
        ]
        if not moved:
            return {"copied_mib": 0.0, "mib_per_s": 0.0}
        return self.rate_between(self.samples[moved[0] - 1][0], self.samples[moved[-1]][0])


def local_starts(topic: str) -> dict[int, tuple[int, int]]:
    """(local log start, high watermark) per partition, from the replicas."""
    from raylog.pipelines import reading

    chosen = reading.controller_catalog().partitions(topic)
    return {
        p: (b.log_start_offset, b.high_watermark)
        for (_, p), b in reading.fetch_bounds(chosen).items()
    }


def wait_mostly_remote(topic: str) -> dict[int, int]:
    """Wait until every partition's local log start is past REMOTE_FRACTION of its records;
    returns the local log starts."""
    deadline = time.monotonic() + TIERED_WAIT_S
    while True:  # bounded by the deadline
        starts = local_starts(topic)
        if all(start >= REMOTE_FRACTION * hw for start, hw in starts.values()):
            return {p: start for p, (start, _) in starts.items()}
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic} is not mostly remote in {TIERED_WAIT_S:.0f} s: {starts}")
        time.sleep(1.0)


def goal(target: str, measured: float, met: bool) -> dict[str, Any]:
    return {"target": target, "measured": measured, "met": met}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000, help="Spark backfill")
    parser.add_argument("--produce-records", type=int, default=1_000_000)
    parser.add_argument("--rate-mb-per-s", type=float, default=10.0)
    parser.add_argument("--consume-records", type=int, default=500_000)
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rf = args.replication_factor
    result: dict[str, Any] = {
        "records": args.records,
        "produce_records": args.produce_records,
        "rate_mb_per_s": args.rate_mb_per_s,
        "replication_factor": rf,
        "value_bytes": VALUE_BYTES,
        "object_store": "a directory on this machine's disk (raylog up's default)",
        "note": "shared 2-core machine: figures are noisy; MiB = key + value bytes",
    }
    broker_config = ("--broker-config", f"remote.log.manager.task.interval.ms={TASK_INTERVAL_MS}")
    with tempfile.TemporaryDirectory(prefix="raylog-bench-tiered-") as tmp:
        root = Path(tmp)
        data_dir = root / "up"
        with raylog_up(data_dir, extra=broker_config) as bootstrap:
            from raylog.pipelines import reading

            reading.connect(reading.ClusterTarget.resolve(str(data_dir)))
            seg = segment_bytes(args.produce_records, 1)
            create_topic(data_dir, PLAIN, 1, rf)
            create_topic(data_dir, TIERED, 1, rf, *tiered_configs(seg))
            log(f"producing {args.produce_records} records without, then with tiering")
            plain = steady_produce(bootstrap, PLAIN, args.produce_records, args.rate_mb_per_s)
            with CopyProgress(data_dir, TIERED) as progress:
                begin = time.perf_counter()
                tiered = steady_produce(bootstrap, TIERED, args.produce_records, args.rate_mb_per_s)
                end = time.perf_counter()
                starts = wait_mostly_remote(TIERED)
            result["produce"] = {
                "segment_bytes": seg,
                "untiered": plain,
                "tiered": tiered,
                "copy_while_producing": progress.rate_between(begin, end),
                "copy_whole_run": progress.whole_run(),
            }

            log("reading through a Kafka client: remote against local")
            count = min(args.consume_records, starts[0])
            size = VALUE_BYTES + KEY_BYTES
            result["kafka_read"] = {
                "records": count,
                "remote": confluent_consume(bootstrap, TIERED, 0, count, size),
                "local": confluent_consume(bootstrap, PLAIN, 0, count, size),
            }

            log(f"producing {args.records} records for the backfill")
            seg = segment_bytes(args.records, PARTITIONS)
            create_topic(data_dir, TOPIC, PARTITIONS, rf, *tiered_configs(seg))
            begin = time.perf_counter()
            produce(bootstrap, args.records)
            result["backfill_produce_s"] = round(time.perf_counter() - begin, 1)
            starts = wait_mostly_remote(TOPIC)
            backfill_rows = sum(starts.values())
            result["backfill"] = {"segment_bytes": seg, "rows": backfill_rows}
            result["backfill"].update(spark_backfill(data_dir, starts, backfill_rows, args.repeats))

    produce_ratio = round(tiered["mib_per_s"] / plain["mib_per_s"], 3)
    spark_ratio = result["backfill"]["raylog_vs_parquet"]
    result["goals"] = {
        "tiered_produce_vs_untiered": goal(">= 0.9", produce_ratio, produce_ratio >= 0.9),
        "spark_backfill_vs_parquet": goal(">= 0.5", spark_ratio, spark_ratio >= 0.5),
    }
    print(json.dumps(result, indent=2), flush=True)


def spark_backfill(
    data_dir: Path, starts: dict[int, int], rows: int, repeats: int
) -> dict[str, Any]:
    """Spark reading ``[0, local log start)`` of every partition (all remote), beside the same
    rows as Parquet in the object store's directory."""
    spark = spark_session()
    ending = json.dumps({TOPIC: {str(p): o for p, o in starts.items()}})

    def raylog_df() -> Any:
        return (
            spark.read.format("raylog")
            .option("cluster", str(data_dir))
            .option("subscribe", TOPIC)
            .option("endingOffsets", ending)
            .load()
        )

    def noop(df: Any) -> int:
        df.write.format("noop").mode("overwrite").save()
        return rows

    parquet = data_dir / "metadata" / "bench-backfill.parquet"  # beside the remote segments
    raylog_df().write.parquet(str(parquet))
    slots = spark.sparkContext.defaultParallelism
    spark.dataSource.register(floor_source(rows, "raylog_backfill_floor", slots))
    readers: dict[str, Callable[[], int]] = {
        "raylog": lambda: noop(raylog_df()),
        "parquet": lambda: noop(spark.read.parquet(str(parquet))),
        "python_source_floor": lambda: noop(spark.read.format("raylog_backfill_floor").load()),
    }
    out = timed_rounds(readers, repeats)
    spark.stop()

    def vs_parquet(name: str) -> float:
        return round(out[name]["rows_per_s"] / out["parquet"]["rows_per_s"], 2)

    out["raylog_vs_parquet"] = vs_parquet("raylog")
    out["floor_vs_parquet"] = vs_parquet("python_source_floor")
    return out


if __name__ == "__main__":
    main()
