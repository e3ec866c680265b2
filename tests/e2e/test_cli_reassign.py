"""`raylog reassign` against the shared live `raylog up` (three brokers), as a user runs it.

Proves: reassigning an RF=2 partition onto the broker that did not hold it, with a throttle,
prints progress and "Completed", and then `topics describe` shows the new replicas and ISR while
every record produced before (confluent-kafka, acks=all) is still consumed back; `--list` shows
nothing running; `--json --no-wait` returns at once with the started partition; a cancel with
nothing running, an unknown broker and a missing --partition each exit 1 with a one-line reason.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from support.cluster import UpProcess
from support.waiting import wait_until

pytestmark = pytest.mark.slow

TIMEOUT_S = 60.0
RECORDS = 200


def _json(stdout: str) -> Any:
    """The JSON document of a --json command. Ray's raylet may print a warning line to a
    driver's stdout under load (e.g. "(raylet) WARNING: 12 PYTHON worker processes..."), so
    the document starts at the first line that opens one."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line[:1] in ("{", "["))
    return json.loads("\n".join(lines[start:]))


def _describe(up: UpProcess, topic: str) -> dict:
    out = up.raylog("topics", "describe", topic, "--json")
    assert out.returncode == 0, out.stderr
    return _json(out.stdout)[0]["partitions"][0]


def _produce(bootstrap: str, topic: str) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False}
    )
    failed: list[str] = []
    for i in range(RECORDS):
        producer.produce(
            topic,
            key=str(i),
            value=f"v{i}" * 50,
            on_delivery=lambda e, _m: e and failed.append(str(e)),
        )
    assert producer.flush(TIMEOUT_S) == 0
    assert not failed, failed


def _consume_all(bootstrap: str, topic: str) -> set[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])  # no group needed
    keys: set[str] = set()
    try:
        for _ in range(600):  # bounded: each poll waits at most 0.1 s once data flows
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                keys.add(msg.key().decode())
            if len(keys) == RECORDS:
                break
    finally:
        consumer.close()
    return keys


def test_reassign_command_moves_a_partition_and_reports(shared_up: UpProcess) -> None:
    up = shared_up
    created = up.raylog("topics", "create", "moves", "--partitions", "1",
                        "--replication-factor", "2")  # fmt: skip
    assert created.returncode == 0, created.stderr
    _produce(up.bootstrap, "moves")
    before = _describe(up, "moves")
    spare = ({1, 2, 3} - set(before["replicas"])).pop()
    target = [spare, before["replicas"][0]]
    moved = up.raylog(
        "reassign", "--topic", "moves", "--partition", "0",
        "--replicas", ",".join(map(str, target)), "--throttle", "200000", "--timeout", "60",
        timeout_s=120,
    )  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    assert "Completed reassignment of partitions moves-0" in moved.stdout, moved.stdout
    after = _describe(up, "moves")
    assert after["replicas"] == target
    assert sorted(after["isr"]) == sorted(target)
    assert after["leader"] in target
    assert _consume_all(up.bootstrap, "moves") == {str(i) for i in range(RECORDS)}

    listed = up.raylog("reassign", "--list", "--json")
    assert listed.returncode == 0 and _json(listed.stdout) == {"reassignments": []}

    back = up.raylog(
        "reassign", "--topic", "moves", "--partition", "0",
        "--replicas", ",".join(map(str, before["replicas"])), "--no-wait", "--json",
    )  # fmt: skip
    assert back.returncode == 0, back.stderr
    doc = _json(back.stdout)
    assert doc["partitions"] == [{"topic": "moves", "partition": 0}] and doc["errors"] == []
    wait_until(
        lambda: _json(up.raylog("reassign", "--list", "--json").stdout) == {"reassignments": []},
        timeout_s=TIMEOUT_S,
        interval_s=0.5,
        message="the move back completes",
    )
    cancel = up.raylog("reassign", "--cancel", "--topic", "moves", "--partition", "0")
    assert cancel.returncode == 1 and "NoReassignmentInProgressError" in cancel.stderr

    unknown = up.raylog("reassign", "--topic", "moves", "--partition", "0",
                        "--replicas", "1,9")  # fmt: skip
    assert unknown.returncode == 1
    assert "InvalidReplicaAssignmentError" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1

    missing = up.raylog("reassign", "--topic", "moves", "--replicas", "1,2")
    assert missing.returncode == 1 and "--partition" in missing.stderr
