"""What a live test produced, read back: from the cluster, and from every replica's files.

- ``read_back``: (offset, value) of every record below ``ends[p]`` of each partition of a topic,
  read by a consumer that is assigned them (no group), waited on with a deadline.
- ``replica_batches``: (header, bytes) of every batch of one replica's log directory, in offset
  order (every segment file).
- ``sent_ends``: each partition's record count once ``Producing`` sent ``sent`` records.
- ``check_exactly_once``: what ``support.producing.Producing`` sent (record i to partition
  ``i % partitions``), read back: every record once, each partition's in send order at dense
  offsets, and every acknowledgement's offset where the record is (librdkafka may deliver
  records as "implicitly acked" with no offset after an uncertain outcome).
- ``replicas_agree``: the replicas of one partition, read from their files: the ones named
  byte-identical below an offset (the high watermark), and no two of all of them holding
  different batches of the same leader epoch at the same offset (one writer per epoch). It
  first waits until the files of the ones named reach that offset: an acknowledgement needs
  only the ISR (at least min.insync.replicas), and a follower out of it catches up later.
- ``batch_headers``: every replica's batch headers of a topic's partitions (offsets, producer
  id, epoch, sequence, leader epoch, control), for a failure message: they tell a retry appended
  twice from an epoch bump that re-sent persisted records, or which replica diverged.
"""

from __future__ import annotations

from collections.abc import Callable
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


def sent_ends(sent: int, partitions: int) -> dict[int, int]:
    """See the module docstring (record i went to partition ``i % partitions``)."""
    return {p: len(range(p, sent, partitions)) for p in range(partitions)}


def check_exactly_once(
    log: dict[int, list[tuple[int, bytes]]],
    sent: int,
    acked: dict[bytes, int | None],
    explain: Callable[[], None] | None = None,
) -> None:
    """See the module docstring; ``explain`` prints what helps a failure (before it is raised)."""
    partitions = len(log)
    for p, records in log.items():
        wanted = list(range(p, sent, partitions))
        values = [int(value) for _, value in records]
        if values != wanted and explain is not None:
            explain()
        assert [offset for offset, _ in records] == list(range(len(records))), "dense offsets"
        assert values == wanted, f"partition {p}: duplicates, gaps or reordering"
        wrong = {v: (acked[v], o) for o, v in records if acked[v] not in (o, None)}
        assert not wrong, f"partition {p}: acknowledged offsets not the real ones: {wrong}"


def replica_batches(replica_dir: Path) -> list[tuple[Any, bytes]]:
    """(header, bytes) of every batch of one replica's log, in offset order."""
    out = []
    for segment in sorted(replica_dir.glob("*.log")):
        data = segment.read_bytes()
        for pos, h in iter_batches(data, verify=False):
            out.append((h, data[pos : pos + h.size]))
    return out


def _log_end(replica_dir: Path) -> int:
    """The end of a replica's log, from its last segment that holds a batch (not the whole log,
    which a wait reads again and again)."""
    for segment in sorted(replica_dir.glob("*.log"), reverse=True):
        last = None
        for _, h in iter_batches(segment.read_bytes(), verify=False):
            last = h
        if last is not None:
            return last.last_offset + 1
    return 0


def replicas_agree(
    dirs: dict[str, Path], end: int, identical: set[str], timeout_s: float = 60.0
) -> None:
    """See the module docstring: ``dirs`` names each replica's directory, ``identical`` the
    names that must hold the same batches below ``end``."""
    assert identical <= dirs.keys(), f"replicas {sorted(dirs)}, wanted {sorted(identical)}"
    wait_until(
        lambda: all(_log_end(dirs[name]) >= end for name in identical),
        timeout_s=timeout_s,
        interval_s=0.2,
        message=f"the files of {sorted(identical)} reaching offset {end}",
    )
    logs = {name: replica_batches(d) for name, d in dirs.items()}
    below = {
        name: [data for h, data in batches if h.last_offset < end]
        for name, batches in logs.items()
        if name in identical
    }
    first, *rest = below.values()
    assert all(batches == first for batches in rest), (
        f"replicas differ below the high watermark {end}: {[len(b) for b in below.values()]}"
        " batches"
    )
    by_place: dict[tuple[int, int], tuple[str, bytes]] = {}
    for name, batches in logs.items():
        for h, data in batches:
            key = (h.partition_leader_epoch, h.base_offset)
            seen = by_place.setdefault(key, (name, data))
            assert seen[1] == data, (
                f"two batches of leader epoch {key[0]} at offset {key[1]} ({seen[0]}, {name})"
            )


def node_replica_dirs(data_dir: Path, topic: str, partition: int) -> dict[str, Path]:
    """The replicas of a partition of `raylog up --address`, whose nodes keep their data in
    ``node-<rack>`` under its data dir: ``<rack>/broker-<id>`` -> directory."""
    found = sorted(data_dir.glob(f"node-*/broker-*/{topic}-{partition}"))
    return {f"{d.parent.parent.name[5:]}/{d.parent.name}": d for d in found}


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
