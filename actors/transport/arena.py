"""Same-host produce hand-off: a gateway receives a client's large request straight into shared
memory, and its broker's leader replica appends the batch from there.

Why: over the replication channel a 1 MB produce batch was copied four times between the
gateway and the replica (into the call's frame, into the Unix socket, out of it, out of the
frame into the bytes the call decodes), and the socket calls cost as much again. With the
arena the bytes the gateway's socket received are the bytes the replica validates and writes
to its log (``Log.append`` writes the caller's buffer as it is): the call carries where they
are, not what they are.

Shape:

- :class:`Arena` (gateway): a ``memfd`` (128 MiB) mapped shared, cut into
  :class:`Block` s by a first-fit allocator. A block is freed when its last holder releases
  it: the request that received it (once answered) and every call that handed it to a replica
  (once that call's reply arrives, whether or not anyone still waits for it). A call whose
  link breaks never releases its block: the replica may still read it, so it is never reused
  (:meth:`Block.lose`), and an arena that has lost half of itself is retired for a fresh one.
  Nothing in a block is written after its frame arrived, until it is freed.
- :class:`ArenaViews` (replica): opens an arena as ``/proc/<gateway pid>/fd/<fd>`` (both run
  as one user on one machine: the channel's same-host check), read-only, and checks the
  random nonce the gateway wrote at its start, so a reused pid or fd number never maps
  something else. Mappings are cached (a few per replica) and stay alive while a view of
  them does; the mappings of gateways whose process is gone are dropped whenever another
  arena is opened (a restarted gateway opens its new one), so a dead gateway's memfd does not
  stay pinned by its replicas.
- A gateway first asks each replica's link to open the arena (``open_arena``), and hands it
  blocks (``produce_shared``) only once that worked: a replica that cannot open it (another
  machine, a hardened ``/proc``) gets the batches in the call's frame, as before. Produce
  calls on a link keep their order either way (one stream).

``RAYLOG_PRODUCE_ARENA=0`` in the cluster's environment turns the hand-off off.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import logging
import mmap
import os

log = logging.getLogger(__name__)

ARENA_ENV = "RAYLOG_PRODUCE_ARENA"
ARENA_MIB_ENV = "RAYLOG_PRODUCE_ARENA_MIB"
# Large requests in flight at once (acks=all waits for the followers); one that finds no room
# is received in private memory, as before. Pages are touched only as they are used.
ARENA_MIB_DEFAULT = 128
ALIGN = 64
_MAGIC = b"raylog-arena-v1\0"
NONCE_BYTES = 16
HEADER_BYTES = 64  # magic + nonce, then blocks
RETIRE_LOST_FRACTION = 0.5  # an arena that lost this much of itself to broken links is retired
RETIRED_ARENAS_MAX = 4  # then the hand-off stays off: each retired arena's memory may stay
VIEW_CACHE_MAX = 8  # arenas a replica keeps mapped (one per gateway that writes to it)

# Where an arena is, as a replica opens it: (gateway pid, fd in the gateway, nonce hex).
ArenaRef = tuple[int, int, str]


class ArenaError(Exception):
    """The arena cannot be opened or does not hold the range asked for."""


def enabled() -> bool:
    return os.environ.get(ARENA_ENV, "1") != "0" and hasattr(os, "memfd_create")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's (a reused pid)
    return True


def _address(view: memoryview) -> int:
    """Where a writable buffer's first byte is in this process's memory."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class Block:
    """One allocation at ``offset``: ``view`` is writable, exactly the bytes asked for."""

    __slots__ = ("_holders", "_lost", "arena", "offset", "size", "view")

    def __init__(self, arena: Arena, offset: int, size: int, length: int) -> None:
        self.arena = arena
        self.offset = offset
        self.size = size  # aligned: what it takes from the arena
        self.view = arena.view[offset : offset + length]
        self._holders = 1  # the receiver that asked for it
        self._lost = False

    def acquire(self) -> None:
        if self._holders <= 0:
            raise RuntimeError("block acquired after it was freed")
        self._holders += 1

    def release(self) -> None:
        self._holders -= 1
        if self._holders == 0:
            self.arena._free(self)
        elif self._holders < 0:
            raise RuntimeError("block released more often than held")

    def lose(self) -> None:
        """A holder whose release will never come (its call's link broke): never reuse it."""
        if not self._lost:
            self._lost = True
            self.arena.lost_bytes += self.size
        self.release()


class Arena:
    """The gateway's shared memory. Not thread-safe: one event loop allocates and frees."""

    def __init__(self, size: int) -> None:
        if size <= HEADER_BYTES:
            raise ValueError(f"arena of {size} bytes")
        self.fd = os.memfd_create("raylog-produce-arena", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size
        self.nonce = os.urandom(NONCE_BYTES)
        self._map[: len(_MAGIC) + NONCE_BYTES] = _MAGIC + self.nonce
        self.view = memoryview(self._map)
        self._base = _address(self.view)
        self.ref: ArenaRef = (os.getpid(), self.fd, self.nonce.hex())
        # Free ranges as two sorted lists (starts, sizes): first fit, merged with neighbours.
        self._free_starts = [HEADER_BYTES]
        self._free_sizes = [size - HEADER_BYTES]
        self._live: dict[int, Block] = {}  # by offset
        self._live_starts: list[int] = []
        self.lost_bytes = 0
        self.allocated_bytes = 0
        self.allocations = 0
        self.refusals = 0  # allocations that found no room

    def allocate(self, size: int) -> Block | None:
        """A block of ``size`` bytes, or None when no free range holds it."""
        need = -(-size // ALIGN) * ALIGN
        for i, free in enumerate(self._free_sizes):
            if free >= need:
                start = self._free_starts[i]
                if free == need:
                    del self._free_starts[i], self._free_sizes[i]
                else:
                    self._free_starts[i] += need
                    self._free_sizes[i] -= need
                block = Block(self, start, need, size)
                self._live[start] = block
                bisect.insort(self._live_starts, start)
                self.allocated_bytes += need
                self.allocations += 1
                return block
        self.refusals += 1
        return None

    def locate(self, view: memoryview) -> tuple[Block, int] | None:
        """The live block ``view`` lies in (a slice of its frame) and where ``view`` starts in
        the arena, or None."""
        if view.readonly or not view.contiguous or len(view) == 0:
            return None
        try:
            offset = _address(view) - self._base
        except (TypeError, ValueError):
            return None
        if not HEADER_BYTES <= offset < self.size:
            return None
        i = bisect.bisect_right(self._live_starts, offset) - 1
        if i < 0:
            return None
        block = self._live[self._live_starts[i]]
        if offset + len(view) > block.offset + block.size:
            return None
        return block, offset

    @property
    def worn_out(self) -> bool:
        return self.lost_bytes >= RETIRE_LOST_FRACTION * (self.size - HEADER_BYTES)

    def _free(self, block: Block) -> None:
        del self._live[block.offset]
        self._live_starts.pop(bisect.bisect_left(self._live_starts, block.offset))
        self.allocated_bytes -= block.size
        if block._lost:
            return  # never reused: a replica may still read it
        start, size = block.offset, block.size
        i = bisect.bisect_left(self._free_starts, start)
        # Merge with the free range after it, then with the one before it.
        if i < len(self._free_starts) and self._free_starts[i] == start + size:
            size += self._free_sizes[i]
            del self._free_starts[i], self._free_sizes[i]
        if i > 0 and self._free_starts[i - 1] + self._free_sizes[i - 1] == start:
            self._free_sizes[i - 1] += size
        else:
            self._free_starts.insert(i, start)
            self._free_sizes.insert(i, size)

    @property
    def free_bytes(self) -> int:
        return sum(self._free_sizes)


class ArenaViews:
    """A replica's mappings of gateways' arenas (read-only), by :data:`ArenaRef`."""

    def __init__(self, max_arenas: int = VIEW_CACHE_MAX) -> None:
        self._maps: collections.OrderedDict[ArenaRef, memoryview] = collections.OrderedDict()
        self._max = max_arenas

    def open(self, ref: ArenaRef) -> memoryview:
        whole = self._maps.get(ref)
        if whole is not None:
            self._maps.move_to_end(ref)
            return whole
        self.drop_dead()
        pid, fd, nonce_hex = ref
        try:
            nonce = bytes.fromhex(nonce_hex)
            handle = os.open(f"/proc/{int(pid)}/fd/{int(fd)}", os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, ValueError) as exc:
            raise ArenaError(f"cannot open arena {ref}: {exc}") from exc
        try:
            mapped = mmap.mmap(handle, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise ArenaError(f"cannot map arena {ref}: {exc}") from exc
        finally:
            os.close(handle)
        whole = memoryview(mapped)
        if whole[: len(_MAGIC) + NONCE_BYTES] != _MAGIC + nonce:
            raise ArenaError(f"{ref} is not the arena it names (nonce mismatch)")
        self._maps[ref] = whole
        while len(self._maps) > self._max:
            self._maps.popitem(last=False)  # unmapped once no view of it is left
        return whole

    def drop_dead(self) -> int:
        """Forget the mappings of arenas whose gateway process is gone (each is unmapped once
        no view of it is left); returns how many."""
        dead = [ref for ref in self._maps if not _process_alive(ref[0])]
        for ref in dead:
            del self._maps[ref]
        return len(dead)

    def mapped(self) -> list[ArenaRef]:
        return list(self._maps)

    def view(self, ref: ArenaRef, offset: int, length: int) -> memoryview:
        """Read-only view of ``length`` bytes at ``offset`` in arena ``ref``."""
        whole = self.open(ref)
        if not (offset >= HEADER_BYTES and length > 0 and offset + length <= len(whole)):
            raise ArenaError(f"range {offset}+{length} outside arena {ref} ({len(whole)} bytes)")
        return whole[offset : offset + length]


class ArenaPool:
    """The gateway's current arena, replaced by a fresh one when it wears out (lost blocks).

    A retired arena's fd stays open (a replica may still have to open it for a call in flight)
    and its memory with it, so at most ``RETIRED_ARENAS_MAX`` are retired; after that the
    hand-off stays off."""

    def __init__(self, size: int | None = None) -> None:
        if size is None:
            size = int(os.environ.get(ARENA_MIB_ENV, ARENA_MIB_DEFAULT)) << 20
        self._size = size
        self._retired: list[Arena] = []
        self.current: Arena | None = None
        try:
            self.current = Arena(size)
        except OSError as exc:
            log.warning("no produce arena (%r): batches go in the calls' frames", exc)

    def allocate(self, size: int) -> Block | None:
        arena = self.current
        if arena is None:
            return None
        if arena.worn_out:
            arena = self._retire()
            if arena is None:
                return None
        return arena.allocate(size)

    def locate(self, view: memoryview) -> tuple[Block, int] | None:
        """:meth:`Arena.locate` in the current arena or a retired one."""
        for arena in ([self.current] if self.current is not None else []) + self._retired:
            found = arena.locate(view)
            if found is not None:
                return found
        return None

    def stats(self) -> dict[str, int]:
        """For the gateway's metrics: the current arena's size and use, and counts over every
        arena so far (allocations; refusals: large requests received in private memory)."""
        arenas = [*self._retired, *([self.current] if self.current is not None else [])]
        current = self.current
        return {
            "bytes": current.size if current is not None else 0,
            "allocated_bytes": current.allocated_bytes if current is not None else 0,
            "lost_bytes": sum(a.lost_bytes for a in arenas),
            "allocations": sum(a.allocations for a in arenas),
            "refusals": sum(a.refusals for a in arenas),
            "retired": len(self._retired),
        }

    def _retire(self) -> Arena | None:
        assert self.current is not None
        self._retired.append(self.current)
        self.current = None
        if len(self._retired) > RETIRED_ARENAS_MAX:
            log.warning("produce arena retired %d times: hand-off off", len(self._retired))
            return None
        log.warning("produce arena lost half of itself to broken links: a fresh one")
        try:
            self.current = Arena(self._size)
        except OSError as exc:
            log.warning("no fresh produce arena (%r)", exc)
        return self.current
