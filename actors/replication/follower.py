"""The follower's side of one replica's state machine, pure: fetching from the leader, taking
its answers (data, divergence, out of range) and its pushes, truncating where the logs differ.

``FollowerSide`` holds the handlers a follower (or observer) runs over the shared
``ReplicaState``.

Decisions:
- A follower fetches only from a durable log end: the fetch offset tells the leader what it
  holds durably, and the leader counts it towards the HW. One fetch is in flight at a time; an
  unanswered one is sent again after ``fetch_timeout_ms``; an error answer backs off
  ``fetch_backoff_ms``. An answer to a fetch from an offset that is no longer the follower's
  log end (a push landed meanwhile) is dropped, as Kafka's fetcher drops an answer whose fetch
  offset is not the partition's current one: its verdict is about a log that has moved.
- Divergence (KIP-320, with KIP-101/279's truncation): the leader answers a fetch whose last
  fetched epoch ends lower in its log with that epoch's end; the follower cuts its log there
  (Kafka's truncation for a diverging epoch, through the largest epoch it knows below an epoch
  it does not know). Where the leader's answer lies at or below its log start, the leader
  knows nothing below that (its first epoch entry was moved up to it, possibly inside a
  batch), so the follower starts over at the leader's log start.
- Out of range (Kafka's fetcher): a fetch above the leader's log end cuts the follower's log at
  the leader's end (starting over there when that lies below the follower's log start: only
  after an unclean election); a fetch below the leader's log start starts over at it.
- A follower's HW is min(leader's HW, own log end) and, unlike Kafka's, never moves backwards:
  a new leader may report a lower HW than its predecessor did. It adopts the leader's log start
  from every answer and push, bounded by that HW (``delete_records``); from an answer whose
  batches start above its log end (a gap), before appending them, as the leader took it.
- A follower started at a log start inside one of the leader's batches takes that whole batch
  as its first one; a follower whose log end is the leader's log start, inside the leader's
  first batch and above its own HW, starts over there (its bytes below are not the leader's,
  which cannot tell, and are deleted there anyway).
- Push mode: a follower accepts a push only if its first batch starts at its log end and the
  epoch below matches its own; otherwise it refuses (an ack with ``in_push`` False) and pulls.
  It acknowledges every durable advance, not only a fully synced log (under a steady stream of
  pushes the log may never be fully synced at an fsync's completion). Observers always pull.
- Tiered storage (``remote_storage``, KIP-405): a follower that starts over at its leader's
  log start (not at its log end: only after an unclean election) asks the shell for the
  producer and transaction state there from the remote tier (``Ready.build_remote_state``)
  and neither fetches nor takes pushes until it has it (``RemoteStateBuilt``): a transaction
  open across that offset is open here too, as on the leader (its first offset holds the
  LSO, its ABORT marker's aborted entry starts there, it is listed as open); without it the
  follower would know it only from its first batch at or above that offset.
  An answer that failed is asked again after ``REMOTE_STATE_RETRY_MS``; one for an offset no
  longer wanted is dropped; the remote tier holding no state there leaves the state empty,
  as without tiering. A leader takes no remote state (it serves what it has).
"""

from __future__ import annotations

from raylog.actors.replication import delete_records
from raylog.actors.replication.messages import (
    UNDEFINED_EPOCH,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    RecordBatch,
    RemoteStateBuilt,
    ReplicateAck,
    ReplicateRequest,
)
from raylog.actors.replication.ready import Role, check_invariant
from raylog.actors.replication.replica_state import (
    MAX_BATCHES_PER_MESSAGE,
    NONE,
    ReplicaState,
)
from raylog.storage.errors import (
    FencedLeaderEpochError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    UnknownLeaderEpochError,
)

REMOTE_STATE_RETRY_MS = 1_000  # asking the shell again for remote state it could not read


class FollowerSide(ReplicaState):
    """The follower's handlers. See the module docstring for the decisions."""

    def _receives_pushes(self) -> bool:
        """Push mode serves followers only; observers always pull (with long poll)."""
        return self.config.replication_mode == "push" and self.role is Role.FOLLOWER

    def _maybe_fetch(self, now_ms: int) -> None:
        if (
            self.role not in (Role.FOLLOWER, Role.OBSERVER)
            or self.leader_id < 0
            or self.fetch_in_flight is not None
            or now_ms < self.fetch_not_before_ms
            # Fetch only from a durable end: the fetch offset tells the leader what we hold
            # durably, and the leader counts it towards the HW.
            or self.log.durable_end_offset != self.log.log_end_offset
            or self.remote_state_wanted is not None
        ):
            return
        push = self._receives_pushes()
        if (
            push
            and self.push_active
            and now_ms - self.last_push_ms < self.config.push_idle_fetch_ms
        ):
            return  # pushes are flowing; fetch only when they go quiet
        request = FetchRequest(
            replica_id=self.replica_id,
            request_id=self.next_request_id,
            current_leader_epoch=self.leader_epoch,
            fetch_offset=self.log.log_end_offset,
            last_fetched_epoch=self.log.last_epoch,
            max_bytes=self.config.fetch_max_bytes,
            max_wait_ms=0 if push else self.config.fetch_max_wait_ms,
            log_start_offset=self.log.log_start_offset,
        )
        self.next_request_id += 1
        self.fetch_in_flight = request
        self.fetch_sent_ms = now_ms
        self._send(self.leader_id, request)

    def _tick_follower(self, now_ms: int) -> None:
        if (
            self.fetch_in_flight is not None
            and now_ms - self.fetch_sent_ms >= self.config.fetch_timeout_ms
        ):
            self.fetch_in_flight = None  # lost request or response: ask again
        wanted = self.remote_state_wanted
        if (
            wanted is not None
            and not self.remote_state_asked
            and now_ms >= self.remote_state_not_before_ms
        ):
            self._ask_remote_state(wanted)
        self._maybe_fetch(now_ms)

    # --- fetch answers --------------------------------------------------------------------------

    def _on_fetch_response(self, msg: FetchResponse, now_ms: int) -> None:
        request = self.fetch_in_flight
        if request is None or msg.request_id != request.request_id:
            return  # stale or duplicate answer
        if self.role not in (Role.FOLLOWER, Role.OBSERVER):
            return
        self.fetch_in_flight = None
        if request.fetch_offset != self.log.log_end_offset:
            # Our log moved since this fetch was sent (a push landed): the answer is about an
            # offset we no longer fetch from, and its verdict (out of range below the leader's
            # log start, a divergence) would cut what the pushes brought, committed data
            # included. Kafka's fetcher drops such an answer too; fetch again from our end.
            self._maybe_fetch(now_ms)
            return
        if msg.leader_epoch != self.leader_epoch or msg.error_code not in (
            NONE,
            OffsetOutOfRangeError.error_code,
        ):
            self.fetch_not_before_ms = now_ms + self.config.fetch_backoff_ms
            return
        if msg.error_code == OffsetOutOfRangeError.error_code:
            self._handle_out_of_range(msg, request)
        elif msg.diverging_epoch is not None:
            if msg.diverging_epoch.end_offset <= msg.log_start_offset and (
                msg.log_start_offset > self.log.high_watermark or self._may_lose_committed()
            ):
                # The leader knows nothing below its log start (its first epoch entry was moved
                # up to it, possibly inside a batch, where no truncation can cut), and all we
                # hold below it is deleted there: start over at its log start, as Kafka's
                # follower ends up doing after its next fetch is out of range. After a clean
                # election our HW is below it (the logs agree below it, and diverge below the
                # leader's log start); after an unclean one (or a power loss under a relaxed
                # flush policy) our HW says nothing, and where we diverge below the leader's log
                # start is unknowable.
                self._start_over_at_leader_log_start(msg.log_start_offset)
            else:
                self._truncate_diverged(msg.diverging_epoch)
        else:
            if self._straddles_leader_log_start(msg, request):
                self._start_over_at_leader_log_start(msg.log_start_offset)
            elif msg.batches and msg.batches[0].meta.base_offset > self.log.log_end_offset:
                # A gap: take the leader's HW and log start as they stood at our log end first,
                # as the leader did (a mirror's empties its log before it appends above the
                # gap, ending its open transactions: ``mirror``). Taken after the batches, a log
                # start at our old end would leave our log non-empty, and keep them open.
                self._update_follower_high_watermark(msg.high_watermark)
                self._adopt_leader_log_start(msg.log_start_offset)
            appended = self._append_from_leader(msg.batches)
            self._update_follower_high_watermark(msg.high_watermark)
            self._adopt_leader_log_start(msg.log_start_offset)
            if self._receives_pushes():
                caught_up = not appended and msg.log_end_offset == request.fetch_offset
                self.push_active = caught_up
                self.last_push_ms = now_ms
            elif not appended and msg.log_end_offset > request.fetch_offset:
                # The leader had data but sent none (e.g. a read limit): do not spin.
                self.fetch_not_before_ms = now_ms + self.config.fetch_backoff_ms
        self._maybe_fetch(now_ms)

    def _straddles_leader_log_start(self, msg: FetchResponse, request: FetchRequest) -> bool:
        """The leader's first batch starts below our log end, which is the leader's log start
        and lies inside that batch, above our HW (or anywhere, where our HW says nothing: after
        an unclean election, or a power loss under a relaxed flush policy): our bytes just
        below it are not the leader's, which cannot tell (it knows no epoch below its log
        start, so KIP-320's check passed), and are deleted there anyway. Then we start over at
        its log start."""
        first = msg.batches[0].meta if msg.batches else None
        return (
            first is not None
            and first.base_offset < request.fetch_offset < first.next_offset
            and request.fetch_offset == msg.log_start_offset
            and (msg.log_start_offset > self.log.high_watermark or self._may_lose_committed())
            and self.log.log_end_offset > self.log.log_start_offset
        )

    def _append_from_leader(self, batches: tuple[RecordBatch, ...]) -> bool:
        """Append the leader's batches that extend our log (read from our log end); returns
        whether any did."""
        check_invariant(len(batches) <= MAX_BATCHES_PER_MESSAGE, "too many batches in one message")
        appended = False
        for record_batch in batches:
            meta = record_batch.meta
            if meta.next_offset <= self.log.log_end_offset:
                continue  # the first batch may start before the fetch offset
            check_invariant(
                meta.base_offset >= self.log.log_end_offset or self.log.empty_above_log_start(),
                "fetched batches never go back (gaps are a compacted leader log's)",
            )
            check_invariant(meta.leader_epoch <= self.leader_epoch, "a batch from a future epoch")
            self._append(meta, record_batch.data, replicated=True)
            appended = True
        return appended

    def _update_follower_high_watermark(self, leader_high_watermark: int) -> None:
        # A follower's HW is min(leader's HW, own log end), and, unlike Kafka's, never moves
        # backwards: a new leader may report a lower HW than its predecessor did.
        candidate = min(leader_high_watermark, self.log.log_end_offset)
        if candidate > self.log.high_watermark:
            self._set_high_watermark(candidate)

    def _adopt_leader_log_start(self, leader_log_start_offset: int) -> None:
        start = delete_records.follower_log_start(leader_log_start_offset, self.log.high_watermark)
        if start > self.log.log_start_offset:
            self._advance_log_start(start)

    def _truncate_diverged(self, diverging: EpochEndOffset) -> None:
        """Kafka's follower truncation for a KIP-320 diverging epoch."""
        log_end = self.log.log_end_offset
        if diverging.leader_epoch == UNDEFINED_EPOCH:
            target = min(diverging.end_offset, log_end)
        else:
            mine = self.log.end_offset_for_epoch(diverging.leader_epoch)
            if mine.leader_epoch == UNDEFINED_EPOCH:
                target = min(diverging.end_offset, log_end)
            elif mine.leader_epoch != diverging.leader_epoch:
                # We do not know the leader's epoch: cut back to the end of our largest epoch
                # below it, and fetch again with that epoch for the leader to check.
                target = min(mine.end_offset, log_end)
            else:
                target = min(diverging.end_offset, mine.end_offset, log_end)
        self._truncate(max(target, self.log.log_start_offset))

    def _handle_out_of_range(self, msg: FetchResponse, request: FetchRequest) -> None:
        if (
            request.fetch_offset > msg.log_end_offset
            and msg.log_end_offset < self.log.log_start_offset
        ):
            # Only after an unclean election (a clean leader holds our HW, and our log start
            # is below that): the leader's log ends below our log start, so nothing we hold is
            # in its log. Start over at its end, as Kafka's truncateTo does.
            self._truncate_fully(msg.log_end_offset)
        elif request.fetch_offset > msg.log_end_offset:
            self._truncate(msg.log_end_offset)
        elif request.fetch_offset < msg.log_start_offset:
            self._start_over_at_leader_log_start(msg.log_start_offset)

    def _start_over_at_leader_log_start(self, offset: int) -> None:
        self._truncate_fully(offset)
        if self.config.remote_storage and offset > 0:
            self.remote_state_wanted = offset
            self.remote_state_not_before_ms = 0
            self._ask_remote_state(offset)

    def _ask_remote_state(self, offset: int) -> None:
        self.remote_state_asked = True
        self._ready.build_remote_state = offset

    def _on_remote_state_built(self, msg: RemoteStateBuilt, now_ms: int) -> None:
        if msg.offset != self.remote_state_wanted:
            return  # an answer no longer wanted (another truncation, a new role)
        self.remote_state_asked = False
        log = self.log
        if log.log_start_offset != msg.offset or log.log_end_offset != msg.offset:
            self.remote_state_wanted = None  # cannot happen while wanted; be safe
        elif msg.failed:
            self.remote_state_not_before_ms = now_ms + REMOTE_STATE_RETRY_MS
            return
        else:
            if msg.snapshot is not None:
                log.adopt_remote_state(msg.snapshot)
            self.remote_state_wanted = None
        self._maybe_fetch(now_ms)

    # --- pushes ---------------------------------------------------------------------------------

    def _on_replicate(self, msg: ReplicateRequest, now_ms: int) -> None:
        if msg.leader_epoch < self.leader_epoch:
            ack = ReplicateAck(
                self.replica_id, msg.leader_epoch, -1, FencedLeaderEpochError.error_code
            )
            self._send(msg.leader_id, ack)
            return
        if (
            msg.leader_epoch > self.leader_epoch
            or self.role not in (Role.FOLLOWER, Role.OBSERVER)
            or msg.leader_id != self.leader_id
        ):
            code = (
                UnknownLeaderEpochError.error_code
                if msg.leader_epoch > self.leader_epoch
                else NotLeaderOrFollowerError.error_code
            )
            self._send(msg.leader_id, ReplicateAck(self.replica_id, msg.leader_epoch, -1, code))
            return
        first = msg.batches[0].meta if msg.batches else None
        if (
            first is None
            or first.base_offset != self.log.log_end_offset
            or msg.prev_epoch != self.log.last_epoch
            or self.remote_state_wanted is not None
        ):
            # A gap (a lost push), an overlap or a divergence: fall back to pull.
            self.push_active = False
            self._send(
                self.leader_id,
                ReplicateAck(
                    self.replica_id,
                    self.leader_epoch,
                    self.log.durable_end_offset,
                    in_push=False,
                    log_start_offset=self.log.log_start_offset,
                ),
            )
            self._maybe_fetch(now_ms)
            return
        self._append_from_leader(msg.batches)
        self._update_follower_high_watermark(msg.high_watermark)
        self._adopt_leader_log_start(msg.log_start_offset)
        self.push_active = True
        self.last_push_ms = now_ms
        self.push_ack_owed = True  # acknowledged once LocalAppendDurable covers it

    def _follower_durable(self, now_ms: int) -> None:
        """Our durable end grew: acknowledge the pushes it covers, and fetch if due."""
        if self.push_ack_owed:
            # Ack every durable advance, not only a fully synced log: under a steady stream of
            # pushes the log may never be fully synced at an fsync's completion.
            self.push_ack_owed = self.log.durable_end_offset < self.log.log_end_offset
            self._send(
                self.leader_id,
                ReplicateAck(
                    self.replica_id,
                    self.leader_epoch,
                    self.log.durable_end_offset,
                    log_start_offset=self.log.log_start_offset,
                    log_end_offset=self.log.log_end_offset,
                ),
            )
        self._maybe_fetch(now_ms)
