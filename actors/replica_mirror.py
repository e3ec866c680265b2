"""A mirror topic's leader taking a source cluster's batches (KIP-986 cluster links), mixed into
:class:`raylog.actors.replica.ReplicaActor`.

This module owns the shell's side of a mirror append: :meth:`ReplicaMirror.mirror_append`,
which the gateway on the leader's broker calls (over the replica's channel, or by Ray) with the
raw batches a source Fetch returned, and :func:`mirrored_batches`, which checks those bytes and
restamps them. The decisions (which batches go where, acks, fencing) are the pure state
machine's (``raylog.actors.replication.mirror``); the bytes are checked and restamped here:

- whole batches only: a trailing partial batch (a source Fetch cut at its byte limit) is not
  taken, nor anything beyond ``MAX_BATCHES_PER_MESSAGE`` batches; the answer's log end says
  where to fetch next;
- every whole batch is checked (magic 2, lengths, CRC-32C, offsets in order, a transaction
  marker that decodes): at the first bad one the call answers CORRUPT_MESSAGE naming it,
  nothing from it on is appended, and the batches before it are;
- each batch's partition-leader-epoch (outside the CRC'd bytes) is set to the leader's epoch
  in one copy of the buffer: the records, offsets, producer fields and attributes stay the
  source's bytes.

The host class provides ``_ensure_started``, ``_refuse_leader_write``, ``_new_request_id``,
``_step`` and the attributes annotated on :class:`ReplicaMirror`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec

from raylog.actors.calls import MirrorOutcome
from raylog.actors.replica_port import RayReplicaPort, stored_batch_meta
from raylog.actors.replication.messages import MirrorAppendRequest, RecordBatch
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.replica_state import MAX_BATCHES_PER_MESSAGE
from raylog.storage import batch as rb
from raylog.storage.errors import (
    CorruptRecordError,
    InvalidRequiredAcksError,
    RaylogError,
    RequestTimedOutError,
)

REQUEST_TIMEOUT_MS_MAX = 300_000  # bound on a mirror append's timeout, as on a produce's


def mirrored_batches(
    data: bytes | bytearray | memoryview, leader_epoch: int
) -> tuple[tuple[RecordBatch, ...], str]:
    """The whole batches of a source Fetch's ``data``, restamped with ``leader_epoch``, and
    why the rest was not taken when it is corrupt ("" when it is only a partial batch, or
    nothing). See the module docstring for the checks."""
    view = memoryview(data).cast("B")
    stamped: bytearray | None = None
    taken: list[RecordBatch] = []
    pos, next_offset = 0, 0
    # Fewer bytes left than a header: a trailing partial batch, as is one whose length runs
    # past the end (the source cut its answer there).
    while len(taken) < MAX_BATCHES_PER_MESSAGE and len(view) - pos >= rb.HEADER_SIZE:
        header = rb.parse_header(view, pos)
        if (
            header.magic == rb.MAGIC
            and header.batch_length >= rb.MIN_BATCH_LENGTH
            and len(view) - pos < header.size <= rb.MAX_BATCH_SIZE_SANITY
        ):
            break
        try:
            rb.check_framing(view, pos, header)
            rb.verify_crc(view, pos, header)
            if header.last_offset_delta < 0 or header.base_offset < next_offset:
                raise CorruptRecordError(
                    f"record batch at byte {pos}: offsets [{header.base_offset}, "
                    f"{header.next_offset}) out of order (the previous batch ends at "
                    f"{next_offset})"
                )
            if stamped is None:
                stamped = bytearray(view)  # the one copy: the caller's bytes are immutable
            batch = memoryview(stamped)[pos : pos + header.size]
            rb.set_partition_leader_epoch(batch, 0, leader_epoch)
            meta = stored_batch_meta(batch)  # a marker's record decodes (or is corrupt)
        except RaylogError as exc:
            return tuple(taken), f"batch with base offset {header.base_offset}: {exc}"
        taken.append(RecordBatch(meta, batch))
        pos += header.size
        next_offset = header.next_offset
    return tuple(taken), ""


class ReplicaMirror:
    """The mirror append of a replica actor (a mixin; see the module docstring)."""

    _sm: PartitionReplica
    _port: RayReplicaPort

    _ensure_started: Callable[[], None]
    _refuse_leader_write: Callable[..., tuple[int, str] | None]  # (mirrored=...)
    _new_request_id: Callable[[], int]
    _step: Callable[[Any], None]

    async def mirror_append(
        self,
        leader_epoch: int,
        batches: bytes,
        acks: int,
        timeout_ms: int,
        source_log_start: int = -1,
    ) -> MirrorOutcome:
        """Append a source cluster's ``batches`` (as a source Fetch returned them) at their own
        offsets on this mirror topic's leader of ``leader_epoch``; return when ``acks`` hold
        for them (acks=0: at once, with what is known then). ``batches`` b"" asks where the
        log ends (the next source offset to fetch), answered at once.

        Errors: NOT_LEADER_OR_FOLLOWER off the leader (or without a broker session lease),
        FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH for another epoch, INVALID_REQUEST for a
        topic that mirrors no link or a batch straddling the log end, CORRUPT_MESSAGE for a
        bad batch (those before it are appended), INVALID_REQUIRED_ACKS, and produce's
        (NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR)."""
        self._ensure_started()
        refused = self._refuse_leader_write(mirrored=True)
        if refused is None and acks not in (0, 1, -1):
            refused = InvalidRequiredAcksError.error_code, f"acks {acks} is not 0, 1 or -1"
        if refused is not None:
            return self._port.mirror_outcome(*refused)
        taken, corrupt = mirrored_batches(batches, leader_epoch)
        request_id = self._new_request_id()
        timeout_ms = max(0, min(timeout_ms, REQUEST_TIMEOUT_MS_MAX))
        waiter: asyncio.Future[MirrorOutcome] = asyncio.get_running_loop().create_future()
        self._port.mirror_waiters[request_id] = waiter
        self._step(
            MirrorAppendRequest(request_id, leader_epoch, acks, timeout_ms, taken, source_log_start)
        )
        if acks == 0 and not waiter.done():
            # Kafka answers nothing for acks=0; the caller still learns where the log ends.
            self._port.mirror_waiters.pop(request_id, None)
            pending = self._sm.pending.get(request_id)
            outcome = self._port.mirror_outcome(0, "", pending.appended if pending else 0)
        else:
            try:
                # The state machine times the request out itself; this bound guards the shell.
                outcome = await asyncio.wait_for(waiter, timeout=timeout_ms / 1000 + 5)
            except TimeoutError:
                self._port.mirror_waiters.pop(request_id, None)
                outcome = self._port.mirror_outcome(
                    RequestTimedOutError.error_code, "no completion"
                )
        if corrupt and outcome.error_code == 0:
            outcome = msgspec.structs.replace(
                outcome, error_code=CorruptRecordError.error_code, message=corrupt
            )
        return outcome
