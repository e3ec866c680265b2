"""The leader's rule for a follower whose log lost committed records (a damage cut at its
recovery): an ISR member fetching from below the HW leaves the ISR at the next tick, without
waiting ``replica.lag.time.max.ms``, and rejoins only by the normal catch-up rule."""

from __future__ import annotations

from support.partition_steps import commit_alter, follower_fetch, make_durable, make_leader, produce

from raylog.actors.replication.isr import FollowerState, lost_committed
from raylog.actors.replication.messages import UNDEFINED_OFFSET


def test_lost_committed_only_for_a_known_end_below_the_hw() -> None:
    assert lost_committed(FollowerState(log_end_offset=4), 5)
    assert not lost_committed(FollowerState(log_end_offset=5), 5)
    assert not lost_committed(FollowerState(log_end_offset=UNDEFINED_OFFSET), 5)


def test_an_isr_member_fetching_below_the_hw_leaves_the_isr_at_once_and_rejoins_caught_up() -> None:
    leader = make_leader(replica_lag_time_max_ms=30_000)
    for i in range(5):
        produce(leader, i, acks=1)
    make_durable(leader)
    for f in (1, 2):
        follower_fetch(leader, f, 5, 10)
    assert leader.high_watermark == 5
    leader.tick(20)
    assert leader.ready().alter_partition == []
    # Follower 2 restarted and its recovery cut committed records: it fetches from 3 < HW 5,
    # well within the lag time.
    follower_fetch(leader, 2, 3, 30)
    leader.tick(40)
    ready = leader.ready()
    assert [p.new_isr for p in ready.alter_partition] == [(0, 1)]
    commit_alter(leader, ready, 40)
    assert leader.isr == (0, 1)
    follower_fetch(leader, 2, 4, 50)  # still below the HW: stays out
    leader.tick(60)
    assert leader.ready().alter_partition == []
    ready = follower_fetch(leader, 2, 5, 70)  # fetched back up to the HW: the normal rule
    assert [p.new_isr for p in ready.alter_partition] == [(0, 1, 2)]
