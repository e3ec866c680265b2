"""Watch a running `raylog up` cluster's controllers and replicas from a process of its own.

``python controller_watch.py DATA_DIR`` joins the cluster's Ray with the data dir's token (a
separate process: Ray reads its token when it is imported, and the test process has its own Ray
session) and, until a line or EOF arrives on stdin (at most WATCH_MAX_S), prints one JSON line
per round, a round every ROUND_S::

    {"sent": t0, "done": t1, "active": [0], "answered": [0, 1],
     "replicas": [[topic, partition, replica_id, role, leader_epoch, high_watermark,
                   log_end_offset], ...]}

``sent`` and ``done``: ``time.monotonic()`` (the machine's clock, the test's too) when the round's
calls were sent and when the last answer came or its wait ended. ``active``: the controllers
(by index) whose status said active; ``answered``: those that answered within ROUND_WAIT_S.
``replicas``: every replica that answered its broker's ``replica_states``.

:class:`ControllerWatch` runs it from a test: ``start()``, ``rounds()`` (parsed so far),
``stop()`` (by its PID, always).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROUND_S = 0.2
ROUND_WAIT_S = 2.0  # one round's calls, all together
REPLICA_CALL_TIMEOUT_MS = 1_500
WATCH_MAX_S = 900.0
JOIN_DEADLINE_S = 60.0
STOP_DEADLINE_S = 30.0


class ControllerWatch:
    """This module run as a subprocess; its rounds collected by a reader thread."""

    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self._args = [sys.executable, str(Path(__file__).resolve()), str(data_dir)]
        self._env = env
        self._rounds: list[dict[str, Any]] = []
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> ControllerWatch:
        self._proc = subprocess.Popen(
            self._args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self._env,
        )
        stdout = self._proc.stdout
        assert stdout is not None

        def read() -> None:
            for line in stdout:  # ends at the process's exit
                if line.startswith("{"):
                    self._rounds.append(json.loads(line))

        self._reader = threading.Thread(target=read, name="controller-watch", daemon=True)
        self._reader.start()
        from support.waiting import wait_until

        wait_until(
            lambda: self._rounds or self._proc is None or self._proc.poll() is not None,
            timeout_s=JOIN_DEADLINE_S,
            interval_s=0.1,
            message="the controller watch's first round",
        )
        if not self._rounds:
            raise AssertionError(f"the controller watch ended: {self.stderr_tail()}")
        return self

    def rounds(self) -> list[dict[str, Any]]:
        return list(self._rounds)

    def stderr_tail(self) -> str:
        if self._proc is None or self._proc.poll() is None or self._proc.stderr is None:
            return ""
        return self._proc.stderr.read()[-2000:]

    def stop(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()  # EOF: its last round, then it exits
            proc.wait(timeout=STOP_DEADLINE_S)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=STOP_DEADLINE_S)
        if self._reader is not None:
            self._reader.join(timeout=STOP_DEADLINE_S)


def _round(ray: Any, controllers: list[Any], supervisor: Any) -> dict[str, Any]:
    sent = time.monotonic()
    statuses = [c.status.remote() for c in controllers]
    handles_ref = supervisor.handles.remote()
    ready, _ = ray.wait([handles_ref], timeout=ROUND_WAIT_S)
    handles = ray.get(handles_ref) if ready else {}
    states = [b.replica_states.remote(REPLICA_CALL_TIMEOUT_MS) for b, _ in handles.values()]
    pending = [*statuses, *states]
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=ROUND_WAIT_S)
    done = time.monotonic()
    finished = set(ready)
    active, answered, replicas = [], [], []
    for index, ref in enumerate(statuses):
        if ref in finished:
            try:
                status = ray.get(ref)
            except Exception:  # a controller restarting: not an answer
                continue
            answered.append(index)
            if status.active:
                active.append(index)
    for ref in states:
        if ref in finished:
            try:
                found = ray.get(ref)
            except Exception:  # a broker restarting: its replicas are missing from this round
                continue
            replicas.extend(
                [s.topic, s.partition, s.replica_id, s.role, s.leader_epoch, s.high_watermark,
                 s.log_end_offset]
                for s in found
            )  # fmt: skip
    return {
        "sent": sent,
        "done": done,
        "active": active,
        "answered": answered,
        "replicas": replicas,
    }


def main(data_dir: str) -> int:
    from raylog.actors import raycluster

    root = Path(data_dir)
    info = raycluster.read_cluster_info(root)
    if info is None:
        raise SystemExit(f"no cluster running from {root}")
    raycluster.apply_ray_env(root)
    import ray

    from raylog.actors.calls import (
        CONTROLLERS,
        NAMESPACE,
        SUPERVISOR_ACTOR_NAME,
        controller_actor_name,
    )

    ray.init(address=info.ray_address, namespace=NAMESPACE, logging_level="WARNING")
    controllers = [
        ray.get_actor(controller_actor_name(i), namespace=NAMESPACE) for i in range(CONTROLLERS)
    ]
    supervisor = ray.get_actor(SUPERVISOR_ACTOR_NAME, namespace=NAMESPACE)
    deadline = time.monotonic() + WATCH_MAX_S
    while time.monotonic() < deadline:  # bounded; ends earlier at a line or EOF on stdin
        print(json.dumps(_round(ray, controllers, supervisor)), flush=True)
        if select.select([sys.stdin], [], [], ROUND_S)[0]:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
