"""The interface the gateway's handlers call to learn and change the cluster's state.

This module owns the boundary between the Kafka protocol and raylog's actors: handlers speak
Kafka, the backend speaks raylog, and the values crossing it are plain immutable data
(NamedTuples of ints and strings), never protocol messages and never Ray handles. The real backend
(calls to the controller and replica actors) lives with the actors; tests use an in-memory one.

Methods grow with the handlers: today only what Metadata needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

__all__ = ["Backend", "Broker", "ClusterView", "PartitionState", "TopicState"]


class Broker(NamedTuple):
    """A broker as clients must reach it: its gateway's advertised address."""

    node_id: int
    host: str
    port: int
    rack: str | None


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
