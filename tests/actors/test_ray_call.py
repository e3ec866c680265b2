"""``raylog.actors.calls.ray_call``, the one place Ray's failures become raylog's, on real Ray.

Proves: a call to an actor that was killed, or to one that can never be placed (pinned to a
node that is not there, as a restarted controller pinned to a lost node is), fails with
BrokerNotAvailableError, which every caller that tries another peer catches (a broker's
heartbeat tries the next controller); a call with no answer in time fails with
RequestTimedOutError; an error the remote method raises comes back as itself.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raylog.actors.calls import ray_call
from raylog.storage.errors import (
    BrokerNotAvailableError,
    NotControllerError,
    RequestTimedOutError,
)

pytestmark = pytest.mark.slow

NO_SUCH_NODE = "ab" * 28  # a well-formed Ray node id that no node has
CALL_TIMEOUT_MS = 30_000


@ray.remote(num_cpus=0)
class _Peer:
    async def answer(self, value: int) -> int:
        return value

    async def refuse(self) -> None:
        raise NotControllerError("not the active controller")

    async def hang(self) -> None:
        await asyncio.Event().wait()


def _call(ref: Any, timeout_ms: int = CALL_TIMEOUT_MS) -> Any:
    return asyncio.run(ray_call(ref, timeout_ms))


def test_a_peer_that_answers_and_one_that_raises(ray_local: Path) -> None:
    peer = _Peer.remote()  # type: ignore[attr-defined]
    assert _call(peer.answer.remote(7)) == 7
    with pytest.raises(NotControllerError, match="not the active controller"):
        _call(peer.refuse.remote())
    with pytest.raises(RequestTimedOutError, match="no answer within 200 ms"):
        _call(peer.hang.remote(), 200)
    ray.kill(peer)


def test_a_killed_peer_and_one_never_placed_are_not_available(ray_local: Path) -> None:
    peer = _Peer.remote()  # type: ignore[attr-defined]
    assert _call(peer.answer.remote(1)) == 1
    ray.kill(peer, no_restart=True)
    with pytest.raises(BrokerNotAvailableError, match="ActorDiedError"):
        _call(peer.answer.remote(2))
    pinned = NodeAffinitySchedulingStrategy(NO_SUCH_NODE, soft=False)
    stranded = _Peer.options(scheduling_strategy=pinned).remote()  # type: ignore[attr-defined]
    with pytest.raises(BrokerNotAvailableError, match="ActorUnschedulableError"):
        _call(stranded.answer.remote(3))
