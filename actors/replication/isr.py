"""The leader's tracking of its followers, the ISR and the high watermark, pure.

A leader (``partition.PartitionReplica``) keeps a ``FollowerState`` per follower and observer
(Kafka's ReplicaState) and decides with the functions here, which take the state they need
and return their verdict: when a follower is caught up, when an ISR member falls out of sync,
when a follower may join the ISR, which replicas count towards the high watermark and the low
watermark, and what those are.

Decisions:
- High watermark. The leader's HW is the minimum of the log end offsets over the *maximal* ISR
  (KIP-497: the committed ISR plus members of an in-flight expansion, also one answered
  FENCED_LEADER_EPOCH, which may have been committed before the epoch ended; an in-flight
  shrink still counts the members it would remove), where the leader contributes its *durable*
  end offset:
  raylog counts a write as replicated only once fsync'd on every such member (followers report
  only durable offsets: they fetch from their log end only after it is durable, and push acks
  carry the durable end). The HW never moves backwards.
- Below ``min.insync.replicas`` the HW is frozen (Kafka 4.x, KIP-966): while the committed ISR
  is smaller than min ISR the leader does not advance it. Reason: everything below the HW must
  then be on at least min ISR replicas, so acks=1 writes made while the ISR is shrunk do not
  become visible to consumers on a single copy, and a later election (clean or from the
  eligible-leader set) cannot lose what consumers have read.
- A follower outside the ISR that is caught up (by the rule below that keeps members in the ISR)
  holds the HW as a member would (Kafka's shouldWaitForReplicaToJoinIsr). Reason: a follower
  joins once its end reaches the HW; under a steady stream of appends a HW taken over the ISR
  alone runs ahead of it by one fetch round trip's appends, and it would never join. Held
  back, the HW waits for it and it joins within a fetch or two; if it stops fetching it stops
  being caught up after ``replica.lag.time.max.ms`` and the HW moves on without it. One the
  controller refused to add (INELIGIBLE_REPLICA: its broker shuts down or is fenced) holds
  nothing until the leader proposes it again (Kafka's isReplicaIsrEligible): a replica of a
  broker in controlled shutdown keeps fetching, and would otherwise hold every acks=all write
  until it stopped.
- ISR membership (Kafka's Replica.updateFetchStateOrThrow): a follower's ``last_caught_up_ms``
  advances to the time of a fetch whose offset reaches the leader's log end at that fetch, or
  to the time of the previous fetch if this fetch reaches the leader's log end as it was then.
  An ISR member is out of sync when its end differs from the leader's and it has not caught up
  for longer than ``replica.lag.time.max.ms``, and at once when it fetches from below the HW:
  an ISR member's end never falls below the HW (the HW is the lowest end over the ISR, and a
  follower truncates only above it), unless its log lost committed records (damage cut at its
  recovery: see storage/log/recovery.py), and a clean election must not pick it then. A
  non-ISR follower joins once its end reaches both the HW and the start offset of the current
  leader epoch, and its log start reaches the
  highest log start a DeleteRecords (or a mirror's emptied log) set while we lead, or ours when
  we became leader (raylog's rule, not Kafka's: an acknowledged DeleteRecords then holds on
  every replica a clean election can pick; a DeleteRecords acknowledged under an earlier
  leader is at or below our log start, since we were in its ISR). Log starts moved by
  retention or by a mirror following its source do not count: a follower learns ours one
  fetch later, and under a steady churn it would never join. Observers never join.
- A replica re-created from its log (its broker replaced the actor, not the machine) is told
  again to lead the epoch it led, and resumes it at its log end. Its predecessor may have
  proposed adding a follower, which the controller may commit after sending the command, and
  a leadership that wrote no batch leaves no trace in the log. So a fresh replica that leads
  an epoch its log ends with, or that is given an ISR lacking some replica, first proposes
  its ISR with ``fence`` (a new partition epoch: no older proposal can be committed after
  it), and until the answer every replica counts towards the HW and the low watermark (the
  ISR is *unconfirmed*).
- The low watermark (DeleteRecords) is the lowest log start offset over the same maximal ISR
  (Kafka's lowWatermarkIfLeader takes every live replica).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from raylog.actors.replication.messages import UNDEFINED_OFFSET, AlterPartitionRequest

NEVER = -1  # a follower outside the ISR has neither fetched nor caught up in this epoch yet


@dataclass
class FollowerState:
    """The leader's view of one follower or observer (Kafka's ReplicaState)."""

    log_end_offset: int = UNDEFINED_OFFSET  # unknown until it fetches in this epoch
    last_caught_up_ms: int = NEVER
    last_fetch_ms: int = NEVER
    last_fetch_leader_log_end_offset: int = UNDEFINED_OFFSET
    # Push mode: where the follower's log ends once every push sent so far lands; None while
    # it catches up by fetching.
    pushed_end_offset: int | None = None
    # Push mode: where the one push in flight starts (None: none in flight). Batches appended
    # meanwhile go together in the next push, sent when this one is acknowledged.
    push_in_flight_from: int | None = None
    log_start_offset: int = UNDEFINED_OFFSET  # unknown until it fetches or acks in this epoch


def reset_followers(
    replica_id: int,
    replicas: Iterable[int],
    observers: Iterable[int],
    isr: Iterable[int],
    leader_log_end_offset: int,
    now_ms: int,
) -> dict[int, FollowerState]:
    """Kafka's resetReplicaState at becoming leader: ISR members count as caught up now;
    every follower's end is unknown until it fetches in this epoch, which holds the HW until
    they all do."""
    members = set(isr)
    followers: dict[int, FollowerState] = {}
    for rid in (*replicas, *observers):
        if rid == replica_id:
            continue
        in_isr = rid in members
        followers[rid] = FollowerState(
            last_caught_up_ms=now_ms if in_isr else NEVER,
            last_fetch_ms=now_ms if in_isr else NEVER,
            last_fetch_leader_log_end_offset=leader_log_end_offset if in_isr else -1,
        )
    return followers


def record_fetch(
    state: FollowerState, end_offset: int, leader_log_end_offset: int, now_ms: int
) -> None:
    """Kafka's updateFetchStateOrThrow: the follower's log ends at ``end_offset`` now."""
    if end_offset >= leader_log_end_offset:
        state.last_caught_up_ms = max(state.last_caught_up_ms, now_ms)
    elif end_offset >= state.last_fetch_leader_log_end_offset:
        state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
    state.log_end_offset = end_offset
    state.last_fetch_leader_log_end_offset = leader_log_end_offset
    state.last_fetch_ms = now_ms


def is_in_sync(
    state: FollowerState, leader_log_end_offset: int, now_ms: int, lag_time_max_ms: int
) -> bool:
    return (
        state.log_end_offset == leader_log_end_offset
        or now_ms - state.last_caught_up_ms <= lag_time_max_ms
    )


def lost_committed(state: FollowerState, high_watermark: int) -> bool:
    """Whether the follower's log ends below the HW: it lost committed records."""
    return UNDEFINED_OFFSET != state.log_end_offset < high_watermark


def out_of_sync(
    replica_id: int,
    isr: Iterable[int],
    followers: Mapping[int, FollowerState],
    leader_log_end_offset: int,
    now_ms: int,
    lag_time_max_ms: int,
    high_watermark: int,
) -> list[int]:
    """The ISR members (other than the leader) to remove."""
    return [
        rid
        for rid in isr
        if rid != replica_id
        and (
            not is_in_sync(followers[rid], leader_log_end_offset, now_ms, lag_time_max_ms)
            or lost_committed(followers[rid], high_watermark)
        )
    ]


def may_join_isr(
    state: FollowerState,
    high_watermark: int,
    leader_epoch_start_offset: int,
    join_log_start: int,
) -> bool:
    """A follower's log reaches what an ISR member must hold: the HW, the start of the current
    leader epoch, and ``join_log_start`` (it adopts our log start from the answer to the fetch
    that got it here, and reports it in the next one: at most one more round)."""
    return (
        state.log_end_offset >= high_watermark
        and state.log_end_offset >= leader_epoch_start_offset
        and state.log_start_offset >= join_log_start
    )


def maximal_isr(
    isr: tuple[int, ...],
    replicas: Iterable[int],
    alter_in_flight: AlterPartitionRequest | None,
    unconfirmed: bool,
) -> tuple[int, ...]:
    """The committed ISR plus the members an in-flight AlterPartition would add (every
    replica while the predecessor's proposals are not fenced yet)."""
    if unconfirmed:
        return tuple(sorted(set(isr) | set(replicas)))
    if alter_in_flight is None:
        return isr
    return tuple(sorted(set(isr) | set(alter_in_flight.new_isr)))


def high_watermark_holders(
    maximal: Iterable[int],
    replicas: Iterable[int],
    followers: Mapping[int, FollowerState],
    leader_log_end_offset: int,
    now_ms: int,
    lag_time_max_ms: int,
    refused_until_ms: Mapping[int, int],
) -> tuple[int, ...]:
    """The replicas whose log ends hold the HW: the maximal ISR and the followers outside it
    that are caught up and may join (observers never join; a follower whose addition the
    controller refused, its broker shutting down or fenced, not until ``refused_until_ms``)."""
    joining = [
        rid
        for rid in replicas
        if rid in followers
        and refused_until_ms.get(rid, -1) <= now_ms
        and followers[rid].last_caught_up_ms != NEVER
        and is_in_sync(followers[rid], leader_log_end_offset, now_ms, lag_time_max_ms)
    ]
    return tuple(sorted(set(maximal) | set(joining)))


def high_watermark_candidate(
    replica_id: int,
    members: Iterable[int],
    followers: Mapping[int, FollowerState],
    durable_end_offset: int,
) -> int:
    """The lowest log end over ``members`` (``high_watermark_holders``), ours counted
    durable."""
    candidate = durable_end_offset
    for rid in members:
        if rid != replica_id:
            candidate = min(candidate, followers[rid].log_end_offset)
    return candidate


def low_watermark(
    replica_id: int,
    members: Iterable[int],
    followers: Mapping[int, FollowerState],
    log_start_offset: int,
) -> int:
    """The lowest log start over ``members`` (the maximal ISR); UNDEFINED_OFFSET while a
    member's is unknown."""
    low = log_start_offset
    for rid in members:
        if rid != replica_id:
            low = min(low, followers[rid].log_start_offset)
    return low
