"""A gateway's group-offset sync (``gateway/links/groups.py``) from a live Tansu source into a
group coordinator over an in-memory ``__consumer_offsets``.

Proves: from the metadata's links and mirror marks, the sync loop of a link lists the
source's groups, syncs those its groups regex matches (not the others) with their committed
offsets of the mirror topic, each capped at the mirror's high watermark, and reports them
``synced`` with their offsets count and sync time; a group with a member here is reported
``skipped-active`` and left alone; the commit rule names the link for a mirrored group's
mirror topic only; a disconnect stops the loop and lifts the rule. Skips only when Tansu's
binary cannot run on this machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from support.group_coordinator import LogBackend, join, loaded
from support.tansu import tansu_binary, tansu_broker
from support.waiting import wait_until_async

from raylog.actors.control import link_changes as lc
from raylog.actors.control import metadata as m
from raylog.actors.control.links import ClusterLink, SourceTopic
from raylog.actors.control.metadata import ClusterMetadata
from raylog.gateway.links.groups import LinkGroups

_binary, _why_not = tansu_binary()
pytestmark = pytest.mark.skipif(_binary is None, reason=_why_not)

TOPIC = "sync"
RECORDS = 10  # per partition; also the mirror's high watermark here
COMMITS = {"app-a": {0: 4, 1: 50}, "app-b": {0: 2}, "other": {0: 3}}
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("tansu-group-sync")
    with tansu_broker(root, TOPIC, partitions=2) as (bootstrap, _pid):
        producer = Producer({"bootstrap.servers": bootstrap})
        for partition in (0, 1):
            for i in range(RECORDS):
                producer.produce(TOPIC, f"v{i}".encode(), partition=partition)
        assert producer.flush(TIMEOUT_S) == 0
        for group, offsets in COMMITS.items():
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
            consumer.commit(
                offsets=[TopicPartition(TOPIC, p, o) for p, o in offsets.items()],
                asynchronous=False,
            )
            consumer.close()
        yield bootstrap


def linked(bootstrap: str) -> ClusterMetadata:
    md = m.register_broker(ClusterMetadata(cluster_id="dest"), 1, "inc", "r", "127.0.0.1", 9092)
    link = ClusterLink(
        name="east",
        link_id="id",
        bootstrap=(bootstrap,),
        topics_regex=TOPIC,
        groups_regex="app-.*",
        configs={"link.groups.sync.interval.ms": "100"},
    )
    md = lc.create_link(md, link)
    return lc.add_mirror_topic(md, "east", SourceTopic(TOPIC, "s", 2), "id-sync", 1, {})


def test_groups_are_synced_capped_and_skipped_while_active(source: str) -> None:
    async def run() -> None:
        coordinator = await loaded(LogBackend())
        reports: list[tuple[str, dict[str, dict[str, Any]], str]] = []

        async def high_watermark(topic: str, partition: int) -> int:
            return RECORDS if topic == TOPIC else -1

        async def report(link: str, groups: list[dict[str, Any]], error: str) -> None:
            reports.append((link, {g["group"]: g for g in groups}, error))

        async def reported(condition: Any) -> dict[str, dict[str, Any]]:
            await wait_until_async(
                lambda: bool(reports) and condition(reports[-1][1]),
                timeout_s=TIMEOUT_S,
                interval_s=0.05,
                message="a group sync report",
            )
            return reports[-1][1]

        sync = LinkGroups(1, coordinator, high_watermark, report)
        md = linked(source)
        sync.update(md)
        try:
            groups = await reported(lambda g: g.get("app-b", {}).get("state") == "synced")
            assert set(groups) == {"app-a", "app-b"} and reports[-1][0] == "east"
            assert groups["app-a"]["offsets"] == 2 and groups["app-a"]["last_sync_ms"] > 0
            fetched = await coordinator.fetch_offsets("app-a", None)
            offsets = {tp: c.offset for tp, c in fetched.offsets.items() if c is not None}
            assert offsets == {(TOPIC, 0): 4, (TOPIC, 1): RECORDS}  # 50 capped at the HW
            assert (await coordinator.fetch_offsets("other", None)).offsets == {}

            refusal = sync.commit_refusals("app-a", [TOPIC, "local"])
            assert list(refusal) == [TOPIC] and "link 'east'" in refusal[TOPIC]
            assert sync.commit_refusals("other", [TOPIC]) == {}

            first = await join(coordinator, group_id="app-b")
            assert (await join(coordinator, first.member_id, group_id="app-b")).error_code == 0
            reports.clear()
            await reported(lambda g: g.get("app-b", {}).get("state") == "skipped-active")

            sync.update(lc.disconnect(md, "east"))
            assert sync.commit_refusals("app-a", [TOPIC]) == {}
            assert not sync._runners
        finally:
            await sync.aclose()
            await coordinator.stop()

    asyncio.run(run())
