"""The produce arena (``raylog.actors.transport.arena``) without Ray: the gateway's allocator and a
replica's read-only mapping of it.

The claims: blocks never overlap and are reused only once every holder released them; a block
a broken link lost is never reused, and an arena that lost half of itself is replaced; a view
of a frame is found in its block (and nothing else is); a replica maps the arena through
``/proc/<pid>/fd/<fd>``, sees exactly what the gateway wrote, and refuses a wrong nonce, a
closed fd and any range outside the arena.
"""

from __future__ import annotations

import itertools
import os
import random

import pytest

from raylog.actors.transport import arena as ar

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd is Linux's")

SIZE = 1 << 20


def test_blocks_are_disjoint_and_freed_ranges_merge() -> None:
    arena = ar.Arena(SIZE)
    rng = random.Random(7)
    live: list[ar.Block] = []
    for _ in range(2_000):
        if live and (rng.random() < 0.5 or len(live) > 40):
            live.pop(rng.randrange(len(live))).release()
        else:
            block = arena.allocate(rng.randrange(1, 64 << 10))
            if block is not None:
                live.append(block)
        spans = sorted((b.offset, b.offset + b.size) for b in live)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
        assert all(start >= ar.HEADER_BYTES and end <= SIZE for start, end in spans)
        assert all(b.offset % ar.ALIGN == 0 for b in live)
        assert arena.free_bytes + arena.allocated_bytes == SIZE - ar.HEADER_BYTES
    for block in live:
        block.release()
    # Everything merged back into one range: the largest possible block fits again.
    assert arena.allocated_bytes == 0
    whole = arena.allocate(SIZE - ar.HEADER_BYTES)
    assert whole is not None and whole.offset == ar.HEADER_BYTES
    refusals = arena.refusals
    assert arena.allocate(1) is None and arena.refusals == refusals + 1


def test_a_block_is_reused_only_after_its_last_holder_releases_it() -> None:
    arena = ar.Arena(ar.HEADER_BYTES + 4096)
    block = arena.allocate(4096)
    assert block is not None and len(block.view) == 4096
    block.acquire()  # a call handed it on
    block.release()  # the request was answered: the call still holds it
    assert arena.allocate(64) is None
    block.release()  # the call's reply came
    again = arena.allocate(4096)
    assert again is not None and again.offset == block.offset
    with pytest.raises(RuntimeError):
        block.release()  # freed already: a bug, never a silent double free


def test_a_lost_block_is_never_reused_and_a_worn_arena_is_replaced() -> None:
    pool = ar.ArenaPool(ar.HEADER_BYTES + 8 * 4096)
    first = pool.current
    assert first is not None
    blocks = [pool.allocate(4096) for _ in range(8)]
    assert all(b is not None for b in blocks)
    for block in blocks[:4]:
        assert block is not None
        block.acquire()  # handed to a replica
        block.release()  # answered
        block.lose()  # the link broke before the reply: the replica may still read it
    for block in blocks[4:]:
        assert block is not None
        block.release()
    assert first.lost_bytes == 4 * 4096 and first.worn_out
    assert first.free_bytes == 4 * 4096  # only the released half came back
    fresh = pool.allocate(4096)
    assert fresh is not None and fresh.arena is not first and pool.current is fresh.arena
    # A lost block has left the live set; its memory is never handed out again.
    assert pool.locate(blocks[0].view[10:20]) is None
    assert pool.stats() == {
        "bytes": ar.HEADER_BYTES + 8 * 4096,
        "allocated_bytes": 4096,
        "lost_bytes": 4 * 4096,
        "allocations": 9,
        "refusals": 0,
        "retired": 1,
    }
    fresh.release()


def test_views_are_found_in_their_block_only() -> None:
    arena = ar.Arena(SIZE)
    a = arena.allocate(1000)
    b = arena.allocate(5000)
    assert a is not None and b is not None
    inner = b.view[100:4000]
    assert arena.locate(inner) == (b, b.offset + 100)
    assert arena.locate(a.view[:1]) == (a, a.offset)
    assert arena.locate(memoryview(bytearray(100))) is None  # private memory
    assert arena.locate(memoryview(b"read-only")) is None
    assert arena.locate(b.view[0:0]) is None
    a.release()
    assert arena.locate(arena.view[a.offset : a.offset + 10]) is None  # freed


def test_a_replica_maps_what_the_gateway_wrote_and_refuses_anything_else() -> None:
    arena = ar.Arena(SIZE)
    block = arena.allocate(300)
    assert block is not None
    payload = os.urandom(300)
    block.view[:] = payload
    views = ar.ArenaViews(max_arenas=1)
    seen = views.view(arena.ref, block.offset, 300)
    assert seen.readonly and bytes(seen) == payload
    block.view[:3] = b"new"  # shared, not copied: the replica sees the gateway's writes
    assert bytes(views.view(arena.ref, block.offset, 3)) == b"new"
    pid, fd, nonce = arena.ref
    with pytest.raises(ar.ArenaError, match="nonce"):
        views.view((pid, fd, "00" * ar.NONCE_BYTES), block.offset, 1)
    for offset, length in ((0, 10), (SIZE - 10, 11), (block.offset, 0), (-1, 5)):
        with pytest.raises(ar.ArenaError, match="outside"):
            views.view(arena.ref, offset, length)
    with pytest.raises(ar.ArenaError, match="cannot open"):
        views.view((pid, 1 << 20, nonce), block.offset, 1)  # no such fd
    # A second arena evicts the first from a one-entry cache; a view of it stays valid.
    other = ar.Arena(SIZE)
    views.open(other.ref)
    assert bytes(seen[3:]) == payload[3:]
    assert bytes(views.view(arena.ref, block.offset, 3)) == b"new"  # opened again


def test_the_hand_off_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ar.ARENA_ENV, "0")
    assert not ar.enabled()
    monkeypatch.setenv(ar.ARENA_ENV, "1")
    assert ar.enabled()
    monkeypatch.setenv(ar.ARENA_MIB_ENV, "2")
    pool = ar.ArenaPool()
    assert pool.current is not None and pool.current.size == 2 << 20


def test_a_dead_gateways_arena_is_dropped_when_another_is_opened() -> None:
    """A gateway process that died leaves its memfd pinned by the replicas that map it: the
    next arena a replica opens (a restarted gateway's) drops the mappings of dead processes;
    views taken before stay readable until released."""
    read_end, write_end = os.pipe()
    go_read, go_write = os.pipe()
    child = os.fork()
    if child == 0:  # the "gateway": an arena, its ref to the parent, then exit when told
        try:
            os.close(read_end)
            gateway_arena = ar.Arena(SIZE)
            block = gateway_arena.allocate(5)
            assert block is not None
            block.view[:] = b"hello"
            pid, fd, nonce = gateway_arena.ref
            os.write(write_end, f"{pid} {fd} {nonce} {block.offset}".encode())
            os.read(go_read, 1)
        finally:
            os._exit(0)
    os.close(write_end)
    fields = os.read(read_end, 200).decode().split()
    dead_ref: ar.ArenaRef = (int(fields[0]), int(fields[1]), fields[2])
    offset = int(fields[3])
    views = ar.ArenaViews()
    seen = views.view(dead_ref, offset, 5)
    assert bytes(seen) == b"hello"
    assert views.drop_dead() == 0  # alive: kept
    os.write(go_write, b"x")
    os.waitpid(child, 0)
    fresh = ar.Arena(SIZE)
    views.open(fresh.ref)
    assert views.mapped() == [fresh.ref]  # the dead gateway's mapping is gone
    assert bytes(seen) == b"hello"  # a view taken before is still readable
    for fd in (read_end, go_read, go_write):
        os.close(fd)
