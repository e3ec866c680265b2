"""A local directory with S3's conditional-write semantics: the embedded default object store.

Safe across threads and processes on one machine (not across machines, and not on NFS, where
``flock`` is unreliable). Every mutation runs under an exclusive ``flock`` on ``<root>/lock`` and
is made durable before it returns:

  1. take the lock (bounded wait: ``lock_timeout_s``);
  2. check the condition against the current file;
  3. bump the store-wide generation counter and make it durable (temp file, fsync, rename,
     directory fsync);
  4. write the object to a temp file, fsync it, rename it over the key's file, fsync the
     directory (a delete unlinks and fsyncs the directory instead);
  5. release the lock.

Reads take no lock: a rename replaces a file atomically, so a reader sees the old or the new
version whole, never a mix. ``put_stream`` writes and fsyncs its temp file before it takes the
lock (a segment copy of a GiB must not hold the lock the lease needs), and takes it only to
write the header with the ETag and rename.

Layout under ``root``::

    lock                 flock target, empty
    generation           decimal text: the highest generation ever handed out
    tmp/<pid>-...        temp files; those of ended processes are cleared when a store opens
    objects/<name>       one file per key; <name> = the key percent-encoded ('/' -> '%2F'), so
                         keys map to one flat directory and "a/b" and "a/b/c" can coexist

Object file format (bytes)::

    offset  size  field
    0       16    magic  b"raylog-object 1 "
    16      n     etag   ASCII, n <= 64
    16+n    1     b"\\n"
    17+n    rest  body

ETags (``<generation:016x>-<first 16 hex of sha256(body)>``): the generation is a counter shared
by every key of the store, persisted before it is used, so an ETag is never handed out twice,
even for identical content, even after the key was deleted and created again. That rules out
ABA: an ``If-Match`` holding an old ETag fails after any write in between. (S3 differs: its ETag
is the MD5 of the content, so identical content written again keeps its ETag. raylog's lease
writes new content every time, so it behaves the same on both.)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import quote, unquote

from raylog.storage.errors import ObjectStoreError, PreconditionFailedError
from raylog.storage.log.segment import fsync_directory
from raylog.storage.objectstore import (
    LIST_KEYS_MAX,
    ObjectStore,
    StoredObject,
    validate_key,
    validate_prefix,
    validate_range,
)

_MAGIC = b"raylog-object 1 "
_ETAG_LENGTH_MAX = 64
_ETAG_LENGTH = 33  # <generation:016x>-<16 hex>
_LOCK_POLL_S_MIN = 0.001
_LOCK_POLL_S_MAX = 0.02


class LocalObjectStore(ObjectStore):
    """Objects as files under ``root``; see the module docstring for layout and guarantees."""

    def __init__(self, root: str | os.PathLike[str], *, lock_timeout_s: float = 10.0) -> None:
        if lock_timeout_s <= 0:
            raise ValueError(f"lock_timeout_s must be positive, got {lock_timeout_s}")
        self._root = Path(root)
        self._objects = self._root / "objects"
        self._tmp = self._root / "tmp"
        self._lock_path = self._root / "lock"
        self._generation_path = self._root / "generation"
        self._lock_timeout_s = lock_timeout_s
        try:
            for directory in (self._root, self._objects, self._tmp):
                directory.mkdir(parents=True, exist_ok=True)
            fsync_directory(self._root)
            for leftover in self._tmp.iterdir():  # what ended processes left mid-write
                if not _writer_alive(leftover.name):
                    leftover.unlink(missing_ok=True)
        except OSError as e:
            raise ObjectStoreError(f"cannot open local object store at {self._root}: {e}") from e

    @property
    def root(self) -> Path:
        return self._root

    # -- reads ------------------------------------------------------------------------------

    def get(self, key: str) -> StoredObject | None:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ObjectStoreError(f"cannot read {key!r} from {self._root}: {e}") from e
        return _decode(data, path)

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        path = self._path(key)
        validate_range(start, length)
        try:
            with open(path, "rb") as f:  # a rename replaces the file whole: one version read
                head = f.read(len(_MAGIC) + _ETAG_LENGTH_MAX + 1)
                body_at = _body_start(head, path)
                f.seek(body_at + start)
                return f.read(length)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ObjectStoreError(f"cannot read {key!r} from {self._root}: {e}") from e

    def list(self, prefix: str = "") -> list[str]:
        validate_prefix(prefix)
        try:
            names = os.listdir(self._objects)
        except OSError as e:
            raise ObjectStoreError(f"cannot list {self._objects}: {e}") from e
        keys = sorted(k for k in (unquote(n) for n in names) if k.startswith(prefix))
        if len(keys) > LIST_KEYS_MAX:
            raise ObjectStoreError(f"more than {LIST_KEYS_MAX} keys under prefix {prefix!r}")
        return keys

    # -- writes -----------------------------------------------------------------------------

    def put(self, key: str, body: bytes) -> str:
        path = self._path(key)
        with self._mutation(key):
            return self._write(path, body)

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> str:
        path = self._path(key)
        tmp = self._tmp / f"{os.getpid()}-stream-{uuid.uuid4().hex}"
        digest = hashlib.sha256()
        try:
            with self._os_errors(key):
                f = open(tmp, "wb")  # noqa: SIM115 - closed below; chunks' errors propagate
            with f:
                with self._os_errors(key):
                    f.write(_header("0" * _ETAG_LENGTH))  # the ETag goes here once known
                for chunk in chunks:  # bounded by what the caller streams
                    digest.update(chunk)
                    with self._os_errors(key):
                        f.write(chunk)
                with self._os_errors(key):
                    f.flush()
                    os.fsync(f.fileno())
            with self._mutation(key):
                etag = f"{self._next_generation():016x}-{digest.hexdigest()[:16]}"
                with open(tmp, "r+b") as f:
                    f.write(_header(etag))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
                fsync_directory(path.parent)
        finally:
            tmp.unlink(missing_ok=True)
        return etag

    def put_if_absent(self, key: str, body: bytes) -> str:
        path = self._path(key)
        with self._mutation(key):
            if self._current_etag(path) is not None:
                raise PreconditionFailedError(f"{key!r} already exists (If-None-Match: *)")
            return self._write(path, body)

    def put_if_match(self, key: str, body: bytes, etag: str) -> str:
        path = self._path(key)
        with self._mutation(key):
            self._check_match(key, path, etag)
            return self._write(path, body)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with self._mutation(key):
            self._unlink(path)

    def delete_if_match(self, key: str, etag: str) -> None:
        path = self._path(key)
        with self._mutation(key):
            self._check_match(key, path, etag)
            self._unlink(path)

    # -- internals --------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        # quote(safe="") encodes '/', so the name is one path component inside objects/; with
        # validate_key refusing '.'/'..' segments no key can name a file outside the root.
        return self._objects / quote(validate_key(key), safe="")

    def _current_etag(self, path: Path) -> str | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return _decode(data, path).etag

    def _check_match(self, key: str, path: Path, etag: str) -> None:
        current = self._current_etag(path)
        if current is None:
            raise PreconditionFailedError(f"{key!r} does not exist (If-Match: {etag})")
        if current != etag:
            raise PreconditionFailedError(f"{key!r} has ETag {current}, not {etag} (If-Match)")

    def _write(self, path: Path, body: bytes) -> str:
        generation = self._next_generation()
        etag = f"{generation:016x}-{hashlib.sha256(body).hexdigest()[:16]}"
        self._replace(path, _header(etag) + bytes(body))
        return etag

    def _next_generation(self) -> int:
        # Caller holds the lock. Invariant: every generation in an ETag on disk is <= the value
        # persisted here, so the counter never hands out a generation twice, even after a crash.
        try:
            text = self._generation_path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            text = "0"
        if not text.isdigit():
            raise ObjectStoreError(f"corrupt generation counter in {self._generation_path}")
        generation = int(text) + 1
        self._replace(self._generation_path, f"{generation}\n".encode("ascii"))
        return generation

    def _replace(self, path: Path, data: bytes) -> None:
        """Atomically and durably replace ``path`` with ``data`` (caller holds the lock)."""
        tmp = self._tmp / f"{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        fsync_directory(path.parent)

    def _unlink(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            return
        fsync_directory(path.parent)

    @contextlib.contextmanager
    def _mutation(self, key: str) -> Iterator[None]:
        """The lock, with OS errors turned into ObjectStoreError (the outcome is then unknown)."""
        with self._os_errors(key), self._locked():
            yield

    @contextlib.contextmanager
    def _os_errors(self, key: str) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            raise ObjectStoreError(f"local object store {self._root} failed on {key!r}: {e}") from e

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # A fresh open file description per call: flock excludes other descriptions, including
        # other threads of this process, so no separate thread lock is needed.
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + self._lock_timeout_s
            pause_s = _LOCK_POLL_S_MIN
            while True:  # bounded by the deadline
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise ObjectStoreError(
                            f"lock {self._lock_path} still held by another process after "
                            f"{self._lock_timeout_s} s"
                        ) from None
                    time.sleep(pause_s)
                    pause_s = min(pause_s * 2, _LOCK_POLL_S_MAX)
            yield  # closing fd below releases the lock
        finally:
            os.close(fd)


def _header(etag: str) -> bytes:
    return _MAGIC + etag.encode("ascii") + b"\n"


def _writer_alive(temp_name: str) -> bool:
    """Whether the process whose pid starts a temp file's name is running."""
    pid = temp_name.partition("-")[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _body_start(data: bytes, path: Path) -> int:
    """Where the body starts in an object file beginning with ``data`` (its header at least)."""
    newline = data.find(b"\n", len(_MAGIC), len(_MAGIC) + _ETAG_LENGTH_MAX + 1)
    if not data.startswith(_MAGIC) or newline < 0:
        raise ObjectStoreError(f"corrupt object file {path}: bad header")
    return newline + 1


def _decode(data: bytes, path: Path) -> StoredObject:
    body_at = _body_start(data, path)
    etag = data[len(_MAGIC) : body_at - 1].decode("ascii", errors="replace")
    return StoredObject(body=data[body_at:], etag=etag)
