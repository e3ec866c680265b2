"""Kafka's record layout: the records inside a RecordBatch v2 and the varints they are made of.

The one definition of a record that every reader in raylog uses. Pure: no I/O. A records
section (a batch's bytes after its 61-byte header, uncompressed; the header is
:mod:`raylog.storage.batch`'s) holds ``recordsCount`` records back to back, each Kafka's
DefaultRecord::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint | key | valueLength varint | value | headerCount varint |
    headerCount x (headerKeyLength varint | headerKey (UTF-8) | headerValueLength varint |
                   headerValue)

``length`` counts the record's bytes after its own varint. Every varint is zigzag LEB128
(protobuf's sint64: 0, -1, 1, -2 are written 0, 1, 2, 3, then 7 bits a byte, low bits
first, the top bit set on every byte but the last).

The rules, Kafka's (``DefaultRecord.readFrom``), applied the same way by every reader:

1. A varint is at most :data:`VARINT_MAX_BYTES` bytes and holds at most 64 bits.
2. A record's length is positive, the record lies inside its section, and the records fill
   the section exactly.
3. Every field up to the headers lies inside its record. A negative key or value length is
   a null field, which takes no bytes.
4. Headers are checked by whoever reads them (:func:`read_headers`): a count that is not
   negative, header keys of a non-negative length in UTF-8, a negative value length for a
   null value, and the headers ending their record exactly. A reader that does not return
   headers does not look at them.

A record that breaks a rule raises CorruptRecordError; no read goes past the buffer given.

Who reads records with this module:

- :func:`record_fields` walks a section and gives, for every record, where it ends and its
  fields up to the headers (:data:`RECORD_FIELDS`). The reference decoder of
  :mod:`raylog.pipelines.records` is a loop over it; the C scanner of the fast decoder
  (``storage/_record_scan.c``, ``record_fields``) is the same walk in C, and tests check
  that the two agree on every record of valid, corrupt and random sections, refusals
  included. :func:`record_ends` walks the lengths only, as the C scanner's ``record_ends``
  does (the fast decoder's Python scan, where the C one was not built).
- :func:`iter_records` is the broker's view (log cleaner, produce check of compacted topics,
  ListOffsets by timestamp): each record's deltas, key, whether its value is null, and its
  byte span, so that a kept record is copied verbatim or re-stamped
  (:func:`restamp_record`) without decoding its value or headers.
- :func:`check_records` is the broker's check of a produced batch: every rule, in C where
  the scanner was built.
- :func:`iter_decoded` decodes every field, headers included (the group coordinator reading
  ``__consumer_offsets`` back).
- :func:`encode_record` writes one record (``storage.batch.build_batch``).
- :func:`read_uvarint`, the unsigned LEB128 under the zigzag, also reads the wire protocol's
  unsigned varints (:mod:`raylog.gateway.codec`) and a raw snappy block's length
  (:mod:`raylog.storage.compression`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from raylog.storage.errors import CorruptRecordError

try:
    from raylog.storage import _record_scan  # type: ignore[attr-defined]
except ImportError:  # the C extension is optional (no compiler at install time)
    _record_scan = None

Buffer = bytes | bytearray | memoryview

VARINT_MAX_BYTES = 10  # 64 bits, 7 a byte

# What record_fields gives for each record, in this order (the C scanner's record_fields writes
# the same eight int64 per record). Positions are byte indices into the section; a negative
# length is a null field.
RECORD_FIELDS = (
    "end",  # one past the record's last byte: where the next record starts
    "timestamp_delta",
    "offset_delta",
    "key_pos",
    "key_length",
    "value_pos",
    "value_length",
    "headers_pos",  # where the header count is
)
Fields = tuple[int, int, int, int, int, int, int, int]


# ---------------------------------------------------------------------------------------------
# Varints.


def read_uvarint(
    buf: Buffer, pos: int, end: int, max_bytes: int = VARINT_MAX_BYTES
) -> tuple[int, int]:
    """The unsigned LEB128 varint at ``pos``, which must end before ``end`` and take at most
    ``max_bytes`` bytes (a tenth byte may only add the 64th bit); returns (value, position
    after it)."""
    n = 0
    for i in range(max_bytes):
        if pos + i >= end:
            raise CorruptRecordError(f"varint at byte {pos} runs past byte {end}")
        b = buf[pos + i]
        if i == VARINT_MAX_BYTES - 1 and b > 1:
            raise CorruptRecordError(f"varint at byte {pos} holds more than 64 bits")
        n |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return n, pos + i + 1
    raise CorruptRecordError(f"varint at byte {pos} is longer than {max_bytes} bytes")


def zigzag(n: int) -> int:
    """The signed value of an unsigned zigzag code (0, 1, 2, 3 -> 0, -1, 1, -2)."""
    return (n >> 1) ^ -(n & 1)


def read_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` (below ``end``); returns (value, position after it)."""
    if pos < end and (b := buf[pos]) < 0x80:  # most lengths and deltas take one byte
        return (b >> 1) ^ -(b & 1), pos + 1
    n, after = read_uvarint(buf, pos, end)
    return zigzag(n), after


def write_varint(value: int, out: bytearray) -> None:
    """Append ``value`` as a zigzag varint."""
    n = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


_Lookup = list[tuple[int, int] | None]


@functools.cache
def _short_varints() -> tuple[_Lookup, _Lookup]:
    """The (value, size) of every varint of one byte, indexed by that byte, and of every varint
    of two bytes, indexed by its two bytes as a little-endian int16; None elsewhere.

    The walks below read a varint with a lookup or two here: nearly every length and delta
    takes one or two bytes, and a function call per field costs more than the field. Built
    on first use."""
    one: _Lookup = [(zigzag(b), 1) for b in range(0x80)] + [None] * 0x80
    two: _Lookup = [None] * 0x10000
    for second in range(0x80):
        row = second << 8 | 0x80
        two[row : row + 0x80] = [(zigzag(second << 7 | low), 2) for low in range(0x80)]
    return one, two


def _long(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` when it takes three bytes or more (the walks' slow path):
    (value, size)."""
    n, after = read_uvarint(buf, pos, len(buf))
    return zigzag(n), after - pos


# ---------------------------------------------------------------------------------------------
# Walking a records section.


def record_fields(buf: bytes, count: int) -> list[Fields]:
    """The ``count`` records of the records section ``buf`` (rules 1 to 3), one
    :data:`RECORD_FIELDS` tuple each; positions index ``buf``. The C scanner's
    ``record_fields`` in Python.

    A field is checked against its record once the record's fields are read: a field that
    runs past its record leaves the position past the record's end, and every later
    position is further still, so one check at the end refuses it; a read past the section
    raises IndexError, refused likewise (a two-byte lookup reads a second byte only when the
    first has the top bit set, so it reads past the section only for a varint that does).
    """
    one, two = _short_varints()
    end = len(buf)
    at = 0
    fields: list[Fields] = []
    append = fields.append
    try:
        # Bounded by the header's count, and by the section: a record takes 6 bytes or more.
        for _ in range(count):
            length, size = one[buf[at]] or two[buf[at] | buf[at + 1] << 8] or _long(buf, at)
            at += size
            if length <= 0 or length > end - at:
                raise CorruptRecordError(f"record of {length} bytes at byte {at} of {end}")
            record_end = at + length
            at += 1  # attributes: unused
            ts_delta, size = one[buf[at]] or two[buf[at] | buf[at + 1] << 8] or _long(buf, at)
            at += size
            offset_delta, size = one[buf[at]] or two[buf[at] | buf[at + 1] << 8] or _long(buf, at)
            at += size
            key_length, size = one[buf[at]] or two[buf[at] | buf[at + 1] << 8] or _long(buf, at)
            key_pos = at + size
            at = key_pos + key_length if key_length > 0 else key_pos
            value_length, size = one[buf[at]] or two[buf[at] | buf[at + 1] << 8] or _long(buf, at)
            value_pos = at + size
            at = value_pos + value_length if value_length > 0 else value_pos
            if at > record_end:
                raise CorruptRecordError(f"record ending at byte {record_end}: fields run past it")
            append(
                (
                    record_end,
                    ts_delta,
                    offset_delta,
                    key_pos,
                    key_length,
                    value_pos,
                    value_length,
                    at,
                )
            )
            at = record_end
    except IndexError:
        raise CorruptRecordError(f"a record runs past the {end}-byte records section") from None
    if at != end:
        raise CorruptRecordError(
            f"recordsCount {count}: the records end at byte {at} of a {end}-byte section"
        )
    return fields


def record_ends(buf: bytes, counts: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """Where each record ends in ``buf``, which holds records sections back to back from byte
    0: ``counts[i]`` records in the ``sizes[i]`` bytes of section ``i`` (rule 2 only: the
    lengths are walked, the fields are not read). The C scanner's ``record_ends`` in Python."""
    one, two = _short_varints()
    ends: list[int] = []
    append = ends.append
    pos = end = 0
    try:
        for count, section_size in zip(counts, sizes, strict=True):
            end += section_size
            # Bounded by the header's count, and by the section: a record takes 2 bytes or more.
            for _ in range(count):
                length, size = one[buf[pos]] or two[buf[pos] | buf[pos + 1] << 8] or _long(buf, pos)
                pos += size
                if length <= 0 or length > end - pos:
                    raise CorruptRecordError(
                        f"record of {length} bytes at byte {pos}, before {end}"
                    )
                pos += length
                append(pos)
            if pos != end:
                raise CorruptRecordError(
                    f"recordsCount {count}: the records end at byte {pos}, not at {end}"
                )
    except IndexError:
        raise CorruptRecordError(f"a record runs past its section ending at {end}") from None
    return ends


def check_records(section: Buffer, count: int) -> None:
    """Kafka's check of a produced batch (``DefaultRecord.readFrom`` over every record):
    ``count`` records fill ``section`` exactly, each by rules 1 to 4, but for header keys in
    UTF-8 (Kafka's reader does not ask it). Raises CorruptRecordError. In C where the scanner
    was built (``_record_scan.c``'s ``check_records``), else this module's walk."""
    if _record_scan is not None:
        try:
            _record_scan.check_records(section, count)
        except ValueError as exc:
            raise CorruptRecordError(f"the batch's records do not parse: {exc}") from None
        return
    data = bytes(section)
    for fields in record_fields(data, count):
        _header_spans(data, fields[7], fields[0])


def _header_spans(section: bytes, pos: int, end: int) -> list[tuple[int, int, int, int]]:
    """Rule 4 but for UTF-8, over the headers of the record ending at ``end`` whose header
    count is at ``pos``: the position and length of each header's key and value (a negative
    value length for a null value)."""
    count, pos = read_varint(section, pos, end)
    if count < 0 or count > end - pos:  # a header takes at least two bytes
        raise CorruptRecordError(f"header count {count} at byte {pos}")
    spans: list[tuple[int, int, int, int]] = []
    for _ in range(count):
        key_length, key_pos = read_varint(section, pos, end)
        if key_length < 0 or key_length > end - key_pos:
            raise CorruptRecordError(f"header key of {key_length} bytes at byte {key_pos}")
        value_length, value_pos = read_varint(section, key_pos + key_length, end)
        if value_length > end - value_pos:
            raise CorruptRecordError(f"header value of {value_length} bytes at byte {value_pos}")
        spans.append((key_pos, key_length, value_pos, value_length))
        pos = value_pos + max(value_length, 0)
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes after the headers at byte {pos}")
    return spans


def read_headers(section: bytes, pos: int, end: int) -> list[tuple[str, bytes | None]]:
    """The headers of the record ending at ``end`` whose header count is at ``pos`` (rule 4):
    (key, value) pairs, a null value as None."""
    headers: list[tuple[str, bytes | None]] = []
    for key_pos, key_length, value_pos, value_length in _header_spans(section, pos, end):
        try:
            key = str(section[key_pos : key_pos + key_length], "utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"header key at byte {key_pos} is not UTF-8") from exc
        value = section[value_pos : value_pos + value_length] if value_length >= 0 else None
        headers.append((key, value))
    return headers


class DecodedRecord(NamedTuple):
    """One record, every field decoded."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def iter_decoded(section: Buffer, count: int) -> Iterator[DecodedRecord]:
    """The ``count`` records of ``section``, every field decoded and every rule checked."""
    data = bytes(section)
    for fields in record_fields(data, count):
        end, ts_delta, offset_delta, key_pos, key_length, value_pos, value_length, at = fields
        yield DecodedRecord(
            offset_delta,
            ts_delta,
            data[key_pos : key_pos + key_length] if key_length >= 0 else None,
            data[value_pos : value_pos + value_length] if value_length >= 0 else None,
            read_headers(data, at, end),
        )


# ---------------------------------------------------------------------------------------------
# The broker's view: records kept or dropped whole.


class StoredRecord(NamedTuple):
    """One record of a records section (positions index that section)."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value_is_null: bool
    start: int  # the record's first byte (its length varint)
    end: int  # one past its last byte


def iter_records(section: Buffer, count: int) -> Iterator[StoredRecord]:
    """The ``count`` records of an uncompressed records section (rules 1 to 3)."""
    data = bytes(section)  # indexing bytes is faster than a memoryview
    start = 0
    for fields in record_fields(data, count):
        end, timestamp_delta, offset_delta, key_pos, key_length, _, value_length, _ = fields
        key = data[key_pos : key_pos + key_length] if key_length >= 0 else None
        yield StoredRecord(offset_delta, timestamp_delta, key, value_length < 0, start, end)
        start = end


def restamp_record(section: Buffer, record: StoredRecord, timestamp_delta: int) -> bytes:
    """``record`` of ``section`` with a new timestamp delta; every other byte as it was."""
    _, body = read_varint(section, record.start, record.end)
    _, pos = read_varint(section, body + 1, record.end)  # the old timestamp delta
    _, tail = read_varint(section, pos, record.end)  # the offset delta; key, value, headers follow
    inner = bytearray(section[body : body + 1])  # attributes
    write_varint(timestamp_delta, inner)
    write_varint(record.offset_delta, inner)
    inner += section[tail : record.end]
    return _framed(inner)


# ---------------------------------------------------------------------------------------------
# Writing.


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> bytes:
    """One record (attributes 0), length included."""
    body = bytearray(1)  # attributes: unused, always 0
    write_varint(timestamp_delta, body)
    write_varint(offset_delta, body)
    _write_field(key, body)
    _write_field(value, body)
    write_varint(len(headers), body)
    for name, header_value in headers:
        _write_field(name.encode("utf-8"), body)
        _write_field(header_value, body)
    return _framed(body)


def _write_field(value: bytes | None, out: bytearray) -> None:
    if value is None:
        write_varint(-1, out)
    else:
        write_varint(len(value), out)
        out += value


def _framed(body: bytearray) -> bytes:
    out = bytearray()
    write_varint(len(body), out)
    out += body
    return bytes(out)


__all__ = [
    "RECORD_FIELDS",
    "VARINT_MAX_BYTES",
    "DecodedRecord",
    "Fields",
    "StoredRecord",
    "encode_record",
    "iter_decoded",
    "iter_records",
    "read_headers",
    "read_uvarint",
    "read_varint",
    "record_ends",
    "record_fields",
    "restamp_record",
    "write_varint",
    "zigzag",
]
