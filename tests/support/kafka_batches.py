"""Record batches as kafka-python's producer builds them, for tests at any layer.

kafka-python compresses with the optional packages the test extra installs (python-snappy,
lz4, zstandard); tests/support/pipelines.py's ``kafka_codecs()`` stands in for any that
are missing.
"""

from __future__ import annotations

from typing import Any

from kafka.record import default_records as kdr

from raylog.storage import batch as rb


def kafka_batch(
    recs: list[dict[str, Any]],
    codec: int,
    base_offset: int = 0,
    *,
    transactional: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """One batch of ``recs`` (dicts of key, value, timestamp, headers) compressed with ``codec``
    (kafka-python's ``DefaultRecordBatch.CODEC_*``), from an idempotent or transactional
    producer when given its id, epoch and first sequence."""
    builder = kdr.DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for i, r in enumerate(recs):
        builder.append(i, r["timestamp"], r["key"], r["value"], r["headers"])
    buf = bytearray(builder.build())
    rb.set_base_offset(buf, 0, base_offset)
    return bytes(buf)
