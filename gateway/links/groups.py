"""The consumer-group offset sync of one broker's links, and the commits those links refuse.

This module owns the destination side of group-offset mirroring (KIP-986; the rules are
``actors/control/link_groups.py``'s). For every active link with a ``groups_regex``, each
gateway runs one sync loop (every ``link.groups.sync.interval.ms``): it lists the source's
groups, keeps those the regex matches AND this broker's group coordinator serves, fetches
their committed offsets in the link's mirror topics from the source, caps each at the mirror
partition's high watermark, and hands them to its coordinator
(``GroupCoordinator.sync_mirrored_offsets``), which writes the ones that changed into groups
without members and skips groups with members. Each round's outcome per group goes to the
active controller (``report_link_groups``), which ``links describe`` shows.

Why the gateway that coordinates the group, not the controller: the write and the check that
the group has no members must happen under the group's lock in its coordinator (a JoinGroup
between a remote check and the write would have its offsets moved under it), and the
coordinator moves with ``__consumer_offsets`` leadership, which each gateway learns first;
the sync follows it with no hand-over, as the mirror fetchers follow partition leadership.
The price is one ListGroups per broker and round at the source; offsets are fetched only by
the broker serving each group.

The read-only rule is answered here too (:meth:`LinkGroups.commit_refusals`, given to the
coordinator) from the metadata the gateway already polls: links and mirror marks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from raylog.actors.control import link_groups as lg
from raylog.actors.control.link_groups import LinkGroupState
from raylog.actors.control.links import LINK_CONFIGS, ClusterLink, MirrorInfo
from raylog.actors.control.metadata import ClusterMetadata
from raylog.actors.transport.kafka_client import KafkaClient, KafkaClientError, LinkSecurity
from raylog.gateway.groups.coordinator import GroupCoordinator

log = logging.getLogger(__name__)

# A round stops starting new groups past this; the others keep their last state.
ROUND_BUDGET_S = 60.0

HighWatermark = Callable[[str, int], Awaitable[int]]  # the mirror partition's HW, -1 unknown
# (link name, broker id, each group's LinkGroupState as a dict, the round's source error)
ReportCall = Callable[[str, list[dict[str, Any]], str], Awaitable[None]]


@dataclass
class _Runner:
    link: ClusterLink
    states: dict[str, LinkGroupState] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None


class LinkGroups:
    """The group-offset sync loops of broker ``broker_id``, kept current by :meth:`update`."""

    def __init__(
        self,
        broker_id: int,
        coordinator: GroupCoordinator,
        high_watermark: HighWatermark,
        report: ReportCall,
    ) -> None:
        self.broker_id = broker_id
        self._coordinator = coordinator
        self._high_watermark = high_watermark
        self._report = report
        self._links: dict[str, ClusterLink] = {}
        self._mirrors: dict[str, MirrorInfo] = {}
        self._runners: dict[str, _Runner] = {}

    def update(self, md: ClusterMetadata) -> None:
        """Take the metadata's links and mirror marks; start, restart or stop the loops."""
        self._links = dict(md.links)
        self._mirrors = {name: t.mirror for name, t in md.topics.items() if t.mirror is not None}
        wanted = {n: link for n, link in md.links.items() if link.active and link.groups_regex}
        for name in list(self._runners):
            runner = self._runners[name]
            if wanted.get(name) != runner.link:
                del self._runners[name]
                if runner.task is not None:
                    runner.task.cancel()
        for name, link in wanted.items():
            if name not in self._runners:
                runner = self._runners[name] = _Runner(link)
                runner.task = asyncio.get_running_loop().create_task(self._run(runner))

    def commit_refusals(self, group_id: str, topics: Sequence[str]) -> Mapping[str, str]:
        """Each of ``topics`` whose offsets of ``group_id`` an active link mirrors, with the
        message naming the link (the coordinator's ``CommitRefusals``)."""
        owners: dict[str, ClusterLink] = {}
        for topic in topics:
            link = lg.owning_link(self._links, self._mirrors.get(topic), group_id)
            if link is not None:
                owners[topic] = link
        out = {}
        for link in {link.name: link for link in owners.values()}.values():
            mine = [t for t, owner in owners.items() if owner.name == link.name]
            message = lg.refusal_message(link, group_id, mine)
            out.update(dict.fromkeys(mine, message))
        return out

    async def aclose(self) -> None:
        tasks = [r.task for r in self._runners.values() if r.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._runners = {}

    # --- one link -------------------------------------------------------------------------------

    async def _run(self, runner: _Runner) -> None:
        link = runner.link
        client = KafkaClient(
            link.bootstrap,
            client_id=f"raylog-link-{link.name}-groups-{self.broker_id}",
            security=LinkSecurity.from_configs(link.configs),
        )
        key = lg.GROUPS_SYNC_INTERVAL_MS
        interval_s = int(link.configs.get(key, LINK_CONFIGS[key][0])) / 1000
        try:
            while True:  # ends when cancelled (link changed or gone, gateway stops)
                error = ""
                try:
                    await self._round(runner, client)
                except (KafkaClientError, OSError, TimeoutError) as exc:
                    error = f"source {','.join(link.bootstrap)}: {exc}"
                    log.warning("link %s: groups not synced: %s", link.name, error)
                except Exception as exc:  # not the source's: reported, and the loop goes on
                    error = f"{type(exc).__name__}: {exc}"
                    log.warning("link %s: group sync round failed", link.name, exc_info=True)
                states = [msgspec.structs.asdict(s) for s in runner.states.values()]
                try:
                    await self._report(link.name, states, error)
                except Exception as exc:  # the controller away: the next round reports
                    log.debug("link %s: group sync not reported: %s", link.name, exc)
                await asyncio.sleep(interval_s)
        finally:
            with contextlib.suppress(Exception):
                await client.close()

    async def _round(self, runner: _Runner, client: KafkaClient) -> None:
        """One sync of every source group the link mirrors and this broker serves."""
        link = runner.link
        names = await client.list_groups()
        mine = [g for g in names if link.matches_group(g) and self._coordinator.coordinates(g)]
        mine = sorted(mine)[: lg.MAX_GROUPS_PER_ROUND]
        topics = lg.link_mirror_topics(link.name, self._mirrors)
        deadline = time.monotonic() + ROUND_BUDGET_S
        states = {}
        for group in mine:
            previous = runner.states.get(group)
            if time.monotonic() > deadline:
                if previous is not None:
                    states[group] = previous
                continue
            states[group] = await self._sync_group(client, group, topics, previous)
        runner.states = states

    async def _sync_group(
        self,
        client: KafkaClient,
        group: str,
        topics: list[str],
        previous: LinkGroupState | None,
    ) -> LinkGroupState:
        last = previous.last_sync_ms if previous is not None else 0
        held = previous.offsets if previous is not None else 0
        try:
            source = await client.offset_fetch(group, topics) if topics else {}
        except (KafkaClientError, OSError, TimeoutError) as exc:
            return LinkGroupState(
                group=group, state=lg.ERROR, offsets=held, last_sync_ms=last, error=str(exc)
            )
        parts = sorted(source)
        marks = await asyncio.gather(*(self._high_watermark(t, p) for t, p in parts))
        offsets = lg.clamp_to_mirror(source, dict(zip(parts, marks, strict=True)))
        result = await self._coordinator.sync_mirrored_offsets(group, offsets)
        if result.error_code:
            return LinkGroupState(
                group=group,
                state=lg.ERROR,
                offsets=held,
                last_sync_ms=last,
                error=f"offsets not written here: error {result.error_code}",
            )
        if result.active:
            return LinkGroupState(
                group=group, state=lg.SKIPPED_ACTIVE, offsets=held, last_sync_ms=last
            )
        return LinkGroupState(
            group=group,
            state=lg.SYNCED,
            offsets=len(offsets),
            written=result.written,
            last_sync_ms=time.time_ns() // 1_000_000,
        )
