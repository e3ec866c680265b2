"""Request handlers, one module per Kafka API, and the registry the server dispatches on.

To add an API: write ``handlers/<api>.py`` with ``API_KEY`` and ``async def handle(context,
request)`` returning the response message (a kafka-python spec-built response object for
``request.response_version``) or None when the request gets no response (Produce acks=0); then add
the module to ``_MODULES`` below. Its versions come from ``apis.TARGET_VERSIONS`` and it is
advertised from then on. Handlers raise only for bugs: expected failures become error codes in
the response, because an exception escaping a handler closes the client's connection. The one
deliberate exception is :class:`CloseConnection`, for the cases where Kafka answers by closing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from raylog.gateway import apis
from raylog.gateway.backend import Backend
from raylog.gateway.protocol import Request

if TYPE_CHECKING:
    from raylog.gateway.groups.coordinator import GroupCoordinator

__all__ = [
    "HANDLERS",
    "CloseConnection",
    "Handler",
    "RequestContext",
    "advertised_versions",
    "per_partition",
]

_R = TypeVar("_R")


class CloseConnection(Exception):
    """Raised by a handler to close the client's connection instead of answering.

    Kafka does this for a Produce with acks=0 that failed (KAFKA_PROTOCOL.md section 4): the
    client gets no response to learn the error from, so the broker closes the connection and
    the client's next send fails and refreshes metadata. The server logs one line and closes
    that connection only; it is not counted as a rejected (misbehaving) connection.
    """


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a handler may use besides the request: the backend and the advertised table."""

    backend: Backend
    api_versions: Mapping[int, tuple[int, int]]
    peer: str  # "host:port" of the client, for log lines
    groups: GroupCoordinator | None = None  # None: group APIs answer COORDINATOR_NOT_AVAILABLE


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


def _load() -> Mapping[int, Handler]:
    # Imported here, not at module top, so that each handler module can import this package's
    # RequestContext without a cycle.
    from raylog.gateway.handlers import (
        alter_configs,
        api_versions,
        create_topics,
        delete_topics,
        describe_configs,
        fetch,
        incremental_alter_configs,
        list_offsets,
        metadata,
        produce,
    )

    modules: tuple[ModuleType, ...] = (api_versions, metadata, produce, fetch, list_offsets)
    modules += (
        create_topics,
        delete_topics,
        describe_configs,
        alter_configs,
        incremental_alter_configs,
    )
    from raylog.gateway.handlers import create_partitions, delete_records, elect_leaders

    modules += (create_partitions, elect_leaders, delete_records)
    from raylog.gateway.handlers import (
        find_coordinator,
        heartbeat,
        join_group,
        leave_group,
        offset_commit,
        offset_fetch,
        sync_group,
    )

    modules += (find_coordinator, join_group, sync_group, heartbeat, leave_group)
    modules += (offset_commit, offset_fetch)
    from raylog.gateway.handlers import delete_groups, describe_groups, list_groups, offset_delete

    modules += (list_groups, describe_groups, delete_groups, offset_delete)
    from raylog.gateway.handlers import init_producer_id

    modules += (init_producer_id,)
    table: dict[int, Handler] = {}
    for module in modules:
        if module.API_KEY in table:
            raise RuntimeError(f"two handler modules for API {module.API_KEY}")
        table[module.API_KEY] = module.handle
    return MappingProxyType(table)


HANDLERS: Mapping[int, Handler] = _load()


def advertised_versions(
    handlers: Mapping[int, Handler] = HANDLERS,
) -> Mapping[int, tuple[int, int]]:
    """The ApiVersions table for a gateway serving ``handlers``."""
    return apis.advertised_versions(handlers.keys())
