"""Unit tests of the byte checks of a mirror append (``replica_mirror.mirrored_batches``): what
a mirror leader takes from a source Fetch's bytes, and how it restamps them; no Ray.

The claims: every whole batch is taken with its metadata (offsets, producer fields, a
transaction marker's type) and only its partition-leader-epoch changed, so its CRC still
holds; a trailing partial batch is left out silently; a batch with a bad CRC, magic or length,
or offsets out of order, stops the walk with a message naming it, the batches before it taken;
at most MAX_BATCHES_PER_MESSAGE batches are taken from one call.
"""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch
from support.kafka_batches import kafka_batch

from raylog.actors.replica_mirror import mirrored_batches
from raylog.actors.replication.replica_state import MAX_BATCHES_PER_MESSAGE
from raylog.actors.replication.txn_state import CONTROL_COMMIT, NOT_CONTROL
from raylog.storage import batch as rb

RECS = [
    {"key": b"k%d" % i, "value": b"v" * 50, "timestamp": 1_000 + i, "headers": [("h", b"x")]}
    for i in range(5)
]


def source_log() -> list[bytes]:
    """A source's batches: plain, gzip and transactional, with a gap, and a COMMIT marker."""
    marker = rb.build_batch(
        [rb.end_txn_marker_record(True, 3, 2_000)],
        base_offset=20,
        producer_id=9,
        producer_epoch=1,
        transactional=True,
        control=True,
    )
    batches = [
        kafka_batch(RECS, DefaultRecordBatch.CODEC_NONE, base_offset=0),
        kafka_batch(RECS, DefaultRecordBatch.CODEC_GZIP, base_offset=5),
        kafka_batch(
            RECS,
            DefaultRecordBatch.CODEC_NONE,
            base_offset=12,
            transactional=True,
            producer_id=9,
            producer_epoch=1,
            base_sequence=0,
        ),
        marker,
    ]
    for i, data in enumerate(batches):
        stamped = bytearray(data)
        rb.set_partition_leader_epoch(stamped, 0, 40 + i)  # the source's epochs
        batches[i] = bytes(stamped)
    return batches


def test_whole_batches_are_taken_with_only_their_epoch_restamped() -> None:
    source = source_log()
    taken, corrupt = mirrored_batches(b"".join(source), 7)
    assert corrupt == ""
    assert [(b.meta.base_offset, b.meta.next_offset) for b in taken] == [
        (0, 5),
        (5, 10),
        (12, 17),
        (20, 21),
    ]
    for original, batch in zip(source, taken, strict=True):
        data = bytes(batch.data)
        assert batch.meta.leader_epoch == 7 == rb.parse_header(data).partition_leader_epoch
        assert data[:12] + data[16:] == original[:12] + original[16:]  # all but the epoch
        assert rb.crc_ok(data, 0, rb.parse_header(data))
    txn, marker = taken[2].meta, taken[3].meta
    assert (txn.producer_id, txn.is_transactional, txn.control_type) == (9, True, NOT_CONTROL)
    assert (marker.control_type, marker.coordinator_epoch) == (CONTROL_COMMIT, 3)


@pytest.mark.parametrize("cut", [1, 30, rb.HEADER_SIZE, rb.HEADER_SIZE + 10])
def test_a_trailing_partial_batch_is_left_out(cut: int) -> None:
    source = source_log()
    data = b"".join(source[:2]) + source[2][:cut]
    taken, corrupt = mirrored_batches(data, 7)
    assert corrupt == "" and [b.meta.base_offset for b in taken] == [0, 5]


def test_a_corrupt_batch_stops_the_walk_and_the_batches_before_it_are_taken() -> None:
    source = source_log()
    bad_crc = bytearray(source[1])
    bad_crc[-1] ^= 0xFF
    bad_magic = bytearray(source[1])
    bad_magic[rb.MAGIC_POS] = 1
    bad_length = bytearray(source[1])
    bad_length[rb.BATCH_LENGTH_POS : rb.BATCH_LENGTH_POS + 4] = (10).to_bytes(4, "big")
    for bad, says in (
        (bad_crc, "fails its CRC-32C"),
        (bad_magic, "magic 1"),
        (bad_length, "record batch length 10"),
    ):
        taken, corrupt = mirrored_batches(source[0] + bytes(bad) + source[2], 7)
        assert [b.meta.base_offset for b in taken] == [0]
        assert corrupt.startswith("batch with base offset 5: ") and says in corrupt


def test_batches_out_of_offset_order_are_corrupt() -> None:
    source = source_log()
    taken, corrupt = mirrored_batches(source[1] + source[0], 7)
    assert [b.meta.base_offset for b in taken] == [5]
    assert "offsets [0, 5) out of order (the previous batch ends at 10)" in corrupt


def test_at_most_max_batches_per_message_are_taken() -> None:
    one = rb.build_batch([rb.Record(None, b"v", 0)])
    data = bytearray()
    for offset in range(MAX_BATCHES_PER_MESSAGE + 3):
        stamped = bytearray(one)
        rb.set_base_offset(stamped, 0, offset)
        data += stamped
    taken, corrupt = mirrored_batches(bytes(data), 7)
    assert corrupt == "" and len(taken) == MAX_BATCHES_PER_MESSAGE
    assert taken[-1].meta.next_offset == MAX_BATCHES_PER_MESSAGE
