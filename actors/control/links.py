"""Pure: cross-cluster links (KIP-986) as cluster metadata, and the controller's decisions on them.

This module owns what a link is (:class:`ClusterLink`: where the source cluster is, how to reach
it, which of its topics and groups to mirror), what a mirror topic records
(:class:`MirrorInfo`), and the transitions the active controller applies with its
compare-and-swap: creating, altering, disconnecting and deleting links, and the mirror topics a
link's discovery creates or grows.

Decisions:
- A link is defined on the destination. Its name follows Kafka's topic-name rule. ``bootstrap``
  is one or more ``host:port``. Its configs are the source client's settings (Kafka's client
  names: ``security.protocol``, ``sasl.*``, ``ssl.*``) and the link's own bounds
  (:data:`LINK_CONFIGS`). Secrets (``sasl.password``, ``sasl.jaas.config``) are stored in the
  metadata like user credentials and never shown: :func:`describe_configs` masks them and the
  link's repr hides them.
- Mirror topics keep the source's name and partition count and get a topic id of their own.
  While their link is active they are read-only: the leader replica takes only the link's
  batches (``BecomeLeader.mirror_link``), and refuses produce and DeleteRecords.
- Reservations: while an active link's ``topics.regex`` matches a name, a local creation of that
  topic is refused (:func:`check_reserved`); a new link whose regex matches existing local
  topics that are not its mirrors is refused, naming them (their offsets are not the source's).
- Discovery (:func:`plan_mirrors`): every source topic the regex matches (internal ones never)
  that does not exist here becomes a mirror topic; a mirror whose source gained partitions
  grows; a local topic of the same name that is not this link's mirror is left alone (and
  reported). A mirror's configs that describe its data (:data:`MIRRORED_TOPIC_CONFIGS`:
  retention, cleanup policy, compression, message size and timestamp type) follow the source's
  and cannot be altered here while the link is active (:func:`check_own_configs`); the others
  (ISR, elections, replication and flush settings) are the destination's own.
- Disconnect (a whole link or one topic) makes the mirror topics ordinary topics, writable at
  the next offset. Every partition's leader epoch is bumped in the same metadata version: the
  leader learns it is no longer a mirror from a BecomeLeader of a new epoch, which also fences
  any mirrored append still in flight (those carry the epoch they were fetched under). A
  disconnected link discovers and fetches nothing. Deleting a link disconnects its mirrors first.
- ``mode`` ``sync`` (the source holding acks=all for the link) is refused until it is built.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import msgspec

from raylog.storage.errors import InvalidConfigError, InvalidRequestError

__all__ = [
    "LINK_CONFIGS",
    "SECRET_CONFIGS",
    "ClusterLink",
    "MirrorInfo",
    "MirrorPlan",
    "SourceTopic",
    "check_reserved",
    "describe_configs",
    "link_config",
    "mirrored_topic_configs",
    "parse_bootstrap",
    "plan_mirrors",
    "validate_link",
]

ACTIVE = "active"
DISCONNECTED = "disconnected"
MODES = ("async", "sync")
MAX_LINK_NAME_LENGTH = 249
_NAME = re.compile(r"[a-zA-Z0-9._-]+")

# Link configs: name -> (default, kind). Kafka's client names for reaching the source.
LINK_CONFIGS: dict[str, tuple[str, str]] = {
    "security.protocol": ("PLAINTEXT", "protocol"),
    "sasl.mechanism": ("", "mechanism"),
    "sasl.username": ("", "string"),
    "sasl.password": ("", "string"),
    "sasl.jaas.config": ("", "string"),
    "ssl.ca.location": ("", "string"),
    "ssl.endpoint.identification.algorithm": ("https", "identification"),
    # The link's own bounds: bytes per Fetch, per partition, and its metadata refresh.
    "link.fetch.max.bytes": (str(32 << 20), "int"),
    "link.fetch.partition.max.bytes": (str(8 << 20), "int"),
    "link.fetch.max.wait.ms": ("500", "int"),
    "link.metadata.refresh.interval.ms": ("5000", "int"),
    "link.throttle.bytes.per.sec": ("0", "int"),  # 0: unthrottled
    "link.groups.sync.interval.ms": ("5000", "int"),  # consumer-group offset sync (link_groups)
    # The replication factor of the mirror topics the link creates; -1: the destination's
    # default.replication.factor. Either way at most the destination's broker count.
    "link.mirror.replication.factor": ("-1", "int"),
}
SECRET_CONFIGS = frozenset({"sasl.password", "sasl.jaas.config"})
_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "link.fetch.max.bytes": (1 << 10, 1 << 30),
    "link.fetch.partition.max.bytes": (1 << 10, 1 << 30),
    "link.fetch.max.wait.ms": (0, 60_000),
    "link.metadata.refresh.interval.ms": (100, 3_600_000),
    "link.throttle.bytes.per.sec": (0, 1 << 40),
    "link.groups.sync.interval.ms": (100, 3_600_000),
    "link.mirror.replication.factor": (-1, 32_767),
}
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Topic configs a mirror takes from its source: they describe the data. The others (ISR,
# elections, raylog's replication and flush settings) are the destination's own.
MIRRORED_TOPIC_CONFIGS = frozenset(
    {
        "cleanup.policy",
        "compression.type",
        "delete.retention.ms",
        "max.compaction.lag.ms",
        "max.message.bytes",
        "message.timestamp.type",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "retention.bytes",
        "retention.ms",
    }
)


class ClusterLink(msgspec.Struct, frozen=True, kw_only=True):
    """A link from a source cluster to this one (see the module docstring)."""

    name: str
    link_id: str  # uuid hex
    bootstrap: tuple[str, ...]
    mode: str = "async"
    topics_regex: str = ""  # "" : no topic is mirrored automatically
    groups_regex: str = ""
    configs: dict[str, str] = {}  # overrides of LINK_CONFIGS, validated
    state: str = ACTIVE
    source_cluster_id: str = ""  # learned on the first contact

    def __repr__(self) -> str:
        shown = describe_configs(self.configs)
        return (
            f"ClusterLink({self.name!r}, bootstrap={list(self.bootstrap)}, mode={self.mode}, "
            f"state={self.state}, topics_regex={self.topics_regex!r}, configs={shown})"
        )

    @property
    def active(self) -> bool:
        return self.state == ACTIVE

    def matches_topic(self, topic: str) -> bool:
        return bool(self.topics_regex) and re.fullmatch(self.topics_regex, topic) is not None

    def matches_group(self, group: str) -> bool:
        return bool(self.groups_regex) and re.fullmatch(self.groups_regex, group) is not None


class MirrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A topic is a mirror of ``link``'s source topic ``source_topic_id`` (uuid hex, "" if the
    source has none)."""

    link: str
    source_topic_id: str = ""


class SourceTopic(msgspec.Struct, frozen=True):
    """What discovery learned of one source topic."""

    name: str
    topic_id: str
    partitions: int
    configs: dict[str, str] = {}  # the source's non-default configs


class MirrorPlan(msgspec.Struct, frozen=True):
    """What a discovery round does: topics to create (name, partitions, configs, source topic
    id), mirrors to grow (name, partitions), mirrors whose configs follow the source's (name,
    the whole new override set), and names it leaves alone, with the reason."""

    create: tuple[SourceTopic, ...] = ()
    grow: tuple[tuple[str, int], ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    configs: tuple[tuple[str, dict[str, str]], ...] = ()


# --- validation ---------------------------------------------------------------------------------


def parse_bootstrap(bootstrap: str | Sequence[str]) -> tuple[str, ...]:
    """``host:port[,host:port...]`` as a tuple; raises InvalidConfigError."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    out = []
    for raw in items:
        item = raw.strip()
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidConfigError(f"bootstrap server {item!r} is not host:port")
        out.append(item)
    if not out:
        raise InvalidConfigError("a link needs at least one bootstrap server")
    return tuple(out)


def _check_regex(what: str, pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise InvalidConfigError(f"{what} {pattern!r} is not a regular expression: {exc}") from None


def link_config(configs: Mapping[str, str]) -> dict[str, str]:
    """The overrides, validated (unknown names and bad values raise
    InvalidConfigError); returns them normalised."""
    out = {}
    for name, value in configs.items():
        if name not in LINK_CONFIGS:
            raise InvalidConfigError(
                f"unknown link config {name!r}; known: {', '.join(sorted(LINK_CONFIGS))}"
            )
        kind = LINK_CONFIGS[name][1]
        value = value.strip()
        if kind == "int":
            low, high = _INT_BOUNDS[name]
            if not value.lstrip("-").isdigit() or not low <= int(value) <= high:
                raise InvalidConfigError(
                    f"link config {name}={value!r}: expected an integer in [{low}, {high}]"
                )
            value = str(int(value))
        elif kind == "protocol" and value.upper() not in _PROTOCOLS:
            raise InvalidConfigError(f"security.protocol {value!r}: one of {_PROTOCOLS}")
        elif kind == "mechanism" and value.upper() not in _MECHANISMS:
            raise InvalidConfigError(f"sasl.mechanism {value!r}: one of {_MECHANISMS[1:]}")
        elif kind == "identification" and value.lower() not in ("", "none", "https"):
            raise InvalidConfigError(
                f"ssl.endpoint.identification.algorithm {value!r}: https, none or empty"
            )
        if kind in ("protocol", "mechanism"):
            value = value.upper()
        out[name] = value
    protocol = out.get("security.protocol", "PLAINTEXT")
    if protocol.startswith("SASL") and not out.get("sasl.mechanism"):
        raise InvalidConfigError(f"security.protocol {protocol} needs sasl.mechanism")
    return out


def mirror_replication_factor(
    configs: Mapping[str, str], default_replication_factor: int, brokers: int
) -> int:
    """The replication factor of a mirror topic the link creates (never 0, never above the
    broker count)."""
    key = "link.mirror.replication.factor"
    wanted = int(configs.get(key, LINK_CONFIGS[key][0]))
    if wanted <= 0:
        wanted = default_replication_factor
    return max(1, min(wanted, brokers))


def describe_configs(configs: Mapping[str, str]) -> dict[str, str]:
    """Every link config with its value, secrets masked (never shown, as Kafka's
    DescribeConfigs shows a password config as null)."""
    out = {name: default for name, (default, _) in LINK_CONFIGS.items()}
    out.update(configs)
    return {k: ("[hidden]" if k in SECRET_CONFIGS and v else v) for k, v in sorted(out.items())}


def validate_link(
    name: str,
    bootstrap: Sequence[str],
    mode: str,
    topics_regex: str,
    groups_regex: str,
    configs: Mapping[str, str],
) -> None:
    """Raise InvalidRequestError / InvalidConfigError for a link that cannot be."""
    if not name or len(name) > MAX_LINK_NAME_LENGTH or not _NAME.fullmatch(name):
        raise InvalidRequestError(
            f"link name {name!r} is illegal: 1-{MAX_LINK_NAME_LENGTH} ASCII letters, digits, "
            "'.', '_' or '-'"
        )
    parse_bootstrap(bootstrap)
    if mode not in MODES:
        raise InvalidConfigError(f"link mode {mode!r}: one of {', '.join(MODES)}")
    if mode == "sync":
        raise InvalidConfigError(
            "link mode 'sync' is not supported yet: create the link with --mode async"
        )
    _check_regex("topics.regex", topics_regex)
    _check_regex("consumer.groups.regex", groups_regex)
    link_config(configs)


# --- reservations and discovery ---------------------------------------------------------------


def check_reserved(links: Mapping[str, ClusterLink], topic: str) -> None:
    """Refuse a local creation of a topic an active link's regex matches."""
    for link in sorted(links.values(), key=lambda x: x.name):
        if link.active and link.matches_topic(topic):
            raise InvalidRequestError(
                f"topic {topic!r} is reserved by link {link.name!r} (topics.regex "
                f"{link.topics_regex!r}): the link creates it as a mirror of its source"
            )


def conflicting_topics(link: ClusterLink, topics: Mapping[str, MirrorInfo | None]) -> list[str]:
    """Local topics ``link``'s regex matches that are not its mirrors (``topics``: every local
    topic and its mirror info)."""
    return sorted(
        name
        for name, mirror in topics.items()
        if link.matches_topic(name) and (mirror is None or mirror.link != link.name)
    )


def mirrored_topic_configs(source: Mapping[str, str]) -> dict[str, str]:
    """The source's configs a mirror takes (:data:`MIRRORED_TOPIC_CONFIGS`)."""
    return {k: v for k, v in source.items() if k in MIRRORED_TOPIC_CONFIGS}


def followed_configs(local: Mapping[str, str], source: Mapping[str, str]) -> dict[str, str]:
    """A mirror's override set once it follows ``source``: the mirrored keys as the source has
    them (an override the source dropped goes too), the destination's own keys as they are."""
    own = {k: v for k, v in local.items() if k not in MIRRORED_TOPIC_CONFIGS}
    return {**own, **mirrored_topic_configs(source)}


def check_own_configs(mirror: MirrorInfo, old: Mapping[str, str], new: Mapping[str, str]) -> None:
    """Refuse an AlterConfigs of a mirror topic that changes a config it takes from its source
    (those follow the source while the link is active; the others are the destination's own)."""
    changed = sorted(k for k in MIRRORED_TOPIC_CONFIGS if old.get(k) != new.get(k))
    if changed:
        raise InvalidRequestError(
            f"{', '.join(changed)} of a mirror of link {mirror.link!r} follow the source "
            "topic's; alter them there, or disconnect the topic first"
        )


LocalTopic = tuple[MirrorInfo | None, int, Mapping[str, str]]


def plan_mirrors(
    link: ClusterLink, source: Sequence[SourceTopic], local: Mapping[str, LocalTopic]
) -> MirrorPlan:
    """One discovery round of an active link (see the module docstring). ``local``: every
    local topic's mirror info, partition count and config overrides."""
    if not link.active or not link.topics_regex:
        return MirrorPlan()
    create: list[SourceTopic] = []
    grow: list[tuple[str, int]] = []
    skipped: list[tuple[str, str]] = []
    configs: list[tuple[str, dict[str, str]]] = []
    for topic in sorted(source, key=lambda t: t.name):
        if topic.name.startswith("__") or not link.matches_topic(topic.name):
            continue
        if topic.name not in local:
            create.append(topic)
            continue
        mirror, count, overrides = local[topic.name]
        if mirror is None or mirror.link != link.name:
            skipped.append((topic.name, "a local topic of that name is not this link's mirror"))
            continue
        if topic.partitions > count:
            grow.append((topic.name, topic.partitions))
        followed = followed_configs(overrides, topic.configs)
        if followed != dict(overrides):
            configs.append((topic.name, followed))
    return MirrorPlan(tuple(create), tuple(grow), tuple(skipped), tuple(configs))
