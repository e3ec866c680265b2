"""ReplicaActor: the Ray actor that hosts one partition replica and its write-ahead log.

A thin shell around the pure state machine
(:class:`raylog.actors.replication.partition.PartitionReplica`) and a :class:`raylog.storage.Log`.
It owns the I/O the state machine may not do:

- carrying out each Ready in the order the state machine's contract fixes: log operations
  (truncate, append) on the real log, then the high-watermark checkpoint, then messages to
  other replicas, then AlterPartition proposals, then produce completions;
- fsync: appends are written on the actor's event loop (so the log assigns offsets in exactly
  the state machine's order) and made durable by one flusher task that fsyncs in a thread and
  reports ``LocalAppendDurable``. Appends that arrive while an fsync runs share the next one
  (group commit at the actor level);
- the clock (``tick`` every ``TICK_MS``), Ray calls to peers, and long polls for consumers.

Peers are found by name (:func:`replica_actor_name`) in the ``raylog`` namespace, so the
controller only has to create actors and send commands. Messages to peers are one-way (the state
machine retries what gets lost, as on any network): over the peer's replication channel, an
authenticated TCP link (:mod:`raylog.actors.transport.channel`), once it is connected; by a Ray call
until then, with at most ``PEER_CALLS_IN_FLIGHT_MAX`` outstanding per peer, beyond which messages
are dropped. The same channel takes the local gateway's produce, fetch and list_offsets calls.

A failed log (full disk, failed fsync) takes the replica offline, as Kafka does with an offline
log directory: every call then answers KAFKA_STORAGE_ERROR until the actor is re-created, which
recovers the log from disk. A killed actor restarted by Ray does exactly that in ``__init__``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import ray

from raylog.actors.calls import (
    NAMESPACE,
    DeleteRecordsOutcome,
    FetchOutcome,
    ProduceOutcome,
    ReplicaState,
    replica_actor_name,
)
from raylog.actors.control import config_keys
from raylog.actors.control.reassignment import ByteRateThrottle
from raylog.actors.replication.messages import (
    CONSUMER_REPLICA_ID,
    UNDEFINED_EPOCH,
    AlterPartitionRequest,
    BatchMeta,
    BecomeFollower,
    BecomeLeader,
    BecomeObserver,
    DeleteRecordsRequest,
    FetchRequest,
    FetchResponse,
    LocalAppendDurable,
    LocalLogStartAdvanced,
    ProduceRequest,
    RecordBatch,
    ReplicateRequest,
    StopReplica,
)
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.ready import (
    AdvanceLogStart,
    AppendBatch,
    Ready,
    ReplicaConfig,
    Role,
    SendFetchData,
    SendPushData,
    SendToReplica,
    TruncateTo,
)
from raylog.actors.transport.arena import ArenaError, ArenaViews
from raylog.actors.transport.channel import (
    ChannelAddress,
    ChannelServer,
    PeerLink,
    channel_secret,
    encode_frame,
    is_channel_message,
)
from raylog.storage import batch as rb
from raylog.storage import pki
from raylog.storage.batch import first_record_without_key, records_section
from raylog.storage.cleaner_process import run_in_child
from raylog.storage.errors import (
    FencedLeaderEpochError,
    InvalidRecordError,
    KafkaStorageError,
    NotLeaderOrFollowerError,
    PolicyViolationError,
    RaylogError,
    RequestTimedOutError,
    UnknownLeaderEpochError,
)
from raylog.storage.log import Extents, Log, LogConfig
from raylog.storage.pki import LeafCertificate
from raylog.storage.records import iter_records

log = logging.getLogger(__name__)

TICK_MS = 50  # timer resolution of the state machine (ISR lag, timeouts, parked fetches, flush.ms)
PEER_CALLS_IN_FLIGHT_MAX = 64  # one-way messages outstanding per peer before dropping
CHANNEL_START_S = 10.0  # bound on learning a peer's replication channel address
# Methods the gateway may call over a replica's channel, with their argument types.
# (Types, not msgspec Decoders: Ray pickles this module's globals with the actor class.)
_CHANNEL_CALL_ARGS: dict[str, Any] = {
    "produce": tuple[bytes, int, int],
    "open_arena": tuple[int, int, str],
    "produce_shared": tuple[int, int, str, int, int, int, int],
    "fetch": tuple[int, int, int, int, int],
    "fetch_extents": tuple[int, int, int, int, int],
    "list_offsets": tuple[int, int],
}
RETENTION_CHECK_INTERVAL_MS_DEFAULT = 300_000  # log.retention.check.interval.ms (Kafka's)
CLEANER_BACKOFF_MS_DEFAULT = 15_000  # log.cleaner.backoff.ms (Kafka's)
HW_CHECKPOINT_INTERVAL_MS = 1_000  # the HW checkpoint is lazy; recovery clamps it
CONSUMER_WAIT_MS_MAX = 30_000  # bound on a consumer long poll
REQUEST_TIMEOUT_MS_MAX = 300_000  # bound on a produce request's timeout


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _log_and_flush_configs(configs: dict[str, str] | None) -> tuple[LogConfig, int, int]:
    """The log's configs, flush.messages and flush.ms (raises InvalidConfigError)."""
    configs = configs or {}
    flush = config_keys.flush_policy(configs)
    return config_keys.log_config(configs), flush.messages, flush.interval_ms


# The pushes of one Ready, by range: the message and its frame (None over Ray calls).
_Pushed = dict[tuple[int, int, int, ReplicateRequest], tuple[ReplicateRequest, bytearray | None]]


def _fresh_range(
    fresh: dict[int, RecordBatch], start: int, end: int, max_bytes: int
) -> tuple[RecordBatch, ...] | None:
    """The batches of ``fresh`` (by base offset) from ``start`` up to ``end`` as a log read
    with ``max_bytes`` would return them (the first whole, then while the total fits), or None
    when ``fresh`` does not hold that range."""
    batches: list[RecordBatch] = []
    total = 0
    offset = start
    while offset < end:
        batch = fresh.get(offset)
        if batch is None or batch.meta.next_offset > end:
            return None
        if batches and total + batch.meta.size_bytes > max_bytes:
            break
        batches.append(batch)
        total += batch.meta.size_bytes
        offset = batch.meta.next_offset
    return tuple(batches) if batches else None


def _picklable(message: Any) -> Any:
    """``message`` with its batches as bytes, for a Ray call: a batch read from the log is a
    memoryview of the bytes read (:meth:`ReplicaActor._read_batches`), which the channel encodes
    as it is and pickle refuses."""
    batches = getattr(message, "batches", None)
    if not batches or not any(isinstance(b.data, memoryview) for b in batches):
        return message
    copies = tuple(RecordBatch(b.meta, bytes(b.data)) for b in batches)
    return msgspec.structs.replace(message, batches=copies)


def _batch_meta(header: rb.BatchHeader) -> BatchMeta:
    """What the state machine knows of a stored batch, from its header."""
    return BatchMeta(
        header.base_offset,
        header.last_offset_delta + 1,  # offsets spanned: a compacted batch holds fewer records
        header.size,
        header.partition_leader_epoch,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
    )


@dataclass
class _Flusher:
    """Group commit: at most one fsync in flight; appends during it wait for the next one."""

    wanted: bool = False
    running: bool = False


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=1000)
class ReplicaActor:
    """One partition replica: a state machine, its log, and the Ray plumbing between them."""

    _loop: asyncio.AbstractEventLoop  # the actor's event loop, known from the first call

    def __init__(
        self,
        topic: str,
        partition: int,
        replica_id: int,
        log_dir: str,
        topic_config: dict[str, str] | None = None,
        replica_config: ReplicaConfig | None = None,
        session_lease: bool = False,
        retention_check_interval_ms: int = RETENTION_CHECK_INTERVAL_MS_DEFAULT,
        replication_channel: bool = True,
        cleaner_backoff_ms: int = CLEANER_BACKOFF_MS_DEFAULT,
        tls: LeafCertificate | None = None,
    ) -> None:
        self.topic = topic
        # Leader lease (set by a BrokerActor): with ``session_lease`` the replica accepts produce
        # only while now_ms() < _lease_until_ms, a time on this machine's monotonic clock that
        # the broker extends after each heartbeat the controller accepted. Starts lapsed.
        self._lease_required = session_lease
        self._lease_until_ms = 0
        self.partition = partition
        self.replica_id = replica_id
        log_config, self._flush_messages, self._flush_ms = _log_and_flush_configs(topic_config)
        self._max_message_bytes = log_config.max_message_bytes
        # Recovery happens here, also when Ray restarts a killed actor.
        self._log = Log.open(Path(log_dir), log_config)
        self._sm = PartitionReplica(
            replica_id,
            replica_config or ReplicaConfig(),
            log_start_offset=self._log.log_start_offset,
            log_end_offset=self._log.log_end_offset,
            epoch_cache=[(e.epoch, e.start_offset) for e in self._log.epoch_entries],
            high_watermark=self._log.high_watermark,
            # Idempotent-producer state: rebuilt from the WAL's batch headers (no bodies read).
            producer_batches=(
                _batch_meta(h) for h in self._log.batch_headers() if h.producer_id >= 0
            ),
        )
        self._offline: str | None = None
        self._next_request_id = 1
        self._produce_waiters: dict[int, asyncio.Future[ProduceOutcome]] = {}
        self._delete_waiters: dict[int, asyncio.Future[DeleteRecordsOutcome]] = {}
        # A consumer fetch's answer: the response and its batches as one byte string.
        self._fetch_waiters: dict[
            int, asyncio.Future[tuple[FetchResponse, bytes, Extents | None]]
        ] = {}
        self._extent_requests: set[int] = set()  # consumer fetches answered with extents
        self._node = ""  # this replica's Ray node id, once asked (fetch_extents)
        self._peers: dict[int, Any] = {}
        self._peer_calls: dict[int, int] = {}
        self._flusher = _Flusher()
        self._unflushed_records = 0
        self._unflushed_since_ms = 0  # when the oldest unflushed append was made (relaxed policy)
        self._hw_waiters: list[asyncio.Future[None]] = []  # consumer long polls
        self._hw_notified = self._sm.high_watermark  # the HW long polls last heard of
        self._hw_checkpointed = self._log.high_watermark
        self._hw_checkpoint_ms = 0
        self._controller: Any = None
        self._ticker: asyncio.Task[None] | None = None
        self._retention_interval_ms = max(1, retention_check_interval_ms)
        self._retention_checked_ms = now_ms()
        # Log compaction: checked every log.cleaner.backoff.ms, one pass at a time, off the
        # event loop (a pass reads and rewrites segments; only its swap takes the log's lock).
        self._cleaner_backoff_ms = max(1, cleaner_backoff_ms)
        self._cleaner_checked_ms = now_ms()
        self._cleaning: asyncio.Task[None] | None = None
        self._cleaner_stats = {"passes": 0, "records_removed": 0, "bytes_freed": 0}
        self._throttle: ByteRateThrottle | None = None  # see set_replication_throttle
        # Replication messages go over direct links (TCP; a Unix socket within one machine; see
        # actors/transport/channel.py) when enabled.
        self._use_channel = replication_channel
        self._channel: ChannelServer | None = None
        self._channel_address: asyncio.Future[ChannelAddress | None] | None = None
        self._links: dict[int, PeerLink] = {}
        self._ray_calls_out = 0
        self._sent_before_write = 0  # pushes / fetch answers built before the local write
        self._arenas = (
            ArenaViews()
        )  # same-host gateways' produce arenas (actors/transport/arena.py)
        self.shared_produces = 0  # batches appended straight from a gateway's arena
        self._channel_secret = channel_secret() if replication_channel else b""
        # Mutual TLS on the channels when the broker has a certificate from the cluster CA.
        self._tls_server = pki.server_context(tls) if tls is not None else None
        self._tls_client = pki.client_context(tls) if tls is not None else None

    # --- lifecycle ----------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        """Start the ticker on the actor's event loop (not available in ``__init__``)."""
        if self._ticker is None:
            self._loop = asyncio.get_running_loop()
            self._ticker = self._loop.create_task(self._tick_loop())
            self._channel_address = self._loop.create_future()
            if self._use_channel:
                self._loop.create_task(self._start_channel())
            else:
                self._channel_address.set_result(None)

    async def _start_channel(self) -> None:
        assert self._channel_address is not None
        name = replica_actor_name(self.topic, self.partition, self.replica_id)
        server = ChannelServer(
            name, self._channel_secret, self._on_channel_message, self._channel_call
        )
        try:
            address = await server.start(ray.util.get_node_ip_address(), tls=self._tls_server)
        except OSError as exc:  # no port: replication still works over Ray calls
            log.warning("replica %s: no replication channel: %s", name, exc)
            self._channel_address.set_result(None)
            return
        self._channel = server
        self._channel_address.set_result(address)

    async def channel_address(self) -> ChannelAddress | None:
        """Where peers connect this replica's replication channel (None: use Ray calls)."""
        self._ensure_started()
        assert self._channel_address is not None
        return await asyncio.wait_for(asyncio.shield(self._channel_address), CHANNEL_START_S)

    async def channel_stats(self) -> dict[str, int]:
        """Replication messages that went over channels (in, out, dropped) and Ray calls sent."""
        return {
            "messages_in": self._channel.messages_in if self._channel else 0,
            "messages_out": sum(link.messages_out for link in self._links.values()),
            "dropped": sum(link.dropped for link in self._links.values()),
            "rejected": self._channel.rejected if self._channel else 0,
            "tls": int(self._channel is not None and self._channel.tls),
            "local_links_in": self._channel.local_links if self._channel else 0,
            "tcp_links_in": self._channel.tcp_links if self._channel else 0,
            "calls_in": self._channel.calls_in if self._channel else 0,
            "ray_calls_out": self._ray_calls_out,
            "sent_before_write": self._sent_before_write,
            "shared_produces": self.shared_produces,
        }

    async def _channel_call(self, method: str, raw_args: msgspec.Raw) -> Any:
        """A data-path call that came over the channel (the local gateway's produce, fetch and
        list_offsets): the same methods Ray calls reach, without a Ray call's cost."""
        arg_types = _CHANNEL_CALL_ARGS.get(method)
        if arg_types is None:
            raise ValueError(f"{method!r} is not callable over the channel")
        return await getattr(self, method)(*msgspec.msgpack.decode(raw_args, type=arg_types))

    def _on_channel_message(self, message: Any) -> None:
        if self._offline is None:
            self._step(message)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_MS / 1000)
            if self._offline is not None:
                continue
            try:
                self._sm.tick(now_ms())
                self._drain()
                self._maybe_flush_by_time()
                await self._maybe_checkpoint_hw()
                self._maybe_enforce_retention()
                self._maybe_clean()
            except Exception as exc:
                log.exception(
                    "replica %s-%d@%d: tick failed", self.topic, self.partition, self.replica_id
                )
                self._go_offline(f"tick failed: {exc!r}")
                raise

    def _maybe_enforce_retention(self) -> None:
        """Every ``log.retention.check.interval.ms``: delete whole segments past retention.ms /
        retention.bytes, only below the high watermark, and tell the state machine where the
        log starts now. Each replica applies retention to its own log, as Kafka's do."""
        now = now_ms()
        if now - self._retention_checked_ms < self._retention_interval_ms:
            return
        self._retention_checked_ms = now
        try:
            deleted = self._log.enforce_retention(
                time.time_ns() // 1_000_000, self._sm.high_watermark
            )
        except KafkaStorageError as exc:  # as Kafka on a failed log dir: this replica goes offline
            self._go_offline(str(exc))
            return
        if deleted:
            self._step(LocalLogStartAdvanced(self._log.log_start_offset))

    def _maybe_clean(self) -> None:
        """Every ``log.cleaner.backoff.ms``: start a compaction pass of a compacted topic's log
        when one is due (see Log.clean), below the high watermark only. Each replica compacts
        its own log, as Kafka's do; offsets never change, so replicas still agree on them."""
        now = now_ms()
        if self._cleaning is not None or now - self._cleaner_checked_ms < self._cleaner_backoff_ms:
            return
        self._cleaner_checked_ms = now
        wall = time.time_ns() // 1_000_000
        high_watermark = self._sm.high_watermark
        if self._log.config.compact and self._log.cleaning_due(wall, high_watermark):
            self._cleaning = self._loop.create_task(self._clean(wall, high_watermark))

    async def _clean(self, wall_ms: int, high_watermark: int) -> None:
        try:
            # The rewrite runs in a child process: in a thread here its record decoding would
            # hold the GIL and delay this event loop by ~5 ms at every turn for the whole pass.
            result = await asyncio.to_thread(
                self._log.clean, wall_ms, high_watermark, runner=run_in_child
            )
        except KafkaStorageError as exc:  # as Kafka on a failed log dir: this replica goes offline
            self._go_offline(str(exc))
            return
        finally:
            self._cleaning = None
        if result is not None:
            self._cleaner_stats["passes"] += 1
            self._cleaner_stats["records_removed"] += result.records_removed
            self._cleaner_stats["bytes_freed"] += result.bytes_before - result.bytes_after

    async def cleaner_stats(self) -> dict[str, int]:
        """What the log cleaner did: passes, records removed, bytes freed, where the cleaned
        part of the log ends (the first dirty offset), and whether it gave up on corrupt
        bytes (uncleanable: 1)."""
        return {
            **self._cleaner_stats,
            "first_dirty_offset": self._log.first_dirty_offset,
            "uncleanable": int(self._log.uncleanable is not None),
        }

    async def ping(self) -> int:
        """Liveness check; returns the replica id."""
        self._ensure_started()
        return self.replica_id

    async def pid(self) -> int:
        """This replica's process id (each replica actor is a process of its own)."""
        return os.getpid()

    async def state(self) -> ReplicaState:
        self._ensure_started()
        sm = self._sm
        return ReplicaState(
            topic=self.topic,
            partition=self.partition,
            replica_id=self.replica_id,
            role=sm.role.value,
            leader_id=sm.leader_id,
            leader_epoch=sm.leader_epoch,
            partition_epoch=sm.partition_epoch,
            isr=tuple(sm.isr),
            high_watermark=sm.high_watermark,
            log_start_offset=sm.log_start_offset,
            log_end_offset=sm.log_end_offset,
            durable_end_offset=sm.durable_end_offset,
            offline=self._offline,
            log_size_bytes=self._log.size_bytes,
            cleaner_passes=self._cleaner_stats["passes"],
            cleaner_records_removed=self._cleaner_stats["records_removed"],
            cleaner_dirty_ratio=self._log.dirty_ratio(),
        )

    def set_session_lease(self, until_ms: int) -> str | None:
        """Accept produce until ``until_ms`` (this machine's monotonic ms); only ever extends.
        Returns why this replica is offline (its log failed), None while it serves."""
        self._lease_until_ms = max(self._lease_until_ms, until_ms)
        return self._offline

    def revoke_session_lease(self) -> bool:
        """Stop accepting produce at once (until the next grant); True once done."""
        self._lease_until_ms = 0
        return True

    def set_replication_throttle(self, bytes_per_sec: int) -> None:
        """``leader.replication.throttled.rate`` for fetches of followers outside the ISR (the
        replicas a reassignment adds, catching up); 0 lifts it. ISR members are never held."""
        if bytes_per_sec <= 0:
            self._throttle = None
        elif self._throttle is None or self._throttle.bytes_per_sec != bytes_per_sec:
            self._throttle = ByteRateThrottle(bytes_per_sec, now_ms())

    async def reconfigure(
        self, topic_config: dict[str, str], replica_config: ReplicaConfig
    ) -> bool:
        """Apply a topic's changed configs in place, as Kafka applies dynamic topic configs:
        no restart, no leadership change, no client error. False (nothing changed) when
        ``replication.mode`` changed: the broker re-creates the replica from its WAL then.
        Raises InvalidConfigError for a bad value (nothing changed either)."""
        self._ensure_started()
        if replica_config.replication_mode != self._sm.config.replication_mode:
            return False
        log_config, flush_messages, flush_ms = _log_and_flush_configs(topic_config)
        self._sm.reconfigure(replica_config)  # validates before it changes anything
        self._log.reconfigure(log_config)
        self._max_message_bytes = log_config.max_message_bytes
        self._flush_messages = flush_messages
        self._flush_ms = flush_ms
        if flush_messages <= 1 and self._unflushed_records:
            # Back to fsync-per-append: what the relaxed policy left unflushed goes now.
            self._unflushed_records = 0
            self._request_flush(report=False)
        return True

    def set_controller(self, controller: Any) -> None:
        """The actor (this replica's broker) that receives AlterPartition proposals
        (``alter_partition``) and hears when this replica goes offline (``replica_offline``)."""
        self._controller = controller

    # --- controller commands ------------------------------------------------------------------

    async def become_leader(self, command: BecomeLeader) -> ReplicaState:
        return await self._command(command)

    async def become_follower(self, command: BecomeFollower) -> ReplicaState:
        return await self._command(command)

    async def become_observer(self, command: BecomeObserver) -> ReplicaState:
        return await self._command(command)

    async def stop_replica(self, command: StopReplica) -> ReplicaState:
        return await self._command(command)

    async def _command(self, command: Any) -> ReplicaState:
        self._ensure_started()
        self._raise_if_offline()
        # Peers may have been re-created under their names since we looked them up (a restarted
        # broker): look them up again, or a fetch sent to a dead handle waits fetch_timeout_ms.
        self._peers.clear()
        self._step(command)
        return await self.state()

    # --- the data path ------------------------------------------------------------------------

    async def produce(self, batch: bytes, acks: int, timeout_ms: int) -> ProduceOutcome:
        """Append one client batch; return when the acks condition holds (or fails)."""
        self._ensure_started()
        start = self._sm.log_start_offset
        refused = self._refuse_leader_write()
        if refused is not None:
            return ProduceOutcome(refused[0], -1, start, refused[1])
        try:
            header = rb.validate_client_batch(batch, self._max_message_bytes)
            # Kafka's LogValidator: compaction keeps the latest record of each key, so a record
            # without one has no place in a compacted log. Decodes (and decompresses) the batch.
            keyless = first_record_without_key(batch) if self._log.config.compact else None
        except RaylogError as exc:
            return ProduceOutcome(exc.error_code, -1, start, str(exc))
        if keyless is not None:
            return ProduceOutcome(
                InvalidRecordError.error_code,
                -1,
                start,
                "Compacted topic cannot accept message without key in topic partition "
                f"{self.topic}-{self.partition} (record {keyless} of the batch).",
            )
        request_id = self._new_request_id()
        waiter: asyncio.Future[ProduceOutcome] = asyncio.get_running_loop().create_future()
        self._produce_waiters[request_id] = waiter
        timeout_ms = max(0, min(timeout_ms, REQUEST_TIMEOUT_MS_MAX))
        self._step(
            ProduceRequest(
                request_id,
                acks,
                timeout_ms,
                header.records_count,
                header.size,
                batch,
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
            )
        )
        if acks == 0:
            # Kafka answers nothing for acks=0; the caller still learns the assigned offset.
            self._produce_waiters.pop(request_id, None)
            if waiter.done():
                return waiter.result()
            return ProduceOutcome(0, -1, start)
        try:
            # The state machine times out acks=all itself; this bound only guards the shell.
            return await asyncio.wait_for(waiter, timeout=timeout_ms / 1000 + 5)
        except TimeoutError:
            self._produce_waiters.pop(request_id, None)
            return ProduceOutcome(RequestTimedOutError.error_code, -1, start, "no completion")

    def _refuse_leader_write(self) -> tuple[int, str] | None:
        """Why this replica may not change its log for a client now, as (error code, message):
        offline, or (with a session lease) no confirmed broker session, when another replica
        may already lead (no split brain). None: go ahead."""
        if self._offline is not None:
            return KafkaStorageError.error_code, self._offline
        if self._lease_required and now_ms() >= self._lease_until_ms:
            return NotLeaderOrFollowerError.error_code, "broker session lease lapsed"
        return None

    async def open_arena(self, pid: int, fd: int, nonce: str) -> bool:
        """Map a same-host gateway's produce arena (``raylog.actors.transport.arena``); True when
        that worked, after which the gateway hands this replica batches by reference."""
        try:
            self._arenas.open((pid, fd, nonce))
        except ArenaError as exc:
            log.info("%s-%d: %s; batches come in the calls", self.topic, self.partition, exc)
            return False
        return True

    async def produce_shared(
        self, pid: int, fd: int, nonce: str, offset: int, length: int, acks: int, timeout_ms: int
    ) -> ProduceOutcome:
        """:meth:`produce` of the batch at ``offset`` in the gateway arena ``(pid, fd,
        nonce)``: validated and written to the log from there (the gateway changes nothing in
        it until this call's reply). Raises ArenaError when the arena or range is not there."""
        batch = self._arenas.view((pid, fd, nonce), offset, length)
        self.shared_produces += 1
        return await self.produce(batch, acks, timeout_ms)  # type: ignore[arg-type]

    async def delete_records(self, offset: int, timeout_ms: int) -> DeleteRecordsOutcome:
        """Kafka's DeleteRecords for this partition, on its leader: move the log start offset
        up to ``offset`` (-1: the high watermark) and return once every in-sync replica's log
        starts there (the low watermark), or REQUEST_TIMED_OUT after ``timeout_ms``. As Kafka's
        Partition.deleteRecordsOnLeader: NOT_LEADER_OR_FOLLOWER off the leader, then
        POLICY_VIOLATION when cleanup.policy lacks delete, then OFFSET_OUT_OF_RANGE for an
        offset above the high watermark or negative (the state machine's checks)."""
        self._ensure_started()
        refused = self._refuse_leader_write()
        if refused is not None:
            return DeleteRecordsOutcome(refused[0], -1, refused[1])
        if self._sm.role is not Role.LEADER:
            return DeleteRecordsOutcome(NotLeaderOrFollowerError.error_code, -1, "not the leader")
        if not self._log.config.delete:
            return DeleteRecordsOutcome(
                PolicyViolationError.error_code,
                -1,
                f"records of {self.topic}-{self.partition} cannot be deleted: its "
                f"cleanup.policy is {self._log.config.cleanup_policy}",
            )
        request_id = self._new_request_id()
        waiter: asyncio.Future[DeleteRecordsOutcome] = asyncio.get_running_loop().create_future()
        self._delete_waiters[request_id] = waiter
        timeout_ms = max(0, min(timeout_ms, REQUEST_TIMEOUT_MS_MAX))
        self._step(DeleteRecordsRequest(request_id, offset, timeout_ms))
        try:
            # The state machine times the request out itself; this bound only guards the shell.
            return await asyncio.wait_for(waiter, timeout=timeout_ms / 1000 + 5)
        except TimeoutError:
            self._delete_waiters.pop(request_id, None)
            return DeleteRecordsOutcome(RequestTimedOutError.error_code, -1, "no completion")

    async def fetch(
        self,
        fetch_offset: int,
        max_bytes: int,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        current_leader_epoch: int = UNDEFINED_EPOCH,
    ) -> FetchOutcome:
        """Consumer fetch: whole batches from ``fetch_offset``, never at or above the HW.

        Long-polls up to ``max_wait_ms`` until at least ``min_bytes`` are available. Followers
        serve consumers too, up to their own high watermark (KIP-392).
        """
        return await self._fetch(
            fetch_offset, max_bytes, max_wait_ms, min_bytes, current_leader_epoch, False
        )

    async def _fetch(
        self,
        fetch_offset: int,
        max_bytes: int,
        max_wait_ms: int,
        min_bytes: int,
        current_leader_epoch: int,
        extents: bool,
    ) -> FetchOutcome:
        """:meth:`fetch`; with ``extents`` the answer locates the batches instead of holding
        them (:meth:`fetch_extents`)."""
        self._ensure_started()
        deadline = now_ms() + max(0, min(max_wait_ms, CONSUMER_WAIT_MS_MAX))
        while True:
            hw_seen = self._sm.high_watermark
            outcome = await self._fetch_once(fetch_offset, max_bytes, current_leader_epoch, extents)
            remaining_ms = deadline - now_ms()
            if outcome.error_code or outcome.size >= max(1, min_bytes):
                return outcome
            if remaining_ms <= 0:
                return outcome
            if self._sm.high_watermark == hw_seen:
                # Wait for the next HW move (set by _drain), or the deadline.
                waiter: asyncio.Future[None] = self._loop.create_future()
                self._hw_waiters.append(waiter)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter, timeout=remaining_ms / 1000)

    async def _fetch_once(
        self, fetch_offset: int, max_bytes: int, current_leader_epoch: int, extents: bool
    ) -> FetchOutcome:
        sm = self._sm
        if self._offline is not None:
            return FetchOutcome(KafkaStorageError.error_code, -1, -1, -1, b"", -1, self._offline)
        request_id = self._new_request_id()
        waiter: asyncio.Future[tuple[FetchResponse, bytes, Extents | None]] = (
            asyncio.get_running_loop().create_future()
        )
        self._fetch_waiters[request_id] = waiter
        if extents:
            self._extent_requests.add(request_id)
        self._step(
            FetchRequest(
                CONSUMER_REPLICA_ID,
                request_id,
                current_leader_epoch,
                fetch_offset,
                UNDEFINED_EPOCH,
                max(1, max_bytes),
            )
        )
        try:
            response, records, located = await asyncio.wait_for(waiter, timeout=10)
        except TimeoutError:
            self._fetch_waiters.pop(request_id, None)
            self._extent_requests.discard(request_id)
            return FetchOutcome(RequestTimedOutError.error_code, -1, -1, -1, b"")
        return FetchOutcome(
            response.error_code,
            response.high_watermark,
            response.high_watermark,  # no transactions yet: the LSO is the HW
            response.log_start_offset,
            records,
            sm.leader_epoch,
            extents=located,
        )

    async def read_committed(
        self, fetch_offset: int, max_bytes: int, max_wait_ms: int = 0
    ) -> FetchOutcome:
        """Bulk read for pipelines, called through Ray: :meth:`fetch`'s answer with its
        records out of band.

        The records go as a pickle-5 buffer, so Ray writes them into its object store once
        and the reader gets a read-only view of them there (``ray._raylet.SubBuffer``), not
        an unpickled copy: for the 8 MiB reads of Spark and Ray Data, one copy and a fresh
        8 MiB allocation fewer per call.
        """
        outcome = await self.fetch(fetch_offset, max_bytes, max_wait_ms)
        if not outcome.records:
            return outcome
        return msgspec.structs.replace(outcome, records=pickle.PickleBuffer(outcome.records))

    async def fetch_extents(
        self,
        fetch_offset: int,
        max_bytes: int,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        current_leader_epoch: int = UNDEFINED_EPOCH,
    ) -> FetchOutcome:
        """:meth:`fetch` for a reader on this replica's Ray node (``node_id``): the answer
        locates the batches in the segment files (``extents``, from their headers alone) and
        the reader reads them itself (:mod:`raylog.storage.short_circuit`), so no record bytes
        cross a socket or Ray: a short-circuit read, as HDFS has. The reader checks the CRCs
        and the span it read, and falls back to :meth:`fetch` or :meth:`read_committed`.
        The local gateway calls it over the channel; pipeline readers by Ray.
        """
        outcome = await self._fetch(
            fetch_offset, max_bytes, max_wait_ms, min_bytes, current_leader_epoch, True
        )
        return msgspec.structs.replace(outcome, node_id=self._node_id())

    def _node_id(self) -> str:
        if not self._node:
            self._node = str(ray.get_runtime_context().get_node_id())
        return self._node

    async def list_offsets(
        self, timestamp: int, current_leader_epoch: int = UNDEFINED_EPOCH
    ) -> tuple[int, int, int, int]:
        """Kafka's ListOffsets on the leader: ``(error_code, timestamp, offset, leader_epoch)``.

        -2 (earliest) is the log start offset, -1 (latest) the last fetchable offset (the HW;
        for read_committed the LSO, which equals the HW while raylog has no transactions), and
        any other value the first batch whose maxTimestamp >= ``timestamp`` with that
        maxTimestamp (batch precision: records are not decoded). As in Kafka, a batch at or
        above the HW is not offered, and (-1, -1) means no batch is that late.
        """
        self._ensure_started()
        sm = self._sm
        if self._offline is not None:
            return (KafkaStorageError.error_code, -1, -1, -1)
        if sm.role is not Role.LEADER:
            return (NotLeaderOrFollowerError.error_code, -1, -1, -1)
        if current_leader_epoch != UNDEFINED_EPOCH and current_leader_epoch < sm.leader_epoch:
            return (FencedLeaderEpochError.error_code, -1, -1, sm.leader_epoch)
        if current_leader_epoch > sm.leader_epoch:
            return (UnknownLeaderEpochError.error_code, -1, -1, sm.leader_epoch)
        if timestamp == -2:
            return (0, -1, sm.log_start_offset, sm.leader_epoch)
        if timestamp == -1:
            return (0, -1, sm.high_watermark, sm.leader_epoch)
        try:
            found = self._log.offset_for_timestamp(timestamp)
        except RaylogError as exc:
            return (exc.error_code, -1, -1, -1)
        if found is None or found.offset >= sm.high_watermark:
            return (0, -1, -1, sm.leader_epoch)
        try:
            record = self._first_record_at(found.offset, timestamp, sm.high_watermark)
        except RaylogError as exc:
            return (exc.error_code, -1, -1, -1)
        # A batch whose maxTimestamp no record reaches (a client set it so): the batch's own.
        stamp, offset = record if record is not None else (found.timestamp, found.offset)
        return (0, stamp, offset, sm.leader_epoch)

    def _first_record_at(
        self, batch_offset: int, timestamp: int, below: int
    ) -> tuple[int, int] | None:
        """``(timestamp, offset)`` of the first record at or after ``timestamp`` in the batch
        at ``batch_offset`` (whose maxTimestamp is that late): Kafka's record precision, as its
        LogSegment.findOffsetByTimestamp reads records inside the batch it found."""
        data = self._log.read(batch_offset, 1, max_offset=below)  # that one batch, whole
        header = rb.parse_header(data, 0)
        for record in iter_records(records_section(data, header), header.records_count):
            offset = header.base_offset + record.offset_delta
            stamp = (
                header.max_timestamp
                if header.is_log_append_time
                else header.base_timestamp + record.timestamp_delta
            )
            # batch_offset is the log start offset when that lies inside the batch.
            if offset >= batch_offset and stamp >= timestamp:
                return stamp, offset
        return None

    # --- replica to replica ---------------------------------------------------------------------

    async def deliver(self, message: Any) -> None:
        """A one-way message from another replica (fetch, fetch response, push, push ack)."""
        self._ensure_started()
        if self._offline is not None:
            return
        self._step(message)

    async def alter_partition_response(self, message: Any) -> None:
        """The controller's answer to an AlterPartition proposal."""
        self._ensure_started()
        if self._offline is None:
            self._step(message)

    # --- carrying out Ready -----------------------------------------------------------------------

    def _new_request_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id

    def _raise_if_offline(self) -> None:
        if self._offline is not None:
            raise KafkaStorageError(self._offline)

    def _step(self, message: Any) -> None:
        try:
            self._sm.step(message, now_ms())
            self._drain()
        except KafkaStorageError as exc:
            self._go_offline(str(exc))

    def _drain(self) -> None:
        """Carry out every pending Ready, in the contract's order."""
        for _ in range(1_000):  # a Ready's effects may produce another Ready; bounded
            if not self._sm.has_ready():
                self._wake_long_polls()
                return
            ready = self._sm.ready()
            # 0. This Ready's new batches go to the followers waiting for them first.
            sent_early = self._send_fresh(ready)
            appended_records = 0
            # 1. Log operations, in order.
            for op in ready.log_ops:
                if isinstance(op, TruncateTo):
                    if op.full:
                        self._log.truncate_fully_and_start_at(op.offset)
                    else:
                        self._log.truncate_to(op.offset)
                elif isinstance(op, AdvanceLogStart):
                    self._log.advance_log_start(op.offset, self._sm.high_watermark)
                else:
                    assert isinstance(op, AppendBatch)
                    appended_records += op.batch.record_count
                    self._append(op)
            if appended_records:
                self._after_append(appended_records)
            # 2. The HW checkpoint is lazy (see _maybe_checkpoint_hw).
            # 3. Messages.
            pushed: _Pushed = {}
            for index, out in enumerate(ready.messages):
                if index in sent_early:
                    continue
                if isinstance(out, SendToReplica):
                    self._send(out.to, out.message)
                elif isinstance(out, SendPushData):
                    self._send_push(out, pushed, None)
                else:
                    assert isinstance(out, SendFetchData)
                    self._send_fetch_data(out)
            # 4. AlterPartition proposals.
            for request in ready.alter_partition:
                self._propose(request)
            # 5. Produce completions.
            for result in ready.produce_results:
                waiter = self._produce_waiters.pop(result.request_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(
                        ProduceOutcome(
                            result.error_code,
                            result.base_offset,
                            self._sm.log_start_offset,
                            result.message,
                        )
                    )
            for deleted in ready.delete_records_results:
                delete_waiter = self._delete_waiters.pop(deleted.request_id, None)
                if delete_waiter is not None and not delete_waiter.done():
                    delete_waiter.set_result(
                        DeleteRecordsOutcome(
                            deleted.error_code, deleted.low_watermark, deleted.message
                        )
                    )
            self._wake_long_polls()
        raise RuntimeError("state machine kept producing Ready: bound of 1000 rounds reached")

    def _send_fresh(self, ready: Ready) -> set[int]:
        """Leader: send the batches this Ready appends to the followers waiting for them (push
        requests; parked fetches of in-sync followers) before writing them locally, built in
        memory as the log will store them (base offset and leader epoch stamped). The transfer
        and the followers' writes then overlap the leader's own write instead of following it:
        klite's "replicate while the leader persists". Safe because the high watermark still
        waits for the leader's own fsync (``LocalAppendDurable``); a batch a follower holds and
        the leader then fails to write is an unacknowledged suffix, which the next leader keeps
        or truncates as Kafka does. Returns the indexes in ``ready.messages`` it sent; the rest
        (older ranges, a LogAppendTime topic whose stamp the log sets) go after the write.
        """
        if (
            not ready.log_ops
            or self._log.config.log_append_time
            or not any(isinstance(out, SendPushData | SendFetchData) for out in ready.messages)
        ):
            return set()  # nothing to send early: no batch is copied
        fresh: dict[int, RecordBatch] = {}
        for op in ready.log_ops:
            if isinstance(op, AdvanceLogStart):
                continue  # moves the log start, which the fresh batches are above
            if isinstance(op, TruncateTo) or op.replicated:
                return set()  # only a leader's plain appends
            data = bytearray(op.data)  # the one copy: the client's bytes are immutable
            rb.set_base_offset(data, 0, op.batch.base_offset)
            rb.set_partition_leader_epoch(data, 0, op.batch.leader_epoch)
            fresh[op.batch.base_offset] = RecordBatch(op.batch, data)  # type: ignore[arg-type]
        sent: set[int] = set()
        pushed: _Pushed = {}
        for index, out in enumerate(ready.messages):
            if isinstance(out, SendPushData):
                batches = _fresh_range(fresh, out.base_offset, out.end_offset, out.max_bytes)
                if batches is None:
                    continue
                self._send_push(out, pushed, batches)
                sent.add(index)
                self._sent_before_write += 1
            elif (
                isinstance(out, SendFetchData)
                and out.to != CONSUMER_REPLICA_ID
                and out.response.error_code == 0
                and (self._throttle is None or out.to in self._sm.isr)
            ):
                batches = _fresh_range(fresh, out.fetch_offset, out.upper_offset, out.max_bytes)
                if batches is None:
                    continue
                self._send(out.to, msgspec.structs.replace(out.response, batches=batches))
                sent.add(index)
                self._sent_before_write += 1
        return sent

    def _send_push(
        self, out: SendPushData, pushed: _Pushed, batches: tuple[RecordBatch, ...] | None
    ) -> None:
        """Send one push; its batches (read from the log when None) are read and encoded once
        per range, however many followers it goes to (the request is the same for each)."""
        key = (out.base_offset, out.end_offset, out.max_bytes, out.request)
        push = pushed.get(key)
        if push is None:
            if batches is None:
                batches = self._read_batches(out.base_offset, out.max_bytes, out.end_offset)
            message = msgspec.structs.replace(out.request, batches=batches)
            frame = encode_frame(message) if self._use_channel else None
            push = pushed[key] = (message, frame)
        self._send(out.to, push[0], frame=push[1])

    def _wake_long_polls(self) -> None:
        """Wake consumer long polls on any HW move since the last wake-up (the move may have
        happened inside the step or tick that led here)."""
        if self._sm.high_watermark == self._hw_notified:
            return
        self._hw_notified = self._sm.high_watermark
        waiters, self._hw_waiters = self._hw_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _append(self, op: AppendBatch) -> None:
        if op.replicated:
            self._log.append_replicated(op.data)
            return
        # produce() validated the batch (framing, size, CRC) before the state machine saw it.
        info = self._log.append(op.data, op.batch.leader_epoch, validated=True)
        if info.base_offset != op.batch.base_offset:
            # Invariant: the log assigns exactly the offsets the state machine chose.
            raise RuntimeError(
                f"log assigned {info.base_offset}, state machine {op.batch.base_offset}"
            )

    def _after_append(self, records: int) -> None:
        """Make appends durable: fsync now (group commit) or per a relaxed flush policy."""
        if self._flush_messages <= 1:
            self._request_flush()
            return
        # flush.messages > 1: the topic accepts acknowledging before fsync.
        if not self._unflushed_records:
            self._unflushed_since_ms = now_ms()
        self._unflushed_records += records
        self._sm.step(LocalAppendDurable(self._log.log_end_offset, self._sm.generation), now_ms())
        if self._unflushed_records >= self._flush_messages:
            self._unflushed_records = 0
            self._request_flush(report=False)
        else:
            self._maybe_flush_by_time()

    def _maybe_flush_by_time(self) -> None:
        """flush.ms: fsync what a relaxed policy left unflushed once the oldest of it is that
        old, also while no append comes (Kafka's log flusher), in the flusher's thread."""
        if self._unflushed_records and now_ms() - self._unflushed_since_ms >= self._flush_ms:
            self._unflushed_records = 0
            self._request_flush(report=False)

    def _request_flush(self, report: bool = True) -> None:
        if self._flusher.running:
            self._flusher.wanted = True  # the running flusher fsyncs again when it is done
            return
        self._flusher.running = True
        # Start the fsync now, in a thread, so that it runs in parallel with the sends the
        # current Ready still has to make (push mode: the leader's fsync overlaps replication).
        end, generation = self._log.log_end_offset, self._sm.generation
        first = self._loop.run_in_executor(None, self._log.flush)
        self._loop.create_task(self._flush_loop(report, first, end, generation))

    async def _flush_loop(
        self, report: bool, flushing: asyncio.Future[None], end: int, generation: int
    ) -> None:
        try:
            while True:
                try:
                    await flushing
                except KafkaStorageError as exc:
                    self._go_offline(str(exc))
                    return
                if report:
                    self._step(LocalAppendDurable(end, generation))
                if not self._flusher.wanted or self._offline is not None:
                    return
                # Appends arrived during that fsync: one more covers all of them.
                self._flusher.wanted = False
                end, generation = self._log.log_end_offset, self._sm.generation
                flushing = self._loop.run_in_executor(None, self._log.flush)
        finally:
            self._flusher.running = False

    async def _maybe_checkpoint_hw(self) -> None:
        hw = self._sm.high_watermark
        if hw == self._hw_checkpointed or now_ms() - self._hw_checkpoint_ms < (
            HW_CHECKPOINT_INTERVAL_MS
        ):
            return
        self._hw_checkpoint_ms = now_ms()
        await asyncio.to_thread(self._log.checkpoint_high_watermark, hw)
        self._hw_checkpointed = hw

    def _read_batches(self, offset: int, max_bytes: int, upper: int) -> tuple[RecordBatch, ...]:
        """Whole batches as the log stores them, each a view of the bytes read (the log
        verified their CRCs): the channel copies them once, into the message's frame."""
        return tuple(
            RecordBatch(_batch_meta(rb.parse_header(data, 0)), data)  # type: ignore[arg-type]
            for data in self._log.read_batches(offset, max_bytes, max_offset=upper)
        )

    def _send_fetch_data(self, out: SendFetchData) -> None:
        response = out.response
        if out.to == CONSUMER_REPLICA_ID:
            # A consumer takes the batches as the log stores them, in one byte string: no
            # split into batches and join again.
            records = b""
            located = None
            wanted = response.error_code == 0 and out.fetch_offset < out.upper_offset
            if response.request_id in self._extent_requests:
                self._extent_requests.discard(response.request_id)
                located = Extents((), -1, -1)
                if wanted:
                    located = self._log.read_extents(
                        out.fetch_offset, out.max_bytes, out.upper_offset
                    )
            elif wanted:
                records = self._log.read(out.fetch_offset, out.max_bytes, out.upper_offset)
            waiter = self._fetch_waiters.pop(response.request_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result((response, records, located))
            return
        throttle = self._throttle
        if out.to in self._sm.isr:
            throttle = None
        if response.error_code == 0 and out.fetch_offset < out.upper_offset:
            max_bytes = (
                out.max_bytes if throttle is None else min(out.max_bytes, throttle.read_limit())
            )
            batches = self._read_batches(out.fetch_offset, max_bytes, out.upper_offset)
            response = msgspec.structs.replace(response, batches=batches)
            if throttle is not None:
                delay_ms = throttle.delay_ms(sum(len(b.data) for b in batches), now_ms())
                if delay_ms > 0:
                    self._loop.call_later(delay_ms / 1000, self._send, out.to, response)
                    return
        self._send(out.to, response)

    def _peer(self, replica_id: int) -> Any:
        handle = self._peers.get(replica_id)
        if handle is None:
            name = replica_actor_name(self.topic, self.partition, replica_id)
            try:
                handle = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                return None  # not created yet, or gone: the state machine retries later
            self._peers[replica_id] = handle
        return handle

    def _send(self, to: int, message: Any, frame: bytes | bytearray | None = None) -> None:
        """One-way message to a peer replica: over its replication channel when that link is
        up, otherwise by a Ray call (while the link connects in the background); dropped when
        the peer is unknown or saturated. ``frame``, if given, is the message already encoded
        (:func:`encode_frame`), shared by the sends of one push to several followers."""
        if self._use_channel and is_channel_message(message):
            link = self._links.get(to)
            if link is None:
                peer_name = replica_actor_name(self.topic, self.partition, to)
                link = self._links[to] = PeerLink(peer_name, self._channel_secret, self._tls_client)
            if link.send(message, frame):
                return
            link.ensure_connecting(lambda: self._channel_address_of(to))
        if self._peer_calls.get(to, 0) >= PEER_CALLS_IN_FLIGHT_MAX:
            return
        handle = self._peer(to)
        if handle is None:
            return
        self._peer_calls[to] = self._peer_calls.get(to, 0) + 1
        self._ray_calls_out += 1
        message = _picklable(message)
        self._loop.create_task(self._await_peer_call(to, handle.deliver.remote(message)))

    async def _channel_address_of(self, to: int) -> ChannelAddress:
        handle = self._peer(to)
        if handle is None:
            raise LookupError(f"replica {to} not found")
        address = await asyncio.wait_for(handle.channel_address.remote(), CHANNEL_START_S)
        if address is None:
            raise LookupError(f"replica {to} has no replication channel")
        return address

    async def _await_peer_call(self, to: int, ref: Any) -> None:
        try:
            await ref
        except Exception:
            # The peer died or restarted: look it up again next time; the state machine
            # resends whatever mattered.
            self._peers.pop(to, None)
        finally:
            self._peer_calls[to] -= 1

    def _propose(self, request: AlterPartitionRequest) -> None:
        if self._controller is None:
            return  # no controller yet: the state machine resends after its timeout
        self._controller.alter_partition.remote(
            self.topic, self.partition, request, self._self_handle()
        )

    def _self_handle(self) -> Any:
        return ray.get_runtime_context().current_actor

    def _go_offline(self, reason: str) -> None:
        """Stop serving after a storage failure, as Kafka takes a failed log dir offline."""
        if self._offline is not None:
            return
        self._offline = reason
        log.error(
            "replica %s-%d@%d offline: %s", self.topic, self.partition, self.replica_id, reason
        )
        if self._controller is not None:  # else the broker learns it at its next lease grant
            self._controller.replica_offline.remote(
                self.topic, self.partition, reason, ray.get_runtime_context().get_actor_id()
            )
        for waiter in self._produce_waiters.values():
            if not waiter.done():
                waiter.set_result(ProduceOutcome(KafkaStorageError.error_code, -1, -1, reason))
        self._produce_waiters.clear()
        for delete_waiter in self._delete_waiters.values():
            if not delete_waiter.done():
                delete_waiter.set_result(
                    DeleteRecordsOutcome(KafkaStorageError.error_code, -1, reason)
                )
        self._delete_waiters.clear()
        for request_id, fetch_waiter in list(self._fetch_waiters.items()):
            if not fetch_waiter.done():
                fetch_waiter.set_exception(KafkaStorageError(reason))
            self._fetch_waiters.pop(request_id, None)
        self._extent_requests.clear()


__all__ = ["ReplicaActor"]
