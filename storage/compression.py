"""Record batch compression codecs (RecordBatch v2 attributes bits 0-2), both directions.

Decompression serves every reader of records (the connector's decoder, the log cleaner, the
produce check of compacted topics, the group coordinator reading ``__consumer_offsets``);
compression serves the log cleaner, which rewrites a compressed batch with the codec it came
in. Everything goes through pyarrow's bundled libraries or the standard library, so no
optional codec package is needed:

- gzip (1): a gzip stream (Java's GZIPOutputStream, librdkafka); several concatenated
  members are accepted.
- snappy (2): either xerial-framed (Java clients: a 16-byte header ``\\x82SNAPPY\\0`` + version
  + compatible version, then blocks of ``int32 length + raw snappy``) or one raw snappy block
  (librdkafka, Sarama). A raw snappy block starts with its uncompressed length as a varint,
  which is what Arrow's snappy codec needs to be told. :func:`compress` writes xerial
  framing, which every client reads.
- lz4 (3): the LZ4 frame format (v2 batches always use correct frame checksums; the broken
  header checksum of Kafka 0.8/0.9 only exists in magic 0/1 message sets, which raylog never
  stores). Frames need not carry their content size, so they are streamed.
- zstd (4): standard zstd frames (zstd-jni, librdkafka), possibly several, possibly without
  a content size; streamed.

Decompressed output is bounded (:data:`DECOMPRESSED_SIZE_MAX`): a hostile length or a zip bomb
raises CorruptRecordError, never exhausts memory.
"""

from __future__ import annotations

import gzip
import struct
import zlib

from raylog.storage.errors import CorruptRecordError, UnsupportedCompressionTypeError
from raylog.storage.records import read_uvarint

# pyarrow is imported by the codecs that use it, not here: the CLI imports this module (through
# raylog.storage) and never sees a compressed batch.

Buffer = bytes | bytearray | memoryview

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

# A decompressed batch larger than this is a corrupt or hostile length, not data: Kafka's
# max.message.bytes caps compressed batches far below, and ratios beyond 64x are implausible.
DECOMPRESSED_SIZE_MAX = 1 << 30

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16  # magic (8) + version int32 + compatible version int32
_INT32 = struct.Struct(">i")


# ---------------------------------------------------------------------------------------------
# Decompression.


def _snappy_raw(block: Buffer, limit: int) -> bytes:
    """One raw snappy block; its uncompressed length is the leading unsigned varint."""
    import pyarrow as pa

    size, _ = read_uvarint(block, 0, len(block), max_bytes=5)  # a 32-bit varint: 5 bytes
    if size > limit:
        raise CorruptRecordError(f"snappy block claims {size} uncompressed bytes")
    try:
        return pa.decompress(block, decompressed_size=size, codec="snappy", asbytes=True)
    except (OSError, pa.ArrowException) as exc:
        raise CorruptRecordError(f"snappy block does not decompress: {exc}") from exc


def _snappy(data: Buffer, limit: int) -> bytes:
    view = memoryview(data)
    if bytes(view[:8]) != _XERIAL_MAGIC or len(view) < _XERIAL_HEADER_SIZE:
        return _snappy_raw(view, limit)
    # Xerial framing (Java clients): blocks of int32 length + raw snappy after the header.
    out = []
    pos = _XERIAL_HEADER_SIZE
    total = 0
    while pos < len(view):  # bounded: each pass consumes >= 4 bytes
        if len(view) - pos < 4:
            raise CorruptRecordError(f"xerial snappy block length truncated at byte {pos}")
        (length,) = _INT32.unpack_from(view, pos)
        pos += 4
        if length < 0 or length > len(view) - pos:
            raise CorruptRecordError(f"xerial snappy block of {length} bytes at byte {pos}")
        chunk = _snappy_raw(view[pos : pos + length], limit)
        total += len(chunk)
        if total > limit:
            raise CorruptRecordError("xerial snappy stream decompresses beyond the size limit")
        out.append(chunk)
        pos += length
    return b"".join(out)


_GZIP_MEMBERS_MAX = 1024  # Java and librdkafka write one member; a few is plausible


def _gzip(data: Buffer, limit: int) -> bytes:
    """gzip members, concatenated, decompressed with a bound on the output (no zip bombs)."""
    out: list[bytes] = []
    total = 0
    rest = bytes(data)
    for _ in range(_GZIP_MEMBERS_MAX):
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = d.decompress(rest, limit + 1 - total)
        except zlib.error as exc:
            raise CorruptRecordError(f"gzip data does not decompress: {exc}") from exc
        total += len(chunk)
        if total > limit or d.unconsumed_tail:
            raise CorruptRecordError("gzip data decompresses beyond the size limit")
        if not d.eof:
            raise CorruptRecordError("gzip data truncated")
        out.append(chunk)
        rest = d.unused_data
        if not rest:
            return b"".join(out)
    raise CorruptRecordError(f"gzip data has more than {_GZIP_MEMBERS_MAX} members")


def _arrow_stream(data: Buffer, codec: str, limit: int) -> bytes:
    """Stream-decompress a codec whose frames need not say their decompressed size."""
    import pyarrow as pa

    try:
        with pa.input_stream(pa.py_buffer(data), compression=codec) as stream:
            out = stream.read(limit + 1)
    except (OSError, pa.ArrowException) as exc:
        raise CorruptRecordError(f"{codec} data does not decompress: {exc}") from exc
    if len(out) > limit:
        raise CorruptRecordError(f"{codec} data decompresses beyond the size limit")
    return out


def decompress(codec: int, data: Buffer, limit: int = DECOMPRESSED_SIZE_MAX) -> bytes:
    """The records section of a batch with compression ``codec``, uncompressed: at most
    ``limit`` bytes, else CorruptRecordError."""
    if codec == CODEC_GZIP:
        return _gzip(data, limit)
    if codec == CODEC_SNAPPY:
        return _snappy(data, limit)
    if codec == CODEC_LZ4:
        return _arrow_stream(data, "lz4", limit)
    if codec == CODEC_ZSTD:
        return _arrow_stream(data, "zstd", limit)
    raise UnsupportedCompressionTypeError(f"compression codec {codec}")


# ---------------------------------------------------------------------------------------------
# Compression.

# Java's SnappyOutputStream writes blocks of at most 32 KiB; readers accept any block size.
_XERIAL_BLOCK_BYTES = 32 << 10
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)


def _snappy_compress(data: Buffer) -> bytes:
    import pyarrow as pa

    view = memoryview(data).cast("B")
    out = [_XERIAL_HEADER]
    for pos in range(0, len(view), _XERIAL_BLOCK_BYTES):
        block = pa.compress(view[pos : pos + _XERIAL_BLOCK_BYTES], codec="snappy", asbytes=True)
        out.append(_INT32.pack(len(block)))
        out.append(block)
    return b"".join(out)


def _arrow_stream_compress(data: Buffer, codec: str) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, codec) as stream:
        stream.write(data)
    return sink.getvalue().to_pybytes()


def compress(codec: int, data: Buffer) -> bytes:
    """``data`` (a batch's uncompressed records section) compressed with ``codec``."""
    if codec == CODEC_NONE:
        return bytes(data)
    if codec == CODEC_GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    if codec == CODEC_SNAPPY:
        return _snappy_compress(data)
    if codec == CODEC_LZ4:
        return _arrow_stream_compress(data, "lz4")
    if codec == CODEC_ZSTD:
        return _arrow_stream_compress(data, "zstd")
    raise UnsupportedCompressionTypeError(f"compression codec {codec}")
