"""Fuzz a live ReplicaActor's replication channel: what reaches it before, during and after the
handshake never takes it down or changes its log.

One leader replica on real Ray holds a few records; the test connects to its channel over TCP
as a peer would. Proves:

- bytes that are no handshake (random, cut short, a name too long, the wrong replica's name,
  a wrong MAC) get the connection closed, and the channel counts it rejected;
- after a valid handshake, random frames (unknown kinds, lengths that lie or exceed the frame
  limit, random bodies), encodings of replication messages with bytes flipped, messages of
  every kind with random field values, and calls of random methods with random arguments are
  each answered, refused or end the connection (or, where they announce a frame they do not
  finish, the replica waits for its rest, up to the channel's ``FRAME_STALL_S``); never more
  than that: afterwards the replica still
  serves, its log (start, end, high watermark) and records are as they were, and a new link
  gets its calls answered.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import (
    BatchMeta,
    BecomeLeader,
    FetchRequest,
    FetchResponse,
    RecordBatch,
    ReplicateAck,
    ReplicateRequest,
)
from raylog.actors.replication.ready import ReplicaConfig
from raylog.actors.transport import auth
from raylog.actors.transport import frames as fr
from raylog.storage import batch as rb

pytestmark = pytest.mark.slow

TOPIC = "channel-fuzz"
CALL_TIMEOUT_S = 30.0
IO_TIMEOUT_S = 10.0
EXAMPLES = 150
PROBE_CALL_ID = 2**31 - 1  # the call that shows a connection is still served
# Calls a peer may make, with random arguments. A transaction marker would change the log
# legitimately (a coordinator's), so it is left out.
METHODS = ("produce", "produce_shared", "open_arena", "fetch", "fetch_extents", "list_offsets")
METHODS_ALL = (*METHODS, "mirror_append", "no_such_method", "")

_int64 = st.one_of(
    st.sampled_from([-(2**63), -1, 0, 1, 2, 3, 2**31 - 1, 2**63 - 1]),
    st.integers(-(2**63), 2**63 - 1),
)


@pytest.fixture(scope="module")
def leader(ray_local: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    replica = ReplicaActor.options(  # type: ignore[attr-defined]
        name=replica_actor_name(TOPIC, 0, 0), namespace=NAMESPACE
    ).remote(TOPIC, 0, 0, str(tmp_path_factory.mktemp(TOPIC)), {}, ReplicaConfig())
    ray.get(replica.become_leader.remote(BecomeLeader(1, 1, 1, (0,), (0,))), timeout=30)
    for i in range(3):
        batch = rb.build_batch([rb.Record(b"k", f"v{i}".encode(), 1_700_000_000_000 + i)])
        outcome = ray.get(replica.produce.remote(batch, -1, 10_000), timeout=CALL_TIMEOUT_S)
        assert outcome.error_code == 0, outcome
    try:
        yield replica
    finally:
        ray.kill(replica)


def _log_of(replica: Any) -> tuple[Any, ...]:
    state = ray.get(replica.state.remote(), timeout=CALL_TIMEOUT_S)
    fetched = ray.get(replica.fetch.remote(0, 1 << 20), timeout=CALL_TIMEOUT_S)
    return (
        state.log_start_offset,
        state.log_end_offset,
        state.high_watermark,
        bytes(fetched.records or b""),
    )


@contextlib.contextmanager
def _connected(replica: Any) -> Iterator[socket.socket]:
    host, port, _ = ray.get(replica.channel_address.remote(), timeout=CALL_TIMEOUT_S)
    with socket.create_connection((host, port), timeout=IO_TIMEOUT_S) as sock:
        yield sock


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None  # closed
        data += chunk
    return bytes(data)


def _answer(nonce: bytes, name: str, secret: bytes) -> bytes:
    """The client's half of the handshake (auth.client_handshake's bytes)."""
    raw = name.encode()
    return struct.pack(">H", len(raw)) + raw + auth._mac(secret, nonce, raw)


def _handshake(sock: socket.socket, name: str, secret: bytes) -> None:
    nonce = _read_exactly(sock, auth.NONCE_BYTES)
    assert nonce is not None, "the channel closed before its nonce"
    sock.sendall(_answer(nonce, name, secret))


def _probe(sock: socket.socket) -> bool:
    """Send a call the replica answers at once; whether its reply came (False: the connection
    was closed). Frames before the reply (answers to fuzzed calls) are read past."""
    probe = fr.CallRequestOut(PROBE_CALL_ID, "list_offsets", (-1,))
    with contextlib.suppress(OSError):
        sock.sendall(fr.encode_frame(probe))
    parser = fr.FrameParser()
    while True:  # bounded by the socket timeout: a reply or the end of the connection
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return False
        if not chunk:
            return False
        try:
            parser.feed(chunk)
        except fr.FrameError as exc:
            raise AssertionError(f"the replica sent something that is no frame: {exc}") from exc
        while parser.messages:
            message = parser.take()
            if isinstance(message, fr.CallReply) and message.call_id == PROBE_CALL_ID:
                return True


def _ends_inside_a_frame(data: bytes) -> bool:
    """Whether ``data``, as a stream of frames, ends inside one whose length it announced."""
    parser = fr.FrameParser()
    try:
        parser.feed(data)
    except fr.FrameError:
        return False  # the replica closes the connection there
    return parser.inside_frame


# --- what a peer sends ---------------------------------------------------------------------------


def _batch() -> RecordBatch:
    data = rb.build_batch([rb.Record(b"k", b"v", 0)])
    return RecordBatch(BatchMeta(0, 1, len(data), 1), data)


MESSAGES = [
    FetchRequest(1, 1, 1, 0, 1, 1 << 20),
    FetchResponse(1, 1, 1, 0, 3, 0, 3, 3, batches=(_batch(),)),
    ReplicateRequest(1, 1, 3, 1, (_batch(),)),
    ReplicateAck(1, 1, 3),
]

random_messages = st.one_of(
    st.builds(FetchRequest, *[_int64] * 6, _int64, _int64, st.integers(-1, 2)),
    st.builds(ReplicateAck, *[_int64] * 4, st.booleans(), _int64, _int64),
)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """One frame, or bytes that pretend to be one."""
    kind = draw(st.integers(0, 5))
    if kind == 0:  # a replication message with random fields
        return bytes(fr.encode_frame(draw(random_messages)))
    if kind == 1:  # a replication message's encoding with bytes flipped
        frame = bytearray(fr.encode_frame(draw(st.sampled_from(MESSAGES))))
        for _ in range(draw(st.integers(1, 4))):
            frame[draw(st.integers(5, len(frame) - 1))] = draw(st.integers(0, 255))
        return bytes(frame)
    if kind == 2:  # a call of some method with random arguments
        method = draw(st.sampled_from(METHODS_ALL))
        args = draw(st.lists(st.one_of(_int64, st.binary(max_size=80), st.text(max_size=8))))
        raw = msgspec.msgpack.encode(fr.CallRequest(draw(_int64), method, msgspec.Raw(b"\x90")))
        body = raw[:-1] + msgspec.msgpack.encode(args)  # the args in place of an empty array
        return struct.pack(">IB", len(body) + 1, fr.CHANNEL_KINDS.index(fr.CallRequest)) + body
    if kind == 3:  # a length that lies, past the limit or short
        length = draw(st.sampled_from([0, 1, fr.FRAME_BYTES_MAX + 1, 2**32 - 1]))
        return struct.pack(">IB", length, draw(st.integers(0, 255)))
    if kind == 4:  # a kind no one knows
        body = draw(st.binary(max_size=40))
        return struct.pack(">IB", len(body) + 1, draw(st.integers(len(fr.CHANNEL_KINDS), 255)))
    return draw(st.binary(min_size=1, max_size=200))


# --- the tests -----------------------------------------------------------------------------------


def test_a_peer_that_fails_the_handshake_is_shut_out(leader: Any) -> None:
    before = _log_of(leader)
    rejected = ray.get(leader.channel_stats.remote(), timeout=CALL_TIMEOUT_S)["rejected"]
    name = replica_actor_name(TOPIC, 0, 0)
    secret = auth.channel_secret()
    other = replica_actor_name(TOPIC, 0, 7)
    attempts = {  # what the peer answers the nonce with
        "random bytes": lambda nonce: bytes(range(256)) * 2,
        "a name too long": lambda nonce: struct.pack(">H", 60_000) + b"x" * 600,
        "another replica's name": lambda nonce: _answer(nonce, other, secret),
        "a wrong secret": lambda nonce: _answer(nonce, name, secret + b"x"),
        "a MAC cut short": lambda nonce: _answer(nonce, name, secret)[:-1],
    }
    for what, attempt in attempts.items():
        with _connected(leader) as sock:
            nonce = _read_exactly(sock, auth.NONCE_BYTES)
            assert nonce is not None, what
            sock.sendall(attempt(nonce))
            assert not _probe(sock), f"{what}: the channel served the peer"
    stats = ray.get(leader.channel_stats.remote(), timeout=CALL_TIMEOUT_S)
    assert stats["rejected"] >= rejected + len(attempts) - 1, stats
    assert _log_of(leader) == before


def test_garbage_after_the_handshake_leaves_the_replica_as_it_was(leader: Any) -> None:
    before = _log_of(leader)
    name = replica_actor_name(TOPIC, 0, 0)
    secret = auth.channel_secret()
    served = {"closed": 0, "served": 0, "waiting": 0}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(sent=st.lists(frames(), min_size=1, max_size=4))
    def send(sent: list[bytes]) -> None:
        with _connected(leader) as sock:
            _handshake(sock, name, secret)
            with contextlib.suppress(OSError):  # the replica may close it at any frame
                for frame in sent:
                    sock.sendall(frame)
            if _ends_inside_a_frame(b"".join(sent)):
                served["waiting"] += 1  # the replica waits for the rest: no probe gets through
                return
            served["served" if _probe(sock) else "closed"] += 1

    send()
    assert served["served"] and served["closed"], served  # the runs took both ways
    assert _log_of(leader) == before
    with _connected(leader) as sock:  # a new link is served
        _handshake(sock, name, secret)
        assert _probe(sock)
