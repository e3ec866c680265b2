"""InitProducerId (22) without Ray: the handler's rules and the gateway's producer-id blocks.

Proves: a null transactional_id gets a fresh producer id at epoch 0, ids come one by one from a
block and a new block is asked for only when the block is used up (concurrent callers share one
allocation, and no id is handed out twice); a transactional_id goes to the transaction
coordinator (with the held producer id and epoch from v3, KIP-360), COORDINATOR_NOT_AVAILABLE
(15) without one;
when no id can be had the answer is the retriable COORDINATOR_LOAD_IN_PROGRESS (14); requests
and responses go through the real sans-io connection in v0 to v4. The controller side (the
CAS-persisted next id) is tested in test_metadata.py and, live, in
tests/e2e/test_idempotent_producer_live.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse
from support.gateway import InMemoryBackend, handled

from raylog.gateway.producer_ids import ProducerIdBlocks, ProducerIdResult
from raylog.gateway.transactions.coordinator import InitProducerIdResult
from raylog.storage.errors import NotControllerError


@dataclass
class BlockAllocator:
    """Stands in for the controller's allocate_producer_ids: blocks of ``size`` from 1000."""

    size: int = 3
    next_free: int = 1000
    calls: int = 0
    fail: bool = False

    async def __call__(self) -> tuple[int, int]:
        self.calls += 1
        await asyncio.sleep(0)  # let concurrent callers queue behind this allocation
        if self.fail:
            raise NotControllerError("no active controller")
        first, self.next_free = self.next_free, self.next_free + self.size
        return first, self.size


@dataclass
class IdBackend(InMemoryBackend):
    allocator: BlockAllocator = field(default_factory=BlockAllocator)
    blocks: ProducerIdBlocks | None = None

    async def init_producer_id(self) -> ProducerIdResult:
        if self.blocks is None:
            self.blocks = ProducerIdBlocks(self.allocator)
        try:
            return ProducerIdResult(0, await self.blocks.next_id(), 0)
        except NotControllerError as exc:
            return ProducerIdResult(14, message=str(exc))


@dataclass
class RecordingCoordinator:
    """Stands in for the transaction coordinator: answers epoch + 1 of what it was given, and
    records each call's arguments."""

    calls: list[tuple[object, ...]] = field(default_factory=list)

    async def init_producer_id(self, *args: object) -> InitProducerIdResult:
        self.calls.append(args)
        epoch = args[3] if len(args) > 3 else -1
        return InitProducerIdResult(0, 77, int(epoch) + 1)  # type: ignore[call-overload]


def _ask(
    backend: object,
    version: int,
    transactional_id: str | None = None,
    held: tuple[int, int] = (-1, -1),
    transactions: RecordingCoordinator | None = None,
) -> object:
    request = InitProducerIdRequest(
        transactional_id=transactional_id,
        transaction_timeout_ms=60_000,
        producer_id=held[0],
        producer_epoch=held[1],
    )
    return handled(request, version, InitProducerIdResponse, backend, transactions)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_idempotent_producer_gets_a_fresh_id_at_epoch_zero(version: int) -> None:
    backend = IdBackend()
    # From v3 the producer may name the id it holds (KIP-360): without a transactional id
    # that changes nothing, as in Kafka.
    answers = [_ask(backend, version, held=(1000, 3) if version >= 3 else (-1, -1))]
    answers += [_ask(backend, version) for _ in range(3)]
    assert [(a.error_code, a.producer_id, a.producer_epoch) for a in answers] == [
        (0, 1000, 0),
        (0, 1001, 0),
        (0, 1002, 0),
        (0, 1003, 0),
    ]
    assert backend.allocator.calls == 2  # a second block only once the first was used up


def test_transactional_id_goes_to_the_transaction_coordinator() -> None:
    # Without one (a gateway that has none), the retriable COORDINATOR_NOT_AVAILABLE.
    answer = _ask(IdBackend(), 1, transactional_id="tx-1")
    assert (answer.error_code, answer.producer_id) == (15, -1)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_the_held_producer_id_and_epoch_reach_the_coordinator_from_v3(version: int) -> None:
    """KIP-360: from v3 the coordinator gets the producer id and epoch the client holds (it
    bumps that epoch); before v3 the request has no such fields and none are passed."""
    coordinator = RecordingCoordinator()
    answer = _ask(IdBackend(), version, "tx-1", held=(77, 4), transactions=coordinator)
    expected: tuple[object, ...] = ("tx-1", 60_000) + ((77, 4) if version >= 3 else ())
    assert coordinator.calls == [expected]
    assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (
        0,
        77,
        5 if version >= 3 else 0,
    )


def test_no_id_available_is_retriable_coordinator_load_in_progress() -> None:
    backend = IdBackend(allocator=BlockAllocator(fail=True))
    assert _ask(backend, 0).error_code == 14
    assert _ask(InMemoryBackend(), 0).error_code == 14  # a backend that hands out no ids


def test_concurrent_callers_share_one_allocation_and_never_get_the_same_id() -> None:
    allocator = BlockAllocator(size=10)
    blocks = ProducerIdBlocks(allocator)

    async def main() -> list[int]:
        return list(await asyncio.gather(*(blocks.next_id() for _ in range(25))))

    ids = asyncio.run(main())
    assert sorted(ids) == list(range(1000, 1025))
    assert allocator.calls == 3


def test_a_bad_block_is_refused() -> None:
    async def empty() -> tuple[int, int]:
        return 5, 0

    with pytest.raises(ValueError, match="bad producer id block"):
        asyncio.run(ProducerIdBlocks(empty).next_id())
