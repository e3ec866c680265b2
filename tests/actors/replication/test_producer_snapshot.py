"""Producer-state snapshots (``producer_snapshot``), pure.

What they prove: a snapshot's bytes give back both tables exactly (their order too); bytes
that are not a snapshot (a flipped bit, a short or foreign file, a state that breaks the
tables' invariants) are refused with SnapshotError; a snapshot is usable only inside the log
and at or below the starting high watermark; a replica log takes none while its end is not
durable or after a truncation cut its state; and, over seeded random logs with idempotent and
transactional producers, commits, aborts, epoch bumps, high watermark moves, truncations and
log start moves, the state a restart builds from the newest usable snapshot and the batches
after it equals the state it builds from the whole log (but for batches below the log start
that a rebuild reads and a live replica forgot: see ``state``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import crc32c
import msgspec
import pytest

from raylog.actors.replication.messages import BatchMeta
from raylog.actors.replication.producer_snapshot import (
    ProducerSnapshot,
    SnapshotBody,
    SnapshotError,
    decode,
    encode,
)
from raylog.actors.replication.producer_state import ProducerStateTable
from raylog.actors.replication.ready import Ready
from raylog.actors.replication.replica_log import ReplicaLog
from raylog.actors.replication.txn_state import CONTROL_ABORT, CONTROL_COMMIT, TxnTable


def data(offset: int, pid: int, seq: int, count: int = 1, epoch: int = 0, txn: bool = False):
    return BatchMeta(offset, count, 100, 0, pid, epoch, seq, txn)


def marker(offset: int, pid: int, commit: bool, epoch: int = 0, coordinator_epoch: int = 0):
    control = CONTROL_COMMIT if commit else CONTROL_ABORT
    return BatchMeta(offset, 1, 70, 0, pid, epoch, -1, True, control, coordinator_epoch)


def state(rl: ReplicaLog) -> tuple[object, ...]:
    """Both tables whole, but for the idempotent batches below the log start: a log start
    move forgets a producer whose batches all lie below it (``producer_state``), while a
    rebuild still reads those the first segment holds, and keeps them in the window if the
    producer appended again since. Neither can decide anything about a batch above it."""
    start = rl.log_start_offset
    producers = [
        (pid, epoch, [b for b in window if b.next_offset > start], evicted)
        for pid, epoch, window, evicted in rl.producers.export()
    ]
    producers = [
        (pid, epoch, window, evicted if evicted and evicted.next_offset > start else None)
        for pid, epoch, window, evicted in producers
    ]
    return (producers, rl.txns.export(), rl.last_stable_offset)


def replica_log(batches: list[BatchMeta], high_watermark: int = 0) -> ReplicaLog:
    end = batches[-1].next_offset if batches else 0
    return ReplicaLog(0, end, [(0, 0)] if batches else [], high_watermark, batches)


SAMPLE = [
    data(0, 1, 0, count=3),
    data(3, 2, 0, txn=True),
    data(4, 1, 3),
    data(5, 3, 0, txn=True),
    marker(6, 2, commit=False, epoch=1, coordinator_epoch=4),
    data(7, 3, 1, txn=True),
    marker(8, 3, commit=True),
    data(9, 2, 0, epoch=1, txn=True),
]


def test_a_snapshot_gives_back_both_tables_exactly() -> None:
    rl = replica_log(SAMPLE, high_watermark=7)
    snapshot = decode(encode(10, 7, rl.producers, rl.txns))
    assert (snapshot.offset, snapshot.high_watermark) == (10, 7)
    assert snapshot.producers.export() == rl.producers.export()
    assert snapshot.txns.export() == rl.txns.export()
    assert snapshot.txns.aborted == rl.txns.aborted != []


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:5],
        lambda b: b"XXXX" + b[4:],
        lambda b: b[:-1] + bytes([b[-1] ^ 1]),
        lambda b: b[:4] + b"\x00\x09" + b[6:],
    ],
    ids=["short", "magic", "bit-flip", "version"],
)
def test_damaged_bytes_are_refused(damage) -> None:
    rl = replica_log(SAMPLE)
    with pytest.raises(SnapshotError):
        decode(damage(encode(10, 0, rl.producers, rl.txns)))


def test_a_state_that_breaks_the_tables_invariants_is_refused() -> None:
    body = msgspec.msgpack.encode(SnapshotBody(5, 0, [(1, 0, [], None)], [], [], []))
    head = b"RLPS" + (1).to_bytes(2, "big") + crc32c.crc32c(body).to_bytes(4, "big")
    with pytest.raises(SnapshotError, match="producer 1"):
        decode(head + body)


def test_a_snapshot_is_usable_inside_the_log_at_or_below_the_starting_high_watermark() -> None:
    snapshot = ProducerSnapshot(10, 8, ProducerStateTable(), TxnTable())
    assert snapshot.usable(0, 10, 8)
    assert snapshot.usable(10, 20, 9)
    assert not snapshot.usable(11, 20, 12)  # below the log start
    assert not snapshot.usable(0, 9, 9)  # above the log end
    assert not snapshot.usable(0, 20, 7)  # would miss unreplicated transactions


def test_no_snapshot_while_the_end_is_not_durable_nor_after_a_cut() -> None:
    rl = replica_log(SAMPLE)
    assert rl.snapshot() is not None  # a recovered log is durable
    ready = Ready()
    rl.append(data(10, 1, 4), b"", False, ready)
    assert rl.snapshot() is None
    assert rl.mark_durable(rl.generation, 11)
    assert rl.snapshot() is not None
    rl.truncate(9, unclean=False, ready=ready)
    assert rl.snapshot() is None
    rl.truncate_fully(11, unclean=True, ready=ready)
    assert rl.snapshot() is not None


# --- snapshot + tail == the whole log, over seeded random logs -----------------------------------


@dataclass
class Producer:
    pid: int
    transactional: bool
    epoch: int = 0
    seq: int = 0
    open: bool = False
    coordinator_epoch: int = 0


@dataclass
class Run:
    rng: random.Random
    rl: ReplicaLog = field(default_factory=lambda: replica_log([]))
    disk: list[BatchMeta] = field(default_factory=list)
    snapshots: dict[int, bytes] = field(default_factory=dict)

    def append(self, batch: BatchMeta) -> None:
        self.rl.append(batch, b"", False, Ready())
        self.disk.append(batch)

    def produce(self, p: Producer) -> None:
        offset = self.rl.log_end_offset
        if p.transactional and p.open and self.rng.random() < 0.3:
            commit = self.rng.random() < 0.5
            if not commit and self.rng.random() < 0.3:
                p.epoch, p.seq = p.epoch + 1, 0  # an abort that bumps the epoch
            if self.rng.random() < 0.2:
                p.coordinator_epoch += 1
            self.append(marker(offset, p.pid, commit, p.epoch, p.coordinator_epoch))
            p.open = False
            return
        count = self.rng.randint(1, 3)
        self.append(data(offset, p.pid, p.seq, count, p.epoch, p.transactional))
        p.seq += count
        p.open = p.transactional

    def cut(self, offset: int) -> None:
        rl = self.rl
        unclean = offset < rl.high_watermark
        if offset <= rl.log_start_offset:
            rl.truncate_fully(rl.log_start_offset, unclean, Ready())
            self.disk.clear()
            self.snapshots.clear()
            return
        rl.truncate(offset, unclean, Ready())
        self.disk = [b for b in self.disk if b.base_offset < offset]
        self.snapshots = {o: s for o, s in self.snapshots.items() if o <= offset}

    def boundary_at_or_above(self, offset: int) -> int:
        return min((b.base_offset for b in self.disk if b.base_offset >= offset), default=-1)

    def restart(self, high_watermark: int) -> tuple[ReplicaLog, ReplicaLog, int]:
        """The replica log a restart rebuilds from the whole log, the one from the newest
        usable snapshot and the batches after it, and that snapshot's offset (-1: none)."""
        rl = self.rl
        start, end, epochs = rl.log_start_offset, rl.log_end_offset, rl.epoch_cache
        full = ReplicaLog(start, end, epochs, high_watermark, self.disk)
        for offset in sorted(self.snapshots, reverse=True):
            snapshot = decode(self.snapshots[offset])
            if snapshot.usable(start, end, full.high_watermark):
                tail = [b for b in self.disk if b.base_offset >= offset]
                return full, ReplicaLog(start, end, epochs, high_watermark, tail, snapshot), offset
        return full, ReplicaLog(start, end, epochs, high_watermark, self.disk), -1


@pytest.mark.parametrize("seed", range(60))
def test_a_restart_from_a_snapshot_equals_a_restart_from_the_whole_log(seed: int) -> None:
    rng = random.Random(seed)
    producers = [Producer(pid, transactional=pid % 2 == 0) for pid in range(1, 6)]
    run = Run(rng)
    for _ in range(400):
        rl = run.rl
        roll = rng.random()
        if roll < 0.6:
            run.produce(rng.choice(producers))
        elif roll < 0.72:
            rl.mark_durable(rl.generation, rl.log_end_offset)
            rl.set_high_watermark(rng.randint(rl.high_watermark, rl.log_end_offset), Ready())
        elif roll < 0.8:
            data_bytes = rl.snapshot()
            if data_bytes is not None:
                run.snapshots[rl.log_end_offset] = data_bytes
        elif roll < 0.85 and rl.log_end_offset > rl.high_watermark:
            # A follower's clean cut of its unreplicated tail (an unclean one, rarely).
            low = rl.high_watermark if rng.random() < 0.9 else rl.log_start_offset
            offset = run.boundary_at_or_above(rng.randint(low, rl.log_end_offset - 1))
            run.cut(offset)
        elif roll < 0.9 and rl.high_watermark > rl.log_start_offset:
            start = rng.randint(rl.log_start_offset, rl.high_watermark)
            rl.move_log_start(start)
            run.snapshots = {o: s for o, s in run.snapshots.items() if o >= start}
        elif roll < 0.93:
            # A restart, with the high watermark checkpoint somewhat behind.
            hw = rng.randint(max(rl.log_start_offset, rl.high_watermark - 5), rl.high_watermark)
            full, snapped, offset = run.restart(hw)
            assert state(snapped) == state(full), f"restart from the snapshot at {offset}"
            run.rl = snapped
            for p in producers:  # what the restarted log knows of each producer
                entry = snapped.txns.entry(p.pid)
                p.open = entry is not None and entry.is_open
    # And once more at the end: a restart (exact again), a snapshot, more batches, a restart.
    for _ in range(2):
        rl = run.rl
        rl.mark_durable(rl.generation, rl.log_end_offset)
        if (data_bytes := rl.snapshot()) is not None:
            run.snapshots[rl.log_end_offset] = data_bytes
        for _ in range(rng.randint(0, 10)):
            run.produce(rng.choice(producers))
        full, snapped, offset = run.restart(run.rl.high_watermark)
        assert state(snapped) == state(full), f"restart from the snapshot at {offset}"
        run.rl = snapped
    assert offset >= 0
