"""The link fetchers of one broker: its mirror partitions, fetched from their links' sources.

This module owns the data path of cross-cluster links (KIP-986) on the destination. For every
mirror partition this broker leads (``TopicMetadata.mirror`` of an active link, per the
controller's metadata), the gateway fetches the source partition with the Kafka protocol (one
:class:`~raylog.actors.transport.kafka_client.KafkaClient` per link, one Fetch per source
broker carrying all of its partitions) and hands the raw batches to the local leader replica's
``mirror_append``, which appends them at their source offsets and replicates them as it
replicates produced batches.

Why no record is lost, duplicated or reordered (the argument the code relies on):
- The fetch position of a partition is always the leader replica's log end, read from the
  replica itself (``mirror_append`` with no batches, and every append's answer); it is never
  kept anywhere else. A destination leader change therefore needs no hand-over: the new
  leader's log end is where its gateway resumes. Batches the old leader appended above what
  the new one holds are removed from the followers by the destination's own epoch truncation
  (they were never acknowledged to anyone), and fetched again.
- Source offsets are kept byte for byte, so a batch fetched twice (a retry, an overlap after a
  leader change) is recognised by its offsets: the replica skips batches wholly below its log
  end. Batches go in offset order because one partition has at most one fetch and one append
  in flight at a time, and the next fetch starts at the end the append reported.
- A stale fetcher cannot write: each append carries the leader epoch under which the fetcher
  was started, and the replica refuses any other epoch. Disconnecting a link bumps every
  mirror's leader epoch (``control/link_changes.py``), so an append in flight at that moment
  is refused.
- A source whose log start moved above the mirror's end (retention) is continued at its log
  start: the offsets in between are a gap, as in a compacted log, never renumbered. A source
  whose log end lies below the mirror's end has lost data the mirror holds (an unclean
  election there): the partition stops with that error rather than diverging silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from raylog.actors.control.links import LINK_CONFIGS, ClusterLink
from raylog.actors.control.metadata import ClusterMetadata
from raylog.actors.transport.kafka_client import KafkaClient, KafkaClientError, LinkSecurity
from raylog.gateway.errors import ErrorCode

log = logging.getLogger(__name__)

ERROR_BACKOFF_S = 1.0
REPORT_INTERVAL_S = 1.0
IDLE_WAIT_S = 1.0
# Source errors after which the partition's leader may have moved: refresh the metadata.
_REFRESH_ON = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.KAFKA_STORAGE_ERROR,
}
EARLIEST = -2
LATEST = -1

# (topic, partition, leader epoch) -> the replica's MirrorOutcome
AppendCall = Callable[[str, int, int, bytes], Awaitable[Any]]
ReportCall = Callable[[list[dict[str, Any]]], Awaitable[None]]


def _config_int(link: ClusterLink, key: str) -> int:
    return int(link.configs.get(key, LINK_CONFIGS[key][0]))


@dataclass
class _Partition:
    """One mirror partition this broker leads, under one leader epoch."""

    topic: str
    partition: int
    leader_epoch: int
    position: int = -1  # the replica's log end: the next source offset (-1: not asked yet)
    source_hw: int = -1
    error: str = ""
    stopped: bool = False  # a condition only a new leader epoch or the operator clears
    retry_at: float = 0.0  # after a destination error: not before this (monotonic s)
    behind_since: float | None = None
    records: int = 0
    bytes: int = 0


@dataclass
class _Runner:
    link: ClusterLink
    partitions: dict[tuple[str, int], _Partition] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class LinkMirrors:
    """The mirror partitions broker ``broker_id`` leads, kept current by :meth:`update`."""

    def __init__(self, broker_id: int, append: AppendCall, report: ReportCall) -> None:
        self.broker_id = broker_id
        self._append = append
        self._report = report
        self._runners: dict[str, _Runner] = {}
        self._reporter: asyncio.Task[None] | None = None

    def update(self, md: ClusterMetadata) -> None:
        """Start, change or stop the per-link fetchers to match the metadata."""
        wanted: dict[str, dict[tuple[str, int], int]] = {}
        for name, t in md.topics.items():
            if t.mirror is None:
                continue
            link = md.links.get(t.mirror.link)
            if link is None or not link.active:
                continue
            for p in t.partitions:
                if p.leader == self.broker_id:
                    wanted.setdefault(link.name, {})[(name, p.partition)] = p.leader_epoch
        for name in list(self._runners):
            runner = self._runners[name]
            if name not in wanted or md.links[name] != runner.link:
                del self._runners[name]
                if runner.task is not None:
                    runner.task.cancel()
        for name, parts in wanted.items():
            runner = self._runners.get(name)
            if runner is None:
                runner = self._runners[name] = _Runner(md.links[name])
                runner.task = asyncio.get_running_loop().create_task(self._run(runner))
            for key in list(runner.partitions):
                if runner.partitions[key].leader_epoch != parts.get(key):
                    del runner.partitions[key]
            for (topic, partition), epoch in parts.items():
                if (topic, partition) not in runner.partitions:
                    runner.partitions[(topic, partition)] = _Partition(topic, partition, epoch)
            runner.changed.set()
        if self._runners and self._reporter is None:
            self._reporter = asyncio.get_running_loop().create_task(self._report_loop())

    async def aclose(self) -> None:
        tasks = [r.task for r in self._runners.values() if r.task is not None]
        if self._reporter is not None:
            tasks.append(self._reporter)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._runners = {}
        self._reporter = None

    # --- progress -------------------------------------------------------------------------------

    def progress(self) -> list[dict[str, Any]]:
        """Each partition's state as ``links describe`` shows it (``MirrorProgress`` fields)."""
        now = time.monotonic()
        out = []
        for runner in self._runners.values():
            for p in runner.partitions.values():
                lag = max(0, p.source_hw - p.position) if p.position >= 0 <= p.source_hw else -1
                out.append(
                    {
                        "link": runner.link.name,
                        "topic": p.topic,
                        "partition": p.partition,
                        "broker_id": self.broker_id,
                        "state": "error" if p.error else "fetching",
                        "source_high_watermark": p.source_hw,
                        "log_end_offset": p.position,
                        "lag_records": lag,
                        "lag_ms": int((now - p.behind_since) * 1000) if p.behind_since else 0,
                        "records": p.records,
                        "bytes": p.bytes,
                        "error": p.error,
                    }
                )
        return out

    async def _report_loop(self) -> None:
        last: dict[tuple[str, int], tuple[float, int, int]] = {}
        while True:  # ends when the gateway stops (cancelled)
            await asyncio.sleep(REPORT_INTERVAL_S)
            now = time.monotonic()
            reports = []
            for entry in self.progress():
                key = (entry["topic"], entry["partition"])
                records, size = entry.pop("records"), entry.pop("bytes")
                then, records_then, size_then = last.get(key, (now, records, size))
                elapsed = max(now - then, 1e-3)
                entry["records_per_sec"] = (records - records_then) / elapsed
                entry["bytes_per_sec"] = (size - size_then) / elapsed
                last[key] = (now, records, size)
                reports.append(entry)
            if reports:
                try:
                    await self._report(reports)
                except Exception as exc:  # the controller away: the next report carries on
                    log.debug("link progress not reported: %s", exc)

    # --- one link -------------------------------------------------------------------------------

    async def _run(self, runner: _Runner) -> None:
        link = runner.link
        client = KafkaClient(
            link.bootstrap,
            client_id=f"raylog-link-{link.name}-broker-{self.broker_id}",
            security=LinkSecurity.from_configs(link.configs),
        )
        leaders: dict[tuple[str, int], tuple[int, int]] = {}  # source (broker, leader epoch)
        refresh_due = 0.0
        refresh_ms = _config_int(link, "link.metadata.refresh.interval.ms")
        try:
            while True:  # ends when cancelled (link changed, leadership moved, gateway stops)
                now = time.monotonic()
                live = [
                    p for p in runner.partitions.values() if not p.stopped and p.retry_at <= now
                ]
                if not live:
                    runner.changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(runner.changed.wait(), IDLE_WAIT_S)
                    continue
                try:
                    if time.monotonic() >= refresh_due or any(
                        (p.topic, p.partition) not in leaders for p in live
                    ):
                        leaders = await self._source_leaders(client, live)
                        refresh_due = time.monotonic() + refresh_ms / 1000
                    await self._positions(live)
                    moved = await self._fetch_round(runner, client, live, leaders)
                except (KafkaClientError, OSError, TimeoutError) as exc:
                    for p in live:
                        p.error = f"source: {exc}"
                    moved = True
                    await asyncio.sleep(ERROR_BACKOFF_S)
                if moved:
                    refresh_due = 0.0
        finally:
            with contextlib.suppress(Exception):
                await client.close()

    async def _source_leaders(
        self, client: KafkaClient, live: list[_Partition]
    ) -> dict[tuple[str, int], tuple[int, int]]:
        meta = await client.metadata(sorted({p.topic for p in live}))
        out = {}
        for p in live:
            topic = meta.topics.get(p.topic)
            info = topic.partitions.get(p.partition) if topic is not None else None
            if info is None or info.leader < 0:
                p.error = "source partition has no leader"
                continue
            out[(p.topic, p.partition)] = (info.leader, info.leader_epoch)
        return out

    async def _positions(self, live: list[_Partition]) -> None:
        """Ask each replica where its log ends (once per leader epoch)."""
        for p in live:
            if p.position < 0:
                await self._append_batches(p, b"")

    async def _append_batches(self, p: _Partition, batches: bytes) -> None:
        outcome = await self._append(p.topic, p.partition, p.leader_epoch, batches)
        if outcome.error_code:
            # Not (yet) the leader of this epoch, or not yet told it mirrors (the metadata
            # reached this gateway before the replica): ask again where it ends, later. A new
            # leader epoch replaces this partition entry altogether.
            p.error = f"destination: {outcome.message or outcome.error_code}"
            p.position = -1
            p.retry_at = time.monotonic() + ERROR_BACKOFF_S
            return
        p.position = outcome.log_end_offset
        p.error = ""

    async def _fetch_round(
        self,
        runner: _Runner,
        client: KafkaClient,
        live: list[_Partition],
        leaders: dict[tuple[str, int], tuple[int, int]],
    ) -> bool:
        """One Fetch per source broker, concurrently; returns whether a leader moved."""
        link = runner.link
        by_broker: dict[int, list[_Partition]] = {}
        for p in live:
            where = leaders.get((p.topic, p.partition))
            if where is not None and p.position >= 0:
                by_broker.setdefault(where[0], []).append(p)
        results = await asyncio.gather(
            *(self._fetch_from(link, client, b, ps, leaders) for b, ps in by_broker.items()),
            return_exceptions=True,
        )
        moved = False
        for result in results:
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                if not isinstance(result, (KafkaClientError, OSError, TimeoutError)):
                    raise result
                log.info("link %s: fetch failed: %s", link.name, result)
                moved = True
            else:
                moved = moved or result
        if moved:
            await asyncio.sleep(ERROR_BACKOFF_S / 4)
        return moved

    async def _fetch_from(
        self,
        link: ClusterLink,
        client: KafkaClient,
        broker: int,
        parts: list[_Partition],
        leaders: dict[tuple[str, int], tuple[int, int]],
    ) -> bool:
        partition_max = _config_int(link, "link.fetch.partition.max.bytes")
        fetched = await client.fetch(
            broker,
            [
                (
                    p.topic,
                    p.partition,
                    p.position,
                    leaders[(p.topic, p.partition)][1],
                    partition_max,
                )
                for p in parts
            ],
            max_wait_ms=_config_int(link, "link.fetch.max.wait.ms"),
            max_bytes=_config_int(link, "link.fetch.max.bytes"),
        )
        moved = False
        throttle = _config_int(link, "link.throttle.bytes.per.sec")
        total = 0
        for p in parts:
            answer = fetched.get((p.topic, p.partition))
            if answer is None:
                continue
            if answer.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                await self._out_of_range(client, broker, p)
                continue
            if answer.error_code:
                p.error = f"source: error {answer.error_code}"
                moved = moved or answer.error_code in _REFRESH_ON
                continue
            p.source_hw = answer.high_watermark
            if answer.records:
                before = p.position
                await self._append_batches(p, answer.records)
                if p.position > before:
                    p.bytes += len(answer.records)
                    p.records += p.position - before
                    total += len(answer.records)
            self._track_lag(p)
        if throttle and total:
            await asyncio.sleep(total / throttle)
        return moved

    async def _out_of_range(self, client: KafkaClient, broker: int, p: _Partition) -> None:
        """The source no longer has (or never had) our position: continue at its log start
        when that lies above (a gap), stop when its log ends below us (it lost data)."""
        key = (p.topic, p.partition)
        earliest = (await client.list_offsets(broker, [(*key, EARLIEST)])).get(key)
        latest = (await client.list_offsets(broker, [(*key, LATEST)])).get(key)
        if earliest is None or latest is None or earliest[0] or latest[0]:
            p.error = "source: offsets unavailable after OFFSET_OUT_OF_RANGE"
            return
        if p.position > latest[1]:
            p.error = (
                f"source log ends at {latest[1]}, below the mirror's {p.position}: the source "
                "lost records the mirror holds; disconnect the topic or recover the link"
            )
            p.stopped = True
        elif p.position < earliest[1]:
            p.position = earliest[1]
            p.error = ""

    def _track_lag(self, p: _Partition) -> None:
        if p.position >= p.source_hw:
            p.behind_since = None
        elif p.behind_since is None:
            p.behind_since = time.monotonic()
