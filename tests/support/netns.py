"""Network faults between the machines of one test: a Linux network namespace per node.

``NetSandbox(names)`` makes, for this test only, a bridge in the root namespace with the first
address of a /24 it picked (one no route of this machine touches), and for each name a network
namespace wired to the bridge by a veth pair, with the next address. A process started with
:meth:`NetSandbox.command` runs inside a node's namespace: its sockets see only its own loopback
and the bridge, so every byte between nodes crosses the veth pairs, where the faults are made.
The root namespace (the test, Ray's head, clients) reaches every node at its address.

Faults, each undone by its opposite:

- :meth:`isolate` / :meth:`rejoin`: the node's veth pair down (nothing in or out, both ways);
- :meth:`cut` / :meth:`mend`: packets from one node to another address dropped at the sender (a
  blackhole route in the sender's namespace): one direction only; cut both ways for a full
  partition between two nodes, which still reach everything else;
- :meth:`slow` / :meth:`unslow`: the traffic between two nodes moved onto a veth pair of its
  own (a /32 route to each other in both namespaces) whose ends pace what they send with a token
  bucket (``tbf``): a slow link between those two, in both directions, while their links to
  every other node and to the root namespace (Ray's health checks) keep their speed.

Only routing and a token bucket: no packet classifier or ``netem`` module, which the kernels
of small virtual machines often lack. :func:`unavailable` says why a machine cannot run them
(no root, no ``ip``, namespaces refused), for a skip. :meth:`teardown` deletes the namespaces
and their veth pairs and the bridge: only what this sandbox made, by name.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass

IP = "ip"
TC = "tc"
COMMAND_TIMEOUT_S = 10.0
SUBNET_ATTEMPTS = 50


def _run(*args: str) -> str:
    done = subprocess.run(
        list(args), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def unavailable() -> str | None:
    """Why this machine cannot make namespaces for a test (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which(IP) is None or shutil.which(TC) is None:
        return "the ip and tc commands (iproute2) are not installed"
    probe = f"rlprobe{os.getpid() % 100000}"
    try:
        _run(IP, "netns", "add", probe)
    except (RuntimeError, OSError) as exc:
        return f"ip netns add refused: {exc}"
    _run(IP, "netns", "del", probe)
    return None


@dataclass(frozen=True)
class _Node:
    netns: str
    inner: str  # the veth end inside the namespace
    outer: str  # its peer, on the bridge in the root namespace
    address: str


class NetSandbox:
    """See the module docstring. Names are short (interface names have 15 bytes)."""

    def __init__(self, names: list[str]) -> None:
        self.tag = f"rl{os.getpid() % 100000}"
        self.bridge = f"{self.tag}br"
        self.prefix = self._free_prefix()
        self.host = f"{self.prefix}.1"  # the bridge's address: the root namespace's
        self.nodes = {
            name: _Node(
                netns=f"{self.tag}-{name}",
                inner=f"{self.tag}{name}i",
                outer=f"{self.tag}{name}o",
                address=f"{self.prefix}.{i + 2}",
            )
            for i, name in enumerate(names)
        }
        self._made: list[str] = []  # what exists, for teardown: "bridge" or a node's name

    @staticmethod
    def _free_prefix() -> str:
        """A 10.x.y /24 that no address or route of this machine is in."""
        taken = _run(IP, "-4", "route", "show", "table", "all") + _run(IP, "-4", "addr")
        rng = random.Random(os.getpid())
        for _ in range(SUBNET_ATTEMPTS):
            prefix = f"10.{rng.randrange(64, 250)}.{rng.randrange(1, 250)}"
            if f"{prefix}." not in taken:
                return prefix
        raise RuntimeError("no free 10.x.y.0/24 for the sandbox")

    def create(self) -> NetSandbox:
        _run(IP, "link", "add", self.bridge, "type", "bridge")
        self._made.append("bridge")
        _run(IP, "addr", "add", f"{self.host}/24", "dev", self.bridge)
        _run(IP, "link", "set", self.bridge, "up")
        for name, node in self.nodes.items():
            _run(IP, "netns", "add", node.netns)
            self._made.append(name)
            _run(IP, "link", "add", node.outer, "type", "veth", "peer", "name", node.inner)
            _run(IP, "link", "set", node.outer, "master", self.bridge)
            _run(IP, "link", "set", node.outer, "up")
            _run(IP, "link", "set", node.inner, "netns", node.netns)
            _run(IP, "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", node.inner)
            _run(IP, "-n", node.netns, "link", "set", node.inner, "up")
            _run(IP, "-n", node.netns, "link", "set", "lo", "up")
        return self

    def address(self, name: str) -> str:
        return self.nodes[name].address

    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run inside node ``name``'s namespace (``ip netns exec`` execs it: the
        process keeps the pid it is started with)."""
        return [IP, "netns", "exec", self.nodes[name].netns, *argv]

    def isolate(self, name: str) -> None:
        _run(IP, "link", "set", self.nodes[name].outer, "down")

    def rejoin(self, name: str) -> None:
        _run(IP, "link", "set", self.nodes[name].outer, "up")

    def _target(self, name: str) -> str:
        return self.host if name == "host" else self.nodes[name].address

    def cut(self, src: str, dst: str) -> None:
        """Packets from node ``src`` to ``dst`` (a node's name, or "host": the root
        namespace) dropped from now on."""
        node = self.nodes[src]
        _run(IP, "-n", node.netns, "route", "add", "blackhole", f"{self._target(dst)}/32")

    def mend(self, src: str, dst: str) -> None:
        node = self.nodes[src]
        _run(IP, "-n", node.netns, "route", "del", "blackhole", f"{self._target(dst)}/32")

    def _pair(self, a: str, b: str) -> tuple[str, str]:
        return f"{self.tag}{a}{b}", f"{self.tag}{b}{a}"

    def slow(self, a: str, b: str, rate: str, latency: str = "2s") -> None:
        """What nodes ``a`` and ``b`` send each other paced at ``rate`` (tc's units:
        "80kbit"), queued up to ``latency`` and dropped beyond it."""
        end_a, end_b = self._pair(a, b)
        node_a, node_b = self.nodes[a], self.nodes[b]
        _run(IP, "link", "add", end_a, "netns", node_a.netns, "type", "veth",
             "peer", "name", end_b, "netns", node_b.netns)  # fmt: skip
        for node, end, peer in ((node_a, end_a, node_b), (node_b, end_b, node_a)):
            _run(IP, "-n", node.netns, "link", "set", end, "up")
            _run(IP, "netns", "exec", node.netns, TC, "qdisc", "add", "dev", end, "root",
                 "tbf", "rate", rate, "burst", "16kb", "latency", latency)  # fmt: skip
            _run(IP, "-n", node.netns, "route", "add", f"{peer.address}/32", "dev", end)

    def unslow(self, a: str, b: str) -> None:
        """Back to the bridge: deleting one end of the pair deletes both, and their routes."""
        _run(IP, "-n", self.nodes[a].netns, "link", "del", self._pair(a, b)[0])

    def teardown(self) -> None:
        """Delete what :meth:`create` made; every step is tried, the failures raised at the
        end. A node's veth pair is deleted by its outer end first: a deleted namespace lives
        on in the kernel while sockets of its ended processes close (TIME_WAIT), and its veth
        pair with it."""
        failures: list[str] = []
        for made in reversed(self._made):
            if made == "bridge":
                steps = [[IP, "link", "del", self.bridge]]
            else:
                node = self.nodes[made]
                steps = [[IP, "link", "del", node.outer], [IP, "netns", "del", node.netns]]
            for argv in steps:
                try:
                    _run(*argv)
                except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                    if "Cannot find device" not in str(exc):  # a pair already gone is fine
                        failures.append(str(exc))
        self._made.clear()
        if failures:
            raise RuntimeError("; ".join(failures))
