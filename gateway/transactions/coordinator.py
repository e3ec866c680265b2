"""The transaction coordinator of one gateway: transactional ids kept in ``__transaction_state``.

This module owns the asyncio side of Kafka's transaction coordinator: which transactional ids
this broker coordinates, loading them from the internal topic, appending their states, writing
the COMMIT/ABORT markers to every partition of a transaction, and the timers that abort
transactions past their timeout and forget idle ids. Every decision about one id is
``state.py``'s (pure, unit-tested); this class feeds it requests and time and carries out the
plans it returns (that module's docstring, "How the coordinator carries out a Plan").

1. Ownership, loading and writes are ``gateway/internal_topic.py``'s, as for consumer groups:
   an id lives in partition ``abs(java_hash(id)) % partitions`` of ``__transaction_state``
   (``transaction.state.log.num.partitions``, RF ``transaction.state.log.replication.factor``,
   ``min.insync.replicas`` ``transaction.state.log.min.isr``, compacted), created on the first
   FindCoordinator; the broker leading the partition is the id's coordinator; its leader epoch
   is the coordinator epoch every marker carries, so a marker from a deposed coordinator is
   refused by the partition (TRANSACTION_COORDINATOR_FENCED). The load barrier is a tombstone of
   the id "", which no transaction can have.
2. Requests of one id are handled one at a time (a lock per id). A request that arrives while
   the id's partition loads, or before this broker's metadata shows who leads it, waits for
   that (up to ``LOAD_WAIT_MS``), then gets COORDINATOR_LOAD_IN_PROGRESS (14) or
   NOT_COORDINATOR (16).
3. Markers go to each partition's leader replica over raylog's own calls (the backend's
   ``write_txn_marker``, acks=all), all partitions at once, each retried with backoff until
   written; a partition whose topic was deleted is skipped (Kafka drops those markers); a
   partition offline holds this transaction only. When this broker stops leading the id's
   partition, its markers stop: the new coordinator reads the Prepare state from the log and
   writes them again (a marker twice is harmless). After a ``__consumer_offsets`` partition's
   marker, the group coordinator leading it is told (``complete_offsets``), so the
   transaction's offsets become visible (commit) or vanish (abort).
4. EndTxn answers once the transaction is complete (every marker written), not as soon as the
   Prepare state is written as Kafka does: a client's ``commit_transaction()`` then returns
   with its records readable by read_committed consumers, and its next transaction starts
   without being refused CONCURRENT_TRANSACTIONS while the markers are written. A transaction
   that cannot complete within ``END_TXN_WAIT_MS`` (a partition offline) is answered NONE at
   that point anyway: its outcome is durable in the Prepare state and the markers go on in the
   background. The Complete state is not written on its own: it goes in the same batch as the
   id's next write (the next transaction's Ongoing state, so back-to-back transactions cost one
   serial acks=all write fewer), or as any other write of the partition, or at the next tick.
   Until it is written the log holds the Prepare state, and a coordinator that takes the
   partition over writes the markers again (harmless, above); the records of one id keep their
   order because a batch is built under the partition's write lock.
5. Timers: every ``transaction.abort.timed.out.transaction.cleanup.interval.ms`` Ongoing
   transactions past their ``transaction.timeout.ms`` are aborted under a bumped epoch (the
   producer is fenced); every ``transaction.remove.expired.transaction.cleanup.interval.ms``
   ids idle past ``transactional.id.expiration.ms`` are tombstoned. Time in the log is wall
   time, as Kafka's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from raylog.gateway.backend import DataBackend, ProduceResult
from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.coordinator import OFFSETS_TOPIC
from raylog.gateway.internal_topic import (
    ConfigureTopic,
    CoordinatorNode,
    CreateTopic,
    InternalTopic,
    KeyLocks,
)
from raylog.gateway.transactions import state as ts
from raylog.gateway.transactions.records import RecordFormatError
from raylog.storage import batch as rb
from raylog.storage.records import iter_decoded

__all__ = [
    "TRANSACTION_STATE_TOPIC",
    "InitProducerIdResult",
    "MarkerBackend",
    "TransactionCoordinator",
]

log = logging.getLogger(__name__)

TRANSACTION_STATE_TOPIC = "__transaction_state"
# Kafka's __transaction_state configs (transaction.state.log.segment.bytes: 100 MiB, compacted).
TRANSACTION_STATE_CONFIGS: Mapping[str, str] = {
    "cleanup.policy": "compact",
    "segment.bytes": "104857600",
}
LOAD_WAIT_MS = 10_000  # the most a request waits for its partition to load here
END_TXN_WAIT_MS = 10_000  # the most EndTxn waits for its markers (module docstring, step 4)
MARKER_TIMEOUT_MS = 5_000  # acks=all wait of one marker write
MARKER_BACKOFF_MS = (50, 1_000)  # first and longest wait between tries of one marker
BARRIER_ID = ""  # the transactional id of the load barrier's tombstone
# A marker refused so was overtaken: a newer producer epoch or coordinator wrote there.
_OBSOLETE_MARKER = frozenset(
    {ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTION_COORDINATOR_FENCED}
)


class MarkerBackend(DataBackend, Protocol):
    """A backend that writes transaction markers through any partition's leader."""

    async def write_txn_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        timeout_ms: int,
    ) -> ProduceResult: ...


# (broker id leading the __consumer_offsets partition, partition, producer id, commit)
CompleteOffsets = Callable[[int, int, int, bool], Awaitable[None]]
# (coordinating broker id, transactional id, producer id, epoch, topic, partition) -> error
VerifyRemote = Callable[[int, str, int, int, str, int], Awaitable[int]]
NewProducerId = Callable[[], Awaitable[int]]


class InitProducerIdResult(NamedTuple):
    error_code: int
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass
class _Partition:
    """One ``__transaction_state`` partition this broker leads."""

    leader_epoch: int
    loaded: bool = False
    txns: dict[str, ts.TransactionMetadata] = field(default_factory=dict)
    loader: asyncio.Task[None] | None = None
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Transactional id -> its completion (markers, then the Complete state) in progress.
    completing: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # Transactional id -> its Complete state's record, decided but not yet appended (step 4).
    unwritten: dict[str, tuple[bytes, bytes | None]] = field(default_factory=dict)
    flushing: asyncio.Task[None] | None = None  # the tick's write of ``unwritten``


class _Replay:
    """Collects the (key, value) records of a ``__transaction_state`` partition in order."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None]] = []

    def apply(self, records: bytes, from_offset: int) -> int:
        next_offset = from_offset
        view = memoryview(records)
        for pos, header in rb.iter_batches(view, verify=False):
            next_offset = max(next_offset, header.next_offset)
            if header.is_control:
                continue
            section = rb.records_section(view[pos:], header)
            for record in iter_decoded(section, header.records_count):
                if record.key is not None and header.base_offset + record.offset_delta >= (
                    from_offset
                ):
                    self.records.append((bytes(record.key), record.value))
        return next_offset

    def transactions(self) -> dict[str, ts.TransactionMetadata]:
        def skip(index: int, exc: RecordFormatError) -> None:
            log.warning("skipping record %d of %s: %s", index, TRANSACTION_STATE_TOPIC, exc)

        return ts.replay(self.records, on_error=skip)


class TransactionCoordinator:
    """The transactional ids of the ``__transaction_state`` partitions broker ``broker_id``
    leads (see the module docstring)."""

    def __init__(
        self,
        backend: MarkerBackend,
        broker_id: int,
        *,
        new_producer_id: NewProducerId,
        complete_offsets: CompleteOffsets | None = None,
        verify_remote: VerifyRemote | None = None,
        num_partitions: int = 3,
        replication_factor: int = 3,
        min_insync_replicas: int = 2,
        max_timeout_ms: int = ts.TRANSACTION_MAX_TIMEOUT_MS,
        expiration_ms: int = ts.TRANSACTIONAL_ID_EXPIRATION_MS,
        abort_interval_ms: int = 10_000,
        expire_interval_ms: int = 3_600_000,
        create_topic: CreateTopic | None = None,
        configure_topic: ConfigureTopic | None = None,
        load_wait_ms: int = LOAD_WAIT_MS,
        end_txn_wait_ms: int = END_TXN_WAIT_MS,
        monotonic_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._backend = backend
        self.broker_id = broker_id
        self._topic: InternalTopic[_Partition, _Replay] = InternalTopic(
            backend,
            broker_id,
            TRANSACTION_STATE_TOPIC,
            TRANSACTION_STATE_CONFIGS,
            num_partitions=num_partitions,
            replication_factor=replication_factor,
            barrier=self._barrier,
            new_partition=_Partition,
            new_replay=_Replay,
            loaded=self._loaded,
            unloaded=self._unloaded,
            create_topic=create_topic,
            configure_topic=configure_topic,
            min_insync_replicas=min_insync_replicas,
            monotonic_ms=monotonic_ms,
        )
        self._new_producer_id = new_producer_id
        self._complete_offsets = complete_offsets
        self._verify_remote = verify_remote
        self._max_timeout_ms = max_timeout_ms
        self._expiration_ms = expiration_ms
        self._abort_interval_ms = abort_interval_ms
        self._expire_interval_ms = expire_interval_ms
        self._load_wait_ms = load_wait_ms
        self._end_txn_wait_ms = end_txn_wait_ms
        self._now = monotonic_ms
        self._wall = wall_ms
        self._lock = KeyLocks()  # per transactional id
        self._timers: asyncio.Task[None] | None = None
        self._last_abort_check_ms: int | None = None
        self._last_expire_check_ms: int | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self._topic.start(self._tick, "transaction coordinator")

    async def stop(self) -> None:
        await self._topic.stop(self._timers)

    def loaded_partitions(self) -> list[int]:
        return self._topic.loaded_partitions()

    async def set_up_topic(self) -> None:
        """Create ``__transaction_state`` now unless it exists (raises what creation raised)."""
        await self._topic.set_up_topic()

    async def find_coordinator(self, transactional_id: str) -> CoordinatorNode:
        return await self._topic.find_coordinator(transactional_id)

    # --- requests -------------------------------------------------------------------------------

    async def init_producer_id(
        self,
        transactional_id: str,
        txn_timeout_ms: int,
        expected_producer_id: int = ts.NO_PRODUCER_ID,
        expected_epoch: int = ts.NO_PRODUCER_EPOCH,
    ) -> InitProducerIdResult:
        async with self._handling(transactional_id) as (owned, error):
            if owned is None:
                return InitProducerIdResult(error)
            args = (
                transactional_id,
                txn_timeout_ms,
                expected_producer_id,
                expected_epoch,
                self._max_timeout_ms,
            )
            meta = owned.txns.get(transactional_id)
            plan = ts.plan_init_producer_id(meta, *args, self._wall())
            if plan.need_producer_id:
                try:
                    producer_id = await self._new_producer_id()
                except Exception as exc:  # no controller reachable, a CAS lost to a failover
                    log.info("no producer id for %s: %s", transactional_id, exc)
                    return InitProducerIdResult(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
                plan = ts.plan_init_producer_id(
                    meta, *args, self._wall(), new_producer_id=producer_id
                )
            error = await self._carry_out(owned, transactional_id, plan)
            if error or plan.write is None:
                return InitProducerIdResult(error)
            return InitProducerIdResult(
                ErrorCode.NONE, plan.write.producer_id, plan.write.producer_epoch
            )

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[tuple[str, int]],
    ) -> int:
        """AddPartitionsToTxn / AddOffsetsToTxn: the error for every partition of the request."""
        async with self._handling(transactional_id) as (owned, error):
            if owned is None:
                return error
            meta = owned.txns.get(transactional_id)
            plan = ts.plan_add_partitions(
                meta, producer_id, producer_epoch, list(partitions), self._wall()
            )
            return await self._carry_out(owned, transactional_id, plan)

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> int:
        async with self._handling(transactional_id) as (owned, error):
            if owned is None:
                return error
            meta = owned.txns.get(transactional_id)
            plan = ts.plan_end_txn(meta, producer_id, producer_epoch, commit, self._wall())
            error = await self._carry_out(owned, transactional_id, plan)
            completing = owned.completing.get(transactional_id)
        if error or completing is None:
            return error
        # Step 4: answer once complete, or at the bound with the outcome durable anyway.
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(completing), self._end_txn_wait_ms / 1000)
        return ErrorCode.NONE

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> int:
        """KIP-890's check for a partition leader about to open a transaction: NONE when the
        producer's Ongoing transaction holds the partition, INVALID_TXN_STATE when it does
        not; asked of the coordinating broker when that is another one (``verify_remote``);
        a coordinator error when no coordinator can answer now."""
        owned, error = await self._serving(transactional_id)
        if owned is None:
            if error != ErrorCode.NOT_COORDINATOR or self._verify_remote is None:
                return error
            coordinator = await self._topic.find_coordinator(transactional_id)
            if coordinator.error_code or coordinator.node_id == self.broker_id:
                return coordinator.error_code or ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
            return await self._verify_remote(
                coordinator.node_id,
                transactional_id,
                producer_id,
                producer_epoch,
                topic,
                partition,
            )
        meta = owned.txns.get(transactional_id)
        holds = (
            meta is not None
            and meta.producer_id == producer_id
            and meta.producer_epoch == producer_epoch
            and meta.state is ts.TransactionState.ONGOING
            and (topic, partition) in meta.partitions
        )
        return ErrorCode.NONE if holds else ErrorCode.INVALID_TXN_STATE

    def describe(self, transactional_id: str) -> ts.TransactionDescription:
        owned = self._owner(transactional_id)
        if owned is None:
            return ts.TransactionDescription(ErrorCode.NOT_COORDINATOR, transactional_id)
        if not owned.loaded:
            return ts.TransactionDescription(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, transactional_id
            )
        return ts.describe_transaction(owned.txns.get(transactional_id), transactional_id)

    def list(
        self,
        state_filters: Iterable[str] = (),
        producer_id_filters: Iterable[int] = (),
        duration_filter_ms: int = -1,
    ) -> tuple[int, ts.TransactionsList]:
        """The ids of every partition loaded here; COORDINATOR_LOAD_IN_PROGRESS with those
        loaded so far while one is still loading (as Kafka)."""
        owned = list(self._topic.owned.values())
        metas = [meta for p in owned if p.loaded for meta in p.txns.values()]
        listed = ts.list_transactions(
            metas, state_filters, producer_id_filters, duration_filter_ms, self._wall()
        )
        loading = any(not p.loaded for p in owned)
        return (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if loading else ErrorCode.NONE), listed

    # --- carrying out plans ---------------------------------------------------------------------

    async def _carry_out(self, owned: _Partition, transactional_id: str, plan: ts.Plan) -> int:
        """Step 2 of ``state.py``'s "How the coordinator carries out a Plan"; the caller holds
        the id's lock. Starts the completion of a write that leaves the id in a Prepare state."""
        if plan.write is None:
            return plan.error
        assert plan.pending is not None
        owned.txns[transactional_id] = plan.pending
        error = await self._append(owned, ts.to_record(plan.write))
        current = owned.txns.get(transactional_id)
        if current is None or current is not plan.pending:
            return ErrorCode.NOT_COORDINATOR  # unloaded (and maybe loaded again) meanwhile
        if error:
            owned.txns[transactional_id] = ts.fail_write(current, plan)
            return ts.append_error(error)
        done = ts.complete_write(current, plan.write)
        if done is None:
            del owned.txns[transactional_id]
        else:
            owned.txns[transactional_id] = done
            if done.needs_markers:
                self._start_completion(owned, done)
        return plan.error

    async def _append(self, owned: _Partition, record: tuple[bytes, bytes | None] | None) -> int:
        """Append ``record`` after every unwritten Complete state of the partition, in one
        batch (step 4); ``record`` None: those alone. A failed write leaves them unwritten."""
        partition = next((p for p, o in self._topic.owned.items() if o is owned), None)
        if partition is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        taken: dict[str, tuple[bytes, bytes | None]] = {}

        def batch() -> bytes | None:
            # Under the write lock: what is taken here is written before any later batch.
            taken.update(owned.unwritten)
            owned.unwritten.clear()
            records = [*taken.values(), *([record] if record is not None else [])]
            if not records:
                return None
            now = self._wall()
            return rb.build_batch([rb.Record(key, value, now) for key, value in records])

        error, _ = await self._topic.append_built(partition, owned, batch)
        if error:
            for tid, unwritten in taken.items():
                owned.unwritten.setdefault(tid, unwritten)
        return error

    def _start_completion(self, owned: _Partition, meta: ts.TransactionMetadata) -> None:
        tid = meta.transactional_id
        task = asyncio.get_running_loop().create_task(self._complete(owned, tid))
        owned.completing[tid] = task
        task.add_done_callback(lambda t: _forget(owned.completing, tid, t))

    async def _complete(self, owned: _Partition, transactional_id: str) -> None:
        """Step 3 of the module docstring, then the Complete state, which the id's next write
        (or the tick) appends (step 4)."""
        meta = owned.txns[transactional_id]
        plan = ts.plan_complete(meta, self._wall())
        assert plan.markers is not None and plan.write is not None and plan.pending is not None
        await self._write_markers(owned, plan.markers)
        if not self._holds(owned):
            return
        async with self._lock(transactional_id):
            current = owned.txns.get(transactional_id)
            if current is None or not current.needs_markers:
                return
            done = ts.complete_write(plan.pending, plan.write)
            assert done is not None  # a Complete state, never a tombstone
            owned.txns[transactional_id] = done
            owned.unwritten[transactional_id] = ts.to_record(plan.write)

    def _flush_unwritten(self) -> None:
        """Step 4: append the Complete states no other write took, one write per partition."""
        for owned in self._topic.owned.values():
            if (
                owned.loaded
                and owned.unwritten
                and (owned.flushing is None or owned.flushing.done())
            ):
                owned.flushing = asyncio.get_running_loop().create_task(self._flush(owned))

    async def _flush(self, owned: _Partition) -> None:
        error = await self._append(owned, None)
        if error:  # left unwritten: the next tick tries again
            log.info("complete states not written (error %d); again at the next tick", error)

    async def _write_markers(self, owned: _Partition, markers: ts.TxnMarkers) -> None:
        await asyncio.gather(
            *(
                self._write_marker(owned, markers, topic, partition)
                for topic, partition in sorted(markers.partitions)
            )
        )

    async def _write_marker(
        self, owned: _Partition, markers: ts.TxnMarkers, topic: str, partition: int
    ) -> None:
        backoff_ms = MARKER_BACKOFF_MS[0]
        while self._holds(owned):
            result = await self._backend.write_txn_marker(
                topic,
                partition,
                markers.producer_id,
                markers.producer_epoch,
                owned.leader_epoch,
                markers.commit,
                MARKER_TIMEOUT_MS,
            )
            error = result.error_code
            if error == ErrorCode.NONE:
                await self._tell_group_coordinator(topic, partition, markers)
                return
            if error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and topic not in (
                await self._backend.topics([topic])
            ):
                log.info("%s: %s deleted, its marker dropped", markers.transactional_id, topic)
                return
            # INVALID_REQUEST: a mirror topic of an active cross-cluster link, read-only: none of
            # the transaction's batches could be appended there either, so there is nothing to
            # mark.
            if error in (
                ErrorCode.INVALID_PRODUCER_EPOCH,
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                ErrorCode.INVALID_REQUEST,
            ):
                log.warning(
                    "%s: marker for %s-%d refused (error %d): %s",
                    markers.transactional_id,
                    topic,
                    partition,
                    error,
                    result.message,
                )
                return
            await asyncio.sleep(backoff_ms / 1000)
            backoff_ms = min(MARKER_BACKOFF_MS[1], backoff_ms * 2)

    async def _tell_group_coordinator(
        self, topic: str, partition: int, markers: ts.TxnMarkers
    ) -> None:
        if topic != OFFSETS_TOPIC or self._complete_offsets is None:
            return
        state = (await self._backend.topics([topic])).get(topic)
        partitions = state.partitions if state is not None else ()
        leader = next((p.leader for p in partitions if p.partition == partition), -1)
        try:
            await self._complete_offsets(leader, partition, markers.producer_id, markers.commit)
        except Exception as exc:  # its next load replays the marker from the log
            log.info(
                "%s: group coordinator of %s-%d not told: %s",
                markers.transactional_id,
                topic,
                partition,
                exc,
            )

    # --- ownership, locks, waiting --------------------------------------------------------------

    def _owner(self, transactional_id: str) -> _Partition | None:
        return self._topic.owner_of(transactional_id)

    def _holds(self, owned: _Partition) -> bool:
        return any(o is owned for o in self._topic.owned.values())

    def _known(self, transactional_id: str) -> bool:
        return any(transactional_id in owned.txns for owned in self._topic.owned.values())

    @contextlib.asynccontextmanager
    async def _handling(
        self, transactional_id: str
    ) -> AsyncIterator[tuple[_Partition | None, int]]:
        """A request of ``transactional_id``, one at a time (module docstring, step 2): yields
        the id's loaded partition under the id's lock, or None and the error to answer."""
        owned, error = await self._serving(transactional_id)
        if owned is None:
            yield None, error
            return
        async with self._lock(transactional_id):
            if self._owner(transactional_id) is not owned:  # unloaded while this one waited
                yield None, ErrorCode.NOT_COORDINATOR
            else:
                yield owned, ErrorCode.NONE

    async def _serving(self, transactional_id: str) -> tuple[_Partition | None, int]:
        """The id's partition once loaded here (module docstring, step 2), or the error."""
        error = ts.check_transactional_id(transactional_id)
        if error:
            return None, error
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._load_wait_ms / 1000
        while True:  # bounded by the deadline
            changed = self._topic.changed
            owned = self._owner(transactional_id)
            if owned is not None and owned.loaded:
                return owned, ErrorCode.NONE
            error = (
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
                if owned is not None
                else ErrorCode.NOT_COORDINATOR
            )
            waiting = owned is not None or self._topic.may_lead_soon(transactional_id)
            remaining = deadline - loop.time()
            if not waiting or remaining <= 0:
                return None, error
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    # --- loading, unloading, timers -------------------------------------------------------------

    def _barrier(self) -> bytes:
        key, _ = ts.to_record(
            ts.TransactionMetadata(BARRIER_ID, -1, -1, 1, ts.TransactionState.DEAD, 0)
        )
        return rb.build_batch([rb.Record(key, None, self._wall())])

    def _loaded(self, owned: _Partition, replay: _Replay) -> None:
        owned.txns = replay.transactions()
        for plan in ts.recovery_plans(owned.txns, self._wall()):
            assert plan.markers is not None
            self._start_completion(owned, owned.txns[plan.markers.transactional_id])
        log.info("broker %d: %d transactional ids loaded", self.broker_id, len(owned.txns))

    def _unloaded(self, partition: int, owned: _Partition) -> None:
        for task in owned.completing.values():
            task.cancel()
        if owned.flushing is not None:
            owned.flushing.cancel()
        owned.txns = {}
        self._lock.prune(self._known)

    async def _tick(self) -> None:
        await self._topic.refresh()
        self._flush_unwritten()
        self._maybe_run_timers()

    def _maybe_run_timers(self) -> None:
        now = self._now()
        if self._last_abort_check_ms is None or self._last_expire_check_ms is None:
            self._last_abort_check_ms = self._last_expire_check_ms = now
            return
        abort = now - self._last_abort_check_ms >= self._abort_interval_ms
        expire = now - self._last_expire_check_ms >= self._expire_interval_ms
        if not (abort or expire) or (self._timers is not None and not self._timers.done()):
            return
        if abort:
            self._last_abort_check_ms = now
        if expire:
            self._last_expire_check_ms = now
        self._timers = asyncio.get_running_loop().create_task(self._run_timers(abort, expire))

    async def _run_timers(self, abort: bool, expire: bool) -> None:
        """Step 5: abort timed-out transactions, tombstone expired ids."""
        for owned in list(self._topic.owned.values()):
            if not owned.loaded:
                continue
            plans: list[ts.Plan] = []
            if abort:
                plans += ts.plan_timeouts(list(owned.txns.values()), self._wall())
            if expire:
                plans += ts.plan_expiration(
                    list(owned.txns.values()), self._wall(), self._expiration_ms
                )
            for plan in plans:
                assert plan.write is not None
                tid = plan.write.transactional_id
                async with self._lock(tid):
                    # Decided again under the lock: a request may have changed the id.
                    meta = owned.txns.get(tid)
                    metas = [meta] if meta is not None else []
                    again = (
                        ts.plan_timeouts(metas, self._wall())
                        if plan.fence
                        else ts.plan_expiration(metas, self._wall(), self._expiration_ms)
                    )
                    if not again:
                        continue
                    error = await self._carry_out(owned, tid, again[0])
                log.info(
                    "%s: %s%s",
                    tid,
                    "timed out, aborted" if plan.fence else "expired",
                    f" (not written: error {error})" if error else "",
                )
        self._lock.prune(self._known)  # expired ids, and ids no request made known


def _forget(tasks: dict[str, asyncio.Task[None]], key: str, task: asyncio.Task[None]) -> None:
    if tasks.get(key) is task:
        del tasks[key]
    if not task.cancelled() and task.exception() is not None:
        log.error("transaction %s: completion failed", key, exc_info=task.exception())
