"""What every request handler is given and may raise: the request's context, and its helpers.

This module owns the contract between the server and the handlers (``handlers/<api>.py``): a
handler is ``async def handle(context, request)`` returning the response message, or None when
the request gets no response (Produce acks=0); :class:`RequestContext` is what it may use besides
the request; :class:`CloseConnection` is the one exception a handler raises on purpose.

Authorization is asked through the context (:meth:`RequestContext.authorized` and its
companions), never of the authorizer directly: they answer True for everything when the gateway
has no authorizer, and take the principal and host from the connection's session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from raylog.actors.control.acls import CLUSTER_NAME, AclOperation, Authorizer, ResourceType
from raylog.gateway.authentication import ANONYMOUS, Authenticator, ClientSession
from raylog.gateway.authorization import Authorization
from raylog.gateway.backend import Backend
from raylog.gateway.groups.coordinator import GroupCoordinator
from raylog.gateway.protocol import Request
from raylog.gateway.quotas import ClientQuotas
from raylog.gateway.transactions.coordinator import TransactionCoordinator

__all__ = [
    "AUTHORIZATION_FAILED",
    "CloseConnection",
    "Handler",
    "RequestContext",
    "per_partition",
]

AUTHORIZATION_FAILED = (
    "Authorization failed."  # Kafka's message with the *_AUTHORIZATION_FAILED codes
)

_R = TypeVar("_R")


class CloseConnection(Exception):
    """Raised by a handler to close the client's connection instead of answering.

    Kafka does this for a Produce with acks=0 that failed (docs/PROTOCOL.md, section 3): the
    client gets no response to learn the error from, so the broker closes the connection and
    the client's next send fails and refreshes metadata. The server logs one line and closes
    that connection only; it is not counted as a rejected (misbehaving) connection.
    """


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a handler may use besides the request: the backend, the advertised table, the
    connection (its listener and its authentication session) and the broker's client quotas."""

    backend: Backend
    api_versions: Mapping[int, tuple[int, int]]
    peer: str  # "host:port" of the client, for log lines
    groups: GroupCoordinator | None = None  # None: group APIs answer COORDINATOR_NOT_AVAILABLE
    # None: transactional APIs answer COORDINATOR_NOT_AVAILABLE.
    transactions: TransactionCoordinator | None = None
    # The listener the client came in on: Metadata and FindCoordinator answer with its
    # addresses ("" answers with each broker's first listener).
    listener: str = ""
    session: ClientSession | None = None  # None: no authentication (unit tests of handlers)
    authenticator: Authenticator | None = None  # None: the gateway has no SASL listener
    authorization: Authorization | None = None  # None: authorization off
    quotas: ClientQuotas | None = None  # None: no client quotas are enforced

    @property
    def principal(self) -> str:
        """Kafka's principal of the client (``User:ANONYMOUS`` without a session)."""
        return self.session.principal if self.session is not None else ANONYMOUS

    @property
    def client_host(self) -> str:
        """The client's IP address, as ACLs name hosts."""
        if self.session is not None:
            return self.session.peer_host
        return self.peer.rsplit(":", 1)[0]

    @property
    def authorizer(self) -> Authorizer | None:
        """The gateway's current authorizer; None when authorization is off."""
        return self.authorization.authorizer if self.authorization is not None else None

    def authorized(self, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        """Whether the client may do ``operation`` on the resource (True when off)."""
        authorizer = self.authorizer
        if authorizer is None:
            return True
        return authorizer.authorize(
            self.principal, self.client_host, operation, resource_type, name
        )

    def authorized_cluster(self, operation: AclOperation) -> bool:
        return self.authorized(operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def authorized_by_resource_type(
        self, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        """Whether the client may do ``operation`` on some resource of the type (True when
        off)."""
        authorizer = self.authorizer
        if authorizer is None:
            return True
        return authorizer.authorize_by_resource_type(
            self.principal, self.client_host, operation, resource_type
        )

    def authorized_group(self, operation: AclOperation, group_id: str) -> bool:
        return self.authorized(operation, ResourceType.GROUP, group_id)

    def authorized_create_topic(self, name: str) -> bool:
        """CREATE on the cluster or on the topic (Kafka's rule for creating a topic)."""
        return self.authorized_cluster(AclOperation.CREATE) or self.authorized(
            AclOperation.CREATE, ResourceType.TOPIC, name
        )

    def denied_topics(self, operation: AclOperation, names: Iterable[str]) -> set[str]:
        """The topics among ``names`` the client may not do ``operation`` on."""
        if self.authorizer is None:
            return set()
        return {n for n in set(names) if not self.authorized(operation, ResourceType.TOPIC, n)}

    def record_quota(self, key: str, request: Request, value: float) -> int:
        """Record ``value`` against the client's quota ``key`` (``gateway/quotas.py``): its
        (principal, client id) entity's throttle time in ms, 0 without a quota."""
        if self.quotas is None:
            return 0
        now_ms = int(time.monotonic() * 1000)
        return self.quotas.record(key, self.principal, request.header.client_id, value, now_ms)

    def unrecord_quota(self, key: str, request: Request, value: float) -> None:
        """Take back a recorded ``value`` (a throttled Fetch whose data is not sent)."""
        if self.quotas is not None:
            now_ms = int(time.monotonic() * 1000)
            self.quotas.unrecord(key, self.principal, request.header.client_id, value, now_ms)


Handler = Callable[[RequestContext, Request], Awaitable[Any | None]]


async def per_partition(
    topics: Iterable[Any],
    call: Callable[[str, Any], Awaitable[_R]],
    denied: Collection[str] = (),
    refusal: _R | None = None,
) -> list[tuple[Any, list[tuple[Any, _R]]]]:
    """Run ``call(topic name, partition)`` for every partition of a request's ``topics`` (each
    with ``name`` and ``partitions``) concurrently: each partition answered by its own leader;
    the partitions of ``denied`` topics are answered ``refusal`` without a call.
    Returns ``(topic, [(partition, result), ...])`` in the request's order."""
    topics = list(topics)

    async def one(name: str, partition: Any) -> _R:
        if name in denied:
            assert refusal is not None
            return refusal
        return await call(name, partition)

    results = iter(await asyncio.gather(*(one(t.name, p) for t in topics for p in t.partitions)))
    return [(t, [(p, next(results)) for p in t.partitions]) for t in topics]
