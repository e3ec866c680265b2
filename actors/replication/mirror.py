"""A mirror topic's leader appending a source cluster's batches (KIP-986 cluster links), pure.

``MirrorSide`` holds the leader's handler of :class:`MirrorAppendRequest`: a gateway on the
destination leader's broker fetches raw batches from the source cluster and hands them here,
and the leader appends them at the SOURCE's offsets, then replicates them to its followers
exactly as it replicates produced batches (HW, ISR, acks, epochs, truncation unchanged). The
shell has checked the bytes (magic, lengths, CRC-32C) and restamped each batch's
partition-leader-epoch, which lies outside the CRC'd region, with the leader's epoch: the
destination keeps its own epoch lineage, so KIP-101/320 truncation and fencing work as for any
topic, and a new leader's log end IS the next source offset to fetch (no hand-over). The
records, offsets, producer ids and sequences and attributes stay the source's bytes.

Decisions:
- Only the leader of the epoch the caller names appends (NOT_LEADER_OR_FOLLOWER, then
  FENCED_LEADER_EPOCH below it, UNKNOWN_LEADER_EPOCH above it), and only while the controller
  says the topic mirrors a link (``mirror_link``, from BecomeLeader; else INVALID_REQUEST):
  disconnecting a link is a new leader epoch, which fences the appends still in flight.
- Offsets are the source's: a batch wholly below our log end is skipped (the fetcher refetched
  an overlap); a batch that straddles our log end is INVALID_REQUEST (nothing appended: it can
  only be the first one not skipped); gaps above our log end are the source's compaction and
  are kept, as is the gap when the source's log starts above ours (the log start follows the
  source's below; a leader never starts its log over above its HW, which would leave its
  followers' logs ending below it, and a follower elected then would be asked to cut below the
  HW).
- The log start follows the source's (each request carries it as the source's Fetch answered
  it): ours moves up to it, never above our HW, as DeleteRecords moves it. When the source's
  log starts above our log end (its retention passed what we had fetched), every record we
  hold is gone at the source: once our HW covers our log end, our log start moves there (the
  log is then empty, and its open transactions end: ``txn_state``), and once every ISR
  member's log start has followed (the low watermark), the next batch lies above a gap; until
  then a request takes nothing. Appending after a gap instead would keep a transaction's records
  whose marker the source deleted, open forever on the mirror, or closed by the producer's next
  marker with the wrong outcome.
- Producer and transaction state follow the appended batches as on a follower (the log's
  ``append``), with no idempotence or transaction checks: the source's leader made them, and
  the mirror must hold its log as it is. So idempotence, read_committed and the LSO work on the
  mirror, and go on working after the link is disconnected.
- Acks as for produce: acks=all waits for the HW to cover the last appended batch (and is
  refused with NOT_ENOUGH_REPLICAS below min.insync.replicas), acks 0/1 for the local fsync. A
  position query (no batches) is answered at once; a request whose batches were all skipped is
  answered once what the log already holds is covered by its acks condition.
- Clients' writes to a mirror (produce, transaction markers, DeleteRecords) are refused with
  INVALID_REQUEST in ``leader`` (``read_only_message``).
- Push mode: appended batches that continue our log go to the followers that end where they
  start, as produced ones do. After a gap or a start-over no batch starts at the old log end,
  where the next push to a follower would start: pushes to every follower stop, and each
  catches up by fetching (a fetch serves gaps), after which pushes resume from our log end.
"""

from __future__ import annotations

from raylog.actors.replication.leader import LeaderSide, PendingProduce, read_only_message
from raylog.actors.replication.messages import BatchMeta, MirrorAppendRequest
from raylog.actors.replication.ready import Role, check_invariant
from raylog.actors.replication.replica_state import MAX_BATCHES_PER_MESSAGE, NONE
from raylog.storage.errors import (
    FencedLeaderEpochError,
    InvalidRequestError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
)

__all__ = ["MirrorSide", "read_only_message"]


class MirrorSide(LeaderSide):
    """The mirror leader's handler. See the module docstring for the decisions."""

    def _on_mirror_append(self, msg: MirrorAppendRequest, now_ms: int) -> None:
        if msg.request_id in self.pending:
            return  # a duplicate delivery of a request still in progress: answered once
        refused = self._mirror_refusal(msg)
        if refused is not None:
            self._result(msg.request_id, *refused)
            return
        if msg.source_log_start > self.log.log_start_offset and not self._follow_source_log_start(
            msg.source_log_start, now_ms
        ):
            # The source's log starts above all we hold, and not all of that is committed yet:
            # nothing is taken until it is (the fetcher asks again from our log end).
            self._result(msg.request_id, NONE, "")
            return
        if not msg.batches:
            self._result(msg.request_id, NONE, "")  # a position query: answered at once
            return
        old_end = self.log.log_end_offset
        # Skipped: wholly below our log end (the fetcher refetched an overlap).
        fresh = [b.meta for b in msg.batches if b.meta.next_offset > old_end]
        first = fresh[0] if fresh else None
        if first is not None and first.base_offset < old_end:
            message = (
                f"the batch at offsets [{first.base_offset}, {first.next_offset}) straddles "
                f"the log end {old_end}"
            )
            self._result(msg.request_id, InvalidRequestError.error_code, message)
            return
        if first is None and self._acks_hold(msg.acks, old_end):
            self._result(msg.request_id, NONE, "")  # nothing new, and what is there is acked
            return
        refused = self._admission_error(msg.acks)
        if refused is not None:
            self._result(msg.request_id, *refused)
            return
        end = old_end
        if first is not None:
            self._append_mirrored(msg, first, old_end, now_ms)
            end = self.log.log_end_offset
        self._wait_for_acks(
            PendingProduce(
                msg.request_id,
                msg.acks,
                first.base_offset if first is not None else -1,
                end,
                now_ms + msg.timeout_ms,
                appended=len(fresh),
            )
        )

    def _append_mirrored(
        self, msg: MirrorAppendRequest, first: BatchMeta, old_end: int, now_ms: int
    ) -> None:
        """Append ``msg``'s batches from ``first`` on (every one above our old log end
        ``old_end``), then hand them to the followers as produced batches are."""
        for record_batch in msg.batches:
            meta = record_batch.meta
            if meta.base_offset < first.base_offset:
                continue  # skipped, below our log end
            check_invariant(meta.leader_epoch == self.leader_epoch, "mirrored batch restamped")
            check_invariant(
                meta.base_offset >= self.log.log_end_offset, "mirrored batches in offset order"
            )
            self._append(meta, record_batch.data, replicated=True)
        if first.base_offset == old_end:
            self._push_appended(old_end)
        else:
            # No batch starts at our old log end, where a push to a follower ending there (now,
            # or once its push in flight lands) would start: pushes stop, and each follower
            # fetches (a fetch serves gaps) until it fetches at our log end again.
            for state in self.followers.values():
                state.pushed_end_offset = None
                state.push_in_flight_from = None
        self._answer_parked(now_ms, only_expired=False)

    def _follow_source_log_start(self, source_start: int, now_ms: int) -> bool:
        """Move our log start up towards the source's (its retention or DeleteRecords), never
        above our HW; False when the source's log starts above our log end while our HW is
        below it (see the module docstring)."""
        end, hw = self.log.log_end_offset, self.log.high_watermark
        if source_start > end:
            if hw < end:
                return False
            if self.log.log_start_offset < end:
                self._advance_log_start(end)
                self.isr_join_log_start = max(self.isr_join_log_start, end)
                self._answer_parked(now_ms, only_expired=False)  # followers learn it now
            # Every ISR member's log emptied too (its open transactions with it), before
            # anything lands above the gap.
            return self.low_watermark >= end
        target = min(source_start, hw)
        if target > self.log.log_start_offset:
            self._advance_log_start(target)
            self._answer_parked(now_ms, only_expired=False)
        return True

    def _mirror_refusal(self, msg: MirrorAppendRequest) -> tuple[int, str] | None:
        """Why this replica may not take mirrored batches now: (error code, message)."""
        if self.role is not Role.LEADER:
            return NotLeaderOrFollowerError.error_code, "not the leader"
        if msg.leader_epoch != self.leader_epoch:
            # Exact, unlike a consumer's fetch: an append without an epoch is not fenced.
            error = (
                FencedLeaderEpochError.error_code
                if msg.leader_epoch < self.leader_epoch
                else UnknownLeaderEpochError.error_code
            )
            return error, f"leader epoch {msg.leader_epoch}, the leader's is {self.leader_epoch}"
        if not self.mirror_link:
            return InvalidRequestError.error_code, "not a mirror topic"
        if len(msg.batches) > MAX_BATCHES_PER_MESSAGE:
            return (
                InvalidRequestError.error_code,
                f"{len(msg.batches)} batches in one mirror append (at most "
                f"{MAX_BATCHES_PER_MESSAGE})",
            )
        return None
