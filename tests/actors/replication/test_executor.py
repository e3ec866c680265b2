"""Unit tests of the Ready executor: the production state machine driven through a port that
keeps its log in a list and records every call, with explicit times; no Ray, no disk.

The claims, one test each: a Ready's effects go out in the contract's order with the leader's
fresh batches sent before its own write (one frame per push range, shared by its followers),
and not for a LogAppendTime topic; one fsync in flight, the appends made meanwhile sharing the
next one, and a produce answered only once its fsync completed; flush.messages above 1
answers on append and fsyncs every that many records, flush.ms also with no further append,
and going back to 1 fsyncs what was left; the throttle holds back fetch answers to a follower
outside the ISR only; long polls are woken once per move of the high watermark; and the
executor stops loudly when the log disagrees with the state machine (an offset the log
assigned otherwise, a push range with no batch at its start).
"""

from __future__ import annotations

from typing import Any

import pytest

from raylog.actors.replication.executor import FLUSH_INTERVAL_MS_NEVER, ReadyExecutor
from raylog.actors.replication.messages import (
    BecomeLeader,
    FetchRequest,
    ProduceRequest,
    RecordBatch,
    ReplicateRequest,
)
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.ready import (
    AppendBatch,
    DeleteRecordsResult,
    InvariantViolation,
    ProduceResult,
    ReplicaConfig,
    SendFetchData,
    SendPushData,
)

EPOCH = 1


class ListPort:
    """The executor's port over a list of batches; ``calls`` records what was done, in order."""

    def __init__(self, log_append_time: bool = False) -> None:
        self.log_append_time = log_append_time
        self.batches: list[RecordBatch] = []
        self.calls: list[tuple[str, Any]] = []
        self.flushes: list[tuple[int, int]] = []  # fsyncs started and not yet completed
        self.produced: dict[int, ProduceResult] = {}
        self.wakes = 0
        self.assign_offset: int | None = None  # the offset the "log" gives the next append

    @property
    def log_end_offset(self) -> int:
        return self.batches[-1].meta.next_offset if self.batches else 0

    def truncate_to(self, offset: int) -> None:
        self.batches = [b for b in self.batches if b.meta.base_offset < offset]
        self.calls.append(("truncate", offset))

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.batches = []
        self.calls.append(("truncate_fully", offset))

    def advance_log_start(self, offset: int, high_watermark: int) -> None:
        self.calls.append(("advance_log_start", offset))

    def append(self, op: AppendBatch) -> int:
        self.calls.append(("append", op.batch.base_offset))
        if self.assign_offset is not None:
            return self.assign_offset
        self.batches.append(RecordBatch(op.batch, op.data))  # type: ignore[arg-type]
        return op.batch.base_offset

    def stored_batch(self, op: AppendBatch) -> bytes:
        return b"stamped:" + op.data

    def read_batches(
        self, offset: int, max_bytes: int, upper_offset: int
    ) -> tuple[RecordBatch, ...]:
        self.calls.append(("read", offset))
        out: list[RecordBatch] = []
        for batch in self.batches:
            meta = batch.meta
            if meta.next_offset <= offset or meta.next_offset > upper_offset:
                continue
            if out and sum(b.meta.size_bytes for b in out) + meta.size_bytes > max_bytes:
                break
            out.append(batch)
        return tuple(out)

    def checkpoint_high_watermark(self, high_watermark: int) -> None:
        self.calls.append(("checkpoint", high_watermark))

    def start_flush(self, end_offset: int, generation: int) -> None:
        self.calls.append(("flush", end_offset))
        self.flushes.append((end_offset, generation))

    def shared_frame(self, message: Any) -> Any:
        self.calls.append(("frame", type(message).__name__))
        return ("frame", id(message))

    def send(self, to: int, message: Any, frame: Any = None) -> None:
        self.calls.append(("send", (to, type(message).__name__, frame is not None)))

    def send_later(self, delay_ms: int, to: int, message: Any) -> None:
        self.calls.append(("send_later", (to, delay_ms)))

    def propose(self, request: Any) -> None:
        self.calls.append(("propose", request.new_isr))

    def build_remote_state(self, offset: int) -> None:
        self.calls.append(("remote state", offset))

    def answer_consumer_fetch(self, out: SendFetchData) -> None:
        self.calls.append(("consumer", out.response.request_id))

    def complete_produce(self, result: ProduceResult) -> None:
        self.calls.append(("produced", result.request_id))
        self.produced[result.request_id] = result

    def complete_delete_records(self, result: DeleteRecordsResult) -> None:
        self.calls.append(("deleted", result.request_id))

    def wake_long_polls(self) -> None:
        self.wakes += 1

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def leader(
    port: ListPort,
    isr: tuple[int, ...] = (0,),
    replicas: tuple[int, ...] = (0,),
    flush_messages: int = 1,
    flush_interval_ms: int = FLUSH_INTERVAL_MS_NEVER,
    **config: Any,
) -> ReadyExecutor:
    replica = PartitionReplica(0, ReplicaConfig(**config))
    executor = ReadyExecutor(
        replica, port, flush_messages=flush_messages, flush_interval_ms=flush_interval_ms
    )
    executor.step(BecomeLeader(1, EPOCH, 0, isr, replicas), 0)
    port.calls.clear()
    return executor


def produce(executor: ReadyExecutor, request_id: int, acks: int = 1, now_ms: int = 0) -> None:
    data = b"batch%d" % request_id
    executor.step(ProduceRequest(request_id, acks, 30_000, 1, len(data), data), now_ms)


def complete_flushes(executor: ReadyExecutor, port: ListPort, now_ms: int = 0) -> None:
    while port.flushes:
        end, generation = port.flushes.pop(0)
        executor.flushed(end, generation, now_ms)


def fetch(follower: int, offset: int, request_id: int, max_wait_ms: int = 0) -> FetchRequest:
    return FetchRequest(follower, request_id, EPOCH, offset, -1, 1 << 20, max_wait_ms, 0)


def test_fresh_batches_go_to_followers_before_the_write_one_frame_per_range() -> None:
    port = ListPort()
    executor = leader(port, isr=(0, 1, 2), replicas=(0, 1, 2), replication_mode="push")
    for follower in (1, 2):  # caught up at the log end: pushes carry them from here
        executor.step(fetch(follower, 0, follower), 0)
    port.calls.clear()
    produce(executor, 7, acks=-1)
    # The push of [0, 1) is built once, from memory, sent to both followers, then written.
    assert port.calls[:5] == [
        ("frame", "ReplicateRequest"),
        ("send", (1, "ReplicateRequest", True)),
        ("send", (2, "ReplicateRequest", True)),
        ("append", 0),
        ("flush", 1),
    ]
    assert "read" not in port.names()  # nothing read back from the log
    assert executor.sent_before_write == 2


def test_a_log_append_time_topic_sends_after_the_write_read_from_the_log() -> None:
    port = ListPort(log_append_time=True)
    executor = leader(port, isr=(0, 1), replicas=(0, 1), replication_mode="push")
    executor.step(fetch(1, 0, 1), 0)
    port.calls.clear()
    produce(executor, 7, acks=-1)
    names = port.names()
    assert names.index("append") < names.index("read") < names.index("send")
    assert executor.sent_before_write == 0


def test_parked_fetch_of_an_in_sync_follower_is_answered_before_the_write() -> None:
    port = ListPort()
    executor = leader(port, isr=(0, 1), replicas=(0, 1))
    executor.step(fetch(1, 0, 1, max_wait_ms=500), 0)  # parked: nothing to read yet
    assert "send" not in port.names()
    produce(executor, 7, acks=-1)
    names = port.names()
    assert names.index("send") < names.index("append")
    assert executor.sent_before_write == 1


def test_one_fsync_in_flight_and_appends_meanwhile_share_the_next() -> None:
    port = ListPort()
    executor = leader(port)
    produce(executor, 1)
    produce(executor, 2)
    produce(executor, 3)
    assert port.flushes == [(1, 0)]  # one fsync, started by the first append
    assert port.produced == {}  # acks=1: answered once durable, not before
    executor.flushed(*port.flushes.pop(0), 0)
    assert list(port.produced) == [1]
    assert port.flushes == [(3, 0)]  # one more covers the two appends made meanwhile
    executor.flushed(*port.flushes.pop(0), 0)
    assert list(port.produced) == [1, 2, 3]
    assert port.flushes == []


def test_effects_of_one_ready_go_out_in_the_contracts_order() -> None:
    port = ListPort()
    executor = leader(port)
    produce(executor, 1)
    port.calls.clear()
    complete_flushes(executor, port)
    # The fsync's report advanced the HW: checkpoint, then the produce answer; long polls woken.
    assert port.names() == ["checkpoint", "produced"]
    assert port.wakes == 1


def test_relaxed_flush_answers_on_append_and_fsyncs_every_n_records() -> None:
    port = ListPort()
    executor = leader(port, flush_messages=3)
    produce(executor, 1)
    produce(executor, 2)
    assert list(port.produced) == [1, 2] and port.flushes == []  # acknowledged before fsync
    produce(executor, 3)
    assert port.flushes == [(3, 0)]  # the third record triggers the fsync
    complete_flushes(executor, port)
    assert executor.replica.durable_end_offset == 3


def test_flush_ms_fsyncs_without_a_further_append() -> None:
    port = ListPort()
    executor = leader(port, flush_messages=1_000, flush_interval_ms=300)
    produce(executor, 1, now_ms=1_000)
    executor.tick(1_299)
    assert port.flushes == []
    executor.tick(1_300)
    assert port.flushes == [(1, 0)]


def test_back_to_flush_messages_1_fsyncs_what_was_left() -> None:
    port = ListPort()
    executor = leader(port, flush_messages=1_000)
    produce(executor, 1)
    assert port.flushes == []
    executor.set_flush_policy(1, FLUSH_INTERVAL_MS_NEVER)
    assert port.flushes == [(1, 0)]


def test_the_throttle_holds_back_only_followers_outside_the_isr() -> None:
    port = ListPort()
    executor = leader(port, isr=(0, 1), replicas=(0, 1, 2))
    for request_id in range(1, 4):
        produce(executor, request_id)
        complete_flushes(executor, port)
    executor.set_throttle(1, 0)  # one byte a second: one batch overdraws it
    port.calls.clear()
    executor.step(fetch(2, 0, 1), 0)  # outside the ISR (catching up)
    held = [call for name, call in port.calls if name == "send_later"]
    assert len(held) == 1 and held[0][0] == 2 and held[0][1] > 0
    assert ("read", 0) in port.calls
    port.calls.clear()
    executor.step(fetch(1, 0, 2), 0)  # an ISR member is never held
    assert [name for name, _ in port.calls if name.startswith("send")] == ["send"]


def test_long_polls_are_woken_once_per_high_watermark_move() -> None:
    port = ListPort()
    executor = leader(port)
    produce(executor, 1)
    assert port.wakes == 0  # appended, not yet committed
    complete_flushes(executor, port)
    assert port.wakes == 1
    executor.tick(10)
    assert port.wakes == 1


def test_an_offset_the_log_assigned_otherwise_stops_the_executor() -> None:
    port = ListPort()
    executor = leader(port)
    port.assign_offset = 5
    with pytest.raises(InvariantViolation, match="log assigned 5, state machine 0"):
        produce(executor, 1)


def test_a_push_range_with_no_batch_at_its_start_stops_the_executor() -> None:
    port = ListPort(log_append_time=True)  # pushes are read from the log
    executor = leader(port, isr=(0, 1), replicas=(0, 1), replication_mode="push")
    executor.step(fetch(1, 0, 1), 0)
    replica = executor.replica
    produce(executor, 1, acks=-1)
    port.batches.clear()  # the log lost the batch the push starts at
    request = ReplicateRequest(0, EPOCH, 0, -1, ())
    replica._ready.messages.append(SendPushData(1, request, 0, 1))  # a broken state machine's
    with pytest.raises(InvariantViolation, match=r"push of \[0, 1\) to 1"):
        executor.drain(0)
