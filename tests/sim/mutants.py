"""Deliberately broken replicas, executors, reconcilers and controllers: each states the bug it
carries, and test_sim.py proves the simulator's checkers catch it (a checker that nothing can
fail proves nothing). MovesLeadersOften is no bug: a controller that moves leaders more often
than raylog's does, to stress the one-leader-at-a-time rule. Links' mutants are link fetchers
(a LinkSimulation) or mirror replicas."""

from __future__ import annotations

from typing import Any

import msgspec

from raylog.actors.control import reassignment
from raylog.actors.control.metadata import ClusterMetadata
from raylog.actors.control.reconciler import Outcome, Reconciler, ReplicaSpec
from raylog.actors.replication.executor import ReadyExecutor
from raylog.actors.replication.messages import (
    BatchMeta,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    LocalAppendDurable,
    ProduceRequest,
    RecordBatch,
    SyncLinkProgress,
)
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.producer_state import APPEND, Verdict
from raylog.actors.replication.ready import AdvanceLogStart, TruncateTo
from raylog.actors.replication.txn_state import CONTROL_ABORT, NOT_CONTROL, TxnTable

from .controller import TP, SimController
from .links import Fetcher, LinkSimulation
from .node import MirrorAnswer


class IgnoresFollowersHighWatermark(PartitionReplica):
    """Known bug: the leader advances its HW to its own durable end, ignoring the ISR."""

    def _maybe_advance_high_watermark(self, now_ms: int) -> None:
        saved = self.isr, self.alter_in_flight, self.replicas
        self.isr, self.alter_in_flight = (self.replica_id,), None
        self.replicas = (self.replica_id,)
        try:
            super()._maybe_advance_high_watermark(now_ms)
        finally:
            self.isr, self.alter_in_flight, self.replicas = saved


class SkipsTruncation(PartitionReplica):
    """Known bug: divergence is neither detected by the leader nor acted on by the follower, so
    a follower keeps a suffix no leader wrote, appends after it, and its end counts towards the
    HW."""

    def _truncate_diverged(self, diverging: EpochEndOffset) -> None:
        return None

    def _on_fetch(self, msg: FetchRequest, now_ms: int) -> None:
        super()._on_fetch(msgspec.structs.replace(msg, last_fetched_epoch=-1), now_ms)


class AppendsRetriesAgain(PartitionReplica):
    """Known bug: the leader never deduplicates; a retried batch is appended a second time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.producers.check = lambda *_: Verdict(APPEND)  # type: ignore[method-assign]


class FollowersKeepNoProducerState(PartitionReplica):
    """Known bug: followers do not record producers from replicated batch headers, so a new
    leader appends a retry of a batch its predecessor had already appended."""

    def _append(self, batch: BatchMeta, data: bytes, *, replicated: bool) -> None:
        if replicated:
            batch = msgspec.structs.replace(batch, producer_id=-1)
        super()._append(batch, data, replicated=replicated)


class AnswersDeleteRecordsAtOnce(PartitionReplica):
    """Known bug: the leader answers DeleteRecords with its own log start, without waiting for
    the followers' (Kafka's DelayedDeleteRecords skipped): a later leader may start lower."""

    @property
    def low_watermark(self) -> int:
        return self.log_start_offset


class StaysAboveALeaderThatEndsBelowIt(PartitionReplica):
    """Known bug: after an unclean election the new leader's log may end below a follower's log
    start (DeleteRecords had moved it up). The follower's fetch is out of range; it cuts its log
    at the larger of the two, its own start (nothing to cut), and fetches out of range again,
    forever: the ISR never grows back (checker 10)."""

    def _handle_out_of_range(self, msg: FetchResponse, request: FetchRequest) -> None:
        if request.fetch_offset > msg.log_end_offset:
            self._truncate(max(msg.log_end_offset, self.log_start_offset))
        else:
            super()._handle_out_of_range(msg, request)


class _IgnoresOpenTransactions(TxnTable):
    def first_unstable_offset(self) -> int | None:
        firsts = [t.first_offset for t in self._unreplicated]
        return min(firsts) if firsts else None


class _IgnoresUnreplicatedMarkers(TxnTable):
    def first_unstable_offset(self) -> int | None:
        firsts = [e.open_first_offset for e in self._entries.values() if e.is_open]
        return min(firsts) if firsts else None


class _ForgetsAborts(TxnTable):
    def update(self, batch: BatchMeta, high_watermark: int) -> None:
        super().update(batch, high_watermark)
        if batch.control_type == CONTROL_ABORT and self._aborted:
            self._aborted.pop()


class _ReopensNothing(TxnTable):
    def truncate(self, offset: int) -> None:
        before = self.open_spans()
        super().truncate(offset)
        for pid, entry in self._entries.items():
            if entry.is_open and before.get(pid) != entry.open_first_offset:
                entry.open_first_offset = entry.open_epoch = -1


class _AcceptsFencedEpochs(TxnTable):
    def check(self, producer_id: int, producer_epoch: int, *args: Any) -> tuple[int, str]:
        entry = self._entries.get(producer_id)
        if entry is not None and args[1] == NOT_CONTROL:  # a data batch: any epoch goes
            producer_epoch = max(producer_epoch, entry.producer_epoch)
        return super().check(producer_id, producer_epoch, *args)


class _WithTxnTable(PartitionReplica):
    """A replica whose transaction table is ``table``: the known bug is the table's."""

    table: type[TxnTable] = TxnTable

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log.txns.__class__ = self.table


class LsoIgnoresOpenTransactions(_WithTxnTable):
    """Known bug: the LSO counts only transactions whose marker the HW has not passed, not the
    open ones: read_committed consumers read a transaction before its outcome (G1b), and its
    records even when it is aborted later (G1a)."""

    table = _IgnoresOpenTransactions


class LsoIgnoresUnreplicatedMarkers(_WithTxnTable):
    """Known bug: a transaction counts as stable once its marker is in the log, before the
    high watermark passes the marker (Kafka's unreplicatedTxns skipped): the LSO passes
    records whose marker a failover may still cut, and whose outcome may then change."""

    table = _IgnoresUnreplicatedMarkers


class AcksMarkersBeforeReplication(PartitionReplica):
    """Known bug: a transaction marker is acknowledged once the leader's own log holds it
    (acks=1), not once the ISR does: the coordinator completes the transaction while a
    failover may still cut its marker; the transaction stays open on the new leader and
    takes the outcome of its producer's next one."""

    def _on_produce(self, msg: ProduceRequest, now_ms: int) -> None:
        if msg.control_type != NOT_CONTROL:
            msg = msgspec.structs.replace(msg, acks=1)
        super()._on_produce(msg, now_ms)


class AbortMarkerForgetsTheAbortedList(_WithTxnTable):
    """Known bug: an ABORT marker closes its transaction without entering it in the aborted
    list: fetch answers list no aborted transaction, and read_committed consumers deliver the
    aborted records (G1a)."""

    table = _ForgetsAborts


class TruncationReopensNoTransaction(_WithTxnTable):
    """Known bug: a truncation that cuts a transaction's marker but keeps its first records
    leaves the transaction closed: the LSO passes records whose outcome is undecided (the
    marker is written again later, by this leader or another) and may be ABORT."""

    table = _ReopensNothing


class AcceptsFencedProducers(_WithTxnTable):
    """Known bug: the leader takes a data batch of any producer epoch, also one older than the
    epoch a marker bumped the producer to: a fenced producer's batches land after the abort of
    its transaction and become visible with the next transaction's commit."""

    table = _AcceptsFencedEpochs


class LeaseBeforeApplying(SimController):
    """Known bug: a heartbeat extends the write lease of a broker as soon as it is unfenced or
    registered, before it applied the metadata version that says so (raylog's controller waits
    for ``lease_from_epoch``): a leader deposed behind a partition comes back still believing
    it leads, and takes writes in its old epoch."""

    def heartbeat(self, broker_id: int, *args: Any, **kwargs: Any) -> bool:
        super().heartbeat(broker_id, *args, **kwargs)
        return self.md.brokers[broker_id].state != "fenced"


class IgnoresOfflineReplicas(SimController):
    """Known bug: heartbeats' reports of failed logs are ignored, so a replica that lost its
    unsynced writes, re-created by its broker, resumes leading the epoch it led; its followers
    keep other records at the same offsets of that epoch, and a committed one is lost."""

    def heartbeat(self, *args: Any, **kwargs: Any) -> bool:
        return super().heartbeat(*args[:5], log_failed=False)


class MovesLeadersOften(SimController):
    """Workload, not a bug: each leader move first re-orders the replicas so that another ISR
    member is preferred (a reassignment that adds no replica, which completes at once), then
    runs the preferred election. The old leader is up and reachable, which preferred
    elections alone rarely bring about."""

    moved = 0  # leader moves made

    def preferred_election(self) -> bool:
        p = self.partition
        others = [b for b in p.isr if b != p.leader and b not in p.observers]
        if p.leader >= 0 and others:
            target = [others[0], *(b for b in p.replicas if b != others[0])]
            self._write(reassignment.start(self.md, {TP: target}))
        changed = super().preferred_election()
        self.moved += int(self.leader != p.leader and p.leader >= 0)
        return changed


class LeadsBeforeTheStepDown(Reconciler):
    """Known bug: a leader phase waits for no other broker's phase 1, so a new leader may take
    writes while the old one, not yet stepped down, still does."""

    def _stepped_down_first(
        self, md: ClusterMetadata, targets: dict[int, list[ReplicaSpec]]
    ) -> dict[int, set[int] | None]:
        return {b: set() for b in super()._stepped_down_first(md, targets)}


class NeverResyncs(Reconciler):
    """Known bug: a broker whose specs did not change is never pushed again, so a replica
    re-created on a running broker (its process replaced) never learns its role."""

    def _needs_push(self, link: Any, specs: list[ReplicaSpec], now_ms: int) -> bool:
        return bool(link.pushed != specs)


class CountsFailedPushesAsApplied(Reconciler):
    """Known bug: a push that failed (no answer in time, a refusal, the broker's death) counts
    as applied: the broker is not pushed again, and its lease may come before it applied."""

    def _applied(self, outcome: Outcome) -> bool:
        return True


class AcksBeforeFsync(ReadyExecutor):
    """Known bug: with flush.messages=1, an append counts as durable once written, before its
    fsync (acks=1 answered, the leader's end counted towards the HW, a follower fetching or
    acking from it): a crash loses acknowledged writes."""

    def _after_append(self, records: int, now_ms: int) -> None:
        replica = self.replica
        replica.step(LocalAppendDurable(self.port.log_end_offset, replica.generation), now_ms)
        self._request_flush()


class ReportsTheEndAtCompletion(ReadyExecutor):
    """Known bug (group commit): an fsync's completion reports the log end as it is then, so
    the appends made while it ran count as durable before the next fsync syncs them."""

    def flushed(self, end_offset: int, generation: int, now_ms: int) -> None:
        super().flushed(self.port.log_end_offset, generation, now_ms)


class ForgetsAppendsDuringAnFsync(ReadyExecutor):
    """Known bug (group commit): the appends made while an fsync runs wait for the fsync of a
    later append, which may never come: the high watermark stays below the log end."""

    def flushed(self, end_offset: int, generation: int, now_ms: int) -> None:
        self._flush_wanted = False
        super().flushed(end_offset, generation, now_ms)


class DropsTruncations(ReadyExecutor):
    """Known bug: a follower's TruncateTo is not carried out: its log keeps a suffix the
    state machine dropped, and the log no longer assigns the offsets it chooses."""

    def _apply_log_ops(self, log_ops: list[Any]) -> int:
        return super()._apply_log_ops(
            [op for op in log_ops if not (isinstance(op, TruncateTo) and not op.full)]
        )


class DropsLogStartAdvances(ReadyExecutor):
    """Known bug: DeleteRecords' AdvanceLogStart is not carried out: the log keeps the records
    below the new start, and a restarted replica starts there again."""

    def _apply_log_ops(self, log_ops: list[Any]) -> int:
        return super()._apply_log_ops([op for op in log_ops if not isinstance(op, AdvanceLogStart)])


class FetcherRemembersItsPosition(LinkSimulation):
    """Known bug (links): a link fetcher keeps the position it last had, across refusals and
    leader changes, instead of asking the leader replica where its log ends: after a failover
    to a replica whose log ends lower, it fetches from above that end and the mirror skips
    the source's batches in between."""

    remembered = -1

    def _new_fetcher(self, broker: int, leader_epoch: int) -> Fetcher:
        fetcher = super()._new_fetcher(broker, leader_epoch)
        fetcher.position = self.remembered
        return fetcher

    def _refused(self, fetcher: Fetcher) -> None:
        position = fetcher.position
        super()._refused(fetcher)
        fetcher.position = position

    def _mirror_answer(self, answer: MirrorAnswer) -> None:
        super()._mirror_answer(answer)
        if answer.result.error_code == 0:
            self.remembered = max(self.remembered, answer.log_end_offset)


class FetcherPipelinesAppends(LinkSimulation):
    """Known bug (links): a link fetcher does not wait for an append's answer: it fetches on
    from the end of the batches it sent, so appends overlap and may land out of order (the
    later one above the log end: a gap where the source holds batches)."""

    def _append(
        self, fetcher: Fetcher, batches: tuple[RecordBatch, ...], source_log_start: int = -1
    ) -> None:
        super()._append(fetcher, batches, source_log_start)
        if batches:
            fetcher.waiting = ""
            fetcher.position = batches[-1].meta.next_offset


class IgnoresSyncLinksForAcks(PartitionReplica):
    """Known bug (sync links): the leader acknowledges acks=all once the HW covers a write,
    whatever its in-sync sync links hold (checker 20)."""

    def _sync_links_hold(self, end_offset: int) -> bool:
        return True


class CountsACaughtUpLinkAtTheHw(PartitionReplica):
    """Known bug (sync links): a report whose end reaches the HW of the link's previous report
    (Kafka's rule: caught up as of then) is counted as the link holding everything below the
    HW now, so a late or repeated report carries the link's end past the destination's
    (checker 20)."""

    def _on_sync_link_progress(self, msg: SyncLinkProgress, now_ms: int) -> None:
        state = self.sync_links.get(msg.link)
        if (
            state is not None
            and msg.durable_end_offset >= state.progress.last_fetch_leader_log_end_offset >= 0
        ):
            end = max(msg.durable_end_offset, self.high_watermark)
            msg = msgspec.structs.replace(msg, durable_end_offset=end)
        super()._on_sync_link_progress(msg, now_ms)


class TakesReportsOfARecreatedLink(PartitionReplica):
    """Known bug (sync links): reports are matched to links by name alone, so the reports of a
    deleted link's destination (late, or from its gateway that has not heard) count for the
    link created again under its name, whose destination starts empty (checker 20)."""

    def _on_sync_link_progress(self, msg: SyncLinkProgress, now_ms: int) -> None:
        state = self.sync_links.get(msg.link)
        if state is not None:
            msg = msgspec.structs.replace(msg, link_id=state.link_id)
        super()._on_sync_link_progress(msg, now_ms)
