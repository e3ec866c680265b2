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

- once every broker holds within one replica of the others, bytes: when the controller knows
  the partitions' sizes (each partition's largest replica log) and the heaviest broker holds
  more than ``threshold`` times the average and at least ``min_gap`` bytes more than the
  lightest, :func:`byte_swap` exchanges a replica of the heaviest for one of the lightest (two
  partitions move together, counts unchanged, racks kept): the pair that brings the two
  closest, only if it does (each swap lowers the spread, so swaps end). Both moves start in
  one step (they touch the same two brokers); the next check weighs again.

Partitions with observers are left where they are (an observer's placement is the user's), and
so are offline ones wholly on lost brokers (no replica is left to copy from).
Leaders follow their preferred replicas through ``auto.leader.rebalance.enable``.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence, Set

import msgspec

from raylog.actors.control import metadata as md_
from raylog.actors.control import placement
from raylog.actors.control.metadata import NO_LEADER, ClusterMetadata, TopicPartition

BALANCED = "balanced"
SWAP_NEIGHBOURS = 4  # candidates each side of a swap's ideal partner size


class BalanceStep(msgspec.Struct, frozen=True):
    """The reassignment targets to start now (may be empty) and the balancer's state, for
    `raylog status`: ``balanced``, ``moving N partitions``, ``waiting: ...`` or ``paused: ...``.
    """

    targets: dict[TopicPartition, tuple[int, ...]]
    state: str


class ByteRule(msgspec.Struct, frozen=True):
    """When bytes are balanced enough (module docstring): the partitions' sizes, in bytes."""

    sizes: Mapping[TopicPartition, int]
    threshold: float = 1.1  # replica.balancer.bytes.threshold
    min_gap: int = 64 << 20  # replica.balancer.bytes.min.gap


def next_step(
    md: ClusterMetadata, lost: Set[int] = frozenset(), by_bytes: ByteRule | None = None
) -> BalanceStep:
    """See the module docstring; ``lost``: the ids of lost brokers; ``by_bytes``: weigh bytes
    once counts are balanced (None: counts only)."""
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
    if by_bytes is not None:
        swap = byte_swap(assignment, brokers, by_bytes)
        if swap:
            return BalanceStep(swap, f"moving {len(swap)} partitions (bytes)")
    return BalanceStep({}, BALANCED)


def byte_swap(
    assignment: Mapping[TopicPartition, Sequence[int]],
    brokers: Sequence[placement.Broker],
    rule: ByteRule,
) -> dict[TopicPartition, tuple[int, ...]]:
    """The two reassignment targets of the best swap between the heaviest and the lightest
    broker (module docstring), or none."""
    rack_of = {b.broker_id: b.rack for b in brokers}
    held = dict.fromkeys(rack_of, 0)
    for tp, replicas in assignment.items():
        for b in replicas:
            if b in held:
                held[b] += rule.sizes.get(tp, 0)
    if len(held) < 2:
        return {}
    heavy = max(held, key=lambda b: (held[b], -b))
    light = min(held, key=lambda b: (held[b], b))
    gap = held[heavy] - held[light]
    average = sum(held.values()) / len(held)
    if gap < rule.min_gap or held[heavy] <= rule.threshold * average:
        return {}

    def racks(replicas: Sequence[int]) -> int:
        return len({rack_of.get(b) for b in replicas})

    def swapped(tp: TopicPartition, old: int, new: int) -> tuple[int, ...] | None:
        before = tuple(assignment[tp])
        after = tuple(new if b == old else b for b in before)
        return after if racks(after) >= racks(before) else None

    def size(tp: TopicPartition) -> int:
        return rule.sizes.get(tp, 0)

    outs = [tp for tp, r in assignment.items() if heavy in r and light not in r]
    ins = sorted((tp for tp, r in assignment.items() if light in r and heavy not in r), key=size)
    in_sizes = [size(tp) for tp in ins]
    best: tuple[int, dict[TopicPartition, tuple[int, ...]]] | None = None
    for out_tp in outs:
        out_target = swapped(out_tp, heavy, light)
        if out_target is None:
            continue
        # The ideal partner moves exactly half the gap: look at the few sizes nearest it.
        at = bisect.bisect_left(in_sizes, size(out_tp) - gap / 2)
        for i in range(max(0, at - SWAP_NEIGHBOURS), min(len(ins), at + SWAP_NEIGHBOURS)):
            moved = size(out_tp) - in_sizes[i]
            left = abs(gap - 2 * moved)
            if moved <= 0 or left >= gap or (best is not None and left >= best[0]):
                continue
            in_target = swapped(ins[i], light, heavy)
            if in_target is not None:
                best = (left, {out_tp: out_target, ins[i]: in_target})
    return best[1] if best is not None else {}


__all__ = ["BALANCED", "BalanceStep", "ByteRule", "byte_swap", "next_step"]
