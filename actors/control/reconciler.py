"""Pure: the active controller's reconciler, which makes every broker's replicas match the metadata.

It owns, per broker, the desired state (a :class:`ReplicaSpec` per hosted replica: topic id,
configs, role command, throttle) and what the broker is known to have applied, and it decides
the pushes: which broker to send which specs in which phase, and which must wait. No Ray, no
clock, no I/O: the caller passes the metadata and the time in, carries out each :class:`Push`
(``ControllerActor`` with a Ray call, the seeded simulator over its lossy network) and reports
its :class:`Outcome`. One reconciler serves one controller epoch; a controller that becomes
active starts a new one (it cannot know what its predecessor sent).

Rules:

1. A broker is pushed when it has a live link (registered, unfenced, the registered
   incarnation, not confirmed dead), no push to it is in flight, and its desired specs differ
   from what it last applied, or ``resync_interval_ms`` passed since that push's round (the
   resync heals what the controller cannot see: a replica that died alone, a lost command).
2. A push has two phases, each one apply call with all the broker's specs: phase 1
   (``followers``) creates missing replicas, removes strays and forwards the non-leader
   commands; phase 2 (``leaders``) forwards the leader commands. The push counts as applied
   only when both phases were.
3. Step-down before lead: a broker's leader phase starts only after phase 1 (applied or not)
   of every other live broker that may still lead one of the partitions it is to lead. A
   broker may lead any partition until its first phase 1 succeeded (this controller cannot
   know what was sent before it), then only those it applied as leader or was started a push
   with a leader phase for since (that phase may start late, after a slow phase 1, when a
   newer version elects another leader). Such a broker that needs no push itself is pushed
   too (its phase 1 steps it down); one with a push in flight makes the leader phase wait for
   a later round. So two replicas never lead at once, unless the old leader could not be
   reached in phase 1; and a hung broker holds up only the partitions it may lead, until it is
   fenced or confirmed dead.
4. The reconciled metadata epoch: the newest version every unfenced broker was found to have
   applied in full (``wait_reconciled``).
5. A partition serves (``serving``, what topic creation waits for) once it has a leader and
   the leader and every other ISR member last applied in full a push carrying the role command
   they must have now: the leader accepts writes and acks=all ones complete. Each broker counts
   from its own last applied push, so partitions serve as their brokers finish, not when all do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

import msgspec

from raylog.actors.control import config_keys, election
from raylog.actors.control.metadata import NO_LEADER, ClusterMetadata, TopicPartition
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader, BecomeObserver

FOLLOWERS = "followers"  # phase 1: demotions and followers
LEADERS = "leaders"  # phase 2: leaders
UNTHROTTLED_RATE_MIN = 1 << 53  # a rate this high (the default is Long.MAX_VALUE) is no limit

RoleCommand = BecomeLeader | BecomeFollower | BecomeObserver


class ReplicaSpec(msgspec.Struct, frozen=True):
    """One replica a broker must host, and the role command it must have applied."""

    topic: str
    topic_id: str
    partition: int
    configs: dict[str, str]
    command: RoleCommand
    # Bytes/s the leader may send to the replicas a reassignment adds (0: unthrottled).
    throttle_bytes_per_sec: int = 0

    @property
    def is_leader(self) -> bool:
        return isinstance(self.command, BecomeLeader)


def throttle_bytes_per_sec(md: ClusterMetadata, static_configs: Mapping[str, str]) -> int:
    """``leader.replication.throttled.rate`` (dynamic over static); 0 when unlimited."""
    configs = {**static_configs, **md.dynamic_broker_configs}
    rate = config_keys.broker_config(configs).leader_replication_throttled_rate
    return 0 if rate >= UNTHROTTLED_RATE_MIN else rate


class TopicReadiness(msgspec.Struct, frozen=True):
    """Which partitions of a topic serve (rule 5); ``pending`` by partition, each with the
    brokers it waits for (its leader's or an ISR member's push, or no leader at all: -1).
    ``replicas``: the topic's replicas; ``replicas_started``: how many of them their brokers
    host, running (-1: not asked; the caller fills it in)."""

    topic: str
    partitions: int
    serving: tuple[int, ...]
    pending: tuple[tuple[int, tuple[int, ...]], ...]
    replicas: int = 0
    replicas_started: int = -1

    @property
    def done(self) -> bool:
        return not self.pending


class Outcome(Enum):
    """How one phase of a push ended."""

    APPLIED = "applied"  # the broker answered
    FAILED = "failed"  # an error or no answer in time
    GONE = "gone"  # the broker's death was confirmed first


@dataclass(frozen=True)
class Push:
    """One apply call to make: this phase of push ``push_id``, to this broker incarnation."""

    push_id: int
    broker_id: int
    incarnation_id: str
    phase: str  # FOLLOWERS or LEADERS
    metadata_epoch: int
    specs: list[ReplicaSpec]


@dataclass(frozen=True)
class Ended:
    """A push that ended; ``applied``: both phases applied, by the incarnation still linked."""

    push_id: int
    broker_id: int
    metadata_epoch: int
    applied: bool


@dataclass(frozen=True)
class Progress:
    """What an outcome led to: the calls to make now (leader phases it released) and the
    pushes it ended."""

    pushes: list[Push] = field(default_factory=list)
    ended: list[Ended] = field(default_factory=list)


@dataclass
class _Link:
    """What the controller knows of one incarnation of a broker (never persisted)."""

    incarnation_id: str
    gone: bool = False  # Ray confirmed this incarnation dead
    pushed: list[ReplicaSpec] | None = None  # the specs it last applied in full
    pushed_ms: int = 0  # the round of that push
    push: _BrokerPush | None = None  # in flight (one at a time)
    # The partitions whose replica here may act as leader: None (any) until a first phase 1
    # succeeded, then the leaders of what it applied, plus those of every push started since
    # with a leader phase (it may start at any time until the push ends).
    may_lead: frozenset[TopicPartition] | None = None
    followers_applied: list[ReplicaSpec] | None = None  # the specs of its last good phase 1

    def may_be_leading(self, tp: TopicPartition) -> bool:
        return self.may_lead is None or tp in self.may_lead


@dataclass
class _BrokerPush:
    """One broker's two phases. ``after``: the pushes whose phase 1 its leader phase waits
    for (None: no leader phase this round)."""

    push_id: int
    broker_id: int
    link: _Link
    specs: list[ReplicaSpec]
    metadata_epoch: int
    round_ms: int
    after: set[int] | None
    phase: str = FOLLOWERS  # the phase in flight, or LEADERS once phase 1 ended
    ok: bool = True  # every phase so far applied

    @property
    def leaders(self) -> frozenset[TopicPartition]:
        return frozenset(TopicPartition(s.topic, s.partition) for s in self.specs if s.is_leader)


class Reconciler:
    """Desired state per broker and the two push phases of one controller epoch."""

    def __init__(
        self,
        controller_epoch: int,
        resync_interval_ms: int,
        static_broker_configs: Mapping[str, str] | None = None,
    ) -> None:
        self.controller_epoch = controller_epoch
        self.resync_interval_ms = resync_interval_ms
        self._static_configs = dict(static_broker_configs or {})
        self._links: dict[int, _Link] = {}
        self._pushes: dict[int, _BrokerPush] = {}  # in flight, by push id
        self._next_push_id = 1
        self.reconciled_epoch = -1
        # The metadata version ``desired`` last answered for, its throttle, and its answers.
        self._desired_of: tuple[ClusterMetadata, int, dict[int, list[ReplicaSpec]]] | None = None

    # --- links ------------------------------------------------------------------------------

    def attach(self, broker_id: int, incarnation_id: str) -> None:
        """Start tracking this incarnation (it registered, or heartbeat to this controller for
        the first time); a push to the one it replaces ends without effect."""
        self._links[broker_id] = _Link(incarnation_id)

    def forget_pushed(self, broker_id: int, incarnation_id: str) -> None:
        """The broker was fenced or unfenced: push it everything again."""
        link = self._link_of(broker_id, incarnation_id)
        if link is not None:
            link.pushed = None

    def gone(self, broker_id: int, incarnation_id: str) -> None:
        """Ray confirmed this incarnation dead: it is pushed nothing more and waited for by no
        leader phase (the caller fails its call in flight, with ``Outcome.GONE``)."""
        link = self._link_of(broker_id, incarnation_id)
        if link is not None:
            link.gone = True

    def linked(self, broker_id: int, incarnation_id: str) -> bool:
        """Whether this incarnation is tracked and not confirmed dead."""
        link = self._link_of(broker_id, incarnation_id)
        return link is not None and not link.gone

    def pushing(self) -> tuple[int, ...]:
        """The brokers a push is in flight to."""
        return tuple(sorted({p.broker_id for p in self._pushes.values()}))

    def in_flight(self, broker_id: int) -> list[ReplicaSpec] | None:
        """The specs of the push in flight to the broker's tracked incarnation, if any."""
        link = self._links.get(broker_id)
        return None if link is None or link.push is None else link.push.specs

    def _link_of(self, broker_id: int, incarnation_id: str) -> _Link | None:
        link = self._links.get(broker_id)
        return link if link is not None and link.incarnation_id == incarnation_id else None

    def _live_link(self, md: ClusterMetadata, broker_id: int) -> _Link | None:
        """The link to the broker's registered, unfenced incarnation not confirmed dead."""
        reg = md.brokers.get(broker_id)
        if reg is None or reg.state == "fenced":
            return None
        link = self._link_of(broker_id, reg.incarnation_id)
        return None if link is None or link.gone else link

    # --- desired state ------------------------------------------------------------------------

    def desired(self, md: ClusterMetadata, broker_id: int) -> list[ReplicaSpec]:
        """The replicas ``broker_id`` must host, each with its role command (computed once per
        metadata version: the metadata is immutable, and a round asks for it many times)."""
        if self._desired_of is None or self._desired_of[0] is not md:
            self._desired_of = (md, throttle_bytes_per_sec(md, self._static_configs), {})
        _, throttle, by_broker = self._desired_of
        specs = by_broker.get(broker_id)
        if specs is None:
            specs = by_broker[broker_id] = self._specs(md, broker_id, throttle)
        return specs

    def _specs(self, md: ClusterMetadata, broker_id: int, throttle: int) -> list[ReplicaSpec]:
        specs = []
        for name in sorted(md.topics):
            t = md.topics[name]
            # The link a mirror's leader takes batches from, while that link is active.
            link = md.links.get(t.mirror.link) if t.mirror is not None else None
            mirror_link = link.name if link is not None and link.active else ""
            for p in t.partitions:
                if broker_id not in p.replicas:
                    continue
                command = election.role_command(p, broker_id, self.controller_epoch, mirror_link)
                rate = throttle if p.leader == broker_id and p.adding_replicas else 0
                specs.append(
                    ReplicaSpec(name, t.topic_id, p.partition, dict(t.configs), command, rate)
                )
        return specs

    def readiness(self, md: ClusterMetadata, topic: str) -> TopicReadiness:
        """Rule 5 for every partition of ``topic`` (KeyError when it does not exist)."""
        t = md.topics[topic]
        applied: dict[int, dict[tuple[str, int], ReplicaSpec]] = {}
        wanted: dict[int, dict[tuple[str, int], ReplicaSpec]] = {}

        def has_applied(broker_id: int, key: tuple[str, int]) -> bool:
            if broker_id not in applied:
                link = self._live_link(md, broker_id)
                pushed = (link.pushed if link is not None else None) or []
                applied[broker_id] = {(s.topic, s.partition): s for s in pushed}
                wanted[broker_id] = {(s.topic, s.partition): s for s in self.desired(md, broker_id)}
            spec = applied[broker_id].get(key)
            return spec is not None and spec == wanted[broker_id].get(key)

        serving, pending = [], []
        for p in t.partitions:
            if p.leader == NO_LEADER:
                pending.append((p.partition, (NO_LEADER,)))
                continue
            members = dict.fromkeys((p.leader, *p.isr))
            waiting = tuple(b for b in members if not has_applied(b, (topic, p.partition)))
            if waiting:
                pending.append((p.partition, waiting))
            else:
                serving.append(p.partition)
        replicas = sum(len(p.replicas) for p in t.partitions)
        return TopicReadiness(topic, len(t.partitions), tuple(serving), tuple(pending), replicas)

    # --- a round ------------------------------------------------------------------------------

    def round(self, md: ClusterMetadata, now_ms: int) -> list[Push]:
        """Start a push to every broker that needs one (rule 1); the phase-1 calls to make."""
        targets: dict[int, list[ReplicaSpec]] = {}
        for broker_id in md.brokers:
            link = self._live_link(md, broker_id)
            if link is None or link.push is not None:
                continue
            specs = self.desired(md, broker_id)
            if self._needs_push(link, specs, now_ms):
                targets[broker_id] = specs
        waits = self._stepped_down_first(md, targets)
        started: dict[int, _BrokerPush] = {}
        for broker_id, specs in targets.items():
            link = self._links[broker_id]
            deps = waits.get(broker_id)
            if deps is None and link.followers_applied == specs:
                # Its leader phase waits for a later round, and it stepped down for these very
                # specs already: nothing to send now.
                continue
            push = _BrokerPush(
                self._next_push_id, broker_id, link, specs, md.metadata_epoch, now_ms, deps
            )
            self._next_push_id += 1
            started[broker_id] = link.push = self._pushes[push.push_id] = push
            if deps is not None and link.may_lead is not None:
                # From now on: its leader phase may start (late, after a slow phase 1) while a
                # later round elects others, which must then wait for it.
                link.may_lead |= push.leaders
        for push in started.values():  # by push id: a broker skipped above waits for nothing
            if push.after is not None:
                push.after = {started[b].push_id for b in push.after if b in started}
        self._update_reconciled(md)
        return [self._call(p, FOLLOWERS) for p in started.values()]

    def _needs_push(self, link: _Link, specs: list[ReplicaSpec], now_ms: int) -> bool:
        due = now_ms - link.pushed_ms >= self.resync_interval_ms
        return link.pushed != specs or due

    def _stepped_down_first(
        self, md: ClusterMetadata, targets: dict[int, list[ReplicaSpec]]
    ) -> dict[int, set[int] | None]:
        """Per target: the brokers whose phase 1 its leader phase waits for, or None when one
        of them has a push in flight (the leader phase waits for a later round) (rule 3).

        A broker that may lead a partition another target is to lead, and needs no push
        itself, is added to ``targets`` (its phase 1 is what steps it down). Fenced brokers,
        and brokers Ray confirmed dead, are not waited for: their write leases have lapsed.
        """
        live = {b: link for b in md.brokers if (link := self._live_link(md, b)) is not None}
        waits: dict[int, set[int] | None] = {}
        for broker_id in list(targets):
            leads = [
                TopicPartition(s.topic, s.partition) for s in targets[broker_id] if s.is_leader
            ]
            deps = {
                b
                for b, link in live.items()
                if b != broker_id and any(link.may_be_leading(tp) for tp in leads)
            }
            for b in deps:
                if live[b].push is None and b not in targets:
                    targets[b] = self.desired(md, b)
            busy = any(live[b].push is not None for b in deps)
            waits[broker_id] = None if busy else deps
        return waits

    # --- outcomes -----------------------------------------------------------------------------

    def answered(self, call: Push, outcome: Outcome, md: ClusterMetadata) -> Progress:
        """One phase of a push ended (every :class:`Push` handed out is answered once); ``md``
        is the current metadata. Answers of a push no longer in flight change nothing."""
        push = self._pushes.get(call.push_id)
        if push is None or push.phase != call.phase:
            return Progress()
        if outcome is Outcome.GONE:
            push.link.gone = True
        push.ok = push.ok and self._applied(outcome)
        progress = Progress()
        if call.phase == LEADERS:
            self._end(push, md, progress)
            return progress
        # Phase 1 ended, applied or not: record a step-down, release the leader phases it held.
        link = push.link
        if push.ok:  # it hosts exactly these specs and leads none of the others
            link.followers_applied = push.specs
            link.may_lead = push.leaders if link.may_lead is None else link.may_lead & push.leaders
        released = []
        for other in self._pushes.values():
            if other.after and push.push_id in other.after:
                other.after.discard(push.push_id)
                if not other.after and other.phase == LEADERS:
                    released.append(other)
        for other in released:
            self._start_leaders(other, md, progress)
        if push.after is None:  # no leader phase this round
            self._end(push, md, progress)
            return progress
        push.phase = LEADERS
        if not push.after:
            self._start_leaders(push, md, progress)
        return progress

    def _applied(self, outcome: Outcome) -> bool:
        return outcome is Outcome.APPLIED

    def _start_leaders(self, push: _BrokerPush, md: ClusterMetadata, progress: Progress) -> None:
        """The leader phase of ``push``; to a broker confirmed dead nothing is sent: the push
        ends as failed."""
        if push.link.gone:
            push.ok = False
            self._end(push, md, progress)
        else:
            progress.pushes.append(self._call(push, LEADERS))

    def _end(self, push: _BrokerPush, md: ClusterMetadata, progress: Progress) -> None:
        del self._pushes[push.push_id]
        link = push.link
        if link.push is push:
            link.push = None
        applied = push.ok and push.after is not None and self._links.get(push.broker_id) is link
        if applied:
            link.pushed = push.specs
            link.pushed_ms = push.round_ms
        self._update_reconciled(md)
        progress.ended.append(Ended(push.push_id, push.broker_id, push.metadata_epoch, applied))

    def _update_reconciled(self, md: ClusterMetadata) -> None:
        for broker_id, reg in md.brokers.items():
            if reg.state == "fenced":
                continue
            link = self._link_of(broker_id, reg.incarnation_id)
            if link is None or link.pushed is None or link.pushed != self.desired(md, broker_id):
                return
        self.reconciled_epoch = max(self.reconciled_epoch, md.metadata_epoch)

    def _call(self, push: _BrokerPush, phase: str) -> Push:
        return Push(
            push.push_id,
            push.broker_id,
            push.link.incarnation_id,
            phase,
            push.metadata_epoch,
            push.specs,
        )


__all__ = [
    "FOLLOWERS",
    "LEADERS",
    "Ended",
    "Outcome",
    "Progress",
    "Push",
    "Reconciler",
    "ReplicaSpec",
    "RoleCommand",
    "TopicReadiness",
    "throttle_bytes_per_sec",
]
