"""What a live test produced, read back: from the cluster, and from every replica's files.

- ``read_back``: (offset, value) of every record below ``ends[p]`` of each partition of a topic,
  read by a consumer that is assigned them (no group), waited on with a deadline.
- ``replica_batches``: (header, bytes) of every batch of one replica's log directory, in offset
  order (every segment file).
- ``batch_headers``: every replica's batch headers of a topic's partitions (offsets, producer
  id, epoch, sequence, leader epoch, control), for a failure message: they tell a retry appended
  twice from an epoch bump that re-sent persisted records, or which replica diverged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from raylog.storage.batch import iter_batches
from support.waiting import wait_until


def read_back(
    bootstrap: str, topic: str, ends: dict[int, int], timeout_s: float
) -> dict[int, list[tuple[int, bytes]]]:
    """(offset, value) of every record below ``ends[p]`` of each partition ``p``."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    got: dict[int, dict[int, bytes]] = {p: {} for p in ends}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])

        def all_read() -> bool:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is None and msg.offset() < ends[msg.partition()]:
                    got[msg.partition()][msg.offset()] = msg.value()
            return all(len(got[p]) >= end for p, end in ends.items())

        wait_until(all_read, timeout_s=timeout_s, message=f"the records below {ends} consumed")
    finally:
        consumer.close()
    return {p: sorted(records.items()) for p, records in got.items()}


def replica_batches(replica_dir: Path) -> list[tuple[Any, bytes]]:
    """(header, bytes) of every batch of one replica's log, in offset order."""
    out = []
    for segment in sorted(replica_dir.glob("*.log")):
        data = segment.read_bytes()
        for pos, h in iter_batches(data, verify=False):
            out.append((h, data[pos : pos + h.size]))
    return out


def batch_headers(data_dir: Path, topic: str, partition: int | None = None) -> list[str]:
    """Every replica's batch headers of ``partition`` (None: every partition) of ``topic``."""
    lines = []
    pattern = f"{topic}-{'*' if partition is None else partition}"
    for replica in sorted(data_dir.glob(f"broker-*/{pattern}")):
        lines.append(f"{replica.parent.name}/{replica.name}:")
        for h, _ in replica_batches(replica):
            lines.append(
                f"  {h.base_offset}-{h.last_offset} pid={h.producer_id} "
                f"epoch={h.producer_epoch} seq={h.base_sequence} "
                f"leader_epoch={h.partition_leader_epoch} ctl={h.is_control}"
            )
    return lines
