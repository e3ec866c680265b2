"""The rules of mirrored consumer-group offsets (``control/link_groups.py``).

Proves: an active link owns a group's offsets of a topic only when the topic is its mirror and
its groups regex matches the whole group id (not another link's mirror, not a disconnected
link, not a link without a groups regex); a disconnect of the topic or of the link releases
them; the refusal message names the link, the group, the topics and the way out; offsets are
capped at the mirror's high watermark and partitions without a known one are left for later;
the sync interval is a bounded link config with a default.
"""

from __future__ import annotations

import pytest

from raylog.actors.control import link_changes as lc
from raylog.actors.control import link_groups as lg
from raylog.actors.control import links
from raylog.actors.control import metadata as m
from raylog.actors.control.links import ClusterLink, MirrorInfo, SourceTopic
from raylog.actors.control.metadata import ClusterMetadata
from raylog.storage.errors import InvalidConfigError


def linked(groups_regex: str = "app-.*") -> ClusterMetadata:
    md = ClusterMetadata(cluster_id="dest")
    for b in (1, 2, 3):
        md = m.register_broker(md, b, f"inc{b}", "r", "127.0.0.1", 9091 + b)
    link = ClusterLink(
        name="east",
        link_id="id-east",
        bootstrap=("127.0.0.1:9092",),
        topics_regex="orders.*",
        groups_regex=groups_regex,
    )
    md = lc.create_link(md, link)
    for topic in ("orders", "orders-eu"):
        md = lc.add_mirror_topic(md, "east", SourceTopic(topic, "s", 2), f"id-{topic}", 3, {})
    return m.create_topic(md, "local", "id-local", [[1, 2, 3]])


def owner(md: ClusterMetadata, topic: str, group: str) -> str:
    found = lg.owning_link(md.links, md.topics[topic].mirror, group)
    return found.name if found is not None else ""


def test_an_active_link_owns_the_offsets_of_matching_groups_in_its_mirrors() -> None:
    md = linked()
    assert owner(md, "orders", "app-1") == "east"
    assert owner(md, "orders-eu", "app-1") == "east"
    assert owner(md, "local", "app-1") == ""  # not a mirror: the group commits it freely
    assert owner(md, "orders", "xapp-1") == ""  # the regex matches whole ids only
    assert owner(md, "orders", "other") == ""
    assert owner(linked(groups_regex=""), "orders", "app-1") == ""  # no --groups: none
    # Another link's mirror is not this link's to guard.
    other = MirrorInfo(link="west")
    assert lg.owning_link(md.links, other, "app-1") is None


def test_disconnect_of_the_topic_or_the_link_makes_the_offsets_writable() -> None:
    md = linked()
    one = lc.disconnect(md, "east", "orders")
    assert owner(one, "orders", "app-1") == ""
    assert owner(one, "orders-eu", "app-1") == "east"
    whole = lc.disconnect(md, "east")
    assert owner(whole, "orders-eu", "app-1") == ""
    # The rule reads the link's state too, whatever the mirror mark says.
    stale_mark = MirrorInfo(link="east")
    assert lg.owning_link(whole.links, stale_mark, "app-1") is None


def test_refusal_message_names_the_link_and_the_way_out() -> None:
    md = linked()
    message = lg.refusal_message(md.links["east"], "app-1", ["orders-eu", "orders"])
    assert "'app-1'" in message and "orders, orders-eu" in message
    assert "link 'east'" in message and "'app-.*'" in message
    assert "raylog links disconnect east" in message


def test_offsets_are_capped_at_the_mirror_high_watermark() -> None:
    source = {("orders", 0): 120, ("orders", 1): 40, ("orders-eu", 0): 7, ("orders-eu", 1): -1}
    marks = {("orders", 0): 100, ("orders", 1): 90, ("orders-eu", 1): 5}
    assert lg.clamp_to_mirror(source, marks) == {("orders", 0): 100, ("orders", 1): 40}
    assert lg.clamp_to_mirror(source, {("orders", 0): -1}) == {}
    assert lg.link_mirror_topics("east", {t.name: t.mirror for t in linked().topics.values()}) == [
        "orders",
        "orders-eu",
    ]


def test_sync_interval_is_a_bounded_link_config() -> None:
    key = lg.GROUPS_SYNC_INTERVAL_MS
    assert links.describe_configs({})[key] == "5000"
    assert links.link_config({key: "250"}) == {key: "250"}
    with pytest.raises(InvalidConfigError, match=r"\[100, 3600000\]"):
        links.link_config({key: "10"})
