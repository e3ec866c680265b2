"""Client quotas at work: two producers on one broker, one throttled; print one JSON document.

Starts `raylog up` (3 brokers), creates a one-partition topic (RF=1, so both producers write
through the same broker's gateway: quotas are per broker), sets ``producer_byte_rate`` =
``--rate-mib`` MiB/s for client id ``throttled`` with `raylog quotas alter`, then runs two
confluent-kafka producers at once for ``--seconds``, client ids ``throttled`` and ``free``, each
sending ``--value-bytes`` values as fast as its acks allow (acks=all, ``linger.ms=5``).

The quota is measured over ``quota.window.num`` (11) samples of 1 s, counting at least 10 s: in
the first 10 s the throttled client may send ``10 x rate`` at full speed, so its rate is shown
over the whole run and over the time after that first window (``steady``).

    .venv/bin/python benchmarks/quotas.py [--rate-mib 1] [--seconds 25] [--value-bytes 10000]

JSON fields: ``rate_mib_per_s`` (the quota), ``seconds``, ``value_bytes``, ``cpus``,
``bound_mib`` (what Kafka's measurement lets a client send in the run: the quota over the run
plus the 10 s the first window counts at least; once a burst leaves the window, the client may
burst again), and per
producer (``throttled``, ``free``): ``mib``, ``mib_per_s`` (values acknowledged over the run),
``steady_mib_per_s`` (after the first 11 s), ``throttle_ms_avg`` / ``throttle_ms_max`` (the
brokers' throttle times librdkafka reports in its statistics, averaged over the intervals that
had any, and the largest), ``errors``. The machine is shared: figures are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from spark_read import RAYLOG, log, raylog_up

TOPIC = "quotas"
MIB = 1024 * 1024
WINDOW_S = 11.0  # quota.window.num x quota.window.size.seconds: the first window is free-ish


def raylog(data_dir: Path, *args: str) -> str:
    done = subprocess.run(
        [*RAYLOG, *args, "--data-dir", str(data_dir)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout


def run_producer(
    bootstrap: str, client_id: str, seconds: float, value: bytes, out: dict[str, Any]
) -> None:
    from confluent_kafka import Producer

    throttles: list[tuple[float, float]] = []  # per statistics interval: (avg, max) ms

    def on_stats(raw: str) -> None:
        for broker in json.loads(raw).get("brokers", {}).values():
            window = broker.get("throttle", {})
            if window.get("cnt", 0):
                throttles.append((window["avg"], window["max"]))

    acked: list[tuple[float, int]] = []  # (monotonic s, bytes)
    errors = [0]

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors[0] += 1
        else:
            acked.append((time.monotonic(), len(msg.value())))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "acks": "all",
            "linger.ms": 5,
            "statistics.interval.ms": 1000,
            "stats_cb": on_stats,
            "queue.buffering.max.kbytes": 16384,
        }
    )
    started = time.monotonic()
    end = started + seconds
    while time.monotonic() < end:  # bounded by the run's length
        try:
            producer.produce(TOPIC, value, on_delivery=on_delivery)
        except BufferError:  # the local queue is full: the broker (or its throttle) holds it
            producer.poll(0.05)
            continue
        producer.poll(0)
    producer.flush(60)
    total = sum(n for _, n in acked if _ <= end)
    steady = sum(n for t, n in acked if started + WINDOW_S <= t <= end)
    out[client_id] = {
        "mib": round(total / MIB, 2),
        "mib_per_s": round(total / MIB / seconds, 3),
        "steady_mib_per_s": round(steady / MIB / max(seconds - WINDOW_S, 1e-9), 3),
        "throttle_ms_avg": round(sum(a for a, _ in throttles) / len(throttles), 1)
        if throttles
        else 0.0,
        "throttle_ms_max": max((m for _, m in throttles), default=0),
        "errors": errors[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate-mib", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--value-bytes", type=int, default=10_000)
    args = parser.parse_args()
    value = os.urandom(args.value_bytes)
    with tempfile.TemporaryDirectory(prefix="raylog-bench-") as tmp:
        data_dir = Path(tmp) / "up"
        with raylog_up(data_dir) as bootstrap:
            raylog(data_dir, "topics", "create", TOPIC, "--partitions", "1",
                   "--replication-factor", "1")  # fmt: skip
            rate = int(args.rate_mib * MIB)
            raylog(data_dir, "quotas", "alter", "--client-id", "throttled", "--set",
                   f"producer_byte_rate={rate}")  # fmt: skip
            time.sleep(1.0)  # the gateways' metadata poll (200 ms) carries the quota
            log(f"two producers for {args.seconds} s, one at {args.rate_mib} MiB/s")
            results: dict[str, Any] = {}
            threads = [
                threading.Thread(
                    target=run_producer,
                    args=(bootstrap, name, args.seconds, value, results),
                )
                for name in ("throttled", "free")
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=args.seconds + 120)
    print(
        json.dumps(
            {
                "rate_mib_per_s": args.rate_mib,
                "seconds": args.seconds,
                "value_bytes": args.value_bytes,
                "cpus": os.cpu_count(),
                "bound_mib": round(args.rate_mib * (args.seconds + WINDOW_S - 1), 2),
                **results,
            },
            indent=2,
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
