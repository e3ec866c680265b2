"""Pure: the cluster-metadata transitions of cross-cluster links (``links`` says what they mean).

Each function takes the current :class:`ClusterMetadata` and returns the next version (or
raises the Kafka error that refuses the request); the controller writes it with its
compare-and-swap. Mirror topics are created through ``metadata.new_topic`` (the same placement
and checks as any topic) and then marked with their :class:`MirrorInfo`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from raylog.actors.control import links as links_
from raylog.actors.control import metadata as md_
from raylog.actors.control.links import ClusterLink, MirrorInfo, SourceTopic
from raylog.actors.control.metadata import ClusterMetadata, TopicMetadata, _bump
from raylog.storage.errors import InvalidRequestError

__all__ = [
    "add_mirror_topic",
    "alter_link",
    "create_link",
    "delete_link",
    "disconnect",
    "get_link",
    "set_source_cluster_id",
]


def get_link(md: ClusterMetadata, name: str) -> ClusterLink:
    link = md.links.get(name)
    if link is None:
        known = ", ".join(sorted(md.links)) or "none"
        raise InvalidRequestError(f"no link named {name!r} (links: {known})")
    return link


def _mirrors(md: ClusterMetadata) -> dict[str, MirrorInfo | None]:
    return {name: t.mirror for name, t in md.topics.items()}


def _refuse_conflicts(md: ClusterMetadata, link: ClusterLink) -> None:
    clash = links_.conflicting_topics(link, _mirrors(md))
    if clash:
        raise InvalidRequestError(
            f"link {link.name!r}: topics.regex {link.topics_regex!r} matches local topics "
            f"that are not its mirrors: {', '.join(clash)}; their offsets are not the "
            "source's, so the link would not continue them. Rename or delete them, or narrow "
            "the regex"
        )


def create_link(md: ClusterMetadata, link: ClusterLink) -> ClusterMetadata:
    """A new link (validated; its name unique; its regex reserving no existing topic)."""
    links_.validate_link(
        link.name, link.bootstrap, link.mode, link.topics_regex, link.groups_regex, link.configs
    )
    if link.name in md.links:
        raise InvalidRequestError(f"link {link.name!r} already exists")
    link = msgspec.structs.replace(
        link,
        bootstrap=links_.parse_bootstrap(link.bootstrap),
        configs=links_.link_config(link.configs),
    )
    _refuse_conflicts(md, link)
    return _bump(md, links={**md.links, link.name: link})


def alter_link(
    md: ClusterMetadata,
    name: str,
    *,
    bootstrap: Sequence[str] | None = None,
    topics_regex: str | None = None,
    groups_regex: str | None = None,
    configs: Mapping[str, str] | None = None,
) -> ClusterMetadata:
    """Change a link's source address, regexes or configs (``configs``: keys set to "" go
    back to their defaults; the others are set)."""
    old = get_link(md, name)
    merged = dict(old.configs)
    for key, value in (configs or {}).items():
        if value == "":
            merged.pop(key, None)
        else:
            merged[key] = value
    new = msgspec.structs.replace(
        old,
        bootstrap=old.bootstrap if bootstrap is None else links_.parse_bootstrap(bootstrap),
        topics_regex=old.topics_regex if topics_regex is None else topics_regex,
        groups_regex=old.groups_regex if groups_regex is None else groups_regex,
        configs=links_.link_config(merged),
    )
    links_.validate_link(
        new.name, new.bootstrap, new.mode, new.topics_regex, new.groups_regex, new.configs
    )
    if new == old:
        return md
    _refuse_conflicts(md, new)
    return _bump(md, links={**md.links, name: new})


def _unmirrored(t: TopicMetadata) -> TopicMetadata:
    """``t`` as an ordinary topic, every led partition in a new leader epoch (see ``links``)."""
    parts = tuple(
        p
        if p.leader < 0
        else msgspec.structs.replace(
            p, leader_epoch=p.leader_epoch + 1, partition_epoch=p.partition_epoch + 1
        )
        for p in t.partitions
    )
    return msgspec.structs.replace(t, mirror=None, partitions=parts)


def disconnect(md: ClusterMetadata, name: str, topic: str | None = None) -> ClusterMetadata:
    """Stop mirroring: one topic (it becomes writable; the link goes on with the others), or
    the whole link (every mirror becomes writable; the link stays, disconnected)."""
    link = get_link(md, name)
    if topic is not None:
        t = md_.get_topic(md, topic)
        if t.mirror is None or t.mirror.link != name:
            raise InvalidRequestError(f"topic {topic!r} is not a mirror of link {name!r}")
        return _bump(md, topics={**md.topics, topic: _unmirrored(t)})
    topics = {
        k: (_unmirrored(t) if t.mirror is not None and t.mirror.link == name else t)
        for k, t in md.topics.items()
    }
    new = msgspec.structs.replace(link, state=links_.DISCONNECTED)
    return _bump(md, topics=topics, links={**md.links, name: new})


def delete_link(md: ClusterMetadata, name: str) -> ClusterMetadata:
    """Remove a link; its mirror topics stay, as ordinary topics (disconnected first)."""
    md = disconnect(md, name)
    return _bump(md, links={k: v for k, v in md.links.items() if k != name})


def add_mirror_topic(
    md: ClusterMetadata,
    link_name: str,
    source: SourceTopic,
    topic_id: str,
    replication_factor: int,
    configs: Mapping[str, str],
) -> ClusterMetadata:
    """Create the mirror of ``source`` (same name and partition count, a topic id of its
    own); only for an active link."""
    link = get_link(md, link_name)
    if not link.active:
        raise InvalidRequestError(f"link {link_name!r} is {link.state}")
    md = md_.new_topic(md, source.name, topic_id, source.partitions, replication_factor, configs)
    t = md.topics[source.name]
    mirror = MirrorInfo(link=link_name, source_topic_id=source.topic_id)
    return msgspec.structs.replace(
        md, topics={**md.topics, source.name: msgspec.structs.replace(t, mirror=mirror)}
    )


def set_source_cluster_id(md: ClusterMetadata, name: str, cluster_id: str) -> ClusterMetadata:
    """Record the source's cluster id the first time the link reaches it."""
    link = get_link(md, name)
    if link.source_cluster_id == cluster_id:
        return md
    new = msgspec.structs.replace(link, source_cluster_id=cluster_id)
    return _bump(md, links={**md.links, name: new})
