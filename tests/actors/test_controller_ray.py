"""ControllerActor and BrokerActor on real Ray: one node, three brokers, active + standby.

Proves, with short sessions and leases so each scenario takes about a second:
- two controllers started together yield exactly one active one;
- a topic with RF=3 gets a leader and two followers hosted by three brokers; acks=all produce
  through the leader's ReplicaActor succeeds and the whole ISR has it;
- topic errors are Kafka's (exists, bad replication factor, bad config); configs can be altered
  and described, partitions added, and a deleted topic's replicas stop and their data go;
- a leader's broker hard-killed (its replica actors die with it): a new leader from the ISR
  within a short time, no acknowledged acks=all write lost; the broker comes back by itself
  (Ray restarts it), re-creates its replicas from their WALs and rejoins the ISR;
- controlled shutdown moves leadership away before the broker stops; the broker comes back and
  a preferred leader election on demand moves leadership to the preferred replica;
- killing the active controller hands over to the standby, and the old epoch's commands are
  refused (stale controller);
- a replica with a session lease refuses produce with NOT_LEADER_OR_FOLLOWER before its first
  grant, after a revocation and once the lease lapsed;
- a partitioned leader (its broker process stopped, its replica still serving clients) stops
  taking writes when its lease lapses, before the controller fences it and elects another;
- a push to a stopped broker holds up nothing else: the broker is fenced and its partition has
  a new leader taking writes while that push is still waiting for an answer;
- a stopped replica holds up nothing either: its broker heartbeats on and is not fenced;
- a leader replica whose log fails (its file size limit lowered below its next write, so the
  append fails with EFBIG as on a full disk) answers KAFKA_STORAGE_ERROR and goes offline; the
  controller moves leadership to another ISR member within a few heartbeats, with no
  acknowledged write lost and the broker still up; the broker re-creates the replica from its
  log after replica.offline.retry.backoff.ms and it rejoins the ISR; a follower whose log
  fails leaves the ISR at once, and acks=all goes on without it.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from support.controller_cluster import (
    BROKERS,
    CALL_TIMEOUT_S,
    ControllerCluster,
    batch,
    cluster_fixture,
    get,
)
from support.waiting import wait_until

from raylog.actors.calls import (
    NAMESPACE,
    replica_actor_name,
)
from raylog.actors.replica import ReplicaActor
from raylog.actors.replication.messages import BecomeLeader
from raylog.storage import batch as rb
from raylog.storage.errors import (
    CapacityPendingError,
    ElectionNotNeededError,
    InvalidConfigError,
    InvalidReplicationFactorError,
    KafkaStorageError,
    NotControllerError,
    NotLeaderOrFollowerError,
    RecordTooLargeError,
    TopicAlreadyExistsError,
)

pytestmark = pytest.mark.slow

BROKER_CONFIGS = {
    "broker.heartbeat.interval.ms": "100",
    "broker.session.timeout.ms": "1500",
    "replica.offline.retry.backoff.ms": "2000",
}
BROKER_SESSION_S = int(BROKER_CONFIGS["broker.session.timeout.ms"]) / 1000
PREFIX = "ctl-test"  # actor names of this module (namespace raylog)
CONTROLLER_CALL_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def cluster(
    ray_local: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerCluster]:
    root = tmp_path_factory.mktemp("controller")
    # Calls longer than any scenario here takes to elect (a push to a hung broker is seen still
    # waiting after the election that followed it).
    yield from cluster_fixture(
        ControllerCluster(root, PREFIX, BROKER_CONFIGS, call_timeout_ms=CONTROLLER_CALL_TIMEOUT_MS)
    )


def _create(
    cluster: ControllerCluster,
    name: str,
    partitions: int = 1,
    configs: dict[str, str] | None = None,
) -> Any:
    t = cluster.call("create_topic", name, partitions, 3, configs or {"min.insync.replicas": "2"})
    cluster.reconciled()
    return t


def _produce_ok(cluster: ControllerCluster, topic: str, i: int) -> bool:
    try:
        return cluster.produce(topic, i).error_code == 0
    except (ray.exceptions.RayActorError, AttributeError, KeyError):
        return False


def test_two_controllers_started_together_yield_one_active(cluster: ControllerCluster) -> None:
    cluster.active()
    statuses = [s for s in cluster.statuses() if s is not None]
    assert sum(s.active for s in statuses) == 1, statuses


def test_create_topic_rf3_leader_and_followers_take_acks_all(cluster: ControllerCluster) -> None:
    _create(cluster, "orders")
    leader = cluster.leader("orders")
    states = {b: get(cluster.replica(b, "orders").state.remote()) for b in BROKERS}
    assert states[leader].role == "leader"
    assert sorted(s.role for b, s in states.items() if b != leader) == ["follower", "follower"]
    wait_until(
        lambda: _produce_ok(cluster, "orders", 0), timeout_s=CALL_TIMEOUT_S, message="produce"
    )
    for i in range(1, 5):
        assert cluster.produce("orders", i).error_code == 0
    wait_until(
        lambda: all(
            get(cluster.replica(b, "orders").state.remote()).high_watermark == 5 for b in BROKERS
        ),
        timeout_s=CALL_TIMEOUT_S,
        message="HW 5 on every replica",
    )


def _libraries(pid: int) -> set[str]:
    """The shared libraries process ``pid`` has mapped, by file name."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {Path(line.split()[-1]).name for line in maps if ".so" in line}


def _heavy(libraries: set[str]) -> set[str]:
    """Arrow's, numpy's and pydantic's libraries among ``libraries``."""
    return {n for n in libraries if n.startswith(("libarrow", "_multiarray", "_pydantic_core"))}


@ray.remote(num_cpus=0)
class _Bare:
    def pid(self, _: Any) -> int:
        return os.getpid()


def test_replicas_leave_ray_s_arrow_and_pydantic_serializers_out_and_report_their_memory(
    cluster: ControllerCluster,
) -> None:
    """Ray's serialization context imports pyarrow, numpy and pydantic into every process that
    decodes an argument (the premise, on a bare actor): a replica's process, which decodes
    many, maps none of them, and each broker reports what its replicas' processes hold."""
    bare = _Bare.remote()  # type: ignore[attr-defined]
    assert _heavy(_libraries(get(bare.pid.remote({"an": "argument"})))), "premise: Ray's own"
    ray.kill(bare)
    _create(cluster, "lean")
    wait_until(lambda: _produce_ok(cluster, "lean", 0), timeout_s=CALL_TIMEOUT_S, message="produce")
    for b in BROKERS:
        pid = get(cluster.replica(b, "lean").pid.remote())
        assert not _heavy(_libraries(pid))
        mib = get(cluster.brokers[b].status.remote())["replica_private_mib"]
        assert isinstance(mib, float) and 10 < mib < 1024


def test_topic_errors_configs_partitions_and_delete(cluster: ControllerCluster) -> None:
    _create(cluster, "events")
    with pytest.raises(TopicAlreadyExistsError):
        cluster.call("create_topic", "events", 1, 3)
    with pytest.raises(InvalidReplicationFactorError) as refused:
        cluster.call("create_topic", "too-many", 1, 4)
    # No autoscaler runs here: refused at once, nothing asked for.
    assert not isinstance(refused.value, CapacityPendingError), refused.value
    assert "autoscaler" not in str(refused.value)
    with pytest.raises(InvalidConfigError):
        cluster.call("create_topic", "bad-config", 1, 3, {"min.insync.replicas": "zero"})
    t = cluster.call("alter_configs", "events", {"min.insync.replicas": "3"})
    assert t.configs == {"min.insync.replicas": "3"}
    entries = {e.name: e.value for e in cluster.call("describe_configs", "events")}
    assert entries["min.insync.replicas"] == "3"
    t = cluster.call("create_partitions", "events", 2)
    assert len(t.partitions) == 2
    cluster.reconciled()
    assert all(cluster.replica(b, "events", 1) is not None for b in BROKERS)
    data = cluster.root / "data"
    assert (data / "broker-1" / "events-1").is_dir()
    cluster.call("delete_topic", "events")
    cluster.reconciled()
    assert all(cluster.replica(b, "events", p) is None for b in BROKERS for p in (0, 1))
    assert not any((data / f"broker-{b}" / "events-0").exists() for b in BROKERS)


def _pids(cluster: ControllerCluster, topic: str) -> dict[int, int]:
    return {
        b: get(cluster.replica(b, topic).__ray_call__.remote(lambda _: os.getpid()))
        for b in BROKERS
    }


def test_config_changes_apply_in_place_and_a_mode_change_recreates(
    cluster: ControllerCluster,
) -> None:
    _create(cluster, "tuned")
    wait_until(
        lambda: _produce_ok(cluster, "tuned", 0), timeout_s=CALL_TIMEOUT_S, message="produce"
    )
    before = _pids(cluster, "tuned")
    big = rb.build_batch([rb.Record(None, b"x" * 3000, 1_700_000_000_000)])
    cluster.call(
        "alter_configs", "tuned", {"min.insync.replicas": "2", "max.message.bytes": "2000"}
    )
    cluster.reconciled()

    def refused_big() -> bool:
        outcome = get(cluster.leader_replica("tuned").produce.remote(big, -1, 5_000))
        return outcome.error_code == RecordTooLargeError.error_code

    # The same processes (no restart, no leadership change) now refuse a 3000-byte batch.
    wait_until(refused_big, timeout_s=CALL_TIMEOUT_S, message="max.message.bytes 2000 applied")
    assert _pids(cluster, "tuned") == before
    assert cluster.produce("tuned", 1).error_code == 0
    # A replication mode change re-creates the replicas from their WALs.
    cluster.call("alter_configs", "tuned", {"min.insync.replicas": "2", "replication.mode": "push"})
    cluster.reconciled()
    wait_until(
        lambda: set(_pids(cluster, "tuned").values()).isdisjoint(before.values()),
        timeout_s=CALL_TIMEOUT_S,
        message="replicas re-created for the mode change",
    )
    wait_until(lambda: _produce_ok(cluster, "tuned", 2), timeout_s=CALL_TIMEOUT_S, message="push")
    assert get(cluster.leader_replica("tuned").produce.remote(big, -1, 5_000)).error_code == 0


def test_hard_kill_of_leader_broker_elects_from_isr_and_loses_nothing(
    cluster: ControllerCluster,
) -> None:
    _create(cluster, "payments")
    wait_until(
        lambda: _produce_ok(cluster, "payments", 0), timeout_s=CALL_TIMEOUT_S, message="produce"
    )
    acked = {0: 0}
    for i in range(1, 20):
        outcome = cluster.produce("payments", i)
        assert outcome.error_code == 0
        acked[i] = outcome.base_offset
    old = cluster.leader("payments")
    ray.kill(cluster.brokers[old], no_restart=False)  # its replicas die with it; Ray restarts it
    wait_until(
        lambda: cluster.leader("payments") not in (old, -1), timeout_s=10, message="a new leader"
    )
    new = cluster.leader("payments")
    wait_until(
        lambda: _produce_ok(cluster, "payments", 20), timeout_s=10, message="produce on new leader"
    )
    fetched = get(cluster.replica(new, "payments").fetch.remote(0, 1 << 20))
    offsets = [h.base_offset for _, h in rb.iter_batches(fetched.records)]
    assert set(acked.values()) <= set(offsets), "an acknowledged acks=all write was lost"
    # The killed broker comes back (new incarnation), re-creates its replica from the WAL and
    # rejoins the ISR.
    wait_until(
        lambda: old in cluster.call("metadata").topics["payments"].partitions[0].isr,
        timeout_s=CALL_TIMEOUT_S,
        message="restarted broker back in the ISR",
    )


def test_a_broker_ray_restarts_registers_again_every_time(cluster: ControllerCluster) -> None:
    """A restarted broker starts itself from its constructor; Ray refuses that call while it
    still sees the actor as restarting, and a lost call left the broker alive but never
    registered (fenced for good). Several crashes in a row: every incarnation registers."""
    broker = cluster.brokers[3]
    for crash in range(6):
        before = get(broker.status.remote())
        assert before["broker_epoch"] > 0, f"crash {crash}: broker 3 not registered"
        os.kill(before["pid"], signal.SIGKILL)

        def registered_again(before: dict[str, Any] = before) -> bool:
            try:
                now = ray.get(broker.status.remote(), timeout=5)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                return False
            return bool(
                now["incarnation_id"] != before["incarnation_id"] and now["broker_epoch"] > 0
            )

        wait_until(
            registered_again, timeout_s=CALL_TIMEOUT_S, message=f"broker 3 back after crash {crash}"
        )
    cluster.reconciled()


def test_controlled_shutdown_moves_leadership_first(cluster: ControllerCluster) -> None:
    _create(cluster, "clicks")
    wait_until(
        lambda: _produce_ok(cluster, "clicks", 0), timeout_s=CALL_TIMEOUT_S, message="produce"
    )
    old = cluster.leader("clicks")
    assert get(cluster.brokers[old].shutdown.remote()) is True
    new = cluster.leader("clicks")
    assert new not in (old, -1)
    assert cluster.produce("clicks", 1).error_code == 0
    # Bring the broker back: a Ray restart is a new incarnation that registers by itself.
    ray.kill(cluster.brokers[old], no_restart=False)
    wait_until(
        lambda: cluster.call("metadata").brokers[old].state == "registered",
        timeout_s=2 * CALL_TIMEOUT_S,  # a process restart and an actor start on a loaded machine
        message="broker registered again",
    )
    # Preferred leader election on demand, once the preferred replica is back in the ISR.
    md = cluster.call("metadata")
    preferred = md.topics["clicks"].partitions[0].replicas[0]
    wait_until(
        lambda: preferred in cluster.call("metadata").topics["clicks"].partitions[0].isr,
        timeout_s=CALL_TIMEOUT_S,
        message="preferred replica in the ISR",
    )
    codes = cluster.call("elect_leaders", "preferred", [("clicks", 0)])
    assert codes[("clicks", 0)] in (0, ElectionNotNeededError.error_code)
    assert cluster.leader("clicks") == preferred
    wait_until(
        lambda: _produce_ok(cluster, "clicks", 2), timeout_s=CALL_TIMEOUT_S, message="produce"
    )


def test_a_hung_leader_stops_taking_writes_before_another_is_elected(
    cluster: ControllerCluster,
) -> None:
    """A partitioned leader: its broker's process is stopped (SIGSTOP), so no heartbeat reaches
    the controller and no command reaches its replica, while the replica actor (a process of its
    own) still answers clients. The replica refuses writes once the lease its broker last
    extended lapsed, and the controller fences the broker (session expiry) and elects another
    leader only later: no write the old leader accepted began after the new leader was visible.
    (The simulator's checker 9 proves the strict order on every step; on a loaded machine the
    time between two probes here can exceed the 150 ms guard.)"""
    _create(cluster, "hung", configs={"min.insync.replicas": "1"})
    wait_until(lambda: _produce_ok(cluster, "hung", 0), timeout_s=CALL_TIMEOUT_S, message="produce")
    old = cluster.leader("hung")
    replica = cluster.replica(old, "hung")
    pid = get(cluster.brokers[old].status.remote())["pid"]
    outcomes: list[tuple[float, bool, int, str]] = []  # (sent at, new leader seen, code, why)
    elected_at = None
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + CALL_TIMEOUT_S
        i = 1
        while time.monotonic() < deadline:  # bounded by the deadline
            if elected_at is None and cluster.leader("hung") != old:
                elected_at = time.monotonic()
            sent = time.monotonic()
            outcome = get(replica.produce.remote(batch(i), 1, 1_000))  # acks=1: local
            outcomes.append((sent, elected_at is not None, outcome.error_code, outcome.message))
            if elected_at is not None and outcome.error_code != 0:
                break
            i += 1
    finally:
        os.kill(pid, signal.SIGCONT)
    assert elected_at is not None, "no new leader while the broker was stopped"
    codes = [code for _, _, code, _ in outcomes]
    first_refused = next(k for k, code in enumerate(codes) if code != 0)
    assert first_refused > 0, "the leader took no write after its broker stopped"
    assert all(code != 0 for code in codes[first_refused:]), "a write after the lease lapsed"
    assert outcomes[first_refused][2:] == (
        NotLeaderOrFollowerError.error_code,
        "broker session lease lapsed",
    )
    assert not any(seen and code == 0 for _, seen, code, _ in outcomes), "split brain"
    # The broker resumes: it heartbeats again, is unfenced, and its replica follows.
    wait_until(
        lambda: old in cluster.call("metadata").topics["hung"].partitions[0].isr,
        timeout_s=2 * CALL_TIMEOUT_S,
        message=f"broker {old} back in the ISR after it resumed",
    )


def test_a_push_to_a_hung_broker_holds_up_nothing_else(cluster: ControllerCluster) -> None:
    """The leader's broker process is stopped (SIGSTOP), then a config change makes the
    controller push to every broker: the push to the stopped one waits for an answer (up to
    the controller's call timeout, a minute here). Its session expires and it is fenced, and
    the partition it led gets a new leader from the ISR that takes acks=all writes, while that
    push still waits. Before pushes ran per broker, the push held its whole round, and with it
    the session expiry, the election and every other broker's commands, for that long."""
    _create(cluster, "pushhung")
    wait_until(
        lambda: _produce_ok(cluster, "pushhung", 0), timeout_s=CALL_TIMEOUT_S, message="produce"
    )
    hung = cluster.leader("pushhung")
    pid = get(cluster.brokers[hung].status.remote())["pid"]

    def pushing() -> tuple[int, ...]:
        return get(cluster.active().status.remote()).pushing

    os.kill(pid, signal.SIGSTOP)
    try:
        cluster.call("alter_configs", "pushhung", {"retention.ms": "3600000"})
        wait_until(
            lambda: hung in pushing(), timeout_s=CALL_TIMEOUT_S, message="a push to the stopped"
        )
        wait_until(
            lambda: cluster.call("metadata").brokers[hung].state == "fenced",
            timeout_s=CALL_TIMEOUT_S,
            message=f"broker {hung} fenced",
        )
        wait_until(
            lambda: cluster.leader("pushhung") != hung and _produce_ok(cluster, "pushhung", 1),
            timeout_s=CALL_TIMEOUT_S,
            message="a new leader taking writes",
        )
        assert hung in pushing(), "the push to the stopped broker ended before it resumed"
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(
        lambda: hung in cluster.call("metadata").topics["pushhung"].partitions[0].isr,
        timeout_s=2 * CALL_TIMEOUT_S,
        message=f"broker {hung} back in the ISR after it resumed",
    )
    wait_until(lambda: hung not in pushing(), timeout_s=CALL_TIMEOUT_S, message="push answered")


def test_a_stopped_replica_does_not_hold_up_its_brokers_heartbeats(
    cluster: ControllerCluster,
) -> None:
    """A follower replica's process is stopped (SIGSTOP): the broker's lease grant to it gets
    no answer, and the broker goes on heartbeating meanwhile, so its session stays live. When
    a heartbeat waited for every grant (up to 5 s each), a stopped or busy replica made the
    broker miss its 1.5 s session and be fenced with every partition it led."""
    _create(cluster, "stalled")
    leader = cluster.leader("stalled")
    follower = next(b for b in BROKERS if b != leader)
    pid = get(cluster.replica(follower, "stalled").pid.remote())
    broker = cluster.brokers[follower]

    def heartbeats() -> int:
        return int(get(broker.status.remote())["heartbeats"])

    before = heartbeats()
    os.kill(pid, signal.SIGSTOP)
    try:
        # Ten heartbeats (one per 100 ms) need ten grant rounds, each of which would wait for
        # the stopped replica (up to 5 s) if grants were awaited.
        wait_until(
            lambda: heartbeats() >= before + 10,
            timeout_s=BROKER_SESSION_S * 3,
            message=f"broker {follower} heartbeating while one of its replicas is stopped",
        )
        assert cluster.call("metadata").brokers[follower].state != "fenced"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert get(cluster.replica(follower, "stalled").pid.remote()) == pid  # resumed, same one


def _fail_log(cluster: ControllerCluster, broker: int, topic: str, pid: int) -> None:
    """The replica's process may no longer grow a file past its segment's end + 64 bytes: its
    next batch (about 130 bytes) fails with EFBIG, as a write to a full disk fails with ENOSPC."""
    segment = max((cluster.root / "data" / f"broker-{broker}" / f"{topic}-0").glob("*.log"))
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (segment.stat().st_size + 64, hard))


def test_a_replica_whose_log_fails_goes_offline_and_its_partition_moves(
    cluster: ControllerCluster,
) -> None:
    _create(cluster, "full-disk")
    wait_until(
        lambda: _produce_ok(cluster, "full-disk", 0), timeout_s=CALL_TIMEOUT_S, message="produce"
    )
    acked = [0]
    for i in range(1, 10):
        outcome = cluster.produce("full-disk", i)
        assert outcome.error_code == 0
        acked.append(outcome.base_offset)
    old = cluster.leader("full-disk")
    replica = cluster.replica(old, "full-disk")
    pid = get(replica.pid.remote())
    _fail_log(cluster, old, "full-disk", pid)
    failed = get(replica.produce.remote(batch(10), -1, 5_000))
    assert failed.error_code == KafkaStorageError.error_code, failed

    def moved() -> Any:
        p = cluster.call("metadata").topics["full-disk"].partitions[0]
        return p if p.leader not in (old, -1) and p.offline_replicas == (old,) else None

    p = wait_until(moved, timeout_s=CALL_TIMEOUT_S, message="leadership moved off the failed log")
    assert old not in p.isr and len(p.isr) == 2, p
    broker = get(cluster.brokers[old].status.remote())
    assert "full-disk-0" in broker["offline_replicas"], broker
    assert cluster.call("metadata").brokers[old].state == "registered"  # the broker stays up
    wait_until(
        lambda: _produce_ok(cluster, "full-disk", 11),
        timeout_s=CALL_TIMEOUT_S,
        message="acks=all produce on the new leader",
    )
    fetched = get(cluster.replica(p.leader, "full-disk").fetch.remote(0, 1 << 20))
    offsets = [h.base_offset for _, h in rb.iter_batches(fetched.records)]
    assert set(acked) <= set(offsets), "an acknowledged acks=all write was lost"

    # replica.offline.retry.backoff.ms (2 s) later the broker re-creates the replica (a new
    # process: no lowered limit) from its log; it catches up and rejoins the ISR.
    def back() -> bool:
        p = cluster.call("metadata").topics["full-disk"].partitions[0]
        return not p.offline_replicas and old in p.isr

    wait_until(back, timeout_s=CALL_TIMEOUT_S, message="the re-created replica in the ISR")
    assert get(cluster.replica(old, "full-disk").pid.remote()) != pid
    assert not get(cluster.brokers[old].status.remote())["offline_replicas"]

    # A follower's log fails at its next append: the controller takes it out of the ISR at
    # once, so acks=all goes on with the other two well before replica.lag.time.max.ms (30 s)
    # would have dropped it.
    leader = cluster.leader("full-disk")
    follower = next(b for b in BROKERS if b not in (leader, old))
    _fail_log(
        cluster, follower, "full-disk", get(cluster.replica(follower, "full-disk").pid.remote())
    )
    wait_until(
        lambda: _produce_ok(cluster, "full-disk", 12),
        timeout_s=15,
        message="acks=all without the follower whose log failed",
    )
    p = cluster.call("metadata").topics["full-disk"].partitions[0]
    assert follower in p.offline_replicas and follower not in p.isr and len(p.isr) == 2, p


def test_replica_without_a_live_lease_refuses_produce(ray_local: Path, tmp_path: Path) -> None:
    replica = ReplicaActor.options(  # type: ignore[attr-defined]
        name=replica_actor_name(f"{PREFIX}-lease", 0, 0), namespace=NAMESPACE
    ).remote(f"{PREFIX}-lease", 0, 0, str(tmp_path / "log"), {}, None, session_lease=True)
    try:
        get(replica.become_leader.remote(BecomeLeader(1, 1, 1, (0,), (0,))))
        refused = get(replica.produce.remote(batch(0), -1, 5_000))
        assert refused.error_code == NotLeaderOrFollowerError.error_code, "never granted"
        get(replica.set_session_lease.remote(time.monotonic_ns() // 1_000_000 + 60_000))
        assert get(replica.produce.remote(batch(1), -1, 5_000)).error_code == 0
        get(replica.revoke_session_lease.remote())
        refused = get(replica.produce.remote(batch(2), -1, 5_000))
        assert refused.error_code == NotLeaderOrFollowerError.error_code, "revoked"
        get(replica.set_session_lease.remote(time.monotonic_ns() // 1_000_000 - 1))
        refused = get(replica.produce.remote(batch(3), -1, 5_000))
        assert refused.error_code == NotLeaderOrFollowerError.error_code, "lapsed"
    finally:
        ray.kill(replica, no_restart=True)


def test_active_controller_killed_standby_takes_over_and_old_epoch_is_refused(
    cluster: ControllerCluster,
) -> None:
    if "orders" not in cluster.call("metadata").topics:  # when run on its own
        _create(cluster, "orders")
    old = cluster.active()
    old_epoch = get(old.status.remote()).controller_epoch
    ray.kill(old, no_restart=False)  # Ray restarts it; it comes back as the standby
    new = wait_until(
        lambda: next(
            (
                c
                for c, s in zip(cluster.controllers, cluster.statuses(), strict=True)
                if s is not None and s.active and s.controller_epoch > old_epoch
            ),
            None,
        ),
        timeout_s=10,
        message="the standby active with a newer epoch",
    )
    assert new is not old
    wait_until(
        lambda: _produce_ok(cluster, "orders", 100), timeout_s=CALL_TIMEOUT_S, message="produce"
    )
    # Once a broker has heard from the new controller, the old epoch's commands are refused.
    wait_until(
        lambda: get(cluster.brokers[1].status.remote())["controller_epoch"] > old_epoch,
        timeout_s=CALL_TIMEOUT_S,
        message="broker 1 knows the new controller epoch",
    )
    with pytest.raises(NotControllerError):
        get(cluster.brokers[1].apply.remote(old_epoch, 0, [], "followers"))
    statuses = [s for s in cluster.statuses() if s is not None]
    assert sum(s.active for s in statuses) == 1
