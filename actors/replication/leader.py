"""The leader's side of one replica's state machine, pure: produce, acks, serving fetches,
pushes, the ISR and the high watermark as the leader moves them, and DeleteRecords.

``LeaderSide`` holds the handlers a leader runs over the shared ``ReplicaState``: it assigns
offsets, answers produce requests once their acks hold, serves followers' and consumers'
fetches (consumers on followers too, KIP-392), pushes to followers in push mode, records each
follower's progress, proposes ISR changes to the controller, advances the high watermark, and
moves the log start for DeleteRecords. The rules it decides by are in ``isr`` (the ISR, the
high and low watermarks) and ``delete_records``.

Decisions:
- Offsets: a client batch goes at the leader's log end, in its epoch.
- Acks: a result is only ever produced after the data it acknowledges is durable (acks 0/1:
  locally; acks=all: on every member of the ISR, i.e. the HW covers it, and on the destination
  of every in-sync synchronous cluster link: ``sync_links``). A committed shrink
  below min.insync.replicas fails every pending acks=all request at once with
  NOT_ENOUGH_REPLICAS_AFTER_APPEND (Kafka gives that code at completion time; with a frozen HW
  those requests could otherwise only time out).
- Idempotent producers (``producer_state``, Kafka's rules): the leader checks a client batch's
  producer id, epoch and sequence before appending it; a retry of one of the producer's last
  five batches is answered with the ORIGINAL offsets once this request's acks hold for the
  original batch (acks=all: the HW covers it), and nothing is appended. A batch of a producer
  behind one the leader refused with a retriable error (nothing appended) gets that error
  too, not OUT_OF_ORDER_SEQUENCE_NUMBER (``refused_batches``: librdkafka answers that 45 with
  an epoch bump that duplicates records whose answers were lost).
- Transactions (``txn_state``, Kafka's rules): after the idempotent checks (a retried batch is
  a duplicate first, as in Kafka), the leader refuses a non-transactional batch of a producer
  with an open transaction (INVALID_TXN_STATE), a zombie's epoch (INVALID_PRODUCER_EPOCH),
  and a marker of an older epoch (47) or an older coordinator epoch
  (TRANSACTION_COORDINATOR_FENCED). A marker has no sequence; neither has a transactional
  batch that a coordinator writes to an internal topic (the shell lets only those through).
- Fetches are checked against the leader's log first (KIP-320): a fetcher whose last fetched
  epoch ends below its fetch offset here, or is unknown here, gets the diverging epoch and no
  data; then a fetch offset outside [log start, log end] is OFFSET_OUT_OF_RANGE.
- Long poll lives here: a replica's fetch that finds no data (pull mode; observers in push
  mode too) is parked, at most one per replica, and answered when data or a new HW arrives,
  or at ``max_wait_ms`` (on tick). Consumers' fetches are answered at once (the shell
  long-polls them). In push mode followers' fetches are answered at once: a caught-up
  follower then waits for pushes and fetches again only after ``push_idle_fetch_ms`` without
  one (which is also how it learns a new HW when no writes arrive).
- Push and pull share one code path on the leader: a push ack and a fetch both go through
  ``_record_follower_progress``. The leader pushes a new batch to a follower only when that
  follower is known to end exactly at the batch's base offset (``pushed_end_offset``) and no
  push to it is in flight (``push_in_flight_from``); the batches appended while one is in
  flight go together in the next push (up to replica.fetch.max.bytes), sent when the follower
  acknowledges the last one, from where its ack says its log ends: one push and one fsync per
  round trip, not per batch, as a fetch takes what accumulated. Any fetch below the leader's
  end, or a refusing ack, stops pushes to it until it fetches at the leader's end again; a
  fetch also clears a push in flight (a lost push or ack costs one idle fetch). An ack whose
  log end lies below the leader's log start (DeleteRecords or retention moved it while the
  follower was outside the ISR) stops pushes too: nothing is left to push from there, and
  the follower's next fetch is OFFSET_OUT_OF_RANGE (Kafka's rule), on which it starts over at
  the leader's log start.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from raylog.actors.replication import delete_records
from raylog.actors.replication import isr as isr_rules
from raylog.actors.replication import sync_links as sync_link_rules
from raylog.actors.replication.isr import FollowerState
from raylog.actors.replication.messages import (
    CONSUMER_REPLICA_ID,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    AlterPartitionRequest,
    BatchMeta,
    DeleteRecordsRequest,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    ReplicateAck,
    ReplicateRequest,
)
from raylog.actors.replication.producer_state import APPEND, DUPLICATE, ERROR, Verdict
from raylog.actors.replication.ready import (
    DeleteRecordsResult,
    ProduceResult,
    Role,
    SendFetchData,
    SendPushData,
    check_invariant,
)
from raylog.actors.replication.replica_state import NONE, ReplicaState
from raylog.actors.replication.txn_state import NOT_CONTROL, is_coordinator_write
from raylog.storage.errors import (
    FencedLeaderEpochError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidRequestError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    UnknownLeaderEpochError,
)

READ_COMMITTED = 1  # Kafka's IsolationLevel.READ_COMMITTED


def read_only_message(topic: str, link: str) -> str:
    """Why a mirror refuses a client's write (KIP-986): ``topic`` names it for the reader."""
    return f"{topic} is a mirror of link {link}: it is read-only while the link is active"


@dataclass
class PendingProduce:
    request_id: int
    acks: int
    base_offset: int
    end_offset: int  # the batch's last offset + 1
    deadline_ms: int
    appended: int = 0  # a mirror append's batches (MirrorAppendRequest)


@dataclass
class ParkedFetch:
    request: FetchRequest
    deadline_ms: int


class LeaderSide(ReplicaState):
    """The leader's handlers. See the module docstring for the decisions."""

    # --- produce --------------------------------------------------------------------------------

    def _on_produce(self, msg: ProduceRequest, now_ms: int) -> None:
        if msg.request_id in self.pending:
            return  # a duplicate delivery of a request still in progress: answered once
        if self.role is not Role.LEADER:
            self._refuse(msg, NotLeaderOrFollowerError.error_code, "not the leader", now_ms)
            return
        if self.mirror_link:
            # Clients' batches and our coordinator's transaction markers alike: the source's
            # log is the only writer of a mirror (KIP-986).
            self._result(msg.request_id, InvalidRequestError.error_code, self._read_only())
            return
        if msg.record_count < 1 or msg.size_bytes < 0:
            self._result(msg.request_id, InvalidRecordError.error_code, "empty batch")
            return
        refused = self._admission_error(msg.acks)
        if refused is not None:
            self._refuse(msg, *refused, now_ms)
            return
        # 1. Idempotent producers: a batch behind one refused here waits with it
        # (``refused_batches``).
        held = self._held_back(msg, now_ms)
        if held is not None:
            self._result(msg.request_id, *held)
            return
        # A duplicate of a recent batch a duplicate of a recent batch completes with that batch's
        # completes with that batch's offsets under this request's acks; a sequence or epoch
        # error refuses the batch.
        # Then the transaction checks.
        verdict = self._producer_verdict(msg)
        if verdict.kind == ERROR:
            self._result(msg.request_id, verdict.error_code, verdict.message)
            return
        if verdict.kind == DUPLICATE:
            self._complete_duplicate(msg, verdict.base_offset, verdict.next_offset, now_ms)
            return
        # 2. Assign offsets: the batch goes at our log end in our epoch.
        batch = BatchMeta(
            self.log.log_end_offset,
            msg.record_count,
            msg.size_bytes,
            self.leader_epoch,
            msg.producer_id,
            msg.producer_epoch,
            msg.base_sequence,
            msg.is_transactional,
            msg.control_type,
            msg.coordinator_epoch,
        )
        self._append(batch, msg.data, replicated=False)
        self._wait_for_acks(
            PendingProduce(
                msg.request_id,
                msg.acks,
                batch.base_offset,
                batch.next_offset,
                now_ms + msg.timeout_ms,
            )
        )
        # 3. Push mode: send it to every caught-up follower in parallel with our own fsync.
        self._push_appended(batch.base_offset)
        # 4. Parked fetches (pull mode, and observers in push mode) now have data.
        self._answer_parked(now_ms, only_expired=False)

    def _refuse(self, msg: ProduceRequest, error_code: int, message: str, now_ms: int) -> None:
        """Answer ``msg`` with an error, nothing appended; a retriable one is remembered for the
        producer's batches behind it (``refused_batches``)."""
        if msg.producer_id >= 0 and msg.control_type == NOT_CONTROL:
            self.refused_batches.record(
                msg.producer_id, msg.producer_epoch, msg.base_sequence, error_code, now_ms
            )
        self._result(msg.request_id, error_code, message)

    def _held_back(self, msg: ProduceRequest, now_ms: int) -> tuple[int, str] | None:
        """The error a batch behind one of its producer's refused batches shares, as (error
        code, message); None: go on (``refused_batches``)."""
        if msg.producer_id < 0 or msg.control_type != NOT_CONTROL:
            return None
        entry = self.log.producers.entry(msg.producer_id)
        last = (
            entry.last_sequence
            if entry is not None and entry.producer_epoch == msg.producer_epoch
            else None
        )
        refusal = self.refused_batches.held_back(
            msg.producer_id, msg.producer_epoch, msg.base_sequence, last, now_ms
        )
        if refusal is None:
            return None
        return (
            refusal.error_code,
            f"producer {msg.producer_id}: sequence {msg.base_sequence} follows "
            f"{refusal.base_sequence}, refused here with error {refusal.error_code}: retry "
            "after it",
        )

    def _read_only(self) -> str:
        return read_only_message("this topic", self.mirror_link)

    def _admission_error(self, acks: int) -> tuple[int, str] | None:
        """Why a write with ``acks`` may not be appended now (min.insync.replicas for acks=all,
        then the bounds on waiting requests), as (error code, message); None: go ahead."""
        if acks == -1:
            if len(self.isr) < self.config.min_insync_replicas:
                return (
                    NotEnoughReplicasError.error_code,
                    f"ISR {list(self.isr)} is below min.insync.replicas="
                    f"{self.config.min_insync_replicas}",
                )
            if self.pending_acks_all >= self.config.max_pending_acks_all:
                return (
                    RequestTimedOutError.error_code,
                    f"refused: {self.pending_acks_all} acks=all requests already pending "
                    f"(max_pending_acks_all={self.config.max_pending_acks_all})",
                )
        elif len(self.pending) - self.pending_acks_all >= self.config.max_pending_acks_local:
            return (
                RequestTimedOutError.error_code,
                f"refused: max_pending_acks_local={self.config.max_pending_acks_local} reached",
            )
        return None

    def _wait_for_acks(self, pending: PendingProduce) -> None:
        """Answer ``pending`` once its acks hold for [its base offset, its end offset)."""
        self.pending[pending.request_id] = pending
        if pending.acks == -1:
            self.pending_acks_all += 1

    def _acks_hold(self, acks: int, end_offset: int) -> bool:
        """Whether what lies below ``end_offset`` is already acknowledged under ``acks``
        (acks=all: the HW covers it, and every in-sync sync link's destination holds it:
        ``sync_links``; acks 0/1: it is durable here)."""
        if acks == -1:
            return end_offset <= self.log.high_watermark and self._sync_links_hold(end_offset)
        return acks == 0 or end_offset <= self.log.durable_end_offset

    def _sync_links_hold(self, end_offset: int) -> bool:
        """Whether every in-sync sync link's destination durably holds what lies below
        ``end_offset`` (KIP-986 sync mode)."""
        return not sync_link_rules.holding(self.sync_links, end_offset)

    def _complete_acks_all(self) -> None:
        """Answer the acks=all requests whose acks now hold (the HW moved, a sync link
        reported progress or stopped holding)."""
        done = [
            p for p in self.pending.values() if p.acks == -1 and self._acks_hold(-1, p.end_offset)
        ]
        for p in done:
            self._complete(p, NONE, "")

    def _push_appended(self, base_offset: int) -> None:
        """Push mode: send the batches appended from ``base_offset`` to every follower that
        ends there, in parallel with our own fsync."""
        if self.config.replication_mode != "push":
            return
        for rid, state in self.followers.items():
            if (
                rid not in self.observers
                and state.pushed_end_offset == base_offset
                and state.push_in_flight_from is None  # else it rides the next push
            ):
                self._push(rid, state, base_offset, 1 << 30)

    def _producer_verdict(self, msg: ProduceRequest) -> Verdict:
        """The idempotent and transaction checks of a batch (see the module docstring)."""
        producers = self.log.producers
        entry = producers.entry(msg.producer_id)
        sequenced = msg.control_type == NOT_CONTROL and not is_coordinator_write(
            msg.producer_id, msg.base_sequence, msg.is_transactional
        )
        if sequenced:
            verdict = producers.check(
                msg.producer_id, msg.producer_epoch, msg.base_sequence, msg.record_count
            )
            if verdict.kind != APPEND:
                return verdict
        elif entry is not None and msg.producer_epoch < entry.producer_epoch:
            return Verdict(
                ERROR,
                InvalidProducerEpochError.error_code,
                message=f"producer {msg.producer_id}: epoch {msg.producer_epoch} is older "
                f"than {entry.producer_epoch}",
            )
        error_code, message = self.log.txns.check(
            msg.producer_id,
            msg.producer_epoch,
            msg.is_transactional,
            msg.control_type,
            msg.coordinator_epoch,
            entry.producer_epoch if entry is not None else -1,
        )
        if error_code != NONE:
            return Verdict(ERROR, error_code, message=message)
        return Verdict(APPEND)

    def _complete_duplicate(
        self, msg: ProduceRequest, base_offset: int, next_offset: int, now_ms: int
    ) -> None:
        """Answer a retried batch with its original offsets once this request's acks hold for
        the original (acks=all: the HW covers it; acks=1: it is durable here)."""
        if self._acks_hold(msg.acks, next_offset):
            self._result(msg.request_id, NONE, "duplicate of an appended batch", base_offset)
            return
        self._wait_for_acks(
            PendingProduce(
                msg.request_id, msg.acks, base_offset, next_offset, now_ms + msg.timeout_ms
            )
        )

    def _complete_durable(self) -> None:
        """acks 0/1 requests whose batches our own fsync now covers."""
        durable = self.log.durable_end_offset
        for p in [p for p in self.pending.values() if p.acks != -1 and p.end_offset <= durable]:
            self._complete(p, NONE, "")

    def _result(
        self, request_id: int, error_code: int, message: str, base: int = -1, appended: int = 0
    ) -> None:
        self._ready.produce_results.append(
            ProduceResult(request_id, error_code, base, message, appended)
        )

    def _complete(self, pending: PendingProduce, error_code: int, message: str) -> None:
        del self.pending[pending.request_id]
        if pending.acks == -1:
            self.pending_acks_all -= 1
        self._result(pending.request_id, error_code, message, pending.base_offset, pending.appended)

    def _fail_all_pending(self, error_code: int, message: str) -> None:
        for p in list(self.pending.values()):
            self._complete(p, error_code, message)
        self._ready.delete_records_results += self.deletes.fail(error_code, message)

    def _fail_pending_acks_all(self, error_code: int, message: str) -> None:
        for p in [p for p in self.pending.values() if p.acks == -1]:
            self._complete(p, error_code, message)

    # --- DeleteRecords --------------------------------------------------------------------------

    def _on_delete_records(self, msg: DeleteRecordsRequest, now_ms: int) -> None:
        if msg.request_id in self.deletes:
            return  # a duplicate delivery of a request still waiting: answered once
        if self.role is not Role.LEADER:
            self._delete_refused(msg, NotLeaderOrFollowerError.error_code, "not leader")
            return
        if self.mirror_link:
            # A mirror's log start follows the source's (the batches it appends), as Kafka's
            # mirror topics refuse DeleteRecords.
            self._delete_refused(msg, InvalidRequestError.error_code, self._read_only())
            return
        hw = self.log.high_watermark
        offset = delete_records.requested_log_start(msg.offset, hw)
        if offset is None:
            message = f"offset {msg.offset} is not in [0, high watermark {hw}]"
            self._delete_refused(msg, OffsetOutOfRangeError.error_code, message)
            return
        if self.deletes.is_full():
            message = "too many DeleteRecords waiting"
            self._delete_refused(msg, RequestTimedOutError.error_code, message)
            return
        if offset > self.log.log_start_offset:
            self._advance_log_start(offset)
            self.isr_join_log_start = max(self.isr_join_log_start, offset)
            # Followers learn the new start from the answers to their parked fetches now.
            self._answer_parked(now_ms, only_expired=False)
        self.deletes.add(msg.request_id, offset, now_ms + max(0, msg.timeout_ms))
        self._maybe_complete_deletes()

    def _delete_refused(self, msg: DeleteRecordsRequest, error_code: int, message: str) -> None:
        self._ready.delete_records_results.append(
            DeleteRecordsResult(msg.request_id, error_code, -1, message)
        )

    def _maybe_complete_deletes(self) -> None:
        if not self.deletes or self.role is not Role.LEADER:
            return
        self._ready.delete_records_results += self.deletes.complete(self.low_watermark)

    # --- fetches --------------------------------------------------------------------------------

    def _epoch_error(self, current_leader_epoch: int) -> int:
        """Fencing of a request that names a leader epoch (-1 from a consumer: not checked)."""
        if current_leader_epoch == UNDEFINED_EPOCH:
            return NONE
        if current_leader_epoch < self.leader_epoch:
            return FencedLeaderEpochError.error_code
        if current_leader_epoch > self.leader_epoch:
            return UnknownLeaderEpochError.error_code
        return NONE

    def _fetch_header(self, request: FetchRequest, error_code: int, **kw: Any) -> FetchResponse:
        return FetchResponse(
            leader_id=self.leader_id,
            request_id=request.request_id,
            leader_epoch=self.leader_epoch,
            error_code=error_code,
            high_watermark=self.log.high_watermark,
            log_start_offset=self.log.log_start_offset,
            log_end_offset=self.log.log_end_offset,
            last_stable_offset=self.log.last_stable_offset,
            **kw,
        )

    def _reply_fetch(self, request: FetchRequest, error_code: int = NONE, **kw: Any) -> None:
        """Answer with no data (an error, a divergence, or nothing to read)."""
        header = self._fetch_header(request, error_code, **kw)
        self._ready.messages.append(
            SendFetchData(request.replica_id, header, request.fetch_offset, 0, request.fetch_offset)
        )

    def _reply_fetch_data(self, request: FetchRequest) -> None:
        is_consumer = request.replica_id == CONSUMER_REPLICA_ID
        upper = self.log.high_watermark if is_consumer else self.log.log_end_offset
        if is_consumer and request.isolation_level == READ_COMMITTED:
            upper = self.log.last_stable_offset  # Kafka's lastStableOffset: whole batches below
        cap = self.config.consumer_fetch_max_bytes if is_consumer else self.config.fetch_max_bytes
        max_bytes = min(request.max_bytes, cap)
        self._ready.messages.append(
            SendFetchData(
                request.replica_id,
                self._fetch_header(request, NONE),
                request.fetch_offset,
                max_bytes,
                upper,
            )
        )

    def _on_fetch(self, msg: FetchRequest, now_ms: int) -> None:
        is_consumer = msg.replica_id == CONSUMER_REPLICA_ID
        if self.role is Role.LEADER:
            pass
        elif is_consumer and self.role in (Role.FOLLOWER, Role.OBSERVER):
            # KIP-392: any replica serves consumers up to its own high watermark.
            error = self._epoch_error(msg.current_leader_epoch)
            if error == NONE and not (
                self.log.log_start_offset <= msg.fetch_offset <= self.log.log_end_offset
            ):
                error = OffsetOutOfRangeError.error_code
            if error != NONE:
                self._reply_fetch(msg, error)
            else:
                self._reply_fetch_data(msg)
            return
        else:
            self._reply_fetch(msg, NotLeaderOrFollowerError.error_code)
            return
        if not is_consumer and msg.replica_id not in self.followers:
            self._reply_fetch(msg, NotLeaderOrFollowerError.error_code)  # not a replica of ours
            return
        error = self._epoch_error(msg.current_leader_epoch)
        if error != NONE:
            self._reply_fetch(msg, error)
            return
        # KIP-320: check the fetcher's log against ours before anything else.
        if msg.last_fetched_epoch != UNDEFINED_EPOCH:
            epoch_end = self.log.end_offset_for_epoch(msg.last_fetched_epoch)
            if epoch_end.leader_epoch == UNDEFINED_EPOCH:
                self._reply_fetch(msg)  # it knows an epoch we do not: nothing to say, no data
                return
            if (
                epoch_end.leader_epoch < msg.last_fetched_epoch
                or epoch_end.end_offset < msg.fetch_offset
            ):
                self._reply_fetch(msg, diverging_epoch=epoch_end)
                return
        if not self.log.log_start_offset <= msg.fetch_offset <= self.log.log_end_offset:
            self._reply_fetch(msg, OffsetOutOfRangeError.error_code)
            return
        if is_consumer:
            self._reply_fetch_data(msg)
            return
        state = self.followers[msg.replica_id]
        state.log_start_offset = max(state.log_start_offset, msg.log_start_offset)
        self._record_follower_progress(msg.replica_id, state, msg.fetch_offset, now_ms)
        if self.config.replication_mode == "push" and msg.replica_id not in self.observers:
            # Caught up: pushes carry it from here. Behind: it pulls, and we stop pushing.
            caught_up = msg.fetch_offset == self.log.log_end_offset
            state.pushed_end_offset = self.log.log_end_offset if caught_up else None
            state.push_in_flight_from = None  # what it fetched from says where it is
            self._reply_fetch_data(msg)
            return
        if msg.fetch_offset < self.log.log_end_offset or msg.max_wait_ms <= 0:
            self.parked.pop(msg.replica_id, None)
            self._reply_fetch_data(msg)
        else:
            # Long poll: answer when data or a new HW arrives, or at the deadline. A newer fetch
            # from the same follower replaces an older parked one (it gave up on that one).
            self.parked[msg.replica_id] = ParkedFetch(msg, now_ms + msg.max_wait_ms)

    def _answer_parked(self, now_ms: int, *, only_expired: bool) -> None:
        if not self.parked:
            return
        for rid in list(self.parked):
            parked = self.parked[rid]
            if only_expired and parked.deadline_ms > now_ms:
                continue
            del self.parked[rid]
            self._reply_fetch_data(parked.request)

    def _answer_parked_with_error(self, error_code: int) -> None:
        for parked in self.parked.values():
            self._reply_fetch(parked.request, error_code)
        self.parked.clear()

    # --- pushes ---------------------------------------------------------------------------------

    def _on_replicate_ack(self, msg: ReplicateAck, now_ms: int) -> None:
        if self.role is not Role.LEADER or msg.leader_epoch != self.leader_epoch:
            return
        state = self.followers.get(msg.replica_id)
        if state is None or msg.error_code != NONE:
            return
        if msg.durable_end_offset > self.log.log_end_offset:
            return  # cannot be from this epoch's log: ignore rather than trust it
        state.log_start_offset = max(state.log_start_offset, msg.log_start_offset)
        if not msg.in_push:
            state.pushed_end_offset = None
            state.push_in_flight_from = None
        elif (
            state.push_in_flight_from is not None
            and state.pushed_end_offset is not None
            and msg.durable_end_offset > state.push_in_flight_from
        ):
            # The push in flight landed (some of it durable): the next one takes everything
            # appended since, from where the follower's log ends.
            state.push_in_flight_from = None
            if msg.log_end_offset != UNDEFINED_OFFSET:
                state.pushed_end_offset = min(msg.log_end_offset, self.log.log_end_offset)
            self._push_next(msg.replica_id, state)
        if msg.durable_end_offset < state.log_end_offset:
            return  # a late ack overtaken by a newer one: a follower's durable end only grows
        self._record_follower_progress(msg.replica_id, state, msg.durable_end_offset, now_ms)

    def _push_next(self, replica_id: int, state: FollowerState) -> None:
        """Push mode: send ``replica_id`` what was appended since its last push, up to
        replica.fetch.max.bytes (the shell cuts at whole batches; the ack says where the
        follower's log then ends)."""
        start = state.pushed_end_offset
        if start is None or start >= self.log.log_end_offset or replica_id in self.observers:
            return
        if start < self.log.log_start_offset:
            # Its log ends below our log start (DeleteRecords or retention moved it while the
            # push was in flight, the follower being outside the ISR): what it lacks is gone
            # here, and no batch starts where it ends. Kafka's rule for a fetch from there is
            # OFFSET_OUT_OF_RANGE, on which the follower starts over at our log start: stop
            # pushing, so that its next fetch gets that answer.
            state.pushed_end_offset = None
            return
        self._push(replica_id, state, start, self.config.fetch_max_bytes)

    def _push(self, replica_id: int, state: FollowerState, start: int, max_bytes: int) -> None:
        """Push [``start``, our log end) to ``replica_id``, within ``max_bytes``. The shell
        fills the batches from its log: the bytes as stored, with the base offset and leader
        epoch (and LogAppendTime) that the log stamped in them."""
        request = ReplicateRequest(
            self.replica_id,
            self.leader_epoch,
            self.log.high_watermark,
            self.log.epoch_at(start - 1),
            (),
            log_start_offset=self.log.log_start_offset,
        )
        state.push_in_flight_from = start
        state.pushed_end_offset = self.log.log_end_offset
        self._ready.messages.append(
            SendPushData(replica_id, request, start, self.log.log_end_offset, max_bytes)
        )

    # --- followers' progress, the ISR and the high watermark -------------------------------------

    def _record_follower_progress(
        self, replica_id: int, state: FollowerState, end_offset: int, now_ms: int
    ) -> None:
        """Kafka's updateFetchStateOrThrow, then ISR expansion and HW advance."""
        isr_rules.record_fetch(state, end_offset, self.log.log_end_offset, now_ms)
        self._maybe_expand_isr(replica_id, state, now_ms)
        self._maybe_advance_high_watermark(now_ms)
        self._maybe_complete_deletes()

    def _maybe_expand_isr(self, replica_id: int, state: FollowerState, now_ms: int) -> None:
        if (
            self.alter_in_flight is not None
            or self.isr_unconfirmed
            or now_ms < self.alter_not_before_ms
            or replica_id in self.isr
            or replica_id in self.observers
            or replica_id not in self.replicas
        ):
            return
        if isr_rules.may_join_isr(
            state,
            self.log.high_watermark,
            self.leader_epoch_start_offset,
            self.isr_join_log_start,
        ):
            self._propose_isr((*self.isr, replica_id), now_ms)

    def _propose_isr(self, new_isr: Iterable[int], now_ms: int, fence: bool = False) -> None:
        request = AlterPartitionRequest(
            self.next_request_id,
            self.replica_id,
            self.leader_epoch,
            self.partition_epoch,
            tuple(sorted(new_isr)),
            fence,
        )
        self.next_request_id += 1
        check_invariant(
            self.replica_id in request.new_isr, "a leader never removes itself from the ISR"
        )
        self.alter_in_flight = request
        self.alter_sent_ms = now_ms
        self._ready.alter_partition.append(request)

    def _maybe_advance_high_watermark(self, now_ms: int) -> None:
        if self.role is not Role.LEADER:
            return
        if len(self.isr) < self.config.min_insync_replicas:
            return  # KIP-966: frozen while the committed ISR is below min.insync.replicas
        holders = isr_rules.high_watermark_holders(
            self.maximal_isr(),
            self.replicas,
            self.followers,
            self.log.log_end_offset,
            now_ms,
            self.config.replica_lag_time_max_ms,
            self.refused_until_ms,
        )
        new_hw = isr_rules.high_watermark_candidate(
            self.replica_id, holders, self.followers, self.log.durable_end_offset
        )
        if new_hw <= self.log.high_watermark:
            return
        self._set_high_watermark(new_hw)
        self._complete_acks_all()
        self._answer_parked(0, only_expired=False)  # parked fetchers learn the new HW at once

    def _tick_leader(self, now_ms: int) -> None:
        # A follower outside the ISR that held the HW and stopped fetching stops holding it.
        self._maybe_advance_high_watermark(now_ms)
        expired = [p for p in self.pending.values() if p.deadline_ms <= now_ms]
        for p in expired:
            self._complete(p, RequestTimedOutError.error_code, "not replicated within timeout")
        self._ready.delete_records_results += self.deletes.fail(
            RequestTimedOutError.error_code, "low watermark not reached within timeout", now_ms
        )
        self._answer_parked(now_ms, only_expired=True)
        if (
            self.alter_in_flight is not None
            and now_ms - self.alter_sent_ms >= self.config.alter_partition_timeout_ms
        ):
            # Resend: the controller answers a duplicate with its current state.
            self.alter_sent_ms = now_ms
            self._ready.alter_partition.append(self.alter_in_flight)
        if self.alter_in_flight is not None or now_ms < self.alter_not_before_ms:
            return
        if self.isr_unconfirmed:
            self._propose_isr(self.isr, now_ms, fence=True)
            return
        out_of_sync = isr_rules.out_of_sync(
            self.replica_id,
            self.isr,
            self.followers,
            self.log.log_end_offset,
            now_ms,
            self.config.replica_lag_time_max_ms,
            self.log.high_watermark,
        )
        if out_of_sync:
            self._propose_isr((r for r in self.isr if r not in out_of_sync), now_ms)
            return
        for rid, state in self.followers.items():
            self._maybe_expand_isr(rid, state, now_ms)
            if self.alter_in_flight is not None:
                break
