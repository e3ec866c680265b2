"""What one seed of the simulator runs: the cluster's shape, the workload, the faults, the
topic's configs, and the classes it runs (the production ones, or known-bad ones in the
mutation tests); ``Scenario.from_seed`` picks a random mix.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from raylog.actors.control.reassignment import ByteRateThrottle
from raylog.actors.control.reconciler import Reconciler
from raylog.actors.replication.executor import FLUSH_INTERVAL_MS_NEVER, ReadyExecutor
from raylog.actors.replication.partition import PartitionReplica
from raylog.actors.replication.ready import ReplicaConfig

from .controller import SimController
from .network import NetworkConfig

RESYNC_MS = 1_000  # every broker is pushed its specs again at least this often, scaled


@dataclass
class Scenario:
    """What one seed runs; ``from_seed`` picks a random mix."""

    replicas: int = 3
    observers: int = 0
    min_insync_replicas: int = 2
    replication_mode: str = "pull"
    unclean_leader_election_enable: bool = False
    settle: bool = True  # checker 10 after the last step
    lossy_checks: bool = False  # only the checkers that hold with data loss (Checkers.lossy)
    steps: int = 1300
    produce_interval_ms: int = 15
    consume_interval_ms: int = 30
    delete_records_interval_ms: int = 150
    fault_interval_ms: int = 120
    fsync_max_ms: int = 8
    # Each broker's clock rate is drawn from this range; the lease guard absorbs up to 10 %.
    clock_rate_min: float = 0.95
    clock_rate_max: float = 1.05
    # A replica's log fails now and then (a full disk, a failed fsync) while its broker runs
    # on: the replica goes offline, losing what it had not synced; its broker's heartbeats
    # report it; LOG_RETRY_MS later the broker re-creates it from its log. Off by default: a
    # new kind of fault changes every seed's run.
    log_failures: bool = False
    # Transactional producers, a transaction coordinator stand-in and a read_committed
    # consumer (transactions.py). Off by default, as log_failures.
    transactions: bool = False
    resync_ms: int = RESYNC_MS  # the reconciler's resync_interval_ms
    network: NetworkConfig = field(default_factory=NetworkConfig)
    # The topic's flush policy. flush.messages > 1 acknowledges writes before they are
    # fsync'd: such a topic promises that they survive process crashes (the page cache
    # stays), not a power loss of every ISR member before the flush, which the checkers of
    # lost data cannot tell from a bug. So from_seed runs it with crashes and failed logs that
    # keep what was written (``crash_keeps_page_cache``).
    flush_messages: int = 1
    flush_ms: int = FLUSH_INTERVAL_MS_NEVER
    crash_keeps_page_cache: bool = False
    # leader.replication.throttled.rate on every replica (0: none): fetch answers to followers
    # outside the ISR are held back, as during a reassignment.
    throttle_bytes_per_sec: int = 0
    replica_class: type[PartitionReplica] = PartitionReplica
    executor_class: type[ReadyExecutor] = ReadyExecutor
    controller_class: type[SimController] = SimController
    reconciler_class: type[Reconciler] = Reconciler
    # The simulation that runs it: cluster.Simulation when None; links.LinkSimulation makes
    # the partition a mirror of a simulated source cluster's, sync_links.SyncLinkSimulation
    # the source of a synchronous link.
    simulation_class: type[Any] | None = None
    # What ``from_seed`` was given on top of the seed's mix: a failure's replay command names
    # them (seeds.replay_command).
    overrides: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_seed(cls, seed: int, **overrides: Any) -> Scenario:
        rng = random.Random(seed ^ 0x5EED)
        scenario = cls(
            replicas=rng.choice((2, 3, 3, 3)),
            observers=rng.choice((0, 0, 1)),
            min_insync_replicas=rng.choice((1, 2, 2)),
            replication_mode=rng.choice(("pull", "push")),
            network=NetworkConfig(
                drop_probability=rng.choice((0.0, 0.02, 0.1)),
                duplicate_probability=rng.choice((0.0, 0.05)),
                delay_max_ms=rng.choice((3, 20, 60)),
            ),
            fault_interval_ms=rng.choice((60, 120, 300)),
        )
        if rng.random() < 0.25:  # a relaxed flush policy (see flush_messages)
            scenario.flush_messages = rng.choice((2, 5))
            scenario.flush_ms = rng.choice((5, 40, FLUSH_INTERVAL_MS_NEVER))
            scenario.crash_keeps_page_cache = True
        if rng.random() < 0.2:  # a reassignment's throttle, held by followers outside the ISR
            scenario.throttle_bytes_per_sec = rng.choice((300, 1_000))
        for key, value in overrides.items():
            setattr(scenario, key, value)
        scenario.overrides = dict(overrides)
        return scenario

    def replica_config(self) -> ReplicaConfig:
        # A throttled answer may be held up to MAX_DELAY_MS: the follower waits that long for
        # it, as production's fetch timeout (5 s) outlasts it.
        throttled = self.throttle_bytes_per_sec > 0
        return ReplicaConfig(
            replica_lag_time_max_ms=300,
            min_insync_replicas=self.min_insync_replicas,
            replication_mode=self.replication_mode,
            unclean_leader_election_enable=self.unclean_leader_election_enable,
            acks_before_fsync=self.flush_messages > 1,
            max_pending_acks_all=50,
            max_pending_acks_local=50,
            fetch_max_bytes=4096,
            fetch_max_wait_ms=100,
            fetch_timeout_ms=ByteRateThrottle.MAX_DELAY_MS + 300 if throttled else 300,
            fetch_backoff_ms=20,
            push_idle_fetch_ms=100,
            alter_partition_timeout_ms=200,
        )
