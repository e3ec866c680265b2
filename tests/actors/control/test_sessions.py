"""The controller's broker sessions (``raylog.actors.control.sessions``): when a write lease is
granted, when a session is live, which brokers expire, and what a takeover forgets.

Pure and fast. The same class runs in ``ControllerActor`` (its Ray tests cover the wiring) and
in the seeded simulator, whose checker 9 (no broker writes in an epoch it was deposed from)
depends on these rules."""

from __future__ import annotations

import pytest

from raylog.actors.control import metadata as md_
from raylog.actors.control.metadata import ClusterMetadata
from raylog.actors.control.sessions import BrokerSessions

SESSION_MS = 100


def cluster(*broker_ids: int) -> ClusterMetadata:
    md = ClusterMetadata(cluster_id="c", controller_epoch=1)
    for b in broker_ids:
        md = md_.register_broker(md, b, f"inc-{b}", None, "127.0.0.1", 9092 + b)
    return md


def test_a_lease_waits_until_the_broker_applied_the_version_that_admitted_it() -> None:
    sessions = BrokerSessions(SESSION_MS)
    sessions.start(1, "inc-1", now_ms=0, lease_from_epoch=5)
    assert not sessions.heartbeat(1, applied_epoch=4, now_ms=10, fenced=False)
    assert sessions.heartbeat(1, applied_epoch=5, now_ms=20, fenced=False)
    # A heartbeat reporting an older version (reordered) does not take the lease back...
    assert sessions.heartbeat(1, applied_epoch=3, now_ms=30, fenced=False)
    # ...but a fenced broker never gets one.
    assert not sessions.heartbeat(1, applied_epoch=9, now_ms=40, fenced=True)


def test_unfencing_moves_the_version_a_lease_waits_for() -> None:
    sessions = BrokerSessions(SESSION_MS)
    sessions.start(1, "inc-1", now_ms=0, lease_from_epoch=2)
    assert sessions.heartbeat(1, applied_epoch=2, now_ms=10, fenced=False)
    sessions.unfenced(1, metadata_epoch=7)
    assert not sessions.heartbeat(1, applied_epoch=6, now_ms=20, fenced=False)
    sessions.applied(1, 7)  # a push of version 7 answered
    assert sessions.heartbeat(1, applied_epoch=6, now_ms=30, fenced=False)


def test_a_session_is_live_for_session_ms_after_its_last_heartbeat_and_then_expires() -> None:
    md = cluster(1, 2)
    sessions = BrokerSessions(SESSION_MS)
    sessions.start(1, "inc-1", now_ms=0, lease_from_epoch=0)
    sessions.start(2, "inc-2", now_ms=0, lease_from_epoch=0)
    sessions.heartbeat(2, applied_epoch=0, now_ms=50, fenced=False)
    assert sessions.live(1, 99) and not sessions.live(1, 100)
    assert sessions.expired(md, 100) == []  # expiry is strictly after session_ms
    assert sessions.expired(md, 101) == [(1, 101)]
    assert sessions.expired(md, 151) == [(1, 151), (2, 101)]
    assert not sessions.live(3, 0)  # never seen


def test_fenced_brokers_do_not_expire_again() -> None:
    md = md_.set_broker_state(cluster(1, 2), 1, "fenced")
    sessions = BrokerSessions(SESSION_MS)
    assert sessions.expired(md, 1_000) == [(2, 1_000)]


def test_a_takeover_counts_every_session_from_itself() -> None:
    md = cluster(1, 2)
    sessions = BrokerSessions(SESSION_MS)
    sessions.start(1, "inc-1", now_ms=0, lease_from_epoch=0)
    sessions.heartbeat(1, applied_epoch=3, now_ms=900, fenced=False)
    sessions.take_over(now_ms=1_000)
    assert sessions.get(1) is None and not sessions.live(1, 1_000)
    # Neither broker has heartbeat to the new controller: both count from the takeover.
    assert sessions.expired(md, 1_100) == []
    assert sessions.expired(md, 1_101) == [(1, 101), (2, 101)]
    # Its first heartbeat there starts a session that waits for the version current then.
    sessions.start(1, "inc-1", now_ms=1_050, lease_from_epoch=8)
    assert not sessions.heartbeat(1, applied_epoch=3, now_ms=1_050, fenced=False)
    assert sessions.expired(md, 1_101) == [(2, 101)]


def test_a_session_of_another_incarnation_counts_from_the_takeover() -> None:
    """The metadata registers incarnation inc-1; a session tracked for an older one neither
    keeps it alive nor expires it early."""
    md = cluster(1)
    sessions = BrokerSessions(SESSION_MS, now_ms=500)
    sessions.start(1, "old-incarnation", now_ms=0, lease_from_epoch=0)
    assert not sessions.tracks(1, "inc-1") and sessions.tracks(1, "old-incarnation")
    assert sessions.expired(md, 600) == []
    assert sessions.expired(md, 601) == [(1, 101)]


def test_fencing_waits_for_a_second_check_confirm_ms_later() -> None:
    """After a pause of the controller every session looks expired at the first check; the
    heartbeats queued during the pause arrive before the confirming check and clear it."""
    md = cluster(1, 2)
    sessions = BrokerSessions(SESSION_MS)
    for b in (1, 2):
        sessions.start(b, f"inc-{b}", now_ms=0, lease_from_epoch=0)
    assert sessions.due_for_fencing(md, 500, confirm_ms=25) == []  # both suspected
    sessions.heartbeat(1, applied_epoch=0, now_ms=505, fenced=False)  # queued during the pause
    assert sessions.due_for_fencing(md, 510, confirm_ms=25) == []  # 2: only 10 ms suspected
    assert sessions.due_for_fencing(md, 525, confirm_ms=25) == [(2, 525)]
    md = cluster(1)  # broker 2 was fenced (here: it left the metadata)
    # Broker 1 heartbeat; it expires again later and is suspected afresh, not from 500.
    assert sessions.due_for_fencing(md, 606, confirm_ms=25) == []
    assert sessions.due_for_fencing(md, 630, confirm_ms=25) == []
    assert sessions.due_for_fencing(md, 631, confirm_ms=25) == [(1, 126)]


def test_a_takeover_forgets_suspicions() -> None:
    md = cluster(1)
    sessions = BrokerSessions(SESSION_MS)
    sessions.start(1, "inc-1", now_ms=0, lease_from_epoch=0)
    assert sessions.due_for_fencing(md, 200, confirm_ms=25) == []
    sessions.take_over(now_ms=210)
    assert sessions.due_for_fencing(md, 311, confirm_ms=25) == []  # suspected from 311
    assert sessions.due_for_fencing(md, 336, confirm_ms=25) == [(1, 126)]


def test_all_applied_needs_every_broker_tracked_and_at_the_version() -> None:
    sessions = BrokerSessions(SESSION_MS)
    sessions.start(1, "inc-1", now_ms=0, lease_from_epoch=0)
    sessions.start(2, "inc-2", now_ms=0, lease_from_epoch=0)
    sessions.applied(1, 4)
    sessions.heartbeat(2, applied_epoch=5, now_ms=1, fenced=False)
    assert sessions.all_applied([1, 2], 4)
    assert not sessions.all_applied([1, 2], 5)
    assert not sessions.all_applied([1, 2, 3], 0)  # broker 3 is not tracked
    sessions.applied(3, 9)  # an answer from a broker with no session changes nothing
    assert sessions.get(3) is None


def test_misuse_is_refused() -> None:
    with pytest.raises(ValueError, match="session_ms"):
        BrokerSessions(0)
    sessions = BrokerSessions(SESSION_MS)
    with pytest.raises(KeyError, match="broker 4"):
        sessions.heartbeat(4, applied_epoch=0, now_ms=0, fenced=False)
    with pytest.raises(KeyError, match="broker 4"):
        sessions.unfenced(4, 1)
