"""The controller lease: who is the active controller, decided through one object-store key.

This module owns the lease record and the decision logic, :class:`LeaseLogic`, a pure state
machine: it imports no clock, thread, boto3 or randomness. Time comes in as arguments
(``now_ms`` from a monotonic clock, ``wall_ms`` for display only) and store results come in
through :meth:`LeaseLogic.on_result`; it answers with the next action to carry out. The thread
that carries them out against a real store is :class:`raylog.storage.leasekeeper.LeaseKeeper`.

Protocol (as klite does it, with real epochs):

- Acquire: ``put_if_absent`` of ``{holder, epoch: 1, ...}`` when no lease object exists.
- Renew: every ``renew_ms`` the holder writes new content (``renewals`` + 1) with ``If-Match``
  on its last ETag. A 412 means someone else took over: demote at once.
- Take over: a contender that has seen the SAME ETag for ``lease_ms`` of its OWN monotonic time
  writes ``epoch + 1`` with ``If-Match`` on that ETag. Clocks of different machines are never
  compared; ``renewed_at_ms`` in the record is the holder's wall clock, for people only.
- Release: on a graceful stop the holder first stops acting as holder, then writes a released
  marker (same epoch, ``released: true``) with ``If-Match``; a contender seeing it takes over at
  its next poll instead of waiting ``lease_ms``. Release rewrites rather than deletes the object,
  so epochs keep growing across controllers. (Never delete the lease object by hand: the next
  acquirer would start again at epoch 1.)

Why the holder always demotes strictly before anyone else can win:

  Let a successful write (acquire, takeover or renewal) be SENT by the holder at time ``s`` of
  its own clock (the ``now_ms`` at which this class returned the action, which is no later than
  the moment the request leaves). The holder's deadline is ``s + lease_ms - guard_ms``; it
  renews every ``renew_ms`` and, without a newer successful renewal, :meth:`is_holder` turns
  false at the deadline, whether or not the driver thread is running at that moment.
  A taker can only replace that version with ``If-Match`` on its ETag. It starts counting when it
  first RECEIVES a read reply showing that version (not when it sent the read: a read sent
  before the holder's write may still return it). That reply comes after the store applied the
  write, which is after the holder sent it: ``first_seen >= s``. It then waits
  ``max(its lease_ms, the record's lease_ms) >= lease_ms`` more, so its takeover is sent no
  earlier than ``s + lease_ms > s + lease_ms - guard_ms`` = the holder's deadline. If the holder
  renewed meanwhile, the ETag changed and the takeover fails with 412.
  ``guard_ms`` (default 10 % of ``lease_ms``) covers clocks on two machines running at slightly
  different rates; on one machine the argument holds with ``guard_ms = 0``.

  The same argument covers writes whose outcome is unknown (a timeout): if a read later shows
  exactly the content we tried to write, we adopt it with the deadline counted from when that
  write was SENT; otherwise we treat it like anyone else's version.

Limits: ``lease_ms >= 2 * renew_ms`` (at least one retry before the deadline), and
``lease_ms - guard_ms > renew_ms``. Defaults: lease 15 s, renew 5 s, poll 2 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from raylog.storage.errors import InvalidConfigError, KafkaStorageError

LEASE_MS_DEFAULT: Final = 15_000
RENEW_MS_DEFAULT: Final = 5_000
POLL_MS_DEFAULT: Final = 2_000


class LeaseRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """The content of the lease object (JSON).

    ``renewals`` grows on every write by the same holder, so every write has new content: S3's
    ETag is the MD5 of the content, and an unchanged ETag must mean an unchanged version.
    """

    holder: str
    epoch: int
    lease_ms: int
    renewed_at_ms: int  # holder's wall clock at the write; informational only, never compared
    renewals: int = 0
    released: bool = False


def encode_record(record: LeaseRecord) -> bytes:
    return msgspec.json.encode(record)


def decode_record(body: bytes) -> LeaseRecord:
    """Decode a lease object; unreadable content is corrupt storage, not a lost race."""
    try:
        return msgspec.json.decode(body, type=LeaseRecord)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise KafkaStorageError(f"corrupt lease object: {e}: {body[:200]!r}") from e


# -- actions: what the driver must do next ------------------------------------------------


@dataclass(frozen=True)
class Read:
    """Get the lease object; answer with ``Found`` or ``Absent`` (or ``Failed``)."""


@dataclass(frozen=True)
class Acquire:
    """``put_if_absent(key, body)``."""

    body: bytes
    epoch: int


@dataclass(frozen=True)
class TakeOver:
    """``put_if_match(key, body, etag)``: replace an expired or released lease."""

    body: bytes
    etag: str
    epoch: int


@dataclass(frozen=True)
class Renew:
    """``put_if_match(key, body, etag)``: extend our own lease."""

    body: bytes
    etag: str


@dataclass(frozen=True)
class Release:
    """``put_if_match(key, body, etag)`` of the released marker; we already stopped holding."""

    body: bytes
    etag: str


@dataclass(frozen=True)
class Wait:
    """Nothing to do before ``until_ms`` (monotonic); call ``next_action`` again then."""

    until_ms: int


@dataclass(frozen=True)
class Elected:
    """Tell the owner it now holds the lease at ``epoch``. No I/O; call ``next_action`` again."""

    epoch: int


@dataclass(frozen=True)
class Demoted:
    """Tell the owner it no longer holds the lease. No I/O; call ``next_action`` again.
    ``stopping``: it gave the lease up because it was asked to stop (not lost)."""

    epoch: int
    stopping: bool = False


@dataclass(frozen=True)
class Stopped:
    """Stop was requested and is complete; the driver exits."""


Action = Read | Acquire | TakeOver | Renew | Release | Wait | Elected | Demoted | Stopped
StoreAction = Read | Acquire | TakeOver | Renew | Release

# -- results: what the store answered ------------------------------------------------------


@dataclass(frozen=True)
class Found:
    """A read found the object."""

    body: bytes
    etag: str


@dataclass(frozen=True)
class Absent:
    """A read found no object."""


@dataclass(frozen=True)
class Written:
    """A conditional write succeeded with this new ETag."""

    etag: str


@dataclass(frozen=True)
class Conflict:
    """A conditional write lost: 412 (``PreconditionFailedError``)."""


@dataclass(frozen=True)
class Failed:
    """The store failed or timed out (``ObjectStoreError``); a write's outcome is unknown."""

    reason: str


Result = Found | Absent | Written | Conflict | Failed


@dataclass(frozen=True)
class _Observed:
    """A version of the lease object seen by this contender, and when (its own clock)."""

    etag: str
    record: LeaseRecord
    first_seen_ms: int


@dataclass(frozen=True)
class _Attempt:
    """A write we sent whose outcome we have not learned yet, or learned was unknown."""

    record: LeaseRecord
    sent_ms: int


class LeaseLogic:
    """The lease state machine for one contender, ``holder_id`` (unique per process lifetime).

    Drive it as: ``action = next_action(now_ms, wall_ms)``; carry out store actions and report
    with ``on_result(now_ms, result)`` (``now_ms`` read AFTER the reply arrived); notify on
    ``Elected``/``Demoted``; sleep on ``Wait``; exit on ``Stopped``. Exactly one store action
    is outstanding at a time.
    """

    def __init__(
        self,
        holder_id: str,
        *,
        lease_ms: int = LEASE_MS_DEFAULT,
        renew_ms: int = RENEW_MS_DEFAULT,
        poll_ms: int = POLL_MS_DEFAULT,
        guard_ms: int | None = None,
    ) -> None:
        if guard_ms is None:
            guard_ms = lease_ms // 10
        if not holder_id:
            raise InvalidConfigError("lease holder id must be non-empty")
        if renew_ms <= 0 or poll_ms <= 0 or guard_ms < 0:
            raise InvalidConfigError(
                f"lease renew_ms ({renew_ms}) and poll_ms ({poll_ms}) must be positive and "
                f"guard_ms ({guard_ms}) non-negative"
            )
        if lease_ms < 2 * renew_ms:
            raise InvalidConfigError(
                f"lease_ms ({lease_ms}) must be at least 2 * renew_ms ({renew_ms}), so that a "
                "holder can retry a failed renewal before its lease runs out"
            )
        if lease_ms - guard_ms <= renew_ms:
            raise InvalidConfigError(
                f"lease_ms - guard_ms ({lease_ms} - {guard_ms}) must exceed renew_ms ({renew_ms})"
            )
        self.holder_id: Final = holder_id
        self.lease_ms: Final = lease_ms
        self.renew_ms: Final = renew_ms
        self.poll_ms: Final = poll_ms
        self.guard_ms: Final = guard_ms

        self._pending: StoreAction | None = None
        self._pending_sent_ms = 0
        self._notice: Elected | Demoted | None = None
        self._stop_requested = False
        self._release_on_stop = True
        self._stopped = False

        # Holder state. Invariant: _holding implies _etag and _record describe our latest
        # successful write, and _deadline_ms = its send time + lease_ms - guard_ms.
        self._holding = False
        self._record: LeaseRecord | None = None
        self._etag: str | None = None
        self._held_since_ms: int | None = None
        self._deadline_ms = 0
        self._next_renew_ms = 0
        self._pending_release: Release | None = None

        # Contender state. _observed is None until a read is answered (or after a lost write).
        self._observed: _Observed | None = None
        self._absent_seen = False
        self._next_read_ms = 0
        # A write whose outcome is unknown: the next read checks whether it landed.
        self._uncertain: _Attempt | None = None

    # -- queries -------------------------------------------------------------------------

    def is_holder(self, now_ms: int) -> bool:
        """True while this contender holds the lease: elected and ``now_ms`` before deadline.

        Judged from time, not from the driver having run: a holder whose thread is stuck in a
        store call stops being holder at its deadline all the same.
        """
        return self._holding and now_ms < self._deadline_ms

    @property
    def epoch(self) -> int | None:
        """The epoch we hold, or None when not holding."""
        return self._record.epoch if self._holding and self._record else None

    @property
    def hold_until_ms(self) -> int | None:
        """Monotonic time at which our hold ends unless renewed; None when not holding."""
        return self._deadline_ms if self._holding else None

    @property
    def held_since_ms(self) -> int | None:
        """Monotonic time at which we learned we won the current epoch; None when not holding."""
        return self._held_since_ms if self._holding else None

    @property
    def observed(self) -> tuple[str, int] | None:
        """(holder, epoch) of the lease version a contender last read; None if none read yet."""
        if self._observed is None:
            return None
        return self._observed.record.holder, self._observed.record.epoch

    @property
    def stopped(self) -> bool:
        return self._stopped

    # -- inputs --------------------------------------------------------------------------

    def request_stop(self, *, release: bool = True) -> None:
        """Stop contending; if holding, demote and (with ``release``) write the released marker."""
        self._stop_requested = True
        self._release_on_stop = release

    def next_action(self, now_ms: int, wall_ms: int) -> Action:
        if self._pending is not None:
            raise RuntimeError(f"next_action while {self._pending!r} awaits its result")
        if self._notice is not None:
            notice, self._notice = self._notice, None
            return notice
        if self._holding and now_ms >= self._deadline_ms:
            # Renewals did not succeed in time: we are out, whatever the store says.
            return self._demote()
        if self._stop_requested:
            return self._next_stop_action(now_ms, wall_ms)
        if self._holding:
            return self._next_holder_action(now_ms, wall_ms)
        return self._next_contender_action(now_ms, wall_ms)

    def on_result(self, now_ms: int, result: Result) -> None:
        """Report the answer to the outstanding store action; ``now_ms`` read after the reply."""
        action, sent_ms = self._pending, self._pending_sent_ms
        if action is None:
            raise RuntimeError(f"result {result!r} without an outstanding store action")
        self._pending = None
        if isinstance(action, Read):
            self._on_read(now_ms, result)
        elif isinstance(action, Release):
            self._stopped = True  # whatever happened, we are done; the lease expires if it failed
        elif isinstance(action, Renew):
            self._on_renew(now_ms, sent_ms, result)
        else:
            self._on_win_attempt(now_ms, sent_ms, action, result)

    # -- decisions -----------------------------------------------------------------------

    def _send(self, action: StoreAction, now_ms: int) -> StoreAction:
        self._pending, self._pending_sent_ms = action, now_ms
        return action

    def _demote(self, *, stopping: bool = False) -> Demoted:
        assert self._record is not None
        self._holding = False
        # Re-read before contending again, and forget a renewal of unknown outcome: if it
        # landed, its version expires like anyone else's and we take over with epoch + 1.
        self._observed, self._absent_seen, self._uncertain = None, False, None
        return Demoted(self._record.epoch, stopping)

    def _notify(self, notice: Elected | Demoted) -> None:
        # Invariant: at most one notice waits. Each result queues at most one, and next_action
        # hands it out before returning any further store action.
        if self._notice is not None:  # checked with -O too
            raise AssertionError(f"notice {notice!r} while {self._notice!r} still waits")
        self._notice = notice

    def _next_stop_action(self, now_ms: int, wall_ms: int) -> Action:
        if self._holding:
            # 1. stop holding (is_holder is false from here on), 2. tell the owner,
            # 3. only then write the released marker that lets a contender in at once.
            assert self._record is not None and self._etag is not None
            marker = msgspec.structs.replace(
                self._record,
                renewals=self._record.renewals + 1,
                renewed_at_ms=wall_ms,
                released=True,
            )
            if self._release_on_stop:
                self._pending_release = Release(encode_record(marker), self._etag)
            return self._demote(stopping=True)
        if self._pending_release is not None:
            release, self._pending_release = self._pending_release, None
            return self._send(release, now_ms)
        self._stopped = True
        return Stopped()

    def _next_holder_action(self, now_ms: int, wall_ms: int) -> Action:
        assert self._record is not None and self._etag is not None
        if self._uncertain is not None:
            # A renewal's outcome is unknown; renewing again with the old ETag would fail if it
            # had landed, so first read what is there (after a pause if reads are failing).
            if now_ms < self._next_read_ms:
                return Wait(min(self._next_read_ms, self._deadline_ms))
            return self._send(Read(), now_ms)
        if now_ms < self._next_renew_ms:
            return Wait(min(self._next_renew_ms, self._deadline_ms))
        record = msgspec.structs.replace(
            self._record, renewals=self._record.renewals + 1, renewed_at_ms=wall_ms
        )
        self._uncertain = _Attempt(record, now_ms)
        return self._send(Renew(encode_record(record), self._etag), now_ms)

    def _next_contender_action(self, now_ms: int, wall_ms: int) -> Action:
        if self._uncertain is not None:
            # A write of unknown outcome: read what is there before writing again (after a
            # pause, as the store is failing).
            if now_ms < self._next_read_ms:
                return Wait(self._next_read_ms)
            return self._send(Read(), now_ms)
        observed = self._observed
        if observed is not None:
            # Expiry is judged only by our own clock since we first saw this ETag.
            expires_ms = observed.first_seen_ms + max(self.lease_ms, observed.record.lease_ms)
            if observed.record.released or now_ms >= expires_ms:
                epoch = observed.record.epoch + 1
                record = LeaseRecord(self.holder_id, epoch, self.lease_ms, wall_ms)
                self._uncertain = _Attempt(record, now_ms)
                return self._send(TakeOver(encode_record(record), observed.etag, epoch), now_ms)
            if now_ms >= self._next_read_ms:
                return self._send(Read(), now_ms)
            return Wait(min(self._next_read_ms, expires_ms))
        if self._absent_seen:  # the last read found no lease object: create it
            record = LeaseRecord(self.holder_id, 1, self.lease_ms, wall_ms)
            self._uncertain = _Attempt(record, now_ms)
            return self._send(Acquire(encode_record(record), 1), now_ms)
        if now_ms < self._next_read_ms:
            return Wait(self._next_read_ms)  # pausing after a failed read or a failed write
        return self._send(Read(), now_ms)

    # -- results -------------------------------------------------------------------------

    def _become_holder(self, now_ms: int, attempt: _Attempt, etag: str) -> None:
        self._holding = True
        self._record, self._etag = attempt.record, etag
        self._held_since_ms = now_ms
        self._deadline_ms = attempt.sent_ms + self.lease_ms - self.guard_ms
        self._next_renew_ms = attempt.sent_ms + self.renew_ms
        self._notify(Elected(attempt.record.epoch))

    def _on_win_attempt(
        self, now_ms: int, sent_ms: int, action: StoreAction, result: Result
    ) -> None:
        """Result of Acquire or TakeOver."""
        attempt = self._uncertain
        if attempt is None or attempt.sent_ms != sent_ms:  # checked with -O too
            raise AssertionError(f"result for a write sent at {sent_ms} but tracking {attempt!r}")
        if isinstance(result, Written):
            self._observed, self._absent_seen = None, False
            self._uncertain = None
            if attempt.sent_ms + self.lease_ms - self.guard_ms <= now_ms:
                self._next_read_ms = now_ms  # won, but answered too late to hold: let it expire
                return
            self._become_holder(now_ms, attempt, result.etag)
        elif isinstance(result, Conflict):
            self._observed, self._absent_seen = None, False
            self._uncertain = None  # someone else won; read who
            self._next_read_ms = now_ms
        elif isinstance(result, Failed):
            # Keep _uncertain: the next read tells whether it landed. Keep the observation too:
            # a read still showing the version first seen at ``first_seen_ms`` is the same
            # version, expired by then, and is taken over at once rather than counted afresh.
            self._next_read_ms = now_ms + self.poll_ms
        else:
            raise RuntimeError(f"unexpected result {result!r} for {action!r}")

    def _on_renew(self, now_ms: int, sent_ms: int, result: Result) -> None:
        attempt = self._uncertain
        if attempt is None or attempt.sent_ms != sent_ms:  # checked with -O too
            raise AssertionError(f"result for a write sent at {sent_ms} but tracking {attempt!r}")
        if isinstance(result, Written):
            self._uncertain = None
            if now_ms >= self._deadline_ms:
                # The hold lapsed while we waited for this answer. A lapsed hold never resumes
                # (is_holder already said false); our version expires like anyone else's.
                self._notify(self._demote())
                return
            self._etag, self._record = result.etag, attempt.record
            self._deadline_ms = sent_ms + self.lease_ms - self.guard_ms
            self._next_renew_ms = sent_ms + self.renew_ms
        elif isinstance(result, Conflict):
            self._uncertain = None
            self._notify(self._demote())  # another contender took over
        elif isinstance(result, Failed):
            # Keep holding until the deadline; find out at once whether the write landed.
            self._next_read_ms = now_ms
        else:
            raise RuntimeError(f"unexpected result {result!r} for a renewal")

    def _on_read(self, now_ms: int, result: Result) -> None:
        if isinstance(result, Failed):
            self._next_read_ms = now_ms + min(self.poll_ms, self.renew_ms)
            return
        attempt, self._uncertain = self._uncertain, None
        if isinstance(result, Absent):
            if self._holding:
                self._notify(self._demote())  # our lease object was deleted
            self._observed, self._absent_seen = None, True
            self._next_read_ms = now_ms + self.poll_ms
            return
        if not isinstance(result, Found):
            raise RuntimeError(f"unexpected result {result!r} for a read")
        record = decode_record(result.body)
        if (
            attempt is not None
            and record == attempt.record
            and attempt.sent_ms + self.lease_ms - self.guard_ms > now_ms
        ):
            # Our write of unknown outcome landed and its deadline, counted from when it was
            # sent, has not passed: adopt it. (A lapsed hold is never resumed, see _on_renew.)
            if self._holding and now_ms < self._deadline_ms:
                self._etag, self._record = result.etag, attempt.record
                self._deadline_ms = attempt.sent_ms + self.lease_ms - self.guard_ms
                self._next_renew_ms = attempt.sent_ms + self.renew_ms
                return
            if not self._holding:
                self._become_holder(now_ms, attempt, result.etag)
                return
        if self._holding:
            if result.etag == self._etag:
                self._next_renew_ms = now_ms  # the renewal did not land: renew again now
                return
            self._notify(self._demote())  # someone else wrote the lease
        previous = self._observed
        if previous is None or previous.etag != result.etag:
            # A new version: its lease_ms starts now, when we first saw it (see docstring).
            self._observed = _Observed(result.etag, record, now_ms)
        self._absent_seen = False
        self._next_read_ms = now_ms + self.poll_ms
