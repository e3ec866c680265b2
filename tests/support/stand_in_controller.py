"""A stand-in for the controller in tests of replica actors without one: a small Ray actor
that takes one partition's AlterPartition proposals and its replicas' offline reports.

Every proposal made at the current partition epoch is committed (the epoch moves on); the
answer goes back to the proposing replica as the controller's would. Offline reports are
kept. ``reset`` sets the partition epoch and ISR (after the test elects a leader itself);
``state`` gives the ISR and the offline reports.
"""

from __future__ import annotations

from typing import Any

import ray

from raylog.actors.replication.messages import AlterPartitionResponse


@ray.remote(num_cpus=0)
class StandInController:
    def __init__(self, isr: tuple[int, ...]) -> None:
        self.partition_epoch = 1
        self.isr = isr
        self.offline: list[str] = []

    def reset(self, partition_epoch: int, isr: tuple[int, ...]) -> None:
        self.partition_epoch, self.isr = partition_epoch, isr

    def alter_partition(self, topic: str, partition: int, request: Any, replica: Any) -> None:
        if request.partition_epoch == self.partition_epoch:
            self.partition_epoch += 1
            self.isr = tuple(request.new_isr)
        replica.alter_partition_response.remote(
            AlterPartitionResponse(
                0, request.leader_epoch, self.partition_epoch, self.isr, request.request_id
            )
        )

    def replica_offline(self, topic: str, partition: int, reason: str, actor_id: str) -> None:
        self.offline.append(reason)

    def state(self) -> tuple[tuple[int, ...], list[str]]:
        return self.isr, self.offline
