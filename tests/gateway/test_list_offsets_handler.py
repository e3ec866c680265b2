"""ListOffsets (2) without Ray: the handler's version rules, through the real sans-io connection.

Proves: from v4 the request's ``current_leader_epoch`` reaches the leader and the answer carries
the found offset's ``leader_epoch`` (before v4 neither exists: -1 goes to the leader); the
special timestamps -3 (max timestamp), -4 (earliest-local) and -5 (latest-tiered) are answered
UNSUPPORTED_VERSION (35) below the versions that introduced them (7, 8, 9), without asking the
leader, and reach it from those versions. What each timestamp means is the replica's
(tests/storage/log/test_reads.py, tests/actors/test_replica_tiering_ray.py and, live,
tests/e2e/test_tiered_storage_live.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse
from support.gateway import InMemoryBackend, handled

from raylog.gateway.backend import ListOffsetsResult

_Partition = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition


@dataclass
class RecordingBackend(InMemoryBackend):
    """Answers every partition (error 0, the timestamp asked, offset 42, epoch 7) and records
    the (timestamp, current_leader_epoch) of each call."""

    asked: list[tuple[int, int]] = field(default_factory=list)

    async def list_offsets(
        self, topic: str, partition: int, timestamp: int, isolation: int, epoch: int
    ) -> ListOffsetsResult:
        self.asked.append((timestamp, epoch))
        return ListOffsetsResult(0, timestamp, 42, 7)


def _ask(backend: RecordingBackend, version: int, timestamp: int, epoch: int = 5) -> Any:
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(
                name="orders",
                partitions=[
                    _Partition(partition_index=0, current_leader_epoch=epoch, timestamp=timestamp)
                ],
            )
        ],
    )
    return handled(request, version, ListOffsetsResponse, backend).topics[0].partitions[0]


@pytest.mark.parametrize("version", range(1, 10))
def test_leader_epochs_travel_from_v4(version: int) -> None:
    backend = RecordingBackend()
    answer = _ask(backend, version, 1_700_000_000_000)
    assert (answer.error_code, answer.offset) == (0, 42)
    assert backend.asked == [(1_700_000_000_000, 5 if version >= 4 else -1)]
    if version >= 4:
        assert answer.leader_epoch == 7


@pytest.mark.parametrize(("timestamp", "since"), [(-3, 7), (-4, 8), (-5, 9)])
@pytest.mark.parametrize("version", range(1, 10))
def test_special_timestamps_from_their_versions(timestamp: int, since: int, version: int) -> None:
    backend = RecordingBackend()
    answer = _ask(backend, version, timestamp)
    if version < since:
        assert (answer.error_code, answer.offset) == (35, -1)
        assert backend.asked == []
    else:
        assert (answer.error_code, answer.offset) == (0, 42)
        assert backend.asked == [(timestamp, 5)]
