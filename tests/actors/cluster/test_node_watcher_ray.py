"""The node watcher on a real multi-node Ray cluster (three nodes on this machine).

Proves, through ``node_watcher_scenario.py`` run in its own process (it needs its own Ray
driver): adding two nodes with the ``raylog`` resource and rack labels a and b starts one broker
and one gateway on each (through the supervisor), and they register with those racks and the
nodes' ``raylog.port`` ports, where the gateways listen; removing the node of a partition's
leader hard fences its broker and moves leadership to the other broker within seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCENARIO = Path(__file__).with_name("node_watcher_scenario.py")
SCENARIO_TIMEOUT_S = 240


def _own_ray_tmpdir() -> dict[str, str]:
    """The scenario's environment with a Ray temp dir of its own: cluster_utils writes into
    (and on shutdown cleans) $RAY_TMPDIR/ray, which must not be this session's Ray's."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="raylog-nw-")  # short: socket paths are limited
    return env


def test_nodes_with_the_raylog_resource_get_brokers_and_a_dead_node_loses_leadership() -> None:
    env = _own_ray_tmpdir()
    try:
        done = subprocess.run(
            [sys.executable, str(SCENARIO)],
            capture_output=True,
            text=True,
            timeout=SCENARIO_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired as e:  # run() has killed the scenario by then
        pytest.fail(f"scenario ran over {SCENARIO_TIMEOUT_S} s: {e.stdout!r} {e.stderr!r}")
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["racks"] == ["a", "b"]
    assert result["new_leader"] not in (result["old_leader"], -1)
    assert result["failover_s"] < 10, result
