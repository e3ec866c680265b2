"""The one way tests wait: poll a condition until it holds or a deadline passes.

Never a fixed sleep standing in for "long enough": the condition is checked every
``interval_s`` and the wait fails with ``message`` (and the last value seen) at the deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T],
    *,
    timeout_s: float,
    interval_s: float = 0.02,
    message: str = "condition",
) -> T:
    """Return the first truthy value of ``probe()``; raise AssertionError at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout_s}s waiting for {message}; last {last!r}"
            )
        time.sleep(interval_s)


async def wait_until_async(
    probe: Callable[[], T],
    *,
    timeout_s: float,
    interval_s: float = 0.02,
    message: str = "condition",
) -> T:
    """``wait_until`` inside an event loop: polls with ``asyncio.sleep``, so the loop's own
    tasks (the code under test) run between the checks."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout_s}s waiting for {message}; last {last!r}"
            )
        await asyncio.sleep(interval_s)
