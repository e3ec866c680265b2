"""The record layout (raylog.storage.records): its varint codec and its walks of a records section.

Proves:

- varints: every int64 goes through ``write_varint`` / ``read_varint`` unchanged, written byte
  for byte as kafka-python writes it; ``read_uvarint`` refuses an eleventh byte, a tenth byte
  past the 64th bit, a varint running past its end, and one longer than ``max_bytes``; the
  tables the walks read one- and two-byte varints from hold what ``read_varint`` reads;
- on random batches as kafka-python's producer builds them (null and empty keys and values,
  timestamp deltas of one to ten bytes, headers with null values and non-ASCII keys),
  ``iter_decoded`` gives back every field put in, and ``record_fields``, ``iter_records`` and
  ``record_ends`` walk the same records; ``encode_record`` writes what kafka-python writes;
- on corrupt sections (bytes flipped, cut short, random), every walk returns or raises
  CorruptRecordError and nothing else; whatever kafka-python's decoder refuses,
  ``iter_decoded`` refuses too (the group coordinator's decoding loses none of its checks),
  and where both decode, they decode the same records;
- ``restamp_record`` changes a record's timestamp delta and nothing else;
- ``check_records``, the broker's check of a produced batch, passes every producer's batch
  and refuses what ``iter_decoded`` refuses (but for header keys that are not UTF-8, which
  Kafka's reader takes), in C and in its Python twin alike, on valid, corrupt and random
  sections; ``check_client_records`` refuses a batch whose records do not parse under a CRC
  that matches, one whose compressed data does not decompress, and one that inflates past
  its bound, and passes valid batches in every codec;
- the C scanner was built by the install (the broker would check in Python otherwise).
"""

from __future__ import annotations

import contextlib
import gzip
import struct
from collections.abc import Callable
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import encode_varint
from support.kafka_batches import kafka_batch

from raylog.storage import batch as rb
from raylog.storage import records as rr
from raylog.storage.errors import CorruptRecordError

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BASE_TS = 1_700_000_000_000
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)

# ---------------------------------------------------------------------------------------------
# Varints.


@SETTINGS
@given(value=INT64)
def test_varints_round_trip_as_kafka_python_writes_them(value: int) -> None:
    out = bytearray()
    rr.write_varint(value, out)
    theirs = bytearray()
    encode_varint(value, theirs.append)
    assert out == theirs
    assert rr.read_varint(bytes(out), 0, len(out)) == (value, len(out))
    assert rr.read_varint(bytes(out) + b"\x00", 0, len(out) + 1) == (value, len(out))


def test_varint_limits() -> None:
    ten = b"\xff" * 9 + b"\x01"  # 64 bits: the most a varint holds
    assert rr.read_uvarint(ten, 0, 10) == ((1 << 64) - 1, 10)
    refused = [
        (b"\xff" * 9 + b"\x02", 10),  # a 65th bit
        (b"\x80" * 10 + b"\x00", 11),  # eleven bytes
        (b"\x80\x80", 2),  # runs past its end
        (b"\x80\x00", 1),  # ends past the given end
        (b"", 0),
    ]
    for data, end in refused:
        with pytest.raises(CorruptRecordError):
            rr.read_uvarint(data, 0, end)
    assert rr.read_uvarint(b"\x80\x80\x80\x80\x0f", 0, 5, max_bytes=5) == (0xF << 28, 5)
    with pytest.raises(CorruptRecordError, match="longer than 5 bytes"):
        rr.read_uvarint(b"\x80" * 5 + b"\x00", 0, 6, max_bytes=5)


def test_the_short_varint_tables_hold_what_read_varint_reads() -> None:
    one, two = rr._short_varints()
    for first in range(0x100):
        if first < 0x80:
            assert one[first] == rr.read_varint(bytes((first,)), 0, 1)
        else:
            assert one[first] is None
    for index, entry in enumerate(two):
        pair = bytes((index & 0xFF, index >> 8))
        if index & 0x80 and not index & 0x8000:  # exactly two bytes
            assert entry == rr.read_varint(pair, 0, 2)
        else:
            assert entry is None


# ---------------------------------------------------------------------------------------------
# Walks over producer batches.

_timestamp_deltas = st.one_of(
    st.integers(-100, 100), st.integers(-(1 << 40), 1 << 40), st.integers(-(1 << 62), 1 << 62)
)
_record = st.fixed_dictionaries(
    {
        "key": st.none() | st.binary(max_size=20),
        "value": st.none() | st.binary(max_size=300),
        "timestamp": _timestamp_deltas.map(lambda d: BASE_TS + d),
        "headers": st.lists(
            st.tuples(
                st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=6),
                st.none() | st.binary(max_size=12),
            ),
            max_size=3,
        ),
    }
)


def producer_batch(recs: list[dict[str, Any]]) -> tuple[bytes, bytes, rb.BatchHeader]:
    """An uncompressed batch as kafka-python's producer builds it: (batch, section, header)."""
    batch = kafka_batch(recs, DefaultRecordBatch.CODEC_NONE)
    header = rb.parse_header(batch)
    return batch, batch[rb.HEADER_SIZE :], header


@SETTINGS
@given(recs=st.lists(_record, min_size=1, max_size=20))
def test_walks_give_back_what_the_producer_put_in(recs: list[dict[str, Any]]) -> None:
    _, section, header = producer_batch(recs)
    count = header.records_count
    base = recs[0]["timestamp"]
    decoded = list(rr.iter_decoded(section, count))
    assert decoded == [
        (i, r["timestamp"] - base, r["key"], r["value"], r["headers"]) for i, r in enumerate(recs)
    ]
    rr.check_records(section, count)
    with in_python():
        rr.check_records(section, count)
    fields = rr.record_fields(section, count)
    ends = [f[0] for f in fields]
    assert rr.record_ends(section, [count], [len(section)]) == ends
    stored = list(rr.iter_records(section, count))
    assert [(s.offset_delta, s.timestamp_delta, s.key) for s in stored] == [d[:3] for d in decoded]
    assert [s.value_is_null for s in stored] == [r["value"] is None for r in recs]
    assert [(s.start, s.end) for s in stored] == list(zip([0, *ends[:-1]], ends, strict=True))
    ours = b"".join(
        rr.encode_record(i, r["timestamp"] - base, r["key"], r["value"], r["headers"])
        for i, r in enumerate(recs)
    )
    assert ours == section


@SETTINGS
@given(recs=st.lists(_record, min_size=1, max_size=8), shift=_timestamp_deltas)
def test_restamp_changes_the_timestamp_delta_only(recs: list[dict[str, Any]], shift: int) -> None:
    _, section, header = producer_batch(recs)
    stored = list(rr.iter_records(section, header.records_count))
    restamped = b"".join(rr.restamp_record(section, s, s.timestamp_delta + shift) for s in stored)
    before = list(rr.iter_decoded(section, header.records_count))
    after = list(rr.iter_decoded(restamped, header.records_count))
    assert after == [d._replace(timestamp_delta=d.timestamp_delta + shift) for d in before]


# ---------------------------------------------------------------------------------------------
# Corrupt sections.

# Byte values that make small negative lengths and counts, and varints that go on.
_bytes = st.sampled_from([0x01, 0x03, 0x7F, 0x80, 0xFF]) | st.integers(0, 255)

WALKS: list[Callable[[bytes, int], Any]] = [
    lambda section, count: rr.record_fields(section, count),
    lambda section, count: list(rr.iter_records(section, count)),
    lambda section, count: list(rr.iter_decoded(section, count)),
    lambda section, count: rr.record_ends(section, [count], [len(section)]),
]


def refused_or_walked(section: bytes, count: int) -> None:
    """Every walk returns or raises CorruptRecordError (any other exception fails the test),
    and ``check_records`` (C and Python) refuses exactly what ``iter_decoded`` refuses, but
    for header keys that are not UTF-8."""
    for walk in WALKS:
        with contextlib.suppress(CorruptRecordError):
            walk(section, count)
    checked = [passes(lambda: rr.check_records(section, count))]
    with in_python():
        checked.append(passes(lambda: rr.check_records(section, count)))
    assert checked[0] == checked[1], "the C check and its Python twin disagree"
    decoded = passes(lambda: list(rr.iter_decoded(section, count)))
    if decoded:
        assert checked[0], "check_records refuses records that iter_decoded decodes"
    elif checked[0]:
        assert _bad_utf8_header_key(section, count), "check_records passes what is refused"


def passes(check: Callable[[], Any]) -> bool:
    try:
        check()
    except CorruptRecordError:
        return False
    return True


@contextlib.contextmanager
def in_python() -> Any:
    """``check_records`` runs its Python twin inside."""
    scanner, rr._record_scan = rr._record_scan, None
    try:
        yield
    finally:
        rr._record_scan = scanner


def _bad_utf8_header_key(section: bytes, count: int) -> bool:
    """Whether the records parse but for a header key that is not UTF-8."""
    for end, *_, pos in rr.record_fields(section, count):
        headers, pos = rr.read_varint(section, pos, end)
        for _ in range(headers):
            n, pos = rr.read_varint(section, pos, end)
            with contextlib.suppress(UnicodeDecodeError):
                str(section[pos : pos + n], "utf-8")
                pos += n
                n, pos = rr.read_varint(section, pos, end)
                pos += max(n, 0)
                continue
            return True
    return False


@SETTINGS
@given(
    recs=st.lists(_record, min_size=1, max_size=6),
    flips=st.lists(st.tuples(st.integers(0, 1 << 16), _bytes), min_size=1, max_size=4),
    cut=st.integers(0, 1 << 16),
)
def test_corrupt_sections_are_refused_as_kafka_python_refuses_them(
    recs: list[dict[str, Any]], flips: list[tuple[int, int]], cut: int
) -> None:
    batch, section, header = producer_batch(recs)
    corrupt = bytearray(batch)
    for where, byte in flips:  # inside the records section
        corrupt[rb.HEADER_SIZE + where % len(section)] = byte
    corrupt_section = bytes(corrupt[rb.HEADER_SIZE :])
    refused_or_walked(corrupt_section, header.records_count)
    refused_or_walked(section[: cut % len(section)], header.records_count)

    base_offset, base_ts = header.base_offset, header.base_timestamp
    try:
        theirs = [
            (r.offset - base_offset, r.timestamp - base_ts, r.key, r.value, r.headers)
            for r in DefaultRecordBatch(bytes(corrupt))
        ]
    except Exception:  # kafka-python refuses with CorruptRecordError, ValueError or IndexError
        theirs = None
    try:
        ours = [tuple(d) for d in rr.iter_decoded(corrupt_section, header.records_count)]
    except CorruptRecordError:
        ours = None
    if ours is not None:
        # kafka-python reads the attributes byte as a varint: it parses a record whose
        # attributes have the top bit set otherwise, so such records are not compared.
        ends = [f[0] for f in rr.record_fields(corrupt_section, header.records_count)]
        starts = [0, *ends[:-1]]
        attributes = [rr.read_varint(corrupt_section, s, len(corrupt_section))[1] for s in starts]
        assume(all(corrupt_section[a] < 0x80 for a in attributes))
    if theirs is None:
        assert ours is None, "kafka-python refuses records that iter_decoded decodes"
    elif ours is not None:
        assert ours == theirs


@SETTINGS
@given(section=st.binary(max_size=120), count=st.integers(0, 40))
def test_random_sections_are_walked_or_refused(section: bytes, count: int) -> None:
    refused_or_walked(section, count)


def test_header_rules() -> None:
    good = rr.encode_record(0, 0, b"k", b"v", [("é", None), ("h", b"")])
    (decoded,) = rr.iter_decoded(good, 1)
    assert decoded.headers == [("é", None), ("h", b"")]
    bad = {
        "negative count": b"\x01",
        "null key": b"\x02\x01\x00",
        "key not UTF-8": b"\x02\x02\xff\x00",
        "value past the record": b"\x02\x02a\x04",
        "bytes after the headers": b"\x00\x00",
    }
    for name, headers in bad.items():
        body = rr.encode_record(0, 0, b"k", b"v")[1:-1] + headers  # its header count replaced
        section = bytearray()
        rr.write_varint(len(body), section)
        section += body
        with pytest.raises(CorruptRecordError):
            list(rr.iter_decoded(bytes(section), 1))
        for check in ("C", "Python"):  # Kafka's reader takes a header key in any bytes
            with in_python() if check == "Python" else contextlib.nullcontext():
                if name == "key not UTF-8":
                    rr.check_records(bytes(section), 1)
                else:
                    with pytest.raises(CorruptRecordError):
                        rr.check_records(bytes(section), 1)
        # A walk that does not read headers leaves them unchecked, as the C scanner does.
        assert len(rr.record_fields(bytes(section), 1)) == 1, name


def test_the_c_scanner_was_built() -> None:
    assert rr._record_scan is not None, "pip install -e . did not build storage/_record_scan"


def _one_batch(codec: int) -> bytes:
    return kafka_batch(
        [{"key": b"k", "value": b"v" * 100, "timestamp": BASE_TS, "headers": []}], codec
    )


def _with_body(batch: bytes, body: bytes, codec: int) -> bytes:
    """``batch``'s header over ``body``, with the codec, length and CRC made to match."""
    out = bytearray(batch[: rb.HEADER_SIZE]) + body
    struct.pack_into(">i", out, 8, len(out) - rb.LOG_OVERHEAD)
    struct.pack_into(">h", out, 21, codec)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


@pytest.mark.parametrize("codec", range(5), ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_client_batches_are_checked_to_their_records(codec: int) -> None:
    batch = _one_batch(codec)
    rb.check_client_records(batch, rb.validate_client_batch(batch, 1 << 20))
    refused = {
        "records that do not parse": _with_body(batch, b"\x99 not records", 0),
        "data that does not decompress": _with_body(batch, b"not compressed", codec or 1),
        "a bomb": _with_body(batch, gzip.compress(bytes(rb.PRODUCE_INFLATE_MAX + 1)), 1),
    }
    for name, bad in refused.items():
        header = rb.validate_client_batch(bad, 1 << 20)  # header and CRC are fine
        try:
            rb.check_client_records(bad, header)
        except CorruptRecordError:
            continue
        pytest.fail(f"{name} passed the check")
