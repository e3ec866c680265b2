"""Reading a remote segment: whole batches from an offset, by byte range, CRC-checked.

A read finds the batch position in the segment's offset index (floor search on the index
bytes), then walks batch headers in the ``log`` object from there, skipping batches below the
offset, and returns whole batches up to ``max_bytes`` (the first one whole whatever its size),
as :meth:`Log.read` does for a local segment. Bytes come through :class:`ByteLRU`
(:mod:`raylog.storage.remote.cache`): the ``log`` object in aligned chunks of
``READ_CHUNK_BYTES`` (one GetObject with Range per run of missing chunks), and the small
objects (manifest, indexes, txnindex) whole.

Integrity: the manifest carries its own CRC-32C, each small object is checked against the
size and CRC-32C the manifest gives, and each batch returned against its own CRC-32C. A
mismatch raises :class:`~raylog.storage.errors.CorruptRemoteObjectError`, drops the object's
cached bytes (a later read fetches them again) and serves nothing. An object that is gone
(retention deleted the segment under the read) raises OffsetOutOfRangeError, as a local read
below the log start does.

Synchronous, for a replica's thread; one reader may serve several threads.
"""

from __future__ import annotations

from typing import NoReturn

from raylog.storage import batch as rb
from raylog.storage.errors import CorruptRemoteObjectError, OffsetOutOfRangeError
from raylog.storage.log.txnindex import ENTRY, AbortedTxn
from raylog.storage.objectstore import ObjectStore
from raylog.storage.remote import format as fmt
from raylog.storage.remote.cache import ByteLRU, process_cache
from raylog.storage.remote.format import Manifest, RemotePartition
from raylog.storage.remote.metadata import RemoteSegment

READ_CHUNK_BYTES = 1 << 20


class RemoteReader:
    """Reads remote segments of any partition of ``store``, through ``cache`` (the process's
    shared one by default)."""

    def __init__(self, store: ObjectStore, cache: ByteLRU | None = None) -> None:
        self._store = store
        self.cache = cache if cache is not None else process_cache()

    # -- batches ------------------------------------------------------------------------------

    def read(
        self,
        partition: RemotePartition,
        segment: RemoteSegment,
        offset: int,
        max_bytes: int,
        max_offset: int | None = None,
    ) -> list[bytes]:
        """Whole batches of ``segment`` from the one holding ``offset``: at least one, then
        while the total stays within ``max_bytes``; none whose last offset is >=
        ``max_offset``. Only this segment's batches (the caller goes on to the next)."""
        if not segment.base_offset <= offset <= segment.end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} outside remote segment {segment.segment_id} "
                f"[{segment.base_offset}, {segment.end_offset}]"
            )
        if max_bytes < 0:
            raise ValueError(f"max_bytes {max_bytes} < 0")
        manifest = self.manifest(partition, segment)
        key = partition.object_key(segment, fmt.LOG)
        size = manifest.objects[fmt.LOG].size
        pos = self._floor_position(partition, segment, manifest, offset)
        out: list[bytes] = []
        total = 0
        while pos < size:  # bounded: every round moves ``pos`` on by a whole batch
            header = rb.parse_header(self._log_bytes(key, pos, rb.HEADER_SIZE, size))
            if (
                header.magic != rb.MAGIC
                or header.batch_length < rb.MIN_BATCH_LENGTH
                or pos + header.size > size
            ):
                self._corrupt(key, f"no valid batch header at byte {pos}")
            if header.next_offset <= offset:
                pos += header.size
                continue
            if max_offset is not None and header.last_offset >= max_offset:
                break
            if out and total + header.size > max_bytes:
                break
            data = self._log_bytes(key, pos, header.size, size)
            if not rb.crc_ok(data, 0, header):
                self._corrupt(key, f"batch at byte {pos} (offset {header.base_offset}) fails CRC")
            out.append(data)
            total += header.size
            pos += header.size
            if total >= max_bytes:
                break
        return out

    def _floor_position(
        self, partition: RemotePartition, segment: RemoteSegment, manifest: Manifest, offset: int
    ) -> int:
        """The position of the last indexed batch whose base offset is <= ``offset``: a
        binary search over the index bytes (Kafka's layout, sorted)."""
        index = self._small(partition, segment, manifest, fmt.INDEX)
        entries = len(index) // fmt.INDEX_ENTRY.size
        rel = offset - segment.base_offset
        lo, hi = 0, entries  # invariant: entries below lo have rel <= target; from hi on, >
        while lo < hi:
            mid = (lo + hi) // 2
            if fmt.INDEX_ENTRY.unpack_from(index, mid * fmt.INDEX_ENTRY.size)[0] <= rel:
                lo = mid + 1
            else:
                hi = mid
        return fmt.INDEX_ENTRY.unpack_from(index, (lo - 1) * fmt.INDEX_ENTRY.size)[1] if lo else 0

    def _log_bytes(self, key: str, start: int, length: int, size: int) -> bytes:
        """Bytes [start, start + length) of the ``log`` object of ``size`` bytes, through the
        cache in aligned chunks; missing chunks are fetched a run at a time."""
        first, last = start // READ_CHUNK_BYTES, (start + length - 1) // READ_CHUNK_BYTES
        chunks: dict[int, bytes] = {}
        missing: list[int] = []
        for i in range(first, last + 1):
            cached = self.cache.get((key, i))
            if cached is None:
                missing.append(i)
            else:
                chunks[i] = cached
        runs: list[list[int]] = []
        for i in missing:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        for run in runs:
            at = run[0] * READ_CHUNK_BYTES
            want = min(len(run) * READ_CHUNK_BYTES, size - at)
            data = self._store.get_range(key, at, want)
            if data is None:
                raise OffsetOutOfRangeError(f"remote object {key} is gone (segment deleted)")
            if len(data) != want:
                self._corrupt(key, f"{len(data)} bytes at byte {at}, expected {want}")
            for j, i in enumerate(run):
                chunk = data[j * READ_CHUNK_BYTES : (j + 1) * READ_CHUNK_BYTES]
                self.cache.put((key, i), chunk)
                chunks[i] = chunk
        joined = b"".join(chunks[i] for i in range(first, last + 1))
        skip = start - first * READ_CHUNK_BYTES
        out = joined[skip : skip + length]
        if len(out) != length:
            self._corrupt(key, f"ends inside the {length} bytes at byte {start}")
        return out

    # -- the small objects ----------------------------------------------------------------------

    def manifest(self, partition: RemotePartition, segment: RemoteSegment) -> Manifest:
        key = partition.object_key(segment, fmt.MANIFEST)
        data = self.cache.get(key)
        if data is None:
            found = self._store.get(key)
            if found is None:
                raise OffsetOutOfRangeError(f"remote manifest {key} is gone (segment deleted)")
            data = found.body
        try:
            manifest = fmt.decode_manifest(data, key)
        except CorruptRemoteObjectError:
            self.cache.discard_where(key)
            raise
        if (manifest.segment_id, manifest.base_offset, manifest.end_offset) != (
            segment.segment_id,
            segment.base_offset,
            segment.end_offset,
        ):
            self._corrupt(key, "names another segment than its metadata entry")
        self.cache.put(key, data)
        return manifest

    def _small(
        self, partition: RemotePartition, segment: RemoteSegment, manifest: Manifest, name: str
    ) -> bytes:
        """A whole small object, checked against the manifest (b"" when the copy has none)."""
        info = manifest.objects.get(name)
        if info is None:
            return b""
        key = partition.object_key(segment, name)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        found = self._store.get(key)
        if found is None:
            raise OffsetOutOfRangeError(f"remote object {key} is gone (segment deleted)")
        data = fmt.check_object(found.body, info, key)
        self.cache.put(key, data)
        return data

    def aborted_txns(
        self,
        partition: RemotePartition,
        segment: RemoteSegment,
        start_offset: int,
        upper_offset: int,
    ) -> list[AbortedTxn]:
        """The segment's aborted transactions overlapping [start_offset, upper_offset), as
        :meth:`Log.aborted_txns` answers for a local segment."""
        manifest = self.manifest(partition, segment)
        data = self._small(partition, segment, manifest, fmt.TXNINDEX)
        out = []
        for _, *fields in ENTRY.iter_unpack(data):
            txn = AbortedTxn(*fields)
            if txn.last_offset >= start_offset and txn.first_offset < upper_offset:
                out.append(txn)
        return out

    def producer_snapshot(
        self, partition: RemotePartition, segment: RemoteSegment
    ) -> tuple[int, bytes] | None:
        """The producer-state snapshot uploaded with the segment: (its offset, its bytes)."""
        manifest = self.manifest(partition, segment)
        if manifest.producer_snapshot_offset is None:
            return None
        data = self._small(partition, segment, manifest, fmt.SNAPSHOT)
        return manifest.producer_snapshot_offset, data

    def _corrupt(self, key: str, why: str) -> NoReturn:
        self.cache.discard_where(key)
        raise CorruptRemoteObjectError(f"remote object {key}: {why}")
