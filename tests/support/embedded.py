"""Helpers for the pipelines tests that run against a whole embedded cluster (`raylog up`).

- ``spark_session()``: Spark ``local[2]`` on loopback whose Python workers are this venv's
  Python; the ``raylog`` format registered.
- ``create_topic()``: `raylog topics create` through the CLI, as a user does.
- ``produce()``: records through the Kafka gateway with confluent-kafka (acks=all), one
  producer per compression codec; returns the rows a reader must return, with the offsets the
  delivery reports gave.
- ``cluster_action()``: runs ``cluster_actions.py`` in a subprocess that joins the cluster's
  Ray with its token (the test process stays in its own Ray session): kill a broker, read
  with Ray Data.
- ``committed_files()``: the Parquet files a streaming query's file sink has committed, read
  from the sink's own log, so that a test can wait on its output without running a Spark job
  on every poll (each one a job on the same 2 cores as the query it waits for).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from support.cluster import UpProcess, cli_env

CLIENT_TIMEOUT_S = 60.0
ACTION_TIMEOUT_S = 180.0
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
BASE_TS = 1_700_000_000_000


@contextlib.contextmanager
def spark_session(name: str) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from raylog.pipelines import register

    # Spark's Python workers are this venv's python; the JVM hands them this environment.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only
    session = (
        SparkSession.builder.master("local[2]")
        .appName(name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "60s")
        # Python workers (the streaming source runner among them) start slowly on a loaded
        # machine; Spark's default 15 s to connect back is not always enough.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


def create_topic(
    up: UpProcess, name: str, partitions: int, *configs: str, replication_factor: int = 3
) -> None:
    """A topic on ``up``; a test that does not exercise replication asks for one replica (each
    replica is a process to start: seconds of CPU on a 2-core machine)."""
    extra = [a for c in configs for a in ("--config", c)]
    rf = ("--replication-factor", str(replication_factor))
    done = up.raylog("topics", "create", name, "--partitions", str(partitions), *rf, *extra)
    assert done.returncode == 0, done.stderr


def record(i: int, seed: int) -> dict[str, Any]:
    """Null keys and values, empty, repeated and null-valued headers, out-of-order timestamps."""
    return {
        "key": None if i % 7 == 3 else f"key-{seed}-{i}".encode(),
        "value": None if i % 11 == 5 else bytes([i % 256]) * (i % 300) + b"v",
        "timestamp": BASE_TS + 17 * i + 1000 * seed - (5 if i % 3 == 0 else 0),
        "headers": [("h", b"x" * (i % 4)), ("h", b"y"), ("null", None)] if i % 2 else [],
    }


def produce(
    bootstrap: str,
    topic: str,
    by_partition: dict[int, list[dict[str, Any]]],
    compression: str = "none",
    batch_records: int = 10_000,
) -> list[dict[str, Any]]:
    """Produce ``by_partition``'s records with acks=all, at most ``batch_records`` a batch
    (librdkafka's batch.num.messages); returns the expected reader rows."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 20,
            "compression.type": compression,
            "enable.idempotence": False,
            "batch.num.messages": batch_records,
        }
    )
    rows: list[dict[str, Any]] = []
    failed: list[str] = []

    def delivered(err: Any, msg: Any, r: dict[str, Any]) -> None:
        if err is not None:
            failed.append(str(err))
            return
        rows.append(
            {
                "key": r["key"],
                "value": r["value"],
                "topic": msg.topic(),
                "partition": msg.partition(),
                "offset": msg.offset(),
                "timestamp": r["timestamp"],
                "timestampType": 0,
                "headers": [{"key": k, "value": v} for k, v in r["headers"]],
            }
        )

    for partition, recs in by_partition.items():
        for r in recs:
            producer.produce(
                topic,
                key=r["key"],
                value=r["value"],
                partition=partition,
                timestamp=r["timestamp"],
                headers=r["headers"] or None,
                on_delivery=lambda err, msg, r=r: delivered(err, msg, r),
            )
            producer.poll(0)
    remaining = producer.flush(CLIENT_TIMEOUT_S)
    assert remaining == 0 and not failed, (remaining, failed[:3])
    return sorted(rows, key=lambda r: (r["topic"], r["partition"], r["offset"]))


def produce_values(
    bootstrap: str,
    topic: str,
    values: list[tuple[int, bytes]],
    timeout_s: float = CLIENT_TIMEOUT_S,
) -> None:
    """Produce ``(partition, value)`` pairs with acks=all; fails unless every one is
    acknowledged within ``timeout_s``."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    failed: list[str] = []
    for partition, value in values:
        producer.produce(
            topic,
            value=value,
            partition=partition,
            on_delivery=lambda err, _msg: failed.append(str(err)) if err else None,
        )
        producer.poll(0)
    assert producer.flush(timeout_s) == 0 and not failed, failed[:3]


def cluster_action(data_dir: Path, *args: str) -> Any:
    """Run ``cluster_actions.py ARGS`` against the cluster of ``data_dir``; returns its JSON."""
    script = Path(__file__).with_name("cluster_actions.py")
    done = subprocess.run(
        [sys.executable, str(script), str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=ACTION_TIMEOUT_S,
        env=cli_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    marker = "cluster-action-result: "
    results = [line for line in done.stdout.splitlines() if line.startswith(marker)]
    assert results, (done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(results[-1][len(marker) :])


SINK_LOG = "_spark_metadata"


def committed_files(out: Path) -> list[Path]:
    """The files Spark's file sink at ``out`` has committed, in commit order ([] before any).

    The sink's log (``out/_spark_metadata``) has one file per batch and, every few batches, a
    ``N.compact`` file that repeats every earlier entry; each is a ``v1`` line and then one JSON
    line per data file (``path``, ``action`` "add" or "delete"). Spark writes each log file
    aside and renames it into place, so a file seen here is whole. Readers that must agree with
    Spark (the tests' final checks) still read through Spark.
    """
    log_dir = out / SINK_LOG
    if not log_dir.is_dir():
        return []
    batches = []
    for entry in log_dir.iterdir():
        number = entry.name.removesuffix(".compact")
        if number.isdigit():  # not Spark's hidden temp and checksum files
            batches.append((int(number), entry))
    files: dict[str, None] = {}
    for _, entry in sorted(batches):
        for line in entry.read_text().splitlines()[1:]:
            record = json.loads(line)
            if record["action"] == "add":
                files[record["path"]] = None
            else:
                files.pop(record["path"], None)
    return [Path(unquote(urlparse(uri).path)) for uri in files]
