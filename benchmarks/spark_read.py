"""Batch read throughput of the ``raylog`` Spark source, beside Parquet and Ray Data's Kafka reader.

In one run, on one embedded cluster (`raylog up`, 3 brokers) and one Spark ``local[2]``:

1. 1,000,000 records with 100-byte values (10-byte keys) are produced to a 4-partition RF=3
   topic with confluent-kafka through the gateway (acks=all, uncompressed);
2. ``raylog``: ``spark.read.format("raylog")`` earliest to latest, written to Spark's ``noop``
   sink (every row is materialised, nothing is collected to the driver);
3. ``parquet``: the same rows and columns, written once to a Parquet file by Spark, read back
   the same way;
4. Python data sources with the same schema, in as many input partitions as the raylog source
   reads in (Spark's task slots: it packs the 4 ranges into them), neither of which calls Ray
   or decodes a record, that bound what any ``pyspark.sql.datasource`` reader can reach on
   this Spark:
   - ``python_source_floor`` yields one ready-made Arrow batch over and over;
   - ``raylog_batches_floor`` yields the very Arrow batches the raylog source yields for these
     records, read beforehand and served from memory-mapped Arrow files. Set beside
     ``raylog``, it is the cost of reading from the replicas and decoding alone;
   - ``python_source_fixed`` is the first floor with one record per partition: what a query
     costs before it reads a row;
5. ``ray_data_read_kafka``: ``ray.data.read_kafka`` (bounded, "once") through raylog's gateway,
   rows counted by ``materialize()``; ``ray_data_read_topic``: raylog's own Ray Data reader.

The Spark readers run in rounds: one warm-up round, then ``--repeats`` rounds, each of which
runs every reader once in the same order. The JVM keeps getting faster for a while (its JIT),
so readers timed one after the other would favour whichever runs last; within a round they
share the JVM's state, and ``rounds_vs_parquet`` gives the ratio of each round. Ray Data's
readers are timed after Spark stops (warm-up, then ``--repeats`` runs). Every reader reports
its best run and its runs. Prints one JSON document, last on stdout. The machine is shared:
figures are noisy. Goal: raylog >= 0.5 x the Parquet read.

    .venv/bin/python benchmarks/spark_read.py [--records 1000000] [--repeats 3]

JSON fields: ``records``, ``value_bytes``, ``partitions``, ``spark_master``,
``spark_task_slots``, ``produce_s`` (loading the topic); per reader (``raylog``, ``parquet``,
``python_source_floor``, ``raylog_batches_floor``, ``python_source_fixed``,
``ray_data_read_kafka``, ``ray_data_read_topic``) ``rows``, ``seconds_runs``, and
``rows_per_s`` and ``mb_per_s`` (key + value bytes) of its best run; ``raylog_vs_parquet``,
``floor_vs_parquet`` and ``raylog_batches_floor_vs_parquet`` (best against best), and
``rounds_vs_parquet`` (the same ratio round by round).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
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
    """A first port of ``count`` free loopback ports, below Linux's ephemeral range (32768+):
    Ray's processes bind ephemeral ports while the cluster starts, and a gateway whose port one
    took makes `raylog up` exit (as tests/support/cluster.py chooses its ports)."""
    for _ in range(50):
        first = random.randrange(20000, 32000 - count)
        try:
            for port in range(first, first + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError("no block of free ports")


@contextlib.contextmanager
def raylog_up(data_dir: Path, brokers: int = 3, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """`raylog up` in a subprocess (``extra``: more flags); yields the bootstrap servers;
    SIGINT (by PID) at the end."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    # the gateways, then the metrics endpoint (raylog up's default: the port after them)
    port = free_port_block(brokers + 1)
    proc = subprocess.Popen(
        [*RAYLOG, "up", "--brokers", str(brokers), "--port", str(port),
         "--data-dir", str(data_dir), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )  # fmt: skip
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
        # This process leaves the cluster's Ray first: a driver still joined when the cluster
        # stops is ended by Ray 60 s later, before an error's traceback is printed.
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()
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


def summary(rows: int, runs: list[float]) -> dict[str, Any]:
    best = min(runs)
    payload_mb = rows * (VALUE_BYTES + KEY_BYTES) / 1e6
    return {
        "rows": rows,
        "seconds_runs": [round(r, 3) for r in runs],
        "rows_per_s": round(rows / best),
        "mb_per_s": round(payload_mb / best, 1),
    }


def timed(fn: Callable[[], int], repeats: int) -> dict[str, Any]:
    fn()  # warm-up
    runs = []
    rows = 0
    for _ in range(repeats):
        begin = time.perf_counter()
        rows = fn()
        runs.append(time.perf_counter() - begin)
    return summary(rows, runs)


def timed_rounds(readers: dict[str, Callable[[], int]], repeats: int) -> dict[str, Any]:
    """One warm-up round, then ``repeats`` rounds, each running every reader once in order."""
    runs: dict[str, list[float]] = {name: [] for name in readers}
    rows: dict[str, int] = {}
    for round_no in range(repeats + 1):
        for name, fn in readers.items():
            log(f"round {round_no}: {name}")
            begin = time.perf_counter()
            rows[name] = fn()
            if round_no:
                runs[name].append(time.perf_counter() - begin)
    return {name: summary(rows[name], runs[name]) for name in readers}


FLOOR_BATCH_ROWS = 50_000  # about what one 8 MiB fetch of these records decodes to


def floor_source(records: int, name: str, partitions: int) -> Any:
    """A Python data source yielding ready-made Arrow batches shaped like the raylog source's,
    in ``partitions`` input partitions."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from raylog.pipelines.spark_source import SCHEMA_DDL

    per_partition = records // partitions

    class FloorReader(DataSourceReader):
        def __init__(self, schema: Any) -> None:
            self.schema = schema

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(partitions)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            import numpy as np
            import pyarrow as pa
            from pyspark.sql.pandas.types import to_arrow_schema

            n = min(FLOOR_BATCH_ROWS, per_partition)
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
            return name

        def schema(self) -> str:
            return SCHEMA_DDL

        def reader(self, schema: Any) -> DataSourceReader:
            return FloorReader(schema)

    return FloorSource


def save_raylog_batches(data_dir: Path, out: Path, task_slots: int) -> int:
    """Read the topic as the raylog source's tasks do (its reader, in this process, with the
    session's task slots) and write each input partition's Arrow batches, as yielded, to
    ``out/<i>.arrow``. Returns how many."""
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from raylog.pipelines.spark_source import RaylogDataSource

    options = {"cluster": str(data_dir), "subscribe": TOPIC}
    source = RaylogDataSource(options)
    source.task_slots = task_slots
    reader = source.reader(StructType.fromDDL(source.schema()))
    out.mkdir()
    count = 0
    for i, partition in enumerate(reader.partitions()):
        with pa.OSFile(str(out / f"{i}.arrow"), "wb") as sink:
            writer = None
            for batch in reader.read(partition):
                if writer is None:
                    writer = pa.ipc.new_file(sink, batch.schema)
                writer.write_batch(batch)
                count += 1
            if writer is not None:
                writer.close()
    return count


def batches_floor_source(directory: Path) -> Any:
    """A Python data source yielding the Arrow batches :func:`save_raylog_batches` saved, from
    memory-mapped files (no copy, no decoding, no Ray)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from raylog.pipelines.spark_source import SCHEMA_DDL

    files = sorted(str(p) for p in directory.glob("*.arrow"))

    class BatchesReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(path) for path in files]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            import pyarrow as pa

            with pa.memory_map(partition.value) as source:
                arrow_file = pa.ipc.open_file(source)
                for i in range(arrow_file.num_record_batches):
                    yield arrow_file.get_batch(i)

    class BatchesSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "raylog_bench_batches"

        def schema(self) -> str:
            return SCHEMA_DDL

        def reader(self, schema: Any) -> DataSourceReader:
            return BatchesReader()

    return BatchesSource


def spark_session() -> Any:
    from raylog.pipelines.features import spark_session as session

    spark = session("raylog-spark-read-bench")
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
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

            def noop(df: Any, rows: int = args.records) -> int:
                df.write.format("noop").mode("overwrite").save()
                return rows

            parquet = root / "bench.parquet"
            raylog_df().write.parquet(str(parquet))
            slots = spark.sparkContext.defaultParallelism
            result["spark_task_slots"] = slots
            saved = save_raylog_batches(data_dir, root / "batches", slots)
            log(f"saved the raylog source's {saved} Arrow batches")
            spark.dataSource.register(floor_source(args.records, "raylog_bench_floor", slots))
            spark.dataSource.register(floor_source(slots, "raylog_bench_fixed", slots))
            spark.dataSource.register(batches_floor_source(root / "batches"))

            def fmt(name: str, rows: int = args.records) -> Callable[[], int]:
                return lambda: noop(spark.read.format(name).load(), rows)

            spark_readers = {
                "raylog": lambda: noop(raylog_df()),
                "parquet": lambda: noop(spark.read.parquet(str(parquet))),
                "python_source_floor": fmt("raylog_bench_floor"),
                "raylog_batches_floor": fmt("raylog_bench_batches"),
                "python_source_fixed": fmt("raylog_bench_fixed", slots),
            }
            result.update(timed_rounds(spark_readers, args.repeats))

            def ratio(name: str) -> float:
                return round(result[name]["rows_per_s"] / result["parquet"]["rows_per_s"], 2)

            result["raylog_vs_parquet"] = ratio("raylog")
            result["floor_vs_parquet"] = ratio("python_source_floor")
            result["raylog_batches_floor_vs_parquet"] = ratio("raylog_batches_floor")
            result["rounds_vs_parquet"] = {
                name: [
                    round(p / r, 2)
                    for r, p in zip(
                        result[name]["seconds_runs"],
                        result["parquet"]["seconds_runs"],
                        strict=True,
                    )
                ]
                for name in ("raylog", "python_source_floor", "raylog_batches_floor")
            }
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
