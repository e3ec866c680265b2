"""The node watcher's decisions, without Ray.

Proves: ``ray.nodes()`` entries are read for the ``raylog`` resource, the ``raylog.rack``,
``raylog.data-dir`` and ``raylog.port`` labels (a port label that is not a port is ignored); a
data-dir label is a path or a name under the watcher's data dir; an alive ``raylog`` node
without a broker gets one, a node without the resource never does, and a broker whose node died
or vanished is reported lost; a node keeps the broker id persisted in its data directory unless
a running broker already uses it (a dead node's id is free again for that node), otherwise the
new id is above every id in use or known.
"""

from __future__ import annotations

from pathlib import Path

from raylog.actors.broker import read_or_write_broker_id
from raylog.actors.cluster.node_watcher import (
    NodeView,
    broker_ids_in,
    choose_broker_id,
    node_data_dir,
    parse_nodes,
    plan,
)


def test_parse_nodes_reads_resource_and_labels() -> None:
    raw = [
        {
            "NodeID": "b",
            "Alive": True,
            "Resources": {"CPU": 0.0, "raylog": 1.0},
            "Labels": {
                "raylog.rack": "us-east-1a",
                "raylog.data-dir": "/d/b",
                "raylog.port": "29092",
            },
            "NodeManagerAddress": "10.0.0.2",
        },
        {"NodeID": "a", "Alive": False, "Resources": {"CPU": 4.0}, "Labels": {}},
        {"NodeID": "c", "Alive": True, "Labels": {"raylog.port": "99999"}},
        {"NodeID": "d", "Alive": True, "Labels": {"raylog.port": "http"}},
    ]
    a, b, c, d = parse_nodes(raw)
    assert a == NodeView("a", alive=False, raylog=False)
    assert b == NodeView("b", True, True, "us-east-1a", "10.0.0.2", "/d/b", 29092)
    assert c.port is None and d.port is None, "not a port: the watcher's default port is used"


def test_data_dir_label_is_a_path_or_a_name_under_the_default() -> None:
    assert node_data_dir(NodeView("n", True, True), "/data") == "/data"
    assert node_data_dir(NodeView("n", True, True, data_dir="node-a"), "/data") == "/data/node-a"
    assert node_data_dir(NodeView("n", True, True, data_dir="/mnt/x"), "/data") == "/mnt/x"


def test_plan_starts_brokers_on_new_raylog_nodes_and_reports_lost_ones() -> None:
    nodes = [
        NodeView("head", True, False),
        NodeView("n1", True, True, "a"),
        NodeView("n2", True, True, "b"),
        NodeView("n3", False, True, "c"),
    ]
    decided = plan(nodes, {"n1": 1, "n3": 3, "gone": 4})
    assert [n.node_id for n in decided.start] == ["n2"]
    assert decided.lost == [3, 4]
    assert plan(nodes[:3], {"n1": 1, "n2": 2}).start == []


def test_broker_id_is_kept_from_the_data_dir(tmp_path: Path) -> None:
    assert broker_ids_in(str(tmp_path / "missing")) == []
    read_or_write_broker_id(tmp_path / "broker-7", 7)
    (tmp_path / "broker-9").mkdir()  # no meta.properties: not a broker directory
    assert broker_ids_in(str(tmp_path)) == [7]
    assert choose_broker_id([7], in_use=[1, 2]) == 7
    assert choose_broker_id([7], in_use=[7, 2]) == 8, "7 is taken by another node's broker"
    assert choose_broker_id([], in_use=[1, 2, 5]) == 6
    assert choose_broker_id([], in_use=[]) == 1
    assert choose_broker_id([3, 4], in_use=[1]) == 5, "a shared directory names no one broker"
    # A node that comes back keeps its id although the controller still knows it (fenced).
    assert choose_broker_id([3], in_use=[1, 2], known=[1, 2, 3]) == 3
    assert choose_broker_id([], in_use=[1], known=[1, 2, 3]) == 4, "3 may come back: not reused"
