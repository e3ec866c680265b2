"""``internal_topic.KeyLocks``: one lock per key, the same one while it is in use, and a table
that does not keep keys the coordinator no longer knows (unless a request holds their lock)."""

from __future__ import annotations

import asyncio

from raylog.gateway.internal_topic import KeyLocks


def test_a_key_keeps_its_lock_until_it_is_pruned_or_discarded() -> None:
    async def run() -> None:
        locks = KeyLocks()
        held, free, known = locks("held"), locks("free"), locks("known")
        assert locks("held") is held
        await held.acquire()
        locks.prune(lambda key: key == "known")
        assert locks("held") is held  # in use: kept
        assert locks("known") is known  # known: kept
        assert locks("free") is not free  # neither: forgotten, a new lock now
        locks.discard("held")
        assert locks("held") is not held
        held.release()

    asyncio.run(run())
