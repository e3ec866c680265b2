"""What every request handler is given and may raise: the request's context, and its helpers.

This module owns the contract between the server and the handlers (``handlers/<api>.py``): a
handler is ``async def handle(context, request)`` returning the response message, or None when
the request gets no response (Produce acks=0); :class:`RequestContext` is what it may use besides
the request; :class:`CloseConnection` is the one exception a handler raises on purpose.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from raylog.gateway.authentication import Authenticator, ClientSession
from raylog.gateway.backend import Backend
from raylog.gateway.groups.coordinator import GroupCoordinator
from raylog.gateway.protocol import Request

__all__ = ["CloseConnection", "Handler", "RequestContext", "per_partition"]

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
    """What a handler may use besides the request: the backend, the advertised table, and
    the connection: its listener and its authentication session."""

    backend: Backend
    api_versions: Mapping[int, tuple[int, int]]
    peer: str  # "host:port" of the client, for log lines
    groups: GroupCoordinator | None = None  # None: group APIs answer COORDINATOR_NOT_AVAILABLE
    # The listener the client came in on: Metadata and FindCoordinator answer with its
    # addresses ("" answers with each broker's first listener).
    listener: str = ""
    session: ClientSession | None = None  # None: no authentication (unit tests of handlers)
    authenticator: Authenticator | None = None  # None: the gateway has no SASL listener


Handler = Callable[[RequestContext, Request], Awaitable[Any | None]]


async def per_partition(
    topics: Iterable[Any], call: Callable[[str, Any], Awaitable[_R]]
) -> list[tuple[Any, list[tuple[Any, _R]]]]:
    """Run ``call(topic name, partition)`` for every partition of a request's ``topics`` (each
    with ``name`` and ``partitions``) concurrently: each partition answered by its own leader.
    Returns ``(topic, [(partition, result), ...])`` in the request's order."""
    topics = list(topics)
    results = iter(await asyncio.gather(*(call(t.name, p) for t in topics for p in t.partitions)))
    return [(t, [(p, next(results)) for p in t.partitions]) for t in topics]
