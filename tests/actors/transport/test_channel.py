"""The replication channel (actors/transport/channel.py and its parts): frames, authentication
and links on real sockets.

Proves: every replication message survives a frame round trip, also fed one byte at a time;
garbage, unknown kinds and oversized lengths are refused with FrameError; a link delivers
messages in order to the server of the replica it asked for; a peer with the wrong secret or
asking for another replica's name is closed before any message gets in; a link whose server went
away reconnects to the new address after its backoff; a peer that stops inside a frame is cut
off after ``frame_stall_s``, one idling between frames is not. The link tests run over both
transports: a same-host link goes over the server's Unix socket, and over TCP when that is
turned off or the socket is another machine's; a process of another user is refused on the
Unix socket, as server and as client.
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from raylog.actors.replication.messages import (
    BatchMeta,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    RecordBatch,
    ReplicateAck,
    ReplicateRequest,
)
from raylog.actors.transport import auth
from raylog.actors.transport import channel as ch
from raylog.actors.transport import frames as fr

HOST = "127.0.0.1"
DEADLINE_S = 10.0

_BATCH = RecordBatch(BatchMeta(5, 7, 3, 1, 3, 120, 2), b"\x00" * 120)
MESSAGES: list[Any] = [
    FetchRequest(2, 9, 4, 100, 3, 1 << 20, 500),
    FetchResponse(1, 9, 4, 0, 90, 0, 120, EpochEndOffset(3, 80), (_BATCH, _BATCH)),
    ReplicateRequest(1, 4, 90, 3, (_BATCH,)),
    ReplicateAck(2, 4, 108, 0, True),
]


def _read_all(data: bytes, *, step: int = 0, scratch_bytes: int = fr.SCRATCH_BYTES) -> list[Any]:
    """Every message a parser decodes from ``data`` arriving ``step`` bytes at a time (all at
    once for 0); raises FrameError if the data ends inside a frame, as a connection does."""
    parser = ch.FrameParser(scratch_bytes=scratch_bytes)
    got: list[Any] = []
    for i in range(0, len(data), step or max(1, len(data))):
        parser.feed(data[i : i + (step or len(data))])
        while parser.messages:
            got.append(parser.take())
    if parser.inside_frame:
        raise ch.FrameError("the stream ended inside a frame")
    assert parser.queued_bytes == 0
    return got


def test_frames_round_trip_whole_and_byte_by_byte() -> None:
    data = b"".join(ch.encode_frame(m) for m in MESSAGES)
    assert _read_all(data) == MESSAGES
    assert _read_all(data, step=1) == MESSAGES


@pytest.mark.parametrize("step", [0, 1, 7, 1000, 4096])
def test_large_frames_are_received_into_their_own_buffer_between_small_ones(step: int) -> None:
    # With a 256-byte scratch, the 120-byte batches are small frames and the 10 kB ones large:
    # each arrangement of the two, cut at every step, decodes to the same messages.
    big = RecordBatch(BatchMeta(5, 7, 10_000, 1), bytes(range(256)) * 40)
    messages = [
        ReplicateRequest(1, 4, 90, 3, (big,)),
        *MESSAGES,
        ReplicateRequest(1, 4, 91, 3, (big, big)),
        ReplicateRequest(1, 4, 92, 3, (big,)),
        *MESSAGES,
    ]
    data = b"".join(ch.encode_frame(m) for m in messages)
    got = _read_all(data, step=step, scratch_bytes=256)
    assert got == messages
    # Batches decode as views into their frames (no copy), which stay intact after the
    # parser has reused its scratch for every later frame.
    batches = [b for m in got if isinstance(m, ReplicateRequest | FetchResponse) for b in m.batches]
    assert len(batches) == 10 and all(isinstance(b.data, memoryview) for b in batches)


def test_a_call_request_is_encoded_as_the_server_decodes_it() -> None:
    # Two in one read: the first's Raw arguments must not point into the parser's scratch,
    # which the second overwrites once taken.
    frames = [ch.encode_frame(fr.CallRequestOut(i, "produce", (b"b%d" % i, -1))) for i in (7, 8)]
    requests = []
    parser = ch.FrameParser(scratch_bytes=64)
    for frame in frames:
        parser.feed(frame)
        requests.append(parser.take())
    assert all(isinstance(r, ch.CallRequest) for r in requests)
    assert [(r.call_id, r.method) for r in requests] == [(7, "produce"), (8, "produce")]
    assert [msgspec.msgpack.decode(r.args) for r in requests] == [[b"b7", -1], [b"b8", -1]]
    assert not ch.is_channel_message(fr.CallRequestOut(7, "produce", ()))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (struct.pack(">IB", 0, 0), "frame length 0"),
        (struct.pack(">IB", ch.FRAME_BYTES_MAX + 1, 0), "outside"),
        (struct.pack(">IB", 3, 200) + b"ab", "unknown message kind 200"),
        (struct.pack(">IB", 3, 0) + b"\xff\xff", "bad FetchRequest body"),
        (struct.pack(">IB", 30, 0) + b"\x00" * 10, "ended inside a frame"),
        (b"\x00\x00", "ended inside a frame"),
    ],
)
def test_garbage_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(ch.FrameError, match=reason):
        _read_all(data)


async def _until(probe: Callable[[], bool]) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while not probe():
            await asyncio.sleep(0.01)


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


@pytest.fixture(params=["unix", "tcp"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The link tests run over both transports: a same-host Unix socket (where the platform
    has them) and TCP (``RAYLOG_CHANNEL_LOCAL_SOCKETS=0``, as between machines)."""
    if request.param == "unix" and not ch.local_sockets_enabled():
        pytest.skip("same-host sockets need Linux (a kernel boot id)")
    if request.param == "tcp":
        monkeypatch.setenv(ch.LOCAL_SOCKETS_ENV, "0")
    return str(request.param)


def _links(server: ch.ChannelServer, transport: str) -> int:
    """How many connections ``server`` accepted over ``transport``."""
    return server.local_links if transport == "unix" else server.tcp_links


def test_link_delivers_in_order_to_the_replica_it_asked_for(transport: str) -> None:
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
        assert _links(server, transport) == 1 and server.local_links + server.tcp_links == 1
        link.close()
        server.close()

    _run(test)


@pytest.mark.parametrize(("secret", "name"), [(b"wrong", "replica:t:0:2"), (b"s", "replica:t:0:3")])
def test_handshake_refuses_wrong_secret_or_name(secret: bytes, name: str, transport: str) -> None:
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


def test_link_reconnects_to_a_restarted_peer(transport: str) -> None:
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


def test_a_frame_the_peer_stops_sending_closes_its_connection_and_idling_does_not() -> None:
    """A peer that announces a frame and stops sending it is cut off after ``frame_stall_s``
    without a byte; one that idles between frames as long keeps its connection."""

    async def test() -> None:
        got: list[Any] = []
        server = ch.ChannelServer("replica:t:0:2", b"s", got.append, frame_stall_s=0.3)
        host, port, _ = await server.start(HOST)

        async def linked() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            reader, writer = await asyncio.open_connection(host, port)
            nonce = await reader.readexactly(auth.NONCE_BYTES)
            name = b"replica:t:0:2"
            writer.write(struct.pack(">H", len(name)) + name + auth._mac(b"s", nonce, name))
            return reader, writer

        idle_reader, idle = await linked()
        idle.write(fr.encode_frame(MESSAGES[0]))
        stalled_reader, stalled = await linked()
        stalled.write(struct.pack(">IB", 1000, 0) + b"\x00" * 10)  # 11 of 1,001 bytes
        async with asyncio.timeout(DEADLINE_S):
            assert await stalled_reader.read() == b""  # closed by the server
        await _until(lambda: got == [MESSAGES[0]])
        idle.write(fr.encode_frame(MESSAGES[1]))  # idled as long: still served
        await _until(lambda: got == [MESSAGES[0], MESSAGES[1]])
        for writer in (idle, stalled):
            writer.close()
        assert not idle_reader.at_eof()
        server.close()

    _run(test)


class _Hold:
    """Counts what a CallLink does with a call's ``hold``."""

    def __init__(self) -> None:
        self.holders = 0
        self.lost = False

    def acquire(self) -> None:
        self.holders += 1

    def release(self) -> None:
        assert self.holders > 0
        self.holders -= 1

    def lose(self) -> None:
        self.lost = True
        self.release()


def test_calls_answer_in_any_order_and_fail_cleanly(transport: str) -> None:
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
        assert link.local == (transport == "unix")

        # What a call hands over by reference is held until its reply arrives, whatever the
        # reply, and whether or not anyone still waits for it.
        held = [_Hold() for _ in range(5)]
        slow = link.call("slow", (5, b"s"), held[0])
        fast = link.call("fast", (7, b"f"), held[1])
        assert slow is not None and fast is not None
        assert [h.holders for h in held[:2]] == [1, 1]
        assert msgspec.msgpack.decode(await fast) == ["fast", 14, b"f"]  # not held by "slow"
        assert (held[0].holders, held[1].holders) == (1, 0)
        release.set()
        assert msgspec.msgpack.decode(await slow) == ["slow", 10, b"s"]
        assert held[0].holders == 0

        boom = link.call("boom", (0, b""), held[2])
        assert boom is not None
        with pytest.raises(ch.CallFailed, match="ValueError: no such offset") as failed:
            await boom
        assert not failed.value.lost
        assert held[2].holders == 0 and not held[2].lost

        release.clear()
        forgotten = link.call("slow", (2, b""), held[3])
        assert forgotten is not None
        link.forget(forgotten)  # its caller gave up: the peer may still be reading
        assert held[3].holders == 1
        release.set()
        await _until(lambda: held[3].holders == 0)

        release.clear()
        pending = link.call("slow", (1, b""), held[4])
        assert pending is not None
        server.close()
        with pytest.raises(ch.CallFailed) as lost:
            await asyncio.wait_for(pending, DEADLINE_S)
        assert lost.value.lost
        assert held[4].lost and held[4].holders == 0  # never released: lost with the link
        assert not any(h.lost for h in held[:4])
        link.close()

    _run(test)


def test_a_call_link_whose_peer_stops_reading_waits_and_loses_nothing() -> None:
    """Calls queue on the link up to its bound while the peer reads nothing; ``full`` then
    tells the caller to ``wait_room``, and once the peer reads again every call arrives whole
    and in the order it was made."""

    async def test() -> None:
        reading = asyncio.Event()
        received: list[Any] = []

        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"n" * auth.NONCE_BYTES)  # a handshake that never checks the answer
            await reading.wait()
            (name_bytes,) = struct.unpack(">H", await reader.readexactly(2))
            await reader.readexactly(name_bytes + 32)  # the link's name and MAC
            parser = ch.FrameParser()
            while data := await reader.read(1 << 16):
                parser.feed(data)
                while parser.messages:
                    frame = parser.take()
                    if isinstance(frame, ch.CallRequest):
                        received.append(frame)
            writer.close()

        server = await asyncio.start_server(peer, HOST, 0)
        address = server.sockets[0].getsockname()[:2]

        async def resolve() -> tuple[str, int]:
            return address

        calls, payload_bytes = 120, 256 << 10
        link = ch.CallLink("replica:t:0:1", b"s", queue_bytes_max=1 << 20)
        link.ensure_connecting(resolve)
        await _until(lambda: link.connected)
        made = 0
        while made < calls and not link.full:
            assert link.call("produce", (made, bytes([made]) * payload_bytes)) is not None
            made += 1
            await asyncio.sleep(0)  # let the link write what the socket takes
        assert link.full, "30 MiB went into a socket nobody reads"
        waiting = asyncio.ensure_future(link.wait_room())
        for _ in range(20):  # the link gets every chance to write; the peer still reads nothing
            await asyncio.sleep(0)
        assert not waiting.done()
        reading.set()
        await asyncio.wait_for(waiting, DEADLINE_S)
        while made < calls:
            if link.full:
                await asyncio.wait_for(link.wait_room(), DEADLINE_S)
            assert link.call("produce", (made, bytes([made]) * payload_bytes)) is not None
            made += 1
        await _until(lambda: len(received) == calls)
        for i, request in enumerate(received):
            assert request.call_id == i + 1
            number, payload = msgspec.msgpack.decode(request.args)
            assert number == i and payload == bytes([i]) * payload_bytes
        link.close()
        server.close()

    _run(test)


# --- same-host links over Unix sockets -----------------------------------------------------------

NOBODY = 65534
needs_root = pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0,
    reason="needs root, to run a peer process as another user",
)
needs_local = pytest.mark.skipif(
    not ch.local_sockets_enabled(), reason="same-host sockets need Linux (a kernel boot id)"
)


@needs_local
@pytest.mark.parametrize("how", ["turned off", "another machine"])
def test_links_use_tcp_when_the_socket_is_off_or_on_another_machine(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def test() -> None:
        got: list[Any] = []
        server = ch.ChannelServer("replica:t:0:2", b"s", got.append)
        if how == "turned off":
            monkeypatch.setenv(ch.LOCAL_SOCKETS_ENV, "0")
            address = await server.start(HOST)
            assert address[2] == ""
        else:
            host, port, local = await server.start(HOST)
            _, _, name = local.partition("/")
            address = (host, port, f"{'0' * 36}/{name}")  # another kernel's boot id

        async def resolve() -> tuple[str, int, str]:
            return address

        link = ch.PeerLink("replica:t:0:2", b"s")
        link.ensure_connecting(resolve)
        await _until(lambda: link.connected)
        assert link.send(MESSAGES[0])
        await _until(lambda: got == [MESSAGES[0]])
        assert (server.local_links, server.tcp_links) == (0, 1)
        link.close()
        server.close()

    _run(test)


@needs_local
def test_the_handshake_also_guards_the_unix_socket() -> None:
    async def test() -> None:
        got: list[Any] = []
        server = ch.ChannelServer("replica:t:0:2", b"s", got.append)
        address = await server.start(HOST)

        async def resolve() -> tuple[str, int, str]:
            return address

        link = ch.PeerLink("replica:t:0:2", b"wrong secret")
        link.ensure_connecting(resolve)
        await _until(lambda: server.rejected == 1)
        link.send(MESSAGES[3])
        await _until(lambda: not link.connected)
        assert got == [] and server.local_links == 1
        link.close()
        server.close()

    _run(test)


_AS_NOBODY_CONNECT = """
import os, socket, sys
os.setgid({uid}); os.setuid({uid})
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\\0" + sys.argv[1])
s.settimeout(5)
print("closed" if s.recv(64) == b"" else "served", flush=True)
"""

_AS_NOBODY_SERVE = """
import os, socket, sys
os.setgid({uid}); os.setuid({uid})
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\\0" + sys.argv[1]); s.listen(1)
print("listening", flush=True)
s.settimeout(10)
try:
    c, _ = s.accept(); c.recv(64)
except OSError:
    pass
"""


@needs_local
@needs_root
def test_a_local_peer_of_another_user_is_refused_both_ways() -> None:
    """The server closes a same-host connection from another user's process before the
    handshake (no nonce is sent); a client finding another user's process on a channel's
    socket name does not use it (it goes by TCP)."""

    async def test() -> None:
        got: list[Any] = []
        server = ch.ChannelServer("replica:t:0:2", b"s", got.append)
        _, _, local = await server.start(HOST)
        name = local.partition("/")[2]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _AS_NOBODY_CONNECT.format(uid=NOBODY), name,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), DEADLINE_S)
        assert out.decode().strip() == "closed"
        assert server.rejected == 1 and server.local_links == 0
        server.close()

        squatter_name = f"raylog-channel-test-{os.getpid()}"
        squatter = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _AS_NOBODY_SERVE.format(uid=NOBODY), squatter_name,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert squatter.stdout is not None
            line = await asyncio.wait_for(squatter.stdout.readline(), DEADLINE_S)
            assert line.decode().strip() == "listening"
            boot_id = local.partition("/")[0]
            assert await auth.connect_local(f"{boot_id}/{squatter_name}") is None
        finally:
            squatter.kill()
            await squatter.wait()

    _run(test)
