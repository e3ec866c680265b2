"""The Prometheus endpoint of `raylog up`, scraped over HTTP and parsed by prometheus-client.

Proves: `raylog up` prints the metrics URL beside the bootstrap servers and serves Kafka's
health metrics there; per-partition log end offsets and high watermarks equal what was produced
with acks=all; produce requests are counted with a latency histogram and bytes in and out; a
busy metrics port is refused in one line before anything starts. (A hard-killed broker seen in
the metrics, as under-replicated partitions, ISR shrinks and a leader election, and its return
as ISR expands, is test_cli_commands.py's: the same kill that `topics describe` shows.)
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import Producer
from support.cluster import RAYLOG, Samples, UpProcess, cli_env, free_port_block, scrape, total
from support.waiting import wait_until

TOPIC = "m"
PARTITIONS = 2
RECORDS_PER_PARTITION = {0: 7, 1: 12}
WAIT_S = 60.0


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def produce(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    failed: list[str] = []
    for partition, count in RECORDS_PER_PARTITION.items():
        for i in range(count):
            producer.produce(
                TOPIC, value=f"v{i}".encode(), partition=partition,
                on_delivery=lambda err, _msg: failed.append(str(err)) if err else None,
            )  # fmt: skip
            producer.flush(WAIT_S)  # one batch per record: offsets count records exactly
    assert failed == []


@pytest.mark.slow
def test_metrics_endpoint_reports_cluster_health(shared_up: UpProcess) -> None:
    # The session's shared cluster (healed, so every ISR is whole): other modules' topics may
    # remain (__consumer_offsets), so counts cover the whole cluster and counters are compared
    # with their values before this test's events.
    up = shared_up
    url = f"http://127.0.0.1:{up.port + up.brokers}/metrics"  # default: after the gateways
    assert up.metrics_url == url
    created = up.raylog(
        "topics", "create", TOPIC, "--partitions", str(PARTITIONS),
        "--replication-factor", "3",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr

    before = scrape(url)
    assert value(before, "raylog_active_controller_count") == 1
    assert value(before, "raylog_under_replicated_partitions") == 0
    assert value(before, "raylog_offline_partitions_count") == 0
    assert value(before, "raylog_under_min_isr_partition_count") == 0
    assert value(before, "raylog_offline_replica_count") == 0
    assert value(before, "raylog_scrape_errors") == 0

    produce(up.bootstrap)
    # The high watermark reaches the log end once followers fetched (acks=all: already).
    after = wait_until(
        lambda: (
            (s := scrape(url))
            and all(
                value(s, "raylog_high_watermark", topic=TOPIC, partition=str(p)) == n
                for p, n in RECORDS_PER_PARTITION.items()
            )
            and s
        ),
        timeout_s=WAIT_S,
        message="high watermarks at the produced counts",
    )
    for p, n in RECORDS_PER_PARTITION.items():
        assert value(after, "raylog_log_end_offset", topic=TOPIC, partition=str(p)) == n
    produced = sum(RECORDS_PER_PARTITION.values())
    assert total(after, "raylog_requests_total", request="Produce") >= produced
    assert total(after, "raylog_request_latency_seconds_count", request="Produce") >= produced
    assert total(after, "raylog_request_latency_seconds_bucket", request="Produce",
                 le="+Inf") >= produced  # fmt: skip
    assert total(after, "raylog_request_latency_seconds_sum", request="Produce") > 0
    assert total(after, "raylog_bytes_in_total") > 0
    assert total(after, "raylog_bytes_out_total") > 0
    lags = {
        k: v for k, v in after.items() if k[0] == "raylog_follower_lag" and ("topic", TOPIC) in k[1]
    }
    assert len(lags) == PARTITIONS * 2  # two followers per partition of this test's topic


def test_busy_metrics_port_is_refused_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gateway = free_port_block(1)
        proc = subprocess.run(
            [*RAYLOG, "up", "--brokers", "1", "--port", str(gateway),
             "--metrics-port", str(port), "--data-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=WAIT_S, env=cli_env(),
        )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"raylog: metrics port 127.0.0.1:{port} is not available")
    assert len(proc.stderr.strip().splitlines()) == 1
