"""Every `raylog` command against a live embedded cluster, as an operator runs them.

Proves: `topics list|describe` (kafka-topics.sh lines, `--under-replicated-partitions`, `--json`),
`configs describe|alter`, `brokers list` (`--json`: id, rack, address, state, partitions led),
`status` (`--json`); `topics create` past its `--timeout` exits 3 saying the topic was created, what
is pending and how to follow it, and the topic then serves acks=all writes; `topics delete` removes
a topic and its replicas' data and refuses the internal topic; `brokers kill` is a crash: `topics
describe` then shows a new leader and the shrunk ISR, and the broker reads fenced (and the
metrics endpoint counts those partitions under-replicated, the ISR shrinks, a clean leader
election and the fenced broker); `brokers start` brings it back with the same id and port
and the ISR expands again (the metrics count the expansions, no partition under-replicated and
three brokers alive); `leader-election --preferred`
moves leadership back; `brokers stop` is a controlled shutdown (the broker reads shutdown, leads
nothing) and `brokers start` undoes it; `brokers start` replaces a broker whose actor died for good
(Ray will not restart it) and refuses one that runs; a failing command exits 1 with one line.

On the session's shared cluster (tests/conftest.py), healed first: the topics earlier modules
left there (`__consumer_offsets`) stay, so every listing and count is checked against what the
cluster held before this module created its topic. Each test starts again what it killed or
stopped, and waits until every partition of every topic is back in sync.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from support.cluster import RAYLOG, Samples, UpProcess, cli_env, scrape
from support.waiting import wait_until

from raylog.actors import raycluster
from raylog.actors.cli import server as cli_server

pytestmark = pytest.mark.slow

TOPIC = "events"
PARTITIONS = 2
RECORDS = 30
WAIT_S = 60.0


Described = dict[str, list[dict[str, Any]]]  # topic -> its partitions (`topics describe`)


@pytest.fixture(scope="module")
def others(shared_up: UpProcess) -> Described:
    """The topics earlier modules left on the shared cluster, before this module creates its
    own: the commands must show them next to it, and nothing else."""
    return every_partition(shared_up)


@pytest.fixture(scope="module")
def up(shared_up: UpProcess, others: Described) -> UpProcess:
    """The shared cluster with this module's topic (deleted by ``shared_up`` at the end)."""
    assert TOPIC not in others
    ok(shared_up.raylog(
        "topics", "create", TOPIC, "--partitions", str(PARTITIONS),
        "--replication-factor", "3", "--config", "min.insync.replicas=2",
    ))  # fmt: skip
    return shared_up


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def js(up: UpProcess, *args: str) -> Any:
    return json.loads(ok(up.raylog(*args, "--json")))


def failure_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed (Ray's own raylet warnings, printed by every
    driver that joins a busy cluster, are not the command's)."""
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if "(raylet)" not in line]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("raylog: "), lines
    return lines[0]


def partitions(up: UpProcess) -> list[dict[str, Any]]:
    [topic] = js(up, "topics", "describe", TOPIC)
    return topic["partitions"]


def every_partition(up: UpProcess) -> Described:
    """Every topic's partitions, this module's and the ones it found."""
    return {t["name"]: t["partitions"] for t in up.document("topics", "describe")}


def all_in_sync(up: UpProcess) -> bool:
    return all(
        sorted(p["isr"]) == sorted(p["replicas"]) for ps in every_partition(up).values() for p in ps
    )


def expected_names(others: Described) -> list[str]:
    return sorted([*others, TOPIC])


def brokers(up: UpProcess) -> dict[int, dict[str, Any]]:
    return {b["id"]: b for b in js(up, "brokers", "list")}


def produce(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    failed: list[str] = []
    for i in range(RECORDS):
        producer.produce(
            TOPIC, value=f"v{i}".encode(), partition=i % PARTITIONS,
            on_delivery=lambda err, _msg: failed.append(str(err)) if err else None,
        )  # fmt: skip
    assert producer.flush(WAIT_S) == 0
    assert failed == []


def test_topics_configs_and_status_read_like_kafkas_tools(up: UpProcess, others: Described) -> None:
    assert ok(up.raylog("topics", "list")).split() == expected_names(others)
    listed_topics = [(t["name"], t["partitions"]) for t in js(up, "topics", "list")]
    counts = {name: len(ps) for name, ps in others.items()} | {TOPIC: PARTITIONS}
    assert listed_topics == sorted(counts.items())
    total = sum(counts.values())

    text = ok(up.raylog("topics", "describe", TOPIC))
    assert text.startswith(f"Topic: {TOPIC}\tTopicId: ")
    assert "PartitionCount: 2\tReplicationFactor: 3\tConfigs: min.insync.replicas=2" in text
    rows = [line for line in text.splitlines() if "\tPartition: " in line]
    assert len(rows) == PARTITIONS
    for row, p in zip(rows, partitions(up), strict=True):
        assert f"Leader: {p['leader']}\t" in row and f"LeaderEpoch: {p['leader_epoch']}" in row
        assert sorted(p["isr"]) == [1, 2, 3] and not p["under_replicated"]
    assert ok(up.raylog("topics", "describe", "--under-replicated-partitions")) == ""

    described = js(up, "configs", "describe", "--topic", TOPIC)
    assert described["min.insync.replicas"] == {"value": "2", "default": False}
    assert described["retention.ms"]["default"] is True
    ok(up.raylog("configs", "alter", "--topic", TOPIC, "--set", "retention.ms=3600000"))
    text = ok(up.raylog("configs", "describe", "--topic", TOPIC))
    assert "  retention.ms=3600000 (topic override)" in text.splitlines()
    ok(up.raylog("configs", "alter", "--topic", TOPIC, "--delete", "retention.ms"))
    described = js(up, "configs", "describe", "--topic", TOPIC)
    assert described["retention.ms"]["default"] is True
    assert described["min.insync.replicas"]["value"] == "2"  # the other override stays

    status = js(up, "status")
    assert status["brokers"] == {
        "alive": [1, 2, 3],
        "draining": [],
        "fenced": [],
        "shutdown": [],
    }
    assert status["controller"]["id"].startswith("controller:")
    roles = {c["id"]: c["role"] for c in status["controllers"]}
    assert sorted(roles.values()) == ["active", "standby"], status["controllers"]
    assert roles[status["controller"]["id"]] == "active"
    assert {c["node"] for c in status["controllers"]} == {"127.0.0.1"}  # both here
    assert (status["partitions"], status["offline_partitions"]) == (total, 0)
    assert status["topics"] == len(counts)
    assert status["under_replicated_partitions"] == status["under_min_isr_partitions"] == 0
    assert "under-replicated partitions: 0" in ok(up.raylog("status"))

    table = ok(up.raylog("brokers", "list")).splitlines()
    assert table[0].split() == ["ID", "RACK", "ADDRESS", "STATE", "LEADERS"]
    rows_by_id = {int(line.split()[0]): line.split() for line in table[1:]}
    port = up.port
    assert rows_by_id[2][1:4] == ["b", f"127.0.0.1:{port + 1}", "alive"]
    listed = brokers(up)
    assert [listed[b]["rack"] for b in (1, 2, 3)] == ["a", "b", "c"]
    assert sum(b["leader_partitions"] for b in listed.values()) == total


def test_topics_delete(up: UpProcess, others: Described) -> None:
    ok(up.raylog("topics", "create", "scratch", "--partitions", "2", "--replication-factor", "2"))
    assert "scratch" in ok(up.raylog("topics", "list")).split()
    assert ok(up.raylog("topics", "delete", "scratch")).strip() == "Deleted topic scratch."
    assert ok(up.raylog("topics", "list")).split() == expected_names(others)
    replicas = [p for p in up.data_dir.glob("broker-*/scratch-*") if p.is_dir()]
    assert replicas == [], "the replicas' data is removed"
    assert "Unknown topic 'scratch'" in failure_line(up.raylog("topics", "delete", "scratch"))
    internal = failure_line(up.raylog("topics", "delete", "__consumer_offsets"))
    assert "internal" in internal


def test_create_past_its_deadline_says_the_topic_is_still_being_created(up: UpProcess) -> None:
    from raylog.actors.cli.topics import EXIT_STILL_CREATING

    proc = up.raylog(
        "topics", "create", "slow", "--partitions", "3", "--replication-factor", "3",
        "--timeout", "0",
    )  # fmt: skip
    assert proc.returncode == EXIT_STILL_CREATING, proc.stderr
    assert proc.stdout == ""
    said = proc.stderr.strip()
    assert said.startswith("raylog: topic slow created;"), said
    assert "partitions are still starting" in said and "the creation goes on" in said
    assert "`raylog topics describe slow`" in said
    assert "slow" in ok(up.raylog("topics", "list")).split()
    # The creation went on: every partition takes acks=all writes.
    producer = Producer({"bootstrap.servers": up.bootstrap, "acks": "all"})
    acked: list[int] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            acked.append(msg.partition())

    def all_acked() -> bool:
        for p in set(range(3)) - set(acked):
            producer.produce("slow", b"v", partition=p, on_delivery=delivered)
        producer.flush(5)
        return set(acked) == {0, 1, 2}

    wait_until(all_acked, timeout_s=WAIT_S, interval_s=0.5, message="every partition of slow acks")
    assert ok(up.raylog("topics", "delete", "slow")).strip() == "Deleted topic slow."


def test_failures_are_one_line_and_exit_1(up: UpProcess) -> None:
    assert "no broker 9" in failure_line(up.raylog("brokers", "kill", "9"))
    assert "does not exist" in failure_line(up.raylog("topics", "describe", "nope"))
    assert "bogus" in failure_line(up.raylog("configs", "alter", "--topic", TOPIC,
                                             "--set", "bogus=1"))  # fmt: skip
    assert "--partition needs --topic" in failure_line(
        up.raylog("leader-election", "--preferred", "--partition", "0")
    )
    assert "already running" in failure_line(up.raylog("brokers", "start", "2"))


def metric(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def grew(samples: Samples, before: Samples, name: str) -> float:
    return metric(samples, name) - metric(before, name)


def metrics_when(up: UpProcess, condition: Callable[[Samples], bool]) -> Samples:
    """The first scrape of the metrics endpoint for which ``condition`` holds (a deadline)."""

    def scraped() -> Samples | None:
        samples = scrape(up.metrics_url)
        return samples if condition(samples) else None

    return wait_until(scraped, timeout_s=WAIT_S, interval_s=0.2, message="the metrics")


def test_kill_shrinks_the_isr_and_start_expands_it(up: UpProcess, others: Described) -> None:
    produce(up.bootstrap)
    led_by_1 = [p["partition"] for p in partitions(up) if p["leader"] == 1]
    assert led_by_1, "broker 1 is the preferred leader of partition 0"
    # Exactly the partitions with a replica on broker 1 go under-replicated: this module's and
    # those of the topics it found (one whose only replica is there would go offline instead).
    on_1 = {(TOPIC, p) for p in range(PARTITIONS)} | {
        (name, p["partition"])
        for name, ps in others.items()
        for p in ps
        if 1 in p["replicas"] and len(p["replicas"]) > 1
    }

    before = scrape(up.metrics_url)
    ok(up.raylog("brokers", "kill", "1"))

    def shrunk() -> Described | None:
        every = every_partition(up)
        hit = [p for name, ps in every.items() for p in ps if (name, p["partition"]) in on_1]
        done = all(1 not in p["isr"] and p["leader"] not in (1, -1) for p in hit)
        return every if done and len(hit) == len(on_1) else None

    after_kill = wait_until(shrunk, timeout_s=WAIT_S, message="ISRs without broker 1")
    text = ok(up.raylog("topics", "describe", TOPIC))
    for p in after_kill[TOPIC]:
        assert f"Partition: {p['partition']}\tLeader: {p['leader']}\t" in text
        assert p["under_replicated"] and sorted(p["isr"]) == [2, 3]
    assert "Isr: 2,3" in text or "Isr: 3,2" in text
    under = ok(up.raylog("topics", "describe", "--under-replicated-partitions")).splitlines()
    under_rows = {
        (fields["Topic"], int(fields["Partition"]))
        for fields in (dict(f.split(": ", 1) for f in line.strip().split("\t")) for line in under)
    }
    assert (under_rows, len(under)) == (on_1, len(on_1))
    assert brokers(up)[1]["state"] == "fenced"
    assert js(up, "status")["under_replicated_partitions"] == len(on_1)
    crashed = metrics_when(up, lambda s: metric(s, "raylog_under_replicated_partitions") > 0)
    assert metric(crashed, "raylog_under_replicated_partitions") == len(on_1)
    alone_on_1 = sum(p["replicas"] == [1] for ps in others.values() for p in ps)
    assert metric(crashed, "raylog_offline_partitions_count") == alone_on_1
    assert grew(crashed, before, "raylog_isr_shrinks_total") >= PARTITIONS
    assert grew(crashed, before, "raylog_leader_elections_total") >= 1
    assert grew(crashed, before, "raylog_unclean_leader_elections_total") == 0
    assert metric(crashed, "raylog_brokers", state="fenced") == 1

    ok(up.raylog("brokers", "start", "1"))
    wait_until(lambda: all_in_sync(up), timeout_s=WAIT_S, message="broker 1 back in every ISR")
    assert all(sorted(p["isr"]) == [1, 2, 3] for p in partitions(up))
    healed = metrics_when(up, lambda s: metric(s, "raylog_under_replicated_partitions") == 0)
    assert grew(healed, before, "raylog_isr_expands_total") >= PARTITIONS
    assert metric(healed, "raylog_brokers", state="alive") == 3
    listed = brokers(up)[1]
    assert (listed["state"], listed["port"], listed["rack"]) == ("alive", up.port, "a")

    out = ok(up.raylog("leader-election", "--preferred", "--topic", TOPIC))
    # The controller's own imbalance check may have moved partition 0 back first.
    assert (
        f"Successfully completed leader election (PREFERRED) for partitions {TOPIC}-0" in out
        or f"Valid replica already elected for partitions {TOPIC}-0" in out
    ), out
    assert all(p["leader"] == p["replicas"][0] for p in partitions(up))
    out = ok(up.raylog("leader-election", "--preferred", "--topic", TOPIC, "--partition", "0"))
    assert f"Valid replica already elected for partitions {TOPIC}-0" in out


def test_stop_is_a_controlled_shutdown_and_start_undoes_it(up: UpProcess) -> None:
    ok(up.raylog("brokers", "stop", "2"))
    listed = brokers(up)[2]
    assert (listed["state"], listed["leader_partitions"]) == ("shutdown", 0)
    assert js(up, "status")["brokers"]["shutdown"] == [2]
    assert all(p["leader"] != 2 for p in partitions(up))
    assert "is not running" in failure_line(up.raylog("brokers", "stop", "2"))

    ok(up.raylog("brokers", "start", "2"))
    wait_until(lambda: all_in_sync(up), timeout_s=WAIT_S, message="broker 2 back in every ISR")
    assert all(2 in p["isr"] for p in partitions(up))
    assert brokers(up)[2]["state"] == "alive"


def test_decommission_is_refused_while_a_topic_needs_the_broker(up: UpProcess) -> None:
    line = failure_line(up.raylog("brokers", "decommission", "3"))
    assert "replication factor is 3: 2 brokers would be left" in line, line
    assert brokers(up)[3]["state"] == "alive"
    assert not js(up, "reassign", "--list")["reassignments"]
    line = failure_line(up.raylog("brokers", "decommission", "3", "--cancel"))
    assert line == "raylog: broker 3 is not being decommissioned", line


# Kills a broker actor the way Ray does when it gives up restarting it: dead for good.
KILL_FOR_GOOD = r"""
import sys
from pathlib import Path

from raylog.actors import raycluster

data_dir, broker = Path(sys.argv[1]), int(sys.argv[2])
info = raycluster.read_cluster_info(data_dir)
raycluster.apply_ray_env(data_dir)
import ray

from raylog.actors.calls import broker_actor_name
from raylog.actors.calls import NAMESPACE

ray.init(address=info.ray_address, namespace=NAMESPACE, logging_level="WARNING",
         log_to_driver=False)
ray.kill(ray.get_actor(broker_actor_name(broker), namespace=NAMESPACE), no_restart=True)
print("killed for good")
"""


def test_start_replaces_a_broker_whose_actor_died_for_good(up: UpProcess) -> None:
    done = subprocess.run(
        [sys.executable, "-c", KILL_FOR_GOOD, str(up.data_dir), "3"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env=cli_env(),
    )
    assert done.returncode == 0 and "killed for good" in done.stdout, done.stderr[-2000:]
    wait_until(
        lambda: 3 in js(up, "status")["brokers"]["fenced"],
        timeout_s=WAIT_S,
        message="broker 3 fenced",
    )
    # The supervisor still counts it as running; start sees its actor is dead and replaces it.
    ok(up.raylog("brokers", "start", "3"))
    wait_until(lambda: all_in_sync(up), timeout_s=WAIT_S, message="broker 3 back in every ISR")
    assert all(3 in p["isr"] for p in partitions(up))
    assert brokers(up)[3]["state"] == "alive"
    assert "already running" in failure_line(up.raylog("brokers", "start", "3"))


def test_address_finds_the_cluster_too(up: UpProcess, others: Described, tmp_path: Path) -> None:
    info = json.loads((up.data_dir / "cluster.json").read_text())
    env_dir = tmp_path / "elsewhere"  # no cluster.json here: --address alone must do
    proc = subprocess.run(
        [*RAYLOG, "topics", "list", "--address", info["ray_address"]],
        capture_output=True, text=True, timeout=WAIT_S,
        env={**cli_env(), **raycluster.ray_env(up.data_dir), "RAYLOG_DATA_DIR": str(env_dir)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == expected_names(others)


def test_commands_are_served_by_raylog_up_without_joining_ray(up: UpProcess) -> None:
    """The CLI's fast path (actors/cli/server.py): `raylog up` runs the command. A CLI process
    that cannot import Ray at all still gets the answer, and the endpoint refuses a request
    without the cluster's admin token."""
    no_ray = (
        "import sys; sys.modules['ray'] = None; from raylog.actors.cli.main import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", no_ray, "topics", "describe", TOPIC, "--json",
         "--data-dir", str(up.data_dir)],
        capture_output=True, text=True, timeout=WAIT_S, env=cli_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [topic] = json.loads(proc.stdout)
    assert topic["name"] == TOPIC and len(topic["partitions"]) == PARTITIONS
    failed = subprocess.run(
        [sys.executable, "-c", no_ray, "topics", "describe", "nope",
         "--data-dir", str(up.data_dir)],
        capture_output=True, text=True, timeout=WAIT_S, env=cli_env(),
    )  # fmt: skip
    assert failure_line(failed) == "raylog: topic 'nope' does not exist"

    info = json.loads((up.data_dir / "cluster.json").read_text())
    with pytest.raises(ValueError, match="401"):
        cli_server.request(info["admin_port"], "not-the-token", ["topics", "list"])
