"""The controller's admin requests, mixed into :class:`raylog.actors.controller.ControllerActor`.

This module owns the requests an operator or a Kafka client sends the active controller (through a
gateway or the CLI): CreateTopics (and the wait until its partitions serve), DeleteTopics,
DescribeConfigs, AlterConfigs, CreatePartitions, ElectLeaders, AlterPartitionReassignments and
ListPartitionReassignments (KIP-455), AllocateProducerIds, AlterUserScramCredentials and
DescribeUserScramCredentials (KIP-554), CreateAcls, DescribeAcls and DeleteAcls,
Alter/DescribeClientQuotas (KIP-546), and raylog's rebalance; and the two background duties of the
reconcile loop that come with them: completing reassignments, and the automatic preferred leader
election (``auto.leader.rebalance.enable``). Each request decides with a pure module on the current
metadata (``metadata``, ``placement``, ``election``, ``reassignment``, ``acls``, ``client_quotas``)
and writes the outcome with the controller's compare-and-swap (``_mutate``); the brokers then learn
it from the reconciler's next pushes.

The host class provides the active controller's state and helpers: ``_ensure_started``,
``_require_active`` (the current stored version, or NotControllerError), ``_mutate`` (decide,
CAS-write, wake the loop), ``_leos`` (the replicas' last reported log end offsets) and
``_count_unclean``, and the attributes annotated on :class:`AdminRequests`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import msgspec
import ray

from raylog.actors.calls import NAMESPACE, monotonic_ms, ray_call, replica_actor_name
from raylog.actors.control import acls as acls_
from raylog.actors.control import (
    balancer,
    client_quotas,
    config_keys,
    config_registry,
    election,
    placement,
    reassignment,
)
from raylog.actors.control import links as links_
from raylog.actors.control import metadata as md_
from raylog.actors.control.metadata import ClusterMetadata, TopicMetadata, TopicPartition
from raylog.actors.control.metadata_store import VersionedMetadata
from raylog.actors.control.reconciler import Reconciler, TopicReadiness
from raylog.actors.controller_capacity import free_mib_of
from raylog.storage import pki
from raylog.storage.errors import (
    BrokerIdNotRegisteredError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    NotControllerError,
    PolicyViolationError,
    RaylogError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class _DoesNotFit(Exception):
    """CreateTopics' placement refused for lack of brokers or memory, with each active
    broker's free memory (``controller_capacity.free_mib_of``) for the capacity request."""

    def __init__(self, refusal: RaylogError, free_mib: list[float | None]) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal
        self.free_mib = free_mib


WAIT_READY_MS_MAX = 30_000  # bound on one topic_readiness wait (callers ask again)
SIZES_WAIT_MS = 2_000  # a broker's bound on its replicas' answers, for the balancer's sizes
READY_POLL_S = 0.02  # how often that wait looks again (pushes end on the same event loop)


class AdminRequests:
    """The admin requests of the active controller (a mixin; see the module docstring)."""

    _broker_config: config_keys.BrokerConfig
    _call_timeout_ms: int
    _epoch: int | None
    _leader_rebalance_due: tuple[int, int] | None  # (controller epoch, due ms)
    _balance_due: tuple[int, int] | None  # the same, for replica balancing
    _balancer_state: str  # what the balancer did last (`raylog status`)
    _fenced_since: dict[int, int]  # broker id -> when the balancer first saw it fenced (ms)
    balancer_moves: int
    _links: dict[int, Any]  # broker id -> its link (``handle``)
    _reconciler: Reconciler | None  # while active
    _store_location: tuple[str, str | None]  # the object store's URL and S3 endpoint

    # Provided by the host class (see the module docstring).
    _ensure_started: Callable[[], None]
    _require_active: Callable[[], VersionedMetadata]
    _leos: Callable[[], dict[TopicPartition, dict[int, int]]]
    _count_unclean: Callable[[election.Outcome], None]
    _certificate_authority: Callable[[], Awaitable[pki.CertificateAuthority]]
    _ask_capacity: Callable[..., Awaitable[RaylogError]]  # ``CapacityRequests``'

    async def _mutate(self, change: Callable[[ClusterMetadata], tuple[ClusterMetadata, T]]) -> T:
        raise NotImplementedError  # the host's

    # --- topics ----------------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: dict[str, str] | None = None,
        assignment: list[list[int]] | None = None,
    ) -> TopicMetadata:
        """CreateTopics: place replicas rack-aware (or take ``assignment``), validate, write."""
        self._ensure_started()
        topic_id = uuid.uuid4().hex
        node_of, node_memory_mib, replica_mib = await self._broker_nodes()

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, None]:
            links_.check_reserved(md.links, name)
            try:
                out = md_.new_topic(
                    md, name, topic_id, num_partitions, replication_factor, configs, assignment
                )
                chosen = [p.replicas for p in out.topics[name].partitions]
                existing = [p.replicas for _, p in md_.partitions(md)]
                placement.check_memory_fit(chosen, existing, node_of, node_memory_mib, replica_mib)
            except (InvalidReplicationFactorError, PolicyViolationError) as exc:
                # Too few brokers or too little memory for placement to choose: more nodes may
                # help (a manual assignment names its brokers; a factor <= 0 never fits).
                if assignment is None and replication_factor > 0 and num_partitions > 0:
                    free = free_mib_of(md, node_of, node_memory_mib, replica_mib)
                    raise _DoesNotFit(exc, free) from None
                raise
            return out, None

        try:
            await self._mutate(change)
        except _DoesNotFit as short:
            raise await self._ask_capacity(
                short.refusal, num_partitions * replication_factor, replication_factor,
                short.free_mib, replica_mib,
            ) from None  # fmt: skip
        return self._require_active().metadata.topics[name]

    async def topic_readiness(self, name: str, wait_ms: int = 0) -> TopicReadiness:
        """Which partitions of topic ``name`` serve: a leader that accepts writes, and every
        ISR member following it (``Reconciler.readiness``). Waits up to ``wait_ms`` (at most
        WAIT_READY_MS_MAX) for all of them; what is still pending is in the answer.
        UnknownTopicOrPartitionError when the topic does not exist (or was deleted)."""
        self._ensure_started()
        deadline = monotonic_ms() + min(max(wait_ms, 0), WAIT_READY_MS_MAX)
        while True:  # bounded by the deadline
            md = self._require_active().metadata
            md_.get_topic(md, name)
            if self._reconciler is None:
                raise NotControllerError("no reconciler: this controller is not active")
            readiness = self._reconciler.readiness(md, name)
            if readiness.done:
                return readiness
            if monotonic_ms() >= deadline:
                started = await self._replicas_started(name)
                return msgspec.structs.replace(readiness, replicas_started=started)
            await asyncio.sleep(READY_POLL_S)

    async def _replicas_started(self, topic: str) -> int:
        """How many replicas of ``topic`` the linked brokers host, running; -1 when a broker
        did not answer."""
        answers = await asyncio.gather(
            *(
                ray_call(link.handle.replicas_started.remote(topic), self._call_timeout_ms)
                for link in self._links.values()
            ),
            return_exceptions=True,
        )
        if any(not isinstance(a, int) for a in answers):
            return -1
        return sum(answers)

    async def delete_topic(self, name: str) -> None:
        """DeleteTopics: brokers stop the replicas and remove their data on the next round."""
        self._ensure_started()
        await self._mutate(lambda md: (md_.delete_topic(md, name), None))

    async def describe_topic(self, name: str) -> TopicMetadata:
        self._ensure_started()
        return md_.get_topic(self._require_active().metadata, name)

    async def describe_configs(self, name: str) -> list[config_registry.ConfigEntry]:
        self._ensure_started()
        return config_keys.describe(md_.get_topic(self._require_active().metadata, name).configs)

    async def alter_configs(self, name: str, overrides: dict[str, str]) -> TopicMetadata:
        """AlterConfigs (the whole override set). Brokers apply the new configs to the topic's
        running replicas (re-creating them from their WALs only for a replication.mode change);
        then unclean elections are retried if enabled."""
        self._ensure_started()

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, None]:
            topic = md_.get_topic(md, name)
            if topic.mirror is not None:
                links_.check_own_configs(topic.mirror, topic.configs, overrides)
            md = md_.alter_configs(md, name, overrides)
            out = election.elect_offline(md, self._leos())
            self._count_unclean(out)
            return out.metadata, None

        await self._mutate(change)
        return self._require_active().metadata.topics[name]

    async def create_partitions(self, name: str, total_count: int) -> TopicMetadata:
        """CreatePartitions: grow the topic to ``total_count`` partitions (placement continues)."""
        self._ensure_started()

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, None]:
            mirror = md_.get_topic(md, name).mirror
            if mirror is not None:
                raise InvalidRequestError(
                    f"topic {name!r} is a mirror of link {mirror.link!r}: its partitions follow "
                    "the source's"
                )
            return md_.new_partitions(md, name, total_count), None

        await self._mutate(change)
        return self._require_active().metadata.topics[name]

    async def elect_leaders(
        self,
        election_type: Literal["preferred", "unclean"],
        partitions: list[tuple[str, int]] | None = None,
    ) -> dict[tuple[str, int], int]:
        """ElectLeaders; returns Kafka's error code per partition (0 = elected)."""
        self._ensure_started()
        wanted = None if partitions is None else [TopicPartition(t, p) for t, p in partitions]

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, election.Outcome]:
            out = election.elect_leaders(md, election_type, wanted, self._leos())
            self._count_unclean(out)
            return out.metadata, out

        out = await self._mutate(change)
        codes = {(c.topic, c.partition): 0 for c in out.changes}
        codes.update({(tp.topic, tp.partition): e.error_code for tp, e in out.errors.items()})
        return codes

    # --- reassignment (KIP-455) and rebalance -----------------------------------------------

    async def reassign_partitions(
        self,
        targets: dict[tuple[str, int], list[int]],
        throttle_bytes_per_sec: int | None = None,
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """AlterPartitionReassignments: start (or replace) reassignments; per partition Kafka's
        error code and message ((0, "") = started). ``throttle_bytes_per_sec`` sets
        ``leader.replication.throttled.rate`` until no reassignment runs any more."""
        self._ensure_started()
        wanted = {TopicPartition(t, p): list(r) for (t, p), r in targets.items()}

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, election.Outcome]:
            out = reassignment.start(reassignment.throttled(md, throttle_bytes_per_sec), wanted)
            return out.metadata, out

        out = await self._mutate(change)
        return reassignment.request_codes(wanted, out)

    async def cancel_reassignments(
        self, partitions: list[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """Cancel reassignments (all running ones when ``partitions`` is None)."""
        self._ensure_started()
        wanted = None if partitions is None else [TopicPartition(t, p) for t, p in partitions]

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, election.Outcome]:
            out = reassignment.cancel(md, wanted)
            return out.metadata, out

        out = await self._mutate(change)
        return reassignment.request_codes(wanted or [c.topic_partition for c in out.changes], out)

    async def list_reassignments(self) -> list[reassignment.ReassignmentProgress]:
        """ListPartitionReassignments, with live log end offsets of the leader and the adding
        replicas (asked of the replica actors; -1 where one did not answer)."""
        self._ensure_started()
        md = self._require_active().metadata
        asks = [
            (tp, b)
            for tp, p in md_.partitions(md)
            if p.reassigning
            for b in (p.leader, *p.adding_replicas)
            if b != md_.NO_LEADER
        ]
        leos = await asyncio.gather(*(self._log_end_offset(tp, b) for tp, b in asks))
        known: dict[TopicPartition, dict[int, int]] = {}
        for (tp, b), leo in zip(asks, leos, strict=True):
            known.setdefault(tp, {})[b] = leo
        return reassignment.progress(md, known)

    async def rebalance(
        self, topics: list[str] | None = None, throttle_bytes_per_sec: int | None = None
    ) -> dict[tuple[str, int], tuple[int, ...]]:
        """Plan replica moves onto under-loaded brokers (rack-aware, fewest moves) and start
        them as reassignments; returns the targets started (empty: already balanced)."""

        def plan(md: ClusterMetadata) -> dict[TopicPartition, tuple[int, ...]]:
            targets, balanced = reassignment.rebalance_targets(md, topics)
            if not balanced:
                log.warning("rebalance: racks leave no legal move to full balance")
            return targets

        return await self._start_planned("rebalance", plan, throttle_bytes_per_sec)

    async def decommission(
        self, broker_id: int, throttle_bytes_per_sec: int | None = None
    ) -> dict[tuple[str, int], tuple[int, ...]]:
        """Mark ``broker_id`` draining (no new replicas) and start moving every replica off it
        (``reassignment.decommission_targets``), in one metadata version; returns the targets
        started (empty: it holds none). Its caller stops the broker once they complete."""

        def plan(md: ClusterMetadata) -> dict[TopicPartition, tuple[int, ...]]:
            return reassignment.decommission_targets(md, broker_id)

        return await self._start_planned(
            "decommission",
            plan,
            throttle_bytes_per_sec,
            before=lambda md: md_.set_draining(md, broker_id, True),
        )

    async def cancel_decommission(self, broker_id: int) -> bool:
        """The broker takes new replicas again (its draining mark goes); reassignments already
        started go on (``raylog reassign --cancel`` stops them). Whether it was draining."""
        self._ensure_started()

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, bool]:
            reg = md.brokers.get(broker_id)
            if reg is None:
                raise BrokerIdNotRegisteredError(f"Broker {broker_id} is not registered")
            return md_.set_draining(md, broker_id, False), reg.draining

        return await self._mutate(change)

    async def _start_planned(
        self,
        what: str,
        plan: Callable[[ClusterMetadata], dict[TopicPartition, tuple[int, ...]]],
        throttle_bytes_per_sec: int | None,
        before: Callable[[ClusterMetadata], ClusterMetadata] | None = None,
    ) -> dict[tuple[str, int], tuple[int, ...]]:
        """Start the reassignments ``plan`` gives for the current metadata, with ``before``'s
        change to it written in the same version."""
        self._ensure_started()

        def change(
            md: ClusterMetadata,
        ) -> tuple[ClusterMetadata, dict[TopicPartition, tuple[int, ...]]]:
            targets = plan(md)
            if before is not None:
                md = before(md)
            if not targets:
                return md, {}
            out = reassignment.start(reassignment.throttled(md, throttle_bytes_per_sec), targets)
            if out.errors:  # a plan only names registered brokers: this is a bug
                raise AssertionError(f"{what} plan refused: {out.errors}")
            return out.metadata, targets

        started = await self._mutate(change)
        return {(tp.topic, tp.partition): target for tp, target in started.items()}

    async def _log_end_offset(self, tp: TopicPartition, broker_id: int) -> int:
        name = replica_actor_name(tp.topic, tp.partition, broker_id)
        try:
            handle = await asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE)
            state = await ray_call(handle.state.remote(), self._call_timeout_ms)
        except (ValueError, RaylogError):
            return -1
        return int(state.log_end_offset)

    async def _reassignment_round(self) -> None:
        """Complete reassignments whose adding replicas all joined the ISR; drop the throttle
        once none runs (``reassignment.complete_round``)."""
        md = self._require_active().metadata
        running = any(p.reassigning for _, p in md_.partitions(md))
        if not running and reassignment.THROTTLE_KEY not in md.dynamic_broker_configs:
            return

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, election.Outcome]:
            out = reassignment.complete_round(md)
            return out.metadata, out

        out = await self._mutate(change)
        for c in out.changes:
            log.info(
                "reassignment of %s-%d complete: replicas %s", c.topic, c.partition, c.replicas
            )

    async def _auto_leader_rebalance(self) -> None:
        """``auto.leader.rebalance.enable``: every ``leader.imbalance.check.interval.seconds``
        (the first check one interval after this controller became active, as in Kafka), a
        preferred election for brokers above ``leader.imbalance.per.broker.percentage``."""
        cfg = self._broker_config
        if not cfg.auto_leader_rebalance_enable or self._epoch is None:
            return
        now = monotonic_ms()
        interval_ms = cfg.leader_imbalance_check_interval_seconds * 1000
        due = self._leader_rebalance_due
        if due is None or due[0] != self._epoch:
            self._leader_rebalance_due = (self._epoch, now + interval_ms)
            return
        if now < due[1]:
            return
        self._leader_rebalance_due = (self._epoch, now + interval_ms)

        def change(md: ClusterMetadata) -> tuple[ClusterMetadata, election.Outcome]:
            out = election.auto_leader_rebalance(md, cfg.leader_imbalance_per_broker_percentage)
            return out.metadata, out

        out = await self._mutate(change)
        if out.changes:
            log.info(
                "auto leader rebalance: %s back to their preferred leaders",
                [f"{c.topic}-{c.partition}" for c in out.changes],
            )

    async def _replica_balance(self) -> None:
        """``replica.balancer.enable``: every ``replica.balancer.check.interval.ms`` (the first
        check one interval after this controller became active), start the balancer's next
        moves (``balancer.next_step``), throttled by ``replica.balancer.throttle.bytes.per.second``.
        """
        cfg = self._broker_config
        if not cfg.replica_balancer_enable or self._epoch is None:
            return
        now = monotonic_ms()
        due = self._balance_due
        if due is None or due[0] != self._epoch:
            self._balance_due = (self._epoch, now + cfg.replica_balancer_check_interval_ms)
            self._balancer_state = "starting"
            self._fenced_since = {}  # this controller counts from its own takeover
            return
        if now < due[1]:
            return
        self._balance_due = (self._epoch, now + cfg.replica_balancer_check_interval_ms)
        md = self._require_active().metadata
        for broker_id, reg in md.brokers.items():
            if reg.state == "fenced":
                self._fenced_since.setdefault(broker_id, now)
            else:
                self._fenced_since.pop(broker_id, None)
        threshold = cfg.replica_balancer_heal_broker_failure_threshold_ms
        lost = {b for b, since in self._fenced_since.items() if now - since >= threshold}

        by_bytes = None
        if balancer.next_step(md, lost).state == balancer.BALANCED:  # counts even: weigh bytes
            by_bytes = balancer.ByteRule(
                await self._partition_sizes(),
                cfg.replica_balancer_bytes_threshold,
                cfg.replica_balancer_bytes_min_gap,
            )

        def plan(md: ClusterMetadata) -> dict[TopicPartition, tuple[int, ...]]:
            step = balancer.next_step(md, lost, by_bytes)
            self._balancer_state = step.state
            return step.targets

        started = await self._start_planned(
            "balance", plan, cfg.replica_balancer_throttle_bytes_per_second
        )
        if not started:
            return  # nothing planned: nothing written
        self.balancer_moves += len(started)
        log.info(
            "replica balancer: moving %s",
            ", ".join(f"{t}-{p} to {list(r)}" for (t, p), r in sorted(started.items())),
        )

    async def _partition_sizes(self) -> dict[TopicPartition, int]:
        """Each partition's size for the balancer: its largest replica log, as the linked
        brokers' replicas report them (``BrokerActor.replica_states``; one that does not answer
        in time is left out: its partitions weigh what the others say, or nothing)."""
        answers = await asyncio.gather(
            *(
                ray_call(link.handle.replica_states.remote(SIZES_WAIT_MS), self._call_timeout_ms)
                for link in self._links.values()
            ),
            return_exceptions=True,
        )
        sizes: dict[TopicPartition, int] = {}
        for states in answers:
            for state in states if isinstance(states, list) else ():
                tp = TopicPartition(state.topic, state.partition)
                sizes[tp] = max(sizes.get(tp, 0), state.log_size_bytes)
        return sizes

    async def _broker_nodes(self) -> tuple[dict[int, str], dict[str, float], float]:
        """Each linked broker's Ray node, each node's declared memory (Ray's ``memory``
        resource, MiB), and what one replica costs (MiB): the largest of the brokers' measured
        figures (``BrokerActor.status``), ``placement.REPLICA_MIB`` before any is measured.
        For the memory check of new replicas. Best effort: a broker or node that does not
        answer is left out."""
        links = list(self._links.items())
        answers = await asyncio.gather(
            *(ray_call(link.handle.status.remote(), self._call_timeout_ms) for _, link in links),
            return_exceptions=True,
        )
        node_of = {
            b: str(a["node_id"])
            for (b, _), a in zip(links, answers, strict=True)
            if isinstance(a, dict) and a.get("node_id")
        }
        measured = [
            float(a["replica_private_mib"])
            for a in answers
            if isinstance(a, dict) and a.get("replica_private_mib")
        ]
        nodes = await asyncio.to_thread(ray.nodes)
        memory = {
            str(n["NodeID"]): float(n.get("Resources", {}).get("memory", 0)) / (1 << 20)
            for n in nodes
            if n.get("Alive") and n.get("Resources", {}).get("memory")
        }
        return node_of, memory, max(measured, default=placement.REPLICA_MIB)

    # --- SCRAM credentials (KIP-554) -------------------------------------------------------------

    async def alter_scram_credentials(
        self,
        upsertions: list[tuple[str, str, int, bytes, bytes]],
        deletions: list[tuple[str, str]],
    ) -> list[tuple[str, int, str]]:
        """AlterUserScramCredentials: ``upsertions`` as (user, mechanism, iterations, salt,
        salted_password), ``deletions`` as (user, mechanism); per user named, Kafka's error code
        and message ((user, 0, "") = done). Only the derived keys are stored
        (``metadata.alter_scram_credentials``); the gateways' metadata polls carry them."""
        self._ensure_started()
        ups = [md_.ScramUpsertion(*u) for u in upsertions]
        dels = [md_.ScramDeletion(*d) for d in deletions]
        return await self._mutate(lambda md: md_.alter_scram_credentials(md, ups, dels))

    async def describe_scram_credentials(
        self, users: list[str] | None = None
    ) -> list[md_.ScramUserDescription]:
        """DescribeUserScramCredentials: each user's (mechanism, iterations), never a salt or a
        key; every user when ``users`` is None or empty (``metadata``'s rules)."""
        self._ensure_started()
        return md_.describe_scram_credentials(self._require_active().metadata, users)

    # --- ACLs ------------------------------------------------------------------------------------

    async def create_acls(self, creations: list[acls_.AclBinding]) -> list[tuple[int, str]]:
        """CreateAcls: per creation Kafka's error code and message ((0, "") = created, or
        already there); ``acls.check_new``'s rules."""
        self._ensure_started()
        return await self._mutate(lambda md: md_.create_acls(md, creations))

    async def describe_acls(self, acl_filter: acls_.AclBindingFilter) -> list[acls_.AclBinding]:
        """DescribeAcls: the ACLs the filter matches; InvalidRequestError for a filter with
        UNKNOWN codes."""
        self._ensure_started()
        return acls_.describe_acls(self._require_active().metadata.acls, acl_filter)

    async def delete_acls(
        self, filters: list[acls_.AclBindingFilter]
    ) -> list[acls_.DeletionResult]:
        """DeleteAcls: per filter its error or the ACLs it deleted (``acls.delete_acls``)."""
        self._ensure_started()
        return await self._mutate(lambda md: md_.delete_acls(md, filters))

    # --- client quotas (KIP-546) ----------------------------------------------------------------

    async def alter_client_quotas(
        self,
        entries: list[tuple[list[tuple[str, str | None]], list[tuple[str, float, bool]]]],
        validate_only: bool = False,
    ) -> list[client_quotas.EntityResult]:
        """AlterClientQuotas: ``entries`` as (entity, ops), an entity as (type, name or None
        for the default), an op as (key, value, remove); per entry Kafka's error code and
        message (``client_quotas.alter_client_quotas``)."""
        self._ensure_started()
        wanted = [client_quotas.ClientQuotaEntry(e, ops) for e, ops in entries]
        return await self._mutate(
            lambda md: client_quotas.alter_client_quotas(md, wanted, validate_only)
        )

    async def describe_client_quotas(
        self, components: list[tuple[str, int, str | None]], strict: bool = False
    ) -> client_quotas.DescribeResult:
        """DescribeClientQuotas: the entities matching the filter ``components`` (entity
        type, match type, match), with their values."""
        self._ensure_started()
        md = self._require_active().metadata
        return client_quotas.describe_client_quotas(md, components, strict)

    async def allocate_producer_ids(self) -> tuple[int, int]:
        """AllocateProducerIds: the next block of producer ids as ``(first, count)``.

        The next free id is part of the metadata and the block is handed out only after the
        CAS write that moves it past the block succeeded, so no id is handed out twice, across
        controller failovers included (a block whose answer was lost is skipped, never reused).
        """
        self._ensure_started()
        block = await self._mutate(md_.allocate_producer_ids)
        return block.start, len(block)

    # --- tiered storage, for pipeline readers -------------------------------------------------

    async def store_location(self) -> tuple[str, str | None]:
        """The cluster's object store: its URL and S3 endpoint (None: AWS's), as brokers learn
        it at registration. Pipeline readers read remote segments there themselves, with their
        own credentials (none cross Ray). A standby answers too: the store is fixed."""
        return self._store_location

    # --- the cluster CA, for Kafka clients (`raylog certs`) ----------------------------------

    async def sasl_mask_key(self) -> bytes:
        """The key every gateway masks unknown users' SCRAM salts with (derived from the CA's
        private key, so all gateways answer an unknown user alike)."""
        return (await self._certificate_authority()).derive_secret(b"sasl mask key")

    async def ca_certificate(self) -> bytes:
        """The cluster CA's certificate (PEM): what clients trust (``ssl.ca.location``)."""
        return (await self._certificate_authority()).cert_pem

    async def issue_client_certificate(self, name: str, days: int) -> pki.LeafCertificate:
        """A client certificate (clientAuth only, ``CN=name``) from the cluster CA, living
        ``days``; InvalidRequestError for a bad name or life."""
        try:
            pki.check_client_certificate(name, days)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
        ca = await self._certificate_authority()
        leaf = ca.issue(name, days=days, server=False)
        log.info("issued a client certificate for CN=%s (%d days)", name, days)
        return leaf
