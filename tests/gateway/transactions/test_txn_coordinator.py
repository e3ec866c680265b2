"""The transaction coordinator's shell over ``__transaction_state`` kept as in-memory byte logs:
it carries out the pure state machine's plans (appends, then answers), writes markers through
the backend with its partition's leader epoch as the coordinator epoch, answers EndTxn once the
transaction is complete (or at its bound when a partition holds the markers up), finishes a
Prepare state it finds after a failover, aborts timed-out transactions under a bumped epoch,
and tells the group coordinator of a ``__consumer_offsets`` partition's outcome.

The backend here stands in for raylog's replicas (the unit under test is the coordinator); the
live tests with real clients are in tests/e2e/test_transactions.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from raylog.gateway.backend import (
    Broker,
    ClusterView,
    FetchResult,
    ListOffsetsResult,
    PartitionFetch,
    PartitionState,
    ProduceResult,
    TopicState,
)
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.coordinator import OFFSETS_TOPIC
from raylog.gateway.internal_topic import partition_for
from raylog.gateway.transactions import state as ts
from raylog.gateway.transactions.coordinator import (
    TRANSACTION_STATE_TOPIC,
    TransactionCoordinator,
    _Replay,
)
from raylog.storage import batch as rb

TXN = "tx-1"
PARTITION = partition_for(TXN, 3)
DATA = "orders"


class TxnBackend:
    """``__transaction_state`` (3 partitions) as byte logs, a data topic of 2 partitions and
    ``__consumer_offsets``; markers are recorded, and refused while ``marker_error`` is set."""

    def __init__(self, leader: int = 1) -> None:
        self.logs: dict[int, list[bytes]] = {p: [] for p in range(3)}
        self.leader = leader
        self.epoch = 4
        self.markers: list[tuple[str, int, int, int, int, bool]] = []
        self.marker_error = 0
        self.produce_error = 0

    async def cluster(self) -> ClusterView:
        return ClusterView("c", 1, [Broker(b, "127.0.0.1", 9000 + b, None) for b in (1, 2)])

    async def topics(self, names: Sequence[str] | None) -> Mapping[str, TopicState]:
        def topic(name: str, count: int, leader: int) -> TopicState:
            parts = [
                PartitionState(p, leader, self.epoch, [1, 2], [1, 2], []) for p in range(count)
            ]
            return TopicState(name, parts, internal=name.startswith("__"))

        every = {
            TRANSACTION_STATE_TOPIC: topic(TRANSACTION_STATE_TOPIC, 3, self.leader),
            DATA: topic(DATA, 2, 2),
            OFFSETS_TOPIC: topic(OFFSETS_TOPIC, 3, 2),
        }
        return {n: t for n, t in every.items() if names is None or n in names}

    async def produce(
        self, topic: str, partition: int, records: bytes, acks: int, timeout_ms: int
    ) -> ProduceResult:
        assert topic == TRANSACTION_STATE_TOPIC and acks == -1
        if self.produce_error:
            return ProduceResult(self.produce_error, -1, -1, -1)
        log = self.logs[partition]
        stamped = bytearray(records)
        rb.set_base_offset(stamped, 0, len(log))
        log.append(bytes(stamped))  # one record per batch here: offsets are list indexes
        return ProduceResult(0, len(log) - 1, -1, 0)

    async def fetch(self, topic: str, partition: int, read: PartitionFetch) -> FetchResult:
        log = self.logs[partition]
        return FetchResult(0, len(log), len(log), 0, b"".join(log[read.fetch_offset :]))

    async def list_offsets(self, topic: str, partition: int, *args: Any) -> ListOffsetsResult:
        return ListOffsetsResult(0, -1, 0)

    async def write_txn_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        timeout_ms: int,
    ) -> ProduceResult:
        if self.marker_error:
            return ProduceResult(self.marker_error, -1, -1, -1)
        self.markers.append(
            (topic, partition, producer_id, producer_epoch, coordinator_epoch, commit)
        )
        return ProduceResult(0, len(self.markers), -1, 0)

    def states(self) -> list[ts.TransactionState]:
        """The states appended for TXN, in log order."""
        replay = _Replay()
        replay.apply(b"".join(self.logs[PARTITION]), 0)
        metas = (ts.replay([record]) for record in replay.records)
        return [m[TXN].state for m in metas if TXN in m]


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def coordinator(backend: TxnBackend, broker_id: int = 1, **kw: Any) -> TransactionCoordinator:
    ids = iter(range(7000, 8000))

    async def new_producer_id() -> int:
        return next(ids)

    return TransactionCoordinator(backend, broker_id, new_producer_id=new_producer_id, **kw)


async def loaded(c: TransactionCoordinator) -> None:
    await c._topic.refresh()
    await asyncio.gather(*(o.loader for o in c._topic.owned.values() if o.loader))


async def completions(c: TransactionCoordinator, timeout_s: float = 10.0) -> None:
    """Until every completion (markers, then the Complete state) the coordinator runs is done."""
    tasks = [t for owned in c._topic.owned.values() for t in owned.completing.values()]
    if tasks:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout_s)


def test_a_committed_transaction_writes_its_markers_then_completes() -> None:
    async def run() -> None:
        backend = TxnBackend()
        c = coordinator(backend)
        await loaded(c)
        first = await c.init_producer_id(TXN, 60_000)
        assert first == (ErrorCode.NONE, 7000, 0)
        again = await c.init_producer_id(TXN, 60_000)
        assert again == (ErrorCode.NONE, 7000, 1)  # the same id, its epoch bumped
        parts = [(DATA, 0), (DATA, 1)]
        assert await c.add_partitions(TXN, 7000, 1, parts) == ErrorCode.NONE
        assert await c.add_partitions(TXN, 7000, 0, parts) == ErrorCode.PRODUCER_FENCED
        assert await c.end_txn(TXN, 7000, 1, True) == ErrorCode.NONE
        # EndTxn answered once complete: both markers written, with the partition's epoch.
        assert sorted(backend.markers) == [(DATA, 0, 7000, 1, 4, True), (DATA, 1, 7000, 1, 4, True)]
        assert c.describe(TXN).state == "CompleteCommit"
        # The Complete state waits for the id's next write: the log ends at PrepareCommit.
        assert backend.states()[-1] == ts.TransactionState.PREPARE_COMMIT
        batches = len(backend.logs[PARTITION])
        # The next transaction starts at once (no CONCURRENT_TRANSACTIONS), and its Ongoing
        # state goes in one batch behind the previous transaction's Complete state.
        assert await c.add_partitions(TXN, 7000, 1, parts[:1]) == ErrorCode.NONE
        assert len(backend.logs[PARTITION]) == batches + 1
        assert backend.states()[-3:] == [
            ts.TransactionState.PREPARE_COMMIT,
            ts.TransactionState.COMPLETE_COMMIT,
            ts.TransactionState.ONGOING,
        ]
        await c.stop()

    asyncio.run(run())


def test_a_complete_state_no_write_takes_is_appended_at_the_tick_and_kept_on_failure() -> None:
    async def run() -> None:
        backend = TxnBackend()
        c = coordinator(backend)
        await loaded(c)
        await c.init_producer_id(TXN, 60_000)
        assert await c.add_partitions(TXN, 7000, 0, [(DATA, 0)]) == ErrorCode.NONE
        assert await c.end_txn(TXN, 7000, 0, False) == ErrorCode.NONE
        assert c.describe(TXN).state == "CompleteAbort"
        assert backend.states()[-1] == ts.TransactionState.PREPARE_ABORT
        backend.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS
        await c._tick()
        await asyncio.wait_for(c._topic.owned[PARTITION].flushing, 5)  # type: ignore[arg-type]
        assert backend.states()[-1] == ts.TransactionState.PREPARE_ABORT  # kept for later
        backend.produce_error = 0
        await c._tick()
        await asyncio.wait_for(c._topic.owned[PARTITION].flushing, 5)  # type: ignore[arg-type]
        assert backend.states()[-1] == ts.TransactionState.COMPLETE_ABORT
        # Replaying the log gives what the coordinator holds.
        replay = _Replay()
        replay.apply(b"".join(backend.logs[PARTITION]), 0)
        assert replay.transactions()[TXN].state == ts.TransactionState.COMPLETE_ABORT
        await c.stop()

    asyncio.run(run())


def test_a_coordinator_after_failover_finishes_a_prepared_transaction() -> None:
    async def run() -> None:
        backend = TxnBackend()
        old = coordinator(backend, end_txn_wait_ms=50)
        await loaded(old)
        await old.init_producer_id(TXN, 60_000)
        await old.add_partitions(TXN, 7000, 0, [(DATA, 1)])
        backend.marker_error = ErrorCode.NOT_LEADER_OR_FOLLOWER  # the partition is offline
        # The outcome is durable once PrepareAbort is written: answered at the bound.
        assert await old.end_txn(TXN, 7000, 0, False) == ErrorCode.NONE
        assert old.describe(TXN).state == "PrepareAbort" and not backend.markers
        # Broker 2 takes __transaction_state over; broker 1 loses it.
        backend.leader, backend.epoch = 2, 5
        await old._topic.refresh()
        assert old.describe(TXN).error_code == ErrorCode.NOT_COORDINATOR
        backend.marker_error = 0
        new = coordinator(backend, broker_id=2)
        await loaded(new)
        await completions(new)
        assert new.describe(TXN).state == "CompleteAbort"
        assert backend.markers == [(DATA, 1, 7000, 0, 5, False)]  # the new coordinator epoch
        await old.stop()
        await new.stop()

    asyncio.run(run())


def test_a_timed_out_transaction_is_aborted_and_its_producer_fenced() -> None:
    async def run() -> None:
        backend = TxnBackend()
        clock = Clock()
        c = coordinator(backend, abort_interval_ms=1_000, wall_ms=clock, monotonic_ms=clock)
        await loaded(c)
        await c.init_producer_id(TXN, 10_000)
        await c.add_partitions(TXN, 7000, 0, [(DATA, 0)])
        c._maybe_run_timers()  # the first check only starts the intervals
        clock.ms += 10_001 + 1_000
        c._maybe_run_timers()
        assert c._timers is not None
        await c._timers
        await completions(c)
        assert c.describe(TXN).state == "CompleteAbort"
        assert backend.markers == [(DATA, 0, 7000, 1, 4, False)]  # under the bumped epoch
        assert await c.end_txn(TXN, 7000, 0, True) == ErrorCode.PRODUCER_FENCED
        await c.stop()

    asyncio.run(run())


def test_offsets_partition_outcome_goes_to_its_group_coordinator() -> None:
    async def run() -> None:
        backend = TxnBackend()
        told: list[tuple[int, int, int, bool]] = []

        async def complete_offsets(broker: int, partition: int, pid: int, commit: bool) -> None:
            told.append((broker, partition, pid, commit))

        c = coordinator(backend, complete_offsets=complete_offsets)
        await loaded(c)
        await c.init_producer_id(TXN, 60_000)
        group_partition = partition_for("my-group", 3)
        await c.add_partitions(TXN, 7000, 0, [(OFFSETS_TOPIC, group_partition), (DATA, 0)])
        assert await c.end_txn(TXN, 7000, 0, True) == ErrorCode.NONE
        assert told == [(2, group_partition, 7000, True)]  # broker 2 leads that partition
        await c.stop()

    asyncio.run(run())


def test_requests_wait_for_the_load_and_a_failed_append_changes_nothing() -> None:
    async def run() -> None:
        backend = TxnBackend()
        c = coordinator(backend, load_wait_ms=50)
        # Not loaded yet (no refresh): waits, then the retriable NOT_COORDINATOR.
        assert (await c.init_producer_id(TXN, 60_000)).error_code == ErrorCode.NOT_COORDINATOR
        await loaded(c)
        backend.produce_error = ErrorCode.NOT_ENOUGH_REPLICAS
        result = await c.init_producer_id(TXN, 60_000)
        assert result.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        backend.produce_error = 0
        # As in Kafka, the id keeps the producer id it was given before the failed write.
        assert await c.init_producer_id(TXN, 60_000) == (ErrorCode.NONE, 7000, 0)
        assert (await c.init_producer_id(TXN, 900_001)).error_code == (
            ErrorCode.INVALID_TRANSACTION_TIMEOUT
        )
        assert (await c.init_producer_id("", 1000)).error_code == ErrorCode.INVALID_REQUEST
        await c.stop()

    asyncio.run(run())


def test_verify_answers_whether_the_ongoing_transaction_holds_the_partition() -> None:
    async def run() -> None:
        backend = TxnBackend()
        asked: list[tuple[int, str]] = []

        async def verify_remote(broker: int, tid: str, *args: Any) -> int:
            asked.append((broker, tid))
            return ErrorCode.NONE

        c = coordinator(backend, verify_remote=verify_remote)
        await loaded(c)
        await c.init_producer_id(TXN, 60_000)
        assert await c.verify(TXN, 7000, 0, DATA, 0) == ErrorCode.INVALID_TXN_STATE  # Empty
        await c.add_partitions(TXN, 7000, 0, [(DATA, 0)])
        assert await c.verify(TXN, 7000, 0, DATA, 0) == ErrorCode.NONE
        assert await c.verify(TXN, 7000, 0, DATA, 1) == ErrorCode.INVALID_TXN_STATE  # not added
        assert await c.verify(TXN, 7000, 1, DATA, 0) == ErrorCode.INVALID_TXN_STATE  # epoch
        assert await c.end_txn(TXN, 7000, 0, True) == ErrorCode.NONE
        assert await c.verify(TXN, 7000, 0, DATA, 0) == ErrorCode.INVALID_TXN_STATE  # ended
        # An id another broker coordinates is asked of that broker.
        backend.leader = 2
        await c._topic.refresh()
        assert await c.verify(TXN, 7000, 0, DATA, 0) == ErrorCode.NONE
        assert asked == [(2, TXN)]
        await c.stop()

    asyncio.run(run())
