"""An in-memory AdminBackend over a real ClusterMetadata, and a request round trip through the
real Connection and handlers: the input of the gateway's admin handler tests.

``AdminMemory`` keeps a real ``ClusterMetadata`` (three brokers, racks a, b, c) and changes it
with the same pure functions the controller runs (``metadata``, ``placement``, ``election``,
``acls``, ``client_quotas``, ``config_keys``): it is the gateway's input, not a stand-in for the
handlers under test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raylog.actors.control import acls, client_quotas, election
from raylog.actors.control import metadata as md_
from raylog.gateway import codec
from raylog.gateway.actor import client_view
from raylog.gateway.backend import (
    AdminResult,
    ClientQuotaEntry,
    DescribeResult,
    EntityResult,
    NewTopic,
    ScramUpsertion,
    ScramUserDescription,
    TopicConfigsResult,
    TopicState,
    UserResult,
)
from raylog.gateway.handlers import HANDLERS, RequestContext, advertised_versions
from raylog.gateway.protocol import Connection, Request
from raylog.gateway.quotas import ClientQuotas
from raylog.storage.errors import RaylogError
from support.gateway import InMemoryBackend

__all__ = ["AdminMemory", "answer", "roundtrip", "three_brokers"]


@dataclass
class AdminMemory(InMemoryBackend):
    """An in-memory AdminBackend over a real ClusterMetadata with brokers 1-3 in racks a-c."""

    broker_overrides: dict[str, str] = field(default_factory=dict)
    md: md_.ClusterMetadata = field(default_factory=lambda: three_brokers())
    quotas: ClientQuotas | None = None  # a gateway's, which takes the client quotas altered

    async def topics(self, names: Sequence[str] | None) -> Mapping[str, TopicState]:
        _, states = client_view(self.md)
        return states if names is None else {n: states[n] for n in names if n in states}

    async def broker_configs(self) -> tuple[int, Mapping[str, str]]:
        return 1, self.broker_overrides

    async def create_topic(
        self, topic: NewTopic, validate_only: bool, timeout_ms: int
    ) -> AdminResult:
        def change(md: md_.ClusterMetadata) -> md_.ClusterMetadata:
            name, partitions, rf = topic.name, topic.num_partitions, topic.replication_factor
            return md_.new_topic(
                md, name, f"id-{name}", partitions, rf, topic.configs, topic.assignment
            )

        return self._apply(change, validate_only)

    async def delete_topic(self, name: str, timeout_ms: int) -> AdminResult:
        return self._apply(lambda md: md_.delete_topic(md, name), False)

    async def topic_configs(self, name: str) -> TopicConfigsResult:
        try:
            return TopicConfigsResult(0, md_.get_topic(self.md, name).configs)
        except RaylogError as exc:
            return TopicConfigsResult(exc.error_code, {}, str(exc))

    async def alter_topic_configs(
        self, name: str, overrides: Mapping[str, str], validate_only: bool
    ) -> AdminResult:
        return self._apply(lambda md: md_.alter_configs(md, name, overrides), validate_only)

    async def create_partitions(
        self, name: str, total_count: int, validate_only: bool, timeout_ms: int
    ) -> AdminResult:
        return self._apply(lambda md: md_.new_partitions(md, name, total_count), validate_only)

    async def elect_leaders(
        self, election_type: str, partitions: Sequence[tuple[str, int]] | None
    ) -> Mapping[tuple[str, int], AdminResult]:
        wanted = None if partitions is None else [md_.TopicPartition(t, p) for t, p in partitions]
        out = election.elect_leaders(self.md, election_type, wanted)
        self.md = out.metadata
        results = {(c.topic, c.partition): AdminResult(0) for c in out.changes}
        for tp, error in out.errors.items():
            results[(tp.topic, tp.partition)] = AdminResult(error.error_code, str(error))
        return results

    async def alter_scram_credentials(
        self, upsertions: Sequence[ScramUpsertion], deletions: Sequence[tuple[str, str]]
    ) -> Sequence[UserResult]:
        ups = [md_.ScramUpsertion(*u) for u in upsertions]
        self.md, results = md_.alter_scram_credentials(
            self.md, ups, [md_.ScramDeletion(*d) for d in deletions]
        )
        return results

    async def describe_scram_credentials(
        self, users: Sequence[str] | None
    ) -> tuple[AdminResult, Sequence[ScramUserDescription]]:
        return AdminResult(0), md_.describe_scram_credentials(self.md, users)

    async def create_acls(self, creations: Sequence[acls.AclBinding]) -> Sequence[tuple[int, str]]:
        self.md, results = md_.create_acls(self.md, creations)
        return results

    async def describe_acls(
        self, acl_filter: acls.AclBindingFilter
    ) -> tuple[AdminResult, Sequence[acls.AclBinding]]:
        try:
            return AdminResult(0), acls.describe_acls(self.md.acls, acl_filter)
        except RaylogError as exc:
            return AdminResult(exc.error_code, str(exc)), []

    async def delete_acls(
        self, filters: Sequence[acls.AclBindingFilter]
    ) -> Sequence[acls.DeletionResult]:
        self.md, results = md_.delete_acls(self.md, filters)
        return results

    async def alter_client_quotas(
        self, entries: Sequence[ClientQuotaEntry], validate_only: bool
    ) -> Sequence[EntityResult]:
        self.md, results = client_quotas.alter_client_quotas(self.md, entries, validate_only)
        if self.quotas is not None:  # as the gateway actor's metadata poll does
            self.quotas.update(((q.user, q.client_id), q.values) for q in self.md.client_quotas)
        return results

    async def describe_client_quotas(
        self, components: Sequence[tuple[str, int, str | None]], strict: bool
    ) -> DescribeResult:
        return client_quotas.describe_client_quotas(self.md, components, strict)

    def _apply(self, change: Any, validate_only: bool) -> AdminResult:
        try:
            new = change(self.md)
        except RaylogError as exc:
            return AdminResult(exc.error_code, str(exc))
        if not validate_only:
            self.md = new
        return AdminResult(0)


def three_brokers() -> md_.ClusterMetadata:
    md = md_.ClusterMetadata(cluster_id="test")
    for broker_id, rack in ((1, "a"), (2, "b"), (3, "c")):
        md = md_.register_broker(md, broker_id, f"inc-{broker_id}", rack, "127.0.0.1", 9090)
    return md


def roundtrip(backend: Any, request: Any, version: int, response_class: Any, **context: Any) -> Any:
    """:func:`answer` run in a fresh event loop."""
    return asyncio.run(answer(backend, request, version, response_class, **context))


async def answer(
    backend: Any, request: Any, version: int, response_class: Any, **context: Any
) -> Any:
    """``request`` at ``version`` through a real Connection and the registered handler, with a
    RequestContext of ``context``'s fields (e.g. ``session``, ``authorization``, ``groups``);
    the response decoded by kafka-python."""
    request.API_VERSION = version
    request.with_header(correlation_id=7, client_id="t")
    connection = Connection(advertised_versions())
    connection.receive_data(bytes(request.encode(version=version, header=True, framed=True)))
    event = connection.next_event()
    assert isinstance(event, Request)
    context_ = RequestContext(backend, advertised_versions(), "127.0.0.1:5000", **context)
    response = await HANDLERS[event.api_key](context_, event)
    data = bytes(connection.send(event, response))
    # size and correlation id, and the tagged fields of a header v1
    header = 8 if codec.response_header_version(event.api_key, version) == 0 else 9
    return response_class.decode(data[header:], version=version)
