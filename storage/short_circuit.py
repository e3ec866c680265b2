"""Short-circuit reads: a reader on a replica's machine reads the batches the replica located
(:meth:`raylog.storage.log.Log.read_extents`) from the segment files itself, as HDFS's
short-circuit local reads do, so the bytes never cross a socket or Ray's object store.

The replica locates the batches from their headers and checks nothing else, so the reader
checks what it read: every batch whole and passing its CRC (unless the reader decodes them
with CRC checks of its own), and exactly the located span of offsets. Between the locating and
the reading, retention or compaction may remove or replace a segment file and a truncation may
cut it; such a read fails these checks (or raises OSError) and the reader asks the replica for
the bytes instead.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from raylog.storage import batch as rb
from raylog.storage.errors import RaylogError

Run = tuple[str, int, int]  # (segment file, position, size)

# RAYLOG_SHORT_CIRCUIT_READS=0 turns short-circuit reads off, in the gateways and the pipeline
# readers alike: every read then asks the replica for the bytes.
SHORT_CIRCUIT_ENV = "RAYLOG_SHORT_CIRCUIT_READS"


def enabled() -> bool:
    """Whether short-circuit reads are on (``RAYLOG_SHORT_CIRCUIT_READS``, default on)."""
    return os.environ.get(SHORT_CIRCUIT_ENV, "1") != "0"


@dataclass
class ReadStats:
    """How a reader's fetches were answered: bytes read from the segment files on this node
    (short-circuit), bytes the replica sent (through Ray or a socket), short-circuit reads
    that did not hold and were asked again, those that had to wait for the disk, bytes
    read from what a planner located ahead of the reader (with no call to the replica), and
    bytes read from the object store (remote segments of tiered topics)."""

    local_bytes: int = 0
    ray_bytes: int = 0
    fallbacks: int = 0
    disk_reads: int = 0
    planned_bytes: int = 0
    remote_bytes: int = 0


_nowait_supported = True  # False once a filesystem refused RWF_NOWAIT


class WouldBlock(Exception):
    """Part of a ``nowait`` read is not in the page cache: reading it would wait for the disk."""


def read_runs(runs: Sequence[Run], *, nowait: bool = False) -> bytearray:
    """The bytes of ``(file, position, size)`` runs, read into one buffer.

    Raises OSError when a file is gone or shorter than a run. With ``nowait`` it never waits
    for the disk (``RWF_NOWAIT``): it raises WouldBlock when some bytes are not cached, so an
    event loop can read them in a thread instead of stalling. On a filesystem without
    ``RWF_NOWAIT`` it reads as without ``nowait``.
    """
    global _nowait_supported
    data = bytearray(sum(size for _, _, size in runs))
    view = memoryview(data)
    at = 0
    for path, position, size in runs:
        flags = os.RWF_NOWAIT if nowait and _nowait_supported else 0
        fd = os.open(path, os.O_RDONLY)
        try:
            try:
                got = os.preadv(fd, [view[at : at + size]], position, flags)
            except BlockingIOError as exc:
                raise WouldBlock(path) from exc
            except OSError as exc:
                if not flags or exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                # This filesystem cannot tell: read as the replica itself would, blocking.
                _nowait_supported = False
                flags = 0
                got = os.preadv(fd, [view[at : at + size]], position)
        finally:
            os.close(fd)
        if got != size:
            if flags:  # a short read may be the cache's edge, not the file's: ask again
                raise WouldBlock(path)
            raise OSError(f"{path}: {got} of {size} bytes at {position}")
        at += size
    return data


_LENGTH = struct.Struct(">i")  # a batch's length field, at byte 8 of its header


def read_slices(runs: Sequence[Run], slice_bytes: int) -> Iterator[tuple[bytearray, int]]:
    """The bytes of ``(file, position, size)`` runs of whole batches, read ``slice_bytes`` at a
    time: each slice whole batches, about ``slice_bytes`` (a larger batch is a slice of its
    own), with where its last batch starts. So a reader decodes the first batches while the
    later ones are still in the file, and holds one slice at a time.

    Only the batches' length fields are read here; the caller checks their headers and CRCs.
    Raises OSError when a file is gone or shorter than a run, RaylogError when the lengths do
    not cut a run into whole batches.
    """
    if slice_bytes < rb.HEADER_SIZE:
        raise ValueError(f"slice_bytes {slice_bytes} < one batch header")
    for path, position, size in runs:
        fd = os.open(path, os.O_RDONLY)
        try:
            done = 0
            while done < size:  # bounded: every pass takes at least one batch, or raises
                data = _pread(fd, path, position + done, min(slice_bytes, size - done))
                end, last = _whole_batches(data)
                if end == 0:  # one batch larger than a slice: read it whole
                    if len(data) < rb.HEADER_SIZE:
                        raise RaylogError(f"{path}: a run ends inside a batch header")
                    need = _LENGTH.unpack_from(data, 8)[0] + rb.LOG_OVERHEAD
                    if need > size - done:
                        raise RaylogError(f"{path}: a batch at {position + done} passes its run")
                    data = _pread(fd, path, position + done, need)
                    end = need
                del data[end:]
                done += end
                yield data, last
        finally:
            os.close(fd)


def _pread(fd: int, path: str, position: int, size: int) -> bytearray:
    data = bytearray(size)
    got = os.preadv(fd, [data], position)
    if got != size:
        raise OSError(f"{path}: {got} of {size} bytes at {position}")
    return data


def _whole_batches(data: bytearray) -> tuple[int, int]:
    """Where the whole batches at the start of ``data`` end, and where the last one starts
    (0, 0 when not even the first is whole)."""
    pos = last = 0
    while len(data) - pos >= rb.HEADER_SIZE:  # bounded: pos grows by >= one header
        size = _LENGTH.unpack_from(data, pos + 8)[0] + rb.LOG_OVERHEAD
        if size < rb.HEADER_SIZE:
            raise RaylogError(f"a batch length of {size - rb.LOG_OVERHEAD} bytes at {pos}")
        if pos + size > len(data):
            break
        last, pos = pos, pos + size
    return pos, last


def spans(data: bytes | bytearray, first_offset: int, next_offset: int, *, verify: bool) -> bool:
    """Whether ``data`` holds whole batches, starting with the batch at ``first_offset`` and
    ending with the one before ``next_offset``; with ``verify``, each passing its CRC."""
    try:
        headers = [header for _, header in rb.iter_batches(data, verify=verify)]
    except RaylogError:
        return False
    return (
        bool(headers)
        and headers[0].base_offset == first_offset
        and headers[-1].next_offset == next_offset
    )
