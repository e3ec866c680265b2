"""Admin requests forwarded from a gateway to the active controller.

This module owns carrying out the admin APIs (CreateTopics, DeleteTopics, DescribeConfigs and
AlterConfigs on topics, CreatePartitions, ElectLeaders, Describe/AlterUserScramCredentials,
Create/Describe/DeleteAcls, Describe/AlterClientQuotas) and handing out producer ids
(InitProducerId), whichever broker the request reached:

1. The request goes to the active controller, found through a :class:`ControllerLocator` (the
   gateway actor, which polls the controllers for its metadata anyway). A controller that is gone
   or no longer active is looked up again once, and the call retried on it: the active one may
   have moved since the gateway last polled. Each call is bounded by ``ADMIN_CALL_TIMEOUT_MS``.
2. The controller's errors carry Kafka's codes (``storage/errors.py``); they are answered with
   a message naming the problem, never raised to the handler.
3. ``validate_only`` runs the same pure transitions the controller runs
   (``actors/control/metadata.py``: ``new_topic``, ``new_partitions``, ``alter_configs``) on the
   controller's current metadata, and writes nothing.
4. CreateTopics, DeleteTopics and CreatePartitions answer as Kafka does: with ``timeout_ms`` <= 0
   once the controller committed the change; else once this broker's metadata shows it, or
   REQUEST_TIMED_OUT (7) if it does not within ``timeout_ms``. CreateTopics first waits, in the
   same ``timeout_ms``, until every partition has a leader that serves (the controller's
   ``topic_readiness``: the replicas are Ray actors that take a while to start), so a client
   that produces right after the answer is served at once; partitions still starting at the
   timeout do not fail the request (Kafka's CreateTopics succeeds once the topic is created):
   they answer LEADER_NOT_AVAILABLE / NOT_LEADER_OR_FOLLOWER until they serve, which clients
   retry. No controller answering during that wait (a failover) is no failure either: the
   topic exists, and the wait asks again until ``timeout_ms``.
5. A topic that does not fit the brokers present, while the controller has asked Ray's
   autoscaler for nodes (``CapacityPendingError``), is asked for again every
   ``capacity.RETRY_S`` within ``timeout_ms``: a node that joins in time gets its replicas;
   at the timeout the answer is the refusal, naming what was asked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import ray
from ray.exceptions import RayTaskError

from raylog.actors.calls import ray_call
from raylog.actors.control import acls as acls_
from raylog.actors.control import capacity, config_keys
from raylog.actors.control import metadata as md_
from raylog.gateway.backend import (
    AdminResult,
    ClientQuotaEntry,
    DescribeResult,
    EntityResult,
    NewTopic,
    ScramUpsertion,
    ScramUserDescription,
    TopicConfigsResult,
    TopicState,
    UserResult,
)
from raylog.gateway.errors import ErrorCode
from raylog.gateway.producer_ids import ProducerIdBlocks, ProducerIdResult
from raylog.gateway.routing import MetadataSource
from raylog.storage.errors import (
    BrokerNotAvailableError,
    CapacityPendingError,
    NotControllerError,
    RaylogError,
    RequestTimedOutError,
    one_line,
)

__all__ = ["ADMIN_CALL_TIMEOUT_MS", "ControllerAdmin", "ControllerLocator"]

log = logging.getLogger(__name__)

ADMIN_CALL_TIMEOUT_MS = 30_000  # bound on one admin call to the controller (a CAS write or two)
VIEW_POLL_S = 0.02  # how often a create/delete looks for its result in the local metadata
READY_WAIT_MS_MAX = 10_000  # one topic_readiness call waits this long at most (then asks again)
READY_RETRY_S = 0.2  # after no controller answered topic_readiness (a failover), ask again
VALIDATE_ONLY_TOPIC_ID = "validate-only"  # never stored: validate_only writes nothing


class ControllerLocator(Protocol):
    """Finds the active controller's Ray handle (the gateway actor, which already polls it)."""

    async def active_controller(self, refresh: bool = False) -> Any:
        """The handle last found active (looked up again when ``refresh``); None if none is."""
        ...


class ControllerAdmin:
    """The admin half of the gateway's backend: every change goes through the controller."""

    def __init__(
        self,
        metadata: MetadataSource,
        controller: ControllerLocator | None,
        broker_configs: Mapping[str, str] | None = None,
    ) -> None:
        self.metadata = metadata
        self._controller = controller
        self._producer_ids = ProducerIdBlocks(self._allocate_producer_ids)
        # Validated once here, so that a bad broker config fails the gateway's start.
        self._broker_overrides = config_keys.BROKER_CONFIGS.validate(broker_configs or {})

    async def broker_configs(self) -> tuple[int, Mapping[str, str]]:
        return self.metadata.this_broker_id, dict(self._broker_overrides)

    async def create_topic(
        self, topic: NewTopic, validate_only: bool, timeout_ms: int
    ) -> AdminResult:
        name, partitions, rf = topic.name, topic.num_partitions, topic.replication_factor
        chosen = [list(r) for r in topic.assignment] if topic.assignment else None
        configs = dict(topic.configs)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, timeout_ms) / 1000
        try:
            if validate_only:
                md = await self.call("metadata")
                md_.new_topic(md, name, VALIDATE_ONLY_TOPIC_ID, partitions, rf, configs, chosen)
                return AdminResult(ErrorCode.NONE)
            while True:  # bounded by the deadline
                try:
                    await self.call("create_topic", name, partitions, rf, configs, chosen)
                    break
                except CapacityPendingError:  # step 5: nodes asked for; try again until due
                    if loop.time() + capacity.RETRY_S >= deadline:
                        raise
                    await asyncio.sleep(capacity.RETRY_S)
        except RaylogError as exc:
            return AdminResult(exc.error_code, one_line(exc))
        if timeout_ms <= 0:
            return AdminResult(ErrorCode.NONE)
        waited = await self._wait_serving(name, timeout_ms, deadline)
        if waited.error_code not in (ErrorCode.NONE, ErrorCode.REQUEST_TIMED_OUT):
            return waited
        remaining_ms = max(1, int((deadline - loop.time()) * 1000))
        return await self._wait_view(
            lambda topics: name in topics, remaining_ms, f"Topic {name!r} was created but is"
        )

    async def _wait_serving(self, name: str, timeout_ms: int, deadline: float) -> AdminResult:
        """Step 4 for CreateTopics: until every partition of ``name`` serves, or the deadline
        (REQUEST_TIMED_OUT naming what is pending, which the caller logs past)."""
        loop = asyncio.get_running_loop()
        while True:  # bounded by the deadline: each call waits at most until it
            wait_ms = int(max(0.0, deadline - loop.time()) * 1000)
            try:
                readiness = await self.call(
                    "topic_readiness", name, min(wait_ms, READY_WAIT_MS_MAX)
                )
            except (NotControllerError, BrokerNotAvailableError, RequestTimedOutError) as exc:
                # The topic is created: a controller failing over (a loaded machine) is no
                # failure of this request. Ask again; at the deadline, answer as for a wait
                # that ran out (the caller then looks for the topic in this broker's view).
                if loop.time() >= deadline:
                    return AdminResult(ErrorCode.REQUEST_TIMED_OUT, one_line(exc))
                await asyncio.sleep(min(READY_RETRY_S, max(0.0, deadline - loop.time())))
                continue
            except RaylogError as exc:
                return AdminResult(exc.error_code, one_line(exc))
            if readiness.done:
                return AdminResult(ErrorCode.NONE)
            if loop.time() >= deadline:
                pending = [p for p, _ in readiness.pending]
                log.info("topic %s created; partitions %s not serving yet", name, pending[:10])
                return AdminResult(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"Topic {name!r} was created, but after {timeout_ms} ms "
                    f"{len(pending)} of {readiness.partitions} partitions have no serving "
                    f"leader yet (partitions {pending[:10]}); it is still being created",
                )

    async def delete_topic(self, name: str, timeout_ms: int) -> AdminResult:
        try:
            await self.call("delete_topic", name)
        except RaylogError as exc:
            return AdminResult(exc.error_code, one_line(exc))
        return await self._wait_view(
            lambda topics: name not in topics, timeout_ms, f"Topic {name!r} was deleted but is"
        )

    async def topic_configs(self, name: str) -> TopicConfigsResult:
        try:
            topic = await self.call("describe_topic", name)
        except RaylogError as exc:
            return TopicConfigsResult(exc.error_code, {}, one_line(exc))
        return TopicConfigsResult(ErrorCode.NONE, dict(topic.configs))

    async def alter_topic_configs(
        self, name: str, overrides: Mapping[str, str], validate_only: bool
    ) -> AdminResult:
        try:
            if validate_only:
                md_.alter_configs(await self.call("metadata"), name, overrides)
            else:
                await self.call("alter_configs", name, dict(overrides))
        except RaylogError as exc:
            return AdminResult(exc.error_code, one_line(exc))
        return AdminResult(ErrorCode.NONE)

    async def create_partitions(
        self, name: str, total_count: int, validate_only: bool, timeout_ms: int
    ) -> AdminResult:
        try:
            if validate_only:
                md_.new_partitions(await self.call("metadata"), name, total_count)
                return AdminResult(ErrorCode.NONE)
            await self.call("create_partitions", name, total_count)
        except RaylogError as exc:
            return AdminResult(exc.error_code, one_line(exc))
        return await self._wait_view(
            lambda topics: name in topics and len(topics[name].partitions) >= total_count,
            timeout_ms,
            f"Topic {name!r} grew to {total_count} partitions but is",
        )

    async def elect_leaders(
        self, election_type: str, partitions: Sequence[tuple[str, int]] | None
    ) -> Mapping[tuple[str, int], AdminResult]:
        wanted = None if partitions is None else [list(tp) for tp in partitions]
        try:
            codes = await self.call("elect_leaders", election_type, wanted)
        except RaylogError as exc:
            every = partitions or []
            return {tp: AdminResult(exc.error_code, one_line(exc)) for tp in every}
        return {tuple(tp): AdminResult(code) for tp, code in codes.items()}

    async def alter_scram_credentials(
        self, upsertions: Sequence[ScramUpsertion], deletions: Sequence[tuple[str, str]]
    ) -> Sequence[UserResult]:
        try:
            return await self.call("alter_scram_credentials", list(upsertions), list(deletions))
        except RaylogError as exc:  # every user named gets the failure
            named = dict.fromkeys(change[0] for change in (*deletions, *upsertions))
            return [(user, exc.error_code, one_line(exc)) for user in named]

    async def describe_scram_credentials(
        self, users: Sequence[str] | None
    ) -> tuple[AdminResult, Sequence[ScramUserDescription]]:
        wanted = None if users is None else list(users)
        return await self._described("describe_scram_credentials", wanted)

    async def create_acls(
        self, creations: Sequence[acls_.AclBinding]
    ) -> Sequence[acls_.CreationResult]:
        try:
            return await self.call("create_acls", list(creations))
        except RaylogError as exc:  # every creation gets the failure
            return [(exc.error_code, one_line(exc))] * len(creations)

    async def describe_acls(
        self, acl_filter: acls_.AclBindingFilter
    ) -> tuple[AdminResult, Sequence[acls_.AclBinding]]:
        return await self._described("describe_acls", acl_filter)

    async def _described(self, method: str, *args: Any) -> tuple[AdminResult, Any]:
        """A describing ``method``'s answer, or the failure to ask it and nothing found."""
        try:
            found = await self.call(method, *args)
        except RaylogError as exc:
            return AdminResult(exc.error_code, one_line(exc)), []
        return AdminResult(ErrorCode.NONE), found

    async def delete_acls(
        self, filters: Sequence[acls_.AclBindingFilter]
    ) -> Sequence[acls_.DeletionResult]:
        try:
            return await self.call("delete_acls", list(filters))
        except RaylogError as exc:  # every filter gets the failure
            return [acls_.DeletionResult(exc.error_code, one_line(exc), ())] * len(filters)

    async def alter_client_quotas(
        self, entries: Sequence[ClientQuotaEntry], validate_only: bool
    ) -> Sequence[EntityResult]:
        wire = [(list(e.entity), list(e.ops)) for e in entries]
        try:
            return await self.call("alter_client_quotas", wire, validate_only)
        except RaylogError as exc:  # every entry gets the failure
            return [EntityResult(e.entity, exc.error_code, one_line(exc)) for e in entries]

    async def describe_client_quotas(
        self, components: Sequence[tuple[str, int, str | None]], strict: bool
    ) -> DescribeResult:
        try:
            return await self.call("describe_client_quotas", list(components), strict)
        except RaylogError as exc:
            return DescribeResult(exc.error_code, one_line(exc), [])

    async def init_producer_id(self) -> ProducerIdResult:
        """A fresh producer id from this gateway's block (a new block from the controller when
        it is used up); COORDINATOR_LOAD_IN_PROGRESS (14, retriable) when none can be had."""
        try:
            producer_id = await self._producer_ids.next_id()
        except (RaylogError, TimeoutError, ray.exceptions.RayError) as exc:
            return ProducerIdResult(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, message=str(exc))
        return ProducerIdResult(ErrorCode.NONE, producer_id, 0)

    async def _allocate_producer_ids(self) -> tuple[int, int]:
        first, count = await self.call("allocate_producer_ids")
        return int(first), int(count)

    async def call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on the active controller; raises RaylogError with Kafka's code
        (step 1 of the module docstring)."""
        if self._controller is None:
            raise NotControllerError("this gateway was started without a controller to ask")
        for attempt in (1, 2):
            handle = await self._controller.active_controller(refresh=attempt > 1)
            if handle is None:
                raise NotControllerError("no active controller found; retry")
            try:
                return await ray_call(getattr(handle, method).remote(*args), ADMIN_CALL_TIMEOUT_MS)
            except (NotControllerError, BrokerNotAvailableError):
                if attempt == 2:
                    raise
            except RaylogError:
                raise
            except RayTaskError as exc:  # a bug in the controller: answer, do not drop the client
                log.error("controller failed in %s: %s", method, exc)
                raise RaylogError(f"controller failed in {method}: {one_line(exc)}") from exc
        raise AssertionError("unreachable")

    async def _wait_view(
        self,
        done: Callable[[Mapping[str, TopicState]], bool],
        timeout_ms: int,
        what: str,
    ) -> AdminResult:
        """Step 4 of the module docstring: wait until ``done`` holds for this broker's
        metadata, bounded by ``timeout_ms``."""
        if timeout_ms <= 0:
            return AdminResult(ErrorCode.NONE)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while not done(self.metadata.topics()):  # bounded by the deadline
            if loop.time() >= deadline:
                return AdminResult(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"{what} not in this broker's metadata after {timeout_ms} ms",
                )
            await asyncio.sleep(VIEW_POLL_S)
        return AdminResult(ErrorCode.NONE)
