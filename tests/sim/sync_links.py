"""Synchronous cluster links in the simulator (KIP-986 sync mode): the partition is the SOURCE.

A run whose ``Scenario.simulation_class`` is :class:`SyncLinkSimulation` keeps everything
cluster.py simulates (replicas, controller, crashes, leader changes, lost, duplicated and
delayed messages, clients' writes) and gives every leader a synchronous link
(``BecomeLeader.sync_links``, as production's controller will: the simulated controller's
pushes get the link set added on the way to the broker). Its DESTINATION is a model
(:class:`Destination`), on the rules actors/replication/sync_links.py relies on:

- it reads the partition as a consumer does (the sim's consumer fetch path, so below the HW
  of the replica that answers), from the node its metadata says leads (that view follows the
  controller's with a delay, ``VIEW_REFRESH`` per tick), restarting at the log start after
  OFFSET_OUT_OF_RANGE;
- it "appends durably" what a fetch returned after a random delay (its mirror's acks=all
  append), and only then fetches again: its position IS its durable end;
- after each append, and after some empty fetches, it reports its durable end
  (``SyncLinkProgress``) to the node it believes leads, over the lossy network (lost,
  duplicated, delayed) and now and then once more much later (a stale report);
- now and then it stalls for longer than link.sync.lag.time.max.ms (the leader must take the
  link out of sync and acknowledge without it), then resumes;
- now and then the link is deleted and created again under the same name (a new link id, a
  new empty destination): the controller sends ``SyncLinksChanged`` (lost sometimes; its
  resyncs' BecomeLeader carry the set too), and the old destination goes on fetching and
  reporting for a while, as a gateway that has not heard yet.

Checkers (checkers.py):
20. Every write acknowledged with acks=all by a leader that counted the link in sync at that
   moment is then in the durable log of that link's destination (same batch at the same
   offset), unless the destination skipped it because the source had deleted it
   (DeleteRecords) before the link fetched there.
21. Healed (checker 10's settling): the link is back in sync on the leader, its destination
   holding everything below the leader's HW.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from raylog.actors.replication.messages import (
    CONSUMER_REPLICA_ID,
    BecomeLeader,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    RecordBatch,
    SyncLinkProgress,
    SyncLinkRef,
    SyncLinksChanged,
)
from raylog.actors.replication.ready import ProduceResult
from raylog.storage.errors import OffsetOutOfRangeError

from .checkers import SimViolation
from .cluster import Simulation
from .node import CLIENT, CONTROLLER, SimNode
from .scenario import Scenario

LINK = "sim-sync-link"
DESTINATION = -300  # the destination's gateway, as a network address
LINK_TICK_MS = 20
LINK_LAG_MS = 400  # link.sync.lag.time.max.ms, scaled (replica.lag.time.max.ms is 300)
VIEW_REFRESH = 0.3  # per tick: the destination's metadata catches up with the controller's
FETCH_TIMEOUT_MS = 400  # a fetch unanswered for this long is sent again
FETCH_BYTES_MIN, FETCH_BYTES_MAX = 100, 1_500
DURABLE_MAX_MS = 60  # the destination's acks=all append of what a fetch returned
EMPTY_REPORT = 0.5  # an empty fetch is followed by a report of the unchanged end
REPORT_LATE = 0.05  # a report delivered once more, up to LATE_MAX_MS later
LATE_MAX_MS = 1_500
STALL = 0.01  # per tick: the destination stalls for longer than the lag time
STALL_MIN_MS, STALL_MAX_MS = LINK_LAG_MS * 3 // 2, LINK_LAG_MS * 4
RECREATE = 0.006  # per tick: the link is deleted and created again under its name
STALE_DESTINATION_MAX_MS = 800  # the old destination goes on this long at most
CHANGE_LOST = 0.3  # the controller's SyncLinksChanged does not arrive

STATS = (
    "sync_acks_held",  # acks=all acknowledged while the link was in sync (checker 20 ran)
    "sync_acks_out_of_sync",  # acknowledged while the leader had it out of sync
    "sync_reports",
    "sync_reports_late",
    "sync_stalls",
    "sync_recreated",
    "sync_restarts",  # OFFSET_OUT_OF_RANGE: restarted at the log start
)


@dataclass(eq=False)
class Destination:
    """One link's destination: its mirror's durable log, and its link's fetch loop."""

    ref: SyncLinkRef
    position: int = 0  # its durable end: where it fetches from next
    durable: dict[int, bytes] = field(default_factory=dict)  # base offset -> batch data
    floor: int = 0  # the highest log start it restarted at (below it: deleted at the source)
    waiting: str = ""  # "fetch": a fetch in flight, "append": its durable append; "": neither
    since_ms: int = 0
    request_id: int = -1
    stalled_until_ms: int = 0
    stop_at_ms: int | None = None  # the link was re-created: this one is going away


class SyncLinkSimulation(Simulation):
    """A simulation whose partition has a synchronous link (see the module docstring)."""

    def __init__(self, seed: int, scenario: Scenario | None = None, trace: bool = False) -> None:
        super().__init__(seed, scenario, trace)
        for key in STATS:
            self.stats.setdefault(key, 0)
        self.config = msgspec.structs.replace(self.config, link_sync_lag_time_max_ms=LINK_LAG_MS)
        self.link_version = 0
        self.links_made = 0
        self.destination = self._new_destination()
        self.destinations: dict[str, Destination] = {self.destination.ref.link_id: self.destination}
        self.active = [self.destination]  # those still fetching (an old one for a while)
        self.view = -1  # the node the destinations believe leads
        self.fetches: dict[int, Destination] = {}  # request id -> its destination
        self.acks_all: dict[int, tuple[bytes, int]] = {}  # request id -> (data, record count)
        for node in self.nodes.values():
            node.replica.reconfigure(self.config)
            self._hook(node)

    def _new_destination(self) -> Destination:
        self.links_made += 1
        link_id = f"{self.links_made:032x}"
        return Destination(SyncLinkRef(LINK, link_id))

    def _hook(self, node: SimNode) -> None:
        """What production's controller (the set of links in BecomeLeader) and a checker at
        the acknowledgement (20) add to ``node``."""
        apply, complete = node.apply, node.complete_produce

        def apply_with_links(request: Any) -> Any:
            command = apply(request)
            if isinstance(command, BecomeLeader):
                command = msgspec.structs.replace(
                    command,
                    sync_links=(self.destination.ref,),
                    sync_links_version=self.link_version,
                )
            return command

        def complete_checked(result: ProduceResult) -> None:
            self._check_acknowledged(node, result)
            complete(result)

        node.apply = apply_with_links  # type: ignore[method-assign]
        node.complete_produce = complete_checked  # type: ignore[method-assign]

    def run(self) -> Simulation:
        self._schedule(2, "sync_tick")
        return super().run()

    # --- the controller's side: the link re-created -------------------------------------------

    def _recreate(self) -> None:
        old = self.destination
        old.stop_at_ms = self.now_ms + self.rng.randint(0, STALE_DESTINATION_MAX_MS)
        self.destination = self._new_destination()
        self.destinations[self.destination.ref.link_id] = self.destination
        self.active.append(self.destination)
        self.link_version += 1
        self.stats["sync_recreated"] += 1
        if self.leader >= 0 and self.rng.random() >= CHANGE_LOST:
            change = SyncLinksChanged(
                self.controller.controller_epoch,
                self.leader_epoch,
                self.link_version,
                (self.destination.ref,),
            )
            self._send(CONTROLLER, self.leader, change)

    # --- the destinations -----------------------------------------------------------------------

    def _on_sync_tick(self) -> None:
        self._schedule(LINK_TICK_MS, "sync_tick")
        if self.rng.random() < VIEW_REFRESH:
            self.view = self.leader
        if not self.settling:
            if self.rng.random() < RECREATE:
                self._recreate()
            if self.rng.random() < STALL:
                until = self.now_ms + self.rng.randint(STALL_MIN_MS, STALL_MAX_MS)
                self.destination.stalled_until_ms = until
                self.stats["sync_stalls"] += 1
        for destination in list(self.active):
            self._drive(destination)

    def _drive(self, destination: Destination) -> None:
        if destination.stop_at_ms is not None and self.now_ms >= destination.stop_at_ms:
            self.active.remove(destination)
            return
        if self.now_ms < destination.stalled_until_ms or self.view < 0:
            return
        if destination.waiting == "fetch" and self.now_ms - destination.since_ms > FETCH_TIMEOUT_MS:
            destination.waiting = ""  # the same position again
        if destination.waiting:
            return
        request_id = self.next_request_id
        self.next_request_id += 1
        self.fetches[request_id] = destination
        destination.waiting, destination.since_ms = "fetch", self.now_ms
        destination.request_id = request_id
        max_bytes = self.rng.randint(FETCH_BYTES_MIN, FETCH_BYTES_MAX)
        fetch = FetchRequest(
            CONSUMER_REPLICA_ID, request_id, -1, destination.position, -1, max_bytes
        )
        self._send(CLIENT, self.view, fetch, client=True)

    def _fetched(self, destination: Destination, answer: FetchResponse) -> None:
        if destination.waiting != "fetch" or destination.request_id != answer.request_id:
            return  # one it gave up waiting for
        destination.waiting = ""
        if answer.error_code == OffsetOutOfRangeError.error_code:
            if destination.position < answer.log_start_offset:
                # Deleted at the source: the mirror follows its log start (mirror.py).
                destination.position = answer.log_start_offset
                destination.floor = max(destination.floor, destination.position)
                self.stats["sync_restarts"] += 1
            return
        if answer.error_code != 0:
            return
        batches = [b for b in answer.batches if b.meta.next_offset > destination.position]
        if not batches:
            if self.rng.random() < EMPTY_REPORT:
                self._report(destination)
            return
        destination.waiting, destination.since_ms = "append", self.now_ms
        delay = self.rng.randint(1, DURABLE_MAX_MS)
        self._schedule(delay, "sync_durable", destination, tuple(batches))

    def _on_sync_durable(self, destination: Destination, batches: tuple[RecordBatch, ...]) -> None:
        """The destination's mirror has ``batches`` on its whole ISR: its link goes on."""
        for batch in batches:
            destination.durable[batch.meta.base_offset] = bytes(batch.data)
        destination.position = batches[-1].meta.next_offset
        destination.waiting = ""
        self._report(destination)

    def _report(self, destination: Destination) -> None:
        if self.view < 0:
            return
        ref = destination.ref
        report = SyncLinkProgress(ref.name, ref.link_id, destination.position)
        self.stats["sync_reports"] += 1
        self._send(DESTINATION, self.view, report)
        if not self.settling and self.rng.random() < REPORT_LATE:
            incarnation = self.nodes[self.view].incarnation
            late_ms = self.rng.randint(1, LATE_MAX_MS)
            self._schedule(late_ms, "deliver", DESTINATION, self.view, incarnation, report)
            self.stats["sync_reports_late"] += 1

    # --- checker 20 -----------------------------------------------------------------------------

    def _on_deliver(self, src: int, dst: int, incarnation: int, message: Any) -> None:
        if isinstance(message, ProduceRequest) and message.acks == -1:
            self.acks_all[message.request_id] = (message.data, message.record_count)
        super()._on_deliver(src, dst, incarnation, message)

    def _check_acknowledged(self, node: SimNode, result: ProduceResult) -> None:
        """Checker 20, as ``node``'s leader acknowledges ``result``."""
        written = self.acks_all.get(result.request_id)
        if written is None or result.error_code != 0:
            return
        data, count = written
        state = node.replica.sync_links.get(LINK)
        if state is None or not state.in_sync:
            self.stats["sync_acks_out_of_sync"] += 1
            return
        self.stats["sync_acks_held"] += 1
        destination = self.destinations[state.link_id]
        base = result.base_offset
        if destination.durable.get(base) == data or base + count <= destination.floor:
            return
        raise SimViolation(
            f"leader {node.node_id} acknowledged acks=all {data!r} at {base} with link "
            f"{state.link_id[-4:]} in sync (its end {state.end_offset}), but that destination "
            f"holds {destination.durable.get(base)!r} there (durable end {destination.position})"
        )

    def _client_receive(self, src: int, message: Any) -> None:
        if isinstance(message, FetchResponse) and message.request_id in self.fetches:
            self._fetched(self.fetches.pop(message.request_id), message)
            return
        super()._client_receive(src, message)

    # --- checker 21 -----------------------------------------------------------------------------

    def _unconverged(self) -> str:
        return super()._unconverged() or self._link_unconverged()

    def _link_unconverged(self) -> str:
        """Checker 21 once the partition converged ("": the link is back in sync)."""
        replica = self.nodes[self.leader].replica
        state = replica.sync_links.get(LINK)
        current = self.destination.ref.link_id
        if state is None or state.link_id != current:
            return f"the leader's sync links {replica.sync_links}, the link is {current}"
        if not state.in_sync:
            return f"the link is out of sync: {replica.sync_links_status()}"
        if self.destination.position != replica.high_watermark:
            return (
                f"the destination ends at {self.destination.position}, the HW is "
                f"{replica.high_watermark}"
            )
        return ""
