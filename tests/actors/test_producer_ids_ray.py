"""Producer-id blocks from real ControllerActors (active + standby on a lease, real Ray).

Proves: ``allocate_producer_ids`` hands out consecutive, disjoint blocks of Kafka's size; the
next free id is persisted with the metadata's CAS, so after the active controller is killed the
standby that takes over continues after every block handed out before (no id reused across a
controller failover).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import ray
from support.waiting import wait_until

from raylog.actors.calls import NAMESPACE, controller_actor_name
from raylog.actors.control.metadata import PRODUCER_ID_BLOCK_SIZE
from raylog.actors.controller import ControllerActor
from raylog.storage.errors import NotControllerError

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 30.0
LEASE = {"lease_ms": 3_000, "renew_ms": 1_000, "poll_ms": 100}


def _statuses(controllers: list[Any]) -> list[Any]:
    out = []
    for c in controllers:
        try:
            out.append(ray.get(c.status.remote(), timeout=5))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            out.append(None)
    return out


def _active(controllers: list[Any], above_epoch: int = -1) -> Any:
    def probe() -> Any:
        for c, s in zip(controllers, _statuses(controllers), strict=True):
            if s is not None and s.active and s.controller_epoch > above_epoch:
                return c, s.controller_epoch
        return None

    return wait_until(probe, timeout_s=CALL_TIMEOUT_S, message="an active controller")


def _allocate(controllers: list[Any]) -> tuple[int, int]:
    got: list[tuple[int, int]] = []

    def attempt() -> bool:
        try:
            handle, _ = _active(controllers)
            got.append(ray.get(handle.allocate_producer_ids.remote(), timeout=CALL_TIMEOUT_S))
        except (NotControllerError, ray.exceptions.RayActorError):
            return False
        return True

    wait_until(attempt, timeout_s=CALL_TIMEOUT_S, message="a producer-id block")
    return got[-1]


def test_blocks_are_disjoint_and_survive_a_controller_failover(
    ray_local: Path, tmp_path: Path
) -> None:
    names = [f"pid-test-{controller_actor_name(i)}" for i in (0, 1)]
    controllers = [
        ControllerActor.options(name=name, namespace=NAMESPACE).remote(  # type: ignore[attr-defined]
            str(tmp_path / "store"), name, reconcile_interval_ms=100, **LEASE
        )
        for name in names
    ]
    try:
        blocks = [_allocate(controllers) for _ in range(3)]
        assert [count for _, count in blocks] == [PRODUCER_ID_BLOCK_SIZE] * 3
        assert [first for first, _ in blocks] == [
            blocks[0][0] + i * PRODUCER_ID_BLOCK_SIZE for i in range(3)
        ]
        old, old_epoch = _active(controllers)
        ray.kill(old, no_restart=False)  # Ray restarts it; the standby takes over
        _active(controllers, above_epoch=old_epoch)
        first, count = _allocate(controllers)
        assert first >= blocks[-1][0] + blocks[-1][1], "an id handed out before was reused"
        assert count == PRODUCER_ID_BLOCK_SIZE
    finally:
        for handle in controllers:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
