"""The controller's cross-cluster link requests and link discovery, mixed into
:class:`raylog.actors.controller.ControllerActor`.

This module owns what the active controller does for links (KIP-986): the admin requests
(create, alter, list, describe, disconnect, delete: decided by ``control/link_changes.py`` and
written with the controller's compare-and-swap), the discovery round of every active link (a
Kafka client to the source: which topics its ``topics.regex`` matches, their partition counts
and configs; the mirror topics follow, ``links.plan_mirrors``), and the progress the gateways
report for the mirror partitions they fetch (kept in memory: it is live state, re-reported
every second, and ``links describe`` shows it).

The data path is not here: the gateway on each mirror partition's leader broker fetches from
the source and appends through the leader replica (``gateway/links``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from raylog.actors.calls import monotonic_ms
from raylog.actors.control import config_keys
from raylog.actors.control import link_changes as changes
from raylog.actors.control import link_groups as link_groups_
from raylog.actors.control import links as links_
from raylog.actors.control import metadata as md_
from raylog.actors.control.links import ClusterLink, SourceTopic
from raylog.actors.control.metadata import ClusterMetadata
from raylog.actors.control.metadata_store import VersionedMetadata
from raylog.actors.transport.kafka_client import KafkaClient, KafkaClientError, LinkSecurity
from raylog.storage.errors import RaylogError

log = logging.getLogger(__name__)

T = TypeVar("T")

# A gateway's progress report older than this is shown as stale in ``links describe``.
PROGRESS_STALE_MS = 10_000
DISCOVERY_TIMEOUT_MS = 30_000


class MirrorProgress(msgspec.Struct, frozen=True, kw_only=True):
    """What the gateway fetching one mirror partition last reported."""

    topic: str
    partition: int
    broker_id: int
    state: str  # fetching | error
    source_high_watermark: int = -1
    log_end_offset: int = -1  # the mirror's next offset
    lag_records: int = -1
    lag_ms: int = -1  # how long the mirror has been behind the source's HW (0: caught up)
    bytes_per_sec: float = 0.0
    records_per_sec: float = 0.0
    error: str = ""
    reported_ms: int = 0


class GroupSyncReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one gateway last reported of one link's group-offset sync."""

    broker_id: int
    groups: tuple[link_groups_.LinkGroupState, ...] = ()
    error: str = ""  # the round's source error ("" when the source answered)
    reported_ms: int = 0


class LinkRequests:
    """The link requests of the active controller (a mixin; see the module docstring)."""

    _require_active: Callable[[], VersionedMetadata]
    _ensure_started: Callable[[], None]
    _broker_config: config_keys.BrokerConfig
    _link_progress: dict[tuple[str, int], MirrorProgress]
    _link_group_reports: dict[tuple[str, int], GroupSyncReport]
    _discoveries: dict[str, tuple[int, asyncio.Task[None] | None, str]]

    async def _mutate(self, change: Callable[[ClusterMetadata], tuple[ClusterMetadata, T]]) -> T:
        raise NotImplementedError  # the host's

    # --- admin requests --------------------------------------------------------------------------

    async def create_link(
        self,
        name: str,
        bootstrap: list[str],
        mode: str = "async",
        topics_regex: str = "",
        groups_regex: str = "",
        configs: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A new link; its discovery starts in the next reconcile round."""
        self._ensure_started()
        link = ClusterLink(
            name=name,
            link_id=uuid.uuid4().hex,
            bootstrap=tuple(bootstrap),
            mode=mode,
            topics_regex=topics_regex,
            groups_regex=groups_regex,
            configs=dict(configs or {}),
        )
        await self._mutate(lambda md: (changes.create_link(md, link), None))
        return self._link_view(name)

    async def alter_link(
        self,
        name: str,
        bootstrap: list[str] | None = None,
        topics_regex: str | None = None,
        groups_regex: str | None = None,
        configs: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        self._ensure_started()
        await self._mutate(
            lambda md: (
                changes.alter_link(
                    md,
                    name,
                    bootstrap=bootstrap,
                    topics_regex=topics_regex,
                    groups_regex=groups_regex,
                    configs=configs,
                ),
                None,
            )
        )
        self._discoveries.pop(name, None)  # discover with the new settings at once
        return self._link_view(name)

    async def list_links(self) -> list[dict[str, Any]]:
        self._ensure_started()
        md = self._require_active().metadata
        return [self._link_view(name, with_partitions=False) for name in sorted(md.links)]

    async def describe_link(self, name: str) -> dict[str, Any]:
        self._ensure_started()
        return self._link_view(name)

    async def disconnect_link(self, name: str, topic: str | None = None) -> dict[str, Any]:
        """Stop mirroring the whole link or one topic: its topics become writable."""
        self._ensure_started()
        await self._mutate(lambda md: (changes.disconnect(md, name, topic), None))
        return self._link_view(name)

    async def delete_link(self, name: str) -> None:
        """Remove a link; its mirrors become ordinary topics first."""
        self._ensure_started()
        await self._mutate(lambda md: (changes.delete_link(md, name), None))
        self._discoveries.pop(name, None)
        for key in [k for k in self._link_group_reports if k[0] == name]:
            del self._link_group_reports[key]

    async def report_link_progress(self, reports: list[dict[str, Any]]) -> None:
        """A gateway's progress for the mirror partitions it fetches (every second or so):
        ``MirrorProgress`` fields, as dicts (the gateway does not import this module)."""
        now = monotonic_ms()
        for raw in reports[:100_000]:
            try:
                r = msgspec.convert({**raw, "reported_ms": now}, MirrorProgress)
            except msgspec.ValidationError as exc:
                log.warning("a malformed link progress report: %s", exc)
                continue
            self._link_progress[(r.topic, r.partition)] = r

    async def report_link_groups(
        self, link: str, broker_id: int, groups: list[dict[str, Any]], error: str
    ) -> None:
        """A gateway's group-offset sync round of ``link``: each group it coordinates, as
        ``LinkGroupState`` dicts, and the round's source error."""
        try:
            states = msgspec.convert(
                groups[: link_groups_.MAX_GROUPS_PER_ROUND], list[link_groups_.LinkGroupState]
            )
            report = GroupSyncReport(
                broker_id=broker_id,
                groups=tuple(states),
                error=str(error)[:1000],
                reported_ms=monotonic_ms(),
            )
        except msgspec.ValidationError as exc:
            log.warning("a malformed link group report: %s", exc)
            return
        self._link_group_reports[(link, broker_id)] = report

    def _groups_view(self, link: ClusterLink, now: int) -> tuple[list[dict[str, Any]], list[str]]:
        """Each mirrored group's latest reported sync (from whichever broker coordinates it),
        and the brokers' source errors; reports older than ``PROGRESS_STALE_MS`` are stale."""
        groups: dict[str, dict[str, Any]] = {}
        errors = []
        for (name, broker), report in sorted(self._link_group_reports.items()):
            if name != link.name:
                continue
            age = now - report.reported_ms
            if report.error:
                errors.append(f"broker {broker}: {report.error}")
            for state in report.groups:
                if not link.matches_group(state.group):
                    continue
                entry = {**msgspec.structs.asdict(state), "broker_id": broker}
                entry["reported_ms_ago"] = age
                if age > PROGRESS_STALE_MS:
                    entry["state"] = "stale"
                known = groups.get(state.group)
                if known is None or known["reported_ms_ago"] > age:
                    groups[state.group] = entry
        return [groups[g] for g in sorted(groups)], errors

    def _link_view(self, name: str, with_partitions: bool = True) -> dict[str, Any]:
        """A link as ``links describe`` shows it: its settings (secrets masked), its mirror
        topics and, per partition, the progress its gateway last reported."""
        md = self._require_active().metadata
        link = changes.get_link(md, name)
        view: dict[str, Any] = {
            "name": link.name,
            "link_id": link.link_id,
            "state": link.state,
            "mode": link.mode,
            "bootstrap": list(link.bootstrap),
            "source_cluster_id": link.source_cluster_id,
            "topics_regex": link.topics_regex,
            "groups_regex": link.groups_regex,
            "configs": links_.describe_configs(link.configs),
        }
        mirrors = sorted(
            t.name for t in md.topics.values() if t.mirror is not None and t.mirror.link == name
        )
        view["mirror_topics"] = mirrors
        discovery = self._discoveries.get(name)
        view["discovery_error"] = discovery[2] if discovery else ""
        if not with_partitions:
            return view
        now = monotonic_ms()
        view["groups"], view["groups_errors"] = self._groups_view(link, now)
        partitions = []
        for topic in mirrors:
            for p in md.topics[topic].partitions:
                progress = self._link_progress.get((topic, p.partition))
                entry: dict[str, Any] = {"topic": topic, "partition": p.partition}
                if progress is None or progress.broker_id != p.leader:
                    entry["state"] = "startup"
                else:
                    entry.update(msgspec.structs.asdict(progress))
                    entry["reported_ms_ago"] = now - entry.pop("reported_ms")
                    if entry["reported_ms_ago"] > PROGRESS_STALE_MS:
                        entry["state"] = "stale"
                partitions.append(entry)
        view["partitions"] = partitions
        return view

    # --- discovery -------------------------------------------------------------------------------

    def _link_discovery_round(self) -> None:
        """Start a discovery of every active link whose refresh interval has passed (each a
        task of its own, bounded by its client's timeouts: a slow source holds up nothing
        else)."""
        md = self._require_active().metadata
        now = monotonic_ms()
        for name in list(self._discoveries):
            if name not in md.links:
                _, task, _ = self._discoveries.pop(name)
                if task is not None:
                    task.cancel()
        for name, link in md.links.items():
            if not link.active or not link.topics_regex:
                continue
            due, task, error = self._discoveries.get(name, (0, None, ""))
            if now < due or (task is not None and not task.done()):
                continue
            key = "link.metadata.refresh.interval.ms"
            interval = int(link.configs.get(key, links_.LINK_CONFIGS[key][0]))
            task = asyncio.get_running_loop().create_task(self._discover(link))
            self._discoveries[name] = (now + interval, task, error)

    async def _discover(self, link: ClusterLink) -> None:
        """One discovery of ``link``: the source's topics, then the mirrors they call for."""
        error = ""
        try:
            source = await asyncio.wait_for(
                self._source_topics(link), timeout=DISCOVERY_TIMEOUT_MS / 1000
            )
            await self._apply_discovery(link.name, *source)
        except (KafkaClientError, TimeoutError, OSError, ValueError) as exc:
            error = f"source {','.join(link.bootstrap)}: {exc}"
            log.warning("link %s: discovery failed: %s", link.name, error)
        except RaylogError as exc:
            error = str(exc)
            log.warning("link %s: mirrors not created: %s", link.name, exc)
        entry = self._discoveries.get(link.name)
        if entry is not None:
            self._discoveries[link.name] = (entry[0], entry[1], error)

    async def _source_topics(self, link: ClusterLink) -> tuple[str, list[SourceTopic]]:
        client = KafkaClient(
            link.bootstrap,
            client_id=f"raylog-link-{link.name}",
            security=LinkSecurity.from_configs(link.configs),
        )
        try:
            meta = await client.metadata(None)
            names = [
                t.name
                for t in meta.topics.values()
                if t.error_code == 0 and not t.is_internal and link.matches_topic(t.name)
            ]
            configs = await client.describe_topic_configs(names) if names else {}
        finally:
            await client.close()
        topics = [
            SourceTopic(
                name,
                meta.topics[name].topic_id,
                len(meta.topics[name].partitions),
                {k: v for k, (v, is_default) in configs.get(name, {}).items() if not is_default},
            )
            for name in names
        ]
        return meta.cluster_id, topics

    async def _apply_discovery(self, name: str, cluster_id: str, source: list[SourceTopic]) -> None:
        defaults = self._broker_config
        md = self._require_active().metadata
        link = md.links.get(name)
        if link is None or not link.active:
            return
        if cluster_id and link.source_cluster_id != cluster_id:
            await self._mutate(lambda m: (changes.set_source_cluster_id(m, name, cluster_id), None))
        local = {t.name: (t.mirror, len(t.partitions), t.configs) for t in md.topics.values()}
        plan = links_.plan_mirrors(link, source, local)
        for topic, reason in plan.skipped:
            log.warning("link %s: source topic %s not mirrored: %s", name, topic, reason)
        for s in plan.create:
            rf = links_.mirror_replication_factor(
                link.configs, defaults.default_replication_factor, len(md.brokers)
            )
            configs = links_.mirrored_topic_configs(s.configs)
            topic_id = uuid.uuid4().hex
            await self._mutate(
                lambda m, s=s, rf=rf, configs=configs, topic_id=topic_id: (
                    changes.add_mirror_topic(m, name, s, topic_id, rf, configs),
                    None,
                )
            )
            log.info("link %s: mirror topic %s created (%d partitions)", name, s.name, s.partitions)
        for topic, count in plan.grow:
            await self._mutate(lambda m, t=topic, c=count: (md_.new_partitions(m, t, c), None))
            log.info("link %s: mirror topic %s grown to %d partitions", name, topic, count)
        for topic, overrides in plan.configs:
            await self._mutate(lambda m, t=topic, o=overrides: (md_.alter_configs(m, t, o), None))
            log.info("link %s: mirror topic %s follows the source's configs", name, topic)
