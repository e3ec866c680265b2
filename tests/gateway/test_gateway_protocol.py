"""The sans-IO connection and the codec: framing, headers, admission, ordering, limits.

Proves, without sockets: frames are cut at the size prefix however the bytes are chunked; request
header v1 and v2 (flexible, with tagged fields) parse as the JSON specs say, using bytes built by
hand and by kafka-python's client-side encoder; the header version follows ``flexibleVersions``
(and Kafka's two exceptions); an oversized or negative size prefix fails before the frame is
buffered; unknown APIs and versions fail (except ApiVersions); responses leave in request order
and the in-flight bound pauses the reader; the unsupported-ApiVersions answer is Kafka's exact
bytes.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.broker_version_data import infer_broker_version_from_api_versions
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest, MetadataResponse
from support.gateway import InMemoryBackend, api_versions_v0_frame, sample_topics

from raylog.gateway import codec, protocol
from raylog.gateway.errors import LocalProtocolError, RemoteProtocolError
from raylog.gateway.handlers import HANDLERS, RequestContext, advertised_versions
from raylog.gateway.protocol import Connection, Request, Signal

ADVERTISED = advertised_versions()


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def metadata_request_frame(version: int, topics: list[str] | None, correlation_id: int) -> bytes:
    request = MetadataRequest(
        topics=None
        if topics is None
        else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
        allow_auto_topic_creation=False,
    )
    request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id="golden")
    return bytes(request.encode(version=version, header=True, framed=True))


def answer(connection: Connection, request: Request) -> bytes:
    context = RequestContext(InMemoryBackend(topic_states=sample_topics()), ADVERTISED, "test")
    response = asyncio.run(HANDLERS[request.api_key](context, request))
    return bytes(connection.send(request, response))


# Every API with a handler, at the ranges measured against the clients (apis.TARGET_VERSIONS).
EXPECTED_TABLE = {
    0: (3, 7),  # Produce
    1: (4, 11),  # Fetch
    2: (1, 9),  # ListOffsets
    3: (1, 5),  # Metadata
    8: (2, 7),  # OffsetCommit
    9: (1, 3),  # OffsetFetch
    10: (0, 2),  # FindCoordinator
    11: (0, 5),  # JoinGroup
    12: (0, 3),  # Heartbeat
    13: (0, 3),  # LeaveGroup
    14: (0, 3),  # SyncGroup
    15: (0, 6),  # DescribeGroups
    16: (0, 5),  # ListGroups
    17: (0, 1),  # SaslHandshake
    18: (0, 2),  # ApiVersions
    19: (2, 4),  # CreateTopics
    20: (1, 3),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 4),  # InitProducerId
    24: (0, 3),  # AddPartitionsToTxn
    25: (0, 3),  # AddOffsetsToTxn
    26: (0, 3),  # EndTxn
    28: (0, 3),  # TxnOffsetCommit
    29: (0, 1),  # DescribeAcls
    30: (0, 1),  # CreateAcls
    31: (0, 1),  # DeleteAcls
    32: (0, 2),  # DescribeConfigs
    33: (0, 1),  # AlterConfigs
    36: (0, 2),  # SaslAuthenticate
    37: (0, 1),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    43: (0, 1),  # ElectLeaders
    44: (0, 0),  # IncrementalAlterConfigs
    47: (0, 0),  # OffsetDelete
    48: (1, 1),  # DescribeClientQuotas: not v0 (kafka-python would read Kafka 2.6)
    49: (0, 1),  # AlterClientQuotas
    50: (0, 0),  # DescribeUserScramCredentials
    51: (0, 0),  # AlterUserScramCredentials
    65: (0, 0),  # DescribeTransactions
    66: (0, 1),  # ListTransactions
}


def test_advertised_table_is_the_registered_handlers() -> None:
    assert dict(ADVERTISED) == EXPECTED_TABLE
    # docs/PROTOCOL.md: kafka-python reads the table as Kafka 3.0 (ListOffsets v7); it then
    # sends InitProducerId v3 (offered) and nothing the table does not offer.
    assert infer_broker_version_from_api_versions(dict(ADVERTISED)) == (3, 0)


def test_header_versions_follow_flexible_versions() -> None:
    assert codec.request_header_version(3, 5) == 1
    assert codec.request_header_version(3, 9) == 2  # Metadata flexibleVersions "9+"
    assert codec.request_header_version(18, 2) == 1
    assert codec.request_header_version(18, 3) == 2  # ApiVersions flexibleVersions "3+"
    assert codec.request_header_version(7, 0) == 0  # ControlledShutdown v0: no client id
    assert codec.response_header_version(3, 5) == 0
    assert codec.response_header_version(3, 9) == 1
    assert codec.response_header_version(18, 3) == 0  # ApiVersions: always header v0


def test_api_versions_v0_golden_bytes() -> None:
    connection = Connection(ADVERTISED)
    connection.receive_data(api_versions_v0_frame(correlation_id=7, client_id="raw"))
    request = connection.next_event()
    assert isinstance(request, Request)
    assert request.header == codec.RequestHeader(18, 0, 7, "raw", 1)
    assert answer(connection, request) == bytes.fromhex(
        "000000fa"  # size: 250 bytes
        "00000007"  # correlation id
        "0000"  # error_code NONE
        "00000028"  # api_keys: 40 entries, by key; each key, min, max
        "000000030007"  # Produce 3-7
        "00010004000b"  # Fetch 4-11
        "000200010009"  # ListOffsets 1-9
        "000300010005"  # Metadata 1-5
        "000800020007"  # OffsetCommit 2-7
        "000900010003"  # OffsetFetch 1-3
        "000a00000002"  # FindCoordinator 0-2
        "000b00000005"  # JoinGroup 0-5
        "000c00000003"  # Heartbeat 0-3
        "000d00000003"  # LeaveGroup 0-3
        "000e00000003"  # SyncGroup 0-3
        "000f00000006"  # DescribeGroups 0-6
        "001000000005"  # ListGroups 0-5
        "001100000001"  # SaslHandshake 0-1
        "001200000002"  # ApiVersions 0-2
        "001300020004"  # CreateTopics 2-4
        "001400010003"  # DeleteTopics 1-3
        "001500000002"  # DeleteRecords 0-2
        "001600000004"  # InitProducerId 0-4
        "001800000003"  # AddPartitionsToTxn 0-3
        "001900000003"  # AddOffsetsToTxn 0-3
        "001a00000003"  # EndTxn 0-3
        "001c00000003"  # TxnOffsetCommit 0-3
        "001d00000001"  # DescribeAcls 0-1
        "001e00000001"  # CreateAcls 0-1
        "001f00000001"  # DeleteAcls 0-1
        "002000000002"  # DescribeConfigs 0-2
        "002100000001"  # AlterConfigs 0-1
        "002400000002"  # SaslAuthenticate 0-2
        "002500000001"  # CreatePartitions 0-1
        "002a00000002"  # DeleteGroups 0-2
        "002b00000001"  # ElectLeaders 0-1
        "002c00000000"  # IncrementalAlterConfigs 0-0
        "002f00000000"  # OffsetDelete 0-0
        "003000010001"  # DescribeClientQuotas 1-1
        "003100000001"  # AlterClientQuotas 0-1
        "003200000000"  # DescribeUserScramCredentials 0-0
        "003300000000"  # AlterUserScramCredentials 0-0
        "004100000000"  # DescribeTransactions 0-0
        "004200000001"  # ListTransactions 0-1
    )


def test_unsupported_api_versions_gets_kafkas_exact_answer() -> None:
    # kafka-python opens with ApiVersions v4: flexible, header v2, a body we never parse.
    request = ApiVersionsRequest(client_software_name="kafka-python", client_software_version="3")
    request.API_VERSION = 4
    request.with_header(correlation_id=1, client_id="kp")
    connection = Connection(ADVERTISED)
    connection.receive_data(bytes(request.encode(version=4, header=True, framed=True)))
    event = connection.next_event()
    assert isinstance(event, Request)
    assert event.body is None and event.response_version == 0
    assert answer(connection, event) == bytes.fromhex(
        "00000010"  # size: 16 bytes
        "00000001"  # response header v0: correlation id only
        "0023"  # error_code 35 UNSUPPORTED_VERSION
        "00000001"  # api_keys: non-compact array of 1 (v0 body)
        "0012"
        "0000"
        "0002"  # ApiVersions 0-2, and nothing else
    )


def test_unsupported_api_versions_needs_only_eight_bytes() -> None:
    connection = Connection(ADVERTISED)
    connection.receive_data(frame(struct.pack(">hhi", 18, 99, 0x01020304)))
    event = connection.next_event()
    assert isinstance(event, Request)
    assert (event.api_version, event.correlation_id, event.body) == (99, 0x01020304, None)
    assert answer(connection, event)[4:8] == bytes.fromhex("01020304")


def test_flexible_header_v2_with_tagged_fields_by_hand() -> None:
    # Metadata v9, header v2: key 3, version 9, correlation 42, client id "c", then one tagged
    # field (tag 5, 2 bytes) that must be skipped; then the body: topics null (compact 0),
    # allow_auto_topic_creation true, two authorized-operations booleans, no tagged fields.
    header = struct.pack(">hhih", 3, 9, 42, 1) + b"c" + bytes([1, 5, 2, 0xAA, 0xBB])
    body = bytes([0, 1, 0, 0, 0])
    connection = Connection({3: (0, 12)})
    connection.receive_data(frame(header + body))
    event = connection.next_event()
    assert isinstance(event, Request)
    assert event.header == codec.RequestHeader(3, 9, 42, "c", 2)
    assert event.body.topics is None
    assert event.body.allow_auto_topic_creation is True


@pytest.mark.parametrize("version", [1, 4, 5, 9, 12])
def test_client_encoded_metadata_requests_decode(version: int) -> None:
    connection = Connection({3: (0, 12)})
    connection.receive_data(metadata_request_frame(version, ["orders", "events"], 11))
    event = connection.next_event()
    assert isinstance(event, Request)
    assert event.header.client_id == "golden"
    assert event.header.header_version == (2 if version >= 9 else 1)
    assert [t.name for t in event.body.topics] == ["orders", "events"]


@given(
    topics=st.one_of(st.none(), st.lists(st.text(min_size=1, max_size=20), max_size=5)),
    correlation_id=st.integers(-(2**31), 2**31 - 1),
    version=st.integers(1, 5),
    cuts=st.lists(st.integers(0, 400), max_size=6),
)
@settings(max_examples=150, deadline=None)
def test_round_trip_any_chunking(
    topics: list[str] | None, correlation_id: int, version: int, cuts: list[int]
) -> None:
    data = metadata_request_frame(version, topics, correlation_id) * 2
    connection = Connection(ADVERTISED)
    events: list[Any] = []
    previous = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if cut > previous:  # receive_data(b"") would mean end of stream
            connection.receive_data(data[previous:cut])
        previous = max(previous, cut)
        while isinstance(event := connection.next_event(), Request):
            events.append(event)
        assert event is Signal.NEED_DATA
    assert len(events) == 2
    for event in events:
        assert event.correlation_id == correlation_id
        assert (
            None if event.body.topics is None else [t.name for t in event.body.topics]
        ) == topics
    # And the response decodes with the client's own decoder.
    encoded = answer(connection, events[0])
    response = MetadataResponse.decode(encoded[8:], version=version)
    assert {b.node_id for b in response.brokers} == {1, 2, 3}


def _receive_like_a_socket(connection: Connection, data: bytes, step: int) -> list[Request]:
    """Feed ``data`` through get_buffer/buffer_updated as a socket's recv_into would, at most
    ``step`` bytes per read, taking requests as they complete."""
    events: list[Request] = []
    pos = 0
    while pos < len(data):
        view = connection.get_buffer()
        n = min(len(view), step, len(data) - pos)
        view[:n] = data[pos : pos + n]
        connection.buffer_updated(n)
        pos += n
        while isinstance(event := connection.next_event(), Request):
            events.append(event)
    return events


@pytest.mark.parametrize("step", [1000, 65536, 1 << 20])
def test_a_large_request_is_received_in_place_between_small_ones(step: int) -> None:
    names = [f"topic-with-a-long-name-{i:05d}" for i in range(4000)]
    large = metadata_request_frame(4, names, 2)
    assert len(large) > protocol.RECEIVE_IN_PLACE_MIN
    data = metadata_request_frame(4, ["a"], 1) + large + metadata_request_frame(4, ["b"], 3)
    connection = Connection(ADVERTISED)
    events = _receive_like_a_socket(connection, data, step)
    assert [e.correlation_id for e in events] == [1, 2, 3]
    assert [t.name for t in events[1].body.topics] == names
    assert [t.name for t in events[2].body.topics] == ["b"]
    # Once an eighth of it is in, the rest of the large request goes into a buffer of its own.
    connection = Connection(ADVERTISED)
    head = len(large) // protocol.RECEIVE_IN_PLACE_AMPLIFICATION_MAX + 1
    first = _receive_like_a_socket(connection, large[:head], step)
    assert first == [] and len(connection.get_buffer()) == len(large) - head
    assert connection.buffered_bytes == head
    (event,) = _receive_like_a_socket(connection, large[head:], step)
    assert event.correlation_id == 2 and connection.buffered_bytes == 0


class _Block:
    """A shared-memory block as the protocol sees one (``raylog.actors.transport.arena.Block``)."""

    def __init__(self, size: int) -> None:
        self.view = memoryview(bytearray(size))
        self.released = 0

    def release(self) -> None:
        self.released += 1


class _Allocator:
    def __init__(self, room: int) -> None:
        self.room = room  # blocks it still hands out
        self.blocks: list[_Block] = []

    def __call__(self, size: int) -> _Block | None:
        if not self.room:
            return None
        self.room -= 1
        self.blocks.append(_Block(size))
        return self.blocks[-1]


@pytest.mark.parametrize("step", [1000, 65536])
def test_large_requests_are_received_into_shared_blocks_in_order(step: int) -> None:
    # (Reads of at most ``step`` bytes: a read that brings a whole request into the scratch
    # leaves nothing to receive in place.)
    names = [f"topic-with-a-long-name-{i:05d}" for i in range(4000)]
    large = [metadata_request_frame(4, names[: 3000 + i], 10 + i) for i in range(3)]
    small = [metadata_request_frame(4, [f"s{i}"], i) for i in range(4)]
    data = small[0] + large[0] + large[1] + small[1] + small[2] + large[2] + small[3]
    allocate = _Allocator(room=2)  # the third large request finds no room: private memory
    connection = Connection(ADVERTISED, allocate=allocate)
    events = _receive_like_a_socket(connection, data, step)
    assert [e.correlation_id for e in events] == [0, 10, 11, 1, 2, 12, 3]
    assert [len(e.body.topics) for e in events] == [1, 3000, 3001, 1, 1, 3002, 1]
    assert [e.hold for e in events] == [None, *allocate.blocks, None, None, None, None]
    for block, frame in zip(allocate.blocks, large[:2], strict=True):
        assert bytes(block.view) == frame  # received whole, in place
        assert block.released == 0  # the server releases it once the request is answered
    assert connection.buffered_bytes == 0


def test_shared_blocks_of_refused_or_unread_requests_are_released() -> None:
    names = [f"topic-with-a-long-name-{i:05d}" for i in range(4000)]
    frame = bytearray(metadata_request_frame(4, names, 7))
    struct.pack_into(">h", frame, 6, 99)  # an API version nobody supports
    allocate = _Allocator(room=3)
    connection = Connection(ADVERTISED, allocate=allocate)
    with pytest.raises(RemoteProtocolError, match="unsupported"):
        _receive_like_a_socket(connection, bytes(frame), 4096)
    assert [b.released for b in allocate.blocks] == [1]
    # Closed with one request whole and never taken, and one half received: both released.
    good = metadata_request_frame(4, names, 8)
    connection = Connection(ADVERTISED, allocate=allocate)
    data = good + good[: len(good) // 2]
    pos = 0
    while pos < len(data):
        view = connection.get_buffer()
        n = min(len(view), 1 << 16, len(data) - pos)
        view[:n] = data[pos : pos + n]
        connection.buffer_updated(n)
        pos += n
    connection.get_buffer()  # where the socket's next read would go: the second's own block
    assert len(allocate.blocks) == 3
    connection.discard()
    assert [b.released for b in allocate.blocks] == [1, 1, 1]
    connection.discard()  # once only
    assert [b.released for b in allocate.blocks] == [1, 1, 1]


def test_a_size_prefix_alone_allocates_nothing_in_place() -> None:
    # A client declaring a 100 MiB request and sending 1 KiB of it gets no 100 MiB buffer.
    connection = Connection(ADVERTISED)
    declared = 100 << 20
    _receive_like_a_socket(connection, struct.pack(">i", declared) + b"\x00" * 1024, 1 << 20)
    assert len(connection.get_buffer()) == protocol.RECEIVE_SCRATCH_BYTES
    assert connection.buffered_bytes == 4 + 1024


@pytest.mark.parametrize("size", [104_857_601, 2**31 - 1, -1, -(2**31)])
def test_bad_size_prefix_fails_before_buffering(size: int) -> None:
    connection = Connection(ADVERTISED)
    connection.receive_data(struct.pack(">i", size))
    with pytest.raises(RemoteProtocolError, match=r"socket\.request\.max\.bytes"):
        connection.next_event()
    with pytest.raises(RemoteProtocolError):  # and stays failed
        connection.next_event()


def test_frame_limit_is_configurable() -> None:
    connection = Connection(ADVERTISED, max_frame_bytes=100)
    connection.receive_data(frame(b"x" * 100)[:4])
    assert connection.next_event() is Signal.NEED_DATA
    connection = Connection(ADVERTISED, max_frame_bytes=100)
    connection.receive_data(frame(b"x" * 101)[:4])
    with pytest.raises(RemoteProtocolError):
        connection.next_event()


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(0, 8), (0, 2), (3, 0), (3, 6), (3, 9), (-1, 0), (999, 0), (60, 0)],
)
def test_unadvertised_api_or_version_closes(api_key: int, version: int) -> None:
    connection = Connection(ADVERTISED)
    connection.receive_data(frame(struct.pack(">hhih", api_key, version, 1, -1)))
    with pytest.raises(RemoteProtocolError, match="unsupported"):
        connection.next_event()


def test_truncated_body_is_rejected() -> None:
    data = metadata_request_frame(5, ["orders"], 3)
    # Cut the last byte of the topic name but keep the frame's size consistent.
    payload = data[4:-2] + data[-1:]
    connection = Connection(ADVERTISED)
    connection.receive_data(frame(payload))
    with pytest.raises(RemoteProtocolError, match="bad request"):
        connection.next_event()


def test_short_frame_is_rejected() -> None:
    connection = Connection(ADVERTISED)
    connection.receive_data(frame(b"\x00\x12\x00"))
    with pytest.raises(RemoteProtocolError, match="no request header"):
        connection.next_event()


def test_responses_leave_in_request_order_and_in_flight_is_bounded() -> None:
    connection = Connection(ADVERTISED, max_in_flight=3)
    connection.receive_data(b"".join(api_versions_v0_frame(i) for i in range(4)))
    requests = [connection.next_event() for _ in range(3)]
    assert all(isinstance(r, Request) for r in requests)
    assert connection.next_event() is Signal.PAUSED
    assert answer(connection, requests[2]) == b""  # waits for 0 and 1
    assert answer(connection, requests[1]) == b""
    released = answer(connection, requests[0])
    correlation_ids = []
    while released:
        size = struct.unpack_from(">i", released)[0]
        correlation_ids.append(struct.unpack_from(">i", released, 4)[0])
        released = released[4 + size :]
    assert correlation_ids == [0, 1, 2]
    assert connection.in_flight == 0
    last = connection.next_event()
    assert isinstance(last, Request) and last.correlation_id == 3


def test_answering_twice_or_a_stranger_is_a_local_error() -> None:
    connection = Connection(ADVERTISED)
    connection.receive_data(api_versions_v0_frame(1))
    request = connection.next_event()
    assert isinstance(request, Request)
    assert connection.send_nothing(request) == b""
    with pytest.raises(LocalProtocolError):
        connection.send_nothing(request)
    other = Connection(ADVERTISED)
    with pytest.raises(LocalProtocolError):
        other.send_nothing(request)


def test_end_of_stream() -> None:
    connection = Connection(ADVERTISED)
    connection.receive_data(api_versions_v0_frame(1)[:-1])
    connection.receive_data(b"")
    assert connection.next_event() is Signal.CLOSED


def test_in_flight_bytes_are_bounded_but_one_request_always_fits() -> None:
    big = metadata_request_frame(5, ["t" * 200], 1)
    connection = Connection(ADVERTISED, max_in_flight_bytes=100)
    connection.receive_data(big + api_versions_v0_frame(2))
    first = connection.next_event()
    assert isinstance(first, Request)  # larger than the bound, admitted alone
    assert connection.next_event() is Signal.PAUSED
    answer(connection, first)
    second = connection.next_event()
    assert isinstance(second, Request) and second.correlation_id == 2
