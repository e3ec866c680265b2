"""The Ready executor: pure, it carries out a replica state machine's Readys through an I/O port.

This module owns what every shell of a replica state machine
(:class:`~raylog.actors.replication.partition.PartitionReplica`) must do the same way, so that
the Ray actor (``raylog.actors.replica``) and the seeded simulator (tests/sim/node.py) run one
implementation of it:

- the order of a Ready's effects (the contract in ``raylog.actors.replication.ready``):
  0. the early send: a leader's fresh batches go to the followers waiting for them (pushes, and
     parked fetches of followers the throttle does not hold) before its own write, stamped as
     the log will store them, so replication overlaps the local write (klite's "replicate
     while the leader persists"). Safe because the high watermark still waits for the leader's
     own ``LocalAppendDurable``; a batch a follower holds and the leader then fails to write is
     an unacknowledged suffix, which the next leader keeps or truncates as Kafka does;
  1. log operations in order, then the start of an fsync (so that it runs while the rest of the
     Ready is sent);
  2. the high-watermark checkpoint;
  3. messages: replica messages as they are, fetch answers and pushes filled from the log (a
     push read once however many followers it goes to), consumer fetches handed to the shell;
  4. AlterPartition proposals;
  5. produce completions, then DeleteRecords completions;
  and, once no Ready is left, a wake-up of consumer long polls if the high watermark moved;
- durability: one group commit (at most one fsync in flight; the appends made while it runs
  share the next one) and the flush policy (``flush.messages`` 1: a write is acknowledged only
  once fsync'd; above 1: acknowledged on append and fsync'd every ``flush.messages`` records, or
  once the oldest unflushed append is ``flush.ms`` old, also when no further append comes);
- the throttle of reassignment traffic (``leader.replication.throttled.rate``): fetch answers
  to followers outside the ISR are cut to one second of bytes and held back by the delay the
  token bucket gives.

It imports no Ray, asyncio, sockets, threads or clock: time comes in as ``now_ms`` and every
effect goes out through a :class:`ReplicaPort`, which the shell implements with its log, its
network and its requests. An fsync the port starts is reported back with :meth:`flushed`.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from raylog.actors.control.reassignment import ByteRateThrottle
from raylog.actors.replication.messages import (
    CONSUMER_REPLICA_ID,
    AlterPartitionRequest,
    LocalAppendDurable,
    RecordBatch,
    ReplicateRequest,
)
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.ready import (
    AdvanceLogStart,
    AppendBatch,
    DeleteRecordsResult,
    InvariantViolation,
    ProduceResult,
    Ready,
    SendFetchData,
    SendPushData,
    SendToReplica,
    TruncateTo,
)

# flush.ms when the topic sets none: never by time (Kafka's default, Long.MAX_VALUE).
FLUSH_INTERVAL_MS_NEVER = (1 << 63) - 1
READY_ROUNDS_MAX = 1_000  # a Ready's effects may produce another Ready; bounded

# The pushes of one Ready, by range: the message and its shared frame (the port's, or None).
_Pushed = dict[tuple[int, int, int, ReplicateRequest], tuple[ReplicateRequest, Any]]
_NONE_SENT: frozenset[int] = frozenset()


class ReplicaPort(Protocol):
    """The I/O a shell gives the executor: its log, its network and its client requests.

    Calls may raise the shell's storage error (a full disk, a failed write): the executor lets
    it through, and the shell takes the replica offline.
    """

    @property
    def log_end_offset(self) -> int:
        """Where the log ends (what an fsync started now covers)."""
        ...

    @property
    def log_append_time(self) -> bool:
        """The topic stamps LogAppendTime: the log sets each batch's time as it writes it, so
        no batch can be sent as stored before the write (no early send)."""
        ...

    def truncate_to(self, offset: int) -> None: ...

    def truncate_fully_and_start_at(self, offset: int) -> None: ...

    def advance_log_start(self, offset: int, high_watermark: int) -> None: ...

    def append(self, op: AppendBatch) -> int:
        """Write ``op`` to the log; return the base offset the log gave the batch (for a
        replicated one, which carries its own offsets, ``op.batch.base_offset``)."""
        ...

    def stored_batch(self, op: AppendBatch) -> Any:
        """A leader append's bytes as the log will store them (base offset and leader epoch
        stamped), built in memory before the write: what the early send sends."""
        ...

    def read_batches(
        self, offset: int, max_bytes: int, upper_offset: int
    ) -> tuple[RecordBatch, ...]:
        """Whole batches from the one holding ``offset`` below ``upper_offset``, within
        ``max_bytes`` but at least one (Kafka's rule)."""
        ...

    def checkpoint_high_watermark(self, high_watermark: int) -> None:
        """Persist the high watermark, lazily if the shell likes: recovery clamps it."""
        ...

    def start_flush(self, end_offset: int, generation: int) -> None:
        """Start an fsync of everything appended so far; when it completes, the shell calls
        :meth:`ReadyExecutor.flushed` with these arguments (or takes the replica offline)."""
        ...

    def shared_frame(self, message: Any) -> Any:
        """``message`` encoded once for several sends (one push to several followers), or
        None when the shell encodes per send."""
        ...

    def send(self, to: int, message: Any, frame: Any = None) -> None:
        """One-way message to replica ``to`` (``frame``: from :meth:`shared_frame`)."""
        ...

    def send_later(self, delay_ms: int, to: int, message: Any) -> None:
        """:meth:`send` after ``delay_ms`` (the throttle's hold)."""
        ...

    def propose(self, request: AlterPartitionRequest) -> None:
        """Send an AlterPartition proposal to the controller (lost if it cannot: the state
        machine resends after its timeout)."""
        ...

    def build_remote_state(self, offset: int) -> None:
        """Tiered storage: read the producer state at ``offset`` from the remote tier, off
        the event loop, then step ``RemoteStateBuilt`` into the state machine."""
        ...

    def answer_consumer_fetch(self, out: SendFetchData) -> None:
        """Answer consumer fetch ``out.response.request_id`` from the log (its bytes, or where
        they lie): nothing when ``out`` carries an error or ``fetch_offset >= upper_offset``."""
        ...

    def complete_produce(self, result: ProduceResult) -> None: ...

    def complete_delete_records(self, result: DeleteRecordsResult) -> None: ...

    def wake_long_polls(self) -> None:
        """The high watermark moved: consumer fetches waiting for data look again."""
        ...


class ReadyExecutor:
    """Carries out the Readys of one replica state machine through ``port`` (see the module
    docstring for what it owns). The shell feeds it messages, ticks and fsync completions, with
    the current time, and never steps the state machine behind its back."""

    def __init__(
        self,
        replica: PartitionReplica,
        port: ReplicaPort,
        *,
        flush_messages: int = 1,
        flush_interval_ms: int = FLUSH_INTERVAL_MS_NEVER,
    ) -> None:
        self.replica = replica
        self.port = port
        self.flush_messages = flush_messages
        self.flush_interval_ms = flush_interval_ms
        self.throttle: ByteRateThrottle | None = None  # see set_throttle
        self.sent_before_write = 0  # pushes and fetch answers sent before the local write
        # Group commit: at most one fsync in flight; appends while it runs want the next one.
        self._flush_running = False
        self._flush_wanted = False
        # A relaxed flush policy (flush.messages > 1): records appended and not yet fsync'd.
        self._unflushed_records = 0
        self._unflushed_since_ms = 0  # when the oldest of them was appended
        self._hw_notified = replica.high_watermark  # the HW long polls last heard of

    # --- what the shell calls -----------------------------------------------------------------

    def step(self, message: Any, now_ms: int) -> None:
        """Feed the state machine one message and carry out what it decides."""
        self.replica.step(message, now_ms)
        self.drain(now_ms)

    def tick(self, now_ms: int) -> None:
        """Advance the state machine's timers and the flush policy's (flush.ms)."""
        self.replica.tick(now_ms)
        self.drain(now_ms)
        self._maybe_flush_by_time(now_ms)

    def flushed(self, end_offset: int, generation: int, now_ms: int) -> None:
        """The fsync started as ``port.start_flush(end_offset, generation)`` completed."""
        self._flush_running = False
        if self._flush_wanted:
            # Appends arrived during that fsync: one more covers all of them.
            self._flush_wanted = False
            self._request_flush()
        self.step(LocalAppendDurable(end_offset, generation), now_ms)

    def set_flush_policy(self, flush_messages: int, flush_interval_ms: int) -> None:
        """flush.messages and flush.ms changed (a topic reconfigured in place)."""
        self.flush_messages = flush_messages
        self.flush_interval_ms = flush_interval_ms
        if flush_messages <= 1 and self._unflushed_records:
            # Back to fsync before acknowledging: what the relaxed policy left unflushed goes now.
            self._unflushed_records = 0
            self._request_flush()

    def set_throttle(self, bytes_per_sec: int, now_ms: int) -> None:
        """``leader.replication.throttled.rate`` for followers outside the ISR; 0 lifts it."""
        if bytes_per_sec <= 0:
            self.throttle = None
        elif self.throttle is None or self.throttle.bytes_per_sec != bytes_per_sec:
            self.throttle = ByteRateThrottle(bytes_per_sec, now_ms)

    def drain(self, now_ms: int) -> None:
        """Carry out every pending Ready, then wake long polls if the high watermark moved
        (the move may have happened inside the step or tick that led here)."""
        replica = self.replica
        for _ in range(READY_ROUNDS_MAX):
            if not replica.has_ready():
                if replica.high_watermark != self._hw_notified:
                    self._hw_notified = replica.high_watermark
                    self.port.wake_long_polls()
                return
            self.run_ready(replica.ready(), now_ms)
        raise RuntimeError(f"state machine kept producing Ready: bound of {READY_ROUNDS_MAX}")

    # --- one Ready, in the contract's order ---------------------------------------------------

    def run_ready(self, ready: Ready, now_ms: int) -> None:
        port = self.port
        # 0. This Ready's new batches go to the followers waiting for them first.
        sent_early = self._send_fresh(ready)
        # 1. Log operations, in order; then the fsync starts.
        appended_records = self._apply_log_ops(ready.log_ops)
        if appended_records:
            self._after_append(appended_records, now_ms)
        # 2. The high-watermark checkpoint.
        if ready.checkpoint_high_watermark is not None:
            port.checkpoint_high_watermark(ready.checkpoint_high_watermark)
        # 3. Messages.
        pushed: _Pushed = {}
        for index, out in enumerate(ready.messages):
            if index in sent_early:
                continue
            if isinstance(out, SendToReplica):
                port.send(out.to, out.message)
            elif isinstance(out, SendPushData):
                self._send_push(out, pushed, None)
            else:
                self._send_fetch_data(out, now_ms)
        # 4. AlterPartition proposals.
        for request in ready.alter_partition:
            port.propose(request)
        # 5. Completions.
        for result in ready.produce_results:
            port.complete_produce(result)
        for deleted in ready.delete_records_results:
            port.complete_delete_records(deleted)
        # 6. A read from the remote tier.
        if ready.build_remote_state is not None:
            port.build_remote_state(ready.build_remote_state)

    def _apply_log_ops(self, log_ops: list[TruncateTo | AppendBatch | AdvanceLogStart]) -> int:
        """Carry out the log operations in order; returns the records appended."""
        port = self.port
        appended_records = 0
        for op in log_ops:
            if isinstance(op, AppendBatch):
                appended_records += op.batch.record_count
                assigned = port.append(op)
                if assigned != op.batch.base_offset:  # the log assigns the state machine's offsets
                    raise InvariantViolation(
                        f"log assigned {assigned}, state machine {op.batch.base_offset}"
                    )
            elif isinstance(op, TruncateTo):
                if op.full:
                    port.truncate_fully_and_start_at(op.offset)
                else:
                    port.truncate_to(op.offset)
            else:
                port.advance_log_start(op.offset, self.replica.high_watermark)
        return appended_records

    # --- durability: the flush policy and the group commit ------------------------------------

    def _after_append(self, records: int, now_ms: int) -> None:
        """Make appends durable: fsync now (group commit) or per a relaxed flush policy."""
        if self.flush_messages <= 1:
            self._request_flush()
            return
        # flush.messages > 1: the topic accepts acknowledging before fsync.
        if not self._unflushed_records:
            self._unflushed_since_ms = now_ms
        self._unflushed_records += records
        replica = self.replica
        replica.step(LocalAppendDurable(self.port.log_end_offset, replica.generation), now_ms)
        if self._unflushed_records >= self.flush_messages:
            self._unflushed_records = 0
            self._request_flush()
        else:
            self._maybe_flush_by_time(now_ms)

    def _maybe_flush_by_time(self, now_ms: int) -> None:
        """flush.ms: fsync what a relaxed policy left unflushed once the oldest of it is that
        old, also while no append comes (Kafka's log flusher)."""
        if self._unflushed_records and now_ms - self._unflushed_since_ms >= self.flush_interval_ms:
            self._unflushed_records = 0
            self._request_flush()

    def _request_flush(self) -> None:
        if self._flush_running:
            self._flush_wanted = True  # the next fsync starts when this one completes
            return
        self._flush_running = True
        self.port.start_flush(self.port.log_end_offset, self.replica.generation)

    # --- messages -----------------------------------------------------------------------------

    def _send_fresh(self, ready: Ready) -> frozenset[int] | set[int]:
        """Leader: send the batches this Ready appends to the followers waiting for them (push
        requests; fetch answers to followers the throttle does not hold) before writing them
        locally, built in memory as the log will store them. Returns the indexes in
        ``ready.messages`` it sent; the rest (older ranges, a LogAppendTime topic whose stamp
        the log sets) go after the write."""
        port = self.port
        if (
            not ready.log_ops
            or port.log_append_time
            or not any(isinstance(out, SendPushData | SendFetchData) for out in ready.messages)
        ):
            return _NONE_SENT  # nothing to send early: no batch is copied
        fresh: dict[int, RecordBatch] = {}
        for op in ready.log_ops:
            if isinstance(op, AdvanceLogStart):
                continue  # moves the log start, which the fresh batches are above
            if isinstance(op, TruncateTo) or op.replicated:
                return _NONE_SENT  # only a leader's plain appends
            fresh[op.batch.base_offset] = RecordBatch(op.batch, port.stored_batch(op))
        sent: set[int] = set()
        pushed: _Pushed = {}
        throttle, isr = self.throttle, self.replica.isr
        for index, out in enumerate(ready.messages):
            if isinstance(out, SendPushData):
                batches = self._fresh_range(fresh, out.base_offset, out.end_offset, out.max_bytes)
                if batches is None:
                    continue
                self._send_push(out, pushed, batches)
            elif (
                isinstance(out, SendFetchData)
                and out.to != CONSUMER_REPLICA_ID
                and out.response.error_code == 0
                and (throttle is None or out.to in isr)
            ):
                batches = self._fresh_range(
                    fresh, out.fetch_offset, out.upper_offset, out.max_bytes
                )
                if batches is None:
                    continue
                port.send(out.to, msgspec.structs.replace(out.response, batches=batches))
            else:
                continue
            sent.add(index)
            self.sent_before_write += 1
        return sent

    def _fresh_range(
        self, fresh: dict[int, RecordBatch], start: int, end: int, max_bytes: int
    ) -> tuple[RecordBatch, ...] | None:
        """The batches of ``fresh`` (by base offset) from ``start`` up to ``end`` as a log read
        with ``max_bytes`` would return them (the first whole, then while the total fits), or
        None when ``fresh`` does not hold that range."""
        batches: list[RecordBatch] = []
        total = 0
        offset = start
        while offset < end:
            batch = fresh.get(offset)
            if batch is None or batch.meta.next_offset > end:
                return None
            if batches and total + batch.meta.size_bytes > max_bytes:
                break
            batches.append(batch)
            total += batch.meta.size_bytes
            offset = batch.meta.next_offset
        return tuple(batches) if batches else None

    def _send_push(
        self, out: SendPushData, pushed: _Pushed, batches: tuple[RecordBatch, ...] | None
    ) -> None:
        """Send one push; its batches (read from the log when None) are read and encoded once
        per range, however many followers it goes to (the request is the same for each)."""
        key = (out.base_offset, out.end_offset, out.max_bytes, out.request)
        push = pushed.get(key)
        if push is None:
            if batches is None:
                batches = self.port.read_batches(out.base_offset, out.max_bytes, out.end_offset)
                if not batches or batches[0].meta.base_offset != out.base_offset:
                    # The contract: a push range starts at a batch of this replica's log.
                    raise InvariantViolation(
                        f"push of [{out.base_offset}, {out.end_offset}) to {out.to}: the log "
                        f"has no batch there (read {[b.meta for b in batches[:2]]})"
                    )
            message = msgspec.structs.replace(out.request, batches=batches)
            push = pushed[key] = (message, self.port.shared_frame(message))
        self.port.send(out.to, push[0], push[1])

    def _send_fetch_data(self, out: SendFetchData, now_ms: int) -> None:
        """Answer a fetch: a consumer's through the shell, a replica's filled from the log
        (held back by the throttle for a follower outside the ISR)."""
        if out.to == CONSUMER_REPLICA_ID:
            self.port.answer_consumer_fetch(out)
            return
        response = out.response
        throttle = self.throttle
        if throttle is not None and out.to in self.replica.isr:
            throttle = None  # ISR members are never held
        if response.error_code == 0 and out.fetch_offset < out.upper_offset:
            max_bytes = out.max_bytes
            if throttle is not None:
                max_bytes = min(max_bytes, throttle.read_limit())
            batches = self.port.read_batches(out.fetch_offset, max_bytes, out.upper_offset)
            response = msgspec.structs.replace(response, batches=batches)
            if throttle is not None:
                delay_ms = throttle.delay_ms(sum(len(b.data) for b in batches), now_ms)
                if delay_ms > 0:
                    self.port.send_later(delay_ms, out.to, response)
                    return
        self.port.send(out.to, response)


__all__ = ["FLUSH_INTERVAL_MS_NEVER", "ReadyExecutor", "ReplicaPort"]
