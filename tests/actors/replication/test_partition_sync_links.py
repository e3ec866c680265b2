"""Unit tests of synchronous cluster links on the source leader (KIP-986 sync mode), in the pure
replication state machine (actors/replication/sync_links.py, sync_link_side.py).

A leader (replica 0, alone in its ISR unless said otherwise, so its HW is its durable end) is
given sync links by BecomeLeader or SyncLinksChanged and reports from their destinations
(SyncLinkProgress). The claims: an acks=all write is acknowledged once the HW AND every in-sync
link's reported end cover it, never on the HW alone; acks 0/1 never wait; a report's end never
moves back (late, repeated and reordered reports change nothing wrong) and unknown, re-created,
out-of-range reports are refused with a reason; a link not caught up with the HW (Kafka's
rule, against the HW) for link.sync.lag.time.max.ms leaves the in-sync set and releases what it
held, and rejoins when its end reaches the HW; a new leader starts every link in sync with no
end (holding every write), a link added within a leadership starts out of sync; set changes
apply by version and leader epoch only; timeouts and idempotent retries keep their rules; the
per-link state for ``links describe``.
"""

from __future__ import annotations

import pytest
from support.partition_steps import (
    EPOCH,
    commit_alter,
    follower_fetch,
    make_durable,
    produce,
    results,
)

from raylog.actors.replication.isr import NEVER
from raylog.actors.replication.messages import (
    BecomeFollower,
    BecomeLeader,
    ProduceRequest,
    SyncLinkProgress,
    SyncLinkRef,
    SyncLinksChanged,
)
from raylog.actors.replication.partition import (
    InvariantViolation,
    PartitionReplica,
    Ready,
    ReplicaConfig,
    SyncLinkStatus,
)
from raylog.storage.errors import (
    InvalidRequestError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
)

EAST = SyncLinkRef("east", "e" * 32)
WEST = SyncLinkRef("west", "w" * 32)
LAG_MS = 1_000


def lead(
    links: tuple[SyncLinkRef, ...] = (EAST,),
    isr: tuple[int, ...] = (0,),
    replicas: tuple[int, ...] = (0,),
    now_ms: int = 0,
    version: int = 5,
) -> PartitionReplica:
    replica = PartitionReplica(0, ReplicaConfig(link_sync_lag_time_max_ms=LAG_MS))
    replica.step(BecomeLeader(1, EPOCH, 0, isr, replicas, (), "", links, version), now_ms)
    ready = replica.ready()
    if ready.alter_partition:
        commit_alter(replica, ready, now_ms)
    return replica


def report(
    replica: PartitionReplica, end: int, now_ms: int, link: SyncLinkRef = EAST
) -> tuple[tuple[int, str] | None, Ready]:
    """A destination's report: (why it is refused or None, the Ready it produced)."""
    msg = SyncLinkProgress(link.name, link.link_id, end)
    error = replica.sync_link_progress_error(msg)
    replica.step(msg, now_ms)
    return error, replica.ready()


def write(replica: PartitionReplica, request_id: int, acks: int = -1, now_ms: int = 0) -> Ready:
    """A write, made durable here (the HW covers it in an ISR of one)."""
    ready = produce(replica, request_id, acks, now_ms)
    durable = make_durable(replica, now_ms)
    ready.produce_results += durable.produce_results
    return ready


def state(replica: PartitionReplica, name: str = "east") -> SyncLinkStatus:
    return {s.link: s for s in replica.sync_links_status()}[name]


# --- acks ----------------------------------------------------------------------------------------


def test_acks_all_waits_for_the_hw_and_every_in_sync_link() -> None:
    leader = lead(links=(EAST, WEST))
    assert write(leader, 1).produce_results == []
    assert leader.high_watermark == 1  # the HW does not wait for links: they read below it
    assert results(report(leader, 1, 10)[1]) == {}  # west holds it still
    done = results(report(leader, 1, 20, WEST)[1])
    assert done[1].error_code == 0 and done[1].base_offset == 0


def test_the_hw_must_cover_a_write_whatever_the_links_report() -> None:
    leader = lead(isr=(0, 1), replicas=(0, 1))
    produce(leader, 1)
    make_durable(leader)
    assert report(leader, 1, 10)[0] is None  # the link's end reaches 1: the HW does not
    assert leader.high_watermark == 0 and leader.ready().produce_results == []
    done = results(follower_fetch(leader, 1, 1, 20))
    assert done[1].error_code == 0


def test_acks_0_and_1_never_wait_for_links() -> None:
    leader = lead()
    assert results(write(leader, 1, acks=1))[1].error_code == 0
    assert results(write(leader, 2, acks=0))[2].error_code == 0


def test_a_retried_idempotent_batch_is_answered_under_the_same_rule() -> None:
    leader = lead()
    first = ProduceRequest(1, -1, 30_000, 2, 10, b"x", 7, 0, 0)
    leader.step(first, 0)
    make_durable(leader)
    leader.step(ProduceRequest(2, -1, 30_000, 2, 10, b"x", 7, 0, 0), 5)  # the same batch again
    assert leader.ready().produce_results == [] and leader.log_end_offset == 2
    done = results(report(leader, 2, 10)[1])
    assert done.keys() == {1, 2} and done[2].base_offset == 0


def test_acks_all_held_by_a_link_times_out_as_without_links() -> None:
    leader = lead()
    produce(leader, 1, timeout_ms=100)
    make_durable(leader)
    leader.tick(99)
    assert leader.ready().produce_results == []
    leader.tick(100)
    assert results(leader.ready())[1].error_code == RequestTimedOutError.error_code


# --- progress ------------------------------------------------------------------------------------


def test_a_reported_end_never_moves_back() -> None:
    leader = lead()
    for i in range(1, 4):
        write(leader, i)
    report(leader, 3, 10)
    assert state(leader).durable_end_offset == 3
    assert report(leader, 1, 20) == (None, Ready())  # late: taken, changes nothing
    assert state(leader).durable_end_offset == 3
    write(leader, 4, now_ms=30)
    assert report(leader, 3, 40)[1].produce_results == []  # a repeat holds write 4 still


def test_refused_reports_change_nothing_and_say_why() -> None:
    leader = lead()
    write(leader, 1)
    for link, end, says in [
        (SyncLinkRef("north", "n" * 32), 1, "no sync link 'north'"),
        (SyncLinkRef("east", "f" * 32), 1, "the report is of ffff"),  # a deleted namesake's
        (EAST, 2, "outside this log [0, 1]"),
        (EAST, -1, "outside this log"),
    ]:
        error, ready = report(leader, end, 10, link)
        assert error is not None and error[0] == InvalidRequestError.error_code
        assert says in error[1] and ready.produce_results == []
    assert state(leader).durable_end_offset == -1


def test_a_replica_that_does_not_lead_refuses_reports() -> None:
    leader = lead()
    leader.step(BecomeFollower(1, 1, EPOCH + 1, 1), 5)
    assert leader.sync_links_status() == ()
    error, _ = report(leader, 0, 10)
    assert error == (NotLeaderOrFollowerError.error_code, "not the leader")


# --- in sync, out of sync ----------------------------------------------------------------------


def test_a_link_that_lags_leaves_the_in_sync_set_and_releases_what_it_held() -> None:
    leader = lead()
    produce(leader, 1, timeout_ms=10_000)
    make_durable(leader)
    leader.tick(LAG_MS)  # caught up at 0 (becoming leader): not yet over the lag time
    assert leader.ready().produce_results == [] and state(leader).in_sync
    leader.tick(LAG_MS + 1)
    done = results(leader.ready())
    assert done[1].error_code == 0 and not state(leader).in_sync
    assert results(write(leader, 2, now_ms=LAG_MS + 2))[2].error_code == 0  # holds nothing


def test_a_link_whose_end_reaches_the_hw_stays_in_sync_without_reports() -> None:
    leader = lead()
    write(leader, 1)
    report(leader, 1, 10)
    leader.tick(10 * LAG_MS)
    assert state(leader).in_sync


def test_caught_up_time_follows_kafkas_previous_fetch_rule_against_the_hw() -> None:
    leader = lead()
    for i in range(1, 6):
        write(leader, i)
    report(leader, 2, 100)  # below the HW (5) as it was at becoming leader (0): caught up at 0
    assert state(leader).last_caught_up_ms == 0
    for i in range(6, 9):
        write(leader, i, now_ms=150)
    report(leader, 5, 200)  # reaches the HW of the previous report (5): caught up as of 100
    assert state(leader).last_caught_up_ms == 100
    leader.tick(100 + LAG_MS)
    assert state(leader).in_sync
    leader.tick(101 + LAG_MS)
    assert not state(leader).in_sync
    report(leader, 8, 300 + LAG_MS)  # the HW (8): caught up now, back in sync
    assert state(leader).in_sync and state(leader).last_caught_up_ms == 300 + LAG_MS


def test_a_link_rejoins_when_its_end_reaches_the_hw_and_then_holds_again() -> None:
    leader = lead()
    leader.tick(LAG_MS + 1)
    assert not state(leader).in_sync
    write(leader, 1, now_ms=LAG_MS + 2)
    write(leader, 2, now_ms=LAG_MS + 3)
    report(leader, 1, LAG_MS + 4)
    assert not state(leader).in_sync  # below the HW (2)
    report(leader, 2, LAG_MS + 5)
    assert state(leader).in_sync
    assert write(leader, 3, now_ms=LAG_MS + 6).produce_results == []
    assert results(report(leader, 3, LAG_MS + 7)[1])[3].error_code == 0


# --- leaders and the set of links ---------------------------------------------------------------


def test_a_new_leader_starts_every_link_in_sync_with_no_end() -> None:
    leader = lead()
    write(leader, 1)
    report(leader, 1, 10)
    leader.step(BecomeFollower(1, 1, EPOCH + 1, 1), 20)
    leader.step(BecomeLeader(1, EPOCH + 2, 2, (0,), (0,), (), "", (EAST,), 5), 30)
    leader.ready()
    status = state(leader)
    assert status.in_sync and status.durable_end_offset == -1 and status.last_caught_up_ms == 30
    assert write(leader, 2, now_ms=40).produce_results == []  # held until the link reports
    assert results(report(leader, 2, 50)[1])[2].error_code == 0


def test_a_link_added_within_a_leadership_starts_out_of_sync() -> None:
    leader = lead(links=())
    write(leader, 1)
    leader.step(SyncLinksChanged(1, EPOCH, 6, (EAST,)), 10)
    assert not state(leader).in_sync and state(leader).durable_end_offset == -1
    assert results(write(leader, 2, now_ms=20))[2].error_code == 0  # it holds nothing yet
    report(leader, 2, 30)
    assert state(leader).in_sync


def test_a_link_that_leaves_the_set_releases_what_it_held() -> None:
    leader = lead(links=(EAST, WEST))
    write(leader, 1)
    report(leader, 1, 5, WEST)
    leader.step(SyncLinksChanged(1, EPOCH, 6, (WEST,)), 10)
    assert results(leader.ready())[1].error_code == 0
    assert [s.link for s in leader.sync_links_status()] == ["west"]


def test_set_changes_apply_by_version_and_leader_epoch_only() -> None:
    leader = lead(links=(EAST,), version=5)
    for stale in (
        SyncLinksChanged(1, EPOCH, 5, ()),  # not newer
        SyncLinksChanged(1, EPOCH, 4, ()),
        SyncLinksChanged(1, EPOCH + 1, 9, ()),  # another leadership's
    ):
        leader.step(stale, 10)
        assert [s.link for s in leader.sync_links_status()] == ["east"]
    # The controller's resend of BecomeLeader in the same epoch carries a newer set: applied.
    leader.step(BecomeLeader(1, EPOCH, 0, (0,), (0,), (), "", (WEST,), 7), 20)
    assert [s.link for s in leader.sync_links_status()] == ["west"]
    leader.step(SyncLinksChanged(1, EPOCH, 6, (EAST,)), 30)  # older than 7
    assert [s.link for s in leader.sync_links_status()] == ["west"]


def test_a_re_created_link_is_another_link() -> None:
    leader = lead()
    write(leader, 1)
    report(leader, 1, 5)
    again = SyncLinkRef("east", "a" * 32)
    leader.step(SyncLinksChanged(1, EPOCH, 6, (again,)), 10)
    status = state(leader)
    assert status.link_id == "a" * 32 and not status.in_sync and status.durable_end_offset == -1
    error, _ = report(leader, 1, 20)  # its predecessor's late report
    assert error is not None and "the report is of eeee" in error[1]


def test_a_malformed_set_is_the_controllers_bug() -> None:
    replica = PartitionReplica(0)
    with pytest.raises(InvariantViolation, match="named twice"):
        replica.step(BecomeLeader(1, EPOCH, 0, (0,), (0,), (), "", (EAST, EAST), 1), 0)


def test_status_shows_each_link_for_links_describe() -> None:
    leader = lead(links=(EAST, WEST))
    write(leader, 1)
    write(leader, 2)
    report(leader, 1, 10)
    assert state(leader) == SyncLinkStatus("east", EAST.link_id, True, 1, 2, 1, 0, 1)
    assert state(leader, "west") == SyncLinkStatus("west", WEST.link_id, True, -1, 2, -1, 0, 2)
    assert leader.sync_links["east"].progress.last_caught_up_ms != NEVER
