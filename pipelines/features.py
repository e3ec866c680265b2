"""An example ML feature pipeline on raylog: per-user event-time window features, and a generator.

The job (`raylog pipeline features --topic events --out DIR`) reads JSON events
``{"user": str, "item": str, "amount": float, "ts": epoch ms}`` from a topic with the
``raylog`` streaming source and keeps, per user and per 1-minute and 1-hour tumbling window of
event time:

- ``events`` (count), ``amount_sum``, ``amount_mean``;
- ``distinct_items``: exact, ``size(collect_set(item))``. Spark refuses ``count(DISTINCT ...)``
  on a stream ("distinct aggregations are not supported on streaming DataFrames"); a set per
  open (user, window) is fine here because the watermark drops the state of closed windows and
  a user's items per window are few;
- ``distinct_items_approx``: ``approx_count_distinct(item)`` (HyperLogLog++), the one to use
  when item sets per window are large.

Each window size is its own streaming query (``<out>/window=1m``, ``<out>/window=1h``, each with
its own checkpoint): Spark's append mode emits an aggregate once the watermark passes the
window's end, and one ``window()`` column per aggregation keeps that rule simple. The sink is
Parquet in append mode with a checkpoint, so a window is written exactly once: stopping the job
and starting it again from its checkpoints neither repeats nor misses a window.

The generator (`raylog pipeline generate --topic events --rate N`) produces such events with
confluent-kafka through raylog's Kafka gateway: events come from producers, and a Kafka
client is what a real producer uses (batching, compression, retries, keys to partitions); it
needs no Ray connection. The user is the record key, so a user's events stay in order in one
partition.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WINDOWS = {"1m": "1 minute", "1h": "1 hour"}
EVENT_DDL = "user string, item string, amount double, ts long"
DEFAULT_WATERMARK = "10 minutes"
FLUSH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Event:
    user: str
    item: str
    amount: float
    ts: int  # epoch milliseconds, event time

    def to_json(self) -> bytes:
        return json.dumps(
            {"user": self.user, "item": self.item, "amount": self.amount, "ts": self.ts}
        ).encode()


def events(
    seed: int, start_ms: int, step_ms: int, *, users: int = 20, items: int = 50
) -> Iterator[Event]:
    """An endless stream of events, the same for the same ``seed``, ``step_ms`` apart in event
    time from ``start_ms``; amounts are whole cents."""
    rng = random.Random(seed)
    ts = start_ms
    while True:
        yield Event(
            user=f"u{rng.randrange(users)}",
            item=f"i{rng.randrange(items)}",
            amount=rng.randrange(1, 100_000) / 100,
            ts=ts,
        )
        ts += step_ms


# --- the streaming job ----------------------------------------------------------------------------


def event_frame(spark: Any, cluster: str, topic: str, **options: str) -> Any:
    """The topic's events as columns ``user, item, amount, event_time`` (a stream)."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("raylog")
        .option("cluster", cluster)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    parsed = reader.load().select(F.from_json(F.col("value").cast("string"), EVENT_DDL).alias("e"))
    return parsed.select(
        "e.user",
        "e.item",
        "e.amount",
        F.timestamp_millis(F.col("e.ts")).alias("event_time"),
    ).where(F.col("user").isNotNull() & F.col("event_time").isNotNull())


def window_features(frame: Any, window: str, watermark: str) -> Any:
    """Per-user features over tumbling ``window``s of event time (append mode: final rows)."""
    from pyspark.sql import functions as F

    return (
        frame.withWatermark("event_time", watermark)
        .groupBy(F.col("user"), F.window("event_time", window))
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.sum("amount").alias("amount_sum"),
            F.avg("amount").alias("amount_mean"),
            F.size(F.collect_set("item")).alias("distinct_items"),
            F.approx_count_distinct("item").alias("distinct_items_approx"),
        )
        .select(
            "user",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "events",
            "amount_sum",
            "amount_mean",
            "distinct_items",
            "distinct_items_approx",
        )
    )


def start_queries(
    spark: Any,
    *,
    cluster: str,
    topic: str,
    out: Path,
    checkpoint: Path,
    watermark: str = DEFAULT_WATERMARK,
    trigger_seconds: float = 5.0,
    available_now: bool = False,
    source_options: dict[str, str] | None = None,
) -> list[Any]:
    """One query per window size; returns the started ``StreamingQuery``s."""
    queries = []
    for label, window in WINDOWS.items():
        frame = event_frame(spark, cluster, topic, **(source_options or {}))
        writer = (
            window_features(frame, window, watermark)
            .writeStream.queryName(f"features_{label}")
            .outputMode("append")
            .format("parquet")
            .option("path", str(out / f"window={label}"))
            .option("checkpointLocation", str(checkpoint / f"window={label}"))
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
        queries.append(writer.start())
    return queries


def spark_session(app_name: str = "raylog-features", master: str = "local[2]") -> Any:
    """A Spark session whose Python workers run this Python (so they can import raylog), on
    loopback, with the ``raylog`` format registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from raylog.pipelines import register

    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        # Python workers (the streaming source runner among them) start slowly on a loaded
        # machine; Spark's default 15 s to connect back is not always enough.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def run_features(
    *,
    cluster: str,
    topic: str,
    out: Path,
    checkpoint: Path,
    watermark: str,
    trigger_seconds: float,
    available_now: bool,
) -> int:
    """The `raylog pipeline features` job: runs until Ctrl-C (or, with ``available_now``, until
    what the topic holds now is processed)."""
    spark = spark_session()
    queries = start_queries(
        spark,
        cluster=cluster,
        topic=topic,
        out=out,
        checkpoint=checkpoint,
        watermark=watermark,
        trigger_seconds=trigger_seconds,
        available_now=available_now,
    )
    print(f"features: {len(queries)} queries writing under {out}", flush=True)
    try:
        while any(q.isActive for q in queries):  # bounded waits: Ctrl-C is seen promptly
            for q in queries:
                q.awaitTermination(1)
                if q.exception() is not None:
                    raise RuntimeError(f"query {q.name} failed: {q.exception()}")
    except KeyboardInterrupt:
        pass
    finally:
        for q in queries:
            q.stop()
        spark.stop()
    return 0


# --- the generator --------------------------------------------------------------------------------


def run_generate(
    *,
    bootstrap: str,
    topic: str,
    rate: float,
    seconds: float,
    seed: int,
    compression: str = "lz4",
) -> int:
    """Produce ``rate`` events per second for ``seconds`` (event time = wall clock); returns
    how many were acknowledged."""
    from confluent_kafka import Producer

    if rate <= 0 or seconds <= 0:
        raise ValueError("--rate and --seconds must be positive")
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 20,
            "compression.type": compression,
        }
    )
    failed: list[str] = []
    acked = 0

    def delivered(err: Any, _msg: Any) -> None:
        nonlocal acked
        if err is None:
            acked += 1
        else:
            failed.append(str(err))

    total = int(rate * seconds)
    begin = time.monotonic()
    stream = events(seed, int(time.time() * 1000), 0)
    for n in range(total):
        # Pace by the clock: event n is due at begin + n / rate.
        delay = begin + n / rate - time.monotonic()
        if delay > 0:
            producer.poll(delay)
        event = next(stream)
        event = Event(event.user, event.item, event.amount, int(time.time() * 1000))
        producer.produce(
            topic, key=event.user.encode(), value=event.to_json(), on_delivery=delivered
        )
        producer.poll(0)
    left = producer.flush(FLUSH_TIMEOUT_S)
    if left or failed:
        raise RuntimeError(f"{left} events not delivered; errors: {failed[:3]}")
    return acked
