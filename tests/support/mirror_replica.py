"""An in-memory stand-in of mirror topics' leader replicas, for tests of the link fetchers
(``gateway/links/mirrors.py``): :class:`MirrorLeaders` answers ``mirror_append`` as
``actors/replica_mirror.py`` and ``actors/replication/mirror.py`` specify it.

- The bytes go through the real :func:`~raylog.actors.replica_mirror.mirrored_batches` (whole
  batches only, CRC-32C checked, each restamped with the leader's epoch); a corrupt batch is
  CORRUPT_MESSAGE with the batches before it appended.
- Only the partition's leader epoch appends (FENCED_LEADER_EPOCH below it,
  UNKNOWN_LEADER_EPOCH above it), and only while the partition mirrors a link
  (INVALID_REQUEST "not a mirror topic").
- Batches wholly below the log end are skipped; one straddling it is INVALID_REQUEST (nothing
  appended); gaps above the log end are kept; the log start follows the source's, and a
  source log start above the log end empties the log first (every append is committed here:
  the real leader waits for its HW, and for its followers to empty theirs too).
- ``batches`` b"" asks where the log ends.

It keeps every append call (epoch, error code) so tests can see refusals and retries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from raylog.actors.calls import MirrorOutcome
from raylog.actors.replica_mirror import mirrored_batches
from raylog.storage import batch as rb

CORRUPT_MESSAGE = 2
INVALID_REQUEST = 42
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75


@dataclass
class MirrorLog:
    """One mirror partition's leader: its epoch, whether it mirrors, its log."""

    leader_epoch: int
    mirror: bool = True
    log_start: int = 0
    batches: list[tuple[int, bytes]] = field(default_factory=list)  # (base offset, bytes)
    calls: list[tuple[float, int, int]] = field(default_factory=list)  # (monotonic, epoch, err)

    @property
    def log_end(self) -> int:
        if not self.batches:
            return self.log_start
        return rb.parse_header(self.batches[-1][1], 0).next_offset

    def outcome(self, error_code: int = 0, message: str = "", appended: int = 0) -> MirrorOutcome:
        return MirrorOutcome(
            error_code, self.log_end, self.log_end, self.log_start, message, appended
        )

    def append(self, leader_epoch: int, data: bytes, source_start: int = -1) -> MirrorOutcome:
        if leader_epoch != self.leader_epoch:
            code = FENCED_LEADER_EPOCH if leader_epoch < self.leader_epoch else UNKNOWN_LEADER_EPOCH
            return self.outcome(code, f"leader epoch {leader_epoch}, ours {self.leader_epoch}")
        if not self.mirror:
            return self.outcome(INVALID_REQUEST, "not a mirror topic")
        if source_start > self.log_end:
            # The source's log starts above all we hold (its HW is our log end here): the log
            # empties, and its next batch starts it over.
            self.log_start, self.batches = self.log_end, []
        taken, corrupt = mirrored_batches(data, leader_epoch)
        end = self.log_end
        fresh = [b for b in taken if b.meta.next_offset > end]
        if fresh and fresh[0].meta.base_offset < end:
            return self.outcome(INVALID_REQUEST, f"a batch straddles the log end {end}")
        for b in fresh:
            self.batches.append((b.meta.base_offset, bytes(b.data)))
        if source_start > self.log_start:  # the log start follows the source's
            self.log_start = min(source_start, self.log_end)
            self.batches = [
                (base, data)
                for base, data in self.batches
                if rb.parse_header(data, 0).next_offset > self.log_start
            ]
        if corrupt:
            return self.outcome(CORRUPT_MESSAGE, corrupt, len(fresh))
        return self.outcome(0, "", len(fresh))


@dataclass
class MirrorLeaders:
    """The mirror partitions' leaders of one destination broker, by (topic, partition)."""

    logs: dict[tuple[str, int], MirrorLog] = field(default_factory=dict)

    async def append(
        self, topic: str, partition: int, leader_epoch: int, batches: bytes, _source_start: int = -1
    ) -> MirrorOutcome:
        """The gateway's ``_mirror_append``: the partition's leader's answer."""
        log = self.logs.get((topic, partition))
        if log is None:
            return MirrorOutcome(6, -1, -1, -1, "not the leader")  # NOT_LEADER_OR_FOLLOWER
        outcome = log.append(leader_epoch, batches, _source_start)
        log.calls.append((time.monotonic(), leader_epoch, outcome.error_code))
        return outcome

    def records(self, topic: str, partition: int) -> list[tuple[int, bytes]]:
        """(base offset, batch bytes with the source's partition-leader-epoch field zeroed)."""
        return [(base, unstamped(data)) for base, data in self.logs[(topic, partition)].batches]


def unstamped(batch: bytes) -> bytes:
    """``batch`` with its partition-leader-epoch (outside the CRC'd bytes) set to 0, so that a
    source batch and its restamped mirror compare byte for byte."""
    copy = bytearray(batch)
    rb.set_partition_leader_epoch(copy, 0, 0)
    return bytes(copy)
