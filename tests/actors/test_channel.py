"""The replication channel (actors/channel.py): frames, authentication and links on real TCP.

Proves: every replication message survives a frame round trip, also fed one byte at a time;
garbage, unknown kinds and oversized lengths are refused with FrameError; a link delivers
messages in order to the server of the replica it asked for; a peer with the wrong secret or
asking for another replica's name is closed before any message gets in; a link whose server went
away reconnects to the new address after its backoff.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from raylog.actors import channel as ch
from raylog.actors.messages import (
    BatchMeta,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    RecordBatch,
    ReplicateAck,
    ReplicateRequest,
)

HOST = "127.0.0.1"
DEADLINE_S = 10.0

_BATCH = RecordBatch(BatchMeta(5, 7, 3, 1, 3, 120, 2), b"\x00" * 120)
MESSAGES: list[Any] = [
    FetchRequest(2, 9, 4, 100, 3, 1 << 20, 500),
    FetchResponse(1, 9, 4, 0, 90, 0, 120, EpochEndOffset(3, 80), (_BATCH, _BATCH)),
    ReplicateRequest(1, 4, 90, 3, (_BATCH,)),
    ReplicateAck(2, 4, 108, 0, True),
]


def test_frames_round_trip_whole_and_byte_by_byte() -> None:
    data = b"".join(ch.encode_frame(m) for m in MESSAGES)
    assert ch.FrameReader().feed(data) == MESSAGES
    reader = ch.FrameReader()
    got: list[Any] = []
    for i in range(len(data)):
        got += reader.feed(data[i : i + 1])
    assert got == MESSAGES


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (struct.pack(">IB", 0, 0), "frame length 0"),
        (struct.pack(">IB", ch.FRAME_BYTES_MAX + 1, 0), "outside"),
        (struct.pack(">IB", 3, 200) + b"ab", "unknown message kind 200"),
        (struct.pack(">IB", 3, 0) + b"\xff\xff", "bad FetchRequest body"),
    ],
)
def test_garbage_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(ch.FrameError, match=reason):
        ch.FrameReader().feed(data)


async def _until(probe: Callable[[], bool]) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while not probe():
            await asyncio.sleep(0.01)


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_link_delivers_in_order_to_the_replica_it_asked_for() -> None:
    async def test() -> None:
        got: list[Any] = []
        server = ch.ChannelServer("replica:t:0:2", b"secret", got.append)
        address = await server.start(HOST)

        async def resolve() -> tuple[str, int]:
            return address

        link = ch.PeerLink("replica:t:0:2", b"secret")
        assert not link.send(MESSAGES[0])  # not connected yet: the caller falls back
        link.ensure_connecting(resolve)
        await _until(lambda: link.connected)
        sent = MESSAGES * 50
        for m in sent:
            assert link.send(m)
        await _until(lambda: len(got) == len(sent))
        assert got == sent
        link.close()
        server.close()

    _run(test)


@pytest.mark.parametrize(("secret", "name"), [(b"wrong", "replica:t:0:2"), (b"s", "replica:t:0:3")])
def test_handshake_refuses_wrong_secret_or_name(secret: bytes, name: str) -> None:
    async def test() -> None:
        got: list[Any] = []
        server = ch.ChannelServer("replica:t:0:2", b"s", got.append)
        address = await server.start(HOST)

        async def resolve() -> tuple[str, int]:
            return address

        link = ch.PeerLink(name, secret)
        link.ensure_connecting(resolve)
        await _until(lambda: server.rejected == 1)
        # The client may have believed itself connected for an instant; nothing got through.
        link.send(MESSAGES[3])
        await _until(lambda: not link.connected)
        assert got == []
        link.close()
        server.close()

    _run(test)


def test_link_reconnects_to_a_restarted_peer() -> None:
    async def test() -> None:
        got: list[Any] = []
        first = ch.ChannelServer("replica:t:0:2", b"s", got.append)
        addresses = [await first.start(HOST)]

        async def resolve() -> tuple[str, int]:
            return addresses[-1]

        link = ch.PeerLink("replica:t:0:2", b"s")
        link.ensure_connecting(resolve)
        await _until(lambda: link.connected)
        first.close()
        await _until(lambda: not link.connected)

        second = ch.ChannelServer("replica:t:0:2", b"s", got.append)
        addresses.append(await second.start(HOST))

        def reconnect() -> bool:
            link.ensure_connecting(resolve)  # a no-op while backing off, as _send calls it
            return link.connected

        await _until(reconnect)
        assert link.send(MESSAGES[1])
        await _until(lambda: got == [MESSAGES[1]])
        link.close()
        second.close()

    _run(test)


def test_calls_answer_in_any_order_and_fail_cleanly() -> None:
    async def test() -> None:
        release = asyncio.Event()

        async def call(method: str, raw_args: bytes) -> Any:
            args = msgspec.msgpack.decode(raw_args, type=tuple[int, bytes])
            if method == "slow":
                await release.wait()
            if method == "boom":
                raise ValueError("no such offset")
            return [method, args[0] * 2, args[1]]

        server = ch.ChannelServer("replica:t:0:1", b"s", lambda m: None, call)
        address = await server.start(HOST)

        async def resolve() -> tuple[str, int]:
            return address

        link = ch.CallLink("replica:t:0:1", b"s")
        assert link.call("fast", (1, b"x")) is None  # not connected: the caller uses Ray
        link.ensure_connecting(resolve)
        await _until(lambda: link.connected)

        slow = link.call("slow", (5, b"s"))
        fast = link.call("fast", (7, b"f"))
        assert slow is not None and fast is not None
        assert msgspec.msgpack.decode(await fast) == ["fast", 14, b"f"]  # not held by "slow"
        release.set()
        assert msgspec.msgpack.decode(await slow) == ["slow", 10, b"s"]

        boom = link.call("boom", (0, b""))
        assert boom is not None
        with pytest.raises(ch.CallFailed, match="ValueError: no such offset") as failed:
            await boom
        assert not failed.value.lost

        release.clear()
        pending = link.call("slow", (1, b""))
        assert pending is not None
        server.close()
        with pytest.raises(ch.CallFailed) as lost:
            await asyncio.wait_for(pending, DEADLINE_S)
        assert lost.value.lost
        link.close()

    _run(test)
