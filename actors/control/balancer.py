"""Continuous balancing (``replica.balancer.enable``): the next replica moves, decided purely.

Every ``replica.balancer.check.interval.ms`` the active controller asks :func:`next_step` what
to start, and starts it as throttled reassignments (``raylog.actors.control.reassignment``), as
`raylog reassign --rebalance` would. The rules:

- nothing while a reassignment runs (the balancer's own, the user's, a decommission's): a plan
  counts every replica where it is, and one being moved is in two places at once;
- nothing while any partition is under-replicated or offline, unless every replica it lacks is
  on a *lost* broker: one down for longer than
  ``replica.balancer.heal.broker.failure.threshold.ms`` (the controller keeps the time). A
  broker down for less is expected back, its replicas are where they belong then, and copying
  data while redundancy is short puts it at risk; a lost broker's replicas are re-created on
  the others (from each partition's leader), which restores the replication factor;
- otherwise ``placement.plan_rebalance`` over every partition onto the brokers that take new
  replicas (registered, not draining): the fewest moves that bring every broker within one
  replica of the others, racks kept; replicas on a draining or lost broker are moved off;
- of that plan, a partition's moves start only if no live broker they touch (as source or
  destination) is touched by another partition's moves in the same step: one move at a time
  per broker, so a broker that joins fills at the pace of one copy, not of every copy at once
  (a lost broker does no work and does not count). The next check plans again from where the
  finished moves left things.

Partitions with observers are left where they are (an observer's placement is the user's), and
so are offline ones wholly on lost brokers (no replica is left to copy from).
Leaders follow their preferred replicas through ``auto.leader.rebalance.enable``; bytes per
broker are not weighed.
"""

from __future__ import annotations

from collections.abc import Set

import msgspec

from raylog.actors.control import metadata as md_
from raylog.actors.control import placement
from raylog.actors.control.metadata import NO_LEADER, ClusterMetadata, TopicPartition

BALANCED = "balanced"


class BalanceStep(msgspec.Struct, frozen=True):
    """The reassignment targets to start now (may be empty) and the balancer's state, for
    `raylog status`: ``balanced``, ``moving N partitions``, ``waiting: ...`` or ``paused: ...``.
    """

    targets: dict[TopicPartition, tuple[int, ...]]
    state: str


def next_step(md: ClusterMetadata, lost: Set[int] = frozenset()) -> BalanceStep:
    """See the module docstring; ``lost``: the ids of lost brokers."""
    running = sum(1 for _, p in md_.partitions(md) if p.reassigning)
    if running:
        return BalanceStep({}, f"waiting: {running} partitions being reassigned")
    short = sum(
        1
        for _, p in md_.partitions(md)
        if not set(p.replicas) <= lost  # wholly on lost brokers: nothing left to copy from
        and (p.leader == NO_LEADER or not set(p.replicas) - set(p.isr) - set(p.observers) <= lost)
    )  # observers never join the ISR
    if short:
        return BalanceStep({}, f"paused: {short} partitions under-replicated or offline")
    brokers = [b for b in md_.active_brokers(md) if b.broker_id not in lost]
    assignment = {
        tp: p.replicas for tp, p in md_.partitions(md) if not p.observers and p.leader != NO_LEADER
    }
    if not brokers or not assignment:
        return BalanceStep({}, BALANCED)
    plan = placement.plan_rebalance(assignment, brokers)
    touched: dict[TopicPartition, set[int]] = {}
    for move in plan.moves:
        tp = move.key
        assert isinstance(tp, TopicPartition)
        touched.setdefault(tp, set()).update({move.from_broker, move.to_broker} - lost)
    busy: set[int] = set()
    targets: dict[TopicPartition, tuple[int, ...]] = {}
    for tp, brokers_moved in touched.items():  # the plan's order: most loaded sources first
        if brokers_moved & busy:
            continue
        busy |= brokers_moved
        targets[tp] = tuple(plan.assignment[tp])
    if targets:
        return BalanceStep(targets, f"moving {len(targets)} partitions")
    if not plan.balanced:
        return BalanceStep({}, "paused: no legal move left (racks, or too few brokers)")
    return BalanceStep({}, BALANCED)


__all__ = ["BALANCED", "BalanceStep", "next_step"]
