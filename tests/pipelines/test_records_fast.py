"""The fast record decoder (pipelines/fast_records.py) against the reference decoder.

``records.decode_into_reference`` (a Python loop over records) is the specification. Proves:

- for random batches as kafka-python's producer builds them (null and empty keys and values,
  negative and large timestamp deltas, headers with null values and non-ASCII keys, several
  batches in every codec, control batches, LogAppendTime, offset windows cutting batches),
  ``decode_into_fast`` runs without falling back and returns exactly the reference's Arrow rows
  and next offset, with and without headers;
- for hand-made oddities (null lengths other than -1, 10-byte varints, varints past 64 bits,
  offset deltas out of order, timestamps past int64, header keys that are not UTF-8 or split
  a character) ``decode_into`` gives the reference's outcome: the same rows, or the same error;
- for corrupt input (random bytes flipped under a valid CRC) and truncated input (a cut every
  7 bytes), ``decode_into`` raises the reference's error (type and message) or returns its rows;
- the C record scan (``_record_scan.c``) was built by the install, and agrees with its Python
  twin ``record_ends_python`` (the record layout's ``record_ends``) on valid and corrupt
  input; the decoder gives the same rows with either;
- its field walk (``record_fields``) agrees with the numpy twin ``record_fields_numpy`` and
  with the record layout's ``record_fields`` (what the reference decoder and the broker walk),
  field for field or in refusing, on valid, corrupt and random input and on every oddity;
  its field copy (``gather``) builds the same binary arrays as Arrow's ``take``, nulls
  included.
- the rows of a window are taken as a slice when they are one run, by index otherwise.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.pipelines import BASE_TS, CODECS, kafka_batch, kafka_codecs

from raylog.pipelines import fast_records
from raylog.pipelines import records as R
from raylog.storage import batch as rb
from raylog.storage import records as layout
from raylog.storage.errors import CorruptRecordError

END = (1 << 63) - 1
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True, scope="module")
def _fast_path_for_every_size() -> Iterator[None]:
    # decode_into leaves responses of fewer than FAST_MIN_RECORDS records to the reference
    # decoder; here the fast decoder must see the small hand-made and corrupt inputs too.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(R, "FAST_MIN_RECORDS", 0)
        yield


# ---------------------------------------------------------------------------------------------
# Outcomes of a decoder on a buffer.


def decoded(decode: Any, buf: bytes, headers: bool, start: int = 0, end: int = END) -> Any:
    cols = R.new_columns(headers)
    next_offset = decode(buf, cols, start, end)
    return next_offset, R.to_arrow(cols, "events", 2, headers)


def outcome(decode: Any, buf: bytes, headers: bool, start: int = 0, end: int = END) -> Any:
    """("rows", next offset, rows) or ("error", type, message): what a reader would see."""
    try:
        next_offset, batch = decoded(decode, buf, headers, start, end)
    except Exception as exc:
        return ("error", type(exc), str(exc))
    assert batch.schema == R.schema(headers)
    columns = {  # timestamps as epoch ms: datetime cannot hold every int64
        name: (col.cast(pa.int64()) if name == "timestamp" else col).to_pylist()
        for name, col in zip(batch.schema.names, batch.columns, strict=True)
    }
    return ("rows", next_offset, columns)


def assert_fast_matches_reference(buf: bytes, headers: bool, start: int, end: int) -> None:
    fast_next, fast = decoded(R.decode_into_fast, buf, headers, start, end)
    ref_next, ref = decoded(R.decode_into_reference, buf, headers, start, end)
    assert fast_next == ref_next
    assert fast.schema == ref.schema
    assert fast.equals(ref), (fast.to_pylist()[:3], ref.to_pylist()[:3])
    public_next, public = decoded(R.decode_into, buf, headers, start, end)
    assert public_next == ref_next and public.equals(ref)


# ---------------------------------------------------------------------------------------------
# Random producer batches.

_timestamps = st.one_of(
    st.integers(-1000, 1000), st.integers(-(1 << 50), 1 << 50), st.integers(-(1 << 61), 1 << 61)
)
_header_keys = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=6)
_record = st.fixed_dictionaries(
    {
        "key": st.none() | st.binary(max_size=20),
        "value": st.none() | st.binary(max_size=300),
        "timestamp": _timestamps.map(lambda d: BASE_TS + d),
        "headers": st.lists(
            st.tuples(_header_keys, st.none() | st.binary(max_size=12)), max_size=3
        ),
    }
)
_batch = st.tuples(
    st.lists(_record, min_size=1, max_size=25),
    st.sampled_from(sorted(CODECS)),
    st.booleans(),  # LogAppendTime
    st.booleans(),  # a control batch after it
)


def build(batches: list[Any]) -> tuple[bytes, int]:
    """Concatenated batches as a producer (and the broker, for LogAppendTime) wrote them."""
    out = bytearray()
    offset = 0
    for recs, codec, log_append, control in batches:
        buf = bytearray(kafka_batch(recs, CODECS[codec], offset))
        if log_append:
            rb.stamp_log_append_time(buf, BASE_TS + 123_456)
        out += buf
        offset += len(recs)
        if control:
            out += rb.build_batch(
                [rb.Record(None, b"\x00\x00\x00\x00", BASE_TS)],
                base_offset=offset,
                control=True,
                transactional=True,
                producer_id=1,
                base_sequence=0,
            )
            offset += 1
    return bytes(out), offset


@SETTINGS
@given(batches=st.lists(_batch, min_size=1, max_size=4), headers=st.booleans(), data=st.data())
def test_fast_decoder_returns_the_reference_rows(
    batches: list[Any], headers: bool, data: st.DataObject
) -> None:
    with kafka_codecs():
        buf, total = build(batches)
    start = data.draw(st.integers(0, total), label="start")
    end = data.draw(st.one_of(st.just(END), st.integers(start, total + 1)), label="end")
    assert_fast_matches_reference(buf, headers, start, end)


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_every_codec_with_headers_and_log_append_time(codec: str) -> None:
    recs = [
        {
            "key": None if i % 5 == 0 else f"k{i}".encode(),
            "value": [None, b"", b"v" * i][i % 3],
            "timestamp": BASE_TS - 10**12 + (-1) ** i * i * 10**9,
            "headers": [("é", None), ("h", b"x" * i)] if i % 2 else [],
        }
        for i in range(200)
    ]
    with kafka_codecs():
        buf, _ = build([(recs, codec, False, True), (recs[:50], codec, True, False)])
    for headers in (False, True):
        assert_fast_matches_reference(buf, headers, 0, END)
        assert_fast_matches_reference(buf, headers, 150, 230)


def test_rows_keep_their_order_across_fast_and_reference_calls() -> None:
    bufs = [
        rb.build_batch([rb.Record(b"k", bytes([i]), BASE_TS + i)], base_offset=i) for i in range(4)
    ]
    cols = R.new_columns(True)
    for i, buf in enumerate(bufs):
        decode = R.decode_into_fast if i % 2 else R.decode_into_reference
        decode(buf, cols, 0, END)
    batch = R.to_arrow(cols, "t", 0, True)
    assert batch.column("offset").to_pylist() == [0, 1, 2, 3]
    assert batch.column("value").to_pylist() == [b"\x00", b"\x01", b"\x02", b"\x03"]
    assert len(R.to_arrow(R.new_columns(True), "t", 0, True)) == 0


# ---------------------------------------------------------------------------------------------
# Hand-made records sections.


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zz(n: int) -> bytes:
    return uvarint((n << 1) ^ (n >> 63) if n < 0 else n << 1)


def record(
    *,
    ts: bytes = zz(0),
    offset_delta: bytes = zz(0),
    key: bytes = zz(1) + b"k",
    value: bytes = zz(1) + b"v",
    headers: bytes = zz(0),
    length: bytes | None = None,
) -> bytes:
    body = b"\x00" + ts + offset_delta + key + value + headers
    return (zz(len(body)) if length is None else length) + body


def raw_batch(section: bytes, count: int, base_offset: int = 0) -> bytes:
    """A valid batch header (CRC included) around a hand-made records section."""
    dummies = [rb.Record(None, None, BASE_TS)] * count
    buf = bytearray(rb.build_batch(dummies, base_offset=base_offset)[: rb.HEADER_SIZE] + section)
    struct.pack_into(">i", buf, rb.BATCH_LENGTH_POS, len(buf) - rb.LOG_OVERHEAD)
    struct.pack_into(">I", buf, rb.CRC_POS, rb.compute_crc(buf, 0, len(buf)))
    return bytes(buf)


def header(key: bytes, value: bytes | None) -> bytes:
    return zz(len(key)) + key + (zz(-1) if value is None else zz(len(value)) + value)


HEADERLESS = 1  # the fast decoder takes it itself only when headers are not asked for
# (name, records section, record count, whether the fast decoder takes it itself)
ODDITIES: list[tuple[str, bytes, int, bool | int]] = [
    ("null key of length -2", record(key=zz(-2)), 1, True),
    ("empty key and value", record(key=zz(0), value=zz(0)), 1, True),
    ("non-minimal varints", record(ts=b"\x80\x80\x00", offset_delta=b"\x80\x00"), 1, True),
    ("offset deltas out of order", record(offset_delta=zz(1)) + record(), 2, True),
    ("negative offset delta", record(offset_delta=zz(-1)) + record(offset_delta=zz(1)), 2, False),
    ("10-byte timestamp delta", record(ts=b"\xff" * 9 + b"\x00"), 1, True),
    ("timestamp past int64", record(ts=b"\xfe" + b"\xff" * 8 + b"\x01"), 1, False),
    ("varint past 64 bits", record(ts=b"\xff" * 9 + b"\x02"), 1, False),
    ("varint of 11 bytes", record(ts=b"\xff" * 10 + b"\x00"), 1, False),
    ("record length of 11 bytes", b"\xff" * 10 + b"\x01", 1, False),
    ("zero record length", zz(0) + record(), 2, False),
    ("negative record length", zz(-3) + record(), 1, False),
    ("key past its record", record(key=zz(100) + b"k"), 1, False),
    ("value a byte past its record", record(value=zz(2) + b"v", headers=b"") + record(), 2, False),
    ("record past its section", record()[:-1], 1, False),
    ("bytes after the last record", record() + b"\x00", 1, False),
    ("headers", record(headers=zz(2) + header(b"a", None) + header(b"\xc3\xa9", b"")), 1, True),
    ("header key not UTF-8", record(headers=zz(1) + header(b"\xff", b"1")), 1, HEADERLESS),
    ("header key a surrogate", record(headers=zz(1) + header(b"\xed\xa0\x80", b"")), 1, HEADERLESS),
    ("header key overlong", record(headers=zz(1) + header(b"\xc0\x80", b"")), 1, HEADERLESS),
    (
        "character split across header keys",
        record(headers=zz(2) + header(b"\xc3", None) + header(b"\xa9", None)),
        1,
        HEADERLESS,
    ),
    ("null header key", record(headers=zz(1) + zz(-1) + zz(0)), 1, HEADERLESS),
    ("header count too large", record(headers=zz(1000)), 1, HEADERLESS),
    ("bytes after the headers", record(headers=zz(0) + b"\x00"), 1, HEADERLESS),
    ("header value past its record", record(headers=zz(1) + zz(1) + b"a" + zz(5)), 1, HEADERLESS),
]


@pytest.mark.parametrize("headers", [False, True])
@pytest.mark.parametrize(
    ("name", "section", "count", "fast"), ODDITIES, ids=[o[0] for o in ODDITIES]
)
def test_oddities_give_the_reference_outcome(
    name: str, section: bytes, count: int, fast: bool | int, headers: bool
) -> None:
    buf = raw_batch(section, count, base_offset=40)
    expected = outcome(R.decode_into_reference, buf, headers)
    assert outcome(R.decode_into, buf, headers) == expected
    try:
        R.decode_into_fast(buf, R.new_columns(headers), 0, END)
        took_it = True
    except (fast_records.Unfit, R.CorruptRecordError):
        took_it = False
    should_take = fast is True or (fast is HEADERLESS and not headers)
    assert took_it == should_take, f"fast decoder {'took' if took_it else 'declined'} {name!r}"


# ---------------------------------------------------------------------------------------------
# Corrupt and truncated input.

_plain_batch = st.tuples(
    st.lists(_record, min_size=1, max_size=8),
    st.just("none"),
    st.just(False),
    st.just(False),
)


@SETTINGS
@given(
    batches=st.lists(_plain_batch, min_size=1, max_size=2),
    flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=4),
    headers=st.booleans(),
)
def test_corrupt_records_give_the_reference_outcome(
    batches: list[Any], flips: list[tuple[int, int]], headers: bool
) -> None:
    with kafka_codecs():
        buf, _ = build(batches)
    out = bytearray(buf)
    first = rb.parse_header(buf)
    section = first.size - rb.HEADER_SIZE
    for where, byte in flips:  # inside the first batch's records section; the CRC still holds
        out[rb.HEADER_SIZE + where % section] = byte
    struct.pack_into(">I", out, rb.CRC_POS, rb.compute_crc(out, 0, first.size))
    corrupt = bytes(out)
    assert outcome(R.decode_into, corrupt, headers) == outcome(
        R.decode_into_reference, corrupt, headers
    )


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_truncated_input_gives_the_reference_error(codec: str) -> None:
    recs = [
        {"key": b"k", "value": b"v" * i, "timestamp": BASE_TS + i, "headers": [("h", None)]}
        for i in range(30)
    ]
    with kafka_codecs():
        buf, _ = build([(recs, codec, False, True), (recs, codec, True, False)])
    for cut in range(1, len(buf), 7):
        expected = outcome(R.decode_into_reference, buf[:cut], True)
        assert outcome(R.decode_into, buf[:cut], True) == expected, cut
        if expected[0] == "rows":  # a cut on a batch boundary
            assert rb.parse_header(buf[cut:]).base_offset == expected[1]


# ---------------------------------------------------------------------------------------------
# The C record scan and its Python twin.


def test_the_c_record_scan_was_built() -> None:
    # The extension is optional at install time (no compiler: the Python scan is used), so a
    # failed build would go unnoticed but for this test; CI and `make` have gcc.
    assert fast_records._record_scan is not None, "pip install -e . did not build _record_scan"


def layout_fields(blob: bytes, sections: Any) -> fast_records.Fields:
    """The record layout's own walk (``storage.records.record_fields``) over each section, in
    the shape of ``record_fields``: eight columns, positions into ``blob``; Unfit where the
    layout refuses."""
    positional = [name == "end" or name.endswith("_pos") for name in layout.RECORD_FIELDS]
    columns: list[list[int]] = [[] for _ in layout.RECORD_FIELDS]
    start = 0
    for header, data in sections:
        try:
            for fields in layout.record_fields(
                blob[start : start + len(data)], header.records_count
            ):
                for column, value, is_pos in zip(columns, fields, positional, strict=True):
                    column.append(value + start if is_pos else value)
        except CorruptRecordError as exc:
            raise fast_records.Unfit(str(exc)) from exc
        start += len(data)
    return tuple(np.array(column, dtype=np.int64) for column in columns)  # type: ignore[return-value]


# Each C walk and its twins: the record lengths, and every field up to the headers (by numpy,
# and by the record layout's walk, the storage reader's and the reference decoder's).
WALKERS = [
    pytest.param(fast_records.record_ends, fast_records.record_ends_python, id="record_ends"),
    pytest.param(fast_records.record_fields, fast_records.record_fields_numpy, id="record_fields"),
    pytest.param(fast_records.record_fields, layout_fields, id="layout_fields"),
]


def walked(walker: Any, blob: bytes, sections: Any) -> Any:
    """What a walker gives: a list (of ends, or of field columns), or "unfit"."""
    try:
        result = walker(blob, sections)
    except fast_records.Unfit:
        return "unfit"
    return [column.tolist() for column in result] if isinstance(result, tuple) else list(result)


def scan(walker: Any, buf: bytes) -> Any:
    sections = [
        (h, memoryview(buf)[p + rb.HEADER_SIZE : p + h.size])
        for p, h in rb.iter_batches(buf, verify=False)
    ]
    blob = b"".join([*(d for _, d in sections), bytes(fast_records.PAD)])
    return walked(walker, blob, sections)


@pytest.mark.parametrize(("c_walker", "twin"), WALKERS)
@SETTINGS
@given(
    batches=st.lists(_plain_batch, min_size=1, max_size=3),
    flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=3),
)
def test_c_walks_and_their_twins_agree(
    c_walker: Any, twin: Any, batches: list[Any], flips: list[tuple[int, int]]
) -> None:
    with kafka_codecs():
        buf, _ = build(batches)
    out = bytearray(buf)
    section = rb.parse_header(buf).size - rb.HEADER_SIZE
    for where, byte in flips:  # inside the first batch's records section
        out[rb.HEADER_SIZE + where % section] = byte
    python = scan(twin, bytes(out))
    assert scan(c_walker, bytes(out)) == python
    if not flips:
        assert python != "unfit"


@pytest.mark.parametrize(("c_walker", "twin"), WALKERS)
@SETTINGS
@given(
    sections=st.lists(st.tuples(st.integers(0, 40), st.binary(max_size=80)), min_size=1, max_size=3)
)
def test_c_walks_and_their_twins_agree_on_random_bytes(
    c_walker: Any, twin: Any, sections: list[tuple[int, bytes]]
) -> None:
    framed = [(rb.BatchHeader._make([0] * 12 + [count]), data) for count, data in sections]
    blob = b"".join([*(data for _, data in framed), bytes(fast_records.PAD)])
    assert walked(c_walker, blob, framed) == walked(twin, blob, framed)


@pytest.mark.parametrize(("c_walker", "twin"), WALKERS)
@pytest.mark.parametrize(
    ("name", "section", "count", "fast"), ODDITIES, ids=[o[0] for o in ODDITIES]
)
def test_c_walks_and_their_twins_agree_on_oddities(
    c_walker: Any, twin: Any, name: str, section: bytes, count: int, fast: bool | int
) -> None:
    buf = raw_batch(section, count)
    assert scan(c_walker, buf) == scan(twin, buf)


@SETTINGS
@given(
    data=st.binary(min_size=0, max_size=200),
    spans=st.lists(st.tuples(st.integers(0, 200), st.integers(-3, 40)), max_size=30),
)
def test_c_gather_builds_the_arrays_take_builds(data: bytes, spans: list[tuple[int, int]]) -> None:
    # Fields in buffer order that do not overlap, as the decoder passes them (take needs that).
    pos, length, at = [], [], 0
    for gap, n in spans:
        start = at + gap
        if start + max(n, 0) > len(data):
            break
        pos.append(start)
        length.append(n)
        at = start + max(n, 0)
    pos_a, len_a = np.array(pos, dtype=np.int64), np.array(length, dtype=np.int64)
    buffer = pa.py_buffer(data)
    by_c = fast_records._binary(buffer, pos_a, len_a, pa.binary())
    by_take = fast_records._binary_by_take(buffer, pos_a, len_a, len_a >= 0, pa.binary())
    by_c.validate(full=True)
    assert by_c.equals(by_take)
    wanted = [None if n < 0 else data[p : p + n] for p, n in zip(pos, length, strict=True)]
    assert by_c.to_pylist() == wanted


def test_c_gather_refuses_a_field_outside_the_buffer() -> None:
    buffer = pa.py_buffer(b"abcdef")
    for pos, n in ((4, 3), (-1, 2), (7, 1)):
        with pytest.raises(fast_records.Unfit):
            fast_records._binary(
                buffer, np.array([pos], np.int64), np.array([n], np.int64), pa.binary()
            )


def test_decoding_with_the_python_scan_gives_the_reference_rows() -> None:
    recs = [
        {"key": b"k", "value": b"v" * i, "timestamp": BASE_TS + i, "headers": [("h", None)]}
        for i in range(300)
    ]
    with kafka_codecs():
        buf, _ = build([(recs, "none", False, True), (recs, "zstd", True, False)])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fast_records, "_record_scan", None)
        for headers in (False, True):
            assert_fast_matches_reference(buf, headers, 0, END)
            assert_fast_matches_reference(buf, headers, 100, 400)


def test_no_rows_in_the_window_is_an_empty_batch() -> None:
    buf = rb.build_batch([rb.Record(b"k", b"v", BASE_TS)] * 3, base_offset=10)
    next_offset, batch = decoded(R.decode_into_fast, buf, True, start=20)
    assert next_offset == 20 and batch.num_rows == 0 and batch.schema == R.schema(True)
    assert pa.Table.from_batches([batch]).num_rows == 0


def test_the_window_is_a_slice_when_its_rows_are_one_run() -> None:
    offsets = np.array([5, 6, 7, 9, 12, 13], dtype=np.int64)
    assert fast_records._window(offsets, 6, 13) == slice(1, 5)
    assert fast_records._window(offsets, 0, END) == slice(0, 6)
    assert fast_records._window(offsets, 10, 12) is None
    assert fast_records._window(offsets, 14, END) is None
    out_of_order = np.array([5, 9, 6, 7], dtype=np.int64)  # offset deltas out of order
    assert fast_records._window(out_of_order, 6, 8) == slice(2, 4)
    assert fast_records._window(out_of_order, 5, 7).tolist() == [0, 2]  # not one run
