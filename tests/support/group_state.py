"""Helpers of the group state machine's tests: a clock, and a member's JoinGroup, SyncGroup and
answers as the coordinator would pass them to :class:`raylog.gateway.groups.group.Group`."""

from __future__ import annotations

from typing import Any

from raylog.gateway.errors import ErrorCode
from raylog.gateway.groups.group import Group, JoinResult

SESSION_MS = 10_000
REBALANCE_MS = 30_000


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


def join(
    group: Group,
    clock: Clock,
    member_id: str = "",
    *,
    new_id: str = "m",
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"sub"),),
    session_ms: int = SESSION_MS,
    protocol_type: str = "consumer",
    delay_ms: int = 0,
    instance: str | None = None,
) -> JoinResult | None:
    return group.join(
        member_id=member_id,
        client_id="client",
        client_host="/127.0.0.1",
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=REBALANCE_MS,
        protocol_type=protocol_type,
        protocols=protocols,
        require_known_member_id=True,
        new_member_id=new_id,
        now_ms=clock.now_ms,
        initial_rebalance_delay_ms=delay_ms,
        group_instance_id=instance,
    )


def joined(group: Group, clock: Clock, new_id: str, **kwargs: Any) -> str:
    """Run the two-step v4+ join of a new member; returns its id (its answer may be pending)."""
    first = join(group, clock, new_id=new_id, **kwargs)
    assert first is not None and first.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert first.member_id == new_id
    assert join(group, clock, new_id, **kwargs) is None
    return new_id


def replies(group: Group) -> dict[tuple[str, str], Any]:
    return {(r.member_id, r.kind): r.result for r in group.take_replies()}


def sync(group: Group, clock: Clock, member: str, generation: int, **assign: bytes) -> Any:
    return group.sync(
        member_id=member, generation_id=generation, assignments=assign, now_ms=clock.now_ms
    )
