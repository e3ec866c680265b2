"""A consumer-group member in a thread of its own, for live fault tests and the soak runner.

``Consuming(bootstrap, topic, group, commit_every_s)`` subscribes to ``topic`` in ``group``,
reads and commits its position every ``commit_every_s`` (synchronously) until halted; it keeps
the offsets of its last successful commit (``committed``), every commit that failed
(``commit_errors``: a fault may refuse one; it is retried at the next), how many records it
read, and whether a commit ever moved an offset back (``went_back``). ``committed_offsets``
asks the cluster what a group has committed.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition

POLL_S = 0.2
BATCH = 500


class Consuming(threading.Thread):
    """See the module docstring."""

    def __init__(
        self, bootstrap: str, topic: str, group: str, commit_every_s: float, stop_s: float = 60.0
    ) -> None:
        super().__init__(name="consuming", daemon=True)
        self.topic, self.commit_every_s, self.stop_s = topic, commit_every_s, stop_s
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self.consumed = 0
        self.committed: dict[int, int] = {}
        self.commit_errors: list[str] = []
        self.went_back: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        self.consumer.subscribe([self.topic])
        positions: dict[int, int] = {}
        last_commit = time.monotonic()
        try:
            while not self.halt.is_set():  # bounded: the test halts it
                for msg in self.consumer.consume(num_messages=BATCH, timeout=POLL_S):
                    if msg.error() is None:
                        positions[msg.partition()] = msg.offset() + 1
                        self.consumed += 1
                if positions and time.monotonic() - last_commit >= self.commit_every_s:
                    self._commit(dict(positions))
                    last_commit = time.monotonic()
            self._commit(dict(positions))
        finally:
            self.consumer.close()

    def stop(self) -> None:
        """Halts the thread: a last commit, then the consumer leaves the group and closes."""
        self.halt.set()
        if self.is_alive():
            self.join(timeout=self.stop_s)

    def _commit(self, positions: dict[int, int]) -> None:
        if not positions:
            return
        offsets = [TopicPartition(self.topic, p, o) for p, o in positions.items()]
        try:
            done = self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:  # e.g. the coordinator moving: retried at the next commit
            self.commit_errors.append(str(exc))
            return
        if done and all(tp.error is None for tp in done):
            for tp in done:
                before = self.committed.get(tp.partition, 0)
                if tp.offset < before:
                    self.went_back.append(f"partition {tp.partition}: {before} -> {tp.offset}")
                self.committed[tp.partition] = tp.offset


def committed_offsets(
    bootstrap: str, topic: str, group: str, partitions: int, timeout_s: float
) -> dict[int, int]:
    """The offsets ``group`` has committed for each partition of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed(
            [TopicPartition(topic, p) for p in range(partitions)], timeout=timeout_s
        )
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}
