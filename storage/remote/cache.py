"""A byte-bounded LRU cache of remote bytes (index objects, manifests, ranges of ``log``
objects), shared by the readers of one process.

Remote segment objects never change once written (each copy has its own id), so a cached
value stays right until evicted. Bounds: the total of the cached values' lengths never
exceeds ``max_bytes``, least recently used first out; a value larger than ``max_bytes / 4`` is
not cached at all (one large read must not flush everything else). Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

REMOTE_CACHE_BYTES_DEFAULT = 64 << 20


class ByteLRU:
    """``get``/``put`` by key, at most ``max_bytes`` of values held."""

    def __init__(self, max_bytes: int = REMOTE_CACHE_BYTES_DEFAULT) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> bytes | None:
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: bytes) -> None:
        if len(value) > self.max_bytes // 4:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._entries[key] = value
            self._bytes += len(value)
            while self._bytes > self.max_bytes:  # bounded: each round removes one entry
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted)

    def discard_where(self, owner: str) -> None:
        """Drop every entry whose key is ``owner`` or a tuple starting with it (an object
        found corrupt: its cached parts are not trusted either)."""
        with self._lock:
            for key in [
                k for k in self._entries if k == owner or (isinstance(k, tuple) and k[0] == owner)
            ]:
                self._bytes -= len(self._entries.pop(key))


_process_cache: ByteLRU | None = None
_process_cache_lock = threading.Lock()


def process_cache() -> ByteLRU:
    """The cache every reader of this process shares unless given its own."""
    global _process_cache
    with _process_cache_lock:
        if _process_cache is None:
            _process_cache = ByteLRU()
        return _process_cache
