"""A Ray cluster of ``ray start`` nodes on one machine, as tests of cluster mode start it.

``RayCluster(root, ray_tmp)``: :meth:`RayCluster.start_head` starts a head (no ``raylog``
resource) on ``head_ip``, and :meth:`RayCluster.add_node` a node with the ``raylog`` resource and
the labels ``raylog up --address`` reads (rack, data dir, gateway port) on an address of its own;
each node is a process group of its own (``support.cluster.RayNode``), ended by that group at the
end. Two ways to place nodes on one machine:

- loopback addresses of their own (127.0.0.2, .3, ...): the head on 127.0.0.1, and the nodes
  join ``[::ffff:127.0.0.1]:PORT`` with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1``: ``ray start``
  refuses to join a cluster without it, and rewrites a ``127.0.0.1`` address to the machine's
  own address (where this head, loopback only, does not listen); the mapped form is the same
  loopback address, left alone. With it, Ray binds some of a node's listeners (raylet,
  dashboard agent) on all interfaces: clients here only ever connect to loopback addresses;
- a network namespace each (``wrap``: ``support.netns.NetSandbox.command``), the head on the
  sandbox's bridge address, so that the test can cut, slow and isolate the nodes' links.

``raylog_on(cluster, addresses, *broker_configs)`` starts the head, a node per rack at its
address and `raylog up --address` (PLAINTEXT listeners on the nodes' addresses, which only the
test's own sandbox reaches), waits for a live broker on every node and yields the ``ClusterUp``
and each broker's rack; `raylog up` is killed at the end.

``ray_cluster(root, ...)`` is a ``RayCluster`` with a temp dir of its own, every node ended and
the temp dir removed at the end. Ports are explicit (``NODE_PORTS`` a node, from
``free_port_block``), so that nodes on one machine never pick the same ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from raylog.actors import raycluster
from support.cluster import ClusterUp, RayNode, cli_env, free_port_block
from support.waiting import wait_until

# A node's ports: its dashboard agent's (http, grpc), metrics, runtime env agent, 40 for its
# workers, its gateway.
NODE_PORTS = 45
WORKER_PORTS = 40
START_ATTEMPTS = 2
OBJECT_STORE_BYTES = str(200 * 1024 * 1024)
BROKERS_DEADLINE_S = 120.0
LOOPBACK = "127.0.0.1"
# The cluster launcher's command lists, all empty: the fake provider's nodes need none.
NO_COMMANDS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
    "cluster_synced_files",
    "rsync_exclude",
    "rsync_filter",
)
NODES_CALL_S = 120.0  # a driver joining the cluster to list its nodes
WARNINGS_SHOWN = 80  # a failed test prints this many of the actors' last warnings
_RAYLOG_WARNING = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (WARNING|ERROR|CRITICAL) raylog\.")

Wrap = Callable[[str, list[str]], list[str]]  # (node name, argv) -> the argv to run


class RayCluster:
    """See the module docstring."""

    def __init__(
        self,
        root: Path,
        ray_tmp: Path,
        head_ip: str = LOOPBACK,
        wrap: Wrap | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.ray_tmp = ray_tmp
        self.head_ip = head_ip
        self.wrap = wrap
        self.env = cli_env()
        self.env.update(env or {})
        self.env["RAY_TMPDIR"] = str(ray_tmp)
        self.env["RAY_AUTH_TOKEN_PATH"] = str(raycluster.token_path(ray_tmp))
        self.env["RAY_AUTH_MODE"] = "token"
        # The head and drivers: loopback only, or (a sandbox) Ray's own choice of address.
        self.env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0" if head_ip == LOOPBACK else "1"
        self.gcs_port = 0
        self.nodes: dict[str, RayNode] = {}
        self.ports: dict[str, int] = {}  # node name -> its raylog.port label
        self.hosts: dict[str, str] = {}  # node name -> its address

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.gcs_port}"

    def start_head(self) -> None:
        no_log_monitor = ("--include-log-monitor", "false")
        self._start_head(free_port_block(7), self.head_ip, self.env, *no_log_monitor)

    def _start_head(self, first: int, ip: str, env: dict[str, str], *extra: str) -> None:
        """``ray start --head`` on ``ip``, its ports from ``first`` on (7), ``extra`` added."""
        self.gcs_port = first
        self._start(
            "head",
            [
                "--head", "--port", str(first), "--num-cpus", "1", "--resources", "{}",
                "--node-ip-address", ip, "--temp-dir", str(self.ray_tmp / "head"),
                "--include-dashboard", "false", "--dashboard-port", str(first + 1),
                "--ray-client-server-port", str(first + 2),
                "--dashboard-agent-listen-port", str(first + 3),
                "--dashboard-agent-grpc-port", str(first + 4),
                "--metrics-export-port", str(first + 5), "--runtime-env-agent-port", str(first + 6),
                "--object-store-memory", OBJECT_STORE_BYTES,
                "--system-config", json.dumps(raycluster.FAST_DEATH_SYSTEM_CONFIG), *extra,
            ],
            env,
            wrap=False,
        )  # fmt: skip

    def start_autoscaling_head(self, racks: dict[str, int], idle_s: float) -> None:
        """A loopback head that runs Ray's autoscaler on its fake multi-node provider (the one
        Ray's own autoscaler tests use: a "machine" is a raylet the autoscaler starts on this
        one). ``racks``: per rack, how many ``raylog`` nodes the autoscaler keeps at least
        (``min_workers``); each rack's node type may have one node, labelled with its rack,
        data dir and a gateway port of its own (as ``add_node``'s). Idle nodes beyond the
        minimum go after ``idle_s``."""
        first = free_port_block(7)
        types: dict[str, Any] = {
            "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0}
        }
        for rack, least in racks.items():
            port = free_port_block(1)
            self.ports[rack], self.hosts[rack] = port, LOOPBACK
            types[f"broker_{rack}"] = {
                "resources": {"CPU": 1, "raylog": 1},
                "labels": {
                    "raylog.rack": rack,
                    "raylog.data-dir": f"node-{rack}",
                    "raylog.port": str(port),
                },
                "node_config": {},
                "min_workers": least,
                "max_workers": 1,
            }
        config = {
            "cluster_name": "raylog-test",
            "max_workers": len(racks),
            "upscaling_speed": 10.0,
            "idle_timeout_minutes": idle_s / 60,
            "provider": {
                "type": "fake_multinode",
                "use_node_id_as_ip": True,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
                "gcs_address": f"{LOOPBACK}:{first}",
            },
            "available_node_types": types,
            "head_node_type": "ray.head.default",
            **{key: {} for key in ("auth", "docker", "file_mounts")},
            **{key: [] for key in NO_COMMANDS},
        }
        path = self.root / "autoscaling.json"
        path.write_text(json.dumps(config))
        env = {**self.env, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
        self._start_head(first, LOOPBACK, env, f"--autoscaling-config={path}")

    def add_node(self, rack: str, ip: str) -> None:
        """Start a `raylog` node (rack ``rack``, address ``ip``) and wait until it runs."""
        first = free_port_block(NODE_PORTS)
        env = dict(self.env)
        head = self.head_ip
        if head == LOOPBACK:  # see the module docstring
            env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
            head = "[::ffff:127.0.0.1]"
        gateway_port = first + 4 + WORKER_PORTS
        labels = f"raylog.rack={rack},raylog.data-dir=node-{rack},raylog.port={gateway_port}"
        self._start(
            rack,
            [
                "--address", f"{head}:{self.gcs_port}", "--num-cpus", "1",
                "--resources", json.dumps({"raylog": 1}), "--labels", labels,
                "--node-ip-address", ip, "--temp-dir", str(self.ray_tmp / rack),
                "--dashboard-agent-listen-port", str(first),
                "--dashboard-agent-grpc-port", str(first + 1),
                "--metrics-export-port", str(first + 2), "--runtime-env-agent-port", str(first + 3),
                "--min-worker-port", str(first + 4),
                "--max-worker-port", str(first + 3 + WORKER_PORTS),
                "--include-log-monitor", "false", "--object-store-memory", OBJECT_STORE_BYTES,
            ],
            env,
            wrap=True,
        )  # fmt: skip
        self.ports[rack] = gateway_port
        self.hosts[rack] = ip

    def _start(self, name: str, args: list[str], env: dict[str, str], *, wrap: bool) -> None:
        """Ray gives a starting node 30 s to register (hard-coded), too little on a loaded
        2-core machine now and then: one more attempt when the first gives up."""
        outer = (lambda argv: self.wrap(name, argv)) if wrap and self.wrap else None
        for attempt in range(START_ATTEMPTS):
            node = self.nodes[name] = RayNode(name, args, env, self.root, outer).start()
            try:
                node.wait_started()
                return
            except AssertionError:
                print(f"node {name} did not start (attempt {attempt + 1}):", node.log_tail()[-300:])
                node.kill()
                if attempt == START_ATTEMPTS - 1:
                    raise

    def alive_nodes(self, timeout_s: float = NODES_CALL_S) -> list[dict[str, Any]] | None:
        """Ray's ``ray.nodes()`` entries of the alive nodes, asked by a driver that joins the
        cluster in a process of its own (None when it could not)."""
        code = (
            "import json, sys, ray; ray.init(address=sys.argv[1], log_to_driver=False, "
            "logging_level='ERROR'); print('nodes', json.dumps([n for n in ray.nodes() "
            "if n['Alive']]))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, self.address],
            capture_output=True, text=True, env=self.env, timeout=timeout_s,
        )  # fmt: skip
        found = [line[6:] for line in done.stdout.splitlines() if line.startswith("nodes ")]
        return json.loads(found[-1]) if done.returncode == 0 and found else None

    def stop(self) -> None:
        """Every node at once, each by its own process group; then any process left that
        runs with this cluster's temp dir (the raylets an autoscaler started, and their
        workers), by its pid."""
        RayNode.kill_all(list(self.nodes.values()))
        marker = f"RAY_TMPDIR={self.ray_tmp}".encode()
        for environ in Path("/proc").glob("[0-9]*/environ"):
            with contextlib.suppress(OSError):
                pid = int(environ.parent.name)
                entries = b"\0" + environ.read_bytes() + b"\0"
                if pid != os.getpid() and b"\0" + marker + b"\0" in entries:
                    os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def ray_cluster(
    root: Path, head_ip: str = LOOPBACK, wrap: Wrap | None = None, env: dict[str, str] | None = None
) -> Iterator[RayCluster]:
    """See the module docstring."""
    # Ray's unix sockets live under its temp dir: a test's tmp_path is too deep for their
    # 107-byte limit.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rlnodes-"))
    cluster = RayCluster(root, ray_tmp, head_ip, wrap, env)
    try:
        yield cluster
    except BaseException:
        print_raylog_warnings(ray_tmp)  # what the actors said, before their logs go
        raise
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(ray_tmp, ignore_errors=True)


def print_raylog_warnings(ray_tmp: Path, last: int = WARNINGS_SHOWN) -> None:
    """The last ``last`` warnings and errors raylog's actors logged on every node (their lines
    carry a time: ``raylog.actors.logs``), in time order, for a failed test's output."""
    lines = []
    for err in sorted(ray_tmp.glob("*/session_latest/logs/worker-*.err")):
        with contextlib.suppress(OSError):
            text = err.read_text(errors="replace")
            lines += [x for x in text.splitlines() if _RAYLOG_WARNING.match(x)]
    print(f"--- raylog warnings and errors on the nodes (last {last} of {len(lines)}) ---")
    for line in sorted(lines)[-last:]:
        print(line[:500])


def _racks_when_alive(up: ClusterUp, count: int) -> dict[int, str] | None:
    """Broker id -> rack once `raylog brokers list` shows ``count`` brokers, all alive."""
    done = up.raylog("brokers", "list", "--json")
    rows = json.loads(done.stdout) if done.returncode == 0 else []
    if len(rows) != count or any(r["state"] != "alive" for r in rows):
        return None
    return {r["id"]: r["rack"] for r in rows}


@contextlib.contextmanager
def raylog_on(
    cluster: RayCluster, addresses: dict[str, str], *broker_configs: str
) -> Iterator[tuple[ClusterUp, dict[int, str]]]:
    """See the module docstring; ``broker_configs`` are ``key=value``."""
    cluster.start_head()
    for rack, address in addresses.items():
        cluster.add_node(rack, address)
    port = free_port_block(2)
    configs = [
        f"listeners=PLAINTEXT://:{port}",
        "allow.insecure.network.listeners=true",
        *broker_configs,
    ]
    up = ClusterUp(
        cluster.root / "head-data",
        cluster.address,
        port,
        dict(cluster.env),
        *[arg for config in configs for arg in ("--broker-config", config)],
    )
    try:
        up.start()
        racks = wait_until(
            lambda: _racks_when_alive(up, len(addresses)),
            timeout_s=BROKERS_DEADLINE_S,
            message="a live broker on each raylog node",
        )
        yield up, racks
    finally:
        up.kill()
