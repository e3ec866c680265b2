"""Fixtures shared by every suite: a real S3 API (moto's server) on a loopback port.

- ``moto_server`` (session): starts ``python -m moto.server`` on a free 127.0.0.1 port, waits
  (bounded) until it answers, yields its endpoint URL, and stops it by its PID at the end.
- ``s3_client_kwargs``: the boto3 arguments (endpoint, region, dummy credentials) for it.
- ``create_bucket``: a callable that creates a fresh bucket and returns its name, so tests do
  not see each other's objects.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sim.seeds import fresh_seed_base

MOTO_REGION = "us-east-1"
MOTO_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
_MOTO_START_TIMEOUT_S = 30.0
_MOTO_START_ATTEMPTS_MAX = 3  # a free port can be taken between probing it and binding it
_MOTO_STOP_TIMEOUT_S = 10.0


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means the server is up
    except (urllib.error.URLError, OSError):
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the server we started, by its PID: SIGTERM, then SIGKILL after a bounded wait."""
    if process.poll() is not None:
        return
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=_MOTO_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=_MOTO_STOP_TIMEOUT_S)


@contextlib.contextmanager
def run_moto_server(log_dir: Path) -> Iterator[str]:
    """Run one moto server on a free loopback port; yield its endpoint URL."""
    for attempt in range(_MOTO_START_ATTEMPTS_MAX):
        port = _free_loopback_port()
        url = f"http://127.0.0.1:{port}"
        log_path = log_dir / f"moto-{port}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + _MOTO_START_TIMEOUT_S
            while process.poll() is None and time.monotonic() < deadline and not _answers(url):
                time.sleep(0.05)
            if process.poll() is None and _answers(url):
                yield url
                return
            if attempt == _MOTO_START_ATTEMPTS_MAX - 1:
                raise RuntimeError(
                    f"moto server did not answer on {url}: {log_path.read_text()[-2000:]}"
                )
        finally:
            _stop(process)


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Endpoint URL of a moto S3 server shared by the whole session."""
    with run_moto_server(tmp_path_factory.mktemp("moto")) as url:
        yield url


@pytest.fixture
def s3_client_kwargs(moto_server: str) -> dict[str, Any]:
    """Arguments for ``boto3.client("s3", **kwargs)`` or ``S3ObjectStore(bucket, **kwargs)``."""
    return {"endpoint_url": moto_server, "region_name": MOTO_REGION, **MOTO_CREDENTIALS}


@pytest.fixture
def create_bucket(s3_client_kwargs: dict[str, Any]) -> Callable[..., str]:
    """``create_bucket(name=None) -> name``: create a bucket (a fresh unique one by default)."""
    import boto3

    client = boto3.client("s3", **s3_client_kwargs)

    def create(name: str | None = None) -> str:
        bucket = name or f"test-{uuid.uuid4().hex[:16]}"
        client.create_bucket(Bucket=bucket)
        return bucket

    return create


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--sim-seeds N``: how many fresh seeds the simulator runs besides its fixed ones
    (tests/sim/seeds.py; env RAYLOG_SIM_SEEDS)."""
    parser.addoption(
        "--sim-seeds",
        type=int,
        default=None,
        help="fresh seeds for the replication simulator's clean runs (or RAYLOG_SIM_SEEDS)",
    )


def pytest_report_header(config: pytest.Config) -> str:
    """Which fresh seeds the simulator runs (they vary by commit): a failing run says so."""
    base, source = fresh_seed_base()
    return f"raylog simulator: fresh seeds from {base} ({source}; RAYLOG_SIM_SEED_BASE to repeat)"


_RAY_DATA_DIR: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Give this test session its own Ray environment before anything imports ray.

    Ray reads RAY_AUTH_MODE and friends when it is imported, so they are set here, before
    collection imports test modules: token authentication with a token in a directory this
    session owns, loopback listeners, and Ray's temp dir inside that directory.
    """
    global _RAY_DATA_DIR
    import tempfile

    from raylog.actors import raycluster

    _RAY_DATA_DIR = Path(tempfile.mkdtemp(prefix="raylog-ray-"))
    raycluster.apply_ray_env(_RAY_DATA_DIR)


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    if _RAY_DATA_DIR is not None:
        shutil.rmtree(_RAY_DATA_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_local() -> Iterator[Path]:
    """A real local Ray (one node) configured as raylog configures its own clusters.

    Token authentication, loopback listeners, a temp dir owned by this session, the node
    health checks raylog uses (raycluster.FAST_DEATH_SYSTEM_CONFIG). Yields the directory that
    holds the token; shut down at the end of the session.
    """
    import ray

    from raylog.actors import raycluster

    assert _RAY_DATA_DIR is not None
    ray.init(
        namespace="raylog",
        num_cpus=2,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
        object_store_memory=512 * 1024 * 1024,
        _temp_dir=os.environ["RAY_TMPDIR"],
        _system_config=raycluster.FAST_DEATH_SYSTEM_CONFIG,
    )
    try:
        yield _RAY_DATA_DIR
    finally:
        ray.shutdown()


# Broker configs of the shared cluster: Kafka's defaults except the periods of background tasks
# the modules sharing it wait for. None changes what a client sees; each task runs sooner (the
# tasks' own tests cover the defaults). group.initial.rebalance.delay.ms stays 3 s: at 0, a
# kafka-python group leader can compute its assignment before its metadata has the topic.
SHARED_BROKER_CONFIGS = {
    # One tiering round (copy, then local deletion) every 30 s; test_tiered_storage_live waits
    # for a few of them.
    "remote.log.manager.task.interval.ms": "1000",
    # How often a compacted topic's replica checks whether a cleaning pass is due (15 s):
    # test_compaction_live waits for a pass.
    "log.cleaner.backoff.ms": "1000",
    # How often a transaction coordinator aborts transactions past their timeout (10 s):
    # test_transactions_failover's read_committed read waits for its abandoned transaction.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
}


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One `raylog up` (3 brokers, Kafka's default settings but SHARED_BROKER_CONFIGS) for every
    module that can share it.

    Starting a cluster costs 20-40 s on a loaded 2-core machine, so the modules that need
    nothing special share this one, each through a module fixture that calls ``heal()`` first
    (a module that kills or stops a broker does so last; the next module starts it again).
    Modules that need their own flags, count global state or restart the cluster start their
    own ``UpProcess``. Topic and group names differ between the sharing modules.
    """
    from support.cluster import started_up

    configs = [a for k, v in SHARED_BROKER_CONFIGS.items() for a in ("--broker-config", f"{k}={v}")]
    up = started_up(lambda: tmp_path_factory.mktemp("shared-up"), *configs)
    try:
        yield up
    finally:
        up.__exit__(None, None, None)  # stops it (SIGINT, then kill), by its PID


@pytest.fixture(scope="module")
def shared_up(shared_cluster: Any) -> Iterator[Any]:
    """The shared cluster, healed for this module (every broker alive, all partitions in sync).

    The topics the module created are deleted when it ends: every replica is an actor (a
    process), and a 2-core machine cannot hold every module's replicas at once.
    """
    shared_cluster.heal()
    before = shared_cluster.topics()
    yield shared_cluster
    internal = {"__consumer_offsets", "__transaction_state"}
    created = sorted(shared_cluster.topics() - before - internal)
    if created:
        done = shared_cluster.raylog("topics", "delete", *created)
        assert done.returncode == 0, done.stderr[-2000:]


# The session's security cluster while it runs (stopped after its last user's teardown).
_secure: Any = None


@pytest.fixture(scope="session")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One `raylog up` with TLS and SASL listeners and the StandardAuthorizer for the modules
    that need them (tests/support/secure_cluster.py says what it runs): a cluster start less
    than one each. Stopped once the last test using it is torn down
    (:func:`pytest_runtest_teardown`), so that it does not load the machine under later modules.
    """
    from support.secure_cluster import start_secure_cluster

    global _secure
    cluster = start_secure_cluster(lambda: tmp_path_factory.mktemp("secure-up"))
    _secure = cluster.up
    try:
        yield cluster
    finally:
        cluster.up.__exit__(None, None, None)  # stops it (SIGINT, then kill) unless stopped
        _secure = None


_last_ray_local_user: str | None = None  # node id of the last test that uses ``ray_local``
_last_secure_user: str | None = None  # and of the last one that uses ``secure_cluster``

TESTS_ROOT = Path(__file__).resolve().parent
# The layer each folder of tests exercises, as a marker (``pytest -m "storage or replication"``);
# the deepest folder named here wins. Registered in pyproject.toml.
LAYER_MARKERS = {
    "storage": "storage",
    "actors": "actors",
    "actors/replication": "replication",
    "actors/control": "control",
    "actors/transport": "transport",
    "actors/cluster": "actors",
    "actors/cli": "actors",
    "gateway": "gateway",
    "pipelines": "pipelines",
    "sim": "sim",
    "e2e": "e2e",
    "project": "project",
}
# Fixtures that start a Ray cluster: tests using them also get the ``ray`` marker.
RAY_FIXTURES = ("ray_local", "shared_cluster", "shared_up", "embedded", "secure_cluster")


def _layer_marker(path: Path) -> str | None:
    rel = path.resolve().relative_to(TESTS_ROOT).parent.as_posix()
    while rel not in LAYER_MARKERS and "/" in rel:
        rel = rel.rsplit("/", 1)[0]
    return LAYER_MARKERS.get(rel)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Run the modules of the shared cluster last, and tests/pipelines (its Spark session too)
    after them; before either, the tests of the local Ray (``ray_local``), which stops after
    the last of them (:func:`pytest_runtest_teardown`). Session fixtures stay up until the
    session ends, and would load the machine under every later module's own clusters."""
    global _last_ray_local_user, _last_secure_user

    def uses(item: pytest.Item, fixture: str) -> bool:
        return fixture in getattr(item, "fixturenames", ())

    for item in items:
        layer = _layer_marker(item.path)
        if layer is not None:
            item.add_marker(layer)
        if layer == "e2e" or any(uses(item, f) for f in RAY_FIXTURES):
            item.add_marker("ray")

    # Whole modules move together: a module split in two would set its module fixtures up twice.
    on_ray_local = {item.path for item in items if uses(item, "ray_local")}
    items.sort(  # stable: the order within each group is kept
        key=lambda item: (
            uses(item, "shared_cluster"),
            item.path not in on_ray_local,
            item.path.parent.name == "pipelines",
        )
    )
    users = [item.nodeid for item in items if item.path in on_ray_local]
    _last_ray_local_user = users[-1] if users else None
    secure = [item.nodeid for item in items if uses(item, "secure_cluster")]
    _last_secure_user = secure[-1] if secure else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Once the last test of the local Ray is torn down (its module's fixtures with it), stop
    that Ray: its processes (raylet, GCS, log monitor, agents) and any actor a module left
    would otherwise take CPU from every later module until the session ends. The security
    cluster likewise after its last test."""
    yield
    if item.nodeid == _last_secure_user and _secure is not None:
        _secure.__exit__(None, None, None)
    if item.nodeid == _last_ray_local_user and "ray" in sys.modules:
        import ray

        ray.shutdown()  # the fixture's own ray.shutdown() at the session's end does nothing


KAFKAJS_DIR = Path(__file__).resolve().parent / "e2e" / "kafkajs"
NPM_TIMEOUT_S = 300


@pytest.fixture(scope="session")
def kafkajs() -> Path:
    """The ``node`` binary, with kafkajs installed by npm from ``e2e/kafkajs``'s lock file;
    skips (saying so) only where Node.js or npm is missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js and npm are not installed here: kafkajs cannot run")
    if not (KAFKAJS_DIR / "node_modules" / "kafkajs").is_dir():
        installed = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=KAFKAJS_DIR,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
        )
        assert installed.returncode == 0, installed.stderr[-2000:]
    return Path(node)
