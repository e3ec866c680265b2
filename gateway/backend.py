"""The interface the gateway's handlers call to learn and change the cluster's state.

This module owns the boundary between the Kafka protocol and raylog's actors: handlers speak
Kafka, the backend speaks raylog, and the values crossing it are plain immutable data
(NamedTuples of ints and strings), never protocol messages and never Ray handles. The real backend
(calls to the controller and replica actors) is ``gateway/replica_backend.py``; tests use
in-memory ones.

Methods grow with the handlers: :class:`Backend` is what Metadata needs, :class:`DataBackend`
adds the data path (Produce, Fetch, ListOffsets, and DeleteRecords, which like them goes to
each partition's leader replica), :class:`AdminBackend` the admin APIs (topics, configs, SCRAM
users and client quotas, carried out by the active controller whichever broker the request
reached). Record batches cross this boundary as opaque ``bytes``: neither side decodes records
on the produce or fetch path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple, Protocol, runtime_checkable

from raylog.actors.control.acls import AclBinding, AclBindingFilter, CreationResult, DeletionResult
from raylog.actors.control.client_quotas import ClientQuotaEntry, DescribeResult, EntityResult
from raylog.actors.control.metadata import ScramUserDescription, UserResult

__all__ = [
    "AdminBackend",
    "AdminResult",
    "Backend",
    "Broker",
    "ClientQuotaEntry",
    "ClusterView",
    "DataBackend",
    "DeleteRecordsResult",
    "DescribeResult",
    "EntityResult",
    "FetchResult",
    "ListOffsetsResult",
    "NewTopic",
    "PartitionFetch",
    "PartitionState",
    "ProduceResult",
    "ScramUpsertion",
    "ScramUserDescription",
    "TopicConfigsResult",
    "TopicState",
    "UserResult",
]

READ_UNCOMMITTED = 0  # Fetch / ListOffsets isolation_level values, as on the wire
READ_COMMITTED = 1


class Broker(NamedTuple):
    """A broker as clients must reach it: its gateway's advertised address (its first
    listener's) and, by listener name, every listener's."""

    node_id: int
    host: str
    port: int
    rack: str | None
    endpoints: tuple[tuple[str, str, int], ...] = ()  # (listener name, host, port)

    def address(self, listener: str) -> tuple[str, int] | None:
        """Where a client that came in on ``listener`` reaches this broker; None when it has no
        such listener (Kafka leaves the broker out of that client's answers). Without
        endpoints, or for an unnamed listener: the first listener's address."""
        if not self.endpoints or not listener:
            return self.host, self.port
        for name, host, port in self.endpoints:
            if name == listener:
                return host, port
        return None


class ClusterView(NamedTuple):
    """One consistent snapshot of the cluster's identity and live brokers."""

    cluster_id: str
    controller_id: int  # -1 when no controller is known
    brokers: Sequence[Broker]


class PartitionState(NamedTuple):
    """One partition as Metadata reports it. ``leader`` is -1 when the partition has none."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: Sequence[int]
    isr: Sequence[int]
    offline_replicas: Sequence[int]


class TopicState(NamedTuple):
    name: str
    partitions: Sequence[PartitionState]
    internal: bool = False


@runtime_checkable
class Backend(Protocol):
    """What the gateway needs from the rest of raylog. Every method is a bounded wait."""

    async def cluster(self) -> ClusterView:
        """The cluster id, the active controller and the live brokers."""
        ...

    async def topics(self, names: Sequence[str] | None) -> Mapping[str, TopicState]:
        """The named topics that exist (absent names do not), or every topic when None.

        Never creates a topic: raylog has no auto-creation from Metadata.
        """
        ...


class ProduceResult(NamedTuple):
    """The outcome of appending one batch to one partition (Kafka's ProduceResponse fields).

    ``base_offset`` is -1 on error and for acks=0 when the replica did not wait;
    ``log_append_time`` is -1 unless the broker stamped LogAppendTime.
    """

    error_code: int
    base_offset: int
    log_append_time: int
    log_start_offset: int
    message: str = ""
    # Nothing appended: the batch would open a transaction there, to be verified first.
    needs_verification: bool = False


class PartitionFetch(NamedTuple):
    """One partition's part of a Fetch request, as the backend reads it.

    ``max_wait_ms`` and ``min_bytes``: wait up to that long for that many bytes (0 and 1:
    answer at once). ``current_leader_epoch`` -1: not checked. ``rack_id``: see
    :meth:`DataBackend.fetch`.
    """

    fetch_offset: int
    max_bytes: int
    max_wait_ms: int = 0
    min_bytes: int = 1
    isolation_level: int = READ_UNCOMMITTED
    current_leader_epoch: int = -1
    rack_id: str | None = None


class FetchResult(NamedTuple):
    """One partition's fetch: whole stored batches from the one holding the fetch offset.

    ``records`` may start before the fetch offset (clients skip what they did not ask for) and
    holds only records below ``last_stable_offset`` for read_committed, below
    ``high_watermark`` for read_uncommitted. Offsets are -1 when ``error_code`` is set.
    """

    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records: bytes
    preferred_read_replica: int = -1  # KIP-392; -1 = read from the leader
    message: str = ""
    # read_committed: (producer id, first offset) of the aborted transactions ``records``
    # overlap (Kafka's AbortedTransactions).
    aborted_transactions: tuple[tuple[int, int], ...] = ()


class ListOffsetsResult(NamedTuple):
    """ListOffsets for one partition: ``(timestamp, offset)``, (-1, -1) when none matches."""

    error_code: int
    timestamp: int
    offset: int
    leader_epoch: int = -1


class DeleteRecordsResult(NamedTuple):
    """DeleteRecords for one partition: the low watermark (the lowest log start offset over
    the in-sync replicas) once it reached the requested offset, -1 with ``error_code`` set."""

    error_code: int
    low_watermark: int
    message: str = ""


@runtime_checkable
class DataBackend(Backend, Protocol):
    """A :class:`Backend` that also serves the data path, for Produce, Fetch and ListOffsets.

    Every method answers for one partition, reports expected failures as Kafka error codes in
    its result (never by raising), and returns within a bound: ``timeout_ms`` for produce,
    ``max_wait_ms`` for fetch, plus the backend's own call timeout. UNKNOWN_TOPIC_OR_PARTITION
    (3) for a partition the metadata does not hold; NOT_LEADER_OR_FOLLOWER (6) when this broker
    does not lead it, so that the client refreshes its metadata and goes to the leader.
    """

    async def produce(
        self,
        topic: str,
        partition: int,
        records: bytes | memoryview,
        acks: int,
        timeout_ms: int,
        on_sent: Callable[[], None] | None = None,
        verify_txn: bool = False,
    ) -> ProduceResult:
        """Append one client batch (validated and stamped by the leader replica).

        ``records`` may be a view into the client's request, valid until this returns.
        ``verify_txn``: a transactional batch that would open its producer's transaction on the
        partition is not appended but answered ``needs_verification`` (KIP-890).

        ``on_sent``, if given, is called once the batch is on a path that keeps order: a later
        produce to the same partition, started after it, is appended after this one. Then
        the caller need not wait for this one's acks before sending the next.
        """
        ...

    async def fetch(self, topic: str, partition: int, read: PartitionFetch) -> FetchResult:
        """Read from ``read.fetch_offset``, waiting up to ``read.max_wait_ms`` for
        ``read.min_bytes``.

        ``read.rack_id`` is KIP-392's client metadata: None for requests before Fetch v11
        (served by the leader only); a string, possibly empty, from v11 on, when a follower of
        the partition may serve the read and the leader may name a ``preferred_read_replica``.
        """
        ...

    async def list_offsets(
        self,
        topic: str,
        partition: int,
        timestamp: int,
        isolation_level: int,
        current_leader_epoch: int,
    ) -> ListOffsetsResult:
        """-2: the log start offset; -1: the last fetchable offset; else the first offset
        whose batch has a timestamp >= ``timestamp``."""
        ...

    async def delete_records(
        self, topic: str, partition: int, offset: int, timeout_ms: int
    ) -> DeleteRecordsResult:
        """Move the partition's log start offset up to ``offset`` (-1: the high watermark) and
        wait, up to ``timeout_ms``, until every in-sync replica's has moved (Kafka's
        DelayedDeleteRecords): then REQUEST_TIMED_OUT (7). OFFSET_OUT_OF_RANGE (1) above the
        high watermark, POLICY_VIOLATION (44) when cleanup.policy lacks delete."""
        ...


class AdminResult(NamedTuple):
    """The outcome of one admin operation on one resource: 0 and "" on success."""

    error_code: int
    message: str = ""


class NewTopic(NamedTuple):
    """A topic CreateTopics asks for, its counts resolved (no -1 here): ``assignment`` (one
    replica list per partition) when the client placed the replicas, else None."""

    name: str
    num_partitions: int
    replication_factor: int
    assignment: Sequence[Sequence[int]] | None = None
    configs: Mapping[str, str] = MappingProxyType({})


class TopicConfigsResult(NamedTuple):
    """A topic's config overrides (``{}`` with ``error_code`` set when it cannot be read)."""

    error_code: int
    overrides: Mapping[str, str]
    message: str = ""


# AlterUserScramCredentials' upsertion: (user, mechanism name, iterations, salt, salted
# password); the password itself never reaches raylog.
ScramUpsertion = tuple[str, str, int, bytes, bytes]


@runtime_checkable
class AdminBackend(Backend, Protocol):
    """A :class:`Backend` that also carries out admin requests through the active controller.

    Every method reports expected failures as Kafka error codes with a message naming the
    problem (never by raising) and returns within its ``timeout_ms`` plus the backend's own call
    bound. ``validate_only`` runs the controller's own checks on the current metadata and
    changes nothing.
    """

    async def broker_configs(self) -> tuple[int, Mapping[str, str]]:
        """This broker's id and its broker config overrides (``config_keys.BROKER_CONFIGS``)."""
        ...

    async def create_topic(
        self, topic: NewTopic, validate_only: bool, timeout_ms: int
    ) -> AdminResult:
        """Create a topic. With ``timeout_ms`` > 0 it returns once every partition has a
        serving leader and the topic is in this broker's metadata, else REQUEST_TIMED_OUT (7)
        (the topic stays, being created); with 0 or less once the controller committed it
        (Kafka's rule)."""
        ...

    async def delete_topic(self, name: str, timeout_ms: int) -> AdminResult:
        """Delete a topic; like ``create_topic`` it waits (bounded) until metadata drops it."""
        ...

    async def topic_configs(self, name: str) -> TopicConfigsResult:
        """The topic's stored config overrides."""
        ...

    async def alter_topic_configs(
        self, name: str, overrides: Mapping[str, str], validate_only: bool
    ) -> AdminResult:
        """Replace the topic's whole set of config overrides with ``overrides``."""
        ...

    async def create_partitions(
        self, name: str, total_count: int, validate_only: bool, timeout_ms: int
    ) -> AdminResult:
        """Grow a topic to ``total_count`` partitions (placed by the controller); waits like
        ``create_topic`` until this broker's metadata shows them."""
        ...

    async def elect_leaders(
        self, election_type: str, partitions: Sequence[tuple[str, int]] | None
    ) -> Mapping[tuple[str, int], AdminResult]:
        """ElectLeaders ("preferred" or "unclean") on ``partitions`` (every one when None):
        one result per partition the controller reports on."""
        ...

    async def alter_scram_credentials(
        self, upsertions: Sequence[ScramUpsertion], deletions: Sequence[tuple[str, str]]
    ) -> Sequence[UserResult]:
        """AlterUserScramCredentials (KIP-554): per user named, (user, error code, message)."""
        ...

    async def describe_scram_credentials(
        self, users: Sequence[str] | None
    ) -> tuple[AdminResult, Sequence[ScramUserDescription]]:
        """DescribeUserScramCredentials: the request's error (when the controller cannot be
        asked) and per user its (mechanism, iterations); every user when ``users`` is None."""
        ...

    async def create_acls(self, creations: Sequence[AclBinding]) -> Sequence[CreationResult]:
        """CreateAcls: per creation (error code, message); every creation gets the controller's
        code when it cannot be asked."""
        ...

    async def describe_acls(
        self, acl_filter: AclBindingFilter
    ) -> tuple[AdminResult, Sequence[AclBinding]]:
        """DescribeAcls: the request's error (a refused filter, no controller) and the ACLs
        the filter matches."""
        ...

    async def delete_acls(self, filters: Sequence[AclBindingFilter]) -> Sequence[DeletionResult]:
        """DeleteAcls: per filter its error or the ACLs it deleted."""
        ...

    async def alter_client_quotas(
        self, entries: Sequence[ClientQuotaEntry], validate_only: bool
    ) -> Sequence[EntityResult]:
        """AlterClientQuotas (KIP-546): per entry, its error code and message."""
        ...

    async def describe_client_quotas(
        self, components: Sequence[tuple[str, int, str | None]], strict: bool
    ) -> DescribeResult:
        """DescribeClientQuotas: the entities matching the filter, or the request's error."""
        ...
