"""read_committed reads of real replica actors (one partition, RF=3), every read path.

The partition holds a committed transaction, an aborted one (both of producer 11, ended by
markers the leader wrote with ``write_txn_marker``), plain records, then producer 12's open
transaction and plain records after it. Proves:
- ``fetch_bounds`` gives the last stable offset (producer 12's first offset) for
  read_committed and the high watermark for read_uncommitted;
- ``read_range`` with read_committed yields exactly the committed and plain records below the
  LSO, whether the replica is read short-circuit (the reader on its node), through Ray
  (``RAYLOG_SHORT_CIRCUIT_READS=0``), or from what the planner located (no fetch call);
  read_uncommitted yields every data record; no marker is ever a row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import ray
from support.pipelines import RF, catalog_json, produce, start_topic
from support.waiting import wait_until

from raylog.pipelines.catalog import StaticCatalog
from raylog.pipelines.reading import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    Located,
    OffsetRange,
    _Fetcher,
    fetch_bounds,
    locate,
    read_range,
)
from raylog.storage import batch as rb
from raylog.storage.short_circuit import SHORT_CIRCUIT_ENV, ReadStats

pytestmark = pytest.mark.slow

TOPIC = "txn-reads"
TS = 1_700_000_000_000


def _batch(values: list[bytes], pid: int = -1, sequence: int = -1) -> bytes:
    return rb.build_batch(
        [rb.Record(None, v, TS) for v in values],
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=sequence,
        transactional=pid >= 0,
    )


def _marker(leader: Any, pid: int, commit: bool) -> None:
    outcome = ray.get(leader.write_txn_marker.remote(pid, 0, 0, commit, 10_000), timeout=60)
    assert outcome.error_code == 0, outcome


@pytest.fixture(scope="module")
def partition(
    ray_local: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    replicas = start_topic(tmp_path_factory.mktemp("txn-reads"), TOPIC, 1)
    leader = replicas[0][0]
    committed, aborted = [b"c0", b"c1", b"c2"], [b"a0", b"a1"]
    plain, open_txn, later = [b"p0", b"p1"], [b"o0", b"o1"], [b"l0"]
    produce(leader, [_batch(committed, 11, 0)])
    _marker(leader, 11, True)
    produce(leader, [_batch(aborted, 11, 3)])
    _marker(leader, 11, False)
    produce(leader, [_batch(plain)])
    [open_at] = produce(leader, [_batch(open_txn, 12, 0)])
    produce(leader, [_batch(later)])
    yield {
        "committed": committed + plain,
        "every": committed + aborted + plain + open_txn + later,
        "lso": open_at,
        "hwm": open_at + len(open_txn) + len(later),
    }
    for handle in replicas[0].values():
        ray.kill(handle)


def _infos() -> Any:
    return StaticCatalog.from_json(catalog_json(TOPIC, 1)).partitions(TOPIC)


def _ranges(level: int) -> list[OffsetRange]:
    [info] = _infos()
    bounds = fetch_bounds([info], level)[(TOPIC, 0)]
    return [OffsetRange(TOPIC, 0, 0, bounds.high_watermark, tuple(range(RF)))]


def _values(
    ranges: list[OffsetRange],
    level: int,
    located: Located | None = None,
    stats: ReadStats | None = None,
) -> list[bytes]:
    stats = stats if stats is not None else ReadStats()
    batches = [
        b
        for r in ranges
        for b in read_range(r, stats=stats, located=located, isolation_level=level)
    ]
    return pa.Table.from_batches(batches).column("value").to_pylist()


def test_bounds_end_at_the_last_stable_offset(partition: dict[str, Any]) -> None:
    [info] = _infos()
    committed = fetch_bounds([info], READ_COMMITTED)[(TOPIC, 0)]
    every = fetch_bounds([info], READ_UNCOMMITTED)[(TOPIC, 0)]
    assert (committed.high_watermark, committed.read_committed) == (partition["lso"], True)
    assert (every.high_watermark, every.read_committed) == (partition["hwm"], False)


@pytest.mark.parametrize("short_circuit", ["1", "0"])
def test_read_range_filters_aborted_records(
    partition: dict[str, Any], short_circuit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SHORT_CIRCUIT_ENV, short_circuit)
    # A follower reaches the leader's LSO with its next fetch: wait until every replica has.
    committed = partition["committed"]
    wait_until(
        lambda: all(
            _values([OffsetRange(TOPIC, 0, 0, partition["lso"], (rid,))], READ_COMMITTED)
            == committed
            for rid in range(RF)
        ),
        timeout_s=30,
        interval_s=0.2,
        message="every replica reads the committed records",
    )
    stats = ReadStats()
    assert _values(_ranges(READ_COMMITTED), READ_COMMITTED, stats=stats) == committed
    assert _values(_ranges(READ_UNCOMMITTED), READ_UNCOMMITTED, stats=stats) == partition["every"]
    through_ray = short_circuit == "0"
    assert (stats.ray_bytes > 0, stats.local_bytes > 0) == (through_ray, not through_ray)


def test_located_ranges_filter_aborted_records(
    partition: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    ranges = _ranges(READ_COMMITTED)
    found: list[Located | None] = []

    def located() -> bool:
        found[:] = locate(ranges, READ_COMMITTED)
        return found[0] is not None and found[0].next_offset >= ranges[0].end

    wait_until(located, timeout_s=30, interval_s=0.1, message="the range located to its end")
    assert found[0] is not None and found[0].aborted_transactions == ((11, 4),)

    def no_fetch(*_: Any, **__: Any) -> Any:
        raise AssertionError("a located range made a fetch call")

    monkeypatch.setattr(_Fetcher, "call", no_fetch)
    assert _values(ranges, READ_COMMITTED, found[0]) == partition["committed"]
