"""Controllers and brokers on the session's local Ray, driven by handle: what the controller's
real-Ray tests share.

:class:`ControllerCluster` starts two controllers (active + standby on a lease in a local
object store) and three brokers (racks a, b, c) under actor names prefixed by the test module's
own prefix, and offers the calls those tests make: the active controller (retried while the
lease moves), reconciliation, leaders, replicas, and acks=all produce. ``cluster_fixture``
starts one, waits for every broker to register, and kills its actors at the end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import ray

from raylog.actors.broker import BrokerActor
from raylog.actors.calls import NAMESPACE, broker_actor_name, controller_actor_name
from raylog.actors.controller import ControllerActor
from raylog.storage import batch as rb
from raylog.storage.errors import NotControllerError
from support.waiting import wait_until

CALL_TIMEOUT_S = 30.0
BROKERS = (1, 2, 3)
# A loaded 2-core machine can starve a renewal; 3 s keeps the lease while takeover stays short.
LEASE = {"lease_ms": 3_000, "renew_ms": 1_000, "poll_ms": 100}


def batch(i: int) -> bytes:
    """A one-record batch whose key and value say ``i``."""
    return rb.build_batch(
        [
            rb.Record(
                key=str(i).encode(), value=f"v{i}".encode() * 20, timestamp_ms=1_700_000_000_000
            )
        ]
    )


def get(ref: Any) -> Any:
    return ray.get(ref, timeout=CALL_TIMEOUT_S)


class ControllerCluster:
    """Handles to a test module's controllers and brokers."""

    def __init__(
        self,
        root: Path,
        prefix: str,
        broker_configs: Mapping[str, str],
        call_timeout_ms: int | None = None,
    ) -> None:
        self.root = root
        self.prefix = prefix
        self.broker_configs = dict(broker_configs)
        self.call_timeout_ms = call_timeout_ms
        self.controller_names = (
            f"{prefix}-{controller_actor_name(0)}",
            f"{prefix}-{controller_actor_name(1)}",
        )
        self.controllers = [self._controller(name) for name in self.controller_names]
        self.brokers: dict[int, Any] = {b: self._broker(b) for b in BROKERS}

    def _controller(self, name: str) -> Any:
        options: dict[str, Any] = {}
        if self.call_timeout_ms is not None:
            options["call_timeout_ms"] = self.call_timeout_ms
        return ControllerActor.options(name=name, namespace=NAMESPACE).remote(  # type: ignore[attr-defined]
            str(self.root / "store"),
            name,
            broker_configs=self.broker_configs,
            reconcile_interval_ms=100,
            **options,
            **LEASE,
        )

    def _broker(self, broker_id: int) -> Any:
        return BrokerActor.options(  # type: ignore[attr-defined]
            name=f"{self.prefix}-{broker_actor_name(broker_id)}", namespace=NAMESPACE
        ).remote(
            broker_id,
            str(self.root / "data"),
            rack="abc"[broker_id - 1],
            port=9090 + broker_id,
            controller_names=self.controller_names,
            broker_configs=self.broker_configs,
        )

    def statuses(self) -> list[Any]:
        out = []
        for c in self.controllers:
            try:
                out.append(ray.get(c.status.remote(), timeout=5))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                out.append(None)
        return out

    def call(self, method: str, *args: Any) -> Any:
        """Call the active controller; retried while the active one changes (lease moves)."""
        result: list[Any] = []

        def attempt() -> bool:
            try:
                result.append(get(getattr(self.active(), method).remote(*args)))
            except (NotControllerError, ray.exceptions.RayActorError):
                return False
            return True

        wait_until(attempt, timeout_s=CALL_TIMEOUT_S, message=f"controller {method}")
        return result[-1]

    def active(self) -> Any:
        def probe() -> Any:
            for c, s in zip(self.controllers, self.statuses(), strict=True):
                if s is not None and s.active:
                    return c
            return None

        return wait_until(probe, timeout_s=CALL_TIMEOUT_S, message="an active controller")

    def reconciled(self) -> int:
        def probe() -> int:
            try:
                return int(self.call("wait_reconciled", 5_000)) >= 0
            except NotControllerError:
                return False

        wait_until(probe, timeout_s=CALL_TIMEOUT_S, message="brokers reconciled")
        return 0

    def leader(self, topic: str, partition: int = 0) -> int:
        md = self.call("metadata")
        return md.topics[topic].partitions[partition].leader

    def partition(self, topic: str, partition: int = 0) -> Any:
        return self.call("metadata").topics[topic].partitions[partition]

    def replica(self, broker_id: int, topic: str, partition: int = 0) -> Any:
        return get(self.brokers[broker_id].replica.remote(topic, partition))

    def leader_replica(self, topic: str, partition: int = 0) -> Any:
        return self.replica(self.leader(topic, partition), topic, partition)

    def produce(self, topic: str, i: int, partition: int = 0) -> Any:
        return get(self.leader_replica(topic, partition).produce.remote(batch(i), -1, 5_000))


def cluster_fixture(cluster: ControllerCluster) -> Iterator[ControllerCluster]:
    """Yield ``cluster`` once a controller is active and every broker registered; kill its
    actors afterwards."""
    try:
        cluster.active()
        wait_until(
            lambda: all(
                get(b.status.remote())["broker_epoch"] > 0 for b in cluster.brokers.values()
            ),
            timeout_s=CALL_TIMEOUT_S,
            message="three brokers registered",
        )
        yield cluster
    finally:
        for handle in [*cluster.controllers, *cluster.brokers.values()]:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
