"""Where replicas go: rack-aware placement of new partitions, and rebalancing plans.

This module owns the choice of brokers for partition replicas. It follows the shape of Kafka's
rack-aware assignment (AdminUtils / KRaft's striped placer), written afresh here:

1. Brokers are put in a *rack-alternating* order: racks sorted by name, brokers sorted by id
   within each rack, then one broker from each rack in turn (racks a:[1,2] b:[3] c:[4,5] give
   1,3,4,2,5). A broker without a rack is in the rack ``None``, like any other rack.
2. Partition ``p`` (counted across the topic's whole life, so CreatePartitions continues the
   rotation) gets as preferred leader the broker at ``(start_index + p) mod n`` in that order, so
   preferred leaders go round-robin and their counts differ by at most one.
3. Its followers are the other brokers taken in order from just after the leader, rotated by a
   shift that grows by one every ``n`` partitions (so consecutive rounds pair brokers
   differently); a broker whose rack already holds a replica of the partition is skipped until
   every rack holds one. So a partition spans ``min(replication_factor, racks)`` racks.

Placement is deterministic given ``start_index`` and ``replica_shift``; the caller may pass
random ones (Kafka does) — this module draws no randomness.

Also here: :func:`replicas_fit`, the memory check (each replica is a Ray actor: a process of its
own, whose measured private memory the controller uses), and
:func:`plan_rebalance`, the reassignment plan behind ``--rebalance``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Protocol, TypeVar

import msgspec

from raylog.storage.errors import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    PolicyViolationError,
)

# A replica actor's private memory before brokers have measured one (benchmarks/topics.py
# measures it: about 52 MiB on Ray 2.60; a busy replica holds more).
REPLICA_MIB = 64

K = TypeVar("K", bound=Hashable)


class Broker(Protocol):
    """What placement needs of a broker (``metadata.BrokerRegistration`` fits)."""

    @property
    def broker_id(self) -> int: ...

    @property
    def rack(self) -> str | None: ...


class BrokerSlot(msgspec.Struct, frozen=True):
    """A plain broker for callers (and tests) without a registration at hand."""

    broker_id: int
    rack: str | None = None


def rack_alternating(brokers: Sequence[Broker]) -> list[int]:
    """Broker ids ordered one per rack in turn (step 1 of the module docstring)."""
    by_rack: dict[str | None, list[int]] = defaultdict(list)
    for b in brokers:
        by_rack[b.rack].append(b.broker_id)
    # None sorts first, as the empty string would.
    racks = sorted(by_rack, key=lambda r: (r is not None, r or ""))
    columns = [sorted(by_rack[r]) for r in racks]
    out: list[int] = []
    for row in range(max((len(c) for c in columns), default=0)):
        out.extend(c[row] for c in columns if row < len(c))
    if len(set(out)) != len(out):
        raise InvalidReplicationFactorError(f"broker ids are not distinct: {sorted(out)}")
    return out


def place_replicas(
    brokers: Sequence[Broker],
    num_partitions: int,
    replication_factor: int,
    *,
    start_index: int = 0,
    replica_shift: int = 0,
    first_partition: int = 0,
) -> list[tuple[int, ...]]:
    """Replica lists for partitions ``first_partition .. first_partition + num_partitions - 1``.

    ``brokers`` are those that may take replicas (active ones). Raises INVALID_PARTITIONS (37)
    for ``num_partitions <= 0`` and INVALID_REPLICATION_FACTOR (38) for a replication factor
    <= 0 or above the number of brokers.
    """
    if num_partitions <= 0:
        raise InvalidPartitionsError(
            f"Number of partitions must be at least 1, not {num_partitions}"
        )
    if replication_factor <= 0:
        raise InvalidReplicationFactorError(
            f"Replication factor must be at least 1, not {replication_factor}"
        )
    order = rack_alternating(brokers)
    n = len(order)
    if replication_factor > n:
        raise InvalidReplicationFactorError(
            f"Replication factor {replication_factor} is larger than the {n} available brokers"
        )
    rack_of = {b.broker_id: b.rack for b in brokers}
    n_racks = len(set(rack_of.values()))
    out = []
    for p in range(first_partition, first_partition + num_partitions):
        first = (start_index + p) % n
        shift = (replica_shift + p // n) % (n - 1) if n > 1 else 0
        # Every other broker once, starting just after the leader, rotated by the shift.
        others = [order[(first + 1 + (shift + k) % (n - 1)) % n] for k in range(n - 1)]
        chosen = [order[first]]
        racks_used = {rack_of[order[first]]}
        for b in others:  # pass 1: one replica per rack until every rack holds one
            if len(chosen) == replication_factor or len(racks_used) == n_racks:
                break
            if rack_of[b] not in racks_used:
                chosen.append(b)
                racks_used.add(rack_of[b])
        for b in others:  # pass 2: fill up with the brokers not chosen yet, in the same order
            if len(chosen) == replication_factor:
                break
            if b not in chosen:
                chosen.append(b)
        out.append(tuple(chosen))
    return out


def place_new_partitions(
    brokers: Sequence[Broker],
    existing: Sequence[Sequence[int]],
    count: int,
) -> list[tuple[int, ...]]:
    """Replicas for ``count`` partitions added to a topic whose assignment is ``existing``.

    Continues the rotation: the start index is where partition 0's preferred leader sits in
    the rack-alternating order (0 if that broker is gone), the partition number continues from
    ``len(existing)``, and the replication factor is the topic's.
    """
    if count <= 0:
        raise InvalidPartitionsError(
            f"The topic has {len(existing)} partitions; the new count must be higher"
        )
    if not existing:
        raise InvalidPartitionsError("The topic has no partitions to continue from")
    order = rack_alternating(brokers)
    leader0 = existing[0][0]
    start = order.index(leader0) if leader0 in order else 0
    return place_replicas(
        brokers,
        count,
        len(existing[0]),
        start_index=start,
        first_partition=len(existing),
    )


def replicas_fit(n_new_replicas: int, per_replica_mib: float, free_mib: float) -> None:
    """Refuse (POLICY_VIOLATION, 44) new replicas whose actors would not fit the free memory.

    Each replica is a Ray actor with its own worker process (``REPLICA_MIB`` on the reference
    machine), so unlike Kafka a partition has a real memory cost; the message gives the numbers
    so that an operator can act on it.
    """
    need = n_new_replicas * per_replica_mib
    if need > free_mib:
        raise PolicyViolationError(
            f"{n_new_replicas} new replicas need {need:.0f} MiB ({n_new_replicas} x "
            f"{per_replica_mib:g} MiB, one Ray actor each) but the brokers' nodes have "
            f"{free_mib:.0f} MiB free; use fewer partitions or a lower replication factor, "
            f"or add nodes"
        )


def check_memory_fit(
    new_assignment: Sequence[Sequence[int]],
    existing_assignment: Sequence[Sequence[int]],
    node_of: Mapping[int, str],
    node_memory_mib: Mapping[str, float],
    per_replica_mib: float = REPLICA_MIB,
) -> None:
    """Refuse (POLICY_VIOLATION) new replicas that would not fit their brokers' nodes.

    Brokers share their node's memory (the embedded cluster runs several on one node), so the
    check is per node: the replicas already assigned to the node's brokers are taken off its
    declared memory (Ray's ``memory`` resource), and the new ones must fit in the rest. Brokers
    whose node is unknown are not checked (they are counted nowhere rather than guessed).
    """
    new_on: Counter[str] = Counter()
    old_on: Counter[str] = Counter()
    for counter, assignment in ((new_on, new_assignment), (old_on, existing_assignment)):
        for replicas in assignment:
            counter.update(node_of[b] for b in replicas if b in node_of)
    for node in sorted(new_on):
        if node not in node_memory_mib:
            continue
        free = node_memory_mib[node] - old_on[node] * per_replica_mib
        replicas_fit(new_on[node], per_replica_mib, max(0.0, free))


# --- rebalance --------------------------------------------------------------------------------


class ReplicaMove(msgspec.Struct, frozen=True):
    """Move one replica of ``key`` from one broker to another, at the same list position."""

    key: object
    from_broker: int
    to_broker: int


class RebalancePlan(msgspec.Struct, frozen=True):
    """The moves, the resulting assignment, and whether the counts reached balance."""

    moves: list[ReplicaMove]
    assignment: dict
    balanced: bool


def plan_rebalance(
    assignment: Mapping[K, Sequence[int]], brokers: Sequence[Broker]
) -> RebalancePlan:
    """Moves that bring per-broker replica counts within one of each other, keeping racks spread.

    ``assignment`` maps each partition (any hashable key, e.g. a TopicPartition) to its replica
    list; ``brokers`` are those that should hold replicas — replicas on any other broker (one
    being decommissioned) are moved off it.

    Rules:
    - targets: every broker should hold ``floor(R / n)`` or ``ceil(R / n)`` replicas; the
      brokers already holding the most get the ``ceil`` places, so no move is spent where a
      broker is merely one above the average;
    - a move takes a replica from a broker above its target to one below it, so each move
      lowers the total excess by exactly one and the plan has the fewest moves possible (every
      move can lower the excess by at most one);
    - a move never puts two replicas of a partition on one broker and never lowers the number of
      racks a partition spans;
    - the moved replica keeps its position in the list, and followers are moved before
      preferred leaders so leadership moves only when it must.

    If the rack rule leaves no legal move before balance is reached, the plan stops there with
    ``balanced=False`` (the caller reports it; nothing is lost).
    """
    rack_of = {b.broker_id: b.rack for b in brokers}
    ids = sorted(rack_of)
    if not ids:
        raise InvalidReplicationFactorError("No brokers to place replicas on")
    current: dict[K, list[int]] = {k: list(v) for k, v in assignment.items()}
    counts = Counter({b: 0 for b in ids})
    for replicas in current.values():
        counts.update(replicas)
    total = sum(len(r) for r in current.values())
    low, extra = divmod(total, len(ids))
    # The ``extra`` brokers holding the most (ties: lower id) are allowed low + 1.
    by_load = sorted(ids, key=lambda b: (-counts[b], b))
    target = {b: low + (1 if i < extra else 0) for i, b in enumerate(by_load)}

    def rack_count(replicas: Sequence[int]) -> int:
        # Only brokers that stay count: moving off a broker being removed never "loses" a rack.
        return len({rack_of[b] for b in replicas if b in rack_of})

    moves: list[ReplicaMove] = []
    while True:
        over = sorted(
            (b for b in counts if counts[b] > target.get(b, 0)),
            key=lambda b: (b in rack_of, -(counts[b] - target.get(b, 0)), b),
        )
        under = sorted(
            (b for b in ids if counts[b] < target[b]), key=lambda b: (counts[b] - target[b], b)
        )
        if not over or not under:
            break
        move = _find_move(current, over, under, rack_count)
        if move is None:
            break
        key, pos, to_b = move
        from_b = current[key][pos]
        current[key][pos] = to_b
        counts[from_b] -= 1
        counts[to_b] += 1
        moves.append(ReplicaMove(key, from_b, to_b))
    balanced = all(counts[b] == target.get(b, 0) for b in counts)
    return RebalancePlan(
        moves=moves,
        assignment={k: tuple(v) for k, v in current.items()},
        balanced=balanced,
    )


def _find_move(
    current: Mapping[K, list[int]],
    over: Sequence[int],
    under: Sequence[int],
    rack_count: Callable[[Sequence[int]], int],
) -> tuple[K, int, int] | None:
    # Try sources most over target first (brokers being removed before all others), then
    # followers before preferred leaders, then destinations most under target.
    for from_b in over:
        for leader_pass in (False, True):
            for key, replicas in current.items():
                if from_b not in replicas:
                    continue
                pos = replicas.index(from_b)
                if (pos == 0) != leader_pass:
                    continue
                before = rack_count(replicas)
                for to_b in under:
                    if to_b in replicas:
                        continue
                    after = replicas.copy()
                    after[pos] = to_b
                    if rack_count(after) >= before:
                        return key, pos, to_b
    return None
