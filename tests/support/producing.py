"""An idempotent confluent-kafka producer in a thread of its own, for live fault tests and the
soak runner (benchmarks/soak.py).

``Producing(bootstrap, topic, partitions, message_timeout_s, pace_s)`` produces record i (value
``%07d``) to partition ``i % partitions`` with acks=all until halted, polling ``pace_s`` between
records (its pacing, and its delivery events); a full client queue (the cluster is down) waits.
It keeps each acknowledgement's offset (``acked``; None: librdkafka's "implicitly acked"), when
it arrived (``ack_times``), how long after its ``produce()`` (``ack_latencies``), and every
failure (``errors``: a delivery error, or ``produce()`` raising, which ends the thread).
``settings`` add to the client's. ``finish`` stops it, delivers what is queued and checks that
every record was acknowledged.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import KafkaException, Producer


class Producing(threading.Thread):
    """See the module docstring."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        message_timeout_s: float,
        pace_s: float,
        settings: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name="producing", daemon=True)
        self.topic, self.partitions, self.pace_s = topic, partitions, pace_s
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": int(message_timeout_s * 1000),
                **(settings or {}),
            }
        )
        self.sent = 0
        self.sent_at: list[float] = []  # record i's produce() time (time.monotonic())
        self.acked: dict[bytes, int | None] = {}
        self._acked_at: dict[bytes, float] = {}
        self.errors: list[str] = []
        self.halt = threading.Event()
        self.abandoned = False  # ``abandon`` let the client go

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.value()!r}: {err}")
        else:
            self.acked[msg.value()] = msg.offset()
            self._acked_at[msg.value()] = time.monotonic()

    def ack_times(self) -> list[float]:
        return sorted(list(self._acked_at.values()))

    def ack_latencies(self, since: float, until: float) -> list[float]:
        """Seconds from produce() to acknowledgement of the records acknowledged in
        [since, until) (time.monotonic())."""
        acked_at = list(self._acked_at.items())  # a copy: the client's thread adds to it
        return [t - self.sent_at[int(v)] for v, t in acked_at if since <= t < until]

    def finish(self, timeout_s: float) -> int:
        """Stop producing, deliver what is queued, and check every record was acknowledged
        without an error; returns how many were sent."""
        self.halt.set()
        self.join(timeout=timeout_s)
        assert not self.is_alive(), "the producer thread did not stop"
        assert self.producer.flush(timeout_s) == 0, "records still queued"
        assert not self.errors, self.errors[:3]
        assert len(self.acked) == self.sent, "every record is acknowledged"
        return self.sent

    def stop(self, timeout_s: float) -> None:
        """Halts the thread (its records still queued stay queued: ``producer.flush()``)."""
        self.halt.set()
        if self.is_alive():
            self.join(timeout=timeout_s)

    def run(self) -> None:
        while not self.halt.is_set():  # bounded: the test halts it, or an error does
            try:
                self.producer.produce(
                    self.topic,
                    value=b"%07d" % self.sent,
                    partition=self.sent % self.partitions,
                    on_delivery=self._delivered,
                )
            except BufferError:  # the client's queue is full (the cluster is down): wait
                self.producer.poll(0.1)
                continue
            except KafkaException as exc:  # e.g. _UNKNOWN_TOPIC: what issue 31 was
                self.errors.append(f"produce() raised {exc}")
                return
            self.sent_at.append(time.monotonic())
            self.sent += 1
            self.producer.poll(self.pace_s)

    def abandon(self, timeout_s: float = 10.0) -> None:
        """After a failure: halt the thread, drop what is queued and let the client go, so its
        threads stop reconnecting to ports that later tests may reuse. Idempotent."""
        self.stop(timeout_s)
        if self.is_alive() or self.abandoned:  # still inside a client call: leave it to it
            return
        self.producer.purge()
        self.producer.flush(0)
        del self.producer  # the last reference: librdkafka's threads end with it
        self.abandoned = True
