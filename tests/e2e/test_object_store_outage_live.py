"""The object store unreachable, then slow, under a running cluster (issue 31's scenario).

A `raylog up` of its own (3 brokers, lease 6 s, sessions 9 s) whose object store is moto's S3
server reached through a fault-injecting proxy (``support.tcp_proxy``); a topic with 2
partitions, RF=3, min.insync.replicas=2; an idempotent confluent-kafka producer (acks=all, a
message timeout longer than the test) producing throughout in a thread; a consumer group
committing its offsets in another; a watcher process asking both controllers whether they are
active and every replica what it leads, five times a second (``support.controller_watch``).

Proves, with the store cut for longer than the controller lease plus the brokers' session
lease: never two controllers active; none active from the lease deadline on; the producer's
records stop being acknowledged once the brokers' leases lapse, while a consumer still reads
what was acknowledged before; restored, a controller is active again and writes resume. With
every request to the store taking a second, a controller stays active and writes go on; with
every request taking 4 s (longer than the lease's renewals bear), never two controllers active.
At the end: every acknowledged record is in the log exactly once, in send order,
at the offset its acknowledgement gave; the group's offset committed before the outage is
still committed (or a later one); every replica's log holds the same bytes below the high
watermark; each leader epoch was led by one replica only and leader epochs never go down along
a log. A failure prints the timeline and every replica's batch headers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cluster import UpProcess, cli_env, create_durable_topic, started_up
from support.consuming import Consuming, committed_offsets
from support.controller_watch import ControllerWatch
from support.producing import Producing
from support.read_back import (
    batch_headers,
    check_exactly_once,
    read_back,
    replica_batches,
    sent_ends,
)
from support.tcp_proxy import TcpProxy
from support.waiting import wait_until

pytestmark = pytest.mark.slow

TOPIC = "store-outage"
GROUP = "store-outage-group"
PARTITIONS = 2
LEASE_S = 6.0  # `raylog up`'s controller lease (actors/cluster/embedded.py)
SESSION_S = 9.0  # broker.session.timeout.ms, `raylog up`'s default
# Leaders refuse writes by the controller's lease deadline plus a session (less its guard); an
# acknowledgement may trail the write it answers by the followers' next fetch.
ACK_SLACK_S = 1.0
OUTAGE_S = LEASE_S + SESSION_S + 3.0  # the store cut this long: past both leases
# A slow store: each request's bytes held this long each way. A controller renews its lease
# one request after another, each from the answer to the one before: the lease holds while a
# request takes under half of lease - guard (2.7 s).
SLOW_EACH_WAY_S = 0.5
SLOW_FOR_S = 15.0
TOO_SLOW_EACH_WAY_S = 2.0
TOO_SLOW_FOR_S = LEASE_S + 4.0
PACE_S = 0.01  # the producer's poll between records
COMMIT_EVERY_S = 0.5
MESSAGE_TIMEOUT_S = 300.0
WAIT_S = 60.0
ACKED_FIRST = 300
MARKS: dict[str, float] = {}  # what happened when (time.monotonic()), printed at the end


@pytest.fixture(scope="module")
def store_proxy(moto_server: str) -> Iterator[TcpProxy]:
    port = int(moto_server.rsplit(":", 1)[1])
    proxy = TcpProxy(port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
    store_proxy: TcpProxy,
    s3_client_kwargs: dict[str, Any],
    create_bucket: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[UpProcess]:
    """`raylog up` on a fresh bucket of the session's moto server, through ``store_proxy``."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_client_kwargs["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_client_kwargs["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3_client_kwargs["region_name"])
    up = started_up(
        lambda: tmp_path_factory.mktemp("store-outage"),
        "--object-store", f"s3://{create_bucket()}/c",
        "--s3-endpoint", f"http://{store_proxy.address}",
    )  # fmt: skip
    try:
        yield up
    finally:
        store_proxy.restore()
        store_proxy.delay(0.0, 0.0)
        up.__exit__(None, None, None)


def _in_sync(watch: ControllerWatch) -> dict[tuple[str, int], int] | None:
    """Each partition's high watermark once every replica of it answered with the leader's
    log end and high watermark (none behind); None until then."""
    rounds = watch.rounds()
    if not rounds:
        return None
    by_partition: dict[tuple[str, int], list[list[Any]]] = {}
    for r in rounds[-1]["replicas"]:
        by_partition.setdefault((r[0], r[1]), []).append(r)
    hws = {}
    for key, rows in by_partition.items():
        if len(rows) != 3 or sum(r[3] == "leader" for r in rows) != 1:
            return None
        if len({(r[5], r[6]) for r in rows}) != 1 or rows[0][5] != rows[0][6]:
            return None
        hws[key] = rows[0][5]
    return hws if (TOPIC, 0) in hws else None


def _check_replica_logs(data_dir: Path, hws: dict[tuple[str, int], int]) -> None:
    """Every replica's batches below the high watermark are the same bytes; leader epochs
    never go down along a log."""
    for (topic, partition), hw in sorted(hws.items()):
        logs = {
            d.parent.name: [(h, b) for h, b in replica_batches(d) if h.last_offset < hw]
            for d in sorted(data_dir.glob(f"broker-*/{topic}-{partition}"))
        }
        assert len(logs) == 3, f"{topic}-{partition}: replica dirs {sorted(logs)}"
        first = next(iter(logs.values()))
        for name, batches in logs.items():
            assert [b for _, b in batches] == [b for _, b in first], (
                f"{topic}-{partition}: {name} differs below the high watermark {hw}"
            )
        if hw > 0:
            assert first and first[-1][0].last_offset == hw - 1, f"{topic}-{partition}: short"
        epochs = [h.partition_leader_epoch for h, _ in first]
        assert epochs == sorted(epochs), f"{topic}-{partition}: leader epochs go down"


def _leaders_by_epoch(watch: ControllerWatch) -> dict[tuple[str, int, int], set[int]]:
    seen: dict[tuple[str, int, int], set[int]] = {}
    for r in watch.rounds():
        for topic, partition, replica, role, epoch, _, _ in r["replicas"]:
            if role == "leader":
                seen.setdefault((topic, partition, epoch), set()).add(replica)
    return seen


def _one_controller_at_most(watch: ControllerWatch) -> None:
    for r in watch.rounds():
        # A round shorter than the lease's guard (0.6 s) cannot straddle a handover.
        if r["done"] - r["sent"] < 0.5:
            assert len(r["active"]) <= 1, f"two active controllers: {r}"


def _observe(seconds: float, check: Callable[[], None]) -> None:
    """Run ``check`` every 0.2 s for ``seconds``: the scenario holds that long."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded by the deadline
        check()
        time.sleep(0.2)


def _timeline(watch: ControllerWatch, t0: float) -> str:
    """Each change of the active set, relative to ``t0``."""
    out, last = [], None
    for r in watch.rounds():
        now = (tuple(r["active"]), tuple(r["answered"]))
        if now != last:
            out.append(f"{r['sent'] - t0:+7.2f}s active={r['active']} answered={r['answered']}")
            last = now
    return "\n".join(out)


def _cut(up: UpProcess, proxy: TcpProxy, watch: ControllerWatch, producing: Producing) -> None:
    """(1) The store cut for longer than the controller lease and the brokers' leases: the
    controller steps down by its deadline, writes stop once the brokers' leases lapse, a
    consumer reads what was acknowledged before. (2) Restored: a controller is active again and
    writes resume."""
    acked_before = dict(producing.acked)
    cut_at = MARKS["cut"] = time.monotonic()
    proxy.cut()
    _observe(LEASE_S + 1.0, lambda: _one_controller_at_most(watch))
    # Each partition's records are acknowledged in order: those acked are its first ones.
    ends = {p: sum(1 for v in acked_before if int(v) % PARTITIONS == p) for p in range(PARTITIONS)}
    read_during = read_back(up.bootstrap, TOPIC, ends, WAIT_S)
    assert all(len(read_during[p]) == ends[p] for p in ends)
    MARKS["read back in the outage"] = time.monotonic()
    _observe(max(0.0, cut_at + OUTAGE_S - time.monotonic()), lambda: _one_controller_at_most(watch))
    sent_in_outage = producing.sent
    restore_at = MARKS["restore"] = time.monotonic()
    proxy.restore()

    during = [r for r in watch.rounds() if cut_at <= r["sent"] < restore_at]
    stepped_down = next((r["sent"] for r in during if not r["active"]), None)
    assert stepped_down is not None, "the controller stepped down"
    MARKS["no controller active"] = stepped_down
    assert not [r for r in during if r["sent"] >= cut_at + LEASE_S and r["active"]], (
        "a controller active after its lease deadline"
    )
    last_ack = max((t for t in producing.ack_times() if cut_at <= t < restore_at), default=cut_at)
    MARKS["last ack in the outage"] = last_ack
    assert last_ack < cut_at + LEASE_S + SESSION_S + ACK_SLACK_S, (
        f"acknowledged {last_ack - cut_at:.1f} s into the outage"
    )
    assert sent_in_outage > len(acked_before), "the producer kept producing"

    acked_at_restore = len(producing.acked)
    wait_until(
        lambda: len(producing.acked) >= acked_at_restore + 200,
        timeout_s=WAIT_S,
        interval_s=0.1,
        message="writes resumed after the store came back",
    )
    again = [r for r in watch.rounds() if r["sent"] >= restore_at and r["active"]]
    assert again, "a controller active again"
    MARKS["active again"] = again[0]["sent"]
    MARKS["first ack after"] = min(t for t in producing.ack_times() if t >= restore_at)


def _slow(proxy: TcpProxy, watch: ControllerWatch, producing: Producing) -> None:
    """(3) Every request to the store slow, within what the lease bears: a controller stays
    active and writes go on. Slower than that: never two controllers active; fast again: a
    controller is active and writes go on."""
    slow_at = MARKS["slow"] = time.monotonic()
    proxy.delay(SLOW_EACH_WAY_S, SLOW_EACH_WAY_S)
    _observe(SLOW_FOR_S, lambda: _one_controller_at_most(watch))
    too_slow_at = MARKS["too slow"] = time.monotonic()
    proxy.delay(TOO_SLOW_EACH_WAY_S, TOO_SLOW_EACH_WAY_S)
    _observe(TOO_SLOW_FOR_S, lambda: _one_controller_at_most(watch))
    proxy.delay(0.0, 0.0)
    fast_at = MARKS["fast again"] = time.monotonic()
    acked_when_fast = len(producing.acked)
    again = wait_until(
        lambda: [r["sent"] for r in watch.rounds() if r["sent"] >= fast_at and r["active"]],
        timeout_s=WAIT_S,
        interval_s=0.2,
        message="a controller active once the store is fast again",
    )
    MARKS["active again after slow"] = again[0]
    wait_until(
        lambda: len(producing.acked) >= acked_when_fast + 100,
        timeout_s=WAIT_S,
        interval_s=0.1,
        message="writes going on once the store is fast again",
    )

    for start, end, each_way in (
        (slow_at, too_slow_at, SLOW_EACH_WAY_S),
        (too_slow_at, fast_at, TOO_SLOW_EACH_WAY_S),
    ):
        rounds = [r for r in watch.rounds() if start <= r["sent"] < end]
        inactive = [r["sent"] for r in rounds if not r["active"]]
        acked = sum(1 for t in producing.ack_times() if start <= t < end)
        print(
            f"store requests {2 * each_way:.1f} s each: {len(inactive)}/{len(rounds)} rounds "
            f"without an active controller, {acked} records acknowledged"
        )
        if inactive:
            MARKS[f"{2 * each_way:.1f} s requests: no controller active"] = inactive[0]
        if each_way == SLOW_EACH_WAY_S:
            assert rounds and not inactive, "no active controller with a slow store"
            assert acked >= 100, "writes go on with a slow store"


def test_store_cut_then_slow_under_load(cluster: UpProcess, store_proxy: TcpProxy) -> None:
    up, proxy = cluster, store_proxy
    create_durable_topic(up, TOPIC, PARTITIONS)
    watch = ControllerWatch(up.data_dir, cli_env()).start()
    producing, consuming = (
        Producing(up.bootstrap, TOPIC, PARTITIONS, MESSAGE_TIMEOUT_S, PACE_S),
        Consuming(up.bootstrap, TOPIC, GROUP, COMMIT_EVERY_S, WAIT_S),
    )
    MARKS.clear()
    started = time.monotonic()
    try:
        producing.start()
        consuming.start()
        wait_until(
            lambda: len(producing.acked) >= ACKED_FIRST and consuming.committed,
            timeout_s=WAIT_S,
            interval_s=0.1,
            message="records acknowledged and an offset committed",
        )
        committed_before = dict(consuming.committed)
        _cut(up, proxy, watch, producing)
        _slow(proxy, watch, producing)

        # (4) Stop producing; check everything.
        producing.stop(WAIT_S)
        assert not producing.is_alive(), "the producer thread did not stop"
        assert producing.producer.flush(WAIT_S) == 0
        consuming.stop()
        assert not consuming.is_alive(), "the consumer thread did not stop"
        assert not consuming.went_back, consuming.went_back
        assert not producing.errors, producing.errors[:3]
        sent = producing.sent
        assert len(producing.acked) == sent, "every record is acknowledged"
        log = read_back(up.bootstrap, TOPIC, sent_ends(sent, PARTITIONS), WAIT_S)
        check_exactly_once(log, sent, producing.acked)

        after = committed_offsets(up.bootstrap, TOPIC, GROUP, PARTITIONS, WAIT_S)
        for p, offset in committed_before.items():
            assert after[p] >= offset, f"partition {p}: committed {offset}, now {after[p]}"
        assert after == {p: consuming.committed[p] for p in after}, "the last commit holds"

        hws = wait_until(
            lambda: _in_sync(watch), timeout_s=WAIT_S, interval_s=0.5, message="replicas in sync"
        )
        ends = {p: hws[(TOPIC, p)] for p in range(PARTITIONS)}
        assert ends == sent_ends(sent, PARTITIONS), "nothing more in the log"
        _check_replica_logs(up.data_dir, hws)
        shared = {k: v for k, v in _leaders_by_epoch(watch).items() if len(v) > 1}
        assert not shared, f"leader epochs led by more than one replica: {shared}"
    except AssertionError:
        print("\n".join(batch_headers(up.data_dir, TOPIC)))
        raise
    finally:
        producing.abandon(WAIT_S)
        consuming.stop()
        watch.stop()
        for name, t in sorted(MARKS.items(), key=lambda kv: kv[1]):
            print(f"{t - started:7.2f}s {name}")
        print(_timeline(watch, started))
        print(f"{len(consuming.commit_errors)} commits failed: {consuming.commit_errors[:2]}")
