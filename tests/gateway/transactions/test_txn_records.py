"""``__transaction_state`` record formats: Kafka's TransactionLogKey and TransactionLogValue.

Proves: keys and values of both value versions round-trip; the bytes are Kafka's layouts
(checked against a key, a version 0 value and a version 1 value with a tagged field, built by
hand from Kafka's JSON schemas); an Empty transaction's partitions are a null array; unknown
tags are skipped; truncated, trailing, unknown-version, unknown-status, non-UTF-8 and
oversized-count bytes raise RecordFormatError, and so does every random byte string that is
not a record (never another exception).
"""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raylog.gateway.transactions import records as tr
from raylog.gateway.transactions.records import TransactionStatus

ONGOING = tr.TransactionLogValue(
    producer_id=7,
    producer_epoch=3,
    transaction_timeout_ms=60_000,
    transaction_status=TransactionStatus.ONGOING,
    transaction_partitions=(("orders", (0, 2)),),
    transaction_last_update_timestamp_ms=1_700_000_000_123,
    transaction_start_timestamp_ms=1_700_000_000_000,
)

# TransactionLogValue v0 by hand: version, producer_id, producer_epoch, timeout, status,
# partitions [topic string, [int32]], last update, start.
ONGOING_V0 = (
    b"\x00\x00"
    + struct.pack(">qhib", 7, 3, 60_000, 1)
    + struct.pack(">i", 1)
    + b"\x00\x06orders"
    + struct.pack(">iii", 2, 0, 2)
    + struct.pack(">qq", 1_700_000_000_123, 1_700_000_000_000)
)

# v1 (flexible): compact array (n + 1), compact string (len + 1), compact int32 array, the
# entry's empty tagged fields, timestamps, then one tagged field: tag 0 (previous producer id),
# 8 bytes.
ONGOING_V1 = (
    b"\x00\x01"
    + struct.pack(">qhib", 7, 3, 60_000, 1)
    + b"\x02"
    + b"\x07orders"
    + b"\x03"
    + struct.pack(">ii", 0, 2)
    + b"\x00"
    + struct.pack(">qq", 1_700_000_000_123, 1_700_000_000_000)
    + b"\x01\x00\x08"
    + struct.pack(">q", 6)
)


def test_key_bytes_are_kafkas() -> None:
    key = tr.encode_key(tr.TransactionLogKey("payments-1"))
    assert key == b"\x00\x00\x00\x0apayments-1"
    assert tr.decode_key(key) == tr.TransactionLogKey("payments-1")


def test_a_version_0_value_is_kafkas_layout() -> None:
    assert tr.encode_value(ONGOING) == ONGOING_V0
    assert tr.decode_value(ONGOING_V0) == ONGOING


def test_a_version_1_value_is_kafkas_flexible_layout_with_its_tagged_field() -> None:
    value = ONGOING._replace(previous_producer_id=6)
    assert tr.encode_value(value, version=1) == ONGOING_V1
    assert tr.decode_value(ONGOING_V1) == value
    # version 0 has no place for the tagged fields: they read back as their defaults
    assert tr.decode_value(tr.encode_value(value, version=0)) == ONGOING


def test_an_empty_transactions_partitions_are_a_null_array() -> None:
    empty = ONGOING._replace(
        transaction_status=TransactionStatus.EMPTY,
        transaction_partitions=None,
        transaction_start_timestamp_ms=-1,
    )
    v0 = tr.encode_value(empty)
    assert v0[17:21] == struct.pack(">i", -1)
    v1 = tr.encode_value(empty, version=1)
    assert v1[17] == 0  # compact null
    assert tr.decode_value(v0) == tr.decode_value(v1) == empty


def test_unknown_tags_are_skipped() -> None:
    data = ONGOING_V1[:-11] + b"\x02\x00\x08" + struct.pack(">q", 6) + b"\x09\x02\xff\xff"
    assert tr.decode_value(data).previous_producer_id == 6


names = st.text(max_size=20)
partitions = st.lists(st.tuples(names, st.lists(st.integers(0, 2**31 - 1), max_size=5)), max_size=4)
int64 = st.integers(-(2**63), 2**63 - 1)


@given(
    version=st.sampled_from(tr.VALUE_VERSIONS),
    producer_id=int64,
    epoch=st.integers(-1, 2**15 - 1),
    timeout_ms=st.integers(-(2**31), 2**31 - 1),
    status=st.sampled_from(TransactionStatus),
    parts=st.none() | partitions,
    last_update=int64,
    start=int64,
    previous=int64,
    next_id=int64,
    client_version=st.integers(-(2**15), 2**15 - 1),
)
def test_values_round_trip(
    version: int,
    producer_id: int,
    epoch: int,
    timeout_ms: int,
    status: TransactionStatus,
    parts: list[tuple[str, list[int]]] | None,
    last_update: int,
    start: int,
    previous: int,
    next_id: int,
    client_version: int,
) -> None:
    value = tr.TransactionLogValue(
        producer_id,
        epoch,
        timeout_ms,
        status,
        None if parts is None else tuple((t, tuple(ids)) for t, ids in parts),
        last_update,
        start,
        *((previous, next_id, client_version) if version else ()),
    )
    assert tr.decode_value(tr.encode_value(value, version)) == value


@given(names)
def test_keys_round_trip(transactional_id: str) -> None:
    key = tr.TransactionLogKey(transactional_id)
    assert tr.decode_key(tr.encode_key(key)) == key


@pytest.mark.parametrize("good", [ONGOING_V0, ONGOING_V1])
def test_every_truncation_is_a_format_error(good: bytes) -> None:
    for end in range(len(good)):
        with pytest.raises(tr.RecordFormatError):
            tr.decode_value(good[:end])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (ONGOING_V0 + b"\x00", "after the record's end"),
        (b"\x00\x02" + ONGOING_V0[2:], "unknown TransactionLogValue version 2"),
        (ONGOING_V0[:16] + b"\x08" + ONGOING_V0[17:], "unknown transaction status 8"),
        (ONGOING_V0[:17] + struct.pack(">i", 2**30) + ONGOING_V0[21:], "runs past"),
        (ONGOING_V0[:21] + b"\xff\xff" + ONGOING_V0[23:], "null string"),
        (ONGOING_V0[:23] + b"\xff" + ONGOING_V0[24:], "not UTF-8"),
        (ONGOING_V1[:-11] + b"\x01\x00\x04" + b"\x00" * 4, "tagged field 0 has 4 bytes"),
        (ONGOING_V1[:-11] + b"\xff\xff\xff\xff\x7f", "tagged fields"),
    ],
)
def test_malformed_values_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(tr.RecordFormatError, match=message):
        tr.decode_value(data)


def test_malformed_keys_say_what_is_wrong() -> None:
    with pytest.raises(tr.RecordFormatError, match="key version 1"):
        tr.decode_key(b"\x00\x01\x00\x01a")
    with pytest.raises(tr.RecordFormatError, match="runs past"):
        tr.decode_key(b"\x00\x00\x00\x05ab")
    with pytest.raises(tr.RecordFormatError, match="after the record's end"):
        tr.decode_key(b"\x00\x00\x00\x01ab")


def test_values_cannot_be_written_in_an_unknown_version() -> None:
    with pytest.raises(tr.RecordFormatError, match="no version 2"):
        tr.encode_value(ONGOING, version=2)
    with pytest.raises(tr.RecordFormatError, match="longer than 32767"):
        tr.encode_key(tr.TransactionLogKey("x" * 40_000))


@given(st.binary(max_size=80))
def test_random_bytes_are_a_record_or_a_format_error(data: bytes) -> None:
    for decode in (tr.decode_key, tr.decode_value):
        with contextlib.suppress(tr.RecordFormatError):
            decode(data)
