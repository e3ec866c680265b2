"""A whole `raylog up` crashed and started again while an idempotent producer keeps producing.

The session's shared `raylog up` (3 brokers; the later modules share it restarted), a topic with
2 partitions, RF=3, min.insync.replicas=2. confluent-kafka with ``enable.idempotence=true``,
acks=all and a message timeout longer than the outage produces to both partitions in a thread of
its own, throughout: while the cluster runs, while every process of it is SIGKILLed (the `up`
process and its whole Ray cluster, by PID: a crash of the machine), and while a second `raylog
up` starts on the same data dir, object store and ports, until records are acknowledged by the
restarted cluster.

Proves (issue 31): a starting broker never tells the client that the topic does not exist:
every record is delivered, none fails (_UNKNOWN_PARTITION, _UNKNOWN_TOPIC or any other error),
and ``produce()`` never raises; every record is in the log exactly once, each partition's in
send order with dense offsets; every acknowledgement's offset is where the record is (librdkafka
may deliver records as "implicitly acked" with no offset after an uncertain outcome; those are
in the log once and in order all the same).
"""

from __future__ import annotations

import logging
from collections import deque

import pytest
from support.cluster import UpProcess, create_durable_topic
from support.producing import Producing
from support.read_back import batch_headers, check_exactly_once, read_back, sent_ends
from support.waiting import wait_until

pytestmark = pytest.mark.slow

TOPIC = "crash-restart"
PARTITIONS = 2
MESSAGE_TIMEOUT_S = 240.0  # longer than the outage: the client keeps every record queued
ACKED_BEFORE = 300  # acknowledged before the crash
ACKED_AFTER = 300  # more acknowledged by the restarted cluster
ACK_DEADLINE_S = 180.0
PACE_S = 0.005  # the producer's poll between records (its pacing, and its delivery events)
READ_DEADLINE_S = 120.0


class _EosLog(logging.Handler):
    """librdkafka's idempotence log lines (epoch bumps, sequence errors), kept for a failure
    message: the last ``limit`` lines, without the outage's connection refusals."""

    def __init__(self, limit: int = 300) -> None:
        super().__init__()
        self.lines: deque[str] = deque(maxlen=limit)

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if "Connect to" not in line:
            self.lines.append(line)


def _producing(bootstrap: str) -> tuple[Producing, _EosLog]:
    """The producer, with librdkafka's idempotence log kept for a failure message."""
    eos_log = _EosLog()
    logger = logging.getLogger("crash-restart-producer")
    logger.addHandler(eos_log)
    logger.setLevel(logging.DEBUG)
    settings = {"debug": "eos", "logger": logger}
    return Producing(bootstrap, TOPIC, PARTITIONS, MESSAGE_TIMEOUT_S, PACE_S, settings), eos_log


def _acked_at_least(producing: Producing, count: int) -> bool:
    assert not producing.errors, producing.errors[:3]
    return len(producing.acked) >= count


# Not strict until repeated runs confirm the cause is gone: about one run in ten found one
# record appended twice, under the producer's epoch 0 and again under epoch 1, after librdkafka
# bumped its epoch on an OUT_OF_ORDER_SEQUENCE_NUMBER answered to a batch behind a refused one
# (what actors/replication/refused_batches.py and the gateway's rule 3 hold back). A failure
# prints every replica's batch headers and librdkafka's idempotence log.
def test_an_idempotent_producer_loses_nothing_across_a_crash_and_restart(
    shared_up: UpProcess,
) -> None:
    up = shared_up
    producing: Producing | None = None
    try:
        create_durable_topic(up, TOPIC, PARTITIONS)
        producing, eos_log = _producing(up.bootstrap)
        producing.start()
        wait_until(
            lambda: _acked_at_least(producing, ACKED_BEFORE),
            timeout_s=ACK_DEADLINE_S,
            interval_s=0.1,
            message="records acknowledged before the crash",
        )
        bootstrap = up.bootstrap
        up.crash()
        sent_at_crash = producing.sent
        # The same data dir, object store (in it) and ports: the bootstrap the client has. The
        # session's later modules share the restarted cluster.
        assert up.start() == bootstrap
        assert producing.sent > sent_at_crash, "the producer kept producing while down"
        wait_until(
            lambda: _acked_at_least(producing, sent_at_crash + ACKED_AFTER),
            timeout_s=ACK_DEADLINE_S,
            interval_s=0.1,
            message="records acknowledged by the restarted cluster",
        )
        sent = producing.finish(MESSAGE_TIMEOUT_S)
        log = read_back(up.bootstrap, TOPIC, sent_ends(sent, PARTITIONS), READ_DEADLINE_S)
    finally:
        if producing is not None:
            producing.abandon()

    def explain() -> None:
        for q in log:
            print("\n".join(batch_headers(up.data_dir, TOPIC, q)))
        print("librdkafka eos log:\n" + "\n".join(eos_log.lines))

    check_exactly_once(log, sent, producing.acked, explain)
