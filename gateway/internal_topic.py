"""The partitions of an internal, compacted topic that this broker leads, and what coordinators
built on one share: ``__consumer_offsets`` for the group coordinator, ``__transaction_state``
for the transaction coordinator.

This module owns, for one such topic:

1. Placement of keys: a key (a group id, a transactional id) lives in partition
   ``abs(java_hash(key)) % partitions`` (:func:`partition_for`, Kafka's rule); the broker
   leading that partition is its coordinator (:meth:`InternalTopic.find_coordinator`).
2. Setting the topic up: created through the controller on first need (RF = min(the
   configured replication factor, live brokers); ``min.insync.replicas``, when the coordinator
   sets one, capped by that RF) with the coordinator's configs (compacted); an
   existing topic without compaction is given the coordinator's ``cleanup.policy`` once seen.
   Attempts are at least ``CREATE_RETRY_MS`` apart.
3. Ownership: every refresh (the coordinator's tick) compares the partitions this broker leads
   (the gateway's metadata view) with those it holds. On gaining one (or a new leader epoch of
   one) it loads it; on losing one it hands it back to the coordinator (``unloaded``).
4. Loading: (a) append the coordinator's barrier record with acks=all; once acknowledged, the
   high watermark is past everything the previous leader acknowledged (a new leader's HW may
   lag its log until the followers report in); (b) read the partition from its log start to
   the barrier through the backend's fetch and feed it to the coordinator's replay. Retried
   every ``LOAD_RETRY_MS`` until done or unloaded.
5. Writes: whole batches appended with acks=all through the backend's produce path, one at a
   time per partition (the partition's ``write_lock``), so records land in the order their
   coordinator decided them.
6. Waiting: requests that arrive while their partition loads, or before this broker's metadata
   shows who leads it, wait on :meth:`InternalTopic.changed` (set on every change of what is
   owned or loaded) rather than being refused at once.
7. Running: the coordinator's tick every ``TICK_MS`` (:meth:`InternalTopic.start`), and stopping
   it with every task it started (:meth:`InternalTopic.stop`); a lock per key
   (:class:`KeyLocks`) for coordinators that handle one key's requests one at a time.

What a partition's records mean, and what a coordinator keeps per partition, is the
coordinator's; this module never decodes a record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Generic, NamedTuple, Protocol, TypeVar

from raylog.gateway.backend import DataBackend, PartitionFetch, TopicState
from raylog.gateway.errors import ErrorCode
from raylog.storage.errors import RaylogError

__all__ = [
    "STORE_ERRORS",
    "TICK_MS",
    "CoordinatorNode",
    "InternalTopic",
    "KeyLocks",
    "OwnedPartition",
    "Replay",
    "java_string_hash",
    "partition_for",
]

log = logging.getLogger(__name__)

APPEND_TIMEOUT_MS = 5_000  # acks=all wait for a coordinator write (offsets.commit.timeout.ms)
LOAD_FETCH_BYTES = 1 << 20
LOAD_RETRY_MS = 500
CREATE_RETRY_MS = 2_000  # the least time between two attempts to create or configure the topic
TICK_MS = 100  # a coordinator's tick: leadership checks, then its own timers

CreateTopic = Callable[[str, int, int, dict[str, str]], Awaitable[None]]
# Set these configs among a topic's overrides (the others kept); raises when it cannot.
ConfigureTopic = Callable[[str, Mapping[str, str]], Awaitable[None]]

# Produce errors -> what a coordinator's client is told (Kafka's GroupMetadataManager and
# TransactionStateManager map them alike).
STORE_ERRORS: Mapping[int, int] = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.FENCED_LEADER_EPOCH: ErrorCode.NOT_COORDINATOR,
}


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode``: 31-polynomial over UTF-16 code units, as a signed int32."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(key: str, partitions: int) -> int:
    """The internal topic's partition of a key (Kafka's ``Utils.abs(hash) % n``)."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class CoordinatorNode(NamedTuple):
    """FindCoordinator's answer."""

    error_code: int
    node_id: int = -1
    host: str = ""
    port: int = -1


class Replay(Protocol):
    """A coordinator's replay of one partition (step 4b)."""

    def apply(self, records: bytes, from_offset: int) -> int:
        """Apply the records at or after ``from_offset`` of a fetch's whole batches; return
        the next offset to read."""
        ...


class OwnedPartition(Protocol):
    """What this module keeps of a partition a coordinator holds; the coordinator's own class
    adds what it keeps (its groups, its transactions)."""

    leader_epoch: int
    loaded: bool
    loader: asyncio.Task[None] | None
    write_lock: asyncio.Lock


P = TypeVar("P", bound=OwnedPartition)
R = TypeVar("R", bound=Replay)


class KeyLocks:
    """One asyncio lock per key (a group id, a transactional id), made on first use; a key's
    lock is dropped with :meth:`discard` or :meth:`prune` so the table stays bounded."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def __call__(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def discard(self, key: str) -> None:
        """Forget ``key``'s lock: requests waiting on it keep it; new ones get a new lock."""
        self._locks.pop(key, None)

    def prune(self, keep: Callable[[str], bool]) -> None:
        """Forget the free locks of the keys ``keep`` says no."""
        for key in [k for k, lock in self._locks.items() if not lock.locked() and not keep(k)]:
            del self._locks[key]


class LoadFailed(Exception):
    """A load attempt that is retried (no ISR yet, a moving leader)."""


class InternalTopic(Generic[P, R]):
    """One internal topic's partitions led by broker ``broker_id`` (the module docstring)."""

    def __init__(
        self,
        backend: DataBackend,
        broker_id: int,
        topic: str,
        configs: Mapping[str, str],
        *,
        num_partitions: int,
        replication_factor: int,
        barrier: Callable[[], bytes],
        new_partition: Callable[[int], P],
        new_replay: Callable[[], R],
        loaded: Callable[[P, R], None],
        unloaded: Callable[[int, P], None],
        create_topic: CreateTopic | None = None,
        configure_topic: ConfigureTopic | None = None,
        min_insync_replicas: int | None = None,
        monotonic_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
    ) -> None:
        self._backend = backend
        self.broker_id = broker_id
        self.topic = topic
        self._configs = dict(configs)
        self._num_partitions = num_partitions
        self._replication_factor = replication_factor
        self._min_isr = min_insync_replicas  # capped by the replication factor at creation
        self._barrier = barrier  # one whole batch, appended as each load's barrier
        self._new_partition = new_partition
        self._new_replay = new_replay
        self._loaded = loaded
        self._unloaded = unloaded
        self._create_topic = create_topic
        self._configure_topic = configure_topic
        # The existing topic's cleanup.policy is the coordinator's (or there is no way to set it).
        self._topic_configured = configure_topic is None
        self._now = monotonic_ms
        self.owned: dict[int, P] = {}
        self.snapshot: Mapping[str, TopicState] = {}
        self._setting_up: asyncio.Task[None] | None = None
        self._last_set_up_ms = -CREATE_RETRY_MS
        self._changed = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None

    # --- placement ----------------------------------------------------------------------------

    def partition_of(self, key: str) -> int | None:
        """The key's partition by the snapshot the last refresh read (ownership is decided from
        it too); None while the topic is not in it."""
        state = self.snapshot.get(self.topic)
        if state is None or not state.partitions:
            return None
        return partition_for(key, len(state.partitions))

    def owner_of(self, key: str) -> P | None:
        """The partition holding ``key`` when this broker holds it (loaded or not)."""
        partition = self.partition_of(key)
        return self.owned.get(partition) if partition is not None else None

    def may_lead_soon(self, key: str) -> bool:
        """Whether this broker may come to hold ``key``'s partition: its metadata does not show
        the topic yet, or no other broker leading the partition."""
        state = self.snapshot.get(self.topic)
        if state is None or not state.partitions:
            return True
        leader = state.partitions[partition_for(key, len(state.partitions))].leader
        return leader in (-1, self.broker_id)

    async def find_coordinator(self, key: str) -> CoordinatorNode:
        """The broker leading ``key``'s partition, from the gateway's current metadata; sets the
        topic up when it does not exist (COORDINATOR_NOT_AVAILABLE meanwhile)."""
        topics = await self._backend.topics([self.topic])
        state = topics.get(self.topic)
        if state is None or not state.partitions:
            self.maybe_set_up_topic()
            return CoordinatorNode(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        leader = state.partitions[partition_for(key, len(state.partitions))].leader
        cluster = await self._backend.cluster()
        broker = next((b for b in cluster.brokers if b.node_id == leader), None)
        if leader < 0 or broker is None:
            return CoordinatorNode(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return CoordinatorNode(ErrorCode.NONE, broker.node_id, broker.host, broker.port)

    # --- waiting for changes --------------------------------------------------------------------

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next change of what this broker holds or has loaded (step 6)."""
        return self._changed

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --- setting the topic up -------------------------------------------------------------------

    def maybe_set_up_topic(self) -> None:
        """Start setting the topic up unless that runs or ran less than CREATE_RETRY_MS ago."""
        now = self._now()
        if self._create_topic is None and self._configure_topic is None:
            return
        if (self._setting_up and not self._setting_up.done()) or (
            now - self._last_set_up_ms < CREATE_RETRY_MS
        ):
            return
        self._last_set_up_ms = now
        self._setting_up = asyncio.get_running_loop().create_task(self._set_up_topic())

    async def set_up_topic(self) -> None:
        """Create the topic now, as the first FindCoordinator would (`raylog up` does this
        before it says ready, so that a cluster's first request is served at once); nothing
        when it exists. Raises what the creation raised."""
        if self.topic in await self._backend.topics([self.topic]):
            return
        if self._create_topic is None:
            raise RaylogError(f"this coordinator cannot create {self.topic}")
        await self._create()

    async def _create(self) -> None:
        assert self._create_topic is not None
        cluster = await self._backend.cluster()
        rf = max(1, min(self._replication_factor, len(cluster.brokers)))
        configs = dict(self._configs)
        if self._min_isr is not None:
            configs["min.insync.replicas"] = str(min(self._min_isr, rf))
        await self._create_topic(self.topic, self._num_partitions, rf, configs)
        log.info("created %s: %d partitions, RF %d", self.topic, self._num_partitions, rf)

    async def _set_up_topic(self) -> None:
        try:
            if self.topic not in await self._backend.topics([self.topic]):
                if self._create_topic is not None:
                    await self._create()
            elif self._configure_topic is not None:
                policy = {"cleanup.policy": self._configs["cleanup.policy"]}
                await self._configure_topic(self.topic, policy)
                self._topic_configured = True
        except Exception as exc:  # created by another gateway meanwhile, or no controller yet
            log.info("setting up %s: %s", self.topic, exc)

    # --- ownership ------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Step 3: load the partitions this broker newly leads, hand back those it lost."""
        self.snapshot = await self._backend.topics([self.topic])
        led: dict[int, int] = {}
        state = self.snapshot.get(self.topic)
        if state is not None:
            led = {
                p.partition: p.leader_epoch for p in state.partitions if p.leader == self.broker_id
            }
        for partition in list(self.owned):
            if self.owned[partition].leader_epoch != led.get(partition):
                self.unload(partition)
        if state is not None and not self._topic_configured:
            self.maybe_set_up_topic()
        for partition, epoch in led.items():
            if partition not in self.owned:
                owned = self.owned[partition] = self._new_partition(epoch)
                owned.loader = asyncio.get_running_loop().create_task(self._load(partition, owned))
        self.notify()

    def unload(self, partition: int) -> None:
        owned = self.owned.pop(partition)
        if owned.loader is not None:
            owned.loader.cancel()
        self._unloaded(partition, owned)
        log.info("broker %d: unloaded %s-%d", self.broker_id, self.topic, partition)

    def loaded_partitions(self) -> list[int]:
        return sorted(p for p, owned in self.owned.items() if owned.loaded)

    # --- running --------------------------------------------------------------------------------

    def start(self, tick: Callable[[], Awaitable[None]], name: str) -> None:
        """Run the coordinator's ``tick`` every TICK_MS until :meth:`stop` (a tick that raises
        is logged and the next one runs). Idempotent."""
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick_loop(tick, name))

    async def _tick_loop(self, tick: Callable[[], Awaitable[None]], name: str) -> None:
        while True:
            try:
                await tick()
            except Exception:
                log.exception("%s of broker %d: tick failed", name, self.broker_id)
            await asyncio.sleep(TICK_MS / 1000)

    async def stop(self, *tasks: asyncio.Task[None] | None) -> None:
        """Stop the tick, the set-up and the loads, and the coordinator's own ``tasks``, waiting
        for each to end; then hand every partition back (``unloaded``)."""
        running = [t for t in (self._ticker, self._setting_up, *tasks) if t is not None]
        running += [p.loader for p in self.owned.values() if p.loader is not None]
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._ticker = None
        for partition in list(self.owned):
            self.unload(partition)

    # --- loading --------------------------------------------------------------------------------

    async def _load(self, partition: int, owned: P) -> None:
        """Step 4, retried until done or unloaded."""
        while True:
            try:
                replay = await self._read_partition(partition, owned)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # LoadFailed is expected (no ISR yet, a moving leader); anything else is a
                # bug worth its traceback, but the partition must still load on a retry.
                if not isinstance(exc, LoadFailed):
                    log.exception("broker %d: loading %s-%d", self.broker_id, self.topic, partition)
                log.info("broker %d: loading %s-%d: %s", self.broker_id, self.topic, partition, exc)
                await asyncio.sleep(LOAD_RETRY_MS / 1000)
                continue
            self._loaded(owned, replay)
            owned.loaded = True
            self.notify()
            log.info("broker %d: loaded %s-%d", self.broker_id, self.topic, partition)
            return

    async def _read_partition(self, partition: int, owned: P) -> R:
        async with owned.write_lock:
            produced = await self._backend.produce(
                self.topic, partition, self._barrier(), -1, APPEND_TIMEOUT_MS
            )
        if produced.error_code:
            raise LoadFailed(f"barrier not written: error {produced.error_code}")
        end = produced.base_offset + 1
        start = await self._backend.list_offsets(self.topic, partition, -2, 0, -1)
        if start.error_code:
            raise LoadFailed(f"log start offset: error {start.error_code}")
        replay = self._new_replay()
        offset = start.offset
        while offset < end:
            fetched = await self._backend.fetch(
                self.topic, partition, PartitionFetch(offset, LOAD_FETCH_BYTES)
            )
            if fetched.error_code:
                raise LoadFailed(f"fetch at {offset}: error {fetched.error_code}")
            if not fetched.records:
                raise LoadFailed(f"no records at {offset} below the barrier at {end - 1}")
            next_offset = replay.apply(fetched.records, offset)
            if next_offset <= offset:
                raise LoadFailed(f"fetch at {offset} returned nothing past it")
            offset = next_offset
        return replay

    # --- writing --------------------------------------------------------------------------------

    async def append(self, partition: int, owned: P, batch: bytes) -> int:
        """Append one whole batch with acks=all (step 5): 0, or the produce error code as the
        replica answered it (the caller maps it for its clients, e.g. with STORE_ERRORS)."""
        error, _ = await self.append_at(partition, owned, batch)
        return error

    async def append_at(self, partition: int, owned: P, batch: bytes) -> tuple[int, int]:
        """:meth:`append`, also returning the base offset the batch got (-1 on an error)."""
        return await self.append_built(partition, owned, lambda: batch)

    async def append_built(
        self, partition: int, owned: P, build: Callable[[], bytes | None]
    ) -> tuple[int, int]:
        """:meth:`append_at` of the batch ``build`` returns once the partition's earlier writes
        are done (None: nothing to write, answered ``(0, -1)``): a coordinator that batches
        records decided while a write was in flight takes them in the order of the writes."""
        async with owned.write_lock:
            batch = build()
            if batch is None:
                return ErrorCode.NONE, -1
            result = await self._backend.produce(
                self.topic, partition, batch, -1, APPEND_TIMEOUT_MS
            )
        return result.error_code, result.base_offset
