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
  start, never renumbered: the leader, told the source's log start with each append, drops
  what it holds (every record of it is gone at the source) and continues above the gap
  (``actors/replication/mirror.py``); a source log start below the mirror's end moves the
  mirror's log start up with it, as DeleteRecords would. A source
  whose log end lies below the mirror's end has lost data the mirror holds (an unclean
  election there): the partition stops with that error rather than diverging silently.

Bounds, so that a slow or cut network delays mirroring and never wedges it: every source call
is bounded by the client's request timeout (the Fetch's long-poll wait plus
``request_timeout_ms``; a call without an answer drops its connection, and the next opens a new
one); every error (a dropped connection, a partition's error code, a Fetch answer that leaves
a partition out, a destination refusal) backs the partition off by ``ERROR_BACKOFF_S`` before
it is fetched again, and a leaderless source partition is looked up again after that long,
never in a busy loop; a partition's error is shown until the next answer without one clears
it; a fault the fetcher does not know (an append call failing unexpectedly) backs off too,
and never ends the fetcher while its link is active. A throttled link asks each Fetch for at
most one second's worth of bytes (the source still answers a whole first batch, KIP-74) and
sleeps for as long as the bytes it appended take at the throttle rate.
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
# A source call's bound beyond the Fetch's long-poll wait (Kafka's request.timeout.ms default).
REQUEST_TIMEOUT_MS = 30_000
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
AppendCall = Callable[[str, int, int, bytes, int], Awaitable[Any]]
ReportCall = Callable[[list[dict[str, Any]]], Awaitable[None]]
SleepCall = Callable[[float], Awaitable[None]]


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
    progressed_at: float = 0.0  # the last append that moved the position (monotonic s)
    records: int = 0
    bytes: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition

    def back_off(self, error: str) -> None:
        """Show ``error`` and fetch the partition again after ``ERROR_BACKOFF_S``."""
        self.error = error
        self.retry_at = time.monotonic() + ERROR_BACKOFF_S


@dataclass
class _Runner:
    link: ClusterLink
    partitions: dict[tuple[str, int], _Partition] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class LinkMirrors:
    """The mirror partitions broker ``broker_id`` leads, kept current by :meth:`update`."""

    def __init__(
        self,
        broker_id: int,
        append: AppendCall,
        report: ReportCall,
        *,
        request_timeout_ms: int = REQUEST_TIMEOUT_MS,
        throttle_sleep: SleepCall = asyncio.sleep,
    ) -> None:
        """``append(topic, partition, leader_epoch, batches)`` is the local leader replica's
        ``mirror_append``; ``report(progress)`` sends :meth:`progress` to the controller;
        ``request_timeout_ms`` bounds each source call beyond the Fetch's wait;
        ``throttle_sleep`` waits out the throttle (tests record what it is asked)."""
        self.broker_id = broker_id
        self._append = append
        self._report = report
        self._request_timeout_ms = request_timeout_ms
        self._throttle_sleep = throttle_sleep
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
            # A long-polling Fetch waits up to max_wait_ms for data: its bound lies beyond.
            request_timeout_ms=_config_int(link, "link.fetch.max.wait.ms")
            + self._request_timeout_ms,
        )
        leaders: dict[tuple[str, int], tuple[int, int]] = {}  # source (broker, leader epoch)
        looked_up: set[tuple[str, int]] = set()  # the partitions the last lookup asked for
        refresh_due = 0.0
        refresh_s = _config_int(link, "link.metadata.refresh.interval.ms") / 1000
        try:
            while True:  # ends when cancelled (link changed, leadership moved, gateway stops)
                now = time.monotonic()
                live = [
                    p for p in runner.partitions.values() if not p.stopped and p.retry_at <= now
                ]
                if not live:
                    await self._idle(runner, refresh_due)
                    continue
                try:
                    if now >= refresh_due or any(p.key not in looked_up for p in live):
                        # Every partition, those backing off too: each is known when it is due.
                        wanted = [p for p in runner.partitions.values() if not p.stopped]
                        leaders = await self._source_leaders(client, wanted)
                        looked_up = {p.key for p in wanted}
                        # A leaderless partition is looked up again after the backoff.
                        missing = any(p.key not in leaders for p in wanted)
                        refresh_due = now + (ERROR_BACKOFF_S if missing else refresh_s)
                    await self._positions(live)
                    fetched, moved = await self._fetch_round(runner, client, live, leaders)
                    if moved:
                        refresh_due = 0.0
                    elif not fetched:  # every live partition leaderless or refused: wait
                        await self._idle(runner, refresh_due)
                except asyncio.CancelledError:
                    raise
                except (KafkaClientError, OSError, TimeoutError) as exc:
                    for p in live:
                        p.back_off(f"source: {exc}")
                    refresh_due = 0.0
                except Exception as exc:
                    # Not the source's: e.g. the local replica's call failing in a way its
                    # caller does not translate. The fetcher backs off and carries on; it
                    # must not end while its link is active.
                    log.warning("link %s: fetch round failed", link.name, exc_info=True)
                    for p in live:
                        p.back_off(f"link fetcher: {type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                await client.close()

    async def _idle(self, runner: _Runner, refresh_due: float) -> None:
        """Wait for a change of partitions, the next retry or lookup, at most IDLE_WAIT_S."""
        now = time.monotonic()
        wake = [p.retry_at for p in runner.partitions.values() if not p.stopped]
        wake.append(refresh_due)
        timeout = min(IDLE_WAIT_S, max(0.01, min(wake) - now))
        runner.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(runner.changed.wait(), timeout)

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
            out[p.key] = (info.leader, info.leader_epoch)
        return out

    async def _positions(self, live: list[_Partition]) -> None:
        """Ask each replica where its log ends (once per leader epoch, and after a refusal)."""
        await asyncio.gather(*(self._append_batches(p, b"") for p in live if p.position < 0))

    async def _append_batches(
        self, p: _Partition, batches: bytes, source_log_start: int = -1
    ) -> None:
        outcome = await self._append(
            p.topic, p.partition, p.leader_epoch, batches, source_log_start
        )
        if outcome.error_code:
            # Not (yet) the leader of this epoch, or not yet told it mirrors (the metadata
            # reached this gateway before the replica): ask again where it ends, later. A new
            # leader epoch replaces this partition entry altogether.
            p.back_off(f"destination: {outcome.message or outcome.error_code}")
            p.position = -1
            return
        p.position = outcome.log_end_offset
        p.error = ""

    async def _fetch_round(
        self,
        runner: _Runner,
        client: KafkaClient,
        live: list[_Partition],
        leaders: dict[tuple[str, int], tuple[int, int]],
    ) -> tuple[bool, bool]:
        """One Fetch per source broker, concurrently; returns (whether anything was fetched,
        whether a source leader moved)."""
        link = runner.link
        by_broker: dict[int, list[_Partition]] = {}
        # Longest without progress first: a Fetch's byte limit then cuts the others' answers
        # (the source answers the first partition's first batch whole, KIP-74).
        for p in sorted(live, key=lambda p: p.progressed_at):
            where = leaders.get(p.key)
            if where is not None and p.position >= 0:
                by_broker.setdefault(where[0], []).append(p)
        results = await asyncio.gather(
            *(self._fetch_from(link, client, b, ps, leaders) for b, ps in by_broker.items()),
            return_exceptions=True,
        )
        moved = False
        for parts, result in zip(by_broker.values(), results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, (KafkaClientError, OSError, TimeoutError)):
                    raise result
                log.info("link %s: fetch failed: %s", link.name, result)
                for p in parts:
                    p.error = f"source: {result}"
                moved = True
            else:
                moved = moved or result
        if moved:
            await asyncio.sleep(ERROR_BACKOFF_S / 4)
        return bool(by_broker), moved

    async def _fetch_from(
        self,
        link: ClusterLink,
        client: KafkaClient,
        broker: int,
        parts: list[_Partition],
        leaders: dict[tuple[str, int], tuple[int, int]],
    ) -> bool:
        """Fetch ``parts`` from ``broker`` and append what it answers; returns whether a
        source leader moved."""
        partition_max = _config_int(link, "link.fetch.partition.max.bytes")
        max_bytes = _config_int(link, "link.fetch.max.bytes")
        throttle = _config_int(link, "link.throttle.bytes.per.sec")
        if throttle:  # at most a second's worth per Fetch (a first batch comes whole)
            partition_max, max_bytes = min(partition_max, throttle), min(max_bytes, throttle)
        fetched = await client.fetch(
            broker,
            [(*p.key, p.position, leaders[p.key][1], partition_max) for p in parts],
            max_wait_ms=_config_int(link, "link.fetch.max.wait.ms"),
            max_bytes=max_bytes,
        )
        moved = False
        total = 0
        for first, p in enumerate(parts):
            answer = fetched.get(p.key)
            if answer is None:
                p.back_off("source: the Fetch answer left the partition out")
                continue
            if answer.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                await self._out_of_range(client, broker, p)
                continue
            if answer.error_code:
                if answer.error_code in _REFRESH_ON:
                    p.error = f"source: error {answer.error_code}"
                    moved = True
                else:
                    p.back_off(f"source: error {answer.error_code}")
                continue
            p.error = ""
            p.source_hw = answer.high_watermark
            if answer.records:
                before = p.position
                await self._append_batches(p, answer.records, answer.log_start_offset)
                if p.position > before:
                    p.bytes += len(answer.records)
                    p.records += p.position - before
                    p.progressed_at = time.monotonic()
                    total += len(answer.records)
                elif first == 0 and not p.error:
                    # The first partition's answer holds no whole batch: the source cut a
                    # batch larger than the Fetch's limits, and will again.
                    p.back_off(
                        f"source: the batch at offset {p.position} is larger than the "
                        "Fetch's limits (link.fetch.partition.max.bytes, link.fetch.max.bytes)"
                    )
            self._track_lag(p)
        if throttle and total:
            await self._throttle_sleep(total / throttle)
        return moved

    async def _out_of_range(self, client: KafkaClient, broker: int, p: _Partition) -> None:
        """The source no longer has (or never had) our position: continue at its log start
        when that lies above (the replica drops what it holds and continues above the gap),
        stop when its log ends below us (it lost data)."""
        key = (p.topic, p.partition)
        earliest = (await client.list_offsets(broker, [(*key, EARLIEST)])).get(key)
        latest = (await client.list_offsets(broker, [(*key, LATEST)])).get(key)
        if earliest is None or latest is None or earliest[0] or latest[0]:
            p.back_off("source: offsets unavailable after OFFSET_OUT_OF_RANGE")
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
        else:  # within the source's log after all (its leader moving): ask again, later
            p.back_off(f"source: offset {p.position} out of range")

    def _track_lag(self, p: _Partition) -> None:
        if p.position >= p.source_hw:
            p.behind_since = None
        elif p.behind_since is None:
            p.behind_since = time.monotonic()
