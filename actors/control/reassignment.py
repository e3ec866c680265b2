"""Partition reassignment (Kafka's KIP-455) as pure transitions on the cluster metadata.

This module owns how a partition's replica set changes while it stays available: starting,
completing and cancelling a reassignment, what ``list_reassignments`` reports, and turning a
rebalance plan (``placement.plan_rebalance``) into reassignment targets. Like
``raylog.actors.control.election`` every function takes a :class:`ClusterMetadata` and returns an
:class:`~raylog.actors.control.election.Outcome`; the controller writes it with compare-and-swap, so
a controller that takes over resumes a reassignment from the metadata alone.

A reassignment of partition ``p`` from its *original* replicas ``O`` to a *target* ``T``
(Kafka KRaft's rules, written afresh):

1. start: ``replicas`` becomes ``T`` followed by ``O - T`` (so the preferred leader is ``T[0]``),
   ``adding_replicas = T - O`` and ``removing_replicas = O - T``. The adding replicas are
   followers: the brokers create them and they catch up from the leader. The ISR and leader do
   not change (the ISR is re-ordered to the new assignment order).
2. complete, once every adding replica is in the ISR (the leader proposed it by AlterPartition
   after it caught up): ``replicas = T``, the removing replicas leave the ISR, and if the leader
   is one of them, the first eligible ISR member of ``T`` leads. The brokers of the removed
   replicas then stop them and delete their data. When no eligible member of ``T`` is in the
   ISR, completion waits.
3. cancel: ``replicas`` goes back to ``O`` (in the order ``T + (O - T)`` left it, as in Kafka),
   the adding replicas leave the ISR and stop; a leader among them hands over to ``O``.

Starting a reassignment of a partition that is already being reassigned replaces the target,
with ``O`` kept as the original. Every replica-set change bumps the leader epoch
(``metadata._changed_partition``), which is how the leader learns its new followers.

Invariant: ``target_replicas ∩ isr`` is never empty at completion, so the ISR is never emptied.

A reassignment may set ``leader.replication.throttled.rate`` (a dynamic broker config: the
bytes/s a leader sends to the replicas being added); it is dropped once no reassignment runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from raylog.actors.control import metadata as md_
from raylog.actors.control import placement
from raylog.actors.control.election import LogEndOffsets, Outcome, clean_leader
from raylog.actors.control.metadata import (
    NO_LEADER,
    ClusterMetadata,
    PartitionChange,
    PartitionState,
    TopicPartition,
)
from raylog.storage.errors import (
    BrokerNotAvailableError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    NoReassignmentInProgressError,
    RaylogError,
    ReassignmentInProgressError,
)

THROTTLE_KEY = "leader.replication.throttled.rate"


class ReassignmentProgress(msgspec.Struct, frozen=True, kw_only=True):
    """One partition being reassigned, as ``list_reassignments`` reports it.

    ``log_end_offsets`` holds the leader's and each adding replica's log end offset where known
    (-1: not reported yet); an adding replica has caught up when it reaches the leader's and
    is done when it is in the ISR.
    """

    topic: str
    partition: int
    replicas: tuple[int, ...]
    target: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]
    leader: int
    isr: tuple[int, ...]
    leader_log_end_offset: int
    adding_log_end_offsets: dict[int, int]


def _eligible(md: ClusterMetadata) -> set[int]:
    return {b for b, reg in md.brokers.items() if reg.state == "registered"}


def _in_order(members: Iterable[int], order: Sequence[int]) -> tuple[int, ...]:
    keep = set(members)
    return tuple(b for b in order if b in keep)


def _leader_within(
    p: PartitionState, replicas: Sequence[int], isr: Sequence[int], ok: set[int]
) -> int:
    """The sitting leader if it stays a replica, else a clean election over ``isr``."""
    if p.leader != NO_LEADER and p.leader in replicas:
        return p.leader
    trial = PartitionState(partition=p.partition, replicas=tuple(replicas), isr=tuple(isr))
    return clean_leader(trial, ok)


def _validate_target(md: ClusterMetadata, tp: TopicPartition, target: Sequence[int]) -> None:
    name = f"{tp.topic}-{tp.partition}"
    if not target:
        raise InvalidReplicaAssignmentError(f"{name}: the target replica list is empty")
    if len(set(target)) != len(target):
        raise InvalidReplicaAssignmentError(f"{name}: {list(target)} names a broker twice")
    unknown = [b for b in target if b not in md.brokers]
    if unknown:
        raise InvalidReplicaAssignmentError(f"{name}: brokers {unknown} are not registered")


def _start_one(
    md: ClusterMetadata, tp: TopicPartition, target: Sequence[int], ok: set[int]
) -> PartitionChange | None:
    _validate_target(md, tp, target)
    p = md_.get_partition(md, tp.topic, tp.partition)
    original = p.original_replicas
    target = tuple(target)
    if target == original:
        return _cancel_one(md, tp, p, ok) if p.reassigning else None
    adding = tuple(b for b in target if b not in original)
    down = [b for b in adding if b not in ok]
    if down:
        raise InvalidReplicaAssignmentError(
            f"{tp.topic}-{tp.partition}: brokers {down} are fenced or shutting down; a replica "
            f"added there could never catch up"
        )
    replicas = target + tuple(b for b in original if b not in target)
    isr = _in_order(p.isr, replicas)
    if not isr:
        raise InvalidReplicaAssignmentError(
            f"{tp.topic}-{tp.partition}: no ISR member {list(p.isr)} would remain a replica"
        )
    leader = _leader_within(p, replicas, isr, ok)
    return PartitionChange(
        topic=tp.topic,
        partition=tp.partition,
        replicas=replicas,
        isr=isr,
        leader=leader,
        observers=_in_order(p.observers, replicas),
        adding_replicas=adding,
        removing_replicas=tuple(b for b in original if b not in target),
    )


def start(md: ClusterMetadata, targets: Mapping[TopicPartition, Sequence[int]]) -> Outcome:
    """AlterPartitionReassignments: start (or replace) a reassignment per partition.

    Refusals are per partition (``Outcome.errors``): unknown partition, an empty or duplicate
    target, an unregistered broker, an added broker that is not active. A target equal to the
    current replicas is a no-op (a cancel if a reassignment is in progress). Partitions whose
    target adds no replica (a pure removal or re-ordering) complete at once.
    """
    ok = _eligible(md)
    changes: list[PartitionChange] = []
    errors: dict[TopicPartition, RaylogError] = {}
    for tp, target in targets.items():
        try:
            change = _start_one(md, tp, target, ok)
        except RaylogError as exc:
            errors[tp] = exc
            continue
        if change is not None:
            changes.append(change)
    started = md_.apply_partition_changes(md, changes)
    done = complete_ready(started, [c.topic_partition for c in changes])
    return Outcome(done.metadata, changes + done.changes, errors)


def _complete_one(tp: TopicPartition, p: PartitionState, ok: set[int]) -> PartitionChange | None:
    if not p.reassigning or any(b not in p.isr for b in p.adding_replicas):
        return None
    target = p.target_replicas
    isr = _in_order(p.isr, target)
    if not isr:
        return None  # only removing replicas are in sync: wait for the target to catch up
    leader = _leader_within(p, target, isr, ok)
    if leader == NO_LEADER and p.leader != NO_LEADER:
        return None  # the leader is being removed and no target replica can take over yet
    return PartitionChange(
        topic=tp.topic,
        partition=tp.partition,
        replicas=target,
        isr=isr,
        leader=leader,
        observers=_in_order(p.observers, target),
        adding_replicas=(),
        removing_replicas=(),
    )


def complete_ready(
    md: ClusterMetadata, partitions: Iterable[TopicPartition] | None = None
) -> Outcome:
    """Complete every reassignment (of ``partitions``, all when None) whose adding replicas are
    all in the ISR (step 2 of the module docstring). The controller runs it every round."""
    ok = _eligible(md)
    wanted = None if partitions is None else set(partitions)
    changes = []
    for tp, p in md_.partitions(md):
        if wanted is not None and tp not in wanted:
            continue
        change = _complete_one(tp, p, ok)
        if change is not None:
            changes.append(change)
    return Outcome(md_.apply_partition_changes(md, changes), changes)


def complete_round(md: ClusterMetadata) -> Outcome:
    """A controller round: :func:`complete_ready`, then the throttle dropped once no
    reassignment runs (after a failover too: the state is all in the metadata)."""
    out = complete_ready(md)
    new = out.metadata
    configs = new.dynamic_broker_configs
    if THROTTLE_KEY in configs and not any(p.reassigning for _, p in md_.partitions(new)):
        new = md_.set_dynamic_broker_configs(
            new, {k: v for k, v in configs.items() if k != THROTTLE_KEY}
        )
    return Outcome(new, out.changes, out.errors)


def throttled(md: ClusterMetadata, throttle_bytes_per_sec: int | None) -> ClusterMetadata:
    """``md`` with ``leader.replication.throttled.rate`` set (None: unchanged)."""
    if throttle_bytes_per_sec is None:
        return md
    configs = {**md.dynamic_broker_configs, THROTTLE_KEY: str(throttle_bytes_per_sec)}
    return md_.set_dynamic_broker_configs(md, configs)


def request_codes(
    wanted: Iterable[TopicPartition], out: Outcome
) -> dict[tuple[str, int], tuple[int, str]]:
    """Per partition of a request, Kafka's (error code, message); (0, "") = done."""
    codes = {(tp.topic, tp.partition): (0, "") for tp in wanted}
    for tp, exc in out.errors.items():
        codes[(tp.topic, tp.partition)] = (exc.error_code, str(exc))
    return codes


def _cancel_one(
    md: ClusterMetadata, tp: TopicPartition, p: PartitionState, ok: set[int]
) -> PartitionChange:
    if not p.reassigning:
        raise NoReassignmentInProgressError(f"{tp.topic}-{tp.partition} is not being reassigned")
    original = p.original_replicas
    isr = _in_order(p.isr, original)
    if not isr:
        raise InvalidReplicaAssignmentError(
            f"{tp.topic}-{tp.partition}: none of the original replicas {list(original)} is in "
            f"the ISR {list(p.isr)}; let the reassignment complete instead"
        )
    return PartitionChange(
        topic=tp.topic,
        partition=tp.partition,
        replicas=original,
        isr=isr,
        leader=_leader_within(p, original, isr, ok),
        observers=_in_order(p.observers, original),
        adding_replicas=(),
        removing_replicas=(),
    )


def cancel(md: ClusterMetadata, partitions: Iterable[TopicPartition] | None = None) -> Outcome:
    """Cancel reassignments (all in progress when ``partitions`` is None), step 3 of the module
    docstring; NO_REASSIGNMENT_IN_PROGRESS for a named partition that has none."""
    ok = _eligible(md)
    if partitions is None:
        partitions = [tp for tp, p in md_.partitions(md) if p.reassigning]
    changes: list[PartitionChange] = []
    errors: dict[TopicPartition, RaylogError] = {}
    for tp in partitions:
        try:
            p = md_.get_partition(md, tp.topic, tp.partition)
            changes.append(_cancel_one(md, tp, p, ok))
        except RaylogError as exc:
            errors[tp] = exc
    return Outcome(md_.apply_partition_changes(md, changes), changes, errors)


def progress(
    md: ClusterMetadata, log_end_offsets: LogEndOffsets | None = None
) -> list[ReassignmentProgress]:
    """ListPartitionReassignments, with each adding replica's log end against the leader's."""
    leos = log_end_offsets or {}
    out = []
    for tp, p in md_.partitions(md):
        if not p.reassigning:
            continue
        known = leos.get(tp, {})
        out.append(
            ReassignmentProgress(
                topic=tp.topic,
                partition=tp.partition,
                replicas=p.replicas,
                target=p.target_replicas,
                adding=p.adding_replicas,
                removing=p.removing_replicas,
                leader=p.leader,
                isr=p.isr,
                leader_log_end_offset=known.get(p.leader, -1),
                adding_log_end_offsets={b: known.get(b, -1) for b in p.adding_replicas},
            )
        )
    return out


def rebalance_targets(
    md: ClusterMetadata, topics: Iterable[str] | None = None
) -> tuple[dict[TopicPartition, tuple[int, ...]], bool]:
    """Reassignment targets that spread replicas evenly over the active brokers.

    Uses ``placement.plan_rebalance`` (fewest moves, racks kept) over the partitions of
    ``topics`` (all when None); returns only partitions whose replicas change, and whether the
    plan reached balance. Refused (REASSIGNMENT_IN_PROGRESS) while any reassignment runs.
    """
    wanted = None if topics is None else set(topics)
    for name in wanted or ():
        md_.get_topic(md, name)
    running = [tp for tp, p in md_.partitions(md) if p.reassigning]
    if running:
        # A plan counts every replica where it is; one in flight is in two places at once.
        raise ReassignmentInProgressError(
            f"{len(running)} partitions are being reassigned (e.g. {running[0].topic}-"
            f"{running[0].partition}); wait for them or cancel them before a rebalance"
        )
    assignment = {
        tp: p.replicas for tp, p in md_.partitions(md) if wanted is None or tp.topic in wanted
    }
    if not assignment:
        return {}, True
    plan = placement.plan_rebalance(assignment, md_.active_brokers(md))
    targets = {
        tp: tuple(plan.assignment[tp])
        for tp in assignment
        if tuple(plan.assignment[tp]) != tuple(assignment[tp])
    }
    return targets, plan.balanced


class ByteRateThrottle:
    """A token bucket for ``leader.replication.throttled.rate`` (no clock inside: callers pass
    ``now_ms``). It holds at most one second of bytes; a send that overdraws it is delayed until
    the bucket is back to zero, and no delay exceeds ``MAX_DELAY_MS`` so a throttled follower's
    fetch is answered well before its fetch timeout (5 s) makes it resend."""

    MAX_DELAY_MS = 2_000

    def __init__(self, bytes_per_sec: int, now_ms: int) -> None:
        if bytes_per_sec <= 0:
            raise ValueError(f"throttle rate must be positive, not {bytes_per_sec}")
        self.bytes_per_sec = bytes_per_sec
        self._tokens = float(bytes_per_sec)
        self._last_ms = now_ms

    def read_limit(self) -> int:
        """At most one second of bytes per send (at least one batch is always read)."""
        return self.bytes_per_sec

    def delay_ms(self, nbytes: int, now_ms: int) -> int:
        """Take ``nbytes`` sent now; how long to hold the send back."""
        elapsed = max(0, now_ms - self._last_ms)
        self._last_ms = now_ms
        self._tokens = min(
            float(self.bytes_per_sec), self._tokens + elapsed * self.bytes_per_sec / 1000
        )
        self._tokens -= nbytes
        if self._tokens >= 0:
            return 0
        return min(self.MAX_DELAY_MS, int(-self._tokens * 1000 / self.bytes_per_sec) + 1)


__all__ = [
    "THROTTLE_KEY",
    "ByteRateThrottle",
    "ReassignmentProgress",
    "cancel",
    "complete_ready",
    "complete_round",
    "progress",
    "rebalance_targets",
    "request_codes",
    "start",
    "throttled",
]


def decommission_targets(
    md: ClusterMetadata, broker_id: int
) -> dict[TopicPartition, tuple[int, ...]]:
    """Reassignment targets that move every replica off ``broker_id`` onto the other active
    brokers (``placement.plan_rebalance`` over the partitions it holds: fewest moves, racks
    kept, the new replicas spread evenly; what its greedy moves leave goes to the least loaded
    broker the partition lacks). Refused (INVALID_REPLICATION_FACTOR, naming the
    topic) when a partition it holds has more replicas than the brokers left; refused
    (REASSIGNMENT_IN_PROGRESS) while any reassignment runs; BROKER_NOT_AVAILABLE for a
    broker that is not registered."""
    broker = md.brokers.get(broker_id)
    if broker is None or broker.state != "registered":
        raise BrokerNotAvailableError(f"broker {broker_id} is not a registered, active broker")
    running = [tp for tp, p in md_.partitions(md) if p.reassigning]
    if running:
        raise ReassignmentInProgressError(
            f"{len(running)} partitions are being reassigned (e.g. {running[0].topic}-"
            f"{running[0].partition}); wait for them or cancel them before a decommission"
        )
    left = [b for b in md_.active_brokers(md) if b.broker_id != broker_id]
    held = {tp: p.replicas for tp, p in md_.partitions(md) if broker_id in p.replicas}
    for tp, replicas in sorted(held.items()):
        if len(replicas) > len(left):
            raise InvalidReplicationFactorError(
                f"broker {broker_id} holds a replica of {tp.topic}-{tp.partition}, whose "
                f"replication factor is {len(replicas)}: {len(left)} brokers would be left"
            )
    if not held:
        return {}
    plan = placement.plan_rebalance(held, left)
    targets = {tp: list(plan.assignment[tp]) for tp in held}
    # plan_rebalance stops at balance: a replica its greedy moves left on the broker goes to
    # the least loaded broker the partition lacks, on a rack it lacks where there is one.
    load = Counter(b for target in targets.values() for b in target)
    rack = {b.broker_id: b.rack for b in left}
    for tp in sorted(targets):
        target = targets[tp]
        if broker_id not in target:
            continue
        racks = {rack[b] for b in target if b in rack}
        to = min(
            (b for b in rack if b not in target),
            key=lambda b: (rack[b] in racks, load[b], b),
        )
        target[target.index(broker_id)] = to
        load[to] += 1
    return {tp: tuple(target) for tp, target in targets.items()}
