"""gateway/quotas.py, pure: KIP-55's resolution order and metric tags, Kafka's sampled rate and
its throttle time formula (with ClientQuotaManagerTest's spike), and one broker's measurements
per (user, client id)."""

from __future__ import annotations

import asyncio

import pytest

from raylog.gateway.quotas import (
    CONSUMER_BYTE_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ClientQuotas,
    SampledRate,
    busy_time,
    resolve,
    throttle_time_ms,
    user_of,
)

P = PRODUCER_BYTE_RATE
# Every one of KIP-55's eight entities, each with its own value, so the answer names the level.
EIGHT = {
    ("u", "c"): 1.0,
    ("u", DEFAULT): 2.0,
    ("u", None): 3.0,
    (DEFAULT, "c"): 4.0,
    (DEFAULT, DEFAULT): 5.0,
    (DEFAULT, None): 6.0,
    (None, "c"): 7.0,
    (None, DEFAULT): 8.0,
}
TAGS = {
    1.0: ("u", "c"),
    2.0: ("u", "c"),
    3.0: ("u", ""),
    4.0: ("u", "c"),
    5.0: ("u", "c"),
    6.0: ("u", ""),
    7.0: ("", "c"),
    8.0: ("", "c"),
}


@pytest.mark.parametrize("level", range(1, 9))
def test_the_most_specific_entity_that_sets_the_key_wins(level: int) -> None:
    # Drop the levels above ``level``: the answer is that level's, with Kafka's metric tags.
    table = {e: {P: v} for e, v in EIGHT.items() if v >= level}
    quota, tags = resolve(table, P, "u", "c")
    assert quota == float(level)
    assert tags == TAGS[float(level)]


@pytest.mark.parametrize(
    ("table", "user", "client_id", "expected"),
    [
        ({}, "u", "c", (None, ("", "c"))),  # no quota: measured per client id, never throttled
        ({("v", None): {P: 9.0}}, "u", "c", (None, ("", "c"))),  # another user's
        ({("u", "d"): {P: 9.0}}, "u", "c", (None, ("", "c"))),  # another client id's
        # Each key resolves on its own: u's consumer quota does not hide c's producer quota.
        (
            {("u", None): {CONSUMER_BYTE_RATE: 1.0}, (None, "c"): {P: 7.0}},
            "u",
            "c",
            (7.0, ("", "c")),
        ),
        # The default user's quota applies to ANONYMOUS as to anyone.
        ({(DEFAULT, None): {P: 6.0}}, "ANONYMOUS", "", (6.0, ("ANONYMOUS", ""))),
    ],
)
def test_resolution_edges(table, user, client_id, expected) -> None:
    assert resolve(table, P, user, client_id) == expected


@pytest.mark.parametrize(
    ("principal", "user"),
    [
        ("User:alice", "alice"),
        ("User:ANONYMOUS", "ANONYMOUS"),
        (None, "ANONYMOUS"),
        ("", "ANONYMOUS"),
    ],
)
def test_the_quota_user_is_the_principals_name(principal, user) -> None:
    assert user_of(principal) == user


def test_a_rate_spreads_a_first_burst_over_the_whole_window() -> None:
    # Kafka's Rate.windowSize counts at least samples - 1 full windows.
    rate = SampledRate(samples=11, window_ms=1000)
    rate.record(10_000, now_ms=0)
    assert rate.window_size_ms(0) == 10_000
    assert rate.measure(0) == pytest.approx(1000.0)
    assert rate.measure(500) == pytest.approx(10_000 / 10.5)


def test_kafkas_spike_example() -> None:
    # ClientQuotaManagerTest.testQuotaViolation: 11 samples of 1 s, quota 500 B/s; 400 B/s for
    # 10 s is within it; a 2300-byte spike half-way into the 11th second makes 6300 B over
    # 10.5 s = 600 B/s, throttled (600 - 500) / 500 * 10.5 s = 2100 ms.
    rate = SampledRate(samples=11, window_ms=1000)
    for second in range(10):
        rate.record(400, now_ms=second * 1000)
        assert throttle_time_ms(rate.measure(second * 1000), 500, 1000, 10**9) == 0
    rate.record(2300, now_ms=10_500)
    assert rate.measure(10_500) == pytest.approx(600.0)
    window_ms = rate.window_size_ms(10_500)
    assert window_ms == 10_500
    assert throttle_time_ms(600.0, 500.0, window_ms, 10**9) == 2100
    # The same through a broker's quotas.
    quotas = ClientQuotas()
    quotas.update([((None, DEFAULT), {P: 500.0})])
    for second in range(10):
        assert quotas.record(P, None, "unknown", 400, now_ms=second * 1000) == 0
    assert quotas.record(P, None, "unknown", 2300, now_ms=10_500) == 2100
    # At most the whole window, 11 s.
    assert quotas.record(P, None, "unknown", 10**9, now_ms=10_500) == 11_000


def test_old_samples_expire() -> None:
    rate = SampledRate(samples=3, window_ms=1000)
    rate.record(3000, now_ms=0)
    assert rate.measure(2999) == pytest.approx(3000 / 2.999)
    assert rate.measure(3000) == 0.0  # the whole window has passed: the sample is reset
    rate.record(100, now_ms=3100)
    assert rate.measure(3100) == pytest.approx(100 / 2.1)  # the reset sample began at 3000


@pytest.mark.parametrize(
    ("rate", "quota", "window_ms", "expected"),
    [(100, 100, 11_000, 0), (99, 100, 11_000, 0), (110, 100, 11_000, 1100), (150, 100, 1000, 500)],
)
def test_throttle_time_formula(rate, quota, window_ms, expected) -> None:
    assert throttle_time_ms(rate, quota, window_ms, 10**9) == expected


def test_a_broker_throttles_only_the_client_over_its_quota() -> None:
    quotas = ClientQuotas()  # 11 samples of 1 s
    quotas.update([((None, "slow"), {P: 1000.0})])
    # 15 kB at once is 1500 B/s over the first 10 s: (1500 - 1000) / 1000 * 10 s.
    assert quotas.record(P, "User:ANONYMOUS", "slow", 15_000, now_ms=0) == 5000
    assert quotas.record(P, "User:ANONYMOUS", "fast", 15_000, now_ms=0) == 0
    # 10 kB over the first 10 s is exactly the quota: not throttled.
    quotas = ClientQuotas()
    quotas.update([((None, "slow"), {P: 1000.0})])
    assert quotas.record(P, None, "slow", 10_000, now_ms=500) == 0
    # Two clients of one user share a user-level quota (one measurement, tags (user, "")).
    quotas.update([(("alice", None), {P: 1000.0})])
    assert quotas.record(P, "User:alice", "a", 6_000, now_ms=0) == 0
    assert quotas.record(P, "User:alice", "b", 6_000, now_ms=0) == 2000
    rows = {(r["user"], r["client_id"]): r for r in quotas.metrics(0)[P]}
    assert rows[("alice", "")]["total"] == 12_000
    assert rows[("alice", "")]["throttled"] == 1
    assert rows[("alice", "")]["throttle_time_ms_total"] == 2000
    assert rows[("alice", "")]["quota"] == 1000.0


def test_unrecord_takes_back_a_throttled_fetch() -> None:
    quotas = ClientQuotas()
    quotas.update([((None, DEFAULT), {CONSUMER_BYTE_RATE: 100.0})])
    assert quotas.record(CONSUMER_BYTE_RATE, None, "c", 5_000, now_ms=0) > 0
    quotas.unrecord(CONSUMER_BYTE_RATE, None, "c", 5_000, now_ms=0)
    assert quotas.record(CONSUMER_BYTE_RATE, None, "c", 500, now_ms=0) == 0


def test_request_percentage_counts_handler_time_and_exempts_authentication() -> None:
    quotas = ClientQuotas()
    quotas.update([((DEFAULT, None), {REQUEST_PERCENTAGE: 10.0})])
    # 10 % of a thread over 10 s is 1 s of handler time; 2 s would be throttled 10 s, but
    # request_percentage's throttle is at most one sample (1 s), as Kafka's.
    assert quotas.record_request_time(18, "User:u", "c", 2.0, now_ms=0) == 0  # ApiVersions
    assert quotas.record_request_time(3, "User:u", "c", 1.0, now_ms=0) == 0
    assert quotas.record_request_time(3, "User:u", "c", 1.0, now_ms=0) == 1000


def test_window_configs_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"quota\.window"):
        ClientQuotas(window_num=0)


def test_busy_time_counts_running_not_waiting() -> None:
    now = [0.0]  # the clock busy_time reads: it moves only when this test moves it

    async def handler() -> str:
        now[0] += 0.02  # running: 20 ms
        await waited.wait()
        now[0] += 0.005  # running again: 5 ms
        return "done"

    async def main() -> tuple[str, float]:
        task = asyncio.ensure_future(busy_time(handler(), lambda: now[0]))
        await asyncio.sleep(0)  # the handler runs until it waits
        now[0] += 0.2  # 200 ms pass while it waits
        waited.set()
        return await task

    waited = asyncio.Event()
    result, busy_s = asyncio.run(main())
    assert result == "done"
    assert busy_s == pytest.approx(0.025)


def test_limited_says_whether_any_quota_applies() -> None:
    quotas = ClientQuotas()
    assert not quotas.limited("User:alice", "app")
    quotas.update([(("alice", None), {REQUEST_PERCENTAGE: 50.0})])
    assert quotas.limited("User:alice", "app")
    assert not quotas.limited("User:bob", "app")
    quotas.update([])
    assert not quotas.limited("User:alice", "app")  # the answers follow the table
