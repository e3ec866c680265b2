"""The source leader's rules for synchronous cluster links (KIP-986 sync mode), pure.

A synchronous link copies this partition to a mirror on another raylog cluster, as an
asynchronous one does (``mirror`` is the destination's side), and while it is *in sync* the
leader acknowledges an acks=all write only once that destination holds it durably. The state
per link is :class:`SyncLinkState`; the functions here decide, and ``sync_link_side`` (the
leader's handlers) applies them. ``link.sync.lag.time.max.ms`` is
``ReplicaConfig.link_sync_lag_time_max_ms``.

What the destination does, and what this relies on:
(a) it reads this partition as a Kafka consumer does, so only below the high watermark of the
    replica that answers;
(b) its link fetches the next range only after the previous one was appended with acks=all on
    its mirror's ISR (fsync'd on every member), so the offset it fetches from next IS its
    durable end; it reports that offset (:class:`SyncLinkProgress`), never a larger one, and a
    durable end on its mirror never goes back (its mirror elects cleanly, as any topic does);
(c) its mirror holds this partition's batches at their offsets (``mirror``), skipping only
    what this partition no longer held when the link fetched there.

Decisions:
- The HW does not wait for sync links: by (a) a link could never read above it, so an HW held
  for a link would never move. What waits is the acknowledgement: a pending acks=all write
  ending at ``end`` completes when the HW has reached ``end`` AND the durable end of every
  in-sync sync link has (``holding``); a retried idempotent batch is answered under the same
  rule. acks 0 and 1 do not wait; acks=all still times out (REQUEST_TIMED_OUT) and still fails
  when the ISR shrinks below min.insync.replicas, as without links.
- Which links hold acks is the controller's: ``BecomeLeader.sync_links``, and within a
  leadership ``SyncLinksChanged`` with a higher version (a late or repeated command changes
  nothing). A link is its name and its id.
- Progress: a link's end is the highest end it reported to this leadership; a lower one
  (late, reordered) changes nothing, an equal one (repeated) counts as a report.
  ``progress_error`` refuses, changing nothing, a report of a link not in the set, of another
  link of that name (a different id), or of an end below 0 or above our log end.
- In sync: Kafka's ISR rule (``isr.record_fetch``) with the HW in place of the leader's log
  end, because by (a) the HW is all a link can reach: a report that reaches the HW catches the
  link up now, one that reaches the HW as of the previous report catches it up as of then. An
  in-sync link whose end is below the HW and that has not caught up for
  ``link.sync.lag.time.max.ms`` leaves the in-sync set (checked on every tick), and the writes
  it held are acknowledged if nothing else holds them. It rejoins when a report's end reaches
  the HW; from then on it holds every write above its end again.
- A new leader (Kafka's resetReplicaState for ISR members) starts every link of its set IN
  SYNC, caught up now, end unknown: it holds every acks=all write until the link reports to
  it, or until ``link.sync.lag.time.max.ms`` passes. A link added within a leadership starts
  OUT of sync (a link being created may be far behind) and joins as above. Nothing about
  links is persisted.

What is guaranteed: an acks=all write acknowledged while a link was in sync on the leader
that acknowledged it is, at that moment, durably on that link's destination mirror ISR (unless
DeleteRecords, retention or compaction removed it from this partition before the link fetched
it, (c)). What is not: writes acknowledged while the link was out of sync or not in the set
(they reach the destination as an asynchronous link's do), writes acknowledged with acks 0 or
1, and anything after an unclean election here (which loses acknowledged writes anyway) or a
loss of the destination mirror's data (its topic deleted, an unclean election there).

Why (clean elections on both sides):
1. At the acknowledgement of a write at [b, e) the link is in sync with end >= e. That end is
   the largest a report of this very link (name and id) gave this leadership. By (b) each
   report was a durable end of the destination when it was sent, and stays one: so the
   destination durably holds its mirror's offsets below e, the write's among them (c).
2. Those offsets hold this write, not others: the destination read them below some replica's
   HW (a), and a clean election never truncates below an HW any replica exposed, so every log
   of this partition holds the same batches there; the acknowledging leader holds the write at
   [b, e) with e <= its HW (acks=all), so that is what the destination read.
3. Stale, duplicated and reordered reports: each is a true lower bound on the destination's
   durable end, then and later (b); taking the maximum keeps the highest true one, so no
   delivery order makes the end pass the real one. A report of a deleted link of the same name
   is refused by its id: its destination is not this link's. A report sent to an earlier
   leader, or to an earlier leadership of this replica, is still a true bound: the
   destination's offsets hold this partition's batches whichever replica served them (2).
   A report above our log end cannot be about our log (the destination only reads below an
   HW, and a clean election keeps every HW's offsets): refused.
4. Leader changes: the new leader has heard no report of this leadership; its links start in
   sync with no end, which holds every acks=all write, so forgetting is safe (what it costs is
   liveness: a link that was out of sync holds writes again until it reports or lags out).
   Requests pending on the old leader failed with NOT_LEADER_OR_FOLLOWER, unacknowledged.
5. Truncations on this partition happen only above the HW (clean elections), where no write
   is acknowledged (acks=all waits for the HW) and no destination reads (a). So truncation
   can neither take an acknowledged write away from the destination's copy (2) nor give an
   offset a link reported a different batch.
6. Set changes: a link that leaves the set or goes out of sync stops holding at once (the
   guarantee does not cover what is acknowledged then); a link that joins starts out of sync
   and holds nothing until its end reaches the HW, and every write it holds from then on ends
   above that end, so 1-5 hold for it from its first in-sync moment.

No record is lost, duplicated or reordered by sync mode: it adds no path that writes records.
The source's log is written as without links, and the destination's as ``mirror`` writes it
(at the source's offsets, a batch below its log end skipped, so each batch once and in order);
sync mode only delays acks=all acknowledgements on the source.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from raylog.actors.replication import isr as isr_rules
from raylog.actors.replication.isr import NEVER, FollowerState
from raylog.actors.replication.messages import UNDEFINED_OFFSET, SyncLinkProgress, SyncLinkRef
from raylog.storage.errors import InvalidRequestError

MAX_SYNC_LINKS = 64  # links of one partition (bounds every loop over them)


@dataclass
class SyncLinkState:
    """The leader's view of one synchronous link: ``progress`` is kept as a follower's is
    (``isr.FollowerState``): its log end is the destination's reported durable end, its
    fetches are the link's reports, and the leader's log end at a report is our HW."""

    link_id: str
    in_sync: bool
    progress: FollowerState = field(default_factory=FollowerState)

    @property
    def end_offset(self) -> int:
        """The destination's durable end as reported (UNDEFINED_OFFSET: no report yet)."""
        return self.progress.log_end_offset


class SyncLinkStatus(msgspec.Struct, frozen=True):
    """One link as ``links describe`` shows it on the source's leader."""

    link: str
    link_id: str
    in_sync: bool
    durable_end_offset: int  # -1: no report to this leader yet
    high_watermark: int
    lag: int  # offsets below the HW not yet reported durable (-1: unknown)
    last_caught_up_ms: int  # the leader's clock; -1: never in this leadership
    holding: int  # acks=all requests waiting for this link


def reset_links(refs: Iterable[SyncLinkRef], now_ms: int) -> dict[str, SyncLinkState]:
    """A new leader's links: every one in sync, caught up now, its end unknown."""
    return {
        ref.name: SyncLinkState(
            ref.link_id, True, FollowerState(last_caught_up_ms=now_ms, last_fetch_ms=now_ms)
        )
        for ref in refs
    }


def changed_links(
    links: Mapping[str, SyncLinkState], refs: Iterable[SyncLinkRef]
) -> dict[str, SyncLinkState]:
    """The set becomes ``refs``: a link still in it (same name and id) keeps its state; a new
    one starts out of sync, its end unknown, never caught up."""
    out: dict[str, SyncLinkState] = {}
    for ref in refs:
        kept = links.get(ref.name)
        out[ref.name] = (
            kept
            if kept is not None and kept.link_id == ref.link_id
            else SyncLinkState(ref.link_id, False)
        )
    return out


def check_refs(refs: tuple[SyncLinkRef, ...]) -> str | None:
    """Why a set of links from the controller is malformed (None: it is not)."""
    if len(refs) > MAX_SYNC_LINKS:
        return f"{len(refs)} sync links (at most {MAX_SYNC_LINKS})"
    if len({ref.name for ref in refs}) != len(refs):
        return f"a sync link named twice in {[ref.name for ref in refs]}"
    return None


def progress_error(
    links: Mapping[str, SyncLinkState], msg: SyncLinkProgress, log_end_offset: int
) -> tuple[int, str] | None:
    """Why a leader ignores ``msg`` (error code, message); None: it takes it (a stale end
    is taken too, and changes nothing)."""
    state = links.get(msg.link)
    if state is None:
        return InvalidRequestError.error_code, f"no sync link {msg.link!r} holds this partition"
    if state.link_id != msg.link_id:
        return (
            InvalidRequestError.error_code,
            f"sync link {msg.link!r} is {state.link_id}, the report is of {msg.link_id}",
        )
    if not 0 <= msg.durable_end_offset <= log_end_offset:
        return (
            InvalidRequestError.error_code,
            f"sync link {msg.link!r} reports end {msg.durable_end_offset}, outside this "
            f"log [0, {log_end_offset}]",
        )
    return None


def record_progress(
    state: SyncLinkState, end_offset: int, high_watermark: int, now_ms: int
) -> bool:
    """The link reports ``end_offset`` now (``progress_error`` found nothing wrong): Kafka's
    caught-up rule against the HW; an end below the known one changes nothing. True when the
    link rejoins the in-sync set."""
    if end_offset < state.progress.log_end_offset:
        return False  # late: a true bound, but below one already known
    isr_rules.record_fetch(state.progress, end_offset, high_watermark, now_ms)
    if not state.in_sync and end_offset >= high_watermark:
        state.in_sync = True
        return True
    return False


def is_caught_up(
    state: SyncLinkState, high_watermark: int, now_ms: int, lag_time_max_ms: int
) -> bool:
    """Kafka's isInSync against the HW (a link's end may lie above a new leader's HW)."""
    progress = state.progress
    return (
        progress.log_end_offset >= high_watermark
        or now_ms - progress.last_caught_up_ms <= lag_time_max_ms
    )


def falling_behind(
    links: Mapping[str, SyncLinkState], high_watermark: int, now_ms: int, lag_time_max_ms: int
) -> list[str]:
    """The in-sync links to take out of the in-sync set."""
    return [
        name
        for name, state in links.items()
        if state.in_sync and not is_caught_up(state, high_watermark, now_ms, lag_time_max_ms)
    ]


def holding(links: Mapping[str, SyncLinkState], end_offset: int) -> list[str]:
    """The in-sync links whose destinations do not hold everything below ``end_offset`` yet
    (an acks=all write ending there waits for them)."""
    return [
        name
        for name, state in links.items()
        if state.in_sync and state.progress.log_end_offset < end_offset
    ]


def status(
    name: str, state: SyncLinkState, high_watermark: int, pending_ends: Iterable[int]
) -> SyncLinkStatus:
    """``links describe``'s view of one link; ``pending_ends``: the ends of the acks=all
    requests pending."""
    end = state.progress.log_end_offset
    return SyncLinkStatus(
        link=name,
        link_id=state.link_id,
        in_sync=state.in_sync,
        durable_end_offset=end,
        high_watermark=high_watermark,
        lag=max(0, high_watermark - end) if end != UNDEFINED_OFFSET else -1,
        last_caught_up_ms=state.progress.last_caught_up_ms
        if state.progress.last_caught_up_ms != NEVER
        else -1,
        holding=sum(1 for e in pending_ends if state.in_sync and end < e),
    )
