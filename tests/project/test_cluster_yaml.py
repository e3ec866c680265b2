"""cluster.yaml is a valid Ray cluster-launcher config, checked offline with Ray's own schema.

Proves: the launcher accepts it after filling its defaults; brokers only run on nodes with the
`raylog` resource, each labelled with a rack; the head carries no `raylog` resource; every node
type autoscales within bounds; every Ray start command uses token authentication.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER_YAML = Path(__file__).resolve().parents[2] / "cluster.yaml"


def test_cluster_yaml_validates_against_ray_schema() -> None:
    config = prepare_config(yaml.safe_load(CLUSTER_YAML.read_text()))
    validate_config(config)  # raises on any schema violation

    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("raylog", 0) == 0
    brokers = {name: t for name, t in types.items() if t["resources"].get("raylog", 0) > 0}
    assert len(brokers) >= 3
    racks = {t["labels"]["raylog.rack"] for t in brokers.values()}
    assert len(racks) == len(brokers), "one rack per broker node type"
    for t in brokers.values():
        assert 0 < t["min_workers"] <= t["max_workers"]
    for cmd in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        if "ray start" in cmd:
            assert "RAY_AUTH_MODE=token" in cmd
