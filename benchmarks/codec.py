"""The gateway's codec on the broker side, beside kafka-python's own decoder; print one JSON
document (µs per operation).

Paths measured, each the broker's half of a real exchange, timed in this process (the median
of five runs of the mean time per call):

- ``produce_v7_1mib_decode``: header + body of a Produce v7 request carrying one 1 MiB batch,
  through ``codec.parse_request_header`` and ``codec.decode_request`` (what the gateway runs);
  ``produce_v7_1mib_kafka_python_decode`` is kafka-python's own
  ``ProduceRequest.decode(header=True)`` for comparison (it copies the frame into a BytesIO to
  read the header).
- ``produce_v7_1mib_connection``: the same frame through ``Connection.receive_data`` and
  ``next_event`` (framing, admission, header, body), from a fresh connection, so the frame
  buffer is freshly allocated as in the server; ``baseline_fresh_1mib_bytearray`` (one copy
  into a new 1 MiB buffer) is the cost of that allocation alone. With glibc's default malloc
  thresholds a frame-sized buffer is mapped and page-faulted in anew each time, which the
  cluster's processes avoid with ``raycluster.MALLOC_ENV``; run this script with those
  variables set to see the gateway's cost.
- ``fetch_v11_1mib_encode``: a framed Fetch v11 response with one partition carrying 1 MiB.
- ``metadata_v5_1000_partitions_build`` / ``_encode``: building the response objects the way the
  Metadata handler does, then encoding the frame.
- ``produce_v7_small_decode`` (a 100-byte batch) and ``metadata_v5_request_decode`` (Metadata
  v5 naming two topics): the fixed cost of small requests.

    .venv/bin/python benchmarks/codec.py

JSON fields: ``unit``, ``python``, ``machine``, ``kafka_python`` (its version) and
``results``, one number per path above.
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
    # Baseline for the line above: a fresh 1 MiB buffer filled once. The first touch of freshly
    # mapped pages dominates any path that allocates a frame-sized buffer.
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
