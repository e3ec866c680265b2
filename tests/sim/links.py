"""Cross-cluster links in the simulator (KIP-986): the partition is the MIRROR of a source's.

A run whose ``Scenario.simulation_class`` is :class:`LinkSimulation` keeps everything cluster.py
simulates on the destination (its replicas, controller, crashes, leader changes, lost,
duplicated and delayed messages, disk faults) and makes its partition a mirror: the
controller's metadata holds an active link and marks the topic its mirror, so every leader is
started with ``BecomeLeader.mirror_link`` (production's reconciler decides it). Clients' writes
go on and must all be refused. The records come from:

- the SOURCE (:class:`SourceLog`): a seeded, pre-generated log as a source partition holds it:
  gaps between batches (compaction), plain batches, idempotent ones of several producers with
  sequences and epoch bumps, transactional ones closed by COMMIT or ABORT markers, a log start
  above 0 sometimes. It grows during the run, and now and then its log start moves up
  (retention; sometimes inside a batch).
- LINK FETCHERS (:class:`Fetcher`), on gateway/links/mirrors.py's rules: a fetcher runs on the
  broker its metadata says leads, under that leader epoch; its metadata follows the
  controller's with a delay (``METADATA_REFRESH`` per tick), and the gateway of a deposed
  leader runs its fetcher a while longer (two at once). The fetch position is the replica's
  log end: asked with an empty ``MirrorAppendRequest``, then taken from every append's answer
  (``node.MirrorAnswer``), never kept across a refusal. It fetches from there with a random
  byte budget (the answer sometimes ends inside a batch, which the shell's
  ``mirrored_batches`` drops, and now and then holds no whole batch at all), continues at the
  source's log start after OFFSET_OUT_OF_RANGE, appends with its leader epoch, one fetch and
  one append in flight, and on any refusal or silence starts over.

Faults of the link: source answers and append answers lost, appends delivered twice (the copy
late, possibly after a leader change: a stale append), stale fetchers. Every replica takes
mirror appends only under a write lease, as the replica actor does.

Checkers (checkers.py):
17. Every replica's log below its HW is the source's: each batch equal to the source's batch
   at its base offset (so in order, and each once), with a gap only where the source has one
   or where every source batch it skips lay below the source's log start when a fetch returned
   the batch after the gap. Consumers (a read_committed one too: checkers 13-15) pass only such
   gaps; a client's write is never acknowledged.
18. Healed (checker 10's settling): the mirror ends where the source does and holds every batch
   the source retains; when the source retains no batch above the mirror's end (its log start
   is its end), the mirror's log holds nothing on every replica instead (it never starts over
   above its HW: its end moves up with the source's next batch).
19. Then every replica's producer state, open transactions, aborted list and LSO equal a
   rebuild from its batches, and the aborted list and LSO a model of Kafka's rules over them.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from typing import Any

import msgspec

from raylog.actors.control import link_changes
from raylog.actors.control.links import ClusterLink, MirrorInfo
from raylog.actors.control.metadata import ClusterMetadata
from raylog.actors.replication.messages import BatchMeta, MirrorAppendRequest, RecordBatch
from raylog.actors.replication.ready import DeleteRecordsResult, ProduceResult
from raylog.actors.replication.replica_log import ReplicaLog
from raylog.actors.replication.replica_state import MAX_BATCHES_PER_MESSAGE
from raylog.actors.replication.txn_state import CONTROL_ABORT, NOT_CONTROL

from .checkers import Checkers, SimViolation
from .cluster import Consumer, Simulation
from .controller import TOPIC
from .node import CLIENT, MIRROR_REQUEST_IDS, MirrorAnswer, SimNode
from .scenario import Scenario

LINK = "sim-link"
LINK_TICK_MS = 20
SOURCE_BATCHES_MIN, SOURCE_BATCHES_MAX = 60, 220  # pre-generated
SOURCE_GROW_MS = 40  # the source takes a batch or a few this often
SOURCE_START_ABOVE_0 = 0.4  # the source's log starts above offset 0
COMPACTED_GAP = 0.15  # a gap (removed batches) before a source batch
TXN_ABORT = 0.3
RETENTION = 0.02  # per tick: the source's log start moves up
METADATA_REFRESH = 0.3  # per tick: the fetchers' metadata catches up with the controller's
STALE_FETCHER_MAX_MS = 800  # a deposed leader's gateway runs its fetcher this long at most
SOURCE_LATENCY_MAX_MS = 30
SOURCE_TIMEOUT_MS = 500  # a source fetch unanswered for this long is tried again
APPEND_TIMEOUT_MS = 1_000  # the mirror append's timeout_ms
ANSWER_TIMEOUT_MS = 2_500  # an append unanswered for this long: start over (ask the position)
ERROR_BACKOFF_MS = 100
FETCH_BYTES_MIN, FETCH_BYTES_MAX = 60, 700  # link.fetch.partition.max.bytes, scaled
CUT_MID_BATCH = 0.3  # the answer ends inside a batch (mirrored_batches drops it)
NO_WHOLE_BATCH = 0.05  # the answer holds only part of its first batch
SOURCE_ANSWER_LOST = 0.03
APPEND_ANSWER_LOST = 0.05
APPEND_DUPLICATED = 0.05  # delivered twice, the copy up to LATE_MAX_MS later
LATE_MAX_MS = 1_500
HEADER_BYTES = 61  # a v2 batch header, for the byte budgets

STATS = (
    "link_fetches",
    "link_appends",
    "link_batches_appended",
    "link_refused",
    "link_answers_lost",
    "link_duplicated",
    "link_cut_mid_batch",
    "link_out_of_range",
    "link_retention",
    "link_fetchers",
    "link_gaps",
    "txn_read_committed",  # by the read_committed consumer (cluster.py)
)


def mirror_metadata(md: ClusterMetadata) -> ClusterMetadata:
    """``md`` with an active link whose mirror is the simulated topic."""
    link = ClusterLink(name=LINK, link_id="1" * 32, bootstrap=("127.0.0.1:9092",))
    md = link_changes.create_link(md, link)
    topic = msgspec.structs.replace(md.topics[TOPIC], mirror=MirrorInfo(link=LINK))
    return msgspec.structs.replace(md, topics={**md.topics, TOPIC: topic})


class SourceLog:
    """The source partition: pre-generated batches (offset order), of which the first
    ``visible`` exist now, from ``log_start`` on."""

    def __init__(
        self, rng: random.Random, seed: int, checkers: Checkers, start_above_0: bool
    ) -> None:
        self.batches: list[RecordBatch] = []
        above_0 = start_above_0 and rng.random() < SOURCE_START_ABOVE_0
        offset = rng.randint(1, 40) if above_0 else 0
        self.log_start = offset
        idempotent = {pid: [0, 0] for pid in (3000, 3001, 3002)}  # pid -> [epoch, sequence]
        txn = {pid: [0, 0, 0, False] for pid in (4000, 4001)}  # [epoch, seq, txn, open]
        for _ in range(rng.randint(SOURCE_BATCHES_MIN, SOURCE_BATCHES_MAX)):
            if self.batches and rng.random() < COMPACTED_GAP:
                offset += rng.randint(1, 5)
            count = rng.randint(1, 3)
            choice = rng.random()
            data = f"s{seed}src{offset}"
            if choice < 0.3:
                meta = BatchMeta(offset, count, 0, 0)
            elif choice < 0.6:
                pid = rng.choice(list(idempotent))
                state = idempotent[pid]
                if rng.random() < 0.05:
                    state[:] = [state[0] + 1, 0]
                meta = BatchMeta(offset, count, 0, 0, pid, state[0], state[1])
                state[1] += count
                data += f"/i{pid}.{state[0]}.{meta.base_sequence}"
            else:
                pid = rng.choice(list(txn))
                epoch, seq, number, is_open = txn[pid]
                if is_open and rng.random() < 0.35:  # the coordinator writes its marker
                    commit = rng.random() >= TXN_ABORT
                    control = 1 if commit else CONTROL_ABORT
                    meta = BatchMeta(offset, 1, 0, 0, pid, epoch, -1, True, control, number)
                    data += f"/m{pid}.{number}{'C' if commit else 'A'}"
                    checkers.marker_of[data.encode()] = ((pid, number), commit)
                    txn[pid][3] = False
                else:
                    if not is_open:
                        number += 1
                        if rng.random() < 0.1:
                            epoch, seq = epoch + 1, 0
                    meta = BatchMeta(offset, count, 0, 0, pid, epoch, seq, True)
                    data += f"/t{pid}.{number}.{seq}"
                    checkers.txn_of[data.encode()] = (pid, number)
                    txn[pid] = [epoch, seq + count, number, True]
            raw = data.encode()
            meta = msgspec.structs.replace(meta, size_bytes=HEADER_BYTES + len(raw))
            self.batches.append(RecordBatch(meta, memoryview(raw)))
            offset = meta.next_offset
        self.bases = [b.meta.base_offset for b in self.batches]
        self.visible = rng.randint(0, len(self.batches) // 3)
        # base offset -> the highest log start any fetch that returned that batch saw
        self.served_floor: dict[int, int] = {}

    @property
    def end(self) -> int:
        """The log end offset (the source's high watermark: it serves only what it committed)."""
        return self.batches[self.visible - 1].meta.next_offset if self.visible else self.log_start

    def _index(self, offset: int) -> int:
        """Index of the first batch ending above ``offset``."""
        index = bisect.bisect_right(self.bases, offset) - 1
        if index < 0 or self.batches[index].meta.next_offset <= offset:
            index += 1
        return index

    def batch_at(self, base_offset: int) -> RecordBatch | None:
        index = bisect.bisect_left(self.bases, base_offset, hi=self.visible)
        if index < self.visible and self.bases[index] == base_offset:
            return self.batches[index]
        return None

    def fetch(self, position: int, max_bytes: int) -> list[RecordBatch] | None:
        """A Fetch at ``position``: whole batches from the one holding it, within ``max_bytes``
        but at least one (KIP-74); None: OFFSET_OUT_OF_RANGE."""
        if not self.log_start <= position <= self.end:
            return None
        out: list[RecordBatch] = []
        size = 0
        for batch in self.batches[self._index(position) : self.visible]:
            if len(out) >= MAX_BATCHES_PER_MESSAGE or (
                out and size + batch.meta.size_bytes > max_bytes
            ):
                break
            out.append(batch)
            size += batch.meta.size_bytes
            floor = self.served_floor.get(batch.meta.base_offset, -1)
            self.served_floor[batch.meta.base_offset] = max(floor, self.log_start)
        return out

    def legal_gap(self, start: int, end: int) -> bool:
        """Whether a log may skip offsets [start, end) before the source batch at ``end``:
        every source batch there lay below the log start when a fetch returned that one."""
        if start >= end:
            return False
        floor = self.served_floor.get(end, -1)
        index = self._index(start)
        while index < len(self.batches) and self.bases[index] < end:
            if self.batches[index].meta.next_offset > floor:
                return False
            index += 1
        return True

    def check(self, batch: RecordBatch, previous_end: int, who: str) -> None:
        """Checker 17 for one batch of a mirror log, after one that ends at ``previous_end``."""
        meta = batch.meta
        held = self.batch_at(meta.base_offset)
        if (
            held is None
            or bytes(held.data) != bytes(batch.data)
            or held.meta != msgspec.structs.replace(meta, leader_epoch=0)
        ):
            raise SimViolation(f"{who} holds {meta} {bytes(batch.data)!r}; the source: {held}")
        if previous_end < meta.base_offset and not self.legal_gap(previous_end, meta.base_offset):
            raise SimViolation(
                f"{who} skips offsets [{previous_end}, {meta.base_offset}), which the source "
                f"held above its log start when it served the batch after them"
            )


@dataclass(eq=False)
class Fetcher:
    """One gateway's link fetcher of the mirror partition, under one leader epoch."""

    broker: int
    broker_incarnation: int
    leader_epoch: int
    position: int = -1  # the replica's log end: the next source offset (-1: ask)
    waiting: str = ""  # "source": a fetch in flight, "append": an append; "": neither
    since_ms: int = 0
    request_id: int = -1
    retry_at_ms: int = 0
    stop_at_ms: int | None = None  # its gateway learned it leads no more


class LinkSimulation(Simulation):
    """A simulation whose partition mirrors a :class:`SourceLog` (see the module docstring).

    Its source may start above 0, and its log start moves up, past the mirror's end too (the
    leader then empties its log on every ISR member before it takes anything above the gap:
    ``actors/replication/mirror.py``)."""

    source_starts_above_0 = True
    retention_past_the_mirror = True

    def __init__(self, seed: int, scenario: Scenario | None = None, trace: bool = False) -> None:
        super().__init__(seed, scenario, trace)
        for key in STATS:
            self.stats.setdefault(key, 0)
        self.source = SourceLog(self.rng, seed, self.checkers, self.source_starts_above_0)
        self.checkers.legal_gap = self.source.legal_gap
        self.controller.md = mirror_metadata(self.controller.md)
        self.consumers.append(Consumer(read_committed=True))
        for node in self.nodes.values():
            node.disk.gaps = True
        self.fetchers: list[Fetcher] = []
        self.view = (-1, -1)  # the fetchers' metadata: (leader, leader epoch)
        self.next_mirror_request = MIRROR_REQUEST_IDS
        self.mirror_requests: dict[int, Fetcher] = {}
        # Checker 17's progress per replica: (incarnation, log start, batches checked, the
        # last one's base offset).
        self.checked: dict[int, tuple[int, int, int, int]] = {}

    def run(self) -> Simulation:
        self._schedule(3, "link_tick")
        self._schedule(SOURCE_GROW_MS, "link_grow")
        return super().run()

    # --- the source -----------------------------------------------------------------------------

    def _on_link_grow(self) -> None:
        if self.settling:
            return
        self._schedule(self.rng.randint(1, 2 * SOURCE_GROW_MS), "link_grow")
        source = self.source
        source.visible = min(len(source.batches), source.visible + self.rng.randint(1, 3))

    def _retention(self) -> None:
        """The source's log start moves up (retention, or DeleteRecords there)."""
        source = self.source
        highest = source.end
        if not self.retention_past_the_mirror:
            highest = min(highest, *(n.disk.end_offset for n in self.nodes.values()))
        if highest > source.log_start:
            source.log_start = self.rng.randint(source.log_start + 1, highest)
            self.stats["link_retention"] += 1

    # --- the fetchers ---------------------------------------------------------------------------

    def _on_link_tick(self) -> None:
        self._schedule(LINK_TICK_MS, "link_tick")
        if not self.settling and self.rng.random() < RETENTION:
            self._retention()
        if self.rng.random() < METADATA_REFRESH:
            self._learn_leader()
        for fetcher in list(self.fetchers):
            self._drive(fetcher)

    def _learn_leader(self) -> None:
        """The gateways' metadata catches up: a fetcher starts on the leader's broker; those
        of other brokers or epochs stop, each when its own gateway learns it."""
        view = (self.leader, self.leader_epoch)
        if view == self.view:
            return
        self.view = view
        for fetcher in self.fetchers:
            if fetcher.stop_at_ms is None and (fetcher.broker, fetcher.leader_epoch) != view:
                fetcher.stop_at_ms = self.now_ms + self.rng.randint(0, STALE_FETCHER_MAX_MS)
        if view[0] >= 0 and self.nodes[view[0]].alive:
            self.fetchers.append(self._new_fetcher(*view))
            self.stats["link_fetchers"] += 1

    def _new_fetcher(self, broker: int, leader_epoch: int) -> Fetcher:
        return Fetcher(broker, self.nodes[broker].broker_incarnation, leader_epoch)

    def _refused(self, fetcher: Fetcher) -> None:
        """After a refusal or silence: ask the replica where its log ends, after a backoff."""
        fetcher.position = -1
        fetcher.retry_at_ms = self.now_ms + ERROR_BACKOFF_MS

    def _drive(self, fetcher: Fetcher) -> None:
        node = self.nodes[fetcher.broker]
        stopped = fetcher.stop_at_ms is not None and self.now_ms >= fetcher.stop_at_ms
        if stopped or not node.alive or node.broker_incarnation != fetcher.broker_incarnation:
            self.fetchers.remove(fetcher)  # its gateway stopped it, or died with its broker
            return
        waited_ms = self.now_ms - fetcher.since_ms
        if fetcher.waiting == "append" and waited_ms > ANSWER_TIMEOUT_MS:
            fetcher.waiting = ""
            self._refused(fetcher)
        elif fetcher.waiting == "source" and waited_ms > SOURCE_TIMEOUT_MS:
            fetcher.waiting = ""  # the same position again
        if fetcher.waiting or self.now_ms < fetcher.retry_at_ms:
            return
        if fetcher.position < 0:
            self._append(fetcher, ())
            return
        fetcher.waiting, fetcher.since_ms = "source", self.now_ms
        self.stats["link_fetches"] += 1
        if not self.settling and self.rng.random() < SOURCE_ANSWER_LOST:
            return
        answer = self.source.fetch(
            fetcher.position, self.rng.randint(FETCH_BYTES_MIN, FETCH_BYTES_MAX)
        )
        delay = self.rng.randint(1, SOURCE_LATENCY_MAX_MS)
        self._schedule(
            delay, "link_source_answer", fetcher, fetcher.since_ms, answer, self.source.log_start
        )

    def _on_link_source_answer(
        self, fetcher: Fetcher, since_ms: int, answer: list[RecordBatch] | None, log_start: int
    ) -> None:
        if fetcher not in self.fetchers or (fetcher.waiting, fetcher.since_ms) != (
            "source",
            since_ms,
        ):
            return  # a stopped fetcher's, or one it gave up waiting for
        fetcher.waiting = ""
        if answer is None:  # OFFSET_OUT_OF_RANGE: ListOffsets, as mirrors.py's _out_of_range
            self.stats["link_out_of_range"] += 1
            if fetcher.position > self.source.end:
                raise SimViolation(
                    f"the mirror ends at {fetcher.position}, above the source's end "
                    f"{self.source.end}: it holds offsets the source never had"
                )
            fetcher.position = max(fetcher.position, self.source.log_start)
            return
        if answer and self.rng.random() < NO_WHOLE_BATCH:
            answer = []  # only part of the first batch came: nothing whole to append
            self.stats["link_cut_mid_batch"] += 1
        elif len(answer) > 1 and self.rng.random() < CUT_MID_BATCH:
            answer = answer[:-1]  # the last batch came in part, which the shell drops
            self.stats["link_cut_mid_batch"] += 1
        if answer or self.rng.random() < 0.5:
            self._append(fetcher, tuple(answer), log_start)

    def _append(
        self, fetcher: Fetcher, batches: tuple[RecordBatch, ...], source_log_start: int = -1
    ) -> None:
        """The replica's ``mirror_append`` (acks=1, as the gateway calls it) of ``batches``
        restamped with the fetcher's leader epoch, with the source's log start as the Fetch
        answered it; none: where does the log end?"""
        request_id = self.next_mirror_request
        self.next_mirror_request += 1
        stamped = tuple(
            RecordBatch(msgspec.structs.replace(b.meta, leader_epoch=fetcher.leader_epoch), b.data)
            for b in batches
        )
        request = MirrorAppendRequest(
            request_id, fetcher.leader_epoch, 1, APPEND_TIMEOUT_MS, stamped, source_log_start
        )
        self.mirror_requests[request_id] = fetcher
        fetcher.waiting, fetcher.since_ms, fetcher.request_id = "append", self.now_ms, request_id
        self.stats["link_appends"] += 1
        self._send(CLIENT, fetcher.broker, request, client=True)
        if batches and not self.settling and self.rng.random() < APPEND_DUPLICATED:
            incarnation = self.nodes[fetcher.broker].incarnation
            late_ms = self.rng.randint(1, LATE_MAX_MS)
            self._schedule(late_ms, "deliver", CLIENT, fetcher.broker, incarnation, request)
            self.stats["link_duplicated"] += 1

    def _mirror_answer(self, answer: MirrorAnswer) -> None:
        result = answer.result
        fetcher = self.mirror_requests.get(result.request_id)
        if fetcher is None or fetcher.request_id != result.request_id:
            return  # a duplicate's answer, or one the fetcher gave up waiting for
        if fetcher not in self.fetchers or fetcher.waiting != "append":
            return
        if not self.settling and self.rng.random() < APPEND_ANSWER_LOST:
            self.stats["link_answers_lost"] += 1
            return  # it times out, and starts over
        del self.mirror_requests[result.request_id]
        fetcher.waiting = ""
        if result.error_code:
            self.stats["link_refused"] += 1
            self._refused(fetcher)
            return
        self.stats["link_batches_appended"] += result.appended
        fetcher.position = answer.log_end_offset

    # --- the hooks into cluster.py --------------------------------------------------------------

    def _on_deliver(self, src: int, dst: int, incarnation: int, message: Any) -> None:
        node = self.nodes.get(dst)
        if (
            isinstance(message, MirrorAppendRequest)
            and node is not None
            and node.alive
            and node.incarnation == incarnation
            and not node.log_failed
            and self._clock(node) >= node.lease_until_ms
        ):
            self._refuse_without_lease(node, message)  # as the replica actor's mirror_append
            return
        super()._on_deliver(src, dst, incarnation, message)

    def _client_receive(self, src: int, message: Any) -> None:
        if isinstance(message, MirrorAnswer):
            self._mirror_answer(message)
            return
        if isinstance(message, ProduceResult | DeleteRecordsResult) and message.error_code == 0:
            raise SimViolation(f"replica {src} took a client's write on a mirror: {message}")
        super()._client_receive(src, message)

    def _check_after_step(self) -> None:
        super()._check_after_step()
        for node in self.nodes.values():
            if node.alive:
                self._check_mirrored(node)

    def _check_mirrored(self, node: SimNode) -> None:
        """Checker 17 on the batches below ``node``'s HW not yet checked."""
        disk, hw = node.disk, node.replica.high_watermark
        batches = disk.batches
        incarnation, log_start, count, last_base = self.checked.get(node.node_id, (-1, -1, 0, -1))
        if (incarnation, log_start) != (node.incarnation, disk.log_start) or not (
            count <= len(batches)
            and (count == 0 or batches[count - 1].meta.base_offset == last_base)
        ):
            count = 0
        previous_end = batches[count - 1].meta.next_offset if count else disk.log_start
        while count < len(batches) and batches[count].meta.next_offset <= hw:
            batch = batches[count]
            if batch.meta.base_offset > previous_end:
                self.stats["link_gaps"] += 1
            self.source.check(batch, previous_end, f"replica {node.node_id} (HW {hw})")
            previous_end = batch.meta.next_offset
            count += 1
        last_base = batches[count - 1].meta.base_offset if count else -1
        self.checked[node.node_id] = (node.incarnation, disk.log_start, count, last_base)

    def _unconverged(self) -> str:
        return super()._unconverged() or self._mirror_unconverged()

    def _mirror_unconverged(self) -> str:
        """Checker 18 once the partition converged ("": the mirror caught up), then 19."""
        leader = self.nodes[self.leader]
        source = self.source
        logs = {n.node_id: (n.disk.log_start, n.disk.end_offset) for n in self.nodes.values()}
        behind = mirror_behind(source.log_start, source.end, leader.node_id, logs)
        if behind:
            return behind
        held = {b.meta.base_offset for b in leader.disk.batches}
        retained = source.batches[source._index(source.log_start) : source.visible]
        missing = [b.meta.base_offset for b in retained if b.meta.base_offset not in held]
        if missing:
            raise SimViolation(f"the mirror lacks the source's batches at {missing}")
        for node in self.nodes.values():
            check_state(node)
        return ""


def mirror_behind(
    source_start: int, source_end: int, leader: int, logs: dict[int, tuple[int, int]]
) -> str:
    """Checker 18's ends ("": caught up) for the replicas' logs ``logs`` (id -> (log start, log
    end)): the leader's log ends where the source's does. A source that retains no batch (its
    log start is its end) above the mirror's end is the exception: the leader never starts its
    log over above its HW (``actors/replication/mirror.py``), so the mirror's log stays at its
    own end, holding nothing (every record of it is gone at the source) on every replica, until
    the source's next batch lands above the gap."""
    end = logs[leader][1]
    if end == source_end:
        return ""
    if not source_start == source_end > end:
        return f"the mirror ends at {end}, the source at {source_end}"
    holding = sorted(i for i, (first, last) in logs.items() if first < last)
    if holding:
        return (
            f"the source retains nothing from {source_start} on, and replicas {holding} of the "
            f"mirror ending at {end} still hold records"
        )
    return ""


def same_txns(live: tuple[Any, ...], other: tuple[Any, ...], log_start: int) -> bool:
    """Whether a replica's (open transactions, aborted list, LSO) is what ``other`` (a rebuild
    from its remaining log, or Kafka's rules over it) says, up to where transactions that began
    below the log start begin: the live state knows their first offset, a rebuild only their
    first batch left, which may itself begin below the log start when the log start lies inside
    it (both keep them, and Kafka clamps them to the log start); the live LSO is then at most
    the rebuild's."""

    def first_ok(mine: int, theirs: int) -> bool:
        return mine == theirs or mine < min(log_start, theirs + 1)

    (open_a, aborted_a, lso_a), (open_b, aborted_b, lso_b) = live, other
    if open_a.keys() != open_b.keys() or len(aborted_a) != len(aborted_b):
        return False
    if not all(first_ok(open_a[pid], open_b[pid]) for pid in open_a):
        return False
    for (pid_a, first_a, last_a), (pid_b, first_b, last_b) in zip(
        aborted_a, aborted_b, strict=True
    ):
        if (pid_a, last_a) != (pid_b, last_b) or not first_ok(first_a, first_b):
            return False
    straddles = any(f < log_start for f in open_a.values()) or any(
        f < log_start for _, f, _ in aborted_a
    )
    return lso_a == lso_b or (straddles and lso_a < lso_b)


def check_state(node: SimNode) -> None:
    """Checker 19 on one replica whose HW is at its log end."""
    replica, disk = node.replica, node.disk
    metas = [b.meta for b in disk.batches]
    hw = replica.high_watermark
    rebuilt = ReplicaLog(disk.log_start, disk.end_offset, disk.epoch_cache(), hw, metas)
    live = replica.log

    def producers(log: ReplicaLog) -> dict[int, Any]:
        return {pid: (epoch, window[-1]) for pid, epoch, window, _ in log.producers.export()}

    def txns(log: ReplicaLog) -> tuple[Any, ...]:
        aborted = [(t.producer_id, t.first_offset, t.last_offset) for t in log.txns.aborted]
        return log.txns.open_spans(), aborted, log.last_stable_offset

    if producers(live) != producers(rebuilt) or not same_txns(
        txns(live), txns(rebuilt), disk.log_start
    ):
        raise SimViolation(
            f"replica {node.node_id}'s producer or transaction state differs from a rebuild "
            f"from its log: {producers(live)} {txns(live)} != {producers(rebuilt)} "
            f"{txns(rebuilt)}"
        )
    # Kafka's rules: a transaction runs from its producer's first batch after a marker to its
    # next marker; an ABORT marker lists it; the LSO is the first offset of one that is open or
    # whose marker the HW has not passed, else the HW.
    open_first: dict[int, int] = {}
    aborted: list[tuple[int, int, int]] = []
    unstable = [hw]
    for meta in metas:
        if meta.producer_id < 0 or not meta.is_transactional:
            continue
        if meta.control_type == NOT_CONTROL:
            open_first.setdefault(meta.producer_id, meta.base_offset)
            continue
        first = open_first.pop(meta.producer_id, meta.base_offset)
        if meta.base_offset >= hw:
            unstable.append(first)
        if meta.control_type == CONTROL_ABORT and meta.base_offset >= disk.log_start:
            aborted.append((meta.producer_id, first, meta.base_offset))
    unstable += open_first.values()
    lso = min(hw, *(max(first, disk.log_start) for first in unstable))
    model = (open_first, aborted, lso)
    if not same_txns(txns(live), model, disk.log_start):
        raise SimViolation(
            f"replica {node.node_id}'s transactions {txns(live)} are not Kafka's over its log: "
            f"{model}"
        )
