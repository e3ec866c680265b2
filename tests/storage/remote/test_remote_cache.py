"""The byte-bounded LRU cache of remote bytes (storage/remote/cache.py).

Proves: the cached bytes never exceed the bound, the least recently used entry goes first, a
value larger than a quarter of the bound is not cached, and a corrupt object's entries (whole
and chunks) are dropped together.
"""

from __future__ import annotations

import pytest

from raylog.storage.remote.cache import ByteLRU


def test_the_least_recently_used_goes_first_within_the_bound() -> None:
    cache = ByteLRU(max_bytes=100)
    for i in range(4):
        cache.put(("k", i), bytes(25))
    assert cache.size_bytes == 100
    assert cache.get(("k", 0)) is not None  # 0 is now the most recent
    cache.put(("k", 9), bytes(25))
    assert cache.get(("k", 1)) is None and cache.get(("k", 0)) is not None
    assert cache.size_bytes == 100 and len(cache) == 4
    cache.put(("k", 0), bytes(10))  # replacing a value re-counts its bytes
    assert cache.size_bytes == 85


def test_a_large_value_is_not_cached() -> None:
    cache = ByteLRU(max_bytes=100)
    cache.put("small", bytes(25))
    cache.put("large", bytes(26))
    assert cache.get("large") is None and cache.get("small") is not None
    assert (cache.hits, cache.misses) == (1, 1)


def test_discard_drops_an_objects_entries() -> None:
    cache = ByteLRU(max_bytes=1000)
    cache.put("a/log", b"x")
    cache.put(("a/log", 0), b"yy")
    cache.put(("a/log", 1), b"zz")
    cache.put(("b/log", 0), b"w")
    cache.discard_where("a/log")
    assert len(cache) == 1 and cache.size_bytes == 1


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError):
        ByteLRU(max_bytes=-1)
