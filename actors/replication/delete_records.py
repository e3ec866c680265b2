"""DeleteRecords and the log start offset, pure: the leader's waiting requests and the rules.

Decisions (Kafka's Partition.deleteRecordsOnLeader and DelayedDeleteRecords):
- The leader moves its log start offset up to the requested offset (-1: the high watermark;
  negative or above the high watermark: OFFSET_OUT_OF_RANGE) at once (``AdvanceLogStart``),
  and answers when the low watermark, the lowest log start offset over the maximal ISR (as the
  HW: a member an in-flight expansion adds may already be in the controller's ISR; see
  ``isr``), reaches it, or with REQUEST_TIMED_OUT at its timeout. Leaving leadership fails the
  waiting requests; an ISR shrink can complete them.
- Followers report their log start offset in fetches and push acks, and adopt the leader's
  from every fetch answer and push, bounded by their own high watermark (Kafka's
  maybeIncrementLogStartOffset on the follower). The leader answers parked fetches at once
  when its log start moves, so followers learn it without waiting out a long poll.
- Retention moves the log start on its own (``LocalLogStartAdvanced``: the log has done it),
  never above the high watermark either.
- A follower started (by a full truncation) at a log start inside one of the leader's batches
  takes that whole batch as its first one (see ``follower``).
- The cleanup.policy check (POLICY_VIOLATION) is the shell's: the state machine does not know
  topic configs.
"""

from __future__ import annotations

from dataclasses import dataclass

from raylog.actors.replication.ready import DeleteRecordsResult

MAX_PENDING_DELETE_RECORDS = 1_000  # DeleteRecords requests waiting for the low watermark
DELETE_RECORDS_HIGH_WATERMARK = -1  # DeleteRecords' offset -1: up to the high watermark


def requested_log_start(offset: int, high_watermark: int) -> int | None:
    """The log start a DeleteRecords asks for; None when it is out of range."""
    wanted = high_watermark if offset == DELETE_RECORDS_HIGH_WATERMARK else offset
    return wanted if 0 <= wanted <= high_watermark else None


def follower_log_start(leader_log_start_offset: int, high_watermark: int) -> int:
    """Kafka's maybeIncrementLogStartOffset(leaderLogStartOffset) on a follower: the leader's
    log start, bounded by our high watermark (so also by our log end)."""
    return min(leader_log_start_offset, high_watermark)


@dataclass
class PendingDeleteRecords:
    request_id: int
    offset: int  # answered once the low watermark reaches it
    deadline_ms: int


class DeleteRecordsQueue:
    """The leader's DeleteRecords requests waiting for the low watermark (at most
    ``MAX_PENDING_DELETE_RECORDS``); each method returns the answers it decides."""

    def __init__(self) -> None:
        self.pending: dict[int, PendingDeleteRecords] = {}

    def __contains__(self, request_id: int) -> bool:
        return request_id in self.pending

    def __len__(self) -> int:
        return len(self.pending)

    def is_full(self) -> bool:
        return len(self.pending) >= MAX_PENDING_DELETE_RECORDS

    def add(self, request_id: int, offset: int, deadline_ms: int) -> None:
        self.pending[request_id] = PendingDeleteRecords(request_id, offset, deadline_ms)

    def complete(self, low_watermark: int) -> list[DeleteRecordsResult]:
        """Answer the requests the low watermark reached."""
        done = [p for p in self.pending.values() if p.offset <= low_watermark]
        for p in done:
            del self.pending[p.request_id]
        return [DeleteRecordsResult(p.request_id, 0, low_watermark, "") for p in done]

    def fail(
        self, error_code: int, message: str, now_ms: int | None = None
    ) -> list[DeleteRecordsResult]:
        """Answer with an error: every waiting request, or (``now_ms``) the expired ones."""
        failed = [p for p in self.pending.values() if now_ms is None or p.deadline_ms <= now_ms]
        for p in failed:
            del self.pending[p.request_id]
        return [DeleteRecordsResult(p.request_id, error_code, -1, message) for p in failed]
