"""The simulator's read_committed filter (transactions.AbortedFilter) filters a fetch answer as
Kafka's consumer does: a producer's transactional batches are skipped from the first offset of
one of its listed aborted transactions up to its ABORT marker, and delivered again after it;
other producers' batches, non-transactional ones and committed transactions are delivered;
control batches never are. Checker 13 trusts it, so it is proven on its own here.
"""

from __future__ import annotations

import pytest

from raylog.actors.replication.messages import BatchMeta
from raylog.actors.replication.txn_state import CONTROL_ABORT, CONTROL_COMMIT, NOT_CONTROL

from .transactions import AbortedFilter

pytestmark = pytest.mark.sim


def batch(offset: int, pid: int = -1, control: int = NOT_CONTROL, count: int = 1) -> BatchMeta:
    return BatchMeta(offset, count, 10, 0, pid, 0, -1, pid >= 0, control, 0)


def test_an_aborted_transaction_is_skipped_up_to_its_marker() -> None:
    log = [
        batch(0, pid=7),  # committed below
        batch(1, pid=7, control=CONTROL_COMMIT),
        batch(2, pid=7, count=2),  # aborted: [2, 5]
        batch(4, pid=8),  # another producer's, committed
        batch(5, pid=7, control=CONTROL_ABORT),
        batch(6),  # not transactional
        batch(7, pid=7),  # the producer's next transaction
        batch(8, pid=8, control=CONTROL_COMMIT),
    ]
    kept = AbortedFilter(((7, 2),))
    assert [meta.base_offset for meta in log if kept.delivers(meta)] == [0, 4, 6, 7]


def test_an_answer_starting_inside_an_aborted_transaction_skips_its_rest() -> None:
    # The replica lists the transaction that began below the fetch offset (aborted_between).
    kept = AbortedFilter(((7, 2),))
    log = [batch(3, pid=7), batch(4, pid=8), batch(5, pid=7, control=CONTROL_ABORT)]
    assert [meta.base_offset for meta in log if kept.delivers(meta)] == [4]


def test_without_aborted_transactions_every_data_batch_is_delivered() -> None:
    kept = AbortedFilter(())
    log = [batch(0, pid=7), batch(1, pid=7, control=CONTROL_ABORT), batch(2), batch(3, pid=9)]
    assert [meta.base_offset for meta in log if kept.delivers(meta)] == [0, 2, 3]
