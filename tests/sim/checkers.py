"""Safety checkers run by the simulator after every step.

Definitions (what each checker proves, for runs with clean elections only):
1. Acknowledged acks=all writes survive: an acked batch is entered into ``committed`` at its
   offset; every replica the controller makes leader must hold every committed batch when it
   takes over (the leader is elected from the ISR, so a member of the ISR that acknowledged the
   write survives, counting a crashed-and-restarted replica with its durable disk).
2. Logs never differ below the high watermark: every batch that lies below some replica's HW
   must equal the batch recorded in ``committed`` at that offset (recorded on first sight).
3. High watermarks never go backwards, per replica incarnation. Across failovers the
   *committed data* never regresses: a new leader holds every batch below the highest HW any
   replica ever exposed (checker 1's check). The HW *number* a new leader reports may be lower
   for a while (Kafka's behaviour: it learns the followers' ends first); consumers then see an
   empty read, never different data.
4. At most one replica appends client writes in any one leader epoch.
5. Consumers never read at or above the HW of the replica that served them.
6. Consumer reads have no lost write, skip or nonmonotonic read: each consumer reads offsets
   contiguously from 0, each batch read equals the committed batch at that offset (lost write:
   an acked batch replaced by another), its first batch starts exactly at its position (skip)
   and positions only grow (nonmonotonic).
7. Idempotent producers: no batch is committed twice (the same data at two offsets: a retry
   appended again instead of answered with the original offsets), and the committed batches of
   each producer id and epoch, in offset order, carry consecutive sequences from 0 (no gap).
   Producers write ``...p<id>e<epoch>q<first sequence>n<record count>`` as their batch data.
   Kafka's exception, after DeleteRecords: a producer whose batches all lie below a log start
   is forgotten (evictUnretainedProducers), and its next batch is accepted at any sequence. So
   a batch whose first copy lies wholly below ``deleted_below`` (the highest log start any
   replica adopted) may be committed again, and a producer's first batch at or above it may
   start at any sequence.
8. DeleteRecords: a replica elected cleanly starts at or above every low watermark a
   DeleteRecords was answered with (deleted records never come back); no replica's log start
   passes its high watermark.
9. No split brain (leases; run by cluster.py, which sees brokers' clocks): when the controller
   fences a live broker whose session expired, that broker's write lease has already lapsed on
   its own clock, so it stopped accepting writes before anyone else is elected; and a broker
   fenced out of leader epoch ``e`` (session expiry or death) never again appends a client
   write in an epoch <= ``e``.
10. Liveness (run by cluster.py after the last step): once the faults stop, the partition
   converges: one leader, every replica holding its log, the ISR whole, the HW at the log end.
   It holds in runs with unclean elections too (``lossy``), where 1-3, 6 and 7 do not.
11. One leader at a time (run by cluster.py, which sees the controller's pushes): no replica
   appends a client write in a leader epoch older than one another replica already appended
   one in, whatever their leases, unless the controller could not step it down (its step-down
   push failed, or after a failover it had no link to the new controller yet when the new
   leader was told to lead) and has not given up on it (it still has no link, or a push to it
   is in flight, or its last one ended within one reconcile round).
12. What the controller counts applied was applied (run by cluster.py): a push the reconciler
   counts applied in full was applied by its broker, both phases (``wait_reconciled``,
   controlled shutdown and the lease rule rely on it).

Transactions (runs with ``Scenario.transactions``; transactions.py writes them):
13. Read committed (Jepsen G1a, G1b): a read_committed consumer, filtering each fetch answer
   with its aborted transactions as Kafka's client does (``transactions.AbortedFilter``),
   never delivers a record of an aborted transaction (G1a; a fenced producer's records among
   them: its transaction is aborted with a bumped epoch) nor of one whose marker is not
   committed (G1b: open, or its outcome still undecided).
14. The LSO: on every replica process (a leader within and across its epochs, a follower, in
   one incarnation) the last stable offset never decreases. Across failovers the *number* may
   be lower on a new leader for a while, as the HW's may (checker 3; Kafka's KIP-207 answers
   ListOffsets OFFSET_NOT_AVAILABLE meanwhile); what never moves back is the stable prefix:
   every transactional record below an LSO any replica exposed belongs to a transaction whose
   marker is committed and lies above it, so every later answer below that offset shows the
   same records with the same outcome (the committed log below the HW never changes: 1, 2).
15. Committed transactions are visible whole: when a read_committed consumer passes a COMMIT
   marker it has delivered every record of that transaction its producer was acknowledged
   (those DeleteRecords removed before the consumer got there excepted).
16. Fenced producers: a batch of a producer epoch older than the one a marker bumped it to is
   never appended after that marker (checker 14's "above it"), so never visible as committed.

Links (runs of links.LinkSimulation, whose partition mirrors a source's; links.py says more):
17. Every replica's log below its HW is the source's batches at the same offsets, with gaps only
   where the source has one or had deleted the batches; consumers pass only such gaps.
18. Healed, the mirror ends where the source does and holds every batch the source retains
   (or holds nothing, when the source retains nothing above its end).
19. Its producer state, transactions and LSO equal a rebuild from its batches, and Kafka's.

Sync links (runs of sync_links.SyncLinkSimulation, whose partition is a synchronous link's
source; sync_links.py says more):
20. Every acks=all write a leader acknowledges while it counts the link in sync is, at that
   moment, in the durable log of that link's destination (unless deleted at the source before
   the link fetched it).
21. Healed, the link is back in sync on the leader, its destination holding all below the HW.

The ISR at the acknowledgement (node.py, in runs that fsync every write and lose no data):
22. Every acks=all write a leader acknowledges is, at that moment, durable on the disk of every
   replica of its maximal ISR (or below that disk's log start): what the HW counts is what the
   replicas have fsync'd, not what they have fetched.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

_IDEMPOTENT_DATA = re.compile(rb"p(\d+)e(\d+)q(\d+)n(\d+)$")

TxnKey = tuple[int, int]  # (producer id, the producer's transaction number)


class SimViolation(AssertionError):
    """A checker found a safety violation."""


@dataclass
class Checkers:
    committed: dict[int, bytes] = field(default_factory=dict)  # base offset -> batch data
    committed_next: dict[int, int] = field(default_factory=dict)  # base offset -> next offset
    committed_bases: list[int] = field(default_factory=list)  # sorted keys of ``committed``
    committed_end: int = 0  # highest offset below which every batch is committed
    epoch_writers: dict[int, int] = field(default_factory=dict)  # leader epoch -> replica id
    # Unclean elections lose acknowledged data by design: checkers 1, 2, 3, 6 and 7 (and 8's
    # clean-election part) do not apply; 4, 5, 9 and 10 and the state machine's own do.
    lossy: bool = False
    last_hw: dict[tuple[int, int], int] = field(default_factory=dict)  # (node, incarnation)
    committed_at: dict[bytes, int] = field(default_factory=dict)  # batch data -> base offset
    deleted_below: int = 0  # the highest log start offset any replica adopted (checker 7)
    # Checkers 13-16: what each transactional batch and marker is, by its data, as the
    # transactional producers and the coordinator stand-in register them.
    txn_of: dict[bytes, TxnKey] = field(default_factory=dict)  # data batch -> transaction
    marker_of: dict[bytes, tuple[TxnKey, bool]] = field(default_factory=dict)  # -> commit?
    fenced: set[TxnKey] = field(default_factory=set)  # aborted with a bumped producer epoch
    acked: dict[TxnKey, dict[bytes, int]] = field(default_factory=dict)  # data -> base offset
    marker_at: dict[TxnKey, int] = field(default_factory=dict)  # first committed marker
    marker_commits: dict[TxnKey, bool] = field(default_factory=dict)  # its type: COMMIT?
    delivered: dict[TxnKey, set[bytes]] = field(default_factory=dict)  # read committed
    # Checker 17: whether a log may skip offsets [start, end) (a mirror's source had none
    # there, or had deleted them); no gap anywhere else.
    legal_gap: Callable[[int, int], bool] = lambda start, end: False
    last_lso: dict[tuple[int, int], int] = field(default_factory=dict)  # (node, incarnation)
    lso_checked: dict[tuple[int, int], int] = field(default_factory=dict)  # scanned below

    def note_log_start(self, offset: int) -> None:
        self.deleted_below = max(self.deleted_below, offset)

    def commit(self, base_offset: int, next_offset: int, data: bytes, why: str) -> None:
        """Record that ``data`` is committed at ``base_offset`` (checkers 1, 2, 6)."""
        if self.lossy:
            return
        seen = self.committed.get(base_offset)
        if seen is not None:
            if seen != data or self.committed_next[base_offset] != next_offset:
                raise SimViolation(
                    f"{why}: offset {base_offset} holds {data!r}, but {seen!r} was committed there"
                )
            return
        # A batch at a new base offset must not overlap any committed batch: a divergent log
        # may cut its batches at other boundaries.
        index = bisect.bisect_left(self.committed_bases, base_offset)
        if index > 0:
            before = self.committed_bases[index - 1]
            if self.committed_next[before] > base_offset:
                raise SimViolation(
                    f"{why}: batch {data!r} at [{base_offset}, {next_offset}) overlaps committed "
                    f"{self.committed[before]!r} at [{before}, {self.committed_next[before]})"
                )
        if index < len(self.committed_bases) and self.committed_bases[index] < next_offset:
            after = self.committed_bases[index]
            raise SimViolation(
                f"{why}: batch {data!r} at [{base_offset}, {next_offset}) overlaps committed "
                f"{self.committed[after]!r} at [{after}, {self.committed_next[after]})"
            )
        first = self.committed_at.setdefault(data, base_offset)
        if first != base_offset and self.committed_next[first] <= self.deleted_below:
            self.committed_at[data] = base_offset  # its first copy was deleted: Kafka's rule
        elif first != base_offset:
            raise SimViolation(
                f"{why}: batch {data!r} committed twice, at {first} and at {base_offset}"
            )
        self.committed[base_offset] = data
        self.committed_next[base_offset] = next_offset
        self.committed_bases.insert(index, base_offset)
        self.committed_end = max(self.committed_end, next_offset)
        marker = self.marker_of.get(data)
        if marker is not None:  # a transaction marker committed: its outcome is final
            key, commit = marker
            if self.marker_commits.setdefault(key, commit) != commit:
                raise SimViolation(f"{why}: transaction {key} has a COMMIT and an ABORT marker")
            self.marker_at[key] = min(self.marker_at.get(key, base_offset), base_offset)

    def check_hw_monotonic(self, node: int, incarnation: int, hw: int) -> None:
        if self.lossy:
            return
        key = (node, incarnation)
        previous = self.last_hw.get(key, -1)
        if hw < previous:
            raise SimViolation(f"replica {node} HW went back from {previous} to {hw}")
        self.last_hw[key] = hw

    def check_single_writer(self, epoch: int, node: int) -> None:
        writer = self.epoch_writers.setdefault(epoch, node)
        if writer != node:
            raise SimViolation(
                f"replicas {writer} and {node} both accepted writes in epoch {epoch}"
            )

    def newer_writer(self, epoch: int, node: int) -> tuple[int, int] | None:
        """Checker 11: a (leader epoch, replica) that appended a client write in an epoch
        later than ``epoch``, other than ``node`` (None: none did)."""
        later = [(e, w) for e, w in self.epoch_writers.items() if e > epoch and w != node]
        return max(later) if later else None

    def check_idempotent_sequences(self) -> None:
        if self.lossy:
            return
        """Checker 7's gap check, over every batch committed so far (a prefix of the log)."""
        expected: dict[tuple[int, int], int] = {}  # (producer id, epoch) -> next sequence
        forgotten: set[tuple[int, int]] = set()  # had batches deleted: may restart anywhere
        for base_offset in self.committed_bases:
            match = _IDEMPOTENT_DATA.search(self.committed[base_offset])
            if match is None:
                continue
            producer_id, epoch, sequence, count = (int(g) for g in match.groups())
            key = (producer_id, epoch)
            if self.committed_next[base_offset] <= self.deleted_below:
                forgotten.add(key)  # deleted: the replicas may have forgotten the producer
                expected.pop(key, None)
                continue
            want = expected.get(key, sequence if key in forgotten else 0)
            if sequence != want:
                raise SimViolation(
                    f"producer {producer_id} epoch {epoch}: committed batch at {base_offset} "
                    f"starts at sequence {sequence}, expected {want} (a gap or a duplicate)"
                )
            expected[key] = sequence + count

    # --- transactions (checkers 13-16) ------------------------------------------------------------

    def check_lso(self, node: int, incarnation: int, lso: int, disk: Any) -> None:
        """Checker 14 on one replica after a step (its HW's batches already committed): its LSO
        did not decrease, and every transactional record below it has a committed marker
        above it (16: no fenced producer's record after its transaction's marker)."""
        if self.lossy:
            return
        key = (node, incarnation)
        previous = self.last_lso.get(key, -1)
        if lso < previous:
            raise SimViolation(f"replica {node}'s LSO went back from {previous} to {lso}")
        self.last_lso[key] = lso
        checked = max(self.lso_checked.get(key, 0), disk.log_start)
        if lso <= checked:
            return
        index = max(0, bisect.bisect_right(disk.bases, checked) - 1)
        batches = disk.batches
        while index < len(batches) and batches[index].meta.next_offset <= lso:
            meta, data = batches[index].meta, batches[index].data
            index += 1
            txn = self.txn_of.get(data) if meta.next_offset > checked else None
            if txn is None:
                continue
            marker_at = self.marker_at.get(txn)
            if marker_at is None:
                raise SimViolation(
                    f"replica {node}'s LSO {lso} passed {data!r} at {meta.base_offset}, whose "
                    f"transaction {txn} has no committed marker"
                )
            if marker_at < meta.base_offset:
                raise SimViolation(
                    f"replica {node} holds {data!r} of transaction {txn} at {meta.base_offset}, "
                    f"after its marker at {marker_at} (fenced: {txn in self.fenced})"
                )
        self.lso_checked[key] = lso

    def check_committed_read(self, data: bytes, floor: int) -> None:
        """Checkers 13 and 15: a read_committed consumer delivered ``data`` (a data batch
        its aborted list did not filter out) or passed a marker; ``floor`` is the highest
        log start it restarted at."""
        if self.lossy:
            return
        txn = self.txn_of.get(data)
        if txn is not None:
            commit = self.marker_commits.get(txn)
            if commit is None:
                raise SimViolation(f"read_committed delivered {data!r} of open transaction {txn}")
            if not commit:
                fenced = " of a fenced producer" if txn in self.fenced else ""
                raise SimViolation(
                    f"read_committed delivered {data!r}{fenced}, of aborted transaction {txn}"
                )
            self.delivered.setdefault(txn, set()).add(data)
            return
        marker = self.marker_of.get(data)
        if marker is None or not marker[1]:
            return
        txn = marker[0]
        delivered = self.delivered.get(txn, set())
        missing = [
            d
            for d, offset in self.acked.get(txn, {}).items()
            if offset >= floor and d not in delivered
        ]
        if missing:
            raise SimViolation(
                f"read_committed passed the COMMIT marker of transaction {txn} without "
                f"delivering its acknowledged {missing}"
            )


def check_durable_on_isr(
    leader: int, members: Iterable[int], base: int, end: int, disks: Mapping[int, Any]
) -> None:
    """Checker 22, as ``leader`` acknowledges acks=all [``base``, ``end``): ``disks`` are the
    replicas' SimDisks."""
    for member in members:
        disk = disks[member]
        count = disk.durable_count
        durable_end = disk.batches[count - 1].meta.next_offset if count else disk.log_start
        if durable_end < end and disk.log_start < end:
            raise SimViolation(
                f"leader {leader} acknowledged acks=all [{base}, {end}) while replica {member} "
                f"of its ISR {tuple(members)} is durable only up to {durable_end}"
            )
