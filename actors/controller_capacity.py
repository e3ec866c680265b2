"""The controller's capacity requests, mixed into :class:`raylog.actors.controller.ControllerActor`.

This module owns carrying out ``actors/control/capacity.py``'s decisions on the active
controller: when CreateTopics does not fit the brokers present and Ray's autoscaler runs
(``actors/autoscaler.py``), ask it for the ``raylog`` nodes the topic needs and answer
with the pending form of the refusal (``storage.errors.capacity_pending``), which the gateway
and `raylog topics create` ask again on; and, in the reconcile loop, clear the request once the
brokers have joined or its time is up (``autoscaler.request.timeout.ms``). A controller that
takes over clears what its predecessor may have left standing, once, if an autoscaler runs.

The host class provides ``_require_active``, ``_broker_config`` and ``_epoch``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from raylog.actors import autoscaler
from raylog.actors.calls import monotonic_ms
from raylog.actors.control import capacity, config_keys
from raylog.actors.control import metadata as md_
from raylog.actors.control.metadata_store import VersionedMetadata
from raylog.storage.errors import RaylogError, capacity_pending, one_line

log = logging.getLogger(__name__)


class CapacityRequests:
    """See the module docstring (a mixin)."""

    _broker_config: config_keys.BrokerConfig
    _epoch: int | None
    _capacity_request: capacity.CapacityRequest | None
    _capacity_epoch: int | None  # the controller epoch whose takeover clear has run
    _require_active: Callable[[], VersionedMetadata]

    async def _ask_capacity(
        self,
        refusal: RaylogError,
        new_replicas: int,
        replication_factor: int,
        free_mib: Sequence[float | None],
        per_replica_mib: float,
    ) -> RaylogError:
        """The error to answer a creation refused for ``refusal`` with: its pending form once
        the autoscaler has been asked for nodes, else ``refusal`` itself (no autoscaler, the
        config at 0, or no number of nodes would do)."""
        timeout_ms = self._broker_config.autoscaler_request_timeout_ms
        if timeout_ms <= 0 or await asyncio.to_thread(autoscaler.autoscaler_kind) is None:
            return refusal
        more = capacity.more_nodes(new_replicas, replication_factor, free_mib, per_replica_mib)
        if more is None:
            return refusal
        had = len(free_mib)
        now = monotonic_ms()
        before = self._capacity_request
        request = capacity.renew(before, had + max(more, 1), had, now, timeout_ms)
        if before is None or request.nodes != before.nodes:
            await asyncio.to_thread(autoscaler.request_raylog_nodes, request.nodes)
            log.info(
                "asked Ray's autoscaler for %d raylog nodes (%d brokers take replicas): %s",
                request.nodes,
                had,
                one_line(refusal),
            )
        self._capacity_request = request
        return capacity_pending(refusal, capacity.pending_message(one_line(refusal), request, now))

    async def _capacity_round(self) -> None:
        """The reconcile loop's part (module docstring)."""
        if self._capacity_epoch != self._epoch:
            self._capacity_epoch = self._epoch
            asking = self._broker_config.autoscaler_request_timeout_ms > 0
            if (
                self._capacity_request is None
                and asking
                and await asyncio.to_thread(autoscaler.autoscaler_kind) is not None
            ):
                await asyncio.to_thread(autoscaler.request_raylog_nodes, 0)
            return
        request = self._capacity_request
        if request is None:
            return
        active = len(md_.active_brokers(self._require_active().metadata))
        why = capacity.request_done(request, active, monotonic_ms())
        if why is None:
            return
        await asyncio.to_thread(autoscaler.request_raylog_nodes, 0)
        self._capacity_request = None
        log.info(
            "request to Ray's autoscaler for %d raylog nodes cleared: %s (%d brokers take "
            "replicas)",
            request.nodes,
            why,
            active,
        )

    def _capacity_status(self) -> str:
        """The standing request for `raylog status` ("" when none)."""
        request = self._capacity_request
        if request is None:
            return ""
        left_s = max(0, request.expires_ms - monotonic_ms()) / 1000
        return f"{request.nodes} raylog nodes asked of Ray's autoscaler, {left_s:.0f} s left"


def free_mib_of(
    md: md_.ClusterMetadata,
    node_of: Mapping[int, str],
    node_memory_mib: Mapping[str, float],
    per_replica_mib: float,
) -> list[float | None]:
    """``capacity.free_per_broker`` for the brokers that take new replicas in ``md``."""
    brokers = [b.broker_id for b in md_.active_brokers(md)]
    assignment = [p.replicas for _, p in md_.partitions(md)]
    return capacity.free_per_broker(brokers, node_of, node_memory_mib, assignment, per_replica_mib)
