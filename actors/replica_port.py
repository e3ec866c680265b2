"""RayReplicaPort: the I/O that a replica actor's Ready executor drives.

The executor (:mod:`raylog.actors.replication.executor`) decides what a Ready does and in which
order; this module is the Ray side of its :class:`~raylog.actors.replication.executor.ReplicaPort`:

- the log (a :class:`raylog.storage.log.Log`): appends on the actor's event loop, so the log
  assigns offsets in exactly the state machine's order, and an fsync in a thread whose
  completion comes back to the actor on its event loop;
- peers: one-way messages over the peer's replication channel (an authenticated TCP link, or a
  Unix socket on one machine: :mod:`raylog.actors.transport.channel`) once it is connected, by
  a Ray call until then, with at most ``PEER_CALLS_IN_FLIGHT_MAX`` calls outstanding per peer,
  beyond which messages are dropped (the state machine retries what gets lost, as on any
  network); AlterPartition proposals to the controller (the replica's broker);
- the requests of clients that wait on the actor's event loop: produce, DeleteRecords and
  consumer fetches (answered with the bytes, or with where they lie for a reader on this node),
  and consumer long polls, woken when the high watermark moves.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import msgspec
import ray

from raylog.actors.calls import (
    NAMESPACE,
    DeleteRecordsOutcome,
    MirrorOutcome,
    ProduceOutcome,
    replica_actor_name,
)
from raylog.actors.replication.messages import (
    AlterPartitionRequest,
    BatchMeta,
    FetchResponse,
    RecordBatch,
)
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.ready import (
    AppendBatch,
    DeleteRecordsResult,
    ProduceResult,
    SendFetchData,
)
from raylog.actors.replication.txn_state import CONTROL_NONE, NOT_CONTROL
from raylog.actors.transport.channel import (
    ChannelAddress,
    PeerLink,
    encode_frame,
    is_channel_message,
)
from raylog.storage import batch as rb
from raylog.storage.errors import KafkaStorageError
from raylog.storage.log import Extents, Log

log = logging.getLogger(__name__)

PEER_CALLS_IN_FLIGHT_MAX = 64  # one-way messages outstanding per peer before dropping
CHANNEL_START_S = 10.0  # bound on learning a peer's replication channel address


def batch_meta(header: rb.BatchHeader, marker: rb.EndTxnMarker | None = None) -> BatchMeta:
    """What the state machine knows of a stored batch, from its header and, for a transaction
    marker, what the marker says."""
    return BatchMeta(
        header.base_offset,
        header.last_offset_delta + 1,  # offsets spanned: a compacted batch holds fewer records
        header.size,
        header.partition_leader_epoch,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.is_transactional,
        marker_type(header, marker),
        marker.coordinator_epoch if marker is not None else -1,
    )


def marker_type(header: rb.BatchHeader, marker: rb.EndTxnMarker | None) -> int:
    """BatchMeta.control_type: the marker's type, NOT_CONTROL for a data batch, CONTROL_NONE
    for a control batch without a marker (one the log cleaner emptied)."""
    if marker is not None:
        return marker.control_type
    return CONTROL_NONE if header.is_control else NOT_CONTROL


def stored_batch_meta(data: bytes | bytearray | memoryview) -> BatchMeta:
    """:func:`batch_meta` of one whole stored batch (a marker's record is read: it is tiny)."""
    header = rb.parse_header(data, 0)
    marker = rb.parse_end_txn_marker(data, header) if header.is_control else None
    return batch_meta(header, marker)


def data_end_offset(records: bytes | memoryview, extents: Extents | None) -> int:
    """Where the batches of a consumer fetch's answer end (-1: none)."""
    if extents is not None:
        return extents.next_offset
    end = -1
    for _, header in rb.iter_batches(records, verify=False):
        end = header.next_offset
    return end


def picklable(message: Any) -> Any:
    """``message`` with its batches as bytes, for a Ray call: a batch read from the log is a
    memoryview of the bytes read (:meth:`RayReplicaPort.read_batches`), which the channel
    encodes as it is and pickle refuses."""
    batches = getattr(message, "batches", None)
    if not batches or not any(isinstance(b.data, memoryview) for b in batches):
        return message
    copies = tuple(RecordBatch(b.meta, bytes(b.data)) for b in batches)
    return msgspec.structs.replace(message, batches=copies)


class RayReplicaPort:
    """The executor's port in a :class:`raylog.actors.replica.ReplicaActor` (see the module
    docstring). The actor sets ``loop`` once its event loop runs, ``controller`` when its broker
    says, and gives the two callbacks through which an fsync reports back."""

    def __init__(
        self,
        topic: str,
        partition: int,
        log_: Log,
        replica: PartitionReplica,
        *,
        use_channel: bool,
        channel_secret: bytes,
        tls_client: Any,
        flushed: Callable[[int, int], None],
        failed: Callable[[str], None],
        remote_state: Callable[[int], None],
    ) -> None:
        self.topic = topic
        self.partition = partition
        self._log = log_
        self._replica = replica
        self._flushed = flushed  # an fsync completed: (end offset, generation)
        self._failed = failed  # the log failed: take the replica offline
        self.build_remote_state = remote_state  # tiered storage: see the executor's port
        self.loop: asyncio.AbstractEventLoop | None = None
        self.controller: Any = None
        self.high_watermark_to_checkpoint = log_.high_watermark  # persisted lazily
        # Clients' requests, by request id.
        self.produce_waiters: dict[int, asyncio.Future[ProduceOutcome]] = {}
        # Mirror appends (KIP-986 links), answered with the ProduceResults of their ids.
        self.mirror_waiters: dict[int, asyncio.Future[MirrorOutcome]] = {}
        self.delete_waiters: dict[int, asyncio.Future[DeleteRecordsOutcome]] = {}
        # A consumer fetch's answer: the response and its batches as one byte string.
        self.fetch_waiters: dict[
            int, asyncio.Future[tuple[FetchResponse, bytes, Extents | None]]
        ] = {}
        self.extent_requests: set[int] = set()  # consumer fetches answered with extents
        self.read_committed_requests: set[int] = set()  # get the aborted transactions too
        self.hw_waiters: list[asyncio.Future[None]] = []  # consumer long polls
        # Peers.
        self._use_channel = use_channel
        self._channel_secret = channel_secret
        self._tls_client = tls_client
        self._peers: dict[int, Any] = {}
        self._peer_calls: dict[int, int] = {}
        self.links: dict[int, PeerLink] = {}
        self.ray_calls_out = 0

    # --- the log ------------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._log.log_end_offset

    @property
    def log_append_time(self) -> bool:
        return self._log.config.log_append_time

    def truncate_to(self, offset: int) -> None:
        self._log.truncate_to(offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self._log.truncate_fully_and_start_at(offset)

    def advance_log_start(self, offset: int, high_watermark: int) -> None:
        self._log.advance_log_start(offset, high_watermark)

    def append(self, op: AppendBatch) -> int:
        if op.replicated:
            self._log.append_replicated(op.data)
            base_offset = op.batch.base_offset
        else:
            # produce() validated the batch (framing, size, CRC) before the state machine saw it.
            info = self._log.append(op.data, op.batch.leader_epoch, validated=True)
            base_offset = info.base_offset
        if op.aborted is not None:
            self._log.append_aborted_txn(op.aborted)
        return base_offset

    def stored_batch(self, op: AppendBatch) -> bytearray:
        data = bytearray(op.data)  # the one copy: the client's bytes are immutable
        rb.set_base_offset(data, 0, op.batch.base_offset)
        rb.set_partition_leader_epoch(data, 0, op.batch.leader_epoch)
        return data

    def read_batches(
        self, offset: int, max_bytes: int, upper_offset: int
    ) -> tuple[RecordBatch, ...]:
        """Whole batches as the log stores them, each a view of the bytes read (the log
        verified their CRCs): the channel copies them once, into the message's frame."""
        return tuple(
            RecordBatch(stored_batch_meta(data), data)  # type: ignore[arg-type]
            for data in self._log.read_batches(offset, max_bytes, max_offset=upper_offset)
        )

    def checkpoint_high_watermark(self, high_watermark: int) -> None:
        self.high_watermark_to_checkpoint = high_watermark  # the actor's timer persists it

    def start_flush(self, end_offset: int, generation: int) -> None:
        """fsync in a thread, so that it runs in parallel with the sends the current Ready
        still has to make (push mode: the leader's fsync overlaps replication)."""
        assert self.loop is not None
        flushing = self.loop.run_in_executor(None, self._log.flush)
        flushing.add_done_callback(functools.partial(self._flush_done, end_offset, generation))

    def _flush_done(self, end_offset: int, generation: int, flushing: asyncio.Future[None]) -> None:
        try:
            flushing.result()
        except KafkaStorageError as exc:
            self._failed(str(exc))
            return
        except Exception as exc:  # an fsync that failed otherwise leaves nothing to trust
            log.exception("%s-%d: fsync failed", self.topic, self.partition)
            self._failed(f"fsync failed: {exc!r}")
            return
        self._flushed(end_offset, generation)

    # --- peers --------------------------------------------------------------------------------

    def shared_frame(self, message: Any) -> bytearray | None:
        return encode_frame(message) if self._use_channel else None

    def send(self, to: int, message: Any, frame: bytes | bytearray | None = None) -> None:
        """One-way message to a peer replica: over its replication channel when that link is
        up, otherwise by a Ray call (while the link connects in the background); dropped when
        the peer is unknown or saturated. ``frame``, if given, is the message already encoded
        (:func:`encode_frame`), shared by the sends of one push to several followers."""
        if self._use_channel and is_channel_message(message):
            link = self.links.get(to)
            if link is None:
                peer_name = replica_actor_name(self.topic, self.partition, to)
                link = self.links[to] = PeerLink(peer_name, self._channel_secret, self._tls_client)
            if link.send(message, frame):
                return
            link.ensure_connecting(lambda: self._channel_address_of(to))
        if self._peer_calls.get(to, 0) >= PEER_CALLS_IN_FLIGHT_MAX:
            return
        handle = self._peer(to)
        if handle is None:
            return
        assert self.loop is not None
        self._peer_calls[to] = self._peer_calls.get(to, 0) + 1
        self.ray_calls_out += 1
        message = picklable(message)
        self.loop.create_task(self._await_peer_call(to, handle.deliver.remote(message)))

    def send_later(self, delay_ms: int, to: int, message: Any) -> None:
        assert self.loop is not None
        self.loop.call_later(delay_ms / 1000, self.send, to, message)

    def forget_peers(self) -> None:
        """Look peers up again: they may have been re-created under their names (a restarted
        broker), and a message sent to a dead handle is lost until a timeout resends it."""
        self._peers.clear()

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

    def propose(self, request: AlterPartitionRequest) -> None:
        if self.controller is None:
            return  # no controller yet: the state machine resends after its timeout
        self_handle = ray.get_runtime_context().current_actor
        self.controller.alter_partition.remote(self.topic, self.partition, request, self_handle)

    # --- clients' requests --------------------------------------------------------------------

    def answer_consumer_fetch(self, out: SendFetchData) -> None:
        """A consumer takes the batches as the log stores them, in one byte string (no split
        into batches and join again), or, asked for extents, where they lie."""
        response = out.response
        records = b""
        located = None
        wanted = response.error_code == 0 and out.fetch_offset < out.upper_offset
        if response.request_id in self.extent_requests:
            self.extent_requests.discard(response.request_id)
            located = Extents((), -1, -1)
            if wanted:
                located = self._log.read_extents(out.fetch_offset, out.max_bytes, out.upper_offset)
        elif wanted:
            records = self._log.read(out.fetch_offset, out.max_bytes, out.upper_offset)
        if response.request_id in self.read_committed_requests:
            self.read_committed_requests.discard(response.request_id)
            if response.error_code == 0:
                response = self._with_aborted(response, out.fetch_offset, records, located)
        waiter = self.fetch_waiters.pop(response.request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result((response, records, located))

    def _with_aborted(
        self,
        response: FetchResponse,
        fetch_offset: int,
        records: bytes,
        located: Extents | None,
    ) -> FetchResponse:
        """Kafka's collectAbortedTransactions for a read_committed answer: the aborted
        transactions overlapping [fetch offset, the end of the batches returned, or the LSO
        when none is)."""
        end = data_end_offset(records, located)
        upper = end if end >= 0 else response.last_stable_offset
        aborted = self._log.aborted_txns(fetch_offset, upper)  # the .txnindex files
        if not aborted:
            return response
        return msgspec.structs.replace(
            response, aborted_transactions=tuple((t.producer_id, t.first_offset) for t in aborted)
        )

    def mirror_outcome(
        self, error_code: int, message: str = "", appended: int = 0
    ) -> MirrorOutcome:
        """A mirror append's answer: ``error_code``, and where the log stands now."""
        replica = self._replica
        return MirrorOutcome(
            error_code,
            replica.log_end_offset,
            replica.high_watermark,
            replica.log_start_offset,
            message,
            appended,
        )

    def complete_produce(self, result: ProduceResult) -> None:
        mirror_waiter = self.mirror_waiters.pop(result.request_id, None)
        if mirror_waiter is not None:
            if not mirror_waiter.done():
                mirror_waiter.set_result(
                    self.mirror_outcome(result.error_code, result.message, result.appended)
                )
            return
        waiter = self.produce_waiters.pop(result.request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(
                ProduceOutcome(
                    result.error_code,
                    result.base_offset,
                    self._replica.log_start_offset,
                    result.message,
                )
            )

    def complete_delete_records(self, result: DeleteRecordsResult) -> None:
        waiter = self.delete_waiters.pop(result.request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(
                DeleteRecordsOutcome(result.error_code, result.low_watermark, result.message)
            )

    def wake_long_polls(self) -> None:
        waiters, self.hw_waiters = self.hw_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def fail_requests(self, reason: str) -> None:
        """The replica went offline: every waiting request fails with KAFKA_STORAGE_ERROR."""
        for waiter in self.produce_waiters.values():
            if not waiter.done():
                waiter.set_result(ProduceOutcome(KafkaStorageError.error_code, -1, -1, reason))
        self.produce_waiters.clear()
        for mirror_waiter in self.mirror_waiters.values():
            if not mirror_waiter.done():
                mirror_waiter.set_result(self.mirror_outcome(KafkaStorageError.error_code, reason))
        self.mirror_waiters.clear()
        for delete_waiter in self.delete_waiters.values():
            if not delete_waiter.done():
                delete_waiter.set_result(
                    DeleteRecordsOutcome(KafkaStorageError.error_code, -1, reason)
                )
        self.delete_waiters.clear()
        for fetch_waiter in self.fetch_waiters.values():
            if not fetch_waiter.done():
                fetch_waiter.set_exception(KafkaStorageError(reason))
        self.fetch_waiters.clear()
        self.extent_requests.clear()
        self.read_committed_requests.clear()


__all__ = ["RayReplicaPort", "batch_meta", "picklable", "stored_batch_meta"]
