"""Fuzz the gateways of `raylog up` with well-formed requests of random content.

Hypothesis builds requests of the APIs a client may send without changing the cluster's shape
(Produce, Fetch, ListOffsets, Metadata, the group, offset and transaction APIs, the Describe*
and List* APIs, SASL on a PLAINTEXT listener, and more), field by field from Kafka's JSON
message specs (kafka-python's copy, which the gateway decodes with): every version the gateway
advertises, integers at their edges, names from a small pool of real and missing topics,
groups and transactional ids, and record batches that are valid, damaged (a flipped byte, cut
short, junk after it, a wrong length, magic or count) or hostile with a CRC that matches (an
unknown codec, a control or transactional flag, records that do not parse, a decompression
bomb). Each request goes to a broker on a new connection.

Proves, on the session's shared `raylog up` (tests/conftest.py):
- every request is answered on its connection, with its correlation id, in a response that
  decodes at its version, carrying no UNKNOWN_SERVER_ERROR: no request makes a handler fail
  (the gateway closes the connection then); an acks=0 Produce is answered by silence, or by
  closing the connection when it failed (Kafka's rule);
- nothing is lost and nothing appears that no client sent: every batch acknowledged on the
  fuzzed topics is in the log at the offset its answer gave, and every batch in the log is one
  the fuzzer sent, whole (CRC-32C), and a confluent-kafka consumer reads both topics to their
  ends without an error;
- afterwards every broker answers;
- a batch whose records do not parse, or do not decompress, or inflate past their bound, under
  a CRC that matches, is refused with CORRUPT_MESSAGE by the leader, as Kafka refuses it:
  appended, it would stop every consumer of the partition there.
"""

from __future__ import annotations

import socket
import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import crc32c
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cluster import UpProcess
from support.gateway import HOST, api_versions_v0_frame, read_frame
from support.kafka_batches import kafka_batch

from raylog.gateway import codec
from raylog.storage import batch as rb

pytestmark = pytest.mark.slow

TOPIC = "fuzz"  # 2 partitions, RF=3
COMPACTED = "fuzz-compacted"  # 1 partition, RF=3, cleanup.policy=compact
DATA_TOPICS = {TOPIC: 2, COMPACTED: 1}
GROUPS = ("fuzz-g1", "fuzz-g2")
TRANSACTIONAL_IDS = ("fuzz-tx1", "fuzz-tx2")
BROKERS = (1, 2, 3)
TIMEOUT_S = 60.0
EXAMPLES = 300  # random requests of every API
BATCH_EXAMPLES = 200  # random batches for the fuzzed partitions' leaders

# APIs a client may send that leave the cluster's topics, configs, ACLs, quotas and users as
# they are (CreateTopics, DeleteRecords, AlterConfigs and the like are not fuzzed here).
FUZZED_APIS = (
    0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 22, 23, 24, 25, 26, 27, 28, 29,
    32, 35, 36, 42, 46, 47, 48, 50, 55, 60, 61, 65, 66, 74, 75,
)  # fmt: skip
PRODUCE, FETCH, METADATA, JOIN_GROUP = 0, 1, 3, 11
UNKNOWN_SERVER_ERROR = -1

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}
NAMES = {
    "topicName": (TOPIC, COMPACTED, "fuzz-missing", "", "__consumer_offsets", "a" * 300),
    "groupId": (*GROUPS, "", "g" * 300),
    "transactionalId": (*TRANSACTIONAL_IDS, ""),
}
# Fields whose useful values are few: mostly these, sometimes any.
CHOICES = {(PRODUCE, "acks"): (-1, -1, 1, 1, 0, 2)}
# Fields whose values decide how long an answer may wait: bounded, so that a request is
# answered within the read timeout.
WAITS_MS = {
    (FETCH, "max_wait_ms"): 300,
    (PRODUCE, "timeout_ms"): 3_000,
    (JOIN_GROUP, "rebalance_timeout_ms"): 300,
    (JOIN_GROUP, "session_timeout_ms"): 10_000,
}


@dataclass
class Sent:
    """What the fuzzer sent to the data topics, and what was acknowledged."""

    crcs: dict[str, set[int]] = field(default_factory=lambda: {t: set() for t in DATA_TOPICS})
    # topic, partition, offset, and the CRCs the batch there may have: the acknowledged one's,
    # or for an idempotent producer's, any batch sent with its id, epoch and sequence (a later
    # one is a retry, answered with the first one's offset, as Kafka does)
    acked: list[tuple[str, int, int, set[int]]] = field(default_factory=list)
    idempotent: dict[tuple[int, int, int], set[int]] = field(default_factory=dict)
    requests: dict[int, int] = field(default_factory=dict)  # api key -> answered requests


SENT = Sent()


@dataclass
class Request:
    api_key: int
    version: int
    message: Any
    leader_of: tuple[str, int] | None = None  # sent to that partition's leader, else anywhere


# --- record batches ------------------------------------------------------------------------------


def _with_crc(batch: bytearray) -> bytes:
    """``batch`` with its CRC-32C made to match (over attributes to the end)."""
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def _rewrite(batch: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(fmt, out, offset, value)
    return _with_crc(out)


def _bomb(size: int) -> bytes:
    """A gzip batch whose records section inflates to ``size`` zero bytes."""
    batch = bytearray(kafka_batch([{"key": b"k", "value": b"v", "timestamp": 0, "headers": []}], 0))
    compressed = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = compressed.compress(bytes(size)) + compressed.flush()
    batch = batch[: rb.HEADER_SIZE] + body
    struct.pack_into(">i", batch, 8, len(batch) - rb.LOG_OVERHEAD)
    struct.pack_into(">h", batch, 21, 1)  # gzip
    return _with_crc(batch)


@st.composite
def valid_batches(draw: st.DrawFn) -> bytes:
    records = [
        {
            "key": draw(st.one_of(st.none(), st.binary(max_size=8))),
            "value": draw(st.one_of(st.none(), st.binary(max_size=64))),
            "timestamp": draw(st.integers(-1, 2**41)),
            "headers": [],
        }
        for _ in range(draw(st.integers(1, 4)))
    ]
    producer_id, epoch, sequence = draw(
        st.sampled_from([(-1, -1, -1), (-1, -1, -1), (9, 0, 0), (9, 0, 7)])
    )
    return kafka_batch(
        records,
        draw(st.integers(0, 4)),  # none, gzip, snappy, lz4, zstd
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
    )


@st.composite
def batches(draw: st.DrawFn) -> bytes | None:
    """A record batch: valid, damaged, hostile with a matching CRC, or null."""
    batch = draw(valid_batches())
    if draw(st.booleans()):
        return batch
    kind = draw(st.integers(0, 11))
    if kind == 0:
        return None
    if kind == 1:  # a flipped byte (the CRC no longer matches, or the header is wrong)
        at = draw(st.integers(0, len(batch) - 1))
        flipped = bytearray(batch)
        flipped[at] ^= draw(st.integers(1, 255))
        return bytes(flipped)
    if kind == 2:  # cut short
        return batch[: draw(st.integers(0, len(batch) - 1))]
    if kind == 3:  # junk after the batch
        return batch + draw(st.binary(min_size=1, max_size=64))
    if kind == 4:  # a length field that lies
        return _rewrite(batch, 8, ">i", draw(st.integers(-(2**31), 2**31 - 1)))
    if kind == 5:  # another magic
        return _rewrite(batch, 16, ">b", draw(st.integers(-128, 127)))
    if kind == 6:  # attributes: an unknown codec, control, transactional, timestamp type
        return _rewrite(batch, 21, ">h", draw(st.integers(-(2**15), 2**15 - 1)))
    if kind == 7:  # a record count or last offset delta that lies
        offset = draw(st.sampled_from([23, 57]))
        return _rewrite(batch, offset, ">i", draw(st.integers(-(2**31), 2**31 - 1)))
    if kind == 8:  # a producer id, epoch or sequence of any value
        where = draw(st.sampled_from([(43, ">q", 63), (51, ">h", 15), (53, ">i", 31)]))
        value = draw(st.integers(-(2 ** where[2]), 2 ** where[2] - 1))
        return _rewrite(batch, where[0], where[1], value)
    if kind == 9:  # records that do not parse, under a CRC that matches
        garbage = bytearray(batch[: rb.HEADER_SIZE]) + draw(st.binary(min_size=1, max_size=64))
        struct.pack_into(">i", garbage, 8, len(garbage) - rb.LOG_OVERHEAD)
        return _with_crc(garbage)
    if kind == 10:  # a decompression bomb
        return _bomb(draw(st.sampled_from([1 << 20, 200 << 20])))
    # timestamps of any value
    offset = draw(st.sampled_from([27, 35]))
    return _rewrite(batch, offset, ">q", draw(st.integers(-(2**63), 2**63 - 1)))


# --- requests, field by field from the specs ------------------------------------------------------


def _integers(kind: str) -> st.SearchStrategy[int]:
    lo, hi = INT_RANGES[kind]
    edges = sorted({lo, hi, -1, 0, 1, 2, 3})
    return st.one_of(st.sampled_from(edges), st.integers(-5, 100), st.integers(lo, hi))


def _simple(draw: st.DrawFn, spec: Any, kind: str, nullable: bool, api_key: int) -> Any:
    if nullable and draw(st.integers(0, 9)) == 0:
        return None
    names = NAMES.get(spec._entity_type or "")
    if kind == "string" and names is not None:
        if spec._entity_type == "topicName" and draw(st.booleans()):
            return draw(st.sampled_from(sorted(DATA_TOPICS)))
        return draw(st.one_of(st.sampled_from(names), st.text(max_size=12)))
    if kind in INT_RANGES:
        choices = CHOICES.get((api_key, spec.name))
        if choices is not None:
            return draw(st.one_of(*[st.sampled_from(choices)] * 3, _integers(kind)))
        wait = WAITS_MS.get((api_key, spec.name))
        if wait is not None:
            return draw(st.integers(-1, wait))
        if spec.name in ("partition", "partition_index", "index"):
            return draw(st.one_of(st.sampled_from([0, 0, 1, -1, 99]), _integers(kind)))
        return draw(_integers(kind))
    if kind == "bool":
        return draw(st.booleans())
    if kind == "float64":
        return draw(st.floats())
    if kind == "string":
        return draw(st.text(max_size=24))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "uuid":
        return draw(st.one_of(st.just(uuid.UUID(int=0)), st.uuids()))
    if kind == "records":
        return draw(batches())
    raise AssertionError(f"a field type the fuzzer does not know: {kind}")


def _message(draw: st.DrawFn, cls: Any, struct_spec: Any, version: int, api_key: int) -> Any:
    values: dict[str, Any] = {}
    for spec in struct_spec._fields:
        if not spec.for_version_q(version) or (spec._tagged_versions and draw(st.booleans())):
            continue
        nullable = spec.nullable_for_version_q(version)
        if (spec.is_struct() or spec.is_array()) and nullable and draw(st.integers(0, 9)) == 0:
            values[spec.name] = None
        elif spec.is_struct() or spec.is_struct_array():
            inner = getattr(cls, spec.type_str, None) or spec.data_class
            count = 1 if spec.is_struct() else draw(st.integers(0, 3))
            made = [_message(draw, inner, spec, version, api_key) for _ in range(count)]
            values[spec.name] = made[0] if spec.is_struct() else made
        elif spec.is_array():
            count = draw(st.integers(0, 4))
            values[spec.name] = [
                _simple(draw, spec, spec.type_str[2:], False, api_key) for _ in range(count)
            ]
        else:
            values[spec.name] = _simple(draw, spec, spec.type_str, nullable, api_key)
    if api_key == METADATA and "allow_auto_topic_creation" in values:
        values["allow_auto_topic_creation"] = False  # no topics named by the fuzzer
    return cls(**values)


@st.composite
def data_produce(draw: st.DrawFn, versions: tuple[int, int]) -> Request:
    """A Produce of one batch to a partition of a fuzzed topic, with a valid acks, for the
    partition's leader."""
    cls = codec.request_class(PRODUCE)
    topic = draw(st.sampled_from(sorted(DATA_TOPICS)))
    index = draw(st.integers(0, DATA_TOPICS[topic] - 1))
    part = cls.TopicProduceData.PartitionProduceData(index=index, records=draw(batches()))
    message = cls(
        transactional_id=draw(st.sampled_from([None, None, *TRANSACTIONAL_IDS])),
        acks=draw(st.sampled_from([-1, 1, 0])),
        timeout_ms=WAITS_MS[PRODUCE, "timeout_ms"],
        topic_data=[cls.TopicProduceData(name=topic, partition_data=[part])],
    )
    return Request(PRODUCE, draw(st.integers(*versions)), message, (topic, index))


@st.composite
def requests(draw: st.DrawFn, versions: dict[int, tuple[int, int]]) -> Request:
    api_key = draw(st.sampled_from(sorted(versions)))
    low, high = versions[api_key]
    version = draw(st.integers(low, high))
    cls = codec.request_class(api_key)
    return Request(api_key, version, _message(draw, cls, cls._struct, version, api_key))


# --- the wire ------------------------------------------------------------------------------------


def _port(up: UpProcess, broker: int) -> int:
    return up.port + broker - 1


def _advertised(up: UpProcess) -> dict[int, tuple[int, int]]:
    """The fuzzed APIs' versions the gateway advertises that kafka-python can encode."""
    with socket.create_connection((HOST, _port(up, 1)), timeout=TIMEOUT_S) as sock:
        sock.sendall(api_versions_v0_frame(1))
        frame = read_frame(sock)
    answer = codec.response_class(18).decode(frame[4:], version=0)
    versions = {}
    for entry in answer.api_keys:
        if entry.api_key in FUZZED_APIS:
            cls = codec.request_class(entry.api_key)
            high = min(entry.max_version, cls._valid_versions[1])
            if entry.min_version <= high:
                versions[entry.api_key] = (entry.min_version, high)
    assert PRODUCE in versions and FETCH in versions and JOIN_GROUP in versions, versions
    return versions


def _error_codes(value: Any) -> Iterator[int]:
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "error_code" and isinstance(inner, int):
                yield inner
            else:
                yield from _error_codes(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _error_codes(inner)


def _exchange(port: int, api_key: int, version: int, message: Any) -> Any:
    """Send ``message`` on a new connection; its decoded answer (None: an acks=0 Produce,
    answered by silence or by a closed connection)."""
    message.with_header(correlation_id=77, client_id="fuzz")
    frame = bytes(message.encode(version=version, header=True, framed=True))
    silent = api_key == PRODUCE and message.acks == 0
    with socket.create_connection((HOST, port), timeout=TIMEOUT_S) as sock:
        sock.sendall(frame)
        if silent:  # the next request shows the connection is alive (or closed)
            sock.sendall(api_versions_v0_frame(78))
        try:
            answer = read_frame(sock)
        except ConnectionError:
            assert silent, f"API {api_key} v{version}: the gateway closed the connection"
            return None
    correlation_id = struct.unpack(">i", answer[:4])[0]
    if silent:
        assert correlation_id == 78, f"an acks=0 Produce was answered ({correlation_id})"
        return None
    assert correlation_id == 77, f"API {api_key} v{version}: correlation id {correlation_id}"
    response = codec.response_class(api_key)
    header = 1 if codec.response_header_version(api_key, version) else 0
    return response.decode(answer[4 + header :], version=version)


def _note_sent(message: Any) -> dict[tuple[str, int], set[int]]:
    """Record the CRC of every batch a Produce carries to a fuzzed topic; returns, by
    partition, the CRCs its batch may be stored with if acknowledged."""
    sent = {}
    for topic in message.topic_data or []:
        for part in topic.partition_data or []:
            if topic.name in DATA_TOPICS and part.records and len(part.records) >= rb.HEADER_SIZE:
                crc = struct.unpack_from(">I", part.records, 17)[0]
                SENT.crcs[topic.name].add(crc)
                producer_id, epoch, sequence = struct.unpack_from(">qhi", part.records, 43)
                crcs = {crc}
                if producer_id >= 0:
                    crcs = SENT.idempotent.setdefault((producer_id, epoch, sequence), set())
                    crcs.add(crc)
                sent[topic.name, part.index] = crcs
    return sent


def _note_acked(sent: dict[tuple[str, int], set[int]], response: Any) -> None:
    for topic in response.responses:
        for part in topic.partition_responses:
            crcs = sent.get((topic.name, part.index))
            if part.error_code == 0 and crcs is not None:
                SENT.acked.append((topic.name, part.index, part.base_offset, crcs))


# --- the tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def up(shared_up: UpProcess) -> UpProcess:
    """The shared cluster with the fuzzed topics (deleted by ``shared_up`` at the end)."""
    admin = AdminClient({"bootstrap.servers": shared_up.bootstrap})
    topics = [
        NewTopic(TOPIC, num_partitions=2, replication_factor=3),
        NewTopic(
            COMPACTED,
            num_partitions=1,
            replication_factor=3,
            config={"cleanup.policy": "compact"},
        ),
    ]
    for future in admin.create_topics(topics, operation_timeout=30).values():
        future.result(timeout=TIMEOUT_S)
    producer = Producer({"bootstrap.servers": shared_up.bootstrap, "message.timeout.ms": 120000})
    for topic, partitions in DATA_TOPICS.items():  # every partition has a leader that writes
        for p in range(partitions):
            producer.produce(topic, b"v", key=b"k", partition=p)
    assert producer.flush(180) == 0
    # A client finds its transaction coordinator before it asks it anything, and that creates
    # __transaction_state; the fuzzer's requests skip that step, so take it here.
    transactional = Producer(
        {"bootstrap.servers": shared_up.bootstrap, "transactional.id": "fuzz-set-up"}
    )
    transactional.init_transactions(TIMEOUT_S)
    return shared_up


def _fuzz(up: UpProcess, strategy: st.SearchStrategy[Request], examples: int) -> None:
    """Send ``examples`` requests drawn from ``strategy``, each to a broker of its own (a
    Produce aimed at a partition to its leader), and check each answer."""
    listed = AdminClient({"bootstrap.servers": up.bootstrap}).list_topics(timeout=TIMEOUT_S)
    leaders = {
        (topic, p): listed.topics[topic].partitions[p].leader
        for topic, partitions in DATA_TOPICS.items()
        for p in range(partitions)
    }

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(request=strategy, broker=st.sampled_from(BROKERS))
    def exchange(request: Request, broker: int) -> None:
        api_key, version, message = request.api_key, request.version, request.message
        if request.leader_of is not None:
            broker = leaders[request.leader_of]
        sent = _note_sent(message) if api_key == PRODUCE else {}
        response = _exchange(_port(up, broker), api_key, version, message)
        if response is None:
            return
        errors = list(_error_codes(response.to_dict()))
        assert UNKNOWN_SERVER_ERROR not in errors, (api_key, version, response)
        if api_key == PRODUCE:
            _note_acked(sent, response)
        SENT.requests[api_key] = SENT.requests.get(api_key, 0) + 1

    exchange()


def test_random_requests_of_every_api_are_answered(up: UpProcess) -> None:
    versions = _advertised(up)
    _fuzz(up, requests(versions), EXAMPLES)
    # The runs reached what they claim to: most of the APIs.
    assert len(SENT.requests) >= len(versions) * 2 // 3, (sorted(SENT.requests), versions)


def test_random_batches_are_answered_and_the_acknowledged_ones_appended(up: UpProcess) -> None:
    _fuzz(up, data_produce(_advertised(up)[PRODUCE]), BATCH_EXAMPLES)
    assert len(SENT.acked) >= 10, SENT.acked  # the runs appended batches, to check below


def _stored(up: UpProcess, topic: str, partition: int) -> dict[int, int]:
    """base offset -> CRC of every batch of the partition, each checked whole."""
    consumer = Consumer({"bootstrap.servers": up.bootstrap, "group.id": "fuzz-read"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), TIMEOUT_S)
    finally:
        consumer.close()
    fetch = codec.request_class(FETCH)
    stored: dict[int, int] = {}
    offset = low
    while offset < high:
        request = fetch(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            topics=[
                fetch.FetchTopic(
                    topic=topic,
                    partitions=[
                        fetch.FetchTopic.FetchPartition(
                            partition=partition,
                            fetch_offset=offset,
                            log_start_offset=-1,
                            partition_max_bytes=1 << 20,
                        )
                    ],
                )
            ],
        )
        answers = [_exchange(_port(up, b), FETCH, 4, request) for b in BROKERS]
        records = [
            p.records
            for a in answers
            for t in a.responses
            for p in t.partitions
            if p.error_code == 0 and p.records
        ]
        assert records, f"no broker served {topic}-{partition} at {offset}"
        for pos, header in rb.iter_batches(records[0]):
            rb.verify_crc(records[0], pos, header)
            stored[header.base_offset] = header.crc
            offset = max(offset, header.next_offset)
    return stored


def test_the_logs_hold_exactly_what_was_acknowledged(up: UpProcess) -> None:
    for topic, partitions in DATA_TOPICS.items():
        for partition in range(partitions):
            stored = _stored(up, topic, partition)  # every batch whole, on either topic
            if topic == COMPACTED:
                continue  # the cleaner rewrites its batches (test_compaction_live checks it)
            foreign = {o: c for o, c in stored.items() if c not in SENT.crcs[topic]}
            # The set-up's one record per partition is the only batch the fuzzer did not send.
            assert len(foreign) <= 1, (topic, partition, foreign)
            for acked_topic, p, offset, crcs in SENT.acked:
                if (acked_topic, p) == (topic, partition):
                    assert stored.get(offset) in crcs, (topic, partition, offset)
    consumer = Consumer(
        {
            "bootstrap.servers": up.bootstrap,
            "group.id": "fuzz-read-all",
            "enable.auto.commit": False,
            "check.crcs": True,
        }
    )
    try:  # a consumer reads every partition to its end: no batch stops it
        ends = {
            (t, p): consumer.get_watermark_offsets(TopicPartition(t, p), TIMEOUT_S)[1]
            for t, partitions in DATA_TOPICS.items()
            for p in range(partitions)
        }
        consumer.assign([TopicPartition(t, p, 0) for t, p in ends])
        positions = dict.fromkeys(ends, 0)
        while any(positions[k] < ends[k] for k in ends):  # bounded: each poll gets a record
            message = consumer.poll(TIMEOUT_S)
            assert message is not None, f"no record within {TIMEOUT_S} s: at {positions}"
            assert message.error() is None, message.error()
            positions[message.topic(), message.partition()] = message.offset() + 1
    finally:
        consumer.close()
    for broker in BROKERS:  # every gateway still answers
        with socket.create_connection((HOST, _port(up, broker)), timeout=TIMEOUT_S) as sock:
            sock.sendall(api_versions_v0_frame(5))
            assert struct.unpack(">i", read_frame(sock)[:4])[0] == 5


def _records_that_do_not_parse() -> bytes:
    batch = kafka_batch([{"key": b"k", "value": b"v", "timestamp": 0, "headers": []}], 0)
    garbage = bytearray(batch[: rb.HEADER_SIZE]) + b"\x99 not records"
    struct.pack_into(">i", garbage, 8, len(garbage) - rb.LOG_OVERHEAD)
    return _with_crc(garbage)


def _gzip_that_does_not_inflate() -> bytes:
    batch = kafka_batch([{"key": b"k", "value": b"v", "timestamp": 0, "headers": []}], 1)
    junk = bytearray(batch[: rb.HEADER_SIZE]) + b"not gzip at all"
    struct.pack_into(">i", junk, 8, len(junk) - rb.LOG_OVERHEAD)
    return _with_crc(junk)


@pytest.mark.parametrize(
    "batch",
    [_records_that_do_not_parse(), _gzip_that_does_not_inflate(), _bomb(200 << 20)],
    ids=["records-that-do-not-parse", "gzip-that-does-not-inflate", "decompression-bomb"],
)
def test_a_batch_whose_records_do_not_parse_is_refused(up: UpProcess, batch: bytes) -> None:
    cls = codec.request_class(PRODUCE)
    part = cls.TopicProduceData.PartitionProduceData(index=0, records=batch)
    message = cls(
        transactional_id=None,
        acks=-1,
        timeout_ms=WAITS_MS[PRODUCE, "timeout_ms"],
        topic_data=[cls.TopicProduceData(name=TOPIC, partition_data=[part])],
    )
    answers = []
    for broker in BROKERS:  # the leader's answer; the others say they do not lead it (6)
        response = _exchange(_port(up, broker), PRODUCE, 7, message)
        errors = [p.error_code for t in response.responses for p in t.partition_responses]
        if errors != [6]:
            answers.append(errors)
    assert answers == [[2]], answers  # CORRUPT_MESSAGE, from the leader alone
