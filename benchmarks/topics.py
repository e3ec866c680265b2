"""How long a new topic takes to serve: from the CreateTopics call until every partition acks an
acks=all produce, on `raylog up` (3 brokers on one machine).

Starts `raylog up`, then creates one topic of ``--partitions`` partitions (RF ``--rf``) through
confluent-kafka's AdminClient (``--via kafka``, CreateTopics with ``operation_timeout``) or
`raylog topics create` (``--via cli``), and produces with acks=all to every partition until
each has acked one record. Each replica is a Ray actor (a process), so the figure is dominated
by how fast Ray starts ``partitions x rf`` processes on the machine.

    .venv/bin/python benchmarks/topics.py [--partitions 30] [--rf 3] [--via kafka|cli]

Then, in the same cluster, each of the topic's replica processes' private memory (USS, from
``/proc/<pid>/smaps_rollup``) beside two bare Ray actors' (a class with one method): one that
was called with an argument (Ray then builds its serialization context, which imports pyarrow,
numpy and pydantic where they are installed, as they are with Ray Data) and one never given an
argument (Ray's floor).

Then, unless ``--balance-gib 0``, a balancing pass on another `raylog up` of four brokers with
continuous balancing on (checks every second, moves unthrottled: 1 GiB/s): broker 4 is
decommissioned (emptied and stopped), ``--balance-gib`` GiB of 64 KiB records go to a topic of
16 partitions, RF=2, on the three others, then `raylog brokers start 4` brings it back as a new,
empty broker and the clock runs until `raylog status` says balanced with broker 4 holding its
share: ``balance`` gives the seconds, the replicas moved, the bytes those hold and the rate.

Prints one JSON document, last on stdout: ``create_answered_s`` (CreateTopics or the CLI
returned), ``create_error`` (None, or what it answered), ``all_acked_s`` (every partition acked
acks=all; the goal is 2 s for 30x3), ``replica_private_mib`` (median, min, max over the
topic's replicas), ``bare_actor_private_mib`` / ``bare_actor_no_args_private_mib``, and
``replica_vs_bare`` / ``replica_vs_bare_no_args`` (the goal: 1.1x or less),
``load_average`` (the machine's 1-minute load when done: on a shared machine the figure moves
with it) and ``cpus``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from spark_read import RAYLOG, raylog_up

ACK_DEADLINE_S = 600.0  # the whole wait is bounded
CALL_TIMEOUT_S = 60.0
BROKER_IDS_MAX = 16  # replica actors are looked up by broker id, 0 up to this
TOPIC = "wide"


def create_kafka(bootstrap: str, partitions: int, rf: int, timeout_s: float) -> str | None:
    # librdkafka gives up on any request after socket.timeout.ms (60 s by default).
    admin = AdminClient(
        {"bootstrap.servers": bootstrap, "socket.timeout.ms": int((timeout_s + 60) * 1000)}
    )
    futures = admin.create_topics(
        [NewTopic(TOPIC, partitions, rf)],
        operation_timeout=timeout_s,
        request_timeout=timeout_s + 30,
    )
    try:
        futures[TOPIC].result(timeout=timeout_s + 60)
    except KafkaException as e:
        return str(e.args[0])
    return None


def create_cli(data_dir: Path, partitions: int, rf: int, timeout_s: float) -> str | None:
    proc = subprocess.run(
        [*RAYLOG, "topics", "create", TOPIC, "--partitions", str(partitions),
         "--replication-factor", str(rf), "--timeout", str(timeout_s),
         "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=timeout_s + 120,
    )  # fmt: skip
    return None if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()}"


def wait_all_acked(bootstrap: str, partitions: int, deadline: float) -> bool:
    """Produce acks=all to every partition until each acked one record, or the deadline; one
    record in flight per partition (a failed one is sent again)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 0,
            "message.timeout.ms": 10_000,
        }
    )
    acked: set[int] = set()
    in_flight: set[int] = set()

    def delivered(err: object, msg: object) -> None:
        partition = msg.partition()  # type: ignore[attr-defined]
        in_flight.discard(partition)
        if err is None:
            acked.add(partition)

    while len(acked) < partitions and time.monotonic() < deadline:
        for p in set(range(partitions)) - acked - in_flight:
            in_flight.add(p)
            producer.produce(TOPIC, b"x", partition=p, on_delivery=delivered)
        producer.poll(0.05)
    producer.flush(10)
    return len(acked) == partitions


def memory_figures(data_dir: Path, partitions: int) -> dict[str, Any]:
    """Private memory (MiB) of the topic's replica processes and of two bare Ray actors, all in
    the cluster of ``data_dir``."""
    from raylog.pipelines import reading

    # First: joining sets Ray's environment (the cluster's token), read when ray is imported.
    ray = reading.connect(reading.ClusterTarget.resolve(str(data_dir)))
    from raylog.actors.calls import NAMESPACE, replica_actor_name
    from raylog.actors.process_memory import private_mib

    @ray.remote(num_cpus=0)
    class Bare:
        def pid(self, *_: Any) -> int:
            return os.getpid()

    replicas: list[float] = []
    for partition in range(partitions):
        for broker in range(BROKER_IDS_MAX):
            try:
                handle = ray.get_actor(replica_actor_name(TOPIC, partition, broker), NAMESPACE)
            except ValueError:
                continue
            mib = private_mib(ray.get(handle.pid.remote(), timeout=CALL_TIMEOUT_S))
            if mib is not None:
                replicas.append(mib)
    called, floor = Bare.remote(), Bare.remote()  # type: ignore[attr-defined]
    called_mib = private_mib(ray.get(called.pid.remote({"an": "argument"}), timeout=CALL_TIMEOUT_S))
    floor_mib = private_mib(ray.get(floor.pid.remote(), timeout=CALL_TIMEOUT_S))
    if not replicas or called_mib is None or floor_mib is None:
        return {"replica_private_mib": None}
    median = statistics.median(replicas)
    return {
        "replicas_measured": len(replicas),
        "replica_private_mib": {
            "median": round(median, 1),
            "min": round(min(replicas), 1),
            "max": round(max(replicas), 1),
        },
        "bare_actor_private_mib": round(called_mib, 1),
        "bare_actor_no_args_private_mib": round(floor_mib, 1),
        "replica_vs_bare": round(median / called_mib, 2),
        "replica_vs_bare_no_args": round(median / floor_mib, 2),
    }


BALANCE_TOPIC = "bulk"
BALANCE_PARTITIONS = 16
BALANCE_VALUE = b"b" * (64 << 10)
BALANCE_CONFIGS = (
    "replica.balancer.enable=true",
    "replica.balancer.check.interval.ms=1000",
    f"replica.balancer.throttle.bytes.per.second={1 << 30}",
)
BALANCE_DEADLINE_S = 3600.0


def raylog_json(data_dir: Path, *args: str) -> Any:
    done = subprocess.run(
        [*RAYLOG, *args, "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=CALL_TIMEOUT_S * 5,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"raylog {' '.join(args)}: {done.stderr.strip()}")
    return json.loads(done.stdout) if "--json" in args else done.stdout


def balance_pass(gib: float) -> dict[str, Any]:
    """The module docstring's balancing pass."""
    extra = tuple(a for c in BALANCE_CONFIGS for a in ("--broker-config", c))
    with tempfile.TemporaryDirectory(prefix="raylog-balance-") as tmp:
        data_dir = Path(tmp) / "data"
        with raylog_up(data_dir, brokers=4, extra=extra) as bootstrap:
            raylog_json(data_dir, "brokers", "decommission", "4")
            raylog_json(data_dir, "topics", "create", BALANCE_TOPIC, "--partitions",
                        str(BALANCE_PARTITIONS), "--replication-factor", "2")  # fmt: skip
            records = int(gib * (1 << 30)) // len(BALANCE_VALUE)
            producer = Producer(
                {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                 "batch.size": 1 << 20, "queue.buffering.max.kbytes": 1 << 20}
            )  # fmt: skip
            began = time.monotonic()
            for i in range(records):
                while True:  # bounded: the queue drains as the brokers answer
                    try:
                        producer.produce(BALANCE_TOPIC, BALANCE_VALUE, partition=i % 16)
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
            if producer.flush(CALL_TIMEOUT_S * 10):
                raise RuntimeError("records still undelivered")
            produced_s = time.monotonic() - began
            raylog_json(data_dir, "brokers", "start", "4")
            began = time.monotonic()
            while True:  # bounded by BALANCE_DEADLINE_S
                status = raylog_json(data_dir, "status", "--json")
                (topic,) = raylog_json(data_dir, "topics", "describe", BALANCE_TOPIC, "--json")
                on_4 = sum(1 for p in topic["partitions"] if 4 in p["replicas"])
                if status["replica_balancer"] == "balanced" and on_4 > 0:
                    break
                if time.monotonic() - began > BALANCE_DEADLINE_S:
                    raise RuntimeError(f"not balanced: {status['replica_balancer']}")
                time.sleep(1.0)
            seconds = time.monotonic() - began
    moved_gib = on_4 * gib / BALANCE_PARTITIONS
    return {
        "gib": gib,
        "partitions": BALANCE_PARTITIONS,
        "replication_factor": 2,
        "produce_s": round(produced_s, 1),
        "seconds": round(seconds, 1),
        "replicas_moved_to_new_broker": on_4,
        "moved_gib": round(moved_gib, 2),
        "moved_mib_per_s": round(moved_gib * 1024 / seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=30)
    parser.add_argument("--rf", type=int, default=3)
    parser.add_argument("--via", choices=("kafka", "cli"), default="kafka")
    parser.add_argument("--timeout", type=float, default=120.0, help="CreateTopics' wait, s")
    parser.add_argument(
        "--balance-gib", type=float, default=10.0, help="the balancing pass's data (0: none)"
    )
    parser.add_argument("--skip-create", action="store_true", help="the balancing pass only")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    if not args.skip_create:
        out = create_and_memory(args)
    if args.balance_gib > 0:
        out["balance"] = balance_pass(args.balance_gib)
    print(json.dumps(out, indent=2))


def create_and_memory(args: argparse.Namespace) -> dict[str, Any]:
    """The topic creation and the memory figures (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="raylog-topics-") as tmp:
        data_dir = Path(tmp) / "data"
        with raylog_up(data_dir) as bootstrap:
            began = time.monotonic()
            if args.via == "kafka":
                error = create_kafka(bootstrap, args.partitions, args.rf, args.timeout)
            else:
                error = create_cli(data_dir, args.partitions, args.rf, args.timeout)
            answered = time.monotonic() - began
            ok = wait_all_acked(bootstrap, args.partitions, began + ACK_DEADLINE_S)
            all_acked = time.monotonic() - began
            memory = memory_figures(data_dir, args.partitions)
    return {
        "partitions": args.partitions,
        "replication_factor": args.rf,
        "via": args.via,
        "create_answered_s": round(answered, 2),
        "create_error": error,
        "all_acked_s": round(all_acked, 2) if ok else None,
        **memory,
        "load_average": round(os.getloadavg()[0], 1),
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    main()
