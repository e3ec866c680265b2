"""The node watcher on a real multi-node Ray cluster (three nodes on this machine).

Proves, through ``node_watcher_scenario.py`` run in its own process (it needs its own Ray
driver): adding two nodes with the ``raylog`` resource and rack labels a and b starts one broker
on each, and they register with those racks; removing the node of a partition's leader hard
fences its broker and moves leadership to the other broker within seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCENARIO = Path(__file__).with_name("node_watcher_scenario.py")
SCENARIO_TIMEOUT_S = 240


def test_nodes_with_the_raylog_resource_get_brokers_and_a_dead_node_loses_leadership() -> None:
    try:
        done = subprocess.run(
            [sys.executable, str(SCENARIO)],
            capture_output=True,
            text=True,
            timeout=SCENARIO_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:  # run() has killed the scenario by then
        pytest.fail(f"scenario ran over {SCENARIO_TIMEOUT_S} s: {e.stdout!r} {e.stderr!r}")
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["racks"] == ["a", "b"]
    assert result["new_leader"] not in (result["old_leader"], -1)
    assert result["failover_s"] < 10, result
