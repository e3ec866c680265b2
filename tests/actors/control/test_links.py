"""Cross-cluster links as cluster metadata (``control/links.py``, ``control/link_changes.py``).

Proves: a link's name, bootstrap, mode, regexes and configs are validated with clear errors
(sync mode refused until built); secrets never show in a describe or repr; a link reserves the
topic names its regex matches and refuses to take over local topics that are not its mirrors;
discovery creates mirrors of matching source topics (never internal ones, never over a local
topic), grows mirrors whose source grew, and only for active links; disconnecting a topic or a
whole link clears the mirror mark and bumps every led partition's leader epoch (the fence for
mirrored appends in flight); deleting a link disconnects its mirrors; metadata round-trips.
"""

from __future__ import annotations

import pytest

from raylog.actors.control import link_changes as lc
from raylog.actors.control import links
from raylog.actors.control import metadata as m
from raylog.actors.control.links import ClusterLink, MirrorInfo, SourceTopic
from raylog.actors.control.metadata import ClusterMetadata
from raylog.storage.errors import InvalidConfigError, InvalidRequestError


def cluster(n: int = 3) -> ClusterMetadata:
    md = ClusterMetadata(cluster_id="dest")
    for b in range(1, n + 1):
        md = m.register_broker(md, b, f"inc{b}", "r", "127.0.0.1", 9091 + b)
    return md


def link(name: str = "east", **kw: object) -> ClusterLink:
    fields: dict[str, object] = {
        "name": name,
        "link_id": f"id-{name}",
        "bootstrap": ("127.0.0.1:9092",),
        "topics_regex": "orders.*",
    }
    fields.update(kw)
    return ClusterLink(**fields)  # type: ignore[arg-type]


def with_mirror(md: ClusterMetadata, topic: str = "orders", partitions: int = 2) -> ClusterMetadata:
    return lc.add_mirror_topic(
        md, "east", SourceTopic(topic, "src-id", partitions), f"id-{topic}", 3, {}
    )


def test_validation_refuses_what_cannot_be() -> None:
    with pytest.raises(InvalidRequestError, match="link name"):
        links.validate_link("bad name", ("h:1",), "async", "", "", {})
    with pytest.raises(InvalidConfigError, match="host:port"):
        links.validate_link("a", ("nohost",), "async", "", "", {})
    with pytest.raises(InvalidConfigError, match="sync"):
        links.validate_link("a", ("h:1",), "sync", "", "", {})
    with pytest.raises(InvalidConfigError, match="mode"):
        links.validate_link("a", ("h:1",), "fast", "", "", {})
    with pytest.raises(InvalidConfigError, match="regular expression"):
        links.validate_link("a", ("h:1",), "async", "(", "", {})
    with pytest.raises(InvalidConfigError, match="unknown link config"):
        links.link_config({"fetch.size": "1"})
    with pytest.raises(InvalidConfigError, match="integer"):
        links.link_config({"link.fetch.max.bytes": "lots"})
    with pytest.raises(InvalidConfigError, match=r"sasl\.mechanism"):
        links.link_config({"security.protocol": "SASL_SSL"})
    assert links.link_config({"security.protocol": "sasl_ssl", "sasl.mechanism": "plain"}) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
    }
    assert links.parse_bootstrap("a:1, b:2") == ("a:1", "b:2")


def test_secrets_are_never_shown() -> None:
    secret = "s3cr3t-password"
    view = links.describe_configs({"sasl.username": "alice", "sasl.password": secret})
    assert view["sasl.password"] == "[hidden]" and view["sasl.username"] == "alice"
    assert view["link.fetch.max.bytes"] == links.LINK_CONFIGS["link.fetch.max.bytes"][0]
    shown = repr(link(configs={"sasl.password": secret, "sasl.jaas.config": secret}))
    assert secret not in shown


def test_create_link_reserves_names_and_refuses_to_take_over_local_topics() -> None:
    md = m.create_topic(cluster(), "orders-local", "id-ol", [[1, 2, 3]])
    with pytest.raises(InvalidRequestError, match="orders-local"):
        lc.create_link(md, link())
    md = lc.create_link(cluster(), link())
    with pytest.raises(InvalidRequestError, match="already exists"):
        lc.create_link(md, link())
    with pytest.raises(InvalidRequestError, match="reserved by link 'east'"):
        links.check_reserved(md.links, "orders-2")
    links.check_reserved(md.links, "payments")  # not matched: free
    disconnected = lc.disconnect(md, "east")
    links.check_reserved(disconnected.links, "orders-2")  # a disconnected link reserves nothing
    assert m.decode_json(m.encode_json(md)) == md


def test_plan_mirrors_creates_grows_and_leaves_local_topics_alone() -> None:
    source = [
        SourceTopic("orders", "t1", 3, {"retention.ms": "1000", "min.insync.replicas": "1"}),
        SourceTopic("orders-eu", "t2", 2),
        SourceTopic("payments", "t3", 1),
        SourceTopic("__consumer_offsets", "t4", 50),
    ]
    local = {
        "orders-eu": (MirrorInfo(link="east"), 1, {}),
        "orders": (None, 3, {}),
    }
    plan = links.plan_mirrors(link(topics_regex="orders.*|__.*"), source, local)
    assert plan.create == () and plan.configs == ()
    assert plan.grow == (("orders-eu", 2),)
    assert [name for name, _ in plan.skipped] == ["orders"]
    plan = links.plan_mirrors(link(), source, {})
    assert [t.name for t in plan.create] == ["orders", "orders-eu"]
    assert links.mirrored_topic_configs(plan.create[0].configs) == {"retention.ms": "1000"}
    assert links.plan_mirrors(link(state=links.DISCONNECTED), source, {}) == links.MirrorPlan()


def test_mirror_topics_and_disconnect_bump_leader_epochs() -> None:
    md = with_mirror(with_mirror(lc.create_link(cluster(), link())), "orders-eu", 1)
    t = md.topics["orders"]
    assert t.mirror == MirrorInfo(link="east", source_topic_id="src-id")
    assert len(t.partitions) == 2 and t.topic_id == "id-orders"
    epochs = [p.leader_epoch for p in t.partitions]

    one = lc.disconnect(md, "east", "orders")
    assert one.topics["orders"].mirror is None
    assert [p.leader_epoch for p in one.topics["orders"].partitions] == [e + 1 for e in epochs]
    assert one.topics["orders-eu"].mirror is not None and one.links["east"].active
    with pytest.raises(InvalidRequestError, match="not a mirror"):
        lc.disconnect(one, "east", "orders")

    whole = lc.disconnect(md, "east")
    assert all(t.mirror is None for t in whole.topics.values())
    assert whole.links["east"].state == links.DISCONNECTED
    with pytest.raises(InvalidRequestError, match="disconnected"):
        with_mirror(whole, "orders-new")

    gone = lc.delete_link(md, "east")
    assert "east" not in gone.links and all(t.mirror is None for t in gone.topics.values())
    with pytest.raises(InvalidRequestError, match="no link named"):
        lc.delete_link(gone, "east")
    assert m.decode_json(m.encode_json(whole)) == whole


def test_mirror_replication_factor_defaults_to_the_destinations_and_fits_its_brokers() -> None:
    assert links.mirror_replication_factor({}, 1, 3) == 1
    three = links.link_config({"link.mirror.replication.factor": "3"})
    assert links.mirror_replication_factor(three, 1, 3) == 3
    assert links.mirror_replication_factor(three, 1, 2) == 2  # two brokers: at most two
    with pytest.raises(InvalidConfigError, match=r"link\.mirror\.replication\.factor"):
        links.link_config({"link.mirror.replication.factor": "0x3"})


def test_alter_link_changes_and_resets_configs() -> None:
    md = lc.create_link(cluster(), link(configs={"link.fetch.max.wait.ms": "100"}))
    md2 = lc.alter_link(md, "east", configs={"link.fetch.max.wait.ms": "", "sasl.username": "u"})
    assert md2.links["east"].configs == {"sasl.username": "u"}
    assert lc.alter_link(md2, "east", configs={"sasl.username": "u"}) is md2
    md3 = lc.alter_link(md2, "east", topics_regex="pay.*", bootstrap=["h:2"])
    assert md3.links["east"].topics_regex == "pay.*"
    assert md3.links["east"].bootstrap == ("h:2",)
    with pytest.raises(InvalidConfigError):
        lc.alter_link(md, "east", topics_regex="(")
    assert lc.set_source_cluster_id(md, "east", "src").links["east"].source_cluster_id == "src"


def test_mirrors_follow_the_source_configs_and_keep_their_own() -> None:
    source = [SourceTopic("orders", "t1", 1, {"retention.ms": "5000", "segment.ms": "10"})]
    own = {"retention.ms": "1", "min.insync.replicas": "2", "cleanup.policy": "compact"}
    local = {"orders": (MirrorInfo(link="east"), 1, own)}
    plan = links.plan_mirrors(link(), source, local)
    # retention.ms follows, cleanup.policy dropped at the source goes, min.insync.replicas
    # (the destination's own) stays; segment.ms is not mirrored.
    assert plan.configs == (("orders", {"retention.ms": "5000", "min.insync.replicas": "2"}),)
    local = {"orders": (MirrorInfo(link="east"), 1, dict(plan.configs[0][1]))}
    assert links.plan_mirrors(link(), source, local).configs == ()
    mirror = MirrorInfo(link="east")
    links.check_own_configs(
        mirror, {"retention.ms": "1"}, {"retention.ms": "1", "min.insync.replicas": "2"}
    )
    with pytest.raises(InvalidRequestError, match=r"retention\.ms of a mirror of link 'east'"):
        links.check_own_configs(mirror, {"retention.ms": "1"}, {"retention.ms": "2"})
