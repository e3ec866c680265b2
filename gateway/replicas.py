"""The data calls a gateway makes to its broker's replicas, and their answers in Kafka's terms.

This module owns what Produce, Fetch, ListOffsets and DeleteRecords ask of one replica actor
(named by the caller, which routed the request: ``gateway/routing.py``) and turning the outcome,
or its absence, into the backend's results with Kafka error codes. How a call reaches the
replica is ``gateway/replica_calls.py``'s.

Every call is bounded: produce and delete_records by their ``timeout_ms``, fetch by its
``max_wait_ms``, the others by nothing but the margin, each plus ``call_margin_ms`` (a Ray round
trip, an fsync, a slow disk). Past it the client gets REQUEST_TIMED_OUT (7) instead of a hang.

Short-circuit fetches (``storage/short_circuit.py``): a replica on this gateway's Ray node is
asked where the batches lie (``fetch_extents``) and the gateway reads the segment files itself,
checking each batch's CRC and the span located. A read that does not hold (a file removed,
replaced or cut since) is never served: the replica is asked for the bytes. A replica found on
another node is asked for the bytes from then on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import ray

from raylog.actors.calls import FetchOutcome, ReplicaState
from raylog.gateway.backend import (
    DeleteRecordsResult,
    FetchResult,
    ListOffsetsResult,
    PartitionFetch,
    ProduceResult,
)
from raylog.gateway.errors import ErrorCode
from raylog.gateway.replica_calls import NoOutcome, ReplicaCalls
from raylog.storage import short_circuit

__all__ = ["CALL_MARGIN_MS", "ReplicaClient"]

log = logging.getLogger(__name__)

# Beyond the wait a request asks for (timeout_ms, max_wait_ms), the time a replica call may take:
# a Ray round trip, an fsync, a slow disk. Past it the gateway answers instead of hanging.
CALL_MARGIN_MS = 10_000
COLD_READ_THREADS = 4  # short-circuit fetches reading from the disk at once, not the cache


class ReplicaClient:
    """Produce, Fetch, ListOffsets and DeleteRecords on a named replica actor."""

    def __init__(self, calls: ReplicaCalls, *, call_margin_ms: int = CALL_MARGIN_MS) -> None:
        self.calls = calls
        self._call_margin_s = call_margin_ms / 1000
        self._short_circuit = short_circuit.enabled()
        self.remote_replicas: set[str] = set()  # found on another Ray node: asked for bytes
        self._node_id: str | None = None
        self.read_stats = short_circuit.ReadStats()
        # Reads that would wait for the disk run here: threads of their own, so that they never
        # queue behind (or hold up) the default executor's Ray lookups.
        self._read_pool = ThreadPoolExecutor(COLD_READ_THREADS, thread_name_prefix="raylog-read")

    async def aclose(self) -> None:
        await self.calls.aclose()
        self._read_pool.shutdown(wait=False)

    async def produce(
        self,
        name: str,
        records: bytes | memoryview,
        acks: int,
        timeout_ms: int,
        on_sent: Callable[[], None] | None,
        verify_txn: bool = False,
    ) -> ProduceResult:
        """Append one client batch; ``acks`` was checked by the Produce handler.
        ``verify_txn``: see the replica's ``produce`` (the result's ``needs_verification``)."""
        timeout_ms = max(0, timeout_ms)
        try:
            outcome = await self.calls.call(
                name,
                "produce",
                (records, acks, timeout_ms, verify_txn),
                timeout_s=timeout_ms / 1000 + self._call_margin_s,
                retry=False,
                on_sent=on_sent,
            )
        except NoOutcome as exc:
            return ProduceResult(exc.error_code, -1, -1, -1, str(exc))
        except TimeoutError:
            return ProduceResult(ErrorCode.REQUEST_TIMED_OUT, -1, -1, -1, "replica call timed out")
        # LogAppendTime is stamped inside the replica, which does not report the time: -1
        # tells the client to keep its own CreateTime (Kafka's answer for CreateTime topics).
        return ProduceResult(
            outcome.error_code,
            outcome.base_offset,
            -1,
            outcome.log_start_offset,
            outcome.message,
            outcome.needs_verification,
        )

    async def fetch(self, name: str, read: PartitionFetch) -> FetchResult:
        """Records from ``read.fetch_offset`` on, short-circuit where the replica is local."""
        max_wait_ms = max(0, read.max_wait_ms)
        epoch = read.current_leader_epoch
        level = read.isolation_level
        args = (read.fetch_offset, read.max_bytes, max_wait_ms, read.min_bytes, epoch, level)
        method = "fetch"
        if self._short_circuit and name not in self.remote_replicas:
            method = "fetch_extents"
        try:
            outcome = await self.calls.call(
                name,
                method,
                args,
                timeout_s=max_wait_ms / 1000 + self._call_margin_s,
                retry=True,
            )
            records = outcome.records
            if outcome.extents is not None:
                located = await self.read_located(name, outcome)
                if located is None:  # it did not hold: ask for the bytes, which are there
                    outcome = await self.calls.call(
                        name,
                        "fetch",
                        (read.fetch_offset, read.max_bytes, 0, 1, epoch, level),
                        timeout_s=self._call_margin_s,
                        retry=True,
                    )
                    located = outcome.records
                records = located
            if outcome.extents is None:
                self.read_stats.ray_bytes += len(outcome.records)
        except NoOutcome as exc:
            return FetchResult(exc.error_code, -1, -1, -1, b"", -1, str(exc))
        except TimeoutError:
            return FetchResult(ErrorCode.REQUEST_TIMED_OUT, -1, -1, -1, b"", -1, "timed out")
        # The replica serves records below the HW (read_uncommitted) or the LSO
        # (read_committed, with the aborted transactions the records overlap).
        return FetchResult(
            outcome.error_code,
            outcome.high_watermark,
            outcome.last_stable_offset,
            outcome.log_start_offset,
            records,
            -1,
            outcome.message,
            outcome.aborted_transactions,
        )

    async def read_located(self, name: str, outcome: FetchOutcome) -> bytes | bytearray | None:
        """The batches ``outcome`` locates, read from the segment files on this node and
        checked (each CRC, and the span located); None when they cannot be read here or did
        not hold (a file removed, replaced or cut since), so the caller asks for the bytes.

        Reads from the page cache happen inline; a read that would wait for the disk goes to
        a thread, so one cold read does not stall every connection on this event loop."""
        extents = outcome.extents
        assert extents is not None
        if not extents.runs:
            return b""
        if outcome.node_id != self._this_node():
            self.remote_replicas.add(name)  # on another node: ask it for the bytes from now on
            return None
        try:
            try:
                data = short_circuit.read_runs(extents.runs, nowait=True)
            except short_circuit.WouldBlock:
                self.read_stats.disk_reads += 1
                loop = asyncio.get_running_loop()
                async with asyncio.timeout(self._call_margin_s):  # then the replica is asked
                    data = await loop.run_in_executor(
                        self._read_pool, short_circuit.read_runs, extents.runs
                    )
        except (OSError, TimeoutError) as exc:
            log.info("short-circuit fetch of %s did not hold (%s); asking for bytes", name, exc)
            self.read_stats.fallbacks += 1
            return None
        if not short_circuit.spans(data, extents.first_offset, extents.next_offset, verify=True):
            log.info("short-circuit fetch of %s read other batches; asking for bytes", name)
            self.read_stats.fallbacks += 1
            return None
        self.read_stats.local_bytes += len(data)
        return data

    def _this_node(self) -> str:
        if self._node_id is None:
            self._node_id = (
                str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else ""
            )
        return self._node_id

    async def list_offsets(
        self, name: str, timestamp: int, current_leader_epoch: int, isolation_level: int = 0
    ) -> ListOffsetsResult:
        try:
            code, found_timestamp, offset, leader_epoch = await self.calls.call(
                name,
                "list_offsets",
                (timestamp, current_leader_epoch, isolation_level),
                timeout_s=self._call_margin_s,
                retry=True,
            )
        except NoOutcome as exc:
            return ListOffsetsResult(exc.error_code, -1, -1)
        except TimeoutError:
            return ListOffsetsResult(ErrorCode.REQUEST_TIMED_OUT, -1, -1)
        return ListOffsetsResult(code, found_timestamp, offset, leader_epoch)

    async def delete_records(self, name: str, offset: int, timeout_ms: int) -> DeleteRecordsResult:
        timeout_ms = max(0, timeout_ms)
        try:
            outcome = await self.calls.call(
                name,
                "delete_records",
                (offset, timeout_ms),
                timeout_s=timeout_ms / 1000 + self._call_margin_s,
                retry=False,
            )
        except NoOutcome as exc:
            return DeleteRecordsResult(exc.error_code, -1, str(exc))
        except TimeoutError:
            return DeleteRecordsResult(ErrorCode.REQUEST_TIMED_OUT, -1, "replica call timed out")
        return DeleteRecordsResult(outcome.error_code, outcome.low_watermark, outcome.message)

    async def write_txn_marker(
        self,
        name: str,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        timeout_ms: int,
    ) -> ProduceResult:
        """A transaction's COMMIT or ABORT marker for one producer, appended by the partition's
        leader replica ``name`` with acks=all (the transaction coordinator's WriteTxnMarkers)."""
        timeout_ms = max(0, timeout_ms)
        try:
            outcome = await self.calls.call(
                name,
                "write_txn_marker",
                (producer_id, producer_epoch, coordinator_epoch, commit, timeout_ms),
                timeout_s=timeout_ms / 1000 + self._call_margin_s,
                retry=False,
            )
        except NoOutcome as exc:
            return ProduceResult(exc.error_code, -1, -1, -1, str(exc))
        except TimeoutError:
            return ProduceResult(ErrorCode.REQUEST_TIMED_OUT, -1, -1, -1, "replica call timed out")
        return ProduceResult(
            outcome.error_code, outcome.base_offset, -1, outcome.log_start_offset, outcome.message
        )

    async def state(self, name: str) -> ReplicaState | None:
        """The replica's own view of itself (role, ISR, high watermark, log start offset);
        None when it cannot be had within the margin."""
        try:
            return await self.calls.call(  # type: ignore[no-any-return]
                name, "state", (), timeout_s=self._call_margin_s, retry=True
            )
        except (NoOutcome, TimeoutError):
            return None
