"""RequestStats: what one gateway counts for the metrics endpoint (no I/O, no clock inside).

Kafka's RequestMetrics and BytesIn/BytesOut, reduced to what an operator graphs: per API key,
how many requests were answered and a cumulative latency histogram; per gateway, the bytes read
from and written to client sockets. The server feeds it durations it measured; ``snapshot()``
returns plain data that crosses Ray and becomes Prometheus families in
``raylog.actors.cluster.metrics``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LATENCY_BUCKETS_S", "RequestStats"]

# Upper bounds (seconds) of the latency buckets; +Inf is implied. From 0.5 ms (a Metadata answer)
# to 10 s (a long-polling Fetch waits up to its max_wait_ms).
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


@dataclass
class _ApiStats:
    count: int = 0
    sum_s: float = 0.0
    # bucket_counts[i]: requests with latency <= LATENCY_BUCKETS_S[i] and > the bound before;
    # the last slot is +Inf.
    bucket_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))


class RequestStats:
    """Counters of one gateway since it started; only ever grow."""

    def __init__(self) -> None:
        self._apis: dict[int, _ApiStats] = {}
        self.bytes_in = 0
        self.bytes_out = 0

    def received(self, nbytes: int) -> None:
        self.bytes_in += nbytes

    def answered(self, api_key: int, latency_s: float, response_bytes: int) -> None:
        """One request answered after ``latency_s`` with ``response_bytes`` on the wire."""
        stats = self._apis.get(api_key)
        if stats is None:
            stats = self._apis[api_key] = _ApiStats()
        latency_s = max(0.0, latency_s)
        stats.count += 1
        stats.sum_s += latency_s
        stats.bucket_counts[bisect.bisect_left(LATENCY_BUCKETS_S, latency_s)] += 1
        self.bytes_out += response_bytes

    def snapshot(self) -> dict[str, Any]:
        """Plain data: ``requests[api_key]`` has ``count``, ``sum_s`` and ``buckets``, a list of
        (upper bound, cumulative count) ending with ("+Inf", count), as Prometheus wants."""
        requests = {}
        for api_key, stats in sorted(self._apis.items()):
            cumulative, buckets = 0, []
            for bound, n in zip((*LATENCY_BUCKETS_S, "+Inf"), stats.bucket_counts, strict=True):
                cumulative += n
                buckets.append((str(bound), cumulative))
            requests[api_key] = {"count": stats.count, "sum_s": stats.sum_s, "buckets": buckets}
        return {"bytes_in": self.bytes_in, "bytes_out": self.bytes_out, "requests": requests}
