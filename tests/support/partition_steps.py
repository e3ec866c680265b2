"""Steps that drive the pure replication state machine (``PartitionReplica``) in unit tests: a
leader in its epoch, a produce, a local fsync, a follower's fetch, a committed AlterPartition,
and the answers a Ready carries."""

from __future__ import annotations

from typing import Any

from raylog.actors.replication.messages import (
    AlterPartitionResponse,
    BecomeLeader,
    FetchRequest,
    FetchResponse,
    LocalAppendDurable,
    ProduceRequest,
)
from raylog.actors.replication.partition import (
    PartitionReplica,
    ProduceResult,
    Ready,
    ReplicaConfig,
    SendFetchData,
)

EPOCH = 1


def make_leader(
    isr: tuple[int, ...] = (0, 1, 2),
    replicas: tuple[int, ...] = (0, 1, 2),
    observers: tuple[int, ...] = (),
    now_ms: int = 0,
    **config: Any,
) -> PartitionReplica:
    replica = PartitionReplica(0, ReplicaConfig(**config))
    replica.step(BecomeLeader(1, EPOCH, 0, isr, replicas, observers), now_ms)
    ready = replica.ready()
    if ready.alter_partition:  # a fresh replica fences before it trusts a partial ISR
        commit_alter(replica, ready, now_ms)
    return replica


def produce(
    replica: PartitionReplica,
    request_id: int,
    acks: int = -1,
    now_ms: int = 0,
    timeout_ms: int = 30_000,
    count: int = 1,
) -> Ready:
    replica.step(ProduceRequest(request_id, acks, timeout_ms, count, 10, b"x"), now_ms)
    return replica.ready()


def make_durable(replica: PartitionReplica, now_ms: int = 0) -> Ready:
    replica.step(LocalAppendDurable(replica.log_end_offset, replica.generation), now_ms)
    return replica.ready()


_fetch_ids = iter(range(1, 1 << 30))


def follower_fetch(
    replica: PartitionReplica,
    follower: int,
    offset: int,
    now_ms: int,
    epoch: int = EPOCH,
    log_start_offset: int = 0,
) -> Ready:
    """A follower's fetch; it reports its log start offset as followers do."""
    request = FetchRequest(
        follower, next(_fetch_ids), epoch, offset, -1, 1 << 20, 0, log_start_offset
    )
    replica.step(request, now_ms)
    return replica.ready()


def commit_alter(replica: PartitionReplica, ready: Ready, now_ms: int = 0) -> Ready:
    request = ready.alter_partition[-1]
    replica.step(
        AlterPartitionResponse(
            0,
            request.leader_epoch,
            request.partition_epoch + 1,
            request.new_isr,
            request.request_id,
        ),
        now_ms,
    )
    return replica.ready()


def results(ready: Ready) -> dict[int, ProduceResult]:
    return {r.request_id: r for r in ready.produce_results}


def fetch_answers(ready: Ready) -> list[FetchResponse]:
    return [m.response for m in ready.messages if isinstance(m, SendFetchData)]
