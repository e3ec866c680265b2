"""Checkers 18 and 19 of the link scenario (links.py), proven on their own: a source that
retains nothing above the mirror's end is caught up with once the mirror's log holds nothing on
every replica (the leader never starts its log over above its HW); and a transaction that began
below the log start may show, in a rebuild, a first batch that itself straddles the log start.
"""

from __future__ import annotations

import pytest

from .links import mirror_behind, same_txns

pytestmark = pytest.mark.sim


def test_the_mirror_ends_where_the_source_does() -> None:
    assert mirror_behind(10, 50, 0, {0: (20, 50), 1: (20, 50)}) == ""
    assert "ends at 40" in mirror_behind(10, 50, 0, {0: (20, 40), 1: (20, 40)})
    # The source retains batches above the mirror's end: it must catch up.
    assert "ends at 37" in mirror_behind(211, 215, 0, {0: (37, 37), 1: (37, 37)})


def test_a_source_retaining_nothing_past_the_mirror_leaves_its_log_empty() -> None:
    # Seed 1114196697: the source's log start is its end (211), above the mirror's end (37).
    assert mirror_behind(211, 211, 1, {0: (37, 37), 1: (37, 37), 2: (37, 37)}) == ""
    assert "replicas [2]" in mirror_behind(211, 211, 1, {0: (37, 37), 1: (37, 37), 2: (30, 37)})


def test_a_first_batch_straddling_the_log_start_is_a_rebuild_of_an_older_first_offset() -> None:
    # Seed 462539222: the transaction began at 28; the log start (40) lies inside its batch at
    # 38, which is all a rebuild sees of it.
    live = ({}, [(4001, 28, 65)], 172)
    rebuilt = ({}, [(4001, 38, 65)], 172)
    assert same_txns(live, rebuilt, 40)
    assert not same_txns(rebuilt, live, 40)  # the live state never knows less
    assert not same_txns(({}, [(4001, 41, 65)], 172), rebuilt, 40)  # at or above: exact
    assert same_txns(({4001: 28}, [], 40), ({4001: 38}, [], 40), 40)
