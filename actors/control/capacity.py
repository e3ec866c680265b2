"""Capacity on demand: how many ``raylog`` nodes a topic that does not fit needs, and the one
request for them that stands.

This module owns the controller's decisions about asking Ray's autoscaler for nodes (the asking
itself is ``actors/autoscaler.py``'s). It is pure: the controller passes what it knows
(the active brokers' nodes and their free memory, the time) and carries out the answer.

1. A topic that does not fit: its replication factor is above the number of brokers that take
   new replicas, or its replicas would not fit the free memory of their nodes
   (``placement.check_memory_fit``). On a Ray cluster each ``raylog`` node runs one broker, and
   placement spreads a topic's replicas evenly over the brokers, so :func:`more_nodes` finds
   the fewest extra nodes after which there are enough brokers and every node's share of the
   new replicas fits its free memory (a new node counted with as much free memory as the
   freest node present: a guess on the safe side, since nodes of one cluster are alike and a
   new one has its replicas still to come). None when no number does: a node too full for
   even its share of one more replica needs a rebalance, not more nodes.
2. The request (:class:`CapacityRequest`): the total number of ``raylog`` nodes wanted, made
   when a creation does not fit and an autoscaler runs, and standing for
   ``autoscaler.request.timeout.ms`` from its last renewal. A larger need raises it (Ray's
   request is a total, not an increment); a smaller one keeps it. :func:`request_done` says
   when to clear it: once that many brokers are active, or when its time is up.
3. The creation itself is not held: the refusal says what was asked
   (:func:`pending_message`), and the caller (the gateway for CreateTopics, `raylog topics
   create`) asks again every ``RETRY_S`` until its own timeout, so a node that joins in time
   gets the topic placed on it, and a client whose timeout is shorter than a cloud machine's
   boot gets the refusal with the request standing for its next try.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import msgspec

MAX_MORE_NODES = 64  # the most nodes one creation asks for
RETRY_S = 1.0  # step 3: how often a caller asks again while the nodes are awaited


class CapacityRequest(msgspec.Struct, frozen=True):
    """The standing request: ``nodes`` raylog nodes in all, until ``expires_ms`` (monotonic)."""

    nodes: int
    expires_ms: int
    had: int  # active brokers when it was made, for the log and `raylog status`


def more_nodes(
    new_replicas: int,
    replication_factor: int,
    free_mib: Sequence[float | None],
    per_replica_mib: float,
    limit: int = MAX_MORE_NODES,
) -> int | None:
    """Step 1 of the module docstring. ``free_mib``: per active broker, its node's free memory
    (None when not known: not checked, as the memory check does)."""
    known = [f for f in free_mib if f is not None]
    new_node_mib = max(known, default=math.inf)
    present = len(free_mib)
    for more in range(max(0, replication_factor - present), limit + 1):
        brokers = present + more
        if brokers == 0 or brokers < replication_factor:
            continue
        share_mib = math.ceil(new_replicas / brokers) * per_replica_mib
        if all(share_mib <= f for f in known) and (more == 0 or share_mib <= new_node_mib):
            return more
    return None


def renew(
    current: CapacityRequest | None, wanted: int, had: int, now_ms: int, timeout_ms: int
) -> CapacityRequest:
    """Step 2: the request after a creation that needs ``wanted`` nodes in all."""
    nodes = max(wanted, current.nodes if current is not None else 0)
    return CapacityRequest(nodes=nodes, expires_ms=now_ms + timeout_ms, had=had)


def request_done(request: CapacityRequest, active_brokers: int, now_ms: int) -> str | None:
    """Step 2: why the request can be cleared ("met", "expired"), or None while it stands."""
    if active_brokers >= request.nodes:
        return "met"
    if now_ms >= request.expires_ms:
        return "expired"
    return None


def pending_message(refusal: str, request: CapacityRequest, now_ms: int) -> str:
    """Step 3: the refusal, with what was asked of the autoscaler."""
    left_s = max(0, request.expires_ms - now_ms) / 1000
    return (
        f"{refusal}; asked Ray's autoscaler for {request.nodes - request.had} more raylog "
        f"node(s), {request.nodes} in all, for {left_s:.0f} s more"
    )


def free_per_broker(
    brokers: Sequence[int],
    node_of: Mapping[int, str],
    node_memory_mib: Mapping[str, float],
    assignment: Iterable[Sequence[int]],
    per_replica_mib: float,
) -> list[float | None]:
    """Step 1's ``free_mib``: for each of ``brokers``, its node's declared memory less the
    replicas already on the node, shared among the node's brokers (None: node or memory not
    known)."""
    on_node: Counter[str] = Counter()
    for replicas in assignment:
        on_node.update(node_of[b] for b in replicas if b in node_of)
    sharing = Counter(node_of[b] for b in brokers if b in node_of)
    out: list[float | None] = []
    for b in brokers:
        node = node_of.get(b)
        if node is None or node not in node_memory_mib:
            out.append(None)
            continue
        free = max(0.0, node_memory_mib[node] - on_node[node] * per_replica_mib)
        out.append(free / sharing[node])
    return out
