"""Producer ids for InitProducerId: blocks from the controller, handed out one by one.

This module owns a gateway's supply of idempotent producer ids. The controller allocates ids in
blocks (``ControllerActor.allocate_producer_ids``: the next free id lives in the cluster
metadata and moves past a block with a compare-and-swap write before the block is handed out,
so no id is ever handed out twice, across controller failovers included). Each gateway keeps
one block and asks for the next when it is used up, as Kafka's brokers do with
AllocateProducerIds (KIP-730). Ids of a block left unused when a gateway stops are skipped, never
reused. Every new producer id starts at epoch 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import NamedTuple, Protocol, runtime_checkable

from raylog.gateway.backend import Backend

__all__ = ["IdempotenceBackend", "ProducerIdBlocks", "ProducerIdResult"]

Allocate = Callable[[], Awaitable[tuple[int, int]]]  # -> (first id, count)


class ProducerIdResult(NamedTuple):
    """InitProducerId's answer: a fresh producer id at epoch 0, or an error code."""

    error_code: int
    producer_id: int = -1
    producer_epoch: int = -1
    message: str = ""


@runtime_checkable
class IdempotenceBackend(Backend, Protocol):
    """A :class:`Backend` that hands out producer ids (InitProducerId without transactions)."""

    async def init_producer_id(self) -> ProducerIdResult:
        """A new producer id at epoch 0; errors as codes, never raised; bounded."""
        ...


class ProducerIdBlocks:
    """One gateway's current block of producer ids; asks ``allocate`` for the next when empty.

    Invariant: ``_next <= _end``; ids in [_next, _end) are this gateway's and not yet handed
    out. Callers queue on one lock, so one allocation serves everyone waiting for it.
    """

    def __init__(self, allocate: Allocate) -> None:
        self._allocate = allocate
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def next_id(self) -> int:
        """The next unused producer id; raises whatever ``allocate`` raises."""
        async with self._lock:
            if self._next >= self._end:
                first, count = await self._allocate()
                if first < 0 or count < 1:
                    raise ValueError(f"bad producer id block: first {first}, count {count}")
                self._next, self._end = first, first + count
            producer_id = self._next
            self._next += 1
            return producer_id
