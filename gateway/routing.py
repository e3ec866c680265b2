"""Where a partition's request goes, decided from the gateway's metadata: pure, no I/O.

This module owns the routing rules of one broker's gateway, as Kafka's brokers apply them, and
the metadata they read: a :class:`MetadataSource`, a local, synchronous view of topics, leaders
and brokers (:class:`MetadataView`, kept current by the gateway actor from the controller's
metadata, or set by hand in tests).

A view is ``current`` once it holds the cluster's topics: given at construction or by the first
``update`` with topics (the gateway actor's first read from the active controller, whose
metadata is the stored one). Until then it knows no topic, and that must never reach a client
as "no such topic": librdkafka fails every queued record of a topic a broker calls unknown
(_UNKNOWN_PARTITION, _UNKNOWN_TOPIC), and a client drops records it is told have nowhere to go.
The gateway actor does not serve at all until its view is current (Kafka's brokers accept
requests only once their metadata caught up); rule 0 keeps the routing decision itself safe.

Routing:

0. While the view is not current, every partition is LEADER_NOT_AVAILABLE (5): its leader is
   not known here yet. Clients refresh their metadata and retry. :func:`leader_error`.
1. A partition the (current) view does not hold is UNKNOWN_TOPIC_OR_PARTITION (3).
2. A partition this broker does not lead (``leader != this_broker_id``, including leaderless
   ones) is NOT_LEADER_OR_FOLLOWER (6): every client refreshes Metadata on 6 and sends the
   request to the leader's gateway, which Metadata advertises. Fetch v11+ is the exception
   (rule 5). :func:`leader_error`.
3. Otherwise the call goes to this broker's replica of the partition, the Ray actor named
   ``replica_actor_name(topic, partition, this_broker_id)`` (replica ids are broker ids). The
   replica checks leadership and leader epochs again, so a stale view cannot make a follower
   accept a write.

Follower fetching (KIP-392), as Kafka's ReplicaManager does it, for Fetch v11+ (requests that
carry client metadata, ``rack_id`` not None):

4. On the leader, a consumer whose ``rack_id`` is set and differs from the leader's rack is
   pointed at an in-sync replica on a live broker in its rack: the answer carries
   ``preferred_read_replica`` and no records, and the client fetches from that broker. The ISR
   is the leader replica's own (fresher than the metadata), and only fetch offsets at or below
   the high watermark qualify: every ISR member holds them (HW = min log end over the ISR).
   Kafka excludes out-of-sync followers for the same reason: a lagging one would leave the
   consumer behind for as long as the client keeps its preferred replica.
   :func:`rack_candidates` and :func:`preferred_read_replica`.
5. On a broker that holds a replica but does not lead, a v11+ fetch is served by the local
   replica up to its own high watermark (the replica checks its role and the leader epoch). A
   follower that falls out of the ISR keeps serving, as in Kafka, but stops being preferred;
   clients return to the leader when their preferred replica expires or on any error. Without
   client metadata (Fetch before v11) only the leader serves, as rule 2 says.
   :func:`replica_error`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from raylog.gateway.backend import Broker, ClusterView, PartitionState, TopicState
from raylog.gateway.errors import ErrorCode

__all__ = [
    "MetadataSource",
    "MetadataView",
    "find_partition",
    "leader_error",
    "partition_leader",
    "preferred_read_replica",
    "rack_candidates",
    "replica_error",
]


class MetadataSource(Protocol):
    """The local metadata a gateway routes by: cheap, synchronous snapshots."""

    @property
    def this_broker_id(self) -> int: ...

    @property
    def current(self) -> bool:
        """Whether the topics are the cluster's (see the module docstring), not yet unknown."""
        ...

    def cluster(self) -> ClusterView: ...

    def topics(self) -> Mapping[str, TopicState]: ...


class MetadataView:
    """A settable :class:`MetadataSource`, updated with what the controller's metadata says.

    Every ``update`` replaces whole values, so a reader always sees one consistent snapshot.
    ``topics`` None (the default) means not known yet: the view is not ``current`` until an
    ``update`` gives them; ``{}`` means a cluster without topics.
    """

    def __init__(
        self,
        this_broker_id: int,
        cluster_id: str,
        *,
        controller_id: int = -1,
        brokers: Sequence[Broker] = (),
        topics: Mapping[str, TopicState] | None = None,
    ) -> None:
        self._this_broker_id = this_broker_id
        self._cluster = ClusterView(cluster_id, controller_id, tuple(brokers))
        self._topics: Mapping[str, TopicState] = dict(topics or {})
        self._current = topics is not None

    @property
    def this_broker_id(self) -> int:
        return self._this_broker_id

    @property
    def current(self) -> bool:
        return self._current

    def cluster(self) -> ClusterView:
        return self._cluster

    def topics(self) -> Mapping[str, TopicState]:
        return self._topics

    def update(
        self,
        *,
        controller_id: int | None = None,
        brokers: Sequence[Broker] | None = None,
        topics: Mapping[str, TopicState] | None = None,
    ) -> None:
        cluster = self._cluster
        self._cluster = ClusterView(
            cluster.cluster_id,
            cluster.controller_id if controller_id is None else controller_id,
            cluster.brokers if brokers is None else tuple(brokers),
        )
        if topics is not None:
            self._topics = dict(topics)
            self._current = True


def find_partition(
    topics: Mapping[str, TopicState], topic: str, partition: int
) -> PartitionState | None:
    state = topics.get(topic)
    if state is None or partition < 0:
        return None
    partitions = state.partitions
    # Partitions are normally listed by index; fall back to a scan if they are not.
    if partition < len(partitions) and partitions[partition].partition == partition:
        return partitions[partition]
    return next((p for p in partitions if p.partition == partition), None)


def leader_error(metadata: MetadataSource, topic: str, partition: int) -> int:
    """0 when this broker leads the partition (rule 3), else the error the client must see
    (rules 0, 1 and 2)."""
    if not metadata.current:
        return ErrorCode.LEADER_NOT_AVAILABLE
    state = find_partition(metadata.topics(), topic, partition)
    if state is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if state.leader != metadata.this_broker_id:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.NONE


def partition_leader(metadata: MetadataSource, topic: str, partition: int) -> tuple[int, int]:
    """``(0, leader id)`` of a partition, whichever broker leads it (the transaction
    coordinator's markers go to the leader's replica), else ``(error, -1)``: rules 0 and 1, or
    LEADER_NOT_AVAILABLE (5) for a leaderless partition."""
    if not metadata.current:
        return ErrorCode.LEADER_NOT_AVAILABLE, -1
    state = find_partition(metadata.topics(), topic, partition)
    if state is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
    if state.leader < 0:
        return ErrorCode.LEADER_NOT_AVAILABLE, -1
    return ErrorCode.NONE, state.leader


def replica_error(metadata: MetadataSource, topic: str, partition: int) -> int:
    """0 when this broker holds a replica of the partition, which may serve a v11+ fetch
    (rule 5), else the error the client must see (rules 0 and 1, or NOT_LEADER_OR_FOLLOWER)."""
    if not metadata.current:
        return ErrorCode.LEADER_NOT_AVAILABLE
    state = find_partition(metadata.topics(), topic, partition)
    if state is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if metadata.this_broker_id not in state.replicas:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.NONE


def rack_candidates(
    metadata: MetadataSource, topic: str, partition: int, rack_id: str
) -> list[int]:
    """Rule 4, from the metadata alone: the replicas on live brokers in the client's rack that
    the leader (this broker) may point the client at; empty when it serves the fetch itself
    (it does not lead, or it is in the client's rack)."""
    state = find_partition(metadata.topics(), topic, partition)
    if state is None or state.leader != metadata.this_broker_id:
        return []  # a follower serving (rule 5): only the leader prefers
    racks = {b.node_id: b.rack for b in metadata.cluster().brokers}
    if racks.get(metadata.this_broker_id) == rack_id:
        return []
    return [r for r in state.replicas if r in racks and racks[r] == rack_id]


def preferred_read_replica(
    candidates: Sequence[int],
    *,
    role: str,
    isr: Sequence[int],
    high_watermark: int,
    fetch_offset: int,
) -> int | None:
    """Rule 4, given the leader replica's own state: the first of ``candidates`` in its ISR,
    when it still leads and ``fetch_offset`` is at or below its high watermark; else None
    (the leader serves the fetch)."""
    if role != "leader" or not 0 <= fetch_offset <= high_watermark:
        return None
    return next((r for r in candidates if r in isr), None)
