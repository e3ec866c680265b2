"""Short-circuit reads of located batches (storage/short_circuit.py) on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raylog.storage import batch as rb
from raylog.storage import short_circuit
from raylog.storage.batch import Record, build_batch
from raylog.storage.errors import RaylogError


def _batches(first_offset: int, count: int) -> bytes:
    out = bytearray()
    for i in range(count):
        data = bytearray(build_batch([Record(b"k", b"v%d" % i * 50, 1_000 + i)]))
        rb.set_base_offset(data, 0, first_offset + i)
        out += data
    return bytes(out)


def test_runs_are_read_in_order_across_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(b"xx" + _batches(0, 3))
    b.write_bytes(_batches(3, 2))
    runs = [(str(a), 2, a.stat().st_size - 2), (str(b), 0, b.stat().st_size)]
    for nowait in (False, True):
        data = short_circuit.read_runs(runs, nowait=nowait)
        assert bytes(data) == _batches(0, 3) + _batches(3, 2)
        assert short_circuit.spans(data, 0, 5, verify=True)
    with pytest.raises(OSError):
        short_circuit.read_runs([(str(tmp_path / "gone.log"), 0, 10)])
    with pytest.raises(OSError, match="of 100 bytes"):
        short_circuit.read_runs([(str(a), a.stat().st_size - 10, 100)])


def test_spans_holds_only_for_whole_checked_batches_of_the_located_offsets() -> None:
    data = bytearray(_batches(10, 4))
    assert short_circuit.spans(data, 10, 14, verify=True)
    assert not short_circuit.spans(data, 11, 14, verify=True)  # another first batch
    assert not short_circuit.spans(data, 10, 15, verify=True)  # another last batch
    assert not short_circuit.spans(data[:-1], 10, 14, verify=True)  # cut
    assert not short_circuit.spans(b"", 10, 14, verify=True)
    data[-2] ^= 0x04  # damaged inside the last batch
    assert not short_circuit.spans(data, 10, 14, verify=True)
    assert short_circuit.spans(data, 10, 14, verify=False)  # a decoder checks CRCs itself


def test_a_nowait_read_of_bytes_not_in_the_page_cache_would_block(tmp_path: Path) -> None:
    path = tmp_path / "cold.log"
    payload = _batches(0, 200)
    runs = [(str(path), 0, len(payload))]
    # On one CPU: pages just written may still sit in a CPU's batch of pages not yet on the
    # kernel's LRU lists, which DONTNEED then misses unless it runs on that same CPU (it
    # failed so once, on a busy machine). A few tries, each dropping the clean pages again.
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(affinity)})
    try:
        with open(path, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        blocked = False
        for _ in range(5):
            with open(path, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # clean: dropped
            if not short_circuit._nowait_supported:
                pytest.skip("this filesystem has no RWF_NOWAIT")
            try:
                short_circuit.read_runs(runs, nowait=True)
            except short_circuit.WouldBlock:
                blocked = True
                break
    finally:
        os.sched_setaffinity(0, affinity)
    if not blocked:
        if short_circuit._nowait_supported:  # it was not refused: the read should have blocked
            pytest.fail("a read of evicted pages did not report that it would block")
        pytest.skip("this filesystem has no RWF_NOWAIT")
    assert bytes(short_circuit.read_runs(runs)) == payload  # the blocking read (a thread's)
    assert bytes(short_circuit.read_runs(runs, nowait=True)) == payload  # cached now


def test_runs_are_read_in_slices_of_whole_batches(tmp_path: Path) -> None:
    small = _batches(0, 6)  # six batches of about 200 bytes
    big = bytearray(build_batch([Record(b"k", b"x" * 3000, 2_000)]))  # larger than a slice
    rb.set_base_offset(big, 0, 6)
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(b"xx" + small + bytes(big))
    b.write_bytes(_batches(7, 3))
    runs = [(str(a), 2, a.stat().st_size - 2), (str(b), 0, b.stat().st_size)]
    slices = list(short_circuit.read_slices(runs, 1024))
    assert b"".join(bytes(data) for data, _ in slices) == small + bytes(big) + _batches(7, 3)
    assert bytes(big) in [bytes(data) for data, _ in slices]  # a slice of its own
    for data, last in slices:
        headers = [(pos, h) for pos, h in rb.iter_batches(data, verify=True)]  # whole batches
        assert headers[-1][0] == last
        assert len(data) <= 1024 or len(headers) == 1
    with pytest.raises(RaylogError, match="passes its run"):  # cut inside the big batch
        list(short_circuit.read_slices([(str(a), 2, len(small) + 100)], 1024))
    with pytest.raises(RaylogError, match="inside a batch header"):
        list(short_circuit.read_slices([(str(a), 2, len(small) + 20)], 1024))
    with pytest.raises(RaylogError, match="batch length"):  # not batches at all
        list(short_circuit.read_slices([(str(a), 0, 500)], 1024))
    with pytest.raises(OSError):
        list(short_circuit.read_slices([(str(tmp_path / "gone.log"), 0, 10)], 1024))
    with pytest.raises(OSError, match="of 100 bytes"):
        list(short_circuit.read_slices([(str(b), b.stat().st_size - 10, 100)], 1024))
