"""Leader election and ISR decisions of the controller, as pure functions.

This module owns every decision about who leads a partition and which ISR the controller accepts:
clean, unclean and preferred elections, what happens to a broker's partitions when it is fenced,
shuts down on purpose or comes back, the auto leader rebalance, and the validation of a leader's
AlterPartition. Each function takes the :class:`~raylog.actors.control.metadata.ClusterMetadata`
(plus inputs such as log end offsets) and returns an :class:`Outcome`: the new metadata, the
partition changes it holds and any per-partition errors. Nothing here reads a clock or does I/O; the
controller actor writes the outcome with compare-and-swap and then tells the replicas.

The rules (Kafka's, KRaft flavour):

- *Eligible* broker: registered, i.e. neither fenced nor in controlled shutdown. Only eligible
  brokers lead or join an ISR; an observer never does, nor does an *offline* replica (its log
  failed: a full disk, an I/O error; its broker reports it, see :func:`set_offline_replicas`).
- *Clean election*: the first replica in assignment order that is in the ISR, eligible and not
  an observer. A sitting leader that is still eligible and in the ISR is kept.
- *Unclean election* (only when the topic's ``unclean.leader.election.enable`` is true, or an
  ElectLeaders UNCLEAN request asks for it): when no ISR member is eligible, the eligible
  non-observer replica with the longest log (log end offsets are an input; ties go to assignment
  order) leads, and the ISR becomes just that replica. Records the old ISR had committed beyond
  its log are lost; the change is marked ``unclean`` so the caller counts it in a metric.
- *Offline*: otherwise the leader becomes -1 and the ISR keeps its last member, so that when that
  broker returns it is elected cleanly and nothing committed is lost.
- Removing a broker from an ISR never empties it (see the last rule).

Caveat carried over from Kafka (before KIP-966): a broker that restarts is trusted to have every
record it acknowledged. raylog's default ``flush.messages=1`` (fsync before acknowledging) makes
that true; a topic that raises it accepts the same risk Kafka does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from raylog.actors.control import config_keys
from raylog.actors.control import metadata as md_
from raylog.actors.control.listeners import Endpoint
from raylog.actors.control.metadata import (
    NO_LEADER,
    ClusterMetadata,
    PartitionChange,
    PartitionState,
    TopicPartition,
)
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader, BecomeObserver
from raylog.storage.errors import (
    BrokerIdNotRegisteredError,
    DuplicateBrokerRegistrationError,
    ElectionNotNeededError,
    EligibleLeadersNotAvailableError,
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidRequestError,
    InvalidUpdateVersionError,
    NotControllerError,
    PreferredLeaderNotAvailableError,
    RaylogError,
    StaleBrokerEpochError,
    UnknownTopicOrPartitionError,
)

# Log end offsets reported by replicas: partition -> broker id -> log end offset. Only unclean
# elections read them; a replica missing from the map counts as having an empty log.
LogEndOffsets = Mapping[TopicPartition, Mapping[int, int]]

ElectionType = Literal["preferred", "unclean"]


@dataclass(frozen=True)
class Outcome:
    """What a decision produced: the metadata to write and what changed in it.

    ``metadata`` is the input object itself when nothing changed. ``errors`` holds per-partition
    refusals of an ElectLeaders request (each a RaylogError carrying Kafka's code).
    """

    metadata: ClusterMetadata
    changes: list[PartitionChange] = field(default_factory=list)
    errors: dict[TopicPartition, RaylogError] = field(default_factory=dict)

    @property
    def unclean_elections(self) -> int:
        """How many leaders were elected outside the ISR (for the metric)."""
        return sum(1 for c in self.changes if c.unclean)

    @property
    def offline(self) -> list[TopicPartition]:
        """Partitions this decision left without a leader."""
        return [c.topic_partition for c in self.changes if c.leader == NO_LEADER]


# --- the partition-level rules ------------------------------------------------------------------


def clean_leader(p: PartitionState, eligible: Iterable[int]) -> int:
    """The first replica in assignment order that is in the ISR, eligible, not an observer and
    not offline; NO_LEADER if there is none."""
    ok = set(eligible) - set(p.offline_replicas)
    for b in p.replicas:
        if b in p.isr and b in ok and b not in p.observers:
            return b
    return NO_LEADER


def unclean_leader(p: PartitionState, eligible: Iterable[int], leos: Mapping[int, int]) -> int:
    """The eligible non-observer replica with the longest log (ties: assignment order), offline
    replicas left out; NO_LEADER if there is none."""
    ok = set(eligible) - set(p.offline_replicas)
    best, best_leo = NO_LEADER, -1
    for b in p.replicas:
        if b in ok and b not in p.observers and leos.get(b, 0) > best_leo:
            best, best_leo = b, leos.get(b, 0)
    return best


def decide_partition(
    tp: TopicPartition,
    p: PartitionState,
    eligible: Iterable[int],
    *,
    unclean_allowed: bool,
    leos: Mapping[int, int] | None = None,
    remove_from_isr: int | None = None,
) -> PartitionChange:
    """Leader and ISR for one partition after ``remove_from_isr`` (if any) leaves the ISR.

    Steps, in order:
    1. the ISR without ``remove_from_isr``, unless that would empty it (then it is kept);
    2. the sitting leader stays if it is eligible, not offline and still in that ISR;
    3. else a clean election over that ISR;
    4. else, if allowed, an unclean election; its ISR is the new leader alone;
    5. else no leader.
    """
    ok = set(eligible) - set(p.offline_replicas)
    isr = p.isr
    if remove_from_isr is not None and remove_from_isr in isr and len(isr) > 1:
        isr = tuple(b for b in isr if b != remove_from_isr)
    if p.leader != NO_LEADER and p.leader in isr and p.leader in ok:
        return PartitionChange(topic=tp.topic, partition=tp.partition, leader=p.leader, isr=isr)
    trial = PartitionState(
        partition=p.partition,
        replicas=p.replicas,
        isr=isr,
        observers=p.observers,
        offline_replicas=p.offline_replicas,
    )
    leader = clean_leader(trial, ok)
    if leader != NO_LEADER:
        return PartitionChange(topic=tp.topic, partition=tp.partition, leader=leader, isr=isr)
    if unclean_allowed:
        leader = unclean_leader(p, ok, leos or {})
        if leader != NO_LEADER:
            return PartitionChange(
                topic=tp.topic, partition=tp.partition, leader=leader, isr=(leader,), unclean=True
            )
    return PartitionChange(topic=tp.topic, partition=tp.partition, leader=NO_LEADER, isr=isr)


def _eligible(md: ClusterMetadata) -> set[int]:
    return {b for b, reg in md.brokers.items() if reg.state == "registered"}


def _unclean_enabled(md: ClusterMetadata, topic: str) -> bool:
    return config_keys.effective(md.topics[topic].configs).unclean_leader_election_enable


def _effective_changes(
    md: ClusterMetadata, changes: list[PartitionChange]
) -> list[PartitionChange]:
    # Keep only changes that change something, so Outcome.changes lists real changes.
    out = []
    for c in changes:
        p = md.topics[c.topic].partitions[c.partition]
        leader = p.leader if c.leader is None else c.leader
        isr = p.isr if c.isr is None else c.isr
        offline = p.offline_replicas if c.offline_replicas is None else c.offline_replicas
        if (leader, isr, set(offline)) != (p.leader, p.isr, set(p.offline_replicas)):
            out.append(c)
    return out


def _apply(md: ClusterMetadata, changes: list[PartitionChange]) -> Outcome:
    real = _effective_changes(md, changes)
    return Outcome(md_.apply_election(md, real), real)


# --- broker lifecycle -------------------------------------------------------------------------


def fence_broker(
    md: ClusterMetadata, broker_id: int, log_end_offsets: LogEndOffsets | None = None
) -> Outcome:
    """A broker's session expired or Ray confirmed its death: fence it.

    Kafka KRaft: the fenced broker leaves every ISR it is in (unless it is the last member), and
    every partition it led is re-elected among the remaining eligible ISR members — or, when the
    topic allows it and none is left, uncleanly — or goes offline.
    """
    if broker_id not in md.brokers:
        raise BrokerIdNotRegisteredError(f"Broker {broker_id} is not registered")
    md = md_.set_broker_state(md, broker_id, "fenced")
    return _remove_broker(md, broker_id, log_end_offsets or {}, allow_unclean=True)


def controlled_shutdown(md: ClusterMetadata, broker_id: int) -> Outcome:
    """A broker asks to shut down: move its leaderships away before it stops.

    Kafka KRaft semantics: the broker enters controlled shutdown (no longer eligible), leaves
    every ISR where another member remains, and each partition it led gets the next eligible ISR
    member in assignment order. A partition whose ISR is only this broker goes offline (leader
    -1, ISR kept) — Kafka does the same rather than hold the shutdown back — and is listed in
    ``Outcome.offline``; it comes back when the broker does. Unlike a fenced broker's partitions,
    these are never elected uncleanly: the broker leaving holds every committed record and is
    expected back, so giving them up would lose data for nothing.

    Removing followers from ISRs may take an ISR below ``min.insync.replicas``; acks=all produce
    then fails with NOT_ENOUGH_REPLICAS until the broker returns, as in Kafka.
    """
    if broker_id not in md.brokers:
        raise BrokerIdNotRegisteredError(f"Broker {broker_id} is not registered")
    md = md_.set_broker_state(md, broker_id, "controlled_shutdown")
    return _remove_broker(md, broker_id, {}, allow_unclean=False)


def _remove_broker(
    md: ClusterMetadata, broker_id: int, leos: LogEndOffsets, *, allow_unclean: bool
) -> Outcome:
    ok = _eligible(md)
    changes = []
    for tp, p in md_.partitions(md):
        if broker_id not in p.isr and p.leader != broker_id:
            continue
        changes.append(
            decide_partition(
                tp,
                p,
                ok,
                unclean_allowed=allow_unclean and _unclean_enabled(md, tp.topic),
                leos=leos.get(tp, {}),
                remove_from_isr=broker_id,
            )
        )
    return _apply(md, changes)


def unfence_broker(
    md: ClusterMetadata, broker_id: int, log_end_offsets: LogEndOffsets | None = None
) -> Outcome:
    """A fenced broker heartbeats again with the same incarnation: make it eligible again.

    Offline partitions it holds are then elected (it is often their last ISR member). It does not
    rejoin other ISRs here: its leaders add it by AlterPartition once it has caught up.
    """
    if broker_id not in md.brokers:
        raise BrokerIdNotRegisteredError(f"Broker {broker_id} is not registered")
    md = md_.set_broker_state(md, broker_id, "registered")
    return _elect_offline(md, log_end_offsets or {}, holding=broker_id)


def register_broker(
    md: ClusterMetadata,
    broker_id: int,
    incarnation_id: str,
    rack: str | None,
    host: str,
    port: int,
    *,
    old_session_live: bool,
    log_end_offsets: LogEndOffsets | None = None,
    endpoints: tuple[Endpoint, ...] = (),
) -> Outcome:
    """BrokerRegistration, with what a new incarnation of a known broker implies.

    ``old_session_live`` is the controller's judgement (by its monotonic clock) of the session of
    the registration on record. Kafka's rules: the same incarnation again is a retry; a new one
    while the old is registered with a live session is refused (DUPLICATE_BROKER_REGISTRATION,
    two processes claim one id); otherwise the old incarnation is fenced first — the new process
    holds none of its in-memory state — then the new one is recorded, its replicas count as
    online again (it re-creates them from their logs) and the offline partitions it holds are
    elected.
    """
    old = md.brokers.get(broker_id)
    if old is not None and old.incarnation_id == incarnation_id:
        return Outcome(md)
    changes: list[PartitionChange] = []
    draining = old is not None and old.draining  # a decommission outlives a restart
    if old is not None:
        # A broker that finished a controlled shutdown is expected back: only a registered
        # (serving) incarnation with a live session makes the new one a duplicate.
        if old_session_live and old.state == "registered":
            raise DuplicateBrokerRegistrationError(
                f"Broker {broker_id} is already registered by incarnation {old.incarnation_id} "
                f"whose session is live"
            )
        if old.state != "fenced":
            fenced = fence_broker(md, broker_id, log_end_offsets)
            md, changes = fenced.metadata, fenced.changes
    md = md_.register_broker(md, broker_id, incarnation_id, rack, host, port, endpoints, draining)
    # The new process re-creates every replica from its log: none is offline any more.
    online = set_offline_replicas(md, broker_id, (), log_end_offsets)
    elected = _elect_offline(online.metadata, log_end_offsets or {}, holding=broker_id)
    return Outcome(elected.metadata, changes + online.changes + elected.changes)


def _elect_offline(md: ClusterMetadata, leos: LogEndOffsets, holding: int | None) -> Outcome:
    ok = _eligible(md)
    changes = []
    for tp, p in md_.partitions(md):
        if p.leader != NO_LEADER or (holding is not None and holding not in p.replicas):
            continue
        changes.append(
            decide_partition(
                tp, p, ok, unclean_allowed=_unclean_enabled(md, tp.topic), leos=leos.get(tp, {})
            )
        )
    return _apply(md, changes)


def elect_offline(md: ClusterMetadata, log_end_offsets: LogEndOffsets | None = None) -> Outcome:
    """Reconcile: try every leaderless partition again under its topic's own unclean setting
    (after a broker returns, or after unclean.leader.election.enable is switched on)."""
    return _elect_offline(md, log_end_offsets or {}, holding=None)


# --- offline replicas (a failed log) --------------------------------------------------------


def offline_report_differs(
    md: ClusterMetadata, broker_id: int, offline: Set[TopicPartition]
) -> bool:
    """Whether :func:`set_offline_replicas` with this report would change anything (one pass,
    stopping at the first difference; partitions the broker does not host do not count)."""
    for tp, p in md_.partitions(md):
        if broker_id in p.replicas and (broker_id in p.offline_replicas) != (tp in offline):
            return True
    return False


class OfflineReportCheck:
    """:func:`offline_report_differs` for a controller's heartbeats, remembering per broker
    the last report found in line with the metadata, and the metadata's version then.

    Every heartbeat carries a broker's whole report, nearly always the same one, and the
    metadata changes far less often than brokers beat: the same report against the same
    ``metadata_epoch`` is answered without a pass over the partitions. A version is one
    content (the metadata never changes without bumping it), so the answer stays right.
    """

    def __init__(self) -> None:
        self._in_line: dict[int, tuple[int, frozenset[TopicPartition]]] = {}

    def differs(self, md: ClusterMetadata, broker_id: int, offline: Set[TopicPartition]) -> bool:
        key = (md.metadata_epoch, frozenset(offline))
        if self._in_line.get(broker_id) == key:
            return False
        if offline_report_differs(md, broker_id, offline):
            return True
        self._in_line[broker_id] = key
        return False


def set_offline_replicas(
    md: ClusterMetadata,
    broker_id: int,
    offline: Iterable[TopicPartition],
    log_end_offsets: LogEndOffsets | None = None,
) -> Outcome:
    """A broker's report of which of its replicas have a failed log (every heartbeat carries
    the whole set, as KRaft's BrokerHeartbeat carries a broker's offline log directories).

    A replica newly reported offline is handled as its broker's fencing is, for that partition
    alone: it leaves the ISR unless it is the last member, and if it led, the partition is
    re-elected among the remaining eligible ISR members, uncleanly where the topic allows it,
    or goes offline. A replica no longer reported (its broker re-created it from its log) is
    eligible again: a leaderless partition it holds is elected; it rejoins other ISRs by the
    leader's AlterPartition once it has caught up. Partitions the broker does not host are
    ignored (a report can cross a reassignment).
    """
    wanted = set(offline)
    ok = _eligible(md)
    leos = log_end_offsets or {}
    changes = []
    for tp, p in md_.partitions(md):
        if broker_id not in p.replicas:
            continue
        was, now = broker_id in p.offline_replicas, tp in wanted
        if was == now:
            continue
        marked = tuple(
            b for b in p.replicas if (now if b == broker_id else b in p.offline_replicas)
        )
        trial = msgspec.structs.replace(p, offline_replicas=marked)
        if now or trial.leader == NO_LEADER:
            decided = decide_partition(
                tp,
                trial,
                ok,
                unclean_allowed=_unclean_enabled(md, tp.topic),
                leos=leos.get(tp, {}),
                remove_from_isr=broker_id if now else None,
            )
            changes.append(msgspec.structs.replace(decided, offline_replicas=marked))
        else:
            changes.append(
                PartitionChange(topic=tp.topic, partition=tp.partition, offline_replicas=marked)
            )
    return _apply(md, changes)


# --- ElectLeaders and the auto leader rebalance -----------------------------------------------


def elect_leaders(
    md: ClusterMetadata,
    election_type: ElectionType,
    partitions: Iterable[TopicPartition] | None = None,
    log_end_offsets: LogEndOffsets | None = None,
) -> Outcome:
    """Kafka's ElectLeaders: ``partitions`` (all when None) with per-partition errors.

    - preferred: move leadership to the preferred replica (``replicas[0]``) when it is eligible,
      in the ISR and not an observer; ELECTION_NOT_NEEDED if it already leads,
      PREFERRED_LEADER_NOT_AVAILABLE otherwise.
    - unclean: elect a leader for a leaderless partition, uncleanly if no ISR member is eligible
      whatever the topic's config says (the operator asked); ELECTION_NOT_NEEDED if it has a
      leader, ELIGIBLE_LEADERS_NOT_AVAILABLE if no replica is alive.
    """
    ok = _eligible(md)
    leos = log_end_offsets or {}
    wanted = [tp for tp, _ in md_.partitions(md)] if partitions is None else list(partitions)
    changes: list[PartitionChange] = []
    errors: dict[TopicPartition, RaylogError] = {}
    for tp in wanted:
        try:
            p = md_.get_partition(md, tp.topic, tp.partition)
        except UnknownTopicOrPartitionError as e:
            errors[tp] = e
            continue
        if election_type == "preferred":
            pref = p.preferred_leader
            if p.leader == pref:
                errors[tp] = ElectionNotNeededError(f"{tp.topic}-{tp.partition} is led by {pref}")
            elif _preferred_can_lead(p, ok):
                changes.append(PartitionChange(topic=tp.topic, partition=tp.partition, leader=pref))
            else:
                errors[tp] = PreferredLeaderNotAvailableError(
                    f"{tp.topic}-{tp.partition}: preferred replica {pref} is not alive and in "
                    f"the ISR {list(p.isr)}"
                )
        else:
            if p.leader != NO_LEADER:
                errors[tp] = ElectionNotNeededError(
                    f"{tp.topic}-{tp.partition} is led by {p.leader}"
                )
                continue
            c = decide_partition(tp, p, ok, unclean_allowed=True, leos=leos.get(tp, {}))
            if c.leader == NO_LEADER:
                errors[tp] = EligibleLeadersNotAvailableError(
                    f"{tp.topic}-{tp.partition}: none of replicas {list(p.replicas)} is alive"
                )
            else:
                changes.append(c)
    out = _apply(md, changes)
    return Outcome(out.metadata, out.changes, errors)


def leader_imbalance(md: ClusterMetadata) -> dict[int, float]:
    """Per broker: the share of partitions it is preferred leader of that it does not lead.

    Kafka's ratio: (preferred here, led elsewhere or not at all) / (preferred here). Brokers that
    are preferred leader of nothing are left out.
    """
    preferred: dict[int, int] = {}
    not_led: dict[int, int] = {}
    for _, p in md_.partitions(md):
        b = p.preferred_leader
        preferred[b] = preferred.get(b, 0) + 1
        if p.leader != b:
            not_led[b] = not_led.get(b, 0) + 1
    return {b: not_led.get(b, 0) / n for b, n in sorted(preferred.items())}


def auto_leader_rebalance(md: ClusterMetadata, imbalance_percentage: int) -> Outcome:
    """The periodic check of ``auto.leader.rebalance.enable``.

    For each eligible broker whose imbalance ratio exceeds
    ``leader.imbalance.per.broker.percentage`` / 100, run preferred elections for the partitions
    it should lead where it can (eligible, in the ISR). Partitions where the preferred replica
    cannot lead are left alone rather than reported: the next check tries again.
    """
    ok = _eligible(md)
    over = {
        b
        for b, ratio in leader_imbalance(md).items()
        if b in ok and ratio > imbalance_percentage / 100
    }
    changes = [
        PartitionChange(topic=tp.topic, partition=tp.partition, leader=p.preferred_leader)
        for tp, p in md_.partitions(md)
        if p.preferred_leader in over
        and p.leader != p.preferred_leader
        and _preferred_can_lead(p, ok)
    ]
    return _apply(md, changes)


class PreferredLeaders(msgspec.Struct, frozen=True):
    """The partitions not led by their preferred replica that it can come to lead, from one
    metadata version: ``electable`` now (its broker registered, in the ISR), or ``catching_up``
    (its broker registered, not in the ISR yet: it rejoins once it has caught up). A partition
    whose preferred replica's broker is not registered, whose log failed there, or which is an
    observer is in neither."""

    electable: list[TopicPartition]
    catching_up: list[TopicPartition]


def preferred_leaders(md: ClusterMetadata) -> PreferredLeaders:
    """Where a preferred election is due or will be (see :class:`PreferredLeaders`)."""
    ok = _eligible(md)
    electable: list[TopicPartition] = []
    catching_up: list[TopicPartition] = []
    for tp, p in md_.partitions(md):
        pref = p.preferred_leader
        if p.leader == pref or pref not in ok:
            continue
        if _preferred_can_lead(p, ok):
            electable.append(tp)
        elif pref not in p.observers and pref not in p.offline_replicas:
            catching_up.append(tp)
    return PreferredLeaders(electable, catching_up)


def _preferred_can_lead(p: PartitionState, eligible: set[int]) -> bool:
    """The preferred replica may take leadership now: its broker is eligible, it is in the ISR,
    not an observer, and its log has not failed."""
    pref = p.preferred_leader
    return (
        pref in eligible
        and pref in p.isr
        and pref not in p.observers
        and pref not in p.offline_replicas
    )


# --- what each replica is told ----------------------------------------------------------------


def role_command(
    p: PartitionState, broker_id: int, controller_epoch: int, mirror_link: str = ""
) -> BecomeLeader | BecomeFollower | BecomeObserver:
    """The command that makes ``broker_id``'s replica of ``p`` what the metadata says it is
    (``broker_id`` must be one of ``p.replicas``); the controller sends it with its epoch.
    ``mirror_link``: the active cluster link the partition's topic mirrors ("" for none),
    which only the leader is told."""
    if p.leader == broker_id:
        return BecomeLeader(
            controller_epoch=controller_epoch,
            leader_epoch=p.leader_epoch,
            partition_epoch=p.partition_epoch,
            isr=p.isr,
            replicas=tuple(b for b in p.replicas if b not in p.observers),
            observers=p.observers,
            mirror_link=mirror_link,
        )
    if broker_id in p.observers:
        return BecomeObserver(controller_epoch, p.leader, p.leader_epoch, p.partition_epoch)
    return BecomeFollower(controller_epoch, p.leader, p.leader_epoch, p.partition_epoch)


# --- AlterPartition ---------------------------------------------------------------------------


def validate_alter_partition(
    md: ClusterMetadata,
    broker_id: int,
    broker_epoch: int,
    tp: TopicPartition,
    leader_epoch: int,
    partition_epoch: int,
    new_isr: Sequence[int],
) -> None:
    """Check a leader's proposed ISR; raise the Kafka error that refuses it.

    Checks in order (the first failing one answers):
    1. the partition exists (UNKNOWN_TOPIC_OR_PARTITION) and the broker is registered with this
       ``broker_epoch`` (BROKER_ID_NOT_REGISTERED / STALE_BROKER_EPOCH: an old incarnation);
    2. epochs above the metadata's mean this controller is behind (NOT_CONTROLLER);
    3. ``leader_epoch`` below the current one: a deposed leader (FENCED_LEADER_EPOCH);
    4. the sender must be the current leader (INVALID_REQUEST);
    5. ``partition_epoch`` must equal the current one, else the leader proposed from a stale ISR
       (INVALID_UPDATE_VERSION);
    6. the ISR has no duplicates, only replicas of the partition, and the leader
       (INVALID_REQUEST);
    7. every member is eligible, not an observer and not offline (INELIGIBLE_REPLICA).

    Shrinking the ISR below ``min.insync.replicas`` is allowed, as in Kafka: acks=all produce
    requests then fail with NOT_ENOUGH_REPLICAS.
    """
    name = f"{tp.topic}-{tp.partition}"
    p = md_.get_partition(md, tp.topic, tp.partition)
    reg = md.brokers.get(broker_id)
    if reg is None:
        raise BrokerIdNotRegisteredError(f"Broker {broker_id} is not registered")
    if broker_epoch != reg.broker_epoch:
        raise StaleBrokerEpochError(
            f"Broker {broker_id} sent broker epoch {broker_epoch}, registered {reg.broker_epoch}"
        )
    if leader_epoch > p.leader_epoch or partition_epoch > p.partition_epoch:
        raise NotControllerError(
            f"{name}: request epochs (leader {leader_epoch}, partition {partition_epoch}) are "
            f"ahead of this controller's ({p.leader_epoch}, {p.partition_epoch})"
        )
    if leader_epoch < p.leader_epoch:
        raise FencedLeaderEpochError(
            f"{name}: leader epoch {leader_epoch} is older than the current {p.leader_epoch}"
        )
    if broker_id != p.leader:
        raise InvalidRequestError(f"{name}: broker {broker_id} is not the leader ({p.leader})")
    if partition_epoch != p.partition_epoch:
        raise InvalidUpdateVersionError(
            f"{name}: partition epoch {partition_epoch} is not the current {p.partition_epoch}"
        )
    isr = list(new_isr)
    if len(set(isr)) != len(isr) or not set(isr) <= set(p.replicas):
        raise InvalidRequestError(
            f"{name}: proposed ISR {isr} is not a set of the replicas {list(p.replicas)}"
        )
    if p.leader not in isr:
        raise InvalidRequestError(f"{name}: proposed ISR {isr} lacks the leader {p.leader}")
    ok = _eligible(md)
    bad = [b for b in isr if b not in ok or b in p.observers or b in p.offline_replicas]
    if bad:
        raise IneligibleReplicaError(
            f"{name}: proposed ISR {isr} names brokers that are fenced, shutting down, "
            f"observers or whose replica is offline: {bad}"
        )


def alter_partition(
    md: ClusterMetadata,
    broker_id: int,
    broker_epoch: int,
    tp: TopicPartition,
    leader_epoch: int,
    partition_epoch: int,
    new_isr: Sequence[int],
    fence: bool = False,
) -> Outcome:
    """Validate then apply a leader's ISR proposal.

    Accepted with a different ISR: ``partition_epoch`` + 1 and the leader epoch unchanged (the
    leader stays). Accepted with the same ISR (a retry): nothing changes, as in Kafka, and the
    leader learns the current epochs from the answer; unless ``fence`` (a leader resumed in a
    new process), which bumps ``partition_epoch`` all the same, so that no proposal made at the
    old one (its predecessor's, still in flight) can be committed after it.
    """
    validate_alter_partition(
        md, broker_id, broker_epoch, tp, leader_epoch, partition_epoch, new_isr
    )
    p = md_.get_partition(md, tp.topic, tp.partition)
    # Kafka keeps the ISR in the order the leader sent; raylog stores it in assignment order so
    # that equal sets compare equal and a retry is recognised as one.
    isr = tuple(b for b in p.replicas if b in set(new_isr))
    if isr == p.isr and not fence:
        return Outcome(md)
    change = PartitionChange(
        topic=tp.topic, partition=tp.partition, isr=isr, bump_partition_epoch=fence
    )
    return Outcome(md_.apply_alter_partition(md, tp.topic, tp.partition, isr, fence), [change])
