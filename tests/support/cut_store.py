"""A real object store that can be cut off, as when the network to S3 goes away.

Every call raises ObjectStoreError while ``is_cut()`` is true; otherwise it passes through to
the wrapped store. Shared by the lease tests in one process (an Event) and across processes
(a file the test creates).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from raylog.storage.errors import ObjectStoreError
from raylog.storage.objectstore import ObjectStore, StoredObject


class CutStore(ObjectStore):
    def __init__(self, inner: ObjectStore, is_cut: Callable[[], bool]) -> None:
        self.inner, self.is_cut = inner, is_cut

    def _check(self) -> None:
        if self.is_cut():
            raise ObjectStoreError("object store unreachable (cut off by the test)")

    def get(self, key: str) -> StoredObject | None:
        self._check()
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        self._check()
        return self.inner.get_range(key, start, length)

    def put(self, key: str, body: bytes) -> str:
        self._check()
        return self.inner.put(key, body)

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> str:
        self._check()
        return self.inner.put_stream(key, chunks)

    def put_if_absent(self, key: str, body: bytes) -> str:
        self._check()
        return self.inner.put_if_absent(key, body)

    def put_if_match(self, key: str, body: bytes, etag: str) -> str:
        self._check()
        return self.inner.put_if_match(key, body, etag)

    def delete(self, key: str) -> None:
        self._check()
        self.inner.delete(key)

    def delete_if_match(self, key: str, etag: str) -> None:
        self._check()
        self.inner.delete_if_match(key, etag)

    def list(self, prefix: str = "") -> list[str]:
        self._check()
        return self.inner.list(prefix)

    def abort_uploads(self, prefix: str) -> int:
        self._check()
        return self.inner.abort_uploads(prefix)
