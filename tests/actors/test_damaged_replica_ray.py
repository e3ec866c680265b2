"""A damaged follower never leads with a hole and never serves the damage (issue 31), on real
Ray: three replica actors with their WALs on disk, the test standing in for the controller
(``support.stand_in_controller`` takes the AlterPartition proposals and offline reports;
elections are election.py's own rules).

A byte is flipped in a committed batch of follower 2's segment file, then follower 2 is
restarted (Ray restarts the killed actor from its WAL):
- in the active segment: recovery cuts below the checkpointed HW; the leader shrinks follower
  2 out of the ISR at its first fetch, and told to lead anyway, it goes offline instead;
- in an inactive segment (trusted by recovery): a consumer's fetch through follower 2 meets
  the damage, answers KAFKA_STORAGE_ERROR and takes the replica offline.
Then the leader is killed: the clean election picks follower 1, never follower 2. Follower 2,
re-created, drops the damaged suffix, fetches it back from the new leader and rejoins the ISR,
its log byte-identical to the leader's below the HW; its damage record is gone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
from support.replica_reads import served_batches
from support.stand_in_controller import StandInController
from support.waiting import wait_until

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.control.election import decide_partition
from raylog.actors.control.metadata import PartitionState, TopicPartition
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.storage import batch as rb
from raylog.storage.errors import KafkaStorageError
from raylog.storage.log import DAMAGE_CHECKPOINT, HIGH_WATERMARK_CHECKPOINT

pytestmark = pytest.mark.slow

REPLICAS = (0, 1, 2)
CALL_TIMEOUT_S = 30.0
BATCHES = 60
CONFIGS = {"segment.bytes": "4096", "min.insync.replicas": "1"}
CONFIG = ReplicaConfig(fetch_max_wait_ms=100)


def _get(ref: Any) -> Any:
    return ray.get(ref, timeout=CALL_TIMEOUT_S)


def _batch(i: int) -> bytes:
    return rb.build_batch([rb.Record(str(i).encode(), bytes(300), 1_700_000_000_000 + i)])


def _state(replica: Any) -> Any:
    return _get(replica.state.remote())


def _follow(replica: Any, leader: int, epoch: int) -> None:
    _get(replica.become_follower.remote(BecomeFollower(1, leader, epoch, epoch)))


def _restart(replicas: dict[int, Any], rid: int, controller: Any) -> None:
    """Kill the actor; Ray restarts it from its WAL (recovery runs in ``__init__``)."""
    old_pid = _get(replicas[rid].pid.remote())
    ray.kill(replicas[rid], no_restart=False)

    def up() -> bool:
        try:
            return _get(replicas[rid].pid.remote()) != old_pid
        except ray.exceptions.RayActorError:
            return False

    wait_until(up, timeout_s=CALL_TIMEOUT_S, message=f"replica {rid} restarted")
    _get(replicas[rid].set_controller.remote(controller))


def _flip(directory: Path, active: bool) -> int:
    """Flip a byte inside the records of a batch in the middle of the last (active) or the
    first segment; returns that batch's base offset."""
    segment = sorted(directory.glob("*.log"))[-1 if active else 0]
    data = bytearray(segment.read_bytes())
    spans = list(rb.iter_batches(bytes(data)))
    assert len(spans) >= 2, "segments of several batches"
    pos, header = spans[len(spans) // 2]
    data[pos + 70] ^= 0x01
    segment.write_bytes(bytes(data))
    return header.base_offset


@pytest.mark.parametrize("where", ["active", "inactive"])
def test_a_damaged_follower_is_not_elected_and_repairs_from_the_leader(
    ray_local: Path, tmp_path: Path, where: str
) -> None:
    topic = f"damaged-{where}"
    controller = StandInController.remote(REPLICAS)  # type: ignore[attr-defined]
    replicas = {
        rid: ReplicaActor.options(  # type: ignore[attr-defined]
            name=replica_actor_name(topic, 0, rid), namespace=NAMESPACE
        ).remote(
            topic, 0, rid, str(tmp_path / f"r{rid}"), CONFIGS, ReplicaConfig(fetch_max_wait_ms=100)
        )
        for rid in REPLICAS
    }
    _get([r.set_controller.remote(controller) for r in replicas.values()])
    _get(replicas[0].become_leader.remote(BecomeLeader(1, 1, 1, REPLICAS, REPLICAS)))
    for rid in (1, 2):
        _follow(replicas[rid], 0, 1)
    for i in range(BATCHES):
        assert _get(replicas[0].produce.remote(_batch(i), -1, 10_000)).error_code == 0
    hw_file = tmp_path / "r2" / HIGH_WATERMARK_CHECKPOINT
    wait_until(
        lambda: hw_file.exists() and hw_file.read_text().split()[1] == str(BATCHES),
        timeout_s=CALL_TIMEOUT_S,
        message="follower 2 checkpointed HW 60",
    )

    damaged = _flip(tmp_path / "r2", where == "active")
    _restart(replicas, 2, controller)
    if where == "active":
        assert _state(replicas[2]).log_end_offset == damaged, "recovery cut the damage"
        # Elected before its leader shrank it out of the ISR (isr.py, tested on its own):
        # it refuses to lead with a hole and goes offline.
        with pytest.raises(ray.exceptions.RayTaskError, match="not leading"):
            _get(replicas[2].become_leader.remote(BecomeLeader(1, 2, 2, REPLICAS, REPLICAS)))
    else:
        _follow(replicas[2], 0, 1)
        fetched = _get(replicas[2].fetch.remote(0, 1 << 20))
        assert fetched.error_code == KafkaStorageError.error_code and not fetched.records
    assert _state(replicas[2]).offline is not None
    isr, offline_reports = _get(controller.state.remote())
    assert offline_reports, "its broker (here: the test's controller) heard of it"

    # The leader dies: the controller's clean election, follower 2 reported offline.
    ray.kill(replicas[0], no_restart=True)
    partition = PartitionState(
        partition=0, replicas=REPLICAS, isr=isr, leader=0, offline_replicas=(2,)
    )
    change = decide_partition(
        TopicPartition(topic, 0), partition, {1, 2}, unclean_allowed=False, remove_from_isr=2
    )
    assert change.leader == 1, change
    alone = PartitionState(partition=0, replicas=REPLICAS, isr=(2,), offline_replicas=(2,))
    assert (
        decide_partition(TopicPartition(topic, 0), alone, {2}, unclean_allowed=False).leader == -1
    )
    _get(controller.reset.remote(2, (1,)))
    _get(replicas[1].become_leader.remote(BecomeLeader(1, 2, 2, (1,), REPLICAS)))

    # Repair: follower 2 re-created (its broker does so after replica.offline.retry.backoff.ms).
    _restart(replicas, 2, controller)
    assert _state(replicas[2]).log_end_offset <= damaged
    _follow(replicas[2], 1, 2)
    wait_until(
        lambda: _get(controller.state.remote())[0] == (1, 2),
        timeout_s=CALL_TIMEOUT_S,
        message="follower 2 caught up and rejoined the ISR",
    )
    wait_until(
        lambda: (
            _state(replicas[2]).high_watermark == BATCHES
            and not (tmp_path / "r2" / DAMAGE_CHECKPOINT).exists()
        ),
        timeout_s=CALL_TIMEOUT_S,
        message="follower 2 repaired",
    )
    assert served_batches(replicas[2], BATCHES) == served_batches(replicas[1], BATCHES)
    for rid in (1, 2):
        ray.kill(replicas[rid], no_restart=True)
    ray.kill(controller, no_restart=True)
