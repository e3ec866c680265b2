"""Rule 3 of the Produce handler: an idempotent batch refused with a retriable error (nothing
appended) makes the producer's later batches to the same partition fail with the same error
instead of reaching the leader, until the refused batch is appended (or the hold ends).

The rule's two functions over real batch headers and the handler's results.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raylog.gateway.backend import ProduceResult
from raylog.gateway.errors import ErrorCode
from raylog.gateway.handlers import produce
from raylog.storage import batch as rb

TOPIC, PARTITION = "events", 0


def header(producer_id: int, sequence: int, epoch: int = 0) -> rb.BatchHeader:
    data = rb.build_batch(
        [rb.Record(b"k", b"v", 0)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
    )
    return rb.parse_header(data, 0)


def refused(error: int) -> ProduceResult:
    return ProduceResult(error, -1, -1, -1)


def held(h: rb.BatchHeader, partition: int = PARTITION) -> int:
    return produce._held_back(TOPIC, partition, h)


def note(h: rb.BatchHeader | None, result: ProduceResult) -> None:
    produce._note_refusal(TOPIC, PARTITION, h, result)


@pytest.fixture(autouse=True)
def empty_table() -> Iterator[None]:
    produce._refusals.clear()
    yield
    produce._refusals.clear()


def test_later_batches_of_the_producer_share_the_refusal_until_it_is_appended() -> None:
    note(header(7, 10), refused(ErrorCode.NOT_LEADER_OR_FOLLOWER))
    assert held(header(7, 11)) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert held(header(7, 10)) == ErrorCode.NONE  # the retry goes on
    assert held(header(8, 11)) == ErrorCode.NONE  # another producer
    assert held(header(7, 11), partition=1) == ErrorCode.NONE  # another partition
    note(header(7, 12), refused(ErrorCode.NOT_ENOUGH_REPLICAS))
    assert held(header(7, 11)) == ErrorCode.NOT_LEADER_OR_FOLLOWER  # the first refusal stays
    note(header(7, 10), ProduceResult(0, 500, -1, 0))
    assert held(header(7, 11)) == ErrorCode.NONE
    assert len(produce._refusals) == 0


def test_a_bumped_epoch_is_not_held_back() -> None:
    note(header(7, 10), refused(ErrorCode.LEADER_NOT_AVAILABLE))
    assert held(header(7, 0, epoch=1)) == ErrorCode.NONE
    assert len(produce._refusals) == 0


def test_only_retriable_refusals_of_idempotent_batches_with_nothing_appended_count() -> None:
    note(header(7, 10), refused(ErrorCode.CORRUPT_MESSAGE))
    note(header(-1, -1), refused(ErrorCode.NOT_LEADER_OR_FOLLOWER))
    note(None, refused(ErrorCode.NOT_LEADER_OR_FOLLOWER))
    note(header(7, 10), ProduceResult(ErrorCode.REQUEST_TIMED_OUT, 40, -1, 0))  # appended
    assert len(produce._refusals) == 0
