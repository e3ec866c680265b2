"""The lease across real processes on a real S3 API (moto's server): the claims under test.

Three contender processes each run a ``LeaseKeeper`` against one lease object and log, on the
machine's shared monotonic clock, when each hold started and until when it was valid. Then:

1. the first holder is killed with SIGKILL: another process takes over within
   ``lease_ms + poll_ms`` (+ slack) and at epoch 2;
2. the new holder loses the object store (every call raises, as when S3 is unreachable): it
   demotes itself, and only then does the third process win, at epoch 3;
3. over the whole run, holding intervals never overlap and each epoch has one holder.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from support.cut_store import CutStore
from support.waiting import wait_until

from raylog.storage.leasekeeper import LeaseKeeper, monotonic_ms
from raylog.storage.s3store import S3ObjectStore

LEASE_MS, RENEW_MS, POLL_MS = 1500, 500, 200
TAKEOVER_SLACK_MS = 600  # request latency and scheduling on a shared 2-core machine
CONTENDER_STEPS_MAX = 100_000  # each contender is killed long before this


def contend(s3_kwargs: dict[str, Any], bucket: str, name: str, workdir: str) -> None:
    """Child process: contend for the lease; log 'start|until|end <epoch> <monotonic ms>'."""
    log_path, cut_path = Path(workdir) / f"{name}.log", Path(workdir) / f"{name}.cut"
    store = S3ObjectStore(
        bucket,
        connect_timeout_s=0.5,
        read_timeout_s=0.5,
        read_attempts_max=1,
        probe=False,
        **s3_kwargs,
    )
    keeper = LeaseKeeper(
        CutStore(store, cut_path.exists),
        name,
        lease_ms=LEASE_MS,
        renew_ms=RENEW_MS,
        poll_ms=POLL_MS,
    )
    with open(log_path, "a", buffering=1) as log:
        epoch, last_until = None, None
        for steps in range(CONTENDER_STEPS_MAX):
            wait_ms = keeper.step()
            if steps == 0:
                log.write(f"ready 0 {monotonic_ms()}\n")
            hold = keeper.hold()
            if hold is not None:
                if epoch is None:
                    epoch = hold.epoch
                    log.write(f"start {epoch} {hold.since_ms}\n")
                if hold.until_ms != last_until:
                    log.write(f"until {epoch} {hold.until_ms}\n")
                    last_until = hold.until_ms
            elif epoch is not None:
                assert last_until is not None
                log.write(f"end {epoch} {min(monotonic_ms(), last_until)}\n")
                epoch, last_until = None, None
            if wait_ms is None:
                return
            time.sleep(wait_ms / 1000)


def read_log(workdir: Path, name: str) -> list[tuple[str, int, int]]:
    path = workdir / f"{name}.log"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    # The last line may be partial if the process is writing it right now.
    return [(k, int(e), int(t)) for k, e, t in (ln.split() for ln in lines if ln.count(" ") == 2)]


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    return wait_until(condition, timeout_s=timeout_s, interval_s=0.01, message=what)


def first_start(workdir: Path, names: list[str], epoch: int) -> tuple[str, int] | None:
    for name in names:
        for kind, e, t in read_log(workdir, name):
            if kind == "start" and e == epoch:
                return name, t
    return None


def intervals(workdir: Path, name: str, killed_at_ms: int | None) -> list[tuple[int, int, int]]:
    """(start, end, epoch) holds of one process; a hold open at SIGKILL ends at the kill."""
    result, start = [], None
    for kind, epoch, t in read_log(workdir, name):
        if kind == "start":
            start = (epoch, t)
        elif kind == "end" and start is not None:
            result.append((start[1], t, epoch))
            start = None
    if start is not None:
        assert killed_at_ms is not None, f"{name} still holds epoch {start[0]} at the end"
        result.append((start[1], killed_at_ms, start[0]))
    return result


@pytest.mark.slow
def test_lease_failover_across_processes(
    s3_client_kwargs: dict[str, Any], create_bucket: Callable[..., str], tmp_path: Path
) -> None:
    bucket = create_bucket()
    ctx = multiprocessing.get_context("fork")  # fast start; each child builds its own client
    names = ["a", "b", "c"]
    processes: dict[str, Any] = {}
    killed: dict[str, int] = {}

    def start(name: str) -> None:
        process = ctx.Process(
            target=contend, args=(s3_client_kwargs, bucket, name, str(tmp_path)), daemon=True
        )
        process.start()
        processes[name] = process

    def kill(name: str) -> None:
        os.kill(processes[name].pid, signal.SIGKILL)
        killed[name] = monotonic_ms()
        processes[name].join(timeout=10)

    try:
        # 0. 'a' acquires alone (epoch 1); then 'b' and 'c' start polling.
        start("a")
        wait_for(lambda: first_start(tmp_path, ["a"], 1), 15, "a to acquire epoch 1")
        start("b")
        start("c")
        for name in ("b", "c"):
            wait_for(lambda n=name: read_log(tmp_path, n), 15, f"{name} to start polling")

        # 1. SIGKILL the holder: one of the others takes over within lease + poll (+ slack).
        kill("a")
        winner, won_at = wait_for(
            lambda: first_start(tmp_path, ["b", "c"], 2), 10, "a takeover at epoch 2"
        )
        takeover_ms = won_at - killed["a"]
        assert takeover_ms <= LEASE_MS + POLL_MS + TAKEOVER_SLACK_MS, takeover_ms

        # 2. The new holder loses the object store: it demotes before the third one wins.
        other = "c" if winner == "b" else "b"
        (tmp_path / f"{winner}.cut").touch()
        cut_at = monotonic_ms()
        _, third_at = wait_for(
            lambda: first_start(tmp_path, [other], 3), 10, f"{other} to take over at epoch 3"
        )
        ends = [t for kind, e, t in read_log(tmp_path, winner) if kind == "end" and e == 2]
        assert ends, f"{winner} never demoted after losing the store"
        assert ends[0] <= cut_at + LEASE_MS, "demoted later than lease_ms after the cut"
        assert ends[0] <= third_at
    finally:
        for name, process in processes.items():
            if process.is_alive():
                kill(name)

    # 3. Over the whole run: no two holds overlap, epochs grow by one per new holder.
    holds = sorted(hold for name in names for hold in intervals(tmp_path, name, killed.get(name)))
    assert [epoch for _, _, epoch in holds] == [1, 2, 3], holds
    for (_, end, _), (next_start, _, _) in pairwise(holds):
        assert end <= next_start, holds
    print(f"takeover after SIGKILL: {takeover_ms} ms; holds: {holds}")
