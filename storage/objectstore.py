"""The object store interface: conditional writes on '/'-separated keys.

raylog keeps its cluster metadata and the controller lease in an object store and relies on
compare-and-swap, exactly as S3 offers it since 2024:

- ``put_if_absent``   PutObject with ``If-None-Match: *``  (create, fails if the key exists)
- ``put_if_match``    PutObject with ``If-Match: <etag>``  (replace, fails if the ETag changed)
- ``delete_if_match`` DeleteObject with ``If-Match: <etag>``

A lost condition raises :class:`~raylog.storage.errors.PreconditionFailedError` (HTTP 412); a
missing key counts as a lost ``If-Match``. Any other failure (timeout, connection, I/O) raises
:class:`~raylog.storage.errors.ObjectStoreError`, after which the outcome of a write is unknown.

``get`` returns ``None`` for a missing key rather than raising: absence is an expected state
(the lease before anyone took it, a topic that does not exist), not a failure. ``get_range``
reads a byte range of an object (GetObject with ``Range``), at most ``RANGE_LENGTH_MAX`` bytes:
what tiered storage serves a fetch from without reading a whole segment. ``put_stream`` writes
an object from chunks (a multipart upload on S3): what tiered storage copies a segment with.

ETags are opaque strings, compared only for equality and only against the same store. Two
implementations: :mod:`raylog.storage.s3store` (boto3; ETag = MD5 of the content, so rewriting
identical content keeps the ETag) and :mod:`raylog.storage.localstore` (one machine, the embedded
default; every write gets a new ETag, even for identical content). Callers that need every write
to be distinguishable (the lease) make every write's content unique, which is enough for both.

This module owns the interface, the key rules shared by both implementations and the start-up
check :meth:`ObjectStore.probe`.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Callable, Iterable
from typing import NamedTuple

from raylog.storage.errors import ObjectStoreUnsupportedError, PreconditionFailedError

# Limits shared by both implementations so a key valid on one is valid on the other. The local
# store percent-encodes a key into one file name (at most 255 bytes), hence the modest length.
KEY_LENGTH_MAX = 200
LIST_KEYS_MAX = 100_000  # list() refuses to return more; metadata prefixes hold far fewer
# get_range() refuses a longer range: two of the largest batches a log holds (64 MiB each).
RANGE_LENGTH_MAX = 128 << 20

_FORBIDDEN_KEY_CHARS = frozenset("\x00\\")


class StoredObject(NamedTuple):
    """An object's content and the ETag of that version; unpacks as ``body, etag``."""

    body: bytes
    etag: str


# What ``get_unless`` answers when the object still has the ETag the caller holds.
UNCHANGED = StoredObject(b"", "")


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid object key, else raise ``ValueError``.

    Keys are relative '/'-separated paths of non-empty segments; '.' and '..' segments, a leading
    '/', backslashes and NUL are refused so that no key can name anything outside a local store's
    root. Both implementations apply the same rules so that code tested on one runs on the other.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string, got {key!r}")
    if len(key) > KEY_LENGTH_MAX:
        raise ValueError(f"object key longer than {KEY_LENGTH_MAX} characters: {key[:40]!r}...")
    if key.startswith("/"):
        raise ValueError(f"object key must be relative, got {key!r}")
    if any(c in _FORBIDDEN_KEY_CHARS for c in key):
        raise ValueError(f"object key contains a backslash or NUL: {key!r}")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"object key has an empty, '.' or '..' segment: {key!r}")
    return key


def validate_range(start: int, length: int) -> None:
    """Raise ``ValueError`` unless ``start >= 0`` and ``0 < length <= RANGE_LENGTH_MAX``."""
    if start < 0 or not 0 < length <= RANGE_LENGTH_MAX:
        raise ValueError(
            f"byte range start {start}, length {length}: need start >= 0 and "
            f"0 < length <= {RANGE_LENGTH_MAX}"
        )


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a valid listing prefix ('' lists everything)."""
    if prefix == "":
        return prefix
    # A prefix may end inside a segment ("topics/or") or with '/', so validate it as a key after
    # dropping one trailing '/'.
    validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


class ObjectStore(abc.ABC):
    """Conditional-write object store; see the module docstring for the contract.

    Implementations are safe to call from several threads; the local one also from several
    processes on one machine.
    """

    @abc.abstractmethod
    def get(self, key: str) -> StoredObject | None:
        """The current content and ETag of ``key``, or ``None`` if it does not exist."""

    def get_unless(self, key: str, etag: str) -> StoredObject | None:
        """As :meth:`get`, but :data:`UNCHANGED` (compare with ``is``) when the object's ETag is
        still ``etag``: a reader that keeps what it read re-reads only what changed (GetObject
        with ``If-None-Match`` on S3, which sends no body then)."""
        found = self.get(key)
        return UNCHANGED if found is not None and found.etag == etag else found

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        """Bytes ``[start, start + length)`` of ``key``, fewer where the object ends first (b""
        from its end on), or ``None`` if it does not exist. ``length`` is at most
        ``RANGE_LENGTH_MAX`` (ValueError otherwise, and for a negative ``start``)."""

    @abc.abstractmethod
    def put(self, key: str, body: bytes) -> str:
        """Write unconditionally; return the new ETag."""

    @abc.abstractmethod
    def put_stream(self, key: str, chunks: Iterable[bytes]) -> str:
        """Write unconditionally the concatenation of ``chunks``, taken one at a time (so a
        large object never sits in memory whole); return the new ETag. The object appears only
        once whole: if ``chunks`` raises, the exception propagates and nothing is written."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, body: bytes) -> str:
        """Create ``key``; raise ``PreconditionFailedError`` if it exists. Return the new ETag."""

    @abc.abstractmethod
    def put_if_match(self, key: str, body: bytes, etag: str) -> str:
        """Replace ``key`` if its ETag is still ``etag``; raise ``PreconditionFailedError`` if it
        changed or the key is missing. Return the new ETag."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete unconditionally; deleting a missing key is not an error."""

    @abc.abstractmethod
    def delete_if_match(self, key: str, etag: str) -> None:
        """Delete ``key`` if its ETag is still ``etag``; raise ``PreconditionFailedError`` if it
        changed or the key is missing."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix``, sorted; at most ``LIST_KEYS_MAX`` of them."""

    def abort_uploads(self, prefix: str) -> int:
        """End every incomplete streamed write (:meth:`put_stream`) under ``prefix`` that a
        crash left behind, and say how many. A write still in flight under ``prefix`` fails
        (its object never appears): call it when no writer there should be running. Stores
        that keep no such state (the local store deletes a dead writer's temp file when it
        opens) have none."""
        validate_prefix(prefix)
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections or file handles; the store is unusable afterwards."""

    def probe(self, probe_prefix: str = "_raylog/probe") -> None:
        """Prove that this store enforces every condition raylog relies on, or refuse to run.

        Writes a fresh probe key and checks, in order:
          1. put_if_absent on a new key succeeds;
          2. a second put_if_absent on it fails with 412;
          3. put_if_match with the current ETag succeeds and changes the ETag;
          4. put_if_match with the now stale ETag fails with 412;
          5. delete_if_match with the stale ETag fails with 412, then with the current one
             succeeds and the key is gone.
        A store that silently accepts a write whose condition should fail would let two
        controllers both believe they hold the lease, so any such answer raises
        ``ObjectStoreUnsupportedError`` naming the condition. Failures to reach the store raise
        ``ObjectStoreError`` as usual. Costs six requests; meant for start-up.
        """
        key = f"{validate_prefix(probe_prefix).rstrip('/')}/{uuid.uuid4().hex}"
        name = type(self).__name__
        first = self.put_if_absent(key, b"probe 1")
        try:
            self._expect_412(
                lambda: self.put_if_absent(key, b"probe 2"),
                f"{name} accepted PutObject with If-None-Match: * on an existing key ({key}); "
                "it does not support conditional writes, so raylog cannot keep its lease safe",
            )
            second = self.put_if_match(key, b"probe 3", first)
            if second == first:
                raise ObjectStoreUnsupportedError(
                    f"{name} kept ETag {first!r} after a write with different content ({key})"
                )
            self._expect_412(
                lambda: self.put_if_match(key, b"probe 4", first),
                f"{name} accepted PutObject with a stale If-Match ETag ({key}); "
                "it does not support conditional writes, so raylog cannot keep its lease safe",
            )
            self._expect_412(
                lambda: self.delete_if_match(key, first),
                f"{name} accepted DeleteObject with a stale If-Match ETag ({key}); "
                "it does not support conditional deletes",
            )
            self.delete_if_match(key, second)
            if self.get(key) is not None:
                raise ObjectStoreUnsupportedError(f"{name} still has {key} after deleting it")
        finally:
            self.delete(key)  # idempotent; leaves no probe keys behind on any path

    @staticmethod
    def _expect_412(write: Callable[[], object], message: str) -> None:
        try:
            write()
        except PreconditionFailedError:
            return
        raise ObjectStoreUnsupportedError(message)


def open_object_store(
    url: str, *, endpoint_url: str | None = None, probe: bool = True
) -> ObjectStore:
    """Opens the store a URL names, and proves it enforces conditional writes (``probe``).

    ``s3://bucket/prefix`` opens S3 (or any S3-compatible store at ``endpoint_url``); a
    ``file://`` URL or a plain path opens a local directory. Anything else raises ValueError.
    ``probe=False``: no probe (its writes), for a process that only reads objects others
    wrote (a pipeline reading remote segments).
    """
    if url.startswith("s3://"):
        from raylog.storage.s3store import S3ObjectStore

        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise ValueError(f"object store URL {url!r} names no bucket")
        return S3ObjectStore(bucket, prefix=prefix, endpoint_url=endpoint_url, probe=probe)
    if "://" in url and not url.startswith("file://"):
        raise ValueError(f"object store URL {url!r}: use s3://bucket/prefix or a local path")
    from raylog.storage.localstore import LocalObjectStore

    store = LocalObjectStore(url.removeprefix("file://"))
    if probe:
        store.probe()
    return store
