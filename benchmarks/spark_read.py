"""Batch read throughput of the ``raylog`` Spark source, beside Parquet and Ray Data's Kafka reader.

In one run, on one embedded cluster (`raylog up`, 3 brokers) and one Spark ``local[2]``:

1. 1,000,000 records with 100-byte values (10-byte keys) are produced to a 4-partition RF=3
   topic with confluent-kafka through the gateway (acks=all, uncompressed);
2. ``raylog``: ``spark.read.format("raylog")`` earliest to latest, written to Spark's ``noop``
   sink (every row is materialised, nothing is collected to the driver);
3. ``parquet``: the same rows and columns, written once to a Parquet file by Spark, read back
   the same way;
4. ``python_source_floor``: a Python data source with the same schema and partitions that
   yields ready-made Arrow batches (no Ray, no decoding): what any ``pyspark.sql.datasource``
   reader costs on this Spark before it reads a byte, the bound on what the raylog source can
   reach through that API;
5. ``ray_data_read_kafka``: ``ray.data.read_kafka`` (bounded, "once") through raylog's gateway,
   rows counted by ``materialize()``; ``ray_data_read_topic``: raylog's own Ray Data reader.

Each reader runs once to warm up (Python workers, Ray connections), then ``--repeats`` times;
the best run is reported with all the runs. Prints one JSON document, last on stdout. The
machine is shared: figures are noisy. Goal: raylog >= 0.5 x the Parquet read.

    .venv/bin/python benchmarks/spark_read.py [--records 1000000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

TOPIC = "bench"
PARTITIONS = 4
VALUE_BYTES = 100
KEY_BYTES = 10
START_TIMEOUT_S = 180.0
RAYLOG = [sys.executable, "-m", "raylog.actors.cli"]


def log(message: str) -> None:
    print(f"[spark_read] {message}", file=sys.stderr, flush=True)


def free_port_block(count: int) -> int:
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        try:
            for port in range(first, first + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError("no block of free ports")


@contextlib.contextmanager
def raylog_up(data_dir: Path) -> Iterator[str]:
    """`raylog up` in a subprocess; yields the bootstrap servers; SIGINT (by PID) at the end."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    port = free_port_block(3)
    proc = subprocess.Popen(
        [*RAYLOG, "up", "--brokers", "3", "--port", str(port), "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        bootstrap = ""
        deadline = time.monotonic() + START_TIMEOUT_S
        for line in proc.stdout:  # bounded by the deadline check and the process's exit
            if line.strip().startswith("bootstrap:"):
                bootstrap = line.split()[-1]
            if "raylog ready" in line:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("raylog up did not become ready")
        if not bootstrap:
            raise RuntimeError("raylog up exited before it was ready")
        yield bootstrap
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


def produce(bootstrap: str, records: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 500_000,
        }
    )
    value = b"v" * VALUE_BYTES
    failed: list[str] = []
    for i in range(records):
        while True:
            try:
                producer.produce(
                    TOPIC,
                    key=b"%010d" % i,
                    value=value,
                    partition=i % PARTITIONS,
                    on_delivery=lambda err, _m: failed.append(str(err)) if err else None,
                )
                break
            except BufferError:  # local queue full: let deliveries drain it
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300) or failed:
        raise RuntimeError(f"produce failed: {failed[:3]}")


def timed(fn: Callable[[], int], repeats: int) -> dict[str, Any]:
    fn()  # warm-up
    runs = []
    rows = 0
    for _ in range(repeats):
        begin = time.perf_counter()
        rows = fn()
        runs.append(time.perf_counter() - begin)
    best = min(runs)
    payload_mb = rows * (VALUE_BYTES + KEY_BYTES) / 1e6
    return {
        "rows": rows,
        "seconds_runs": [round(r, 3) for r in runs],
        "rows_per_s": round(rows / best),
        "mb_per_s": round(payload_mb / best, 1),
    }


FLOOR_BATCH_ROWS = 50_000  # about what one 8 MiB fetch of these records decodes to


def floor_source(records: int) -> Any:
    """A Python data source yielding ready-made Arrow batches shaped like the raylog source's."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from raylog.pipelines.spark_source import SCHEMA_DDL

    per_partition = records // PARTITIONS

    class FloorReader(DataSourceReader):
        def __init__(self, schema: Any) -> None:
            self.schema = schema

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(PARTITIONS)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            import numpy as np
            import pyarrow as pa
            from pyspark.sql.pandas.types import to_arrow_schema

            n = FLOOR_BATCH_ROWS
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.array([b"k" * KEY_BYTES] * n, pa.binary()),
                    pa.array([b"v" * VALUE_BYTES] * n, pa.binary()),
                    pa.repeat(pa.scalar(TOPIC, pa.string()), n),
                    pa.repeat(pa.scalar(partition.value, pa.int32()), n),
                    pa.array(np.arange(n, dtype=np.int64)),
                    pa.array(np.zeros(n, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
                    pa.array(np.zeros(n, dtype=np.int32)),
                ],
                schema=to_arrow_schema(self.schema, timezone="UTC"),
            )
            left = per_partition
            while left > 0:
                yield batch if left >= n else batch.slice(0, left)
                left -= n

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "raylog_bench_floor"

        def schema(self) -> str:
            return SCHEMA_DDL

        def reader(self, schema: Any) -> DataSourceReader:
            return FloorReader(schema)

    return FloorSource


def spark_session() -> Any:
    from raylog.pipelines.features import spark_session as session

    spark = session("raylog-spark-read-bench")
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "records": args.records,
        "value_bytes": VALUE_BYTES,
        "partitions": PARTITIONS,
        "spark_master": "local[2]",
        "note": "shared 2-core machine: figures are noisy; MB = key + value bytes",
    }
    with tempfile.TemporaryDirectory(prefix="raylog-bench-") as tmp:
        root = Path(tmp)
        data_dir = root / "up"
        with raylog_up(data_dir) as bootstrap:
            done = subprocess.run(
                [*RAYLOG, "topics", "create", TOPIC, "--partitions", str(PARTITIONS),
                 "--data-dir", str(data_dir)],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if done.returncode:
                raise RuntimeError(done.stderr)
            log(f"producing {args.records} records")
            begin = time.perf_counter()
            produce(bootstrap, args.records)
            result["produce_s"] = round(time.perf_counter() - begin, 1)

            # This process joins the cluster's Ray (for Ray Data) before Spark starts.
            from raylog.pipelines import reading

            reading.connect(reading.ClusterTarget.resolve(str(data_dir)))
            spark = spark_session()

            def raylog_df() -> Any:
                return (
                    spark.read.format("raylog")
                    .option("cluster", str(data_dir))
                    .option("subscribe", TOPIC)
                    .load()
                )

            def noop(df: Any) -> int:
                df.write.format("noop").mode("overwrite").save()
                return args.records

            log("raylog source")
            result["raylog"] = timed(lambda: noop(raylog_df()), args.repeats)
            parquet = root / "bench.parquet"
            raylog_df().write.parquet(str(parquet))
            log("parquet")
            result["parquet"] = timed(lambda: noop(spark.read.parquet(str(parquet))), args.repeats)
            result["raylog_vs_parquet"] = round(
                result["raylog"]["rows_per_s"] / result["parquet"]["rows_per_s"], 2
            )
            spark.dataSource.register(floor_source(args.records))
            log("python data source floor")
            result["python_source_floor"] = timed(
                lambda: noop(spark.read.format("raylog_bench_floor").load()), args.repeats
            )
            result["floor_vs_parquet"] = round(
                result["python_source_floor"]["rows_per_s"] / result["parquet"]["rows_per_s"], 2
            )
            spark.stop()

            import ray
            import ray.data

            if hasattr(ray.data, "read_kafka"):
                log("ray.data.read_kafka")

                def read_kafka() -> int:
                    ds = ray.data.read_kafka(
                        TOPIC,
                        bootstrap_servers=bootstrap,
                        start_offset="earliest",
                        end_offset="latest",
                    )
                    return int(ds.materialize().count())

                result["ray_data_read_kafka"] = timed(read_kafka, args.repeats)
            else:
                result["ray_data_read_kafka"] = f"not in Ray {ray.__version__}"
            log("raylog read_topic (Ray Data)")
            from raylog.pipelines import read_topic

            result["ray_data_read_topic"] = timed(
                lambda: int(read_topic(TOPIC).materialize().count()), args.repeats
            )
            ray.shutdown()
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
