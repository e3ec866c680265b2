"""The link fetchers (``gateway/links/mirrors.py``, :class:`LinkMirrors`) between a live source
(the real gateway over ``InMemoryLogBackend``: Kafka's protocol over loopback TCP, read by
raylog's own Kafka client) and an in-memory stand-in of the destination leaders'
``mirror_append`` (``support.mirror_replica``, over the real ``mirrored_batches``).

Proves: every batch of several partitions is mirrored byte for byte at its offsets, over many
Fetch rounds, and batches produced while the link runs follow; ``progress()`` shows the lag
while behind and 0 once caught up; a destination refusal (a stale leader epoch, a replica not
yet told it mirrors) shows as the partition's error, is retried only after the backoff, and
clears once the replica takes the batches, and ``update()`` with the new epoch resumes from the
replica's log end (nothing fetched twice, nothing skipped); a source whose log start lies
above the mirror's end is continued at its log start (a gap, or an empty mirror starting
over there); a source whose log ends below the mirror's stops that partition with the error
while the others go on; a source leader change (FENCED_LEADER_EPOCH) is followed; a source
error code backs the partition off (no busy loop) and clears with the next good answer; the
throttle bounds the bytes each Fetch asks for and sleeps bytes / rate.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from support.gateway import InMemoryLogBackend, LiveGateway
from support.link_fetch import (
    BROKER,
    DEST_EPOCH,
    PARTITIONS,
    TOPIC,
    mirror_matches,
    mirror_metadata,
    on_source,
    source_batch,
    source_topics,
)
from support.mirror_replica import MirrorLeaders, MirrorLog, unstamped
from support.waiting import wait_until_async

from raylog.gateway.links import mirrors
from raylog.gateway.links.mirrors import LinkMirrors

WAIT_S = 30.0
BACKOFF_S = 0.3
FAST = {"link.fetch.max.wait.ms": "50", "link.metadata.refresh.interval.ms": "200"}
SMALL_FETCH = {**FAST, "link.fetch.partition.max.bytes": "1024"}


@pytest.fixture(autouse=True)
def short_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mirrors, "ERROR_BACKOFF_S", BACKOFF_S)


@pytest.fixture
def source() -> Iterator[LiveGateway]:
    gateway = LiveGateway(InMemoryLogBackend(topic_states=source_topics()))
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


def backend_of(gateway: LiveGateway) -> InMemoryLogBackend:
    assert isinstance(gateway.backend, InMemoryLogBackend)
    return gateway.backend


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 120))


async def no_report(_: list[dict[str, Any]]) -> None:
    return None


def leaders_at(epochs: dict[int, int] | None = None) -> MirrorLeaders:
    return MirrorLeaders(
        {(TOPIC, p): MirrorLog((epochs or {}).get(p, DEST_EPOCH)) for p in range(PARTITIONS)}
    )


@asynccontextmanager
async def fetchers(leaders: MirrorLeaders, **kwargs: Any) -> AsyncIterator[LinkMirrors]:
    link_mirrors = LinkMirrors(BROKER, leaders.append, no_report, **kwargs)
    try:
        yield link_mirrors
    finally:
        await link_mirrors.aclose()


async def produce(source: LiveGateway, partition: int, count: int, tag: str) -> None:
    for i in range(count):
        await on_source(
            source, backend_of(source).append, TOPIC, partition, source_batch(f"{tag}{i}")
        )


def state(link_mirrors: LinkMirrors, partition: int) -> dict[str, Any]:
    (entry,) = [e for e in link_mirrors.progress() if e["partition"] == partition]
    return entry


def fetch_offsets(source: LiveGateway, partition: int) -> list[int]:
    return [o for t, p, o, _ in list(backend_of(source).fetched) if (t, p) == (TOPIC, partition)]


def test_every_batch_mirrored_byte_for_byte_over_partitions_and_rounds(
    source: LiveGateway,
) -> None:
    async def test() -> None:
        for p in range(PARTITIONS):
            await produce(source, p, 4 + p, f"p{p}-")
        leaders = leaders_at()
        async with fetchers(leaders) as link_mirrors:
            link_mirrors.update(mirror_metadata(source.bootstrap, configs=SMALL_FETCH))
            # ... and what is produced while the link runs.
            for p in range(PARTITIONS):
                await produce(source, p, 3, f"late{p}-")
            backend = backend_of(source)
            await wait_until_async(
                lambda: all(mirror_matches(backend, leaders, p) for p in range(PARTITIONS)),
                timeout_s=WAIT_S,
                message="every partition mirrored",
            )
            # One Fetch answer holds about one batch (1 KiB per partition): many rounds.
            assert len(set(fetch_offsets(source, 0))) >= 7
            for p in range(PARTITIONS):
                mirrored = leaders.logs[(TOPIC, p)].batches
                assert all(data[12:16] == DEST_EPOCH.to_bytes(4, "big") for _, data in mirrored), (
                    "each batch carries the destination leader's epoch"
                )
            await wait_until_async(
                lambda: all(e["lag_records"] == 0 for e in link_mirrors.progress()),
                timeout_s=WAIT_S,
                message="no lag",
            )
            for p in range(PARTITIONS):
                entry = state(link_mirrors, p)
                end = backend.end(TOPIC, p)
                assert entry["state"] == "fetching" and entry["error"] == ""
                assert entry["log_end_offset"] == entry["source_high_watermark"] == end
                assert entry["records"] == end and entry["lag_ms"] == 0

    run(test)


def test_progress_shows_lag_while_behind_and_the_throttle_bounds_each_fetch(
    source: LiveGateway,
) -> None:
    async def test() -> None:
        await produce(source, 0, 6, "t")
        backend = backend_of(source)
        total = sum(len(b) for _, b in backend.logs[(TOPIC, 0)])
        rate = 2048
        asked: list[float] = []
        release = asyncio.Event()

        async def throttle_sleep(seconds: float) -> None:
            asked.append(seconds)
            await release.wait()  # held: the mirror stays behind until the test lets go

        leaders = leaders_at()
        async with fetchers(leaders, throttle_sleep=throttle_sleep) as link_mirrors:
            configs = {**FAST, "link.throttle.bytes.per.sec": str(rate)}
            link_mirrors.update(mirror_metadata(source.bootstrap, configs=configs))
            await wait_until_async(lambda: asked, timeout_s=WAIT_S, message="a throttle sleep")
            behind = state(link_mirrors, 0)
            assert behind["source_high_watermark"] == backend.end(TOPIC, 0)
            assert 0 < behind["log_end_offset"] < behind["source_high_watermark"]
            assert behind["lag_records"] == (
                behind["source_high_watermark"] - behind["log_end_offset"]
            )
            assert behind["state"] == "fetching"
            release.set()
            await wait_until_async(
                lambda: mirror_matches(backend, leaders, 0),
                timeout_s=WAIT_S,
                message="partition 0 mirrored",
            )
            await wait_until_async(
                lambda: state(link_mirrors, 0)["lag_records"] == 0,
                timeout_s=WAIT_S,
                message="no lag",
            )
        # Each Fetch asked for at most a second's worth, and the sleeps asked for are what
        # the appended bytes take at the rate.
        assert all(max_bytes <= rate for *_, max_bytes in backend.fetched)
        assert len(asked) >= 2
        assert sum(asked) == pytest.approx(total / rate)

    run(test)


def test_destination_refusals_back_off_and_a_new_epoch_resumes_at_the_log_end(
    source: LiveGateway,
) -> None:
    async def test() -> None:
        for p in range(2):
            await produce(source, p, 5, f"r{p}-")
        backend = backend_of(source)
        # Partition 0's replica leads a newer epoch than this gateway's metadata says, and
        # already holds the first two batches; partition 1's is not yet told it mirrors.
        leaders = leaders_at({0: DEST_EPOCH + 1})
        first_two = backend.logs[(TOPIC, 0)][:2]
        leaders.logs[(TOPIC, 0)].batches = list(first_two)
        leaders.logs[(TOPIC, 1)].mirror = False
        async with fetchers(leaders) as link_mirrors:
            link_mirrors.update(mirror_metadata(source.bootstrap, configs=FAST))
            refused = leaders.logs[(TOPIC, 0)].calls
            await wait_until_async(
                lambda: len(refused) >= 3, timeout_s=WAIT_S, message="three refusals"
            )
            assert all(err == 74 for _, _, err in refused)  # FENCED_LEADER_EPOCH
            gaps = [b[0] - a[0] for a, b in itertools.pairwise(refused)]
            assert min(gaps) >= BACKOFF_S * 0.9, gaps
            assert "destination:" in state(link_mirrors, 0)["error"]
            assert state(link_mirrors, 1)["state"] == "error"
            assert fetch_offsets(source, 0) == []  # never fetched without a log end
            # The replica learns it mirrors: taken after the next backoff, error cleared.
            leaders.logs[(TOPIC, 1)].mirror = True
            await wait_until_async(
                lambda: mirror_matches(backend, leaders, 1),
                timeout_s=WAIT_S,
                message="partition 1 mirrored",
            )
            assert state(link_mirrors, 1)["error"] == ""
            # The metadata catches up with partition 0's epoch: resumed at its log end.
            link_mirrors.update(mirror_metadata(source.bootstrap, {0: DEST_EPOCH + 1}, FAST))
            await wait_until_async(
                lambda: mirror_matches(backend, leaders, 0),
                timeout_s=WAIT_S,
                message="partition 0 mirrored",
            )
            resumed_at = first_two[-1][0] + 4  # the second batch's next offset
            assert fetch_offsets(source, 0)[0] == resumed_at
            assert state(link_mirrors, 0)["error"] == ""

    run(test)


def test_the_mirror_follows_a_source_log_start_above_it(source: LiveGateway) -> None:
    async def test() -> None:
        backend = backend_of(source)
        for p in range(2):
            await produce(source, p, 5, f"g{p}-")
        batches = {p: list(backend.logs[(TOPIC, p)]) for p in range(2)}
        leaders = leaders_at()
        # Partition 0's mirror holds the first batch; the source then deleted up to its
        # fourth. Partition 1's mirror is empty; the source deleted up to its third.
        leaders.logs[(TOPIC, 0)].batches = [batches[0][0]]
        await on_source(source, backend.delete_before, TOPIC, 0, batches[0][3][0])
        await on_source(source, backend.delete_before, TOPIC, 1, batches[1][2][0])
        async with fetchers(leaders) as link_mirrors:
            link_mirrors.update(mirror_metadata(source.bootstrap, configs=FAST))
            # The mirror's batch is gone at the source: it goes, and the rest lies above a gap.
            want0 = [(b, unstamped(d)) for b, d in batches[0][3:]]
            want1 = [(b, unstamped(d)) for b, d in batches[1][2:]]
            await wait_until_async(
                lambda: leaders.records(TOPIC, 0) == want0 and leaders.records(TOPIC, 1) == want1,
                timeout_s=WAIT_S,
                message="both partitions continued at the source's log start",
            )
            assert leaders.logs[(TOPIC, 1)].log_start == batches[1][2][0]
            await wait_until_async(
                lambda: all(state(link_mirrors, p)["lag_records"] == 0 for p in range(2)),
                timeout_s=WAIT_S,
                message="no lag",
            )
            assert all(state(link_mirrors, p)["error"] == "" for p in range(2))

    run(test)


def test_source_ending_below_the_mirror_stops_that_partition(source: LiveGateway) -> None:
    async def test() -> None:
        backend = backend_of(source)
        for p in range(2):
            await produce(source, p, 4, f"s{p}-")
        leaders = leaders_at()
        leaders.logs[(TOPIC, 0)].batches = list(backend.logs[(TOPIC, 0)])
        # The source lost its last two batches of partition 0 (an unclean election there).
        await on_source(source, backend.truncate, TOPIC, 0, backend.logs[(TOPIC, 0)][2][0])
        async with fetchers(leaders) as link_mirrors:
            link_mirrors.update(mirror_metadata(source.bootstrap, configs=FAST))
            await wait_until_async(
                lambda: state(link_mirrors, 0)["state"] == "error",
                timeout_s=WAIT_S,
                message="partition 0 stopped",
            )
            assert "below the mirror's" in state(link_mirrors, 0)["error"]
            stopped_fetches = len(fetch_offsets(source, 0))
            await wait_until_async(
                lambda: mirror_matches(backend, leaders, 1),
                timeout_s=WAIT_S,
                message="partition 1 mirrored",
            )
            await produce(source, 1, 3, "more")
            await wait_until_async(
                lambda: mirror_matches(backend, leaders, 1) and len(fetch_offsets(source, 1)) > 6,
                timeout_s=WAIT_S,
                message="partition 1 goes on",
            )
            assert len(fetch_offsets(source, 0)) == stopped_fetches  # stopped: not fetched
            assert len(leaders.logs[(TOPIC, 0)].batches) == 4  # nothing removed nor added

    run(test)


def test_source_leader_change_and_errors_back_off_then_clear(source: LiveGateway) -> None:
    async def test() -> None:
        backend = backend_of(source)
        await produce(source, 0, 2, "a")
        await produce(source, 1, 2, "b")
        leaders = leaders_at()
        async with fetchers(leaders) as link_mirrors:
            link_mirrors.update(mirror_metadata(source.bootstrap, configs=FAST))
            await wait_until_async(
                lambda: all(mirror_matches(backend, leaders, p) for p in range(2)),
                timeout_s=WAIT_S,
                message="mirrored",
            )
            # The source's leaders move (a new epoch): FENCED_LEADER_EPOCH, then followed.
            await on_source(source, setattr, backend, "topic_states", source_topics(5, 2))
            # Partition 1 answers TOPIC_AUTHORIZATION_FAILED: shown, backed off, not busy.
            await on_source(source, backend.fetch_errors.__setitem__, (TOPIC, 1), 29)
            await produce(source, 0, 2, "c")
            await wait_until_async(
                lambda: mirror_matches(backend, leaders, 0),
                timeout_s=WAIT_S,
                message="partition 0 followed its new leader",
            )
            await wait_until_async(
                lambda: state(link_mirrors, 1)["error"] == "source: error 29",
                timeout_s=WAIT_S,
                message="partition 1's error shown",
            )
            before, started = len(fetch_offsets(source, 1)), time.monotonic()
            await wait_until_async(
                lambda: len(fetch_offsets(source, 1)) >= before + 3,
                timeout_s=WAIT_S,
                message="three more fetches of partition 1",
            )
            assert time.monotonic() - started >= 2 * BACKOFF_S  # one per backoff, not busy
            await on_source(source, backend.fetch_errors.pop, (TOPIC, 1))
            await produce(source, 1, 1, "d")
            await wait_until_async(
                lambda: (
                    mirror_matches(backend, leaders, 1) and state(link_mirrors, 1)["error"] == ""
                ),
                timeout_s=WAIT_S,
                message="partition 1's error cleared",
            )
            await wait_until_async(
                lambda: all(e["error"] == "" for e in link_mirrors.progress()),
                timeout_s=WAIT_S,
                message="no partition in error",
            )

    run(test)
