"""What a replica actor serves to consumers, read back through its ``fetch`` (tests of replica
actors on real Ray, without gateways)."""

from __future__ import annotations

from typing import Any

import ray

from raylog.storage import batch as rb

CALL_TIMEOUT_S = 30.0


def served_batches(replica: Any, upto: int) -> bytes:
    """Every batch below ``upto`` (at most the replica's high watermark) as this replica
    serves it to consumers, back to back."""
    out = bytearray()
    offset = 0
    while offset < upto:  # bounded: every fetch moves the offset or fails the test
        fetched = ray.get(replica.fetch.remote(offset, 1 << 20), timeout=CALL_TIMEOUT_S)
        assert fetched.error_code == 0, fetched
        assert fetched.records, f"no data at {offset} below {upto}"
        for pos, header in rb.iter_batches(fetched.records):
            if header.base_offset >= offset:
                out += fetched.records[pos : pos + header.size]
            offset = max(offset, header.next_offset)
    return bytes(out)
