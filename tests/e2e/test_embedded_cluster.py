"""The embedded cluster as a user drives it: `raylog up`, `raylog topics create`, Kafka clients.

Proves, with the object store on S3 (moto's server on loopback, the production shape; the
other cluster tests use the default store in the data dir): `raylog up --brokers 3` keeps its
lease and metadata in the bucket, starts controllers, brokers and one gateway per broker and prints
the bootstrap servers; `raylog topics create` makes an RF=3 topic through the active controller
and `raylog topics describe` shows it; records produced with acks=all by confluent-kafka come
back through kcat and through an assigned, seeking confluent-kafka consumer; a new consumer
group's first offset commit succeeds at once (no COORDINATOR_LOAD_IN_PROGRESS on a cluster that
said ready) and reads back; SIGINT stops the
cluster with exit 0; a second `raylog up` on the same data dir is the same cluster (its id), serves
the same topic, every record and a consumer group's committed offsets, and stops with exit 0 on
SIGTERM. The first cluster stops with the preferred leader of partition 0 stopped before it (a
controlled shutdown: its leaderships moved and it left the ISRs), so the second starts with
partitions whose preferred replica must catch up before it can lead: once `raylog up` says
ready, every partition is led by its preferred replica again, or `raylog up` said which it
could not move in time and the controller's leader rebalance moves them. While it runs,
cluster.json says how to join it (this process's PID, a loopback Ray address, a token only its
owner reads); it is gone after each stop. A busy gateway port is refused in one line with exit 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from support.cluster import RAYLOG, START_DEADLINE_S, STOP_DEADLINE_S
from support.cluster import Lines as _Lines
from support.cluster import free_port_block as _free_port_block
from support.waiting import wait_until

pytestmark = pytest.mark.slow

TOPIC = "t"
PARTITIONS = 2
RECORDS = 20
CLIENT_TIMEOUT_S = 60.0
KCAT = "/usr/bin/kcat"
KCAT_FORMAT = "%p %k %s\\n"  # partition, key, value; kcat expands the escape


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return env


def _up(
    data_dir: Path,
    port: int,
    *extra: str,
    env: dict[str, str] | None = None,
    stderr: Path | None = None,
) -> subprocess.Popen[str]:
    """`raylog up`; its stderr to the file ``stderr`` when given (read once it is ready)."""
    with contextlib.ExitStack() as files:
        err = files.enter_context(stderr.open("w")) if stderr else subprocess.PIPE
        return subprocess.Popen(
            [*RAYLOG, "up", "--brokers", "3", "--port", str(port), "--data-dir", str(data_dir),
             *extra],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env or _env(),
        )  # fmt: skip


# What `raylog up` says when it could not put every leader back in time (embedded.py).
NOT_PREFERRED = "not led by their preferred replica"
REBALANCE_DEADLINE_S = 180.0  # leader.imbalance.check.interval.seconds is 30


def _raylog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RAYLOG, *args], capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, env=_env()
    )


def _bootstrap(lines: list[str]) -> str:
    found = [line.split()[-1] for line in lines if line.strip().startswith("bootstrap:")]
    assert found, lines
    return found[-1]


def _cluster_id(lines: list[str]) -> str:
    """The id in `raylog up`'s first line, ``raylog cluster <id>`` (kept in the object store)."""
    found = [line.split()[-1] for line in lines if line.startswith("raylog cluster ")]
    assert found, lines
    return found[0]


def _stop(proc: subprocess.Popen[str], lines: _Lines, sig: int = signal.SIGINT) -> None:
    proc.send_signal(sig)
    lines.wait_for("raylog stopped", STOP_DEADLINE_S)
    assert proc.wait(timeout=STOP_DEADLINE_S) == 0


def _produce(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    failed: list[str] = []
    for i in range(RECORDS):
        producer.produce(
            TOPIC,
            key=str(i).encode(),
            value=f"v{i}".encode(),
            partition=i % PARTITIONS,
            on_delivery=lambda err, _msg: failed.append(str(err)) if err else None,
        )
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    assert failed == []


def _expected() -> set[tuple[int, str, str]]:
    return {(i % PARTITIONS, str(i), f"v{i}") for i in range(RECORDS)}


def _read_kcat(bootstrap: str) -> set[tuple[int, str, str]]:
    out = subprocess.run(
        [
            KCAT,
            "-b",
            bootstrap,
            "-C",
            "-t",
            TOPIC,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            KCAT_FORMAT,
        ],
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
        check=True,
    ).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return {(int(p), k, v) for p, k, v in rows}


def _read_assigned(bootstrap: str) -> set[tuple[int, str, str]]:
    """assign() then seek() to offset 0 of each partition: no group coordinator needed."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    got: set[tuple[int, str, str]] = set()
    try:
        parts = [TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)]
        consumer.assign(parts)
        for tp in parts:
            # seek() needs the assignment active; retry while the client fetches metadata.
            wait_until(lambda tp=tp: _seek(consumer, tp), timeout_s=CLIENT_TIMEOUT_S)

        def all_read() -> bool:
            for msg in consumer.consume(num_messages=RECORDS, timeout=0.5):
                if msg.error() is None:
                    got.add((msg.partition(), msg.key().decode(), msg.value().decode()))
            return len(got) >= RECORDS

        wait_until(all_read, timeout_s=CLIENT_TIMEOUT_S, message="every record consumed")
    finally:
        consumer.close()
    return got


def _partitions(data_dir: Path) -> list[dict[str, Any]]:
    """TOPIC's partitions as `raylog topics describe --json` shows them."""
    done = _raylog("topics", "describe", TOPIC, "--json", "--data-dir", str(data_dir))
    assert done.returncode == 0, done.stderr
    text = done.stdout[done.stdout.index("[") :]  # after any "(raylet)" line
    [topic] = json.loads(text)
    return list(topic["partitions"])


def _off_preferred(data_dir: Path) -> list[dict[str, Any]]:
    """The partitions of TOPIC not led by their first replica."""
    return [p for p in _partitions(data_dir) if p["leader"] != p["replicas"][0]]


GROUP = "restart-readers"
COMMITTED = {0: 7, 1: 4}  # partition -> the offset the group commits before the restart


def _group_offsets(bootstrap: str, commit: bool) -> dict[int, int]:
    """The committed offsets of GROUP (after committing COMMITTED first, with ``commit``).

    The commit is the new group's first, made once, synchronously, without subscribing:
    librdkafka retries an OffsetCommit answered COORDINATOR_LOAD_IN_PROGRESS only twice within
    a few hundred milliseconds and then raises, so it succeeds only if `raylog up` said ready
    once the group coordinators serve their ``__consumer_offsets`` partitions."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False}
    )
    try:
        if commit:
            offsets = [TopicPartition(TOPIC, p, o) for p, o in COMMITTED.items()]
            consumer.commit(offsets=offsets, asynchronous=False)  # raises KafkaException
        parts = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        got = consumer.committed(parts, timeout=CLIENT_TIMEOUT_S)
        return {tp.partition: tp.offset for tp in got}
    finally:
        consumer.close()


def _seek(consumer: Consumer, tp: TopicPartition) -> bool:
    try:
        consumer.seek(tp)
    except KafkaException:
        return False
    return True


def test_up_topics_produce_consume_restart(
    tmp_path: Path, s3_client_kwargs: dict[str, Any], create_bucket: Callable[..., str]
) -> None:
    """On S3 (moto's server), the production shape: the CLI and the controller actors alike
    reach the bucket, which keeps the lease, the metadata and the cluster's identity."""
    import boto3

    bucket = create_bucket()
    env = {
        **_env(),
        "AWS_ACCESS_KEY_ID": s3_client_kwargs["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": s3_client_kwargs["aws_secret_access_key"],
        "AWS_DEFAULT_REGION": s3_client_kwargs["region_name"],
    }
    store = (
        "--object-store",
        f"s3://{bucket}/c1",
        "--s3-endpoint",
        s3_client_kwargs["endpoint_url"],
    )
    data_dir = tmp_path / "data"
    port = _free_port_block(3)

    proc = _up(data_dir, port, *store, env=env)
    try:
        lines = _Lines(proc)
        started = lines.wait_for("raylog ready", START_DEADLINE_S)
        cluster_id = _cluster_id(started)
        bootstrap = _bootstrap(started)
        assert bootstrap == ",".join(f"127.0.0.1:{port + i}" for i in range(3))
        info = json.loads((data_dir / "cluster.json").read_text())
        assert info["pid"] == proc.pid
        assert info["ray_address"].startswith("127.0.0.1:")
        assert (data_dir / "ray-token").stat().st_mode & 0o077 == 0

        created = _raylog(
            "topics", "create", TOPIC, "--partitions", str(PARTITIONS),
            "--replication-factor", "3", "--config", "min.insync.replicas=2",
            "--data-dir", str(data_dir),
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        again = _raylog("topics", "create", TOPIC, "--data-dir", str(data_dir))
        assert again.returncode == 1
        # Ray relays raylet warnings (worker start-up) to every driver's stderr: not ours.
        ours = [line for line in again.stderr.splitlines() if "(raylet)" not in line]
        assert len(ours) == 1 and "TopicAlreadyExists" in ours[0], again.stderr

        _produce(bootstrap)
        assert _read_kcat(bootstrap) == _expected()
        assert _read_assigned(bootstrap) == _expected()
        assert _group_offsets(bootstrap, commit=True) == COMMITTED
        keys = {
            o["Key"]
            for o in boto3.client("s3", **s3_client_kwargs)
            .list_objects_v2(Bucket=bucket)
            .get("Contents", [])
        }
        assert {"c1/controller/lease", "c1/metadata/cluster.json"} <= keys, keys
        # Leadership off a preferred replica that is out of the ISRs at the next start.
        preferred = _partitions(data_dir)[0]["replicas"][0]
        stopped = _raylog("brokers", "stop", str(preferred), "--data-dir", str(data_dir))
        assert stopped.returncode == 0, stopped.stderr
        assert _off_preferred(data_dir), "the controlled shutdown moves partition 0's leader"
        _stop(proc, lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (data_dir / "cluster.json").exists()

    up_stderr = tmp_path / "up-again.err"
    proc = _up(data_dir, port, *store, env=env, stderr=up_stderr)
    try:
        lines = _Lines(proc)
        try:
            started = lines.wait_for("raylog ready", START_DEADLINE_S)
        except AssertionError as e:
            raise AssertionError(f"{e}; stderr {up_stderr.read_text()!r}") from None
        assert _cluster_id(started) == cluster_id, "the cluster identity must survive a restart"
        bootstrap = _bootstrap(started)
        described = _raylog("topics", "describe", TOPIC, "--data-dir", str(data_dir))
        assert described.returncode == 0, described.stderr
        rows = [line for line in described.stdout.splitlines() if "Partition:" in line]
        assert len(rows) == PARTITIONS
        assert all("Replicas: " in r and "LeaderEpoch: " in r for r in rows)
        # Leadership is back on the preferred replicas by the time `raylog up` says ready (the
        # broker stopped first caught up, rejoined the ISRs and was elected), or `raylog up`
        # said it could not do it in time (a slow machine) and the controller's automatic
        # leader rebalance does it later.
        said = [line for line in up_stderr.read_text().splitlines() if NOT_PREFERRED in line]
        if not said:
            assert _off_preferred(data_dir) == []
        else:
            wait_until(
                lambda: _off_preferred(data_dir) == [],
                timeout_s=REBALANCE_DEADLINE_S,
                interval_s=1.0,
                message=f"the rebalance after {said[0]!r}",
            )
        assert _read_kcat(bootstrap) == _expected()
        assert _read_assigned(bootstrap) == _expected()
        assert _group_offsets(bootstrap, commit=False) == COMMITTED  # kept in __consumer_offsets
        _stop(proc, lines, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (data_dir / "cluster.json").exists()


def test_up_refuses_busy_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [*RAYLOG, "up", "--brokers", "1", "--port", str(port), "--data-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=CLIENT_TIMEOUT_S,
            env=_env(),
        )
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"raylog: port 127.0.0.1:{port} is not available")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_topics_without_a_cluster_fail_in_one_line(tmp_path: Path) -> None:
    proc = _raylog("topics", "describe", "--data-dir", str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.startswith("raylog: no raylog cluster is running from ")
    assert len(proc.stderr.strip().splitlines()) == 1
