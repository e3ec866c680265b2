"""The link client (actors/transport/kafka_client.py) against a live raylog gateway and against
misbehaving brokers, on loopback sockets.

The gateway is the real one (server, codec, handlers, SASL, TLS) over ``InMemoryLogBackend``.
Proves: Metadata (cluster id, controller, brokers, topics, partitions and their errors) from
the second bootstrap address when the first is down; ListOffsets earliest and latest; Fetch
returns the stored batches byte for byte (several codecs, headers), honours partition_max_bytes
(whole batches) and long-polls; concurrent fetches share one connection; SASL PLAIN and
SCRAM-SHA-256/512 over SASL_PLAINTEXT and over TLS with the hostname checked; a wrong password
fails with the broker's error code and without the password in the message; an untrusted
certificate is refused. Against raw sockets that misbehave: a size prefix over
``max_response_bytes`` and a correlation id never sent each fail the call and drop the
connection; a broker that never answers fails the call within ``request_timeout_ms``; the next
call opens a new connection; two requests in flight on one connection get their own answers
when the broker sends them in reverse order; a response frame cut short is an error, not a
short value.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse
from kafka.record import default_records as kdr
from support.gateway import HOST, InMemoryLogBackend, LiveGateway, sample_topics
from support.kafka_batches import kafka_batch
from support.waiting import wait_until_async

from raylog.actors.transport.kafka_client import KafkaClient, KafkaClientError, LinkSecurity
from raylog.actors.transport.kafka_connection import decode_response
from raylog.gateway import sasl
from raylog.gateway.authentication import Authenticator
from raylog.gateway.server import ListenerSocket
from raylog.storage import batch as rb
from raylog.storage.pki import CertificateAuthority, listener_context

PASSWORD = "link-Pa55-word"
CREDENTIALS = {
    ("linker", m): sasl.scram_credential(m, PASSWORD, os.urandom(16), 4096)
    for m in sasl.SCRAM_HASHES
}
CODECS = (
    kdr.DefaultRecordBatch.CODEC_NONE,
    kdr.DefaultRecordBatch.CODEC_GZIP,
    kdr.DefaultRecordBatch.CODEC_LZ4,
    kdr.DefaultRecordBatch.CODEC_ZSTD,
)
TIMEOUT_MS = 5_000


def run(test: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(test(), 60))


def records(n: int, tag: str) -> list[dict[str, Any]]:
    return [
        {
            "key": f"{tag}-k{i}".encode(),
            "value": f"{tag}-v{i}".encode() * 20,
            "timestamp": 1_700_000_000_000 + i,
            "headers": [("h", f"{i}".encode())],
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def gateway() -> Iterator[LiveGateway]:
    backend = InMemoryLogBackend(topic_states=sample_topics())
    for i, codec in enumerate(CODECS):
        backend.append("orders", 0, kafka_batch(records(5 + i, f"c{codec}"), codec))
    live = LiveGateway(backend)
    live.start()
    try:
        yield live
    finally:
        live.stop()


def stored(gateway: LiveGateway, topic: str, partition: int) -> list[bytes]:
    backend = gateway.backend
    assert isinstance(backend, InMemoryLogBackend)
    return [batch for _, batch in backend.logs[topic, partition]]


def test_metadata_offsets_and_raw_fetch(gateway: LiveGateway) -> None:
    async def test() -> None:
        with_free_port = f"{HOST}:{free_port()}"  # nothing listens: the next one answers
        client = KafkaClient([with_free_port, gateway.bootstrap], request_timeout_ms=TIMEOUT_MS)
        try:
            source = await client.metadata()
            assert source.cluster_id == "raylog-test-cluster" and source.controller_id == 1
            assert source.brokers == {b: (HOST, gateway.port) for b in (1, 2, 3)}
            assert set(source.topics) == {"orders", "events"}
            orders = source.topics["orders"]
            assert sorted(orders.partitions) == [0, 1, 2] and not orders.is_internal
            assert orders.partitions[1].leader == 2 and orders.error_code == 0
            assert source.topics["events"].partitions[1].error_code == 5  # LEADER_NOT_AVAILABLE
            only = await client.metadata(["events", "missing"])
            assert set(only.topics) == {"events", "missing"}
            assert only.topics["missing"].error_code == 3

            batches = stored(gateway, "orders", 0)
            end = sum(rb.parse_header(b, 0).records_count for b in batches)
            offsets = await client.list_offsets(1, [("orders", 0, -1), ("orders", 1, -2)])
            assert offsets[("orders", 0)][:2] == (0, end)
            assert offsets[("orders", 1)][:2] == (0, 0)

            fetched = await client.fetch(1, [("orders", 0, 0, -1, 1 << 20)])
            whole = fetched[("orders", 0)]
            assert whole.error_code == 0 and whole.high_watermark == end
            assert whole.records == b"".join(batches)  # byte for byte, every codec
            assert whole.diverging_epoch is None
            # From an offset inside the second batch, at most one batch's worth: that batch.
            inside = rb.parse_header(batches[1], 0).base_offset + 2
            part = await client.fetch(1, [("orders", 0, inside, -1, len(batches[1]))])
            assert part[("orders", 0)].records == batches[1]
        finally:
            await client.close()

    run(test)


def test_concurrent_fetches_share_one_connection_and_long_poll(gateway: LiveGateway) -> None:
    backend = gateway.backend
    assert isinstance(backend, InMemoryLogBackend)
    fresh = kafka_batch(records(3, "late"), kdr.DefaultRecordBatch.CODEC_NONE)

    async def test() -> None:
        client = KafkaClient([gateway.bootstrap], request_timeout_ms=TIMEOUT_MS)
        try:
            await client.metadata()
            answered = await asyncio.gather(
                *(client.fetch(1, [("orders", 0, 0, -1, 1 << 20)]) for _ in range(10))
            )
            expected = b"".join(stored(gateway, "orders", 0))
            assert all(a[("orders", 0)].records == expected for a in answered)
            # A long poll answers once data comes, before its max_wait_ms.
            end = backend.end("orders", 2)
            gateway.loop.call_soon_threadsafe(
                gateway.loop.call_later, 0.3, backend.append, "orders", 2, fresh
            )
            started = asyncio.get_running_loop().time()
            polled = await client.fetch(3, [("orders", 2, end, -1, 1 << 20)], max_wait_ms=10_000)
            assert asyncio.get_running_loop().time() - started < 5
            assert polled[("orders", 2)].records[8:] == fresh[8:]  # the base offset is stamped
            assert len(client._connections) == 1  # every broker id is the one listener
        finally:
            await client.close()
        with pytest.raises(KafkaClientError, match="closed"):
            await client.fetch(1, [("orders", 0, 0, -1, 1 << 20)])

    run(test)


def test_unknown_broker_id_and_bad_bootstrap() -> None:
    async def test() -> None:
        client = KafkaClient([f"{HOST}:1"])
        with pytest.raises(KafkaClientError, match="broker 7 is not in"):
            await client.fetch(7, [("t", 0, 0, -1, 100)])
        await client.close()

    run(test)
    for bad in ([], ["no-port"], ["host:0"], ["host:x"]):
        with pytest.raises(ValueError, match="bootstrap"):
            KafkaClient(bad)


def lookup(user: str, mechanism: str) -> sasl.ScramCredential | None:
    return CREDENTIALS.get((user, mechanism))


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    ca = CertificateAuthority.generate("link-test")
    root = tmp_path_factory.mktemp("tls")
    (root / "ca.pem").write_bytes(ca.cert_pem)
    other = CertificateAuthority.generate("someone-else")
    (root / "other.pem").write_bytes(other.cert_pem)
    return ca.issue("gateway", ips=(HOST,)), root / "ca.pem", root / "other.pem"


def secure_gateway(protocol: str, tls_leaf: Any = None) -> LiveGateway:
    context = listener_context(tls_leaf) if tls_leaf is not None else None
    live = LiveGateway(
        InMemoryLogBackend(topic_states=sample_topics()),
        ListenerSocket(protocol, sasl=True, ssl_context=context),
        authenticator=Authenticator(lookup, os.urandom(32), failure_delay_ms=0),
    )
    live.start()
    return live


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_mechanisms(protocol: str, tls_files: tuple[Any, Path, Path]) -> None:
    leaf, ca_file, _ = tls_files
    live = secure_gateway(protocol, leaf if protocol == "SASL_SSL" else None)

    async def test() -> None:
        for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            security = LinkSecurity.from_configs(
                {
                    "security.protocol": protocol,
                    "sasl.mechanism": mechanism,
                    "sasl.username": "linker",
                    "sasl.password": PASSWORD,
                    "ssl.ca.location": str(ca_file),
                }
            )
            client = KafkaClient([live.bootstrap], security=security, request_timeout_ms=TIMEOUT_MS)
            try:
                assert set((await client.metadata()).topics) == {"orders", "events"}
            finally:
                await client.close()
        wrong = LinkSecurity(protocol, "SCRAM-SHA-512", "linker", "not-it", str(ca_file))
        client = KafkaClient([live.bootstrap], security=wrong, request_timeout_ms=TIMEOUT_MS)
        with pytest.raises(KafkaClientError) as refused:
            await client.metadata()
        assert "error 58" in str(refused.value)  # SASL_AUTHENTICATION_FAILED
        assert "not-it" not in str(refused.value)
        await client.close()

    try:
        run(test)
    finally:
        live.stop()


def test_tls_trust_and_hostname(tls_files: tuple[Any, Path, Path]) -> None:
    leaf, ca_file, other_ca = tls_files
    live = secure_gateway("SASL_SSL", leaf)

    async def metadata(cafile: Path, host: str = HOST) -> Any:
        security = LinkSecurity("SASL_SSL", "PLAIN", "linker", PASSWORD, str(cafile))
        client = KafkaClient(
            [f"{host}:{live.port}"], security=security, request_timeout_ms=TIMEOUT_MS
        )
        try:
            return await client.metadata()
        finally:
            await client.close()

    async def test() -> None:
        assert (await metadata(ca_file)).cluster_id == "raylog-test-cluster"
        assert (await metadata(ca_file, "localhost")).cluster_id  # the leaf names localhost too
        with pytest.raises(KafkaClientError, match="CERTIFICATE_VERIFY_FAILED"):
            await metadata(other_ca)

    try:
        run(test)
    finally:
        live.stop()
    with pytest.raises(ValueError, match=r"ssl\.ca\.location"):
        KafkaClient(["h:1"], security=LinkSecurity("SSL", ssl_cafile="/nonexistent.pem"))


# --- misbehaving brokers ------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def api_versions_answer(correlation_id: int) -> bytes:
    """An ApiVersions v3 answer naming Metadata v1-v12 (response header v0)."""
    key = ApiVersionsResponse.ApiVersion
    body = ApiVersionsResponse(
        version=3,
        error_code=0,
        api_keys=[
            key(api_key=18, min_version=0, max_version=3),
            key(api_key=3, min_version=1, max_version=12),
        ],
        throttle_time_ms=0,
    ).encode()
    payload = struct.pack(">i", correlation_id) + bytes(body)
    return struct.pack(">i", len(payload)) + payload


Behaviour = Callable[[int, int], Awaitable[bytes | None]]  # (request number, correlation id)


async def raw_broker(behaviour: Behaviour) -> tuple[asyncio.Server, list[int]]:
    """A broker that answers ApiVersions, then each later request as ``behaviour`` says
    (bytes to send, or None for silence); counts its connections."""
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        n = 0
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
                (correlation_id,) = struct.unpack_from(">i", frame, 4)
                out = (
                    api_versions_answer(correlation_id)
                    if n == 0
                    else await behaviour(n, correlation_id)
                )
                n += 1
                if out is not None:
                    writer.write(out)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, HOST, 0)
    return server, connections


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (lambda cid: struct.pack(">i", 1 << 20), "response frame of 1048576 bytes"),
        (lambda cid: struct.pack(">ii", 4, cid + 1000), "never sent"),
        (lambda cid: struct.pack(">iii", 8, cid, 7), "undecodable"),  # a body cut short
        (lambda cid: None, "no answer within 300 ms"),
    ],
)
def test_misbehaving_broker(answer: Callable[[int], bytes | None], reason: str) -> None:
    async def behaviour(n: int, cid: int) -> bytes | None:
        return answer(cid)

    async def test() -> None:
        server, connections = await raw_broker(behaviour)
        port = server.sockets[0].getsockname()[1]
        client = KafkaClient([f"{HOST}:{port}"], request_timeout_ms=300, max_response_bytes=1 << 16)
        try:
            for attempt in (1, 2):  # the second call opens a new connection
                with pytest.raises(KafkaClientError, match=reason) as failed:
                    await client.metadata()
                assert f"127.0.0.1:{port}" in str(failed.value)
                assert len(connections) == attempt
        finally:
            await client.close()
            server.close()

    run(test)


def metadata_answer(correlation_id: int, cluster_id: str) -> bytes:
    """A Metadata v12 answer (response header v1: a tagged-fields byte after the id)."""
    body = MetadataResponse(
        version=12,
        throttle_time_ms=0,
        brokers=[],
        cluster_id=cluster_id,
        controller_id=1,
        topics=[],
    ).encode()
    payload = struct.pack(">ib", correlation_id, 0) + bytes(body)
    return struct.pack(">i", len(payload)) + payload


def test_pipelined_answers_out_of_order() -> None:
    """Two requests in flight on one connection; the broker answers the second first."""
    held: list[int] = []  # the first request's correlation id

    async def behaviour(n: int, cid: int) -> bytes | None:
        if n == 1:
            held.append(cid)
            return None  # held until the second request comes
        return metadata_answer(cid, "second") + metadata_answer(held[0], "first")

    async def test() -> None:
        server, connections = await raw_broker(behaviour)
        port = server.sockets[0].getsockname()[1]
        client = KafkaClient([f"{HOST}:{port}"], request_timeout_ms=TIMEOUT_MS)
        try:
            one = asyncio.ensure_future(client.metadata())
            await wait_until_async(
                lambda: held, timeout_s=TIMEOUT_MS / 1000, message="the first request in"
            )
            two = await client.metadata()
            assert (await one).cluster_id == "first" and two.cluster_id == "second"
            assert len(connections) == 1
        finally:
            await client.close()
            server.close()

    run(test)


def test_truncated_body_is_an_error() -> None:
    frame = api_versions_answer(5)[4:]
    assert decode_response(ApiVersionsResponse, 3, frame).api_keys[1].max_version == 12
    with pytest.raises(ValueError, match="ApiVersionsResponse v3"):
        decode_response(ApiVersionsResponse, 3, frame[:-3])
