"""The lease driver: carries out :class:`~raylog.storage.lease.LeaseLogic`'s actions on a store.

This module owns the clock, the thread and the store calls; every decision is the logic's (see
:mod:`raylog.storage.lease` for the protocol and the demote-before-takeover argument). Two ways
to run it:

- ``keeper.start()`` runs it in a daemon thread until ``keeper.stop()``; the owner learns of
  changes through ``on_elected(epoch)`` / ``on_demoted()`` (called from that thread) and asks
  ``keeper.is_holder()`` before acting as the controller;
- ``keeper.step()`` runs one action synchronously and returns how long to wait before the next,
  for owners with their own loop (and tests).

Usage by the controller actor::

    keeper = LeaseKeeper(store, holder_id=f"controller-{node_id}-{uuid4()}",
                         on_elected=become_active, on_demoted=become_standby)
    keeper.start()
    ...
    if keeper.is_holder():           # fence every metadata write with this check
        write_metadata(epoch=keeper.epoch)
    ...
    keeper.stop()                    # graceful: releases, so a standby takes over at once
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from raylog.storage.errors import ObjectStoreError, PreconditionFailedError
from raylog.storage.lease import (
    LEASE_MS_DEFAULT,
    POLL_MS_DEFAULT,
    RENEW_MS_DEFAULT,
    Absent,
    Acquire,
    Conflict,
    Demoted,
    Elected,
    Failed,
    Found,
    LeaseLogic,
    Read,
    Release,
    Renew,
    Result,
    Stopped,
    TakeOver,
    Wait,
    Written,
)
from raylog.storage.objectstore import ObjectStore

logger = logging.getLogger(__name__)

LEASE_KEY_DEFAULT = "controller/lease"
_STOP_STEPS_MAX = 8  # demote, release, stopped: a stop completes in a few steps
_WAIT_MS_MAX = 60_000  # never sleep longer than this in one go, whatever the logic says


class Hold(NamedTuple):
    """The lease as held by this keeper; times are this machine's monotonic ms."""

    epoch: int
    since_ms: int  # when the epoch was won
    until_ms: int  # when the hold ends unless renewed


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class LeaseKeeper:
    """Holds, renews and releases the lease object ``key`` in ``store`` for ``holder_id``."""

    def __init__(
        self,
        store: ObjectStore,
        holder_id: str,
        *,
        key: str = LEASE_KEY_DEFAULT,
        lease_ms: int = LEASE_MS_DEFAULT,
        renew_ms: int = RENEW_MS_DEFAULT,
        poll_ms: int = POLL_MS_DEFAULT,
        guard_ms: int | None = None,
        on_elected: Callable[[int], None] | None = None,
        on_demoted: Callable[[], None] | None = None,
        clock_ms: Callable[[], int] = monotonic_ms,
        wall_clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self._store = store
        self._key = key
        self._logic = LeaseLogic(
            holder_id, lease_ms=lease_ms, renew_ms=renew_ms, poll_ms=poll_ms, guard_ms=guard_ms
        )
        self._on_elected = on_elected
        self._on_demoted = on_demoted
        self._clock_ms = clock_ms
        self._wall_clock_ms = wall_clock_ms
        # Guards _logic: step() runs in the keeper thread while is_holder() is called from others.
        # Never held during a store call.
        self._lock = threading.Lock()
        self._step_lock = threading.Lock()  # one step at a time, thread or caller
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None  # what ended the thread, if not a stop

    # -- queries (any thread) ------------------------------------------------------------

    @property
    def holder_id(self) -> str:
        return self._logic.holder_id

    def is_holder(self) -> bool:
        """True while we hold the lease; turns false at the deadline even if the thread hangs."""
        with self._lock:
            return self._logic.is_holder(self._clock_ms())

    @property
    def epoch(self) -> int | None:
        """The epoch held, or None when not holding (check ``is_holder()`` before relying on it)."""
        with self._lock:
            return self._logic.epoch if self._logic.is_holder(self._clock_ms()) else None

    def hold(self) -> Hold | None:
        """A consistent snapshot of the current hold, or None when not holding.

        ``until_ms`` may already be in the past if the keeper thread has not yet noticed; use
        :meth:`is_holder` to decide whether to act.
        """
        with self._lock:
            epoch = self._logic.epoch
            since_ms, until_ms = self._logic.held_since_ms, self._logic.hold_until_ms
        if epoch is None or since_ms is None or until_ms is None:
            return None
        return Hold(epoch, since_ms, until_ms)

    @property
    def observed(self) -> tuple[str, int] | None:
        """(holder, epoch) of the lease as last read while contending; None before any read."""
        with self._lock:
            return self._logic.observed

    # -- synchronous driving -------------------------------------------------------------

    def step(self) -> int | None:
        """Carry out the next action. Return ms to wait before the next step, None once stopped.

        Store failures are results, not exceptions; anything else raised here (a corrupt lease
        object, a bug) propagates and the caller should stop using this keeper.
        """
        with self._step_lock:
            with self._lock:
                now_ms = self._clock_ms()
                action = self._logic.next_action(now_ms, self._wall_clock_ms())
            if isinstance(action, Wait):
                return max(0, min(action.until_ms - now_ms, _WAIT_MS_MAX))
            if isinstance(action, Stopped):
                return None
            if isinstance(action, Elected):
                logger.info(
                    "%s holds the lease %s at epoch %d", self.holder_id, self._key, action.epoch
                )
                self._notify(self._on_elected, action.epoch)
                return 0
            if isinstance(action, Demoted):
                if action.stopping:
                    logger.info(
                        "%s gives up the lease %s (epoch %d): stopping",
                        self.holder_id,
                        self._key,
                        action.epoch,
                    )
                else:
                    logger.warning(
                        "%s lost the lease %s (epoch %d)", self.holder_id, self._key, action.epoch
                    )
                self._notify(self._on_demoted)
                return 0
            result = self._execute(action)
            with self._lock:
                self._logic.on_result(self._clock_ms(), result)  # clock read after the reply
            return 0

    def _execute(self, action: Read | Acquire | TakeOver | Renew | Release) -> Result:
        try:
            if isinstance(action, Read):
                found = self._store.get(self._key)
                return Absent() if found is None else Found(found.body, found.etag)
            if isinstance(action, Acquire):
                return Written(self._store.put_if_absent(self._key, action.body))
            return Written(self._store.put_if_match(self._key, action.body, action.etag))
        except PreconditionFailedError:
            return Conflict()
        except ObjectStoreError as e:
            logger.warning("lease %s: %s failed: %s", self._key, type(action).__name__, e)
            return Failed(str(e))

    def _notify(self, callback: Callable[..., None] | None, *args: int) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:  # the owner's bug must not stop the lease from being renewed/dropped
            logger.exception("lease callback %r failed", callback)

    # -- background thread ---------------------------------------------------------------

    def start(self) -> None:
        """Run the lease in a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            raise RuntimeError("LeaseKeeper.start() called twice")
        self._thread = threading.Thread(
            target=self._run, name=f"lease-{self.holder_id}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:  # ends when the logic reports Stopped, i.e. after stop()
                wait_ms = self.step()
                if wait_ms is None:
                    return
                if wait_ms > 0 and self._wake.wait(wait_ms / 1000):
                    self._wake.clear()
        except BaseException as e:
            self.failure = e
            logger.exception(
                "lease thread of %s failed; it no longer holds the lease", self.holder_id
            )
            with self._lock:
                was_holder = self._logic.is_holder(self._clock_ms())
                self._logic.request_stop(release=False)
            if was_holder:
                self._notify(self._on_demoted)

    def stop(self, *, release: bool = True, timeout_s: float = 10.0) -> None:
        """Stop contending. If holding: demote (``on_demoted``), then with ``release`` write the
        released marker so that a standby takes over at its next poll. Waits at most
        ``timeout_s`` for the thread (or runs the few remaining steps here without one)."""
        with self._lock:
            self._logic.request_stop(release=release)
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("lease thread of %s did not stop in %s s", self.holder_id, timeout_s)
            return
        for _ in range(_STOP_STEPS_MAX):
            if self.step() is None:
                return
        raise RuntimeError(f"lease keeper {self.holder_id} did not stop in {_STOP_STEPS_MAX} steps")

    def wait_until_holder(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` until we hold the lease (for tests and simple owners)."""
        deadline = time.monotonic() + timeout_s
        while not self.is_holder():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(remaining, 0.01))
        return True
