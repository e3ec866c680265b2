"""The state machine's side of retention: LocalLogStartAdvanced moves the log start, never above
the high watermark, and trims the epoch cache from the start as Kafka's truncateFromStart."""

from __future__ import annotations

from raylog.actors.replication.messages import (
    BecomeLeader,
    LocalAppendDurable,
    LocalLogStartAdvanced,
    ProduceRequest,
)
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.ready import ReplicaConfig


def _leader_with_epochs() -> PartitionReplica:
    """RF=1 leader with epoch 1 at offsets 0-4 and epoch 2 from offset 5 to 10 (all committed)."""
    replica = PartitionReplica(0, ReplicaConfig())
    for epoch, count in ((1, 5), (2, 5)):
        replica.step(BecomeLeader(1, epoch, epoch, (0,), (0,)), 0)
        replica.step(ProduceRequest(epoch, 1, 30_000, count, 10, b"x"), 0)
        replica.step(LocalAppendDurable(replica.log_end_offset, replica.generation), 0)
        replica.ready()
    assert replica.high_watermark == 10
    assert replica.epoch_cache == [(1, 0), (2, 5)]
    return replica


def test_log_start_moves_and_epoch_cache_is_trimmed_from_the_start() -> None:
    replica = _leader_with_epochs()
    replica.step(LocalLogStartAdvanced(7), 0)
    assert replica.log_start_offset == 7
    assert replica.epoch_cache == [(2, 7)]


def test_log_start_inside_the_first_epoch_keeps_it_with_a_new_start() -> None:
    replica = _leader_with_epochs()
    replica.step(LocalLogStartAdvanced(3), 0)
    assert replica.epoch_cache == [(1, 3), (2, 5)]


def test_log_start_never_moves_back_nor_past_the_high_watermark() -> None:
    replica = _leader_with_epochs()
    replica.step(LocalLogStartAdvanced(4), 0)
    replica.step(LocalLogStartAdvanced(2), 0)
    assert replica.log_start_offset == 4
    replica.step(LocalLogStartAdvanced(50), 0)
    assert replica.log_start_offset == replica.high_watermark == 10
