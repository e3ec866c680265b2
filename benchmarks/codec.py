"""Measure the gateway's codec on the broker side; print one JSON document (µs per operation).

Paths measured, each the broker's half of a real exchange:

- ``produce_v7_1mib_decode``: header + body of a Produce v7 request carrying one 1 MiB batch,
  through ``codec.parse_request_header`` and ``codec.decode_request`` (what the gateway runs);
  ``..._kafka_python_decode`` is kafka-python's own ``ProduceRequest.decode(header=True)`` for
  comparison (it copies the frame into a BytesIO to read the header).
- ``produce_v7_1mib_connection``: the same frame through ``Connection.receive_data`` and
  ``next_event`` (framing, admission, header, body), from a fresh connection, so the frame
  buffer is freshly allocated as in the server; ``baseline_fresh_1mib_bytearray`` (one copy
  into a new 1 MiB buffer) shows that one allocation alone is cheap: see finding (1) below.
- ``fetch_v11_1mib_encode``: a framed Fetch v11 response with one partition carrying 1 MiB.
- ``metadata_v5_1000_partitions_build`` / ``_encode``: building the response objects the way the
  Metadata handler does, then encoding the frame.
- ``small_request_decode``: Metadata v5 naming two topics, and Produce v7 with a 100-byte batch.

Run: ``.venv/bin/python benchmarks/codec.py``. The run that chose the codec (2 shared cores,
CPython 3.11.7, kafka-python 3.0.12), in µs: Produce v7 1 MiB decode 38-47 (kafka-python's own
``decode(header=True)`` 1700-2800), through the Connection 1150-1730, small Produce 7-11, small
Metadata request 6-10, Fetch v11 1 MiB encode 100-120, Metadata v5 1000 partitions build
3600-6700 plus encode 2800-5000 (the spread is other jobs sharing the two cores).

Two findings. (1) The Connection figure is not decoding: glibc serves allocations above 128 KiB
with mmap or trims them back to the OS on free, so when frame-sized buffers are allocated and
freed in turn (the frame, then the decoded records' copy), each is page-faulted in anew. With
``MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456`` in the environment the same
path takes about 80 µs; the gateway's process should be started with them.
(2) Metadata with 1000 partitions costs 6-12 ms, mostly building and walking kafka-python's
objects. Metadata changes rarely, so the fix is a per-(version, metadata epoch) cache of the
encoded topic entries rather than a hand-written encoder.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import kafka
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest

from raylog.gateway import codec
from raylog.gateway.protocol import Connection

MIB = 1024 * 1024


def per_op_us(fn: Callable[[], Any], *, min_total_s: float = 0.3, repeats: int = 5) -> float:
    """Median over ``repeats`` runs of the mean time per call, in microseconds."""
    fn()  # warm: compile the codec's per-version encoder/decoder
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_total_s / repeats or n >= 1 << 20:
            break
        n *= 2
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return round(statistics.median(samples), 2)


def produce_frame(batch_bytes: int) -> bytes:
    request = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=30000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="orders",
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(
                        index=0, records=b"\x00" * batch_bytes
                    )
                ],
            )
        ],
    )
    request.API_VERSION = 7
    request.with_header(correlation_id=1, client_id="bench")
    return bytes(request.encode(version=7, header=True, framed=True))


def decode_frame(frame: bytes) -> Any:
    view = memoryview(frame)[4:]
    header, offset = codec.parse_request_header(view)
    return codec.decode_request(header.api_key, header.api_version, view[offset:])


def main() -> None:
    results: dict[str, float] = {}

    big = produce_frame(MIB)
    decoded = decode_frame(big)
    assert len(decoded.topic_data[0].partition_data[0].records) == MIB
    results["produce_v7_1mib_decode"] = per_op_us(lambda: decode_frame(big))
    results["produce_v7_1mib_kafka_python_decode"] = per_op_us(
        lambda: ProduceRequest.decode(big[4:], version=7, header=True)
    )

    def through_connection() -> None:
        connection = Connection({0: (3, 7)})
        connection.receive_data(big)
        connection.next_event()

    results["produce_v7_1mib_connection"] = per_op_us(through_connection)
    # Baseline for the line above: a fresh 1 MiB buffer filled once. On this kind of VM the
    # first touch of freshly mapped pages dominates any path that allocates a frame-sized buffer.
    results["baseline_fresh_1mib_bytearray"] = per_op_us(lambda: bytearray(big))

    small_produce = produce_frame(100)
    results["produce_v7_small_decode"] = per_op_us(lambda: decode_frame(small_produce))
    metadata_request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in ("orders", "events")],
        allow_auto_topic_creation=False,
    )
    metadata_request.API_VERSION = 5
    metadata_request.with_header(correlation_id=2, client_id="bench")
    small_metadata = bytes(metadata_request.encode(version=5, header=True, framed=True))
    results["metadata_v5_request_decode"] = per_op_us(lambda: decode_frame(small_metadata))

    partition = FetchResponse.FetchableTopicResponse.PartitionData
    fetch = FetchResponse(
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[
            FetchResponse.FetchableTopicResponse(
                topic="orders",
                partitions=[
                    partition(
                        partition_index=0,
                        error_code=0,
                        high_watermark=1000,
                        last_stable_offset=1000,
                        log_start_offset=0,
                        aborted_transactions=[],
                        preferred_read_replica=-1,
                        records=b"\x00" * MIB,
                    )
                ],
            )
        ],
    )
    assert len(codec.encode_response(1, 11, 3, fetch)) > MIB
    results["fetch_v11_1mib_encode"] = per_op_us(lambda: codec.encode_response(1, 11, 3, fetch))

    topic_cls = MetadataResponse.MetadataResponseTopic
    partition_cls = topic_cls.MetadataResponsePartition
    broker_cls = MetadataResponse.MetadataResponseBroker

    def build_metadata() -> Any:
        return MetadataResponse(
            throttle_time_ms=0,
            brokers=[
                broker_cls(node_id=n, host="127.0.0.1", port=9092, rack=None) for n in (1, 2, 3)
            ],
            cluster_id="bench",
            controller_id=1,
            topics=[
                topic_cls(
                    error_code=0,
                    name=f"topic-{t}",
                    is_internal=False,
                    partitions=[
                        partition_cls(
                            error_code=0,
                            partition_index=p,
                            leader_id=1 + p % 3,
                            leader_epoch=0,
                            replica_nodes=[1, 2, 3],
                            isr_nodes=[1, 2, 3],
                            offline_replicas=[],
                        )
                        for p in range(100)
                    ],
                )
                for t in range(10)
            ],
        )

    metadata = build_metadata()
    results["metadata_v5_1000_partitions_build"] = per_op_us(build_metadata)
    results["metadata_v5_1000_partitions_encode"] = per_op_us(
        lambda: codec.encode_response(3, 5, 4, metadata)
    )

    print(
        json.dumps(
            {
                "unit": "microseconds per operation",
                "python": sys.version.split()[0],
                "machine": platform.machine(),
                "kafka_python": kafka.__version__,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
