"""Golden request frames captured from real clients, and the gateway's answers to them.

The hex strings below are the first frame of each (API, version) that librdkafka 2.16
(confluent-kafka), kafka-python 3.0.12, aiokafka and kcat (librdkafka 2.0.2) sent to this gateway
during bootstrap, with ``client.id`` "golden", size prefix removed. Proves that the header
parser reads each client's real header (v1, and v2 with its tagged-field byte for the flexible
ApiVersions v3/v4 openers), that every body decodes, and that the answers to the two openers we
do not support are Kafka's exact bytes, after which each client retried with a version we do
support (the retry frames are here too). To recapture: run each client against a live gateway
with ``Connection._admit`` wrapped to record its ``frame`` argument.
"""

from __future__ import annotations

import asyncio
import struct

import pytest
from support.gateway import InMemoryBackend, sample_topics

from raylog.gateway.handlers import HANDLERS, RequestContext, advertised_versions
from raylog.gateway.protocol import Connection, Request

GOLDEN: dict[str, str] = {
    "librdkafka ApiVersions v3": "00120003000000010006676f6c64656e0017636f6e666c75656e742d6b61666b"
    "612d707974686f6e16322e31362e312d72646b61666b612d322e31362e3000",
    "librdkafka ApiVersions v0": "00120000000000020006676f6c64656e",
    "librdkafka Metadata v5": "00030005000000030006676f6c64656e0000000000",
    "kafka-python ApiVersions v4": "00120004000000010006676f6c64656e000d6b61666b612d707974686f6e"
    "07332e302e313200",
    "kafka-python ApiVersions v2": "00120002000000020006676f6c64656e",
    "kafka-python Metadata v5": "00030005000000030006676f6c64656e0000000001",
    "aiokafka ApiVersions v0": "00120000000000010006676f6c64656e",
    "aiokafka Metadata v5": "00030005000000020006676f6c64656e0000000001",
    "kcat ApiVersions v3": "00120003000000010006676f6c64656e000b6c696272646b61666b6106322e302e3200",
    "kcat Metadata v4": "00030004000000030006676f6c64656e0000000000",
}

# Response header v0 (correlation id 1), error 35, a v0 array holding only ApiVersions 0-2.
UNSUPPORTED_ANSWER = bytes.fromhex("0000001000000001002300000001001200000002")


def admit(name: str) -> tuple[Connection, Request]:
    payload = bytes.fromhex(GOLDEN[name])
    connection = Connection(advertised_versions())
    connection.receive_data(struct.pack(">i", len(payload)) + payload)
    request = connection.next_event()
    assert isinstance(request, Request)
    return connection, request


def respond(connection: Connection, request: Request) -> bytes:
    backend = InMemoryBackend(topic_states=sample_topics())
    context = RequestContext(backend, advertised_versions(), "golden")
    return bytes(connection.send(request, asyncio.run(HANDLERS[request.api_key](context, request))))


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_headers_and_bodies(name: str) -> None:
    connection, request = admit(name)
    assert request.header.client_id == "golden"
    flexible_opener = request.api_key == 18 and request.api_version >= 3
    assert request.header.header_version == (2 if flexible_opener else 1)
    response = respond(connection, request)
    assert struct.unpack_from(">i", response, 4)[0] == request.correlation_id
    if flexible_opener:
        assert request.body is None
        assert response == UNSUPPORTED_ANSWER
    else:
        assert request.body is not None
        assert struct.unpack_from(">i", response)[0] == len(response) - 4
