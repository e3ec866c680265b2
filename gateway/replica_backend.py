"""The gateway's backend over raylog's actors: what one broker's handlers call.

:class:`ReplicaBackend` is the :class:`~raylog.gateway.backend.DataBackend` and
:class:`~raylog.gateway.backend.AdminBackend` a gateway actor serves with. It composes:

- ``gateway/routing.py``: which replica a partition's request goes to, or the error the client
  gets instead (pure, from the gateway's metadata view);
- ``gateway/replicas.py`` (over ``gateway/replica_calls.py``): the data calls to this broker's
  replica actors, by channel, shared memory or Ray, and their outcomes in Kafka's terms;
- ``gateway/admin.py``: admin requests and producer ids, forwarded to the active controller
  (this class's base, :class:`~raylog.gateway.admin.ControllerAdmin`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.gateway import routing
from raylog.gateway.admin import ControllerAdmin, ControllerLocator
from raylog.gateway.backend import (
    ClusterView,
    DeleteRecordsResult,
    FetchResult,
    ListOffsetsResult,
    PartitionFetch,
    ProduceResult,
    TopicState,
)
from raylog.gateway.errors import ErrorCode
from raylog.gateway.replica_calls import ReplicaCalls
from raylog.gateway.replicas import CALL_MARGIN_MS, ReplicaClient
from raylog.gateway.routing import MetadataSource
from raylog.storage.pki import LeafCertificate

__all__ = ["ReplicaBackend"]


class ReplicaBackend(ControllerAdmin):
    """Data requests routed to this broker's replica actors; admin requests to the controller."""

    def __init__(
        self,
        metadata: MetadataSource,
        *,
        namespace: str = NAMESPACE,
        call_margin_ms: int = CALL_MARGIN_MS,
        controller: ControllerLocator | None = None,
        broker_configs: Mapping[str, str] | None = None,
        use_channels: bool = True,
    ) -> None:
        super().__init__(metadata, controller, broker_configs)
        calls = ReplicaCalls(namespace=namespace, use_channels=use_channels)
        self.replicas = ReplicaClient(calls, call_margin_ms=call_margin_ms)
        # The shared memory the server receives large produce requests into (None: off).
        self.arenas = calls.arenas
        self.read_stats = self.replicas.read_stats  # how fetches were read (short-circuit)

    async def aclose(self) -> None:
        """Close the channels to the replicas (the gateway stops)."""
        await self.replicas.aclose()

    def set_channel_tls(self, leaf: LeafCertificate) -> None:
        """Use mutual TLS with ``leaf`` on the channels to the replicas."""
        self.replicas.calls.set_channel_tls(leaf)

    # --- metadata -------------------------------------------------------------------------------

    async def cluster(self) -> ClusterView:
        return self.metadata.cluster()

    async def topics(self, names: Sequence[str] | None) -> Mapping[str, TopicState]:
        topics = self.metadata.topics()
        if names is None:
            return dict(topics)
        return {name: topics[name] for name in names if name in topics}

    # --- the data path --------------------------------------------------------------------------

    def _local_replica(self, topic: str, partition: int) -> str:
        return replica_actor_name(topic, partition, self.metadata.this_broker_id)

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
        error = routing.leader_error(self.metadata, topic, partition)
        if error:
            return ProduceResult(error, -1, -1, -1)
        name = self._local_replica(topic, partition)
        return await self.replicas.produce(name, records, acks, timeout_ms, on_sent, verify_txn)

    async def fetch(self, topic: str, partition: int, read: PartitionFetch) -> FetchResult:
        error = routing.leader_error(self.metadata, topic, partition)
        if error == ErrorCode.NOT_LEADER_OR_FOLLOWER and read.rack_id is not None:
            error = routing.replica_error(self.metadata, topic, partition)  # a follower serves
        if error:
            return FetchResult(error, -1, -1, -1, b"")
        name = self._local_replica(topic, partition)
        if read.rack_id:
            preferred = await self._preferred_read_replica(topic, partition, name, read)
            if preferred is not None:
                return preferred
        return await self.replicas.fetch(name, read)

    async def _preferred_read_replica(
        self, topic: str, partition: int, name: str, read: PartitionFetch
    ) -> FetchResult | None:
        """The answer naming a replica in the client's rack (routing's rule 4), or None to
        serve the fetch here."""
        assert read.rack_id is not None
        candidates = routing.rack_candidates(self.metadata, topic, partition, read.rack_id)
        if not candidates:
            return None
        replica = await self.replicas.state(name)
        if replica is None:
            return None  # serve from the leader: the read reports what is wrong, if anything
        chosen = routing.preferred_read_replica(
            candidates,
            role=replica.role,
            isr=replica.isr,
            high_watermark=replica.high_watermark,
            fetch_offset=read.fetch_offset,
        )
        if chosen is None:
            return None
        # Kafka's answer: the leader's offsets, no records, and where to fetch from instead.
        return FetchResult(
            ErrorCode.NONE,
            replica.high_watermark,
            replica.last_stable_offset,
            replica.log_start_offset,
            b"",
            chosen,
        )

    async def list_offsets(
        self,
        topic: str,
        partition: int,
        timestamp: int,
        isolation_level: int,
        current_leader_epoch: int,
    ) -> ListOffsetsResult:
        error = routing.leader_error(self.metadata, topic, partition)
        if error:
            return ListOffsetsResult(error, -1, -1)
        name = self._local_replica(topic, partition)
        return await self.replicas.list_offsets(
            name, timestamp, current_leader_epoch, isolation_level
        )

    async def delete_records(
        self, topic: str, partition: int, offset: int, timeout_ms: int
    ) -> DeleteRecordsResult:
        error = routing.leader_error(self.metadata, topic, partition)
        if error:
            return DeleteRecordsResult(error, -1)
        name = self._local_replica(topic, partition)
        return await self.replicas.delete_records(name, offset, timeout_ms)

    async def write_txn_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        timeout_ms: int,
    ) -> ProduceResult:
        """Write a transaction marker through the partition's leader, whichever broker it is on
        (the transaction coordinator's channel to every partition of a transaction)."""
        error, leader = routing.partition_leader(self.metadata, topic, partition)
        if error:
            return ProduceResult(error, -1, -1, -1)
        name = replica_actor_name(topic, partition, leader)
        return await self.replicas.write_txn_marker(
            name, producer_id, producer_epoch, coordinator_epoch, commit, timeout_ms
        )
