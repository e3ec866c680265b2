"""`raylog up` run as a user runs it, for tests that need a whole embedded cluster.

- ``Lines``: a process's stdout collected by a reader thread, waited on with a deadline.
- ``free_port_block``: a first loopback port with ``count`` free ports after it.
- ``started_up``: an ``UpProcess`` started, on a fresh data dir again when Ray itself did not
  start in time (the machine, not raylog).
- ``UpProcess``: one ``raylog up`` subprocess (3 brokers by default) on its own data dir and
  ports; ``start()`` waits for "raylog ready" and returns the bootstrap servers, ``stop()`` sends
  SIGINT and waits for exit 0, ``raylog(*args)`` runs a CLI command against this cluster (its
  ``--data-dir`` appended). Used as a context manager it always ends its own process, by PID.
  ``heal()`` starts the brokers a test stopped or killed and waits until every partition is
  fully replicated again: what a module sharing the session's cluster does before it starts.
  ``crash()`` SIGKILLs the `up` process and every process under it (its Ray cluster), by PID.
- ``create_durable_topic``: ``raylog topics create`` of a topic with RF=3 and
  min.insync.replicas=2 (acks=all survives one broker down), through any of the runners below.
- ``process_tree``: a process and every process under it, from /proc's parent links.
- ``RayNode``: one ``ray start --block`` node (head or worker) in a process group of its own, so
  that the test can crash the whole node (SIGKILL to the group) or stop it, by that group's id.
- ``ClusterUp``: ``raylog up --address`` on such a cluster (cluster mode); collects the
  gateways it announces; CLI commands reach it as an operator's do, through its data dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

RAYLOG = [sys.executable, "-m", "raylog.actors.cli"]
START_DEADLINE_S = 120.0
STOP_DEADLINE_S = 60.0
CLI_TIMEOUT_S = 60.0
HEAL_DEADLINE_S = 180.0
HEAL_POLL_S = 0.5
HEAL_REPLACE_AFTER_S = 60.0


class Lines:
    """Collects a process's stdout lines in a reader thread (select() on a buffered text pipe
    misses lines already in Python's buffer)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                self.queue.put(line)
            self.queue.put(None)

        self.thread = threading.Thread(target=pump, daemon=True)
        self.thread.start()

    def wait_for(self, needle: str, deadline_s: float, since: int | None = None) -> list[str]:
        """The lines so far, once one with ``needle`` comes. ``since``: a line already taken
        (while waiting for another), from ``seen[since]`` on, counts too."""
        if since is not None and any(needle in line for line in self.seen[since:]):
            return self.seen
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                line = self.queue.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                continue
            if line is None:
                break
            self.seen.append(line)
            if needle in line:
                return self.seen
        self.proc.kill()
        stderr = self.proc.stderr.read() if self.proc.stderr else ""
        raise AssertionError(f"no line with {needle!r}; got {self.seen!r}, stderr {stderr!r}")


# Ports handed to `raylog up` lie below Linux's ephemeral range (32768-60999) and above Ray's
# worker ports (10002-19999): Ray's own processes bind ephemeral ports while a cluster starts,
# and a port that was free when the test chose it could be taken by the time a gateway binds.
PORT_RANGE = (20000, 32000)
# Blocks handed out in this process: reserved for a process not started yet (a Ray node's worker
# ports, a gateway), so a later block must not overlap one although its ports are still free.
_HANDED_OUT: list[range] = []


def free_port_block(count: int) -> int:
    """A first port with ``count`` consecutive free loopback ports after it, outside the
    ephemeral range and apart from every block handed out before in this process (a random
    block, so concurrent runs rarely pick the same one)."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        first = rng.randrange(PORT_RANGE[0], PORT_RANGE[1] - count)
        block = range(first, first + count)
        if any(block.start < r.stop and r.start < block.stop for r in _HANDED_OUT):
            continue
        socks: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            _HANDED_OUT.append(block)
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no block of free ports")


def stop_up(proc: subprocess.Popen[str] | None, lines: Lines | None) -> int:
    """Stop a `raylog up` process: SIGINT, wait for "raylog stopped" and the exit; returns the
    exit code."""
    assert proc is not None and lines is not None
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        lines.wait_for("raylog stopped", STOP_DEADLINE_S)
    return proc.wait(timeout=STOP_DEADLINE_S)


def cli_env() -> dict[str, str]:
    """The environment for `raylog` subprocesses: this session's, without a Ray address (the
    CLI finds the cluster from its data dir)."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return env


def create_durable_topic(runner: Any, topic: str, partitions: int) -> None:
    """See the module docstring; ``runner`` has ``raylog(*args)`` (UpProcess, ClusterUp)."""
    created = runner.raylog(
        "topics", "create", topic, "--partitions", str(partitions),
        "--replication-factor", "3", "--config", "min.insync.replicas=2",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr


def bootstrap_of(lines: list[str]) -> str:
    found = [line.split()[-1] for line in lines if line.strip().startswith("bootstrap:")]
    assert found, lines
    return found[-1]


class UpProcess:
    """One `raylog up` subprocess with ``brokers`` brokers on consecutive free ports."""

    def __init__(
        self, data_dir: Path, *extra: str, brokers: int = 3, port: int | None = None
    ) -> None:
        self.data_dir = data_dir
        self.brokers = brokers
        # brokers gateways, then the metrics endpoint (default: the port after the last gateway)
        self.port = port if port is not None else free_port_block(brokers + 1)
        self.extra = extra
        self.proc: subprocess.Popen[str] | None = None
        self.lines: Lines | None = None
        self.bootstrap = ""

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint `raylog up` printed (``metrics: URL``)."""
        assert self.lines is not None
        for line in self.lines.seen:
            words = line.split()
            if len(words) == 2 and words[0] == "metrics:":
                return words[1]
        raise AssertionError("raylog up printed no metrics URL")

    def start(self) -> str:
        """Start `raylog up` and wait until it is ready; returns the bootstrap servers."""
        self.proc = subprocess.Popen(
            [
                *RAYLOG, "up", "--brokers", str(self.brokers), "--port", str(self.port),
                "--data-dir", str(self.data_dir), *self.extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )  # fmt: skip
        self.lines = Lines(self.proc)
        self.bootstrap = bootstrap_of(self.lines.wait_for("raylog ready", START_DEADLINE_S))
        return self.bootstrap

    def raylog(
        self, *args: str, timeout_s: float = CLI_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run ``raylog ARGS --data-dir D`` against this cluster."""
        return subprocess.run(
            [*RAYLOG, *args, "--data-dir", str(self.data_dir)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=cli_env(),
        )

    def stop(self) -> int:
        """SIGINT, wait for "raylog stopped" and the exit; returns the exit code."""
        return stop_up(self.proc, self.lines)

    def document(self, *args: str) -> Any:
        """``raylog ARGS --json``'s document. Ray's raylet may print a warning line to a
        driver's stdout under load ("(raylet) WARNING: ..."), so it starts at the line that
        opens it."""
        done = self.raylog(*args, "--json")
        assert done.returncode == 0, done.stderr[-2000:]
        lines = done.stdout.splitlines()
        start = next((i for i, line in enumerate(lines) if line[:1] in "{["), None)
        assert start is not None, done.stdout[-2000:]
        return json.loads("\n".join(lines[start:]))

    def status(self) -> dict[str, Any]:
        return self.document("status")  # type: ignore[no-any-return]

    def topics(self) -> set[str]:
        return {t["name"] for t in self.document("topics", "list")}

    def heal(self, timeout_s: float = HEAL_DEADLINE_S) -> None:
        """Start every broker that is not alive (a previous module stopped or killed it) and
        wait until all ``brokers`` are alive and no partition is offline or under-replicated.

        A broker Ray restarted after a kill rejoins by itself (``brokers start`` starts it if
        its restarted actor never registered); one still not alive after HEAL_REPLACE_AFTER_S
        is replaced: killed and started again by the supervisor."""
        assert self.proc is not None and self.proc.poll() is None, "raylog up is not running"
        began = time.monotonic()
        deadline = began + timeout_s
        started: set[int] = set()
        replaced: set[int] = set()
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:  # bounded by the deadline
            last = self.status()
            down = {b for state in ("fenced", "shutdown") for b in last["brokers"][state]}
            budget = max(1.0, deadline - time.monotonic())
            for broker in sorted(down - started):
                self.raylog("brokers", "start", str(broker), timeout_s=budget)
                started.add(broker)
            if time.monotonic() - began > HEAL_REPLACE_AFTER_S:
                for broker in sorted(down - replaced):
                    self.raylog("brokers", "kill", str(broker), timeout_s=budget)
                    self.raylog("brokers", "start", str(broker), timeout_s=budget)
                    replaced.add(broker)
            if (
                len(last["brokers"]["alive"]) == self.brokers
                and last["offline_partitions"] == 0
                and last["under_replicated_partitions"] == 0
            ):
                return
            time.sleep(HEAL_POLL_S)
        raise AssertionError(f"the shared cluster did not heal within {timeout_s:.0f} s: {last}")

    def crash(self) -> list[int]:
        """A crash of the machine `raylog up` runs on: SIGKILL to the up process and every
        process under it (Ray's GCS, raylet, workers and agents), by PID; returns those PIDs
        once every one is gone. Each is stopped (SIGSTOP) first, so that none starts another
        between the listing and the kill."""
        assert self.proc is not None and self.proc.poll() is None, "raylog up is not running"
        stopped: list[int] = []
        for _ in range(CRASH_ROUNDS_MAX):  # until a listing finds no process not yet stopped
            found = [pid for pid in process_tree(self.proc.pid) if pid not in stopped]
            if not found:
                break
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            stopped.extend(found)
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_DEADLINE_S)
        deadline = time.monotonic() + STOP_DEADLINE_S
        while any(_running(pid) for pid in stopped):  # bounded by the deadline
            assert time.monotonic() < deadline, [p for p in stopped if _running(p)]
            time.sleep(HEAL_POLL_S)
        return stopped

    def __enter__(self) -> UpProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.stop()
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait(timeout=STOP_DEADLINE_S)


CRASH_ROUNDS_MAX = 10


def _parent_and_state(pid: int) -> tuple[int, str] | None:
    """A process's parent PID and state letter from /proc, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone (or going) between the listing and the read
        return None
    state, ppid = stat.rsplit(")", 1)[1].split()[:2]  # after "pid (comm)", which may hold spaces
    return int(ppid), state


def _running(pid: int) -> bool:
    found = _parent_and_state(pid)
    return found is not None and found[1] != "Z"  # a zombie is dead, waiting to be reaped


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process under it, parents first (one listing of /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _parent_and_state(int(entry))) is not None:
            children.setdefault(found[0], []).append(int(entry))
    tree = [pid]
    for parent in tree:  # grows as it goes; each process once (parent links form a tree)
        tree.extend(children.get(parent, ()))
    return tree


UP_ATTEMPTS_MAX = 3


def started_up(
    make_data_dir: Callable[[], Path], *extra: str, brokers: int = 3, port: int | None = None
) -> UpProcess:
    """An ``UpProcess`` on ``make_data_dir()``, started (the caller stops it). Ray gives its
    raylet a fixed 30 s to register, which a loaded 2-core machine can exceed: then `raylog up`
    says "Ray did not start", and it is tried again on a fresh data dir, up to UP_ATTEMPTS_MAX
    times."""
    for attempt in range(UP_ATTEMPTS_MAX):
        up = UpProcess(make_data_dir(), *extra, brokers=brokers, port=port)
        try:
            up.start()
            return up
        except AssertionError as exc:
            up.__exit__(None, None, None)
            if "Ray did not start" not in str(exc) or attempt == UP_ATTEMPTS_MAX - 1:
                raise
    raise AssertionError("unreachable")


# --- a Ray cluster of `ray start` nodes on this machine (cluster mode) --------------------------

RAY = [sys.executable, "-m", "ray.scripts.scripts"]
NODE_START_DEADLINE_S = 90.0
NODE_STOP_DEADLINE_S = 30.0


class RayNode:
    """One ``ray start --block`` node. Its processes (raylet, agents, workers) stay in the
    process group ``ray start`` leads (a new session), which :meth:`kill` and :meth:`stop` end:
    only what this test started, never by name (``ray stop`` would)."""

    def __init__(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        log_dir: Path,
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.wrap = wrap  # e.g. into a network namespace: the argv it returns is run
        self.log_path = log_dir / f"ray-{name}.log"
        self.proc: subprocess.Popen[str] | None = None
        self.lines: Lines | None = None

    def start(self) -> RayNode:
        argv = [*RAY, "start", "--block", "--disable-usage-stats", *self.args]
        self.proc = subprocess.Popen(
            self.wrap(argv) if self.wrap else argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        self.lines = Lines(self.proc)
        return self

    def wait_started(self) -> None:
        assert self.lines is not None
        self.lines.wait_for("Ray runtime started", NODE_START_DEADLINE_S)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """A crash of the whole machine: SIGKILL to every process of the node."""
        RayNode.kill_all([self])

    @staticmethod
    def kill_all(nodes: list[RayNode]) -> None:
        """:meth:`kill` for several nodes at once. Tests end their nodes this way too (their
        state is thrown away): a signal `ray start --block` would handle cannot be relied on,
        as a head ignores SIGTERM for tens of seconds and a shell's background jobs inherit
        SIGINT ignored."""
        started = [node for node in nodes if node.proc is not None]
        for node in started:
            node._signal_group(signal.SIGKILL)
        for node in started:
            assert node.proc is not None
            node.proc.wait(timeout=NODE_STOP_DEADLINE_S)

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):  # every process of it is gone already
            os.killpg(self.proc.pid, sig)  # the group ``ray start`` leads: its pid

    def log_tail(self) -> str:
        return "".join(self.lines.seen[-30:]) if self.lines is not None else ""


class ClusterUp:
    """``raylog up --address`` against a running Ray cluster. CLI commands name its data dir:
    `raylog up` runs them (actors/cli/server.py), where ``--address`` would join Ray as a
    driver for each one; :meth:`raylog_by_address` runs one that way."""

    def __init__(
        self, data_dir: Path, address: str, port: int, env: dict[str, str], *extra: str
    ) -> None:
        self.data_dir = data_dir
        self.extra = extra  # more `raylog up` arguments
        self.address = address
        self.port = port  # the default gateway port; the metrics endpoint is the next one
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self.lines: Lines | None = None
        self.bootstrap = ""

    def start(self) -> str:
        """Start it and wait for "raylog ready"; returns the bootstrap servers it printed."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "raylog-up.err", "w") as err:  # never a pipe nobody reads
            self.proc = subprocess.Popen(
                [
                    *RAYLOG, "up", "--address", self.address, "--data-dir", str(self.data_dir),
                    "--port", str(self.port), *self.extra,
                ],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=self.env,
            )  # fmt: skip
        self.lines = Lines(self.proc)
        self.bootstrap = bootstrap_of(self.lines.wait_for("raylog ready", START_DEADLINE_S))
        return self.bootstrap

    def wait_joined(self, broker_id: int, deadline_s: float) -> str:
        """The "broker N joined at host:port (rack r)" line for ``broker_id``."""
        assert self.lines is not None
        needle = f"broker {broker_id} joined at "
        found = [line for line in self.lines.seen if needle in line]
        return found[-1] if found else self.lines.wait_for(needle, deadline_s)[-1]

    def raylog(
        self, *args: str, timeout_s: float = CLI_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run ``raylog ARGS --data-dir D`` against this cluster."""
        return self._run([*args, "--data-dir", str(self.data_dir)], timeout_s)

    def raylog_by_address(
        self, *args: str, timeout_s: float = CLI_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run ``raylog ARGS --address A``: the command joins Ray itself."""
        return self._run([*args, "--address", self.address], timeout_s)

    def _run(self, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*RAYLOG, *args], capture_output=True, text=True, timeout=timeout_s, env=self.env
        )

    def stop(self) -> int:
        """SIGINT, wait for "raylog stopped" and the exit; returns the exit code."""
        return stop_up(self.proc, self.lines)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_DEADLINE_S)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """One scrape of a Prometheus endpoint, parsed by prometheus-client: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum over every label set that includes ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))
