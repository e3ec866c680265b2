"""ReplicaActor: the Ray actor that hosts one partition replica and its write-ahead log.

A thin shell around the pure state machine
(:class:`raylog.actors.replication.partition.PartitionReplica`), the pure executor of its
Readys (:class:`raylog.actors.replication.executor.ReadyExecutor`: the order of a Ready's
effects, the early send, the group commit, the flush policy, the throttle) and a
:class:`raylog.storage.Log`. The executor's I/O is
:class:`raylog.actors.replica_port.RayReplicaPort` (the log, fsync in a thread, peers, the
requests waiting here). This actor owns the rest:

- the Ray methods: controller commands, produce, transaction markers (``write_txn_marker``,
  for the transaction coordinator), DeleteRecords, fetch (long-polled for consumers, either
  isolation level), ListOffsets, replica-to-replica delivery; a mirror topic's appends of a
  source cluster's batches (``mirror_append``, KIP-986 links) come from
  :class:`raylog.actors.replica_mirror.ReplicaMirror`, mixed in;
- the clock: ``tick`` every ``TICK_MS`` (the state machine's timers, flush.ms, the lazy
  high-watermark checkpoint, retention and compaction checks);
- the replication channel server, which takes peers' messages and the local gateway's
  produce, fetch, list_offsets and mirror_append calls.

Peers are found by name (:func:`replica_actor_name`) in the ``raylog`` namespace, so the
controller only has to create actors and send commands.

A failed log (full disk, failed fsync) takes the replica offline, as Kafka does with an offline
log directory: every call then answers KAFKA_STORAGE_ERROR until the actor is re-created, which
recovers the log from disk. A killed actor restarted by Ray does exactly that in ``__init__``.
A damaged log (a batch failing its CRC, committed records cut at recovery) is handled by
:class:`raylog.actors.replica_damage.DamagedReplica`, mixed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import time
from pathlib import Path
from typing import Any

import msgspec
import ray

from raylog.actors import logs
from raylog.actors.calls import (
    DeleteRecordsOutcome,
    FetchOutcome,
    ProduceOutcome,
    ReplicaState,
    replica_actor_name,
)
from raylog.actors.control import config_keys
from raylog.actors.process_memory import lean_serialization_context
from raylog.actors.producer_snapshots import SnapshotTaker, start_state
from raylog.actors.replica_damage import DamagedReplica
from raylog.actors.replica_mirror import ReplicaMirror
from raylog.actors.replica_offsets import OffsetsReplica
from raylog.actors.replica_port import CHANNEL_START_S, RayReplicaPort
from raylog.actors.replica_tiering import (
    REMOTE_LOG_MANAGER_TASK_INTERVAL_MS_DEFAULT,
    RemoteStoreLocation,
    TieredReplica,
)
from raylog.actors.replication.delete_records import requested_log_start
from raylog.actors.replication.executor import ReadyExecutor
from raylog.actors.replication.messages import (
    CONSUMER_REPLICA_ID,
    UNDEFINED_EPOCH,
    BecomeFollower,
    BecomeLeader,
    BecomeObserver,
    DeleteRecordsRequest,
    FetchRequest,
    FetchResponse,
    LocalLogStartAdvanced,
    ProduceRequest,
    StopReplica,
)
from raylog.actors.replication.mirror import read_only_message
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.ready import ReplicaConfig, Role
from raylog.actors.transport.arena import ArenaError, ArenaViews
from raylog.actors.transport.channel import ChannelAddress, ChannelServer, channel_secret
from raylog.storage import batch as rb
from raylog.storage import pki
from raylog.storage.cleaner_process import run_in_child
from raylog.storage.errors import (
    InvalidRecordError,
    InvalidRequestError,
    InvalidTxnStateError,
    KafkaStorageError,
    NotLeaderOrFollowerError,
    PolicyViolationError,
    RaylogError,
    RequestTimedOutError,
)
from raylog.storage.log import Extents, Log, LogConfig
from raylog.storage.pki import LeafCertificate

log = logging.getLogger(__name__)
lean_serialization_context()  # before Ray decodes this replica's first arguments

READ_UNCOMMITTED = 0  # Kafka's IsolationLevel
READ_COMMITTED = 1
# Timer resolution of the state machine (ISR lag, timeouts, parked fetches' expiry, flush.ms);
# appends, replication and parked fetches' answers to new data never wait for it. Each tick
# costs every replica CPU while idle (docs/DESIGN.md, density).
TICK_MS = 100
# Methods the gateway may call over a replica's channel, with their argument types.
# (Types, not msgspec Decoders: Ray pickles this module's globals with the actor class.)
_CHANNEL_CALL_ARGS: dict[str, Any] = {
    "produce": tuple[bytes, int, int, bool],
    "open_arena": tuple[int, int, str],
    "produce_shared": tuple[int, int, str, int, int, int, int, bool],
    # Integers; the trailing ones optional (isolation_level came later than the rest).
    "fetch": tuple[int, ...],
    "fetch_extents": tuple[int, ...],
    "list_offsets": tuple[int, ...],
    # The transaction coordinator's markers (producer id, epoch, coordinator epoch, commit,
    # timeout_ms): one per partition per transaction, on a transaction's commit path.
    "write_txn_marker": tuple[int, int, int, bool, int],
    # A mirror's leader appending a source cluster's batches (leader epoch, batches, acks,
    # timeout_ms): the gateway's cluster-link fetcher (KIP-986).
    "mirror_append": tuple[int, bytes, int, int, int],
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


@ray.remote(
    num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=1000, enable_task_events=False
)
class ReplicaActor(ReplicaMirror, TieredReplica, DamagedReplica, OffsetsReplica):
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
        topic_id: str = "",
        remote_store: RemoteStoreLocation | None = None,
        remote_log_manager_interval_ms: int = REMOTE_LOG_MANAGER_TASK_INTERVAL_MS_DEFAULT,
        remote_store_factory: Any = None,
    ) -> None:
        logs.configure()  # timestamped lines in this worker's log
        self.topic = topic
        # Kafka's internal topics: only raylog's coordinators write them (the gateway refuses
        # clients), whose transactional batches carry no sequence (AppendOrigin.COORDINATOR).
        self._internal_topic = topic.startswith("__")
        # Leader lease (set by a BrokerActor): with ``session_lease`` the replica accepts produce
        # only while now_ms() < _lease_until_ms, a time on this machine's monotonic clock that
        # the broker extends after each heartbeat the controller accepted. Starts lapsed.
        self._lease_required = session_lease
        self._lease_until_ms = 0
        self.partition = partition
        self.replica_id = replica_id
        log_config, flush_messages, flush_ms = _log_and_flush_configs(topic_config)
        self._max_message_bytes = log_config.max_message_bytes
        self._topic_config = config_keys.effective(topic_config or {})
        # Recovery happens here, also when Ray restarts a killed actor.
        self._log = Log.open(Path(log_dir), log_config)
        snapshot, tail = start_state(self._log)
        self._sm = PartitionReplica(
            replica_id,
            replica_config or ReplicaConfig(),
            log_start_offset=self._log.log_start_offset,
            log_end_offset=self._log.log_end_offset,
            epoch_cache=[(e.epoch, e.start_offset) for e in self._log.epoch_entries],
            high_watermark=self._log.high_watermark,
            # Idempotent-producer and transaction state: the newest usable snapshot, then the
            # WAL's batch headers after it (no bodies read but those of transaction markers).
            producer_snapshot=snapshot,
            producer_batches=tail,
        )
        self._snapshots = SnapshotTaker(self._log)
        # The .txnindex files answer read_committed fetches: make them match the log (entries
        # a crash lost with an unflushed index, a bad file), from what was just rebuilt.
        self._log.restore_aborted_txns(self._log.log_start_offset, self._sm.txns.aborted)
        self._offline: str | None = None
        self._next_request_id = 1
        self._node = ""  # this replica's Ray node id, once asked (fetch_extents)
        # Replication messages go over direct links (TCP; a Unix socket within one machine; see
        # actors/transport/channel.py) when enabled.
        self._use_channel = replication_channel
        self._channel_secret = channel_secret() if replication_channel else b""
        # Mutual TLS on the channels when the broker has a certificate from the cluster CA.
        self._tls_server = pki.server_context(tls) if tls is not None else None
        self._port = RayReplicaPort(
            topic,
            partition,
            self._log,
            self._sm,
            use_channel=replication_channel,
            channel_secret=self._channel_secret,
            tls_client=pki.client_context(tls) if tls is not None else None,
            flushed=self._flushed,
            failed=self._go_offline,
            remote_state=self._build_remote_state,
        )
        self._executor = ReadyExecutor(
            self._sm, self._port, flush_messages=flush_messages, flush_interval_ms=flush_ms
        )
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
        self._channel: ChannelServer | None = None
        self._channel_address: asyncio.Future[ChannelAddress | None] | None = None
        self._arenas = ArenaViews()  # same-host gateways' produce arenas (transport/arena.py)
        self.shared_produces = 0  # batches appended straight from a gateway's arena
        # Tiered storage (replica_tiering.py): the store is opened at the first round of a
        # topic with remote.storage.enable; ``remote_store_factory`` (tests) opens it instead.
        self._init_tiering(
            topic_id or topic, remote_store, remote_log_manager_interval_ms, remote_store_factory
        )

    # --- lifecycle ----------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        """Start the ticker on the actor's event loop (not available in ``__init__``)."""
        if self._ticker is None:
            self._loop = asyncio.get_running_loop()
            self._port.loop = self._loop
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
            "messages_out": sum(link.messages_out for link in self._port.links.values()),
            "dropped": sum(link.dropped for link in self._port.links.values()),
            "rejected": self._channel.rejected if self._channel else 0,
            "tls": int(self._channel is not None and self._channel.tls),
            "local_links_in": self._channel.local_links if self._channel else 0,
            "tcp_links_in": self._channel.tcp_links if self._channel else 0,
            "calls_in": self._channel.calls_in if self._channel else 0,
            "ray_calls_out": self._port.ray_calls_out,
            "sent_before_write": self._executor.sent_before_write,
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
                self._executor.tick(now_ms())
                if self._snapshots.due():
                    self._snapshots.take(self._sm.log)
                await self._maybe_checkpoint_hw()
                self._maybe_enforce_retention()
                self._maybe_tier(now_ms())
                self._maybe_clean()
                self._check_damage()
            except Exception as exc:
                log.exception(
                    "replica %s-%d@%d: tick failed", self.topic, self.partition, self.replica_id
                )
                self._go_offline(f"tick failed: {exc!r}")
                raise

    def _maybe_enforce_retention(self) -> None:
        """Every ``log.retention.check.interval.ms``: delete whole segments past retention.ms /
        retention.bytes, only below the high watermark, and tell the state machine where the
        log starts now. Each replica applies retention to its own log, as Kafka's do. A
        tiered topic's (remote.storage.enable) local segments go only once copied: see
        replica_tiering.py."""
        now = now_ms()
        if now - self._retention_checked_ms < self._retention_interval_ms:
            return
        if self._tiering_enabled():
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
        when one is due (see Log.clean), below the last stable offset only. Each replica compacts
        its own log, as Kafka's do; offsets never change, so replicas still agree on them."""
        now = now_ms()
        if self._cleaning is not None or now - self._cleaner_checked_ms < self._cleaner_backoff_ms:
            return
        self._cleaner_checked_ms = now
        wall = time.time_ns() // 1_000_000
        # Below the last stable offset only (at most the HW): an open transaction's batches
        # are never cleaned, as Kafka's cleaner stops at the first unstable offset.
        upper = self._sm.last_stable_offset
        if self._log.config.compact and self._log.cleaning_due(wall, upper):
            self._cleaning = self._loop.create_task(self._clean(wall, upper))

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
            last_stable_offset=sm.last_stable_offset,
            open_transactions=sm.txns.open_transactions,
            log_start_offset=sm.log_start_offset,
            log_end_offset=sm.log_end_offset,
            durable_end_offset=sm.durable_end_offset,
            offline=self._offline,
            log_size_bytes=self._log.size_bytes,
            cleaner_passes=self._cleaner_stats["passes"],
            cleaner_records_removed=self._cleaner_stats["records_removed"],
            cleaner_dirty_ratio=self._log.dirty_ratio(),
            mirror_link=sm.mirror_link,
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
        self._executor.set_throttle(bytes_per_sec, now_ms())

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
        self._topic_config = config_keys.effective(topic_config)
        self._max_message_bytes = log_config.max_message_bytes
        self._executor.set_flush_policy(flush_messages, flush_ms)
        return True

    def set_controller(self, controller: Any) -> None:
        """The actor (this replica's broker) that receives AlterPartition proposals
        (``alter_partition``) and hears when this replica goes offline (``replica_offline``)."""
        self._controller = self._port.controller = controller

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
        self._port.forget_peers()
        self._refuse_damaged_leadership(command)
        self._step(command)
        return await self.state()

    # --- the data path ------------------------------------------------------------------------

    async def produce(
        self, batch: bytes, acks: int, timeout_ms: int, verify_txn: bool = False
    ) -> ProduceOutcome:
        """Append one client batch; return when the acks condition holds (or fails).

        ``verify_txn`` (KIP-890's defence against hanging transactions): a transactional batch
        that would open its producer's transaction on this partition is not appended but
        answered ``needs_verification``, so that the gateway first checks with the
        transaction coordinator that the producer added this partition to its transaction.
        Later batches of the same transaction go straight on."""
        self._ensure_started()
        start = self._sm.log_start_offset
        refused = self._refuse_leader_write()
        if refused is not None:
            with contextlib.suppress(RaylogError):  # no header: no producer to hold back
                h = rb.parse_header(batch)
                if h.producer_id >= 0:
                    self._sm.refused_batches.record(
                        h.producer_id, h.producer_epoch, h.base_sequence, refused[0], now_ms()
                    )
            return ProduceOutcome(refused[0], -1, start, refused[1])
        try:
            header = rb.validate_client_batch(
                batch, self._max_message_bytes, coordinator_writes=self._internal_topic
            )
            # Kafka's LogValidator: the records parse; and compaction keeps the latest record of
            # each key, so a record without one has no place in a compacted log.
            keyless = rb.check_client_records(batch, header, keys_required=self._log.config.compact)
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
        if (
            verify_txn
            and header.is_transactional
            and not self._sm.txns.has_open(header.producer_id)
        ):
            return ProduceOutcome(
                InvalidTxnStateError.error_code,
                -1,
                start,
                "the first batch of a transaction here: verify it",
                needs_verification=True,
            )
        return await self._produce(
            ProduceRequest(
                self._new_request_id(),
                acks,
                max(0, min(timeout_ms, REQUEST_TIMEOUT_MS_MAX)),
                header.records_count,
                header.size,
                batch,
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.is_transactional,
            ),
            start,
        )

    async def _produce(self, request: ProduceRequest, start: int) -> ProduceOutcome:
        """Step ``request`` and wait for its outcome (acks=0: only what is known at once)."""
        waiter: asyncio.Future[ProduceOutcome] = asyncio.get_running_loop().create_future()
        self._port.produce_waiters[request.request_id] = waiter
        self._step(request)
        if request.acks == 0:
            # Kafka answers nothing for acks=0; the caller still learns the assigned offset.
            self._port.produce_waiters.pop(request.request_id, None)
            if waiter.done():
                return waiter.result()
            return ProduceOutcome(0, -1, start)
        try:
            # The state machine times out acks=all itself; this bound only guards the shell.
            return await asyncio.wait_for(waiter, timeout=request.timeout_ms / 1000 + 5)
        except TimeoutError:
            self._port.produce_waiters.pop(request.request_id, None)
            return ProduceOutcome(RequestTimedOutError.error_code, -1, start, "no completion")

    async def write_txn_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        timeout_ms: int,
    ) -> ProduceOutcome:
        """Kafka's WriteTxnMarkers for this partition, on its leader: append the COMMIT or
        ABORT marker of ``producer_id``'s transaction (a control batch of one record, stamped
        with this leader's epoch) and return once the high watermark passes it (acks=all:
        min.insync.replicas applies). Errors as produce has them, and
        INVALID_PRODUCER_EPOCH (47) for an older producer epoch,
        TRANSACTION_COORDINATOR_FENCED (52) for an older coordinator epoch."""
        self._ensure_started()
        start = self._sm.log_start_offset
        refused = self._refuse_leader_write()
        if refused is not None:
            return ProduceOutcome(refused[0], -1, start, refused[1])
        if self._sm.role is not Role.LEADER:
            return ProduceOutcome(NotLeaderOrFollowerError.error_code, -1, start, "not the leader")
        record = rb.end_txn_marker_record(commit, coordinator_epoch, time.time_ns() // 1_000_000)
        data = rb.build_batch(
            [record],
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            transactional=True,
            control=True,
        )
        return await self._produce(
            ProduceRequest(
                self._new_request_id(),
                -1,
                max(0, min(timeout_ms, REQUEST_TIMEOUT_MS_MAX)),
                1,
                len(data),
                data,
                producer_id,
                producer_epoch,
                -1,
                True,
                rb.CONTROL_COMMIT if commit else rb.CONTROL_ABORT,
                coordinator_epoch,
            ),
            start,
        )

    def _refuse_leader_write(self, *, mirrored: bool = False) -> tuple[int, str] | None:
        """Why this replica may not change its log for a client now, as (error code, message):
        offline, or (with a session lease) no confirmed broker session, when another replica
        may already lead (no split brain), or (unless the write is ``mirrored``: a source's
        batches) a mirror topic of an active cluster link (KIP-986). None: go ahead."""
        if self._offline is not None:
            return KafkaStorageError.error_code, self._offline
        if self._lease_required and now_ms() >= self._lease_until_ms:
            return NotLeaderOrFollowerError.error_code, "broker session lease lapsed"
        if self._sm.mirror_link and not mirrored:
            link = self._sm.mirror_link
            return InvalidRequestError.error_code, read_only_message(f"topic {self.topic}", link)
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
        self,
        pid: int,
        fd: int,
        nonce: str,
        offset: int,
        length: int,
        acks: int,
        timeout_ms: int,
        verify_txn: bool = False,
    ) -> ProduceOutcome:
        """:meth:`produce` of the batch at ``offset`` in the gateway arena ``(pid, fd,
        nonce)``: validated and written to the log from there (the gateway changes nothing in
        it until this call's reply). Raises ArenaError when the arena or range is not there."""
        batch = self._arenas.view((pid, fd, nonce), offset, length)
        self.shared_produces += 1
        return await self.produce(batch, acks, timeout_ms, verify_txn)  # type: ignore[arg-type]

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
        wanted = requested_log_start(offset, self._sm.high_watermark)
        if wanted is not None and self._tiering_enabled():
            answered = await self._tiered_delete_records(wanted)
            if answered is not None:
                return answered
        request_id = self._new_request_id()
        waiter: asyncio.Future[DeleteRecordsOutcome] = asyncio.get_running_loop().create_future()
        self._port.delete_waiters[request_id] = waiter
        timeout_ms = max(0, min(timeout_ms, REQUEST_TIMEOUT_MS_MAX))
        self._step(DeleteRecordsRequest(request_id, offset, timeout_ms))
        try:
            # The state machine times the request out itself; this bound only guards the shell.
            return await asyncio.wait_for(waiter, timeout=timeout_ms / 1000 + 5)
        except TimeoutError:
            self._port.delete_waiters.pop(request_id, None)
            return DeleteRecordsOutcome(RequestTimedOutError.error_code, -1, "no completion")

    async def fetch(
        self,
        fetch_offset: int,
        max_bytes: int,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        current_leader_epoch: int = UNDEFINED_EPOCH,
        isolation_level: int = READ_UNCOMMITTED,
    ) -> FetchOutcome:
        """Consumer fetch: whole batches from ``fetch_offset``, never at or above the HW
        (``isolation_level`` 1, read_committed: the last stable offset, and the answer names
        the aborted transactions it overlaps).

        Long-polls up to ``max_wait_ms`` until at least ``min_bytes`` are available. Followers
        serve consumers too, up to their own high watermark (KIP-392).
        """
        return await self._fetch(
            fetch_offset,
            max_bytes,
            max_wait_ms,
            min_bytes,
            current_leader_epoch,
            False,
            isolation_level,
        )

    async def _fetch(
        self,
        fetch_offset: int,
        max_bytes: int,
        max_wait_ms: int,
        min_bytes: int,
        current_leader_epoch: int,
        extents: bool,
        isolation_level: int = READ_UNCOMMITTED,
    ) -> FetchOutcome:
        """:meth:`fetch`; with ``extents`` the answer locates the batches instead of holding
        them (:meth:`fetch_extents`)."""
        self._ensure_started()
        deadline = now_ms() + max(0, min(max_wait_ms, CONSUMER_WAIT_MS_MAX))
        while True:
            hw_seen = self._sm.high_watermark
            outcome = await self._fetch_once(
                fetch_offset, max_bytes, current_leader_epoch, extents, isolation_level
            )
            remaining_ms = deadline - now_ms()
            if outcome.error_code or outcome.size >= max(1, min_bytes):
                return outcome
            if remaining_ms <= 0:
                return outcome
            if self._sm.high_watermark == hw_seen:
                # Wait for the next HW move (the executor wakes long polls), or the deadline.
                # The LSO moves only with the HW: a marker is stable once the HW passes it.
                waiter: asyncio.Future[None] = self._loop.create_future()
                self._port.hw_waiters.append(waiter)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter, timeout=remaining_ms / 1000)

    async def _fetch_once(
        self,
        fetch_offset: int,
        max_bytes: int,
        current_leader_epoch: int,
        extents: bool,
        isolation_level: int,
    ) -> FetchOutcome:
        sm = self._sm
        if self._offline is not None:
            return FetchOutcome(KafkaStorageError.error_code, -1, -1, -1, b"", -1, self._offline)
        if self._below_local(fetch_offset):  # tiered storage: from the object store
            return await self._remote_fetch(
                fetch_offset, max_bytes, current_leader_epoch, isolation_level
            )
        request_id = self._new_request_id()
        waiter: asyncio.Future[tuple[FetchResponse, bytes, Extents | None]] = (
            asyncio.get_running_loop().create_future()
        )
        self._port.fetch_waiters[request_id] = waiter
        if extents:
            self._port.extent_requests.add(request_id)
        read_committed = isolation_level == READ_COMMITTED
        if read_committed:
            self._port.read_committed_requests.add(request_id)
        self._step(
            FetchRequest(
                CONSUMER_REPLICA_ID,
                request_id,
                current_leader_epoch,
                fetch_offset,
                UNDEFINED_EPOCH,
                max(1, max_bytes),
                isolation_level=READ_COMMITTED if read_committed else READ_UNCOMMITTED,
            )
        )
        try:
            response, records, located = await asyncio.wait_for(waiter, timeout=10)
        except KafkaStorageError as exc:  # the read failed (damage): this replica is offline
            return FetchOutcome(KafkaStorageError.error_code, -1, -1, -1, b"", -1, str(exc))
        except TimeoutError:
            self._port.fetch_waiters.pop(request_id, None)
            self._port.extent_requests.discard(request_id)
            self._port.read_committed_requests.discard(request_id)
            return FetchOutcome(RequestTimedOutError.error_code, -1, -1, -1, b"")
        return FetchOutcome(
            response.error_code,
            response.high_watermark,
            response.last_stable_offset,
            self._log_start_for_clients(response.log_start_offset),
            records,
            sm.leader_epoch,
            extents=located,
            aborted_transactions=response.aborted_transactions,
        )

    async def read_committed(
        self,
        fetch_offset: int,
        max_bytes: int,
        max_wait_ms: int = 0,
        isolation_level: int = READ_UNCOMMITTED,
    ) -> FetchOutcome:
        """Bulk read for pipelines, called through Ray: :meth:`fetch`'s answer with its
        records out of band.

        The records go as a pickle-5 buffer, so Ray writes them into its object store once
        and the reader gets a read-only view of them there (``ray._raylet.SubBuffer``), not
        an unpickled copy: for the 8 MiB reads of Spark and Ray Data, one copy and a fresh
        8 MiB allocation fewer per call.
        """
        outcome = await self.fetch(
            fetch_offset, max_bytes, max_wait_ms, isolation_level=isolation_level
        )
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
        isolation_level: int = READ_UNCOMMITTED,
    ) -> FetchOutcome:
        """:meth:`fetch` for a reader on this replica's Ray node (``node_id``): the answer
        locates the batches in the segment files (``extents``, from their headers alone) and
        the reader reads them itself (:mod:`raylog.storage.short_circuit`), so no record bytes
        cross a socket or Ray: a short-circuit read, as HDFS has. The reader checks the CRCs
        and the span it read, and falls back to :meth:`fetch` or :meth:`read_committed`.
        The local gateway calls it over the channel; pipeline readers by Ray.
        """
        outcome = await self._fetch(
            fetch_offset,
            max_bytes,
            max_wait_ms,
            min_bytes,
            current_leader_epoch,
            True,
            isolation_level,
        )
        return msgspec.structs.replace(outcome, node_id=self._node_id())

    def _node_id(self) -> str:
        if not self._node:
            self._node = str(ray.get_runtime_context().get_node_id())
        return self._node

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

    # --- the executor -------------------------------------------------------------------------

    def _new_request_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id

    def _raise_if_offline(self) -> None:
        if self._offline is not None:
            raise KafkaStorageError(self._offline)

    def _step(self, message: Any) -> None:
        try:
            self._executor.step(message, now_ms())
        except KafkaStorageError as exc:
            self._on_storage_error(exc)

    def _flushed(self, end_offset: int, generation: int) -> None:
        """An fsync the executor started completed (called on the event loop)."""
        if self._offline is not None:
            return
        try:
            self._executor.flushed(end_offset, generation, now_ms())
        except KafkaStorageError as exc:
            self._go_offline(str(exc))

    async def _maybe_checkpoint_hw(self) -> None:
        hw = self._port.high_watermark_to_checkpoint
        if hw == self._hw_checkpointed or now_ms() - self._hw_checkpoint_ms < (
            HW_CHECKPOINT_INTERVAL_MS
        ):
            return
        self._hw_checkpoint_ms = now_ms()
        await asyncio.to_thread(self._log.checkpoint_high_watermark, hw)
        self._hw_checkpointed = hw

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
        self._port.fail_requests(reason)


__all__ = ["ReplicaActor"]
