"""The source leader's handlers for synchronous cluster links (KIP-986 sync mode), pure.

``SyncLinkSide`` holds what a leader does with its sync links (the rules, and the argument why
no acknowledged write is missing from an in-sync link's destination, are in ``sync_links``):
it takes the controller's set of links (``SyncLinksChanged``; ``BecomeLeader`` in
``partition``), the destinations' progress reports (``SyncLinkProgress``), takes lagging links
out of the in-sync set on every tick, acknowledges the acks=all writes they released, and
shows each link's state for ``links describe``. The acknowledgement rule itself is the
leader's (``leader.LeaderSide._acks_hold``).
"""

from __future__ import annotations

from raylog.actors.replication import sync_links as rules
from raylog.actors.replication.leader import LeaderSide
from raylog.actors.replication.messages import SyncLinkProgress, SyncLinkRef, SyncLinksChanged
from raylog.actors.replication.ready import Role, check_invariant
from raylog.actors.replication.sync_links import SyncLinkStatus
from raylog.storage.errors import NotLeaderOrFollowerError

__all__ = ["SyncLinkSide", "SyncLinkStatus", "check_refs"]


def check_refs(refs: tuple[SyncLinkRef, ...]) -> None:
    """A set of sync links from the controller is well formed (InvariantViolation if not: the
    controller's bug)."""
    malformed = rules.check_refs(refs)
    check_invariant(malformed is None, f"sync links from the controller: {malformed}")


class SyncLinkSide(LeaderSide):
    """The leader's sync-link handlers. See ``sync_links`` for the decisions."""

    # --- what the shell asks ----------------------------------------------------------------------

    def sync_link_progress_error(self, msg: SyncLinkProgress) -> tuple[int, str] | None:
        """Why stepping ``msg`` changes nothing, as (Kafka error code, message) for the caller
        (the destination then finds the leader again, or logs why); None: it is taken."""
        if self.role is not Role.LEADER:
            return NotLeaderOrFollowerError.error_code, "not the leader"
        return rules.progress_error(self.sync_links, msg, self.log.log_end_offset)

    def sync_links_status(self) -> tuple[SyncLinkStatus, ...]:
        """Each sync link's state on this leader (none on any other replica)."""
        ends = [p.end_offset for p in self.pending.values() if p.acks == -1]
        hw = self.log.high_watermark
        return tuple(rules.status(name, s, hw, ends) for name, s in self.sync_links.items())

    # --- handlers ---------------------------------------------------------------------------------

    def _on_sync_link_progress(self, msg: SyncLinkProgress, now_ms: int) -> None:
        if self.sync_link_progress_error(msg) is not None:
            return
        state = self.sync_links[msg.link]
        rules.record_progress(state, msg.durable_end_offset, self.log.high_watermark, now_ms)
        self._complete_acks_all()

    def _on_sync_links_changed(self, msg: SyncLinksChanged, now_ms: int) -> None:
        if self.role is not Role.LEADER or msg.leader_epoch != self.leader_epoch:
            return  # for another leadership: the next BecomeLeader carries the set
        self._change_sync_links(msg.sync_links, msg.version)

    def _change_sync_links(self, refs: tuple[SyncLinkRef, ...], version: int) -> None:
        """The controller's set as of ``version``, if newer than ours (see ``sync_links``)."""
        if version <= self.sync_links_version:
            return
        check_refs(refs)
        self.sync_links = rules.changed_links(self.sync_links, refs)
        self.sync_links_version = version
        self._complete_acks_all()  # a link that left holds nothing

    def _start_sync_links(self, refs: tuple[SyncLinkRef, ...], version: int, now_ms: int) -> None:
        """A new leadership's links: all in sync, caught up now, no end known (``partition``
        has checked ``refs`` with ``check_refs`` before changing anything)."""
        self.sync_links = rules.reset_links(refs, now_ms)
        self.sync_links_version = version

    def _tick_leader(self, now_ms: int) -> None:
        # Before the requests' timeouts: a write held only by a link that lags out is
        # acknowledged, not timed out, when both fall due at once.
        lagging = rules.falling_behind(
            self.sync_links,
            self.log.high_watermark,
            now_ms,
            self.config.link_sync_lag_time_max_ms,
        )
        for name in lagging:
            self.sync_links[name].in_sync = False
        if lagging:
            self._complete_acks_all()
        super()._tick_leader(now_ms)
