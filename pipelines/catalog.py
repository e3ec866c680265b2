"""Where a topic's partitions live, and which replica a bulk reader should read.

A :class:`Catalog` answers two questions for the Spark and Ray Data readers: which topics
exist, and for a topic, each partition's leader, ISR and replica ids. Replicas are Ray actors
named :func:`raylog.actors.calls.replica_actor_name` in the ``raylog`` namespace, so a
partition's metadata is enough to reach any of its replicas.

Implementations:

- :class:`StaticCatalog`: explicit metadata. :func:`catalog_from_metadata` builds one from the
  active controller's ``ClusterMetadata`` (topics, assignments, leaders, ISR), which is what
  the Spark source and ``read_topic`` use (:func:`raylog.pipelines.reading.controller_catalog`
  asks the controller over Ray); tests of planning build one by hand.

Read placement (:func:`read_order`): prefer an in-sync follower, so that bulk reads do not load
the leader that serves producers; fall back to the leader, then to anything else. A replica
serves only committed records (below its own high watermark; KIP-392), so any ISR member
gives a correct, if possibly slightly older, view; the planner asks for end offsets before it
reads, and a reader that meets a replica whose high watermark is below the planned end waits
for it (bounded) or moves to the next replica.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

REMOTE_STORAGE_ENABLE = "remote.storage.enable"  # Kafka's topic config (KIP-405)


@dataclass(frozen=True)
class PartitionInfo:
    """One partition as a reader needs it. ``leader_id`` is -1 when the partition has none.
    ``remote_topic_id``: the topic's id when it has remote.storage.enable (its remote
    segments are under that id in the object store, :mod:`raylog.pipelines.remote_ranges`),
    else ""."""

    topic: str
    partition: int
    leader_id: int
    isr: tuple[int, ...] = ()
    replica_ids: tuple[int, ...] = field(default=())
    remote_topic_id: str = ""

    def __post_init__(self) -> None:
        if self.partition < 0:
            raise ValueError(f"partition {self.partition} of {self.topic!r} is negative")
        if not self.replica_ids:
            raise ValueError(f"{self.topic}-{self.partition} lists no replicas")
        stray = set(self.isr) - set(self.replica_ids)
        if stray:
            raise ValueError(f"{self.topic}-{self.partition}: ISR members {stray} not replicas")


class Catalog(Protocol):
    """Topic metadata for readers."""

    def topics(self) -> list[str]: ...

    def partitions(self, topic: str) -> list[PartitionInfo]:
        """Every partition of ``topic``, sorted by partition; [] when the topic is unknown."""
        ...


class StaticCatalog:
    """A catalog over explicit metadata."""

    def __init__(self, partitions: Iterable[PartitionInfo]) -> None:
        by_topic: dict[str, dict[int, PartitionInfo]] = {}
        for p in partitions:
            if p.partition in by_topic.setdefault(p.topic, {}):
                raise ValueError(f"{p.topic}-{p.partition} listed twice")
            by_topic[p.topic][p.partition] = p
        self._by_topic = {t: [ps[k] for k in sorted(ps)] for t, ps in by_topic.items()}

    def topics(self) -> list[str]:
        return sorted(self._by_topic)

    def partitions(self, topic: str) -> list[PartitionInfo]:
        return list(self._by_topic.get(topic, []))

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> StaticCatalog:
        """Parse ``{"topic": [{"partition": 0, "leader": 0, "isr": [0, 1], "replicas": [0, 1,
        2]}, ...]}``. ``isr`` defaults to ``replicas`` and ``leader`` to the first replica."""
        data = json.loads(text) if isinstance(text, str) else text
        if not isinstance(data, Mapping):
            raise ValueError("catalog must be a JSON object of topic -> list of partitions")
        infos = []
        for topic, parts in data.items():
            if not isinstance(parts, list):
                raise ValueError(f"catalog entry for {topic!r} must be a list of partitions")
            for p in parts:
                if not isinstance(p, Mapping) or "partition" not in p or "replicas" not in p:
                    raise ValueError(
                        f"catalog partition of {topic!r} needs 'partition' and 'replicas': {p!r}"
                    )
                replicas = tuple(int(r) for r in p["replicas"])
                infos.append(
                    PartitionInfo(
                        topic=str(topic),
                        partition=int(p["partition"]),
                        leader_id=int(p.get("leader", replicas[0] if replicas else -1)),
                        isr=tuple(int(r) for r in p.get("isr", replicas)),
                        replica_ids=replicas,
                    )
                )
        return cls(infos)

    def to_json(self) -> str:
        return json.dumps(
            {
                t: [
                    {
                        "partition": p.partition,
                        "leader": p.leader_id,
                        "isr": list(p.isr),
                        "replicas": list(p.replica_ids),
                    }
                    for p in ps
                ]
                for t, ps in self._by_topic.items()
            }
        )


def catalog_from_metadata(metadata: Any) -> StaticCatalog:
    """A catalog of the controller's ``ClusterMetadata`` (:mod:`raylog.actors.control.metadata`).

    Replica ids are broker ids; a partition without a leader has ``leader`` -1 (NO_LEADER),
    which :func:`read_order` then skips. A topic with remote.storage.enable gives its
    partitions its topic id.
    """
    return StaticCatalog(
        PartitionInfo(
            topic=name,
            partition=p.partition,
            leader_id=p.leader,
            isr=tuple(p.isr),
            replica_ids=tuple(p.replicas),
            remote_topic_id=topic.topic_id if _tiered(topic.configs) else "",
        )
        for name, topic in metadata.topics.items()
        for p in topic.partitions
    )


def _tiered(configs: Mapping[str, str]) -> bool:
    # The controller stores validated values: a boolean is "true" or "false".
    return configs.get(REMOTE_STORAGE_ENABLE, "false") == "true"


def read_order(info: PartitionInfo) -> list[int]:
    """Replica ids in the order a bulk reader tries them.

    1. in-sync followers (lowest id first, so that readers of one partition agree and
       share the follower's page cache);
    2. the leader;
    3. replicas out of the ISR (they still serve committed data below their own high
       watermark, which may be behind: the reader checks it).
    """
    followers = sorted(r for r in info.isr if r != info.leader_id)
    order = [*followers]
    if info.leader_id >= 0:
        order.append(info.leader_id)
    order += sorted(r for r in info.replica_ids if r not in order)
    return order


def matching_topics(catalog: Catalog, topics: Sequence[str]) -> list[str]:
    """The subset of ``topics`` the catalog knows, in order."""
    known = set(catalog.topics())
    return [t for t in topics if t in known]
