"""The link fetchers (``gateway/links/mirrors.py``) under a slow and cut network: a
fault-injecting TCP proxy (``support.tcp_proxy``) between the fetchers and a live source (the
real gateway over ``InMemoryLogBackend``, whose Metadata advertises the proxy's address), the
destination being the in-memory stand-in of ``mirror_append``.

Proves, while batches are produced to the source throughout: with 200 ms of delay each way,
with the connections cut and restored repeatedly, with connections reset in the middle of a
response, and with the network stalled for longer than a source call's bound, every batch is
mirrored exactly once, byte for byte at its offsets and in order; a cut shows as the
partitions' source error while it lasts, and every error clears once the network is back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
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
from support.mirror_replica import MirrorLeaders, MirrorLog
from support.tcp_proxy import TcpProxy
from support.waiting import wait_until_async

from raylog.gateway.links import mirrors
from raylog.gateway.links.mirrors import LinkMirrors

WAIT_S = 60.0
CONFIGS = {"link.fetch.max.wait.ms": "100", "link.fetch.partition.max.bytes": "2048"}
# A source call's bound beyond the long poll: room for a few 400 ms round trips (a new
# connection's ApiVersions, then the call), short enough for a stall to outlast it.
REQUEST_TIMEOUT_MS = 2_000


@pytest.fixture(autouse=True)
def short_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mirrors, "ERROR_BACKOFF_S", 0.2)


@pytest.fixture
def behind_proxy() -> Iterator[tuple[LiveGateway, TcpProxy]]:
    source = LiveGateway(InMemoryLogBackend(topic_states=source_topics()))
    source.start()
    proxy = TcpProxy(source.port).start()
    source.backend.port = proxy.port  # Metadata sends every client through the proxy
    try:
        yield source, proxy
    finally:
        proxy.stop()
        source.stop()


async def no_report(_: list[dict[str, Any]]) -> None:
    return None


@asynccontextmanager
async def mirroring(proxy: TcpProxy) -> AsyncIterator[tuple[LinkMirrors, MirrorLeaders]]:
    leaders = MirrorLeaders({(TOPIC, p): MirrorLog(DEST_EPOCH) for p in range(PARTITIONS)})
    link_mirrors = LinkMirrors(
        BROKER, leaders.append, no_report, request_timeout_ms=REQUEST_TIMEOUT_MS
    )
    link_mirrors.update(mirror_metadata(proxy.address, configs=CONFIGS))
    try:
        yield link_mirrors, leaders
    finally:
        await link_mirrors.aclose()


class Producer:
    """Appends a batch to a source partition, round robin, every ``interval_s`` until told."""

    def __init__(self, source: LiveGateway, interval_s: float = 0.02) -> None:
        self.source = source
        self.interval_s = interval_s
        self.sent = 0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        backend = self.source.backend
        assert isinstance(backend, InMemoryLogBackend)
        while True:  # ends when stopped (cancelled)
            partition = self.sent % PARTITIONS
            batch = source_batch(f"b{self.sent}", n=1 + self.sent % 5)
            await on_source(self.source, backend.append, TOPIC, partition, batch)
            self.sent += 1
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        self._task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self._task


async def all_mirrored(source: LiveGateway, leaders: MirrorLeaders, link: LinkMirrors) -> None:
    backend = source.backend
    assert isinstance(backend, InMemoryLogBackend)
    await wait_until_async(
        lambda: all(mirror_matches(backend, leaders, p) for p in range(PARTITIONS)),
        timeout_s=WAIT_S,
        interval_s=0.05,
        message="every batch mirrored",
    )
    await wait_until_async(
        lambda: all(e["error"] == "" and e["lag_records"] == 0 for e in link.progress()),
        timeout_s=WAIT_S,
        interval_s=0.05,
        message="no error and no lag",
    )


async def grows(link: LinkMirrors) -> None:
    """Wait until the fetchers mirror more records than they had."""

    def mirrored() -> int:
        return sum(e["records"] for e in link.progress())

    start = mirrored()
    await wait_until_async(
        lambda: mirrored() > start, timeout_s=WAIT_S, message="more records mirrored"
    )


def run(test: Any) -> None:
    asyncio.run(asyncio.wait_for(test(), 180))


def test_delay_each_way(behind_proxy: tuple[LiveGateway, TcpProxy]) -> None:
    source, proxy = behind_proxy
    proxy.delay(0.2, 0.2)

    async def test() -> None:
        async with mirroring(proxy) as (link, leaders):
            producer = Producer(source)
            await wait_until_async(
                lambda: producer.sent >= 60, timeout_s=WAIT_S, message="60 batches produced"
            )
            await producer.stop()
            await all_mirrored(source, leaders, link)

    run(test)


def test_cut_and_restored_repeatedly(behind_proxy: tuple[LiveGateway, TcpProxy]) -> None:
    source, proxy = behind_proxy

    async def test() -> None:
        async with mirroring(proxy) as (link, leaders):
            producer = Producer(source)
            for _ in range(3):
                await grows(link)
                await asyncio.to_thread(proxy.cut)
                await wait_until_async(
                    lambda: all(e["error"].startswith("source:") for e in link.progress()),
                    timeout_s=WAIT_S,
                    message="the cut shown as a source error",
                )
                await asyncio.to_thread(proxy.restore)
                await wait_until_async(
                    lambda: all(e["error"] == "" for e in link.progress()),
                    timeout_s=WAIT_S,
                    message="errors cleared after the restore",
                )
            await producer.stop()
            await all_mirrored(source, leaders, link)

    run(test)


def test_connections_reset_mid_response(behind_proxy: tuple[LiveGateway, TcpProxy]) -> None:
    source, proxy = behind_proxy

    async def test() -> None:
        async with mirroring(proxy) as (link, leaders):
            producer = Producer(source)
            # Fetch answers with records are the large ones going back to the fetcher.
            await asyncio.to_thread(proxy.reset_mid_response, 5, 200)
            await wait_until_async(
                lambda: proxy.resets >= 5, timeout_s=WAIT_S, message="five resets"
            )
            await producer.stop()
            await all_mirrored(source, leaders, link)
            assert proxy.connections >= 6  # a new connection after each reset

    run(test)


def test_stall_longer_than_a_call_bound(behind_proxy: tuple[LiveGateway, TcpProxy]) -> None:
    source, proxy = behind_proxy

    async def test() -> None:
        async with mirroring(proxy) as (link, leaders):
            producer = Producer(source)
            await grows(link)
            await asyncio.to_thread(proxy.stall)
            stalled = time.monotonic()
            await wait_until_async(
                lambda: any("no answer within" in e["error"] for e in link.progress()),
                timeout_s=WAIT_S,
                message="a call failing at its bound",
            )
            # The bound: the long poll plus REQUEST_TIMEOUT_MS (and a backoff), not more.
            assert time.monotonic() - stalled < 2 * REQUEST_TIMEOUT_MS / 1000 + 1
            await asyncio.to_thread(proxy.restore)
            await producer.stop()
            await all_mirrored(source, leaders, link)

    run(test)
