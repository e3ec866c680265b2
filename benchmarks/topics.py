"""How long a new topic takes to serve: from the CreateTopics call until every partition acks an
acks=all produce, on `raylog up` (3 brokers on one machine).

Starts `raylog up`, then creates one topic of ``--partitions`` partitions (RF ``--rf``) through
confluent-kafka's AdminClient (``--via kafka``, CreateTopics with ``operation_timeout``) or
`raylog topics create` (``--via cli``), and produces with acks=all to every partition until
each has acked one record. Each replica is a Ray actor (a process), so the figure is dominated
by how fast Ray starts ``partitions x rf`` processes on the machine.

    .venv/bin/python benchmarks/topics.py [--partitions 30] [--rf 3] [--via kafka|cli]

Prints one JSON document, last on stdout: ``create_answered_s`` (CreateTopics or the CLI
returned), ``create_error`` (None, or what it answered), ``all_acked_s`` (every partition acked
acks=all; the goal is 2 s for 30x3), ``load_average`` (the machine's 1-minute load when done:
on a shared machine the figure moves with it) and ``cpus``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from spark_read import RAYLOG, raylog_up

ACK_DEADLINE_S = 600.0  # the whole wait is bounded
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=30)
    parser.add_argument("--rf", type=int, default=3)
    parser.add_argument("--via", choices=("kafka", "cli"), default="kafka")
    parser.add_argument("--timeout", type=float, default=120.0, help="CreateTopics' wait, s")
    args = parser.parse_args()
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
    print(
        json.dumps(
            {
                "partitions": args.partitions,
                "replication_factor": args.rf,
                "via": args.via,
                "create_answered_s": round(answered, 2),
                "create_error": error,
                "all_acked_s": round(all_acked, 2) if ok else None,
                "load_average": round(os.getloadavg()[0], 1),
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
