"""A slow but alive follower (issue 31), on real Ray: three replica actors with their WALs on
disk, the test standing in for the controller (``support.stand_in_controller`` commits the
replicas' AlterPartition proposals).

Follower 2's process is paused and resumed in a cycle (stopped 4 s, running 0.1 s: alive, and
fetching now and then, but never caught up for ``replica.lag.time.max.ms``, 3 s here) while a
producer writes with acks=all and ``min.insync.replicas=2``. Proves:
- the leader shrinks follower 2 out of the ISR, and acks=all writes go on being acknowledged
  with the ISR {0, 1} while follower 2 stays slow;
- once follower 2 runs at full speed again it catches up and rejoins the ISR, its log
  byte-identical to the leader's below the high watermark, and every acknowledged write is in
  it.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import ray
from support.replica_reads import served_batches
from support.stand_in_controller import StandInController
from support.waiting import wait_until

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.storage import batch as rb

pytestmark = pytest.mark.slow

TOPIC = "slow-follower"
REPLICAS = (0, 1, 2)
CALL_TIMEOUT_S = 30.0
LAG_MAX_MS = 3000
STOPPED_S, RUNNING_S = 4.0, 0.1  # the slow follower's cycle
WRITES_WHILE_SLOW = 20  # acks=all writes acknowledged after the shrink, follower 2 still slow


def _get(ref: Any) -> Any:
    return ray.get(ref, timeout=CALL_TIMEOUT_S)


def _batch(i: int) -> bytes:
    return rb.build_batch([rb.Record(str(i).encode(), bytes(200), 1_700_000_000_000 + i)])


class _Slow:
    """Pauses and resumes a process in a cycle, in a thread, until stopped (it always ends
    resumed)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():  # bounded by stop(); each turn waits at most 4.1 s
                os.kill(self.pid, signal.SIGSTOP)
                self._stop.wait(STOPPED_S)
                os.kill(self.pid, signal.SIGCONT)
                self._stop.wait(RUNNING_S)
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def __enter__(self) -> _Slow:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=CALL_TIMEOUT_S)
        os.kill(self.pid, signal.SIGCONT)


def test_a_slow_follower_leaves_the_isr_writes_go_on_and_it_rejoins(
    ray_local: Path, tmp_path: Path
) -> None:
    config = ReplicaConfig(
        min_insync_replicas=2, fetch_max_wait_ms=100, replica_lag_time_max_ms=LAG_MAX_MS
    )
    controller = StandInController.remote(REPLICAS)  # type: ignore[attr-defined]
    replicas = {
        rid: ReplicaActor.options(  # type: ignore[attr-defined]
            name=replica_actor_name(TOPIC, 0, rid), namespace=NAMESPACE
        ).remote(TOPIC, 0, rid, str(tmp_path / f"r{rid}"), {"min.insync.replicas": "2"}, config)
        for rid in REPLICAS
    }
    try:
        _get([r.set_controller.remote(controller) for r in replicas.values()])
        _get(replicas[0].become_leader.remote(BecomeLeader(1, 1, 1, REPLICAS, REPLICAS)))
        for rid in (1, 2):
            _get(replicas[rid].become_follower.remote(BecomeFollower(1, 0, 1, 1)))
        acked: dict[int, int] = {}  # write -> its offset
        for i in range(10):
            outcome = _get(replicas[0].produce.remote(_batch(i), -1, 10_000))
            assert outcome.error_code == 0, outcome
            acked[i] = outcome.base_offset

        with _Slow(_get(replicas[2].pid.remote())):
            i = len(acked)

            def write() -> None:
                nonlocal i
                outcome = _get(replicas[0].produce.remote(_batch(i), -1, 10_000))
                if outcome.error_code == 0:  # a write waiting on follower 2 may time out
                    acked[i] = outcome.base_offset
                i += 1

            def shrunk() -> bool:
                write()
                return _get(controller.state.remote())[0] == (0, 1)

            wait_until(shrunk, timeout_s=60, message="follower 2 shrunk out of the ISR")
            for _ in range(WRITES_WHILE_SLOW):  # follower 2 still slow: writes go on
                before = len(acked)
                write()
                assert len(acked) == before + 1, "an acks=all write failed with the ISR {0, 1}"

        wait_until(
            lambda: _get(controller.state.remote())[0] == REPLICAS,
            timeout_s=60,
            message="follower 2 rejoined the ISR",
        )
        hw = _get(replicas[0].state.remote()).high_watermark
        wait_until(
            lambda: _get(replicas[2].state.remote()).log_end_offset >= hw,
            timeout_s=CALL_TIMEOUT_S,
            message="follower 2 caught up",
        )
        leader_log = served_batches(replicas[0], hw)
        assert served_batches(replicas[2], hw) == leader_log
        stored = {h.base_offset: h for _, h in rb.iter_batches(leader_log)}
        assert all(offset in stored for offset in acked.values()), "an acknowledged write lost"
        assert _get(controller.state.remote())[1] == [], "a replica went offline"
    finally:
        for replica in replicas.values():
            ray.kill(replica)
