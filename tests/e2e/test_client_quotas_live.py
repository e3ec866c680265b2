"""Client quotas on a live `raylog up`: `raylog quotas` and a Kafka admin client manage the same
quotas, and the gateways enforce them.

On the session's shared embedded cluster. Proves:

- `raylog quotas alter` and kafka-python's admin transport (AlterClientQuotas v1, through a
  broker's gateway to the controller) set quotas that both `raylog quotas describe --json` and
  DescribeClientQuotas v1 list alike; a bad value fails in one line (INVALID_REQUEST, 42);
- once the gateways' metadata poll carries it, a kafka-python producer whose client id has a
  low producer_byte_rate gets responses with throttle_time_ms > 0, while a producer with
  another client id, sending the same records to the same partition, gets none.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.protocol.admin import AlterClientQuotasRequest, DescribeClientQuotasRequest
from support.cluster import UpProcess

pytestmark = pytest.mark.slow

TIMEOUT_S = 60.0
TOPIC = "quota-e2e"
SLOW, FAST, OTHER = "e2e-quota-slow", "e2e-quota-fast", "e2e-quota-other"
RATE = 10_000  # bytes/s: the first ~100 kB (11 samples of 1 s) are free, then it throttles
RECORD = b"q" * 2_000


@pytest.fixture(scope="module")
def up(shared_up: UpProcess) -> UpProcess:
    return shared_up


def raylog(up: UpProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return up.raylog(*args, timeout_s=TIMEOUT_S)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def ask(admin: KafkaAdminClient, request: Any) -> Any:
    return admin._manager.run(admin._manager.send, request)


def throttle_time_max(producer: KafkaProducer) -> float:
    return max(
        (
            v
            for group in producer.metrics().values()
            for k, v in group.items()
            if k == "throttle-time-max"
        ),
        default=0.0,
    )


def test_quotas_from_the_cli_and_an_admin_client_are_enforced(up: UpProcess) -> None:
    ok(raylog(up, "topics", "create", TOPIC, "--partitions", "1", "--replication-factor", "1"))
    admin = KafkaAdminClient(bootstrap_servers=up.bootstrap, request_timeout_ms=30_000)
    try:
        ok(
            raylog(
                up, "quotas", "alter", "--client-id", SLOW, "--set", f"producer_byte_rate={RATE}"
            )
        )
        entry = AlterClientQuotasRequest.EntryData
        done = ask(
            admin,
            AlterClientQuotasRequest(
                entries=[
                    entry(
                        entity=[
                            entry.EntityData(entity_type="user", entity_name="ANONYMOUS"),
                            entry.EntityData(entity_type="client-id", entity_name=OTHER),
                        ],
                        ops=[entry.OpData(key="request_percentage", value=50.0, remove=False)],
                    )
                ],
                validate_only=False,
            ),
        )
        assert [e.error_code for e in done.entries] == [0]
        bad = raylog(up, "quotas", "alter", "--user", "u", "--set", "producer_byte_rate=-1")
        assert bad.returncode == 1
        assert bad.stderr.strip().splitlines()[-1] == (
            "raylog: user=u: InvalidRequestError: Quota producer_byte_rate must be greater than 0"
        )

        expected = [
            {"entity": {"client-id": SLOW}, "values": {"producer_byte_rate": float(RATE)}},
            {
                "entity": {"user": "ANONYMOUS", "client-id": OTHER},
                "values": {"request_percentage": 50.0},
            },
        ]
        from_cli = json.loads(ok(raylog(up, "quotas", "describe", "--json")))
        assert [e for e in from_cli if e in expected] == expected
        found = ask(admin, DescribeClientQuotasRequest(components=[], strict=False))
        from_admin = [
            {
                "entity": {e.entity_type: e.entity_name for e in item.entity},
                "values": {v.key: v.value for v in item.values},
            }
            for item in found.entries
        ]
        assert [e for e in from_admin if e in expected] == expected
        table = ok(raylog(up, "quotas", "describe", "--client-id", SLOW))
        assert table.strip() == (
            f"Quota configs for client-id={SLOW} are producer_byte_rate={RATE}"
        )
    finally:
        admin.close()

    slow = KafkaProducer(bootstrap_servers=up.bootstrap, client_id=SLOW, linger_ms=0)
    fast = KafkaProducer(bootstrap_servers=up.bootstrap, client_id=FAST, linger_ms=0)
    try:
        sent = 0
        deadline = time.monotonic() + TIMEOUT_S
        # Until throttled: the gateways learn the quota from their next metadata poll.
        while throttle_time_max(slow) == 0:
            assert time.monotonic() < deadline, f"{SLOW} not throttled after {sent} records"
            slow.send(TOPIC, RECORD).get(timeout=TIMEOUT_S)
            sent += 1
        for _ in range(sent):
            fast.send(TOPIC, RECORD).get(timeout=TIMEOUT_S)
        assert throttle_time_max(slow) > 0
        assert throttle_time_max(fast) == 0
    finally:
        slow.close()
        fast.close()
        for client_id in (SLOW, OTHER):
            user = ["--user", "ANONYMOUS"] if client_id == OTHER else []
            key = "request_percentage" if client_id == OTHER else "producer_byte_rate"
            ok(raylog(up, "quotas", "alter", *user, "--client-id", client_id, "--delete", key))
