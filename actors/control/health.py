"""Cluster health as Kafka's operators read it, computed from the metadata (pure functions).

Owns the definitions that `raylog status`, `raylog topics describe --under-replicated-partitions`,
`raylog brokers list` and the metrics endpoint share, so they always agree:

- a partition is *offline* when it has no leader (Kafka's OfflinePartitionsCount);
- *under-replicated* when its ISR is smaller than its voting replicas (replicas minus observers;
  Kafka's UnderReplicatedPartitions);
- *under min ISR* when it is online and its ISR is smaller than its topic's effective
  ``min.insync.replicas`` (Kafka's UnderMinIsrPartitionCount): acks=all produce fails there;
- a broker is *alive* (registered), *fenced* (session expired or crashed) or *shutdown* (stopped
  on purpose: in controlled shutdown, or stopped by `raylog brokers stop` and not started since);
- ISR shrinks and expands and leader elections are counted by comparing two metadata versions.

No Ray, no clock, no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from typing import Literal, Protocol

import msgspec

from raylog.actors.control import config_keys
from raylog.actors.control.metadata import NO_LEADER, ClusterMetadata, PartitionState

BrokerHealth = Literal["alive", "draining", "fenced", "shutdown"]
BROKER_STATES: tuple[BrokerHealth, ...] = ("alive", "draining", "fenced", "shutdown")

__all__ = [
    "BROKER_STATES",
    "BrokerRow",
    "ClusterHealth",
    "PartitionHealth",
    "ReplicaView",
    "Transitions",
    "broker_rows",
    "cluster_health",
    "follower_lags",
    "partition_health",
    "transitions",
]


class PartitionHealth(msgspec.Struct, frozen=True, kw_only=True):
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_insync_replicas: int
    offline: bool
    under_replicated: bool
    under_min_isr: bool
    offline_replicas: tuple[int, ...] = ()  # replicas whose log failed


class ClusterHealth(msgspec.Struct, frozen=True, kw_only=True):
    partitions: int
    offline_partitions: int
    under_replicated_partitions: int
    under_min_isr_partitions: int
    offline_replicas: int = 0  # Kafka's OfflineReplicaCount, over the whole cluster


class BrokerRow(msgspec.Struct, frozen=True, kw_only=True):
    broker_id: int
    rack: str | None
    host: str
    port: int
    state: BrokerHealth
    leader_partitions: int  # partitions this broker leads now


class Transitions(msgspec.Struct, frozen=True, kw_only=True):
    isr_shrinks: int = 0
    isr_expands: int = 0
    leader_elections: int = 0


def _health(topic: str, p: PartitionState, min_isr: int) -> PartitionHealth:
    voters = [b for b in p.replicas if b not in p.observers]
    offline = p.leader == NO_LEADER
    return PartitionHealth(
        topic=topic,
        partition=p.partition,
        leader=p.leader,
        leader_epoch=p.leader_epoch,
        replicas=p.replicas,
        isr=p.isr,
        min_insync_replicas=min_isr,
        offline=offline,
        under_replicated=len(p.isr) < len(voters),
        under_min_isr=not offline and len(p.isr) < min_isr,
        offline_replicas=p.offline_replicas,
    )


def partition_health(
    md: ClusterMetadata, topics: Iterable[str] | None = None
) -> list[PartitionHealth]:
    """One row per partition of ``topics`` (default: every topic), in topic, partition order."""
    rows = []
    for name in sorted(md.topics if topics is None else topics):
        t = md.topics[name]
        min_isr = config_keys.effective(t.configs).min_insync_replicas
        rows.extend(_health(name, p, min_isr) for p in t.partitions)
    return rows


def cluster_health(rows: Iterable[PartitionHealth]) -> ClusterHealth:
    rows = list(rows)
    return ClusterHealth(
        partitions=len(rows),
        offline_partitions=sum(r.offline for r in rows),
        under_replicated_partitions=sum(r.under_replicated for r in rows),
        under_min_isr_partitions=sum(r.under_min_isr for r in rows),
        offline_replicas=sum(len(r.offline_replicas) for r in rows),
    )


def broker_rows(md: ClusterMetadata, stopped: Set[int] = frozenset()) -> list[BrokerRow]:
    """Every registered broker; ``stopped``: ids stopped on purpose (not started since)."""
    led: dict[int, int] = {}
    for t in md.topics.values():
        for p in t.partitions:
            if p.leader != NO_LEADER:
                led[p.leader] = led.get(p.leader, 0) + 1
    rows = []
    for broker_id in sorted(md.brokers):
        reg = md.brokers[broker_id]
        state: BrokerHealth
        if broker_id in stopped or reg.state == "controlled_shutdown":
            state = "shutdown"
        elif reg.state == "fenced":
            state = "fenced"
        else:
            state = "draining" if reg.draining else "alive"
        rows.append(
            BrokerRow(
                broker_id=broker_id,
                rack=reg.rack,
                host=reg.host,
                port=reg.port,
                state=state,
                leader_partitions=led.get(broker_id, 0),
            )
        )
    return rows


def transitions(old: ClusterMetadata, new: ClusterMetadata) -> Transitions:
    """ISR shrinks/expands and leader elections between two versions of the metadata.

    A partition whose ISR lost a member counts one shrink, one that gained a member one expand
    (both when a member was swapped). A new leader epoch with a leader is one election; a
    partition created in ``new`` counts nothing.
    """
    shrinks = expands = elections = 0
    for name, t in new.topics.items():
        before = old.topics.get(name)
        if before is None or before.topic_id != t.topic_id:
            continue
        for p in t.partitions[: len(before.partitions)]:
            q = before.partitions[p.partition]
            old_isr, new_isr = set(q.isr), set(p.isr)
            shrinks += bool(old_isr - new_isr)
            expands += bool(new_isr - old_isr)
            elections += p.leader_epoch > q.leader_epoch and p.leader != NO_LEADER
    return Transitions(isr_shrinks=shrinks, isr_expands=expands, leader_elections=elections)


class ReplicaView(Protocol):
    """The fields of a ReplicaState snapshot (``raylog.actors.replica``) lags are computed from."""

    topic: str
    partition: int
    replica_id: int
    role: str
    leader_id: int
    log_end_offset: int


def follower_lags(states: Iterable[ReplicaView]) -> dict[tuple[str, int, int], int]:
    """(topic, partition, follower id) -> messages behind its leader's log end offset.

    A partition whose leader did not answer (or two replicas claim to lead: a moment during an
    election) has no entries; only followers of that leader count.
    """
    by_tp: dict[tuple[str, int], list[ReplicaView]] = {}
    for s in states:
        by_tp.setdefault((s.topic, s.partition), []).append(s)
    lags = {}
    for (topic, partition), group in by_tp.items():
        leaders = [s for s in group if s.role == "leader"]
        if len(leaders) != 1:
            continue
        leader = leaders[0]
        for s in group:
            if s is not leader and s.leader_id == leader.replica_id:
                lags[(topic, partition, s.replica_id)] = max(
                    0, leader.log_end_offset - s.log_end_offset
                )
    return lags
