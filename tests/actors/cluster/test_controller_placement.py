"""Where `raylog up --address` places its controllers with an S3 metadata store, without Ray.

Proves: the controllers go on different nodes, the ``raylog`` nodes (the brokers') first, then
the head; dead nodes and nodes without the resource are passed over; a node is used twice only
when there are fewer nodes than controllers.
"""

from __future__ import annotations

from typing import Any

from raylog.actors.cluster.raynodes import controller_nodes


def node(node_id: str, *, raylog: bool = True, alive: bool = True) -> dict[str, Any]:
    resources = {"CPU": 2.0, **({"raylog": 1.0} if raylog else {})}
    return {"NodeID": node_id, "Alive": alive, "Resources": resources}


def test_two_raylog_nodes_take_one_controller_each() -> None:
    nodes = [node("head", raylog=False), node("b"), node("a"), node("c", alive=False)]
    assert controller_nodes("head", nodes, 2) == ["a", "b"]


def test_one_raylog_node_and_the_head() -> None:
    nodes = [node("head", raylog=False), node("a"), node("gpu", raylog=False)]
    assert controller_nodes("head", nodes, 2) == ["a", "head"]


def test_only_the_head() -> None:
    assert controller_nodes("head", [node("head", raylog=False)], 2) == ["head", "head"]
    assert controller_nodes("head", [], 2) == ["head", "head"]
