"""Replica actors replicate over their channels, and still over Ray calls without them.

Proves, on real Ray with an RF=3 partition in push and in pull mode: with channels (the default)
the replication messages after the first few go over them (the followers receive them on their
channel servers), over Unix sockets between these same-host replicas, or over TCP with
``RAYLOG_CHANNEL_LOCAL_SOCKETS=0`` in their environment; every acks=all produce completes and
the followers hold the same bytes as the leader (most of them sent before the leader wrote
them, from memory); with ``replication_channel=False`` the same traffic goes by Ray calls and
also completes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
from support.waiting import wait_until

from raylog.actors.calls import NAMESPACE, replica_actor_name
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeFollower, BecomeLeader
from raylog.actors.replication.ready import ReplicaConfig
from raylog.actors.transport import channel as ch
from raylog.storage import batch as rb
from raylog.storage.log import Log

pytestmark = pytest.mark.slow

RF = 3
BATCHES = 30
CALL_TIMEOUT_S = 30.0


def _start(tmp_path: Path, topic: str, mode: str, channel: str) -> list[Any]:
    config = ReplicaConfig(replication_mode=mode, min_insync_replicas=2, fetch_max_wait_ms=200)
    # Only the TCP case gets an environment of its own (a new worker process each).
    env = {"env_vars": {ch.LOCAL_SOCKETS_ENV: "0"}} if channel == "tcp" else None
    replicas = [
        ReplicaActor.options(  # type: ignore[attr-defined]
            name=replica_actor_name(topic, 0, rid), namespace=NAMESPACE, runtime_env=env
        ).remote(
            topic,
            0,
            rid,
            str(tmp_path / topic / str(rid)),
            {},
            config,
            replication_channel=channel != "off",
        )
        for rid in range(RF)
    ]
    everyone = tuple(range(RF))
    calls = [replicas[0].become_leader.remote(BecomeLeader(1, 1, 1, everyone, everyone))]
    calls += [replicas[r].become_follower.remote(BecomeFollower(1, 0, 1, 1)) for r in (1, 2)]
    ray.get(calls, timeout=CALL_TIMEOUT_S)
    return replicas


def _end_offsets(replicas: list[Any]) -> list[int]:
    states = ray.get([r.state.remote() for r in replicas], timeout=CALL_TIMEOUT_S)
    return [s.log_end_offset for s in states]


def _stored(directory: Path) -> bytes:
    """Every batch of the log in ``directory`` as stored (offsets and epochs stamped)."""
    log = Log.open(directory)
    try:
        return log.read(0, 1 << 30)
    finally:
        log.close()


@pytest.mark.parametrize("mode", ["push", "pull"])
@pytest.mark.parametrize("channel", ["unix", "tcp", "off"])
def test_replication_over_channels_and_over_ray(
    ray_local: Path, tmp_path: Path, mode: str, channel: str
) -> None:
    if channel == "unix" and not ch.local_sockets_enabled():
        pytest.skip("same-host sockets need Linux (a kernel boot id)")
    topic = f"chan-{mode}-{channel}"
    replicas = _start(tmp_path, topic, mode, channel)
    try:

        def produce(i: int) -> Any:
            batch = rb.build_batch([rb.Record(b"k", b"v%d" % i, 1_700_000_000_000 + i)])
            return replicas[0].produce.remote(batch, -1, 20_000)

        # The first batch alone, so that every later one finds the followers caught up.
        outcomes = ray.get([produce(0)], timeout=CALL_TIMEOUT_S)
        wait_until(lambda: _end_offsets(replicas) == [1] * RF, timeout_s=CALL_TIMEOUT_S)
        outcomes += ray.get([produce(i) for i in range(1, BATCHES)], timeout=CALL_TIMEOUT_S)
        assert [o.error_code for o in outcomes] == [0] * BATCHES
        assert sorted(o.base_offset for o in outcomes) == list(range(BATCHES))
        wait_until(lambda: _end_offsets(replicas) == [BATCHES] * RF, timeout_s=CALL_TIMEOUT_S)

        stats = ray.get([r.channel_stats.remote() for r in replicas], timeout=CALL_TIMEOUT_S)
        followers_in = stats[1]["messages_in"] + stats[2]["messages_in"]
        if channel != "off":
            assert followers_in > 0, stats
            assert stats[0]["messages_in"] > 0, stats  # acks or fetches back to the leader
            used, unused = (
                ("local_links_in", "tcp_links_in")
                if channel == "unix"
                else ("tcp_links_in", "local_links_in")
            )
            assert all(s[used] > 0 and s[unused] == 0 for s in stats), stats
        else:
            assert followers_in == 0 and stats[0]["ray_calls_out"] > 0, stats
        assert all(s["rejected"] == 0 for s in stats), stats
        # The leader sends each batch it appends to the followers waiting for it before its own
        # write (push requests; parked fetches in pull mode), stamped in memory as its log
        # stamps it: what the followers stored must be the leader's bytes exactly.
        assert stats[0]["sent_before_write"] > 0, stats
    finally:
        for r in replicas:
            ray.kill(r, no_restart=True)
    stored = [_stored(tmp_path / topic / str(rid)) for rid in range(RF)]
    assert len(stored[0]) > 0
    assert stored[1] == stored[0] and stored[2] == stored[0]


def test_batches_read_as_views_go_by_ray_call_as_bytes() -> None:
    """A fetch answer's batches are views of the bytes the log read, which the channel encodes
    as they are; a Ray call pickles its message, and pickle refuses a memoryview."""
    import pickle

    from raylog.actors.replica_port import picklable
    from raylog.actors.replication.messages import BatchMeta, RecordBatch, ReplicateRequest

    data = rb.build_batch([rb.Record(b"k", b"v", 1_700_000_000_000)])
    view = memoryview(b"xx" + data)[2:]
    request = ReplicateRequest(0, 1, 0, -1, (RecordBatch(BatchMeta(0, 1, len(data), 1), view),))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pickle.dumps(request)
    sent = pickle.loads(pickle.dumps(picklable(request)))
    assert sent.batches[0].data == data and type(sent.batches[0].data) is bytes
    assert ch.encode_frame(request) == ch.encode_frame(sent)  # the channel's frame: the same
    plain = ReplicateRequest(0, 1, 0, -1, (RecordBatch(BatchMeta(0, 1, len(data), 1), data),))
    assert picklable(plain) is plain  # nothing to convert: no copy
