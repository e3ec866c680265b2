"""Transactions through a broker failure on a real embedded cluster (`raylog up`, 3 brokers).

Three confluent-kafka transactional producers (threads) run transactions back to back over the
three partitions of an RF=3 topic (min.insync.replicas=2): six records each, every fourth
transaction aborted on purpose. They go on as an application drives librdkafka: a retriable
error -> the same call again; an abortable one -> ``abort_transaction`` and the next
transaction; a fatal one -> a new producer with the same transactional.id (its
``init_transactions`` fences the old one and settles its transaction either way). A fourth
producer begins a transaction, writes it, and is abandoned: only the coordinator's timeout can
end it. Once every producer has committed, a broker is killed at the moment a producer calls
``commit_transaction`` (records flushed, EndTxn on its way; the others are mid-transaction),
through Ray from a separate process (tests/support/kill_leader.py). The producers keep going
until each has committed transactions ending after the kill; then a read_committed consumer
reads the topic up to every producer's last committed transaction.

- the data case: the broker leading partition 0 of the topic dies (its replicas and broker
  actor; Ray restarts the broker); the producers' coordinators are elsewhere;
- the coordinator case: the whole broker leading the producers' ``__transaction_state``
  partition crashes as ``raylog brokers kill`` crashes it (broker actor and gateway, so the
  coordinator with them; it stays down, so this case comes last and the next module heals).

Proves, in both: every transaction acknowledged as committed is whole to read_committed (all
six records, each once, in the order written); every aborted one, and the abandoned one (aborted
by the timeout of the coordinator that leads its id after the failure), is invisible though its
records are in the log; one whose outcome the producer could not know is all or nothing; no
record appears twice and none belongs to no transaction; and the producers commit again after
the failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from support.cluster import Lines, UpProcess, cli_env, create_durable_topic
from support.waiting import wait_until

from raylog.gateway.internal_topic import partition_for
from raylog.gateway.transactions.records import TransactionStatus, decode_key, decode_value

pytestmark = pytest.mark.slow

PARTITIONS = 3
RECORDS_PER_TXN = 6  # record j of a transaction goes to partition j % PARTITIONS
ABORT_EVERY = 4  # transaction n is aborted on purpose when n % ABORT_EVERY == ABORT_EVERY - 1
PRODUCERS = 3
WARM_UP_COMMITS = 2  # per producer, before the kill
COMMITS_AFTER_KILL = 2  # per producer, ending after the kill
TXNS_MAX = 500  # per producer: the bound of its loop
CALL_ATTEMPTS_MAX = 8  # tries of one retriable librdkafka call
CLIENT_TIMEOUT_S = 60.0
TXN_TIMEOUT_MS = 60_000  # the producers' transaction.timeout.ms: longer than any failover here
# The abandoned transaction's, aborted within this plus the coordinator's
# transaction.abort.timed.out.transaction.cleanup.interval.ms (1 s on the shared cluster).
ABANDONED_TIMEOUT_MS = 5_000
RUN_DEADLINE_S = 150.0
TXN_STATE = "__transaction_state"
PREPARED = (TransactionStatus.PREPARE_COMMIT, TransactionStatus.PREPARE_ABORT)
COMPLETED = (TransactionStatus.COMPLETE_COMMIT, TransactionStatus.COMPLETE_ABORT)
KILL_LEADER = Path(__file__).resolve().parents[1] / "support" / "kill_leader.py"

Outcome = str  # "commit" | "abort" | "unknown" (a fatal error: the producer could not know)


def _values(name: str) -> list[bytes]:
    return [f"{name}.{j}".encode() for j in range(RECORDS_PER_TXN)]


def _txn_of(value: bytes) -> str:
    return value.decode().rsplit(".", 1)[0]


class TxnProducer(threading.Thread):
    """One transactional.id's producer loop (module docstring); ``outcomes`` in the order the
    transactions ended. Sets ``committing`` as it calls ``commit_transaction``."""

    def __init__(
        self, bootstrap: str, topic: str, transactional_id: str, committing: threading.Event
    ) -> None:
        super().__init__(name=transactional_id, daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.transactional_id = transactional_id
        self.committing = committing
        self.stop = threading.Event()  # end with the next committed transaction
        self.outcomes: dict[str, Outcome] = {}
        self.errors: list[str] = []
        self.producers = 0
        self.failure: BaseException | None = None
        self._lock = threading.Lock()

    def ended(self) -> list[tuple[str, Outcome]]:
        with self._lock:
            return list(self.outcomes.items())

    def commits(self, since: int = 0) -> int:
        return sum(outcome == "commit" for _, outcome in self.ended()[since:])

    def run(self) -> None:
        try:
            producer = self._new_producer()
            for n in range(TXNS_MAX):
                name = f"{self.transactional_id}.{n:04d}"
                commit = n % ABORT_EVERY != ABORT_EVERY - 1
                outcome, producer = self._transaction(producer, name, commit)
                with self._lock:
                    self.outcomes[name] = outcome
                if self.stop.is_set() and outcome == "commit":
                    return
            raise AssertionError(f"{self.transactional_id}: {TXNS_MAX} transactions, not stopped")
        except BaseException as exc:  # reported by the test thread
            self.failure = exc

    def _new_producer(self) -> Producer:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": self.transactional_id,
                "linger.ms": 5,
                "transaction.timeout.ms": TXN_TIMEOUT_MS,
            }
        )
        self.producers += 1
        self._call(producer.init_transactions)
        return producer

    def _call(self, call: Callable[[float], None]) -> None:
        """``call(timeout)`` again while librdkafka says its error is retriable."""
        for _ in range(CALL_ATTEMPTS_MAX):
            try:
                call(CLIENT_TIMEOUT_S)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
                self.errors.append(f"retried: {exc.args[0]}")
        raise AssertionError(f"{self.transactional_id}: {CALL_ATTEMPTS_MAX} retriable failures")

    def _transaction(self, producer: Producer, name: str, commit: bool) -> tuple[Outcome, Any]:
        try:
            producer.begin_transaction()
            for j, value in enumerate(_values(name)):
                producer.produce(self.topic, value=value, partition=j % PARTITIONS)
            producer.flush(CLIENT_TIMEOUT_S)
            if not commit:
                self._call(producer.abort_transaction)
                return "abort", producer
            self.committing.set()
            self._call(producer.commit_transaction)
            return "commit", producer
        except KafkaException as exc:
            error = exc.args[0]
            self.errors.append(f"{name}: {error}")
            if error.txn_requires_abort():
                try:
                    self._call(producer.abort_transaction)
                    return "abort", producer
                except KafkaException as again:
                    self.errors.append(f"{name}: abort: {again.args[0]}")
                    error = again.args[0]
            if not error.fatal():
                raise
            return "unknown", self._new_producer()


class Killer:
    """kill_leader.py ``--kill-on-stdin``/``--crash-on-stdin``: joins Ray at once, kills on
    :meth:`go`."""

    def __init__(self, up: UpProcess, topic: str, partition: int, mode: str, log: Path) -> None:
        self.log = log
        with open(log, "w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, str(KILL_LEADER), str(up.data_dir), topic, str(partition), mode],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=cli_env(),
            )
        self.lines = Lines(self.proc)

    def _line(self, needle: str) -> dict[str, Any]:
        try:
            seen = self.lines.wait_for(needle, CLIENT_TIMEOUT_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; stderr {self.log.read_text()[-3000:]}") from None
        return json.loads(seen[-1].split(needle, 1)[1])  # type: ignore[no-any-return]

    def ready(self) -> int:
        return int(self._line("ready:")["leader"])

    def go(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        killed = self._line("killed:")
        assert self.proc.wait(timeout=CLIENT_TIMEOUT_S) == 0, self.log.read_text()[-3000:]
        return killed

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=CLIENT_TIMEOUT_S)


def _partitions(up: UpProcess, topic: str) -> list[dict[str, Any]]:
    [described] = up.document("topics", "describe", topic)
    return described["partitions"]  # type: ignore[no-any-return]


def _txn_state_leaders(up: UpProcess) -> dict[int, int]:
    """Leader of every ``__transaction_state`` partition, the topic created first if missing
    (a transactional producer's first FindCoordinator creates it)."""
    if TXN_STATE not in up.topics():
        setup = Producer({"bootstrap.servers": up.bootstrap, "transactional.id": "txkill-setup"})
        setup.init_transactions(CLIENT_TIMEOUT_S)

    def leaders() -> dict[int, int] | None:
        found = {p["partition"]: p["leader"] for p in _partitions(up, TXN_STATE)}
        return found if all(leader >= 0 for leader in found.values()) else None

    return wait_until(leaders, timeout_s=CLIENT_TIMEOUT_S, interval_s=0.5, message=TXN_STATE)


def _ids(prefix: str, count: int, partitions: int, keep: Callable[[int], bool]) -> list[str]:
    """``count`` transactional ids ``prefix-i`` whose ``__transaction_state`` partition (of
    ``partitions``) passes ``keep``."""
    ids = (f"{prefix}-{i}" for i in range(1000))
    return [tid for tid in ids if keep(partition_for(tid, partitions))][:count]


def _create(up: UpProcess, topic: str) -> None:
    create_durable_topic(up, topic, PARTITIONS)


def _abandon_a_transaction(bootstrap: str, topic: str, transactional_id: str) -> Producer:
    """A transaction begun, written to every partition, and never ended (the producer is
    returned to keep it alive and silent)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": ABANDONED_TIMEOUT_MS,
        }
    )
    producer.init_transactions(CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    for j, value in enumerate(_values(f"{transactional_id}.0000")):
        producer.produce(topic, value=value, partition=j % PARTITIONS)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    return producer


def _read(bootstrap: str, topic: str, isolation: str, last: set[bytes]) -> dict[int, list[bytes]]:
    """Every partition's values in offset order, once all of ``last`` are read (assign from
    offset 0, no group)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])

        def all_read() -> bool:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is None:
                    got[msg.partition()].append(msg.value())
            return last <= {v for values in got.values() for v in values}

        wait_until(all_read, timeout_s=RUN_DEADLINE_S, message=f"{isolation}: {sorted(last)}")
    finally:
        consumer.close()
    return got


def _caught_mid_commit(bootstrap: str, partition: int, ids: list[str]) -> list[str]:
    """The transactions of ``ids`` whose Prepare state one leader of ``__transaction_state``-
    ``partition`` wrote and whose Complete state a later one did: those the kill caught between
    EndTxn and completion (read from the partition itself, each batch's leader epoch)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    prepared: dict[str, int] = {}  # id -> the leader epoch of its last Prepare state
    caught: list[str] = []
    try:
        _, end = consumer.get_watermark_offsets(
            TopicPartition(TXN_STATE, partition), timeout=CLIENT_TIMEOUT_S
        )
        consumer.assign([TopicPartition(TXN_STATE, partition, 0)])
        position = [0]

        def read_to_end() -> bool:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is not None:
                    continue
                position[0] = msg.offset() + 1
                tid = decode_key(msg.key()).transactional_id
                if tid not in ids or msg.value() is None:
                    continue
                status, epoch = decode_value(msg.value()).transaction_status, msg.leader_epoch()
                if status in PREPARED:
                    prepared[tid] = epoch
                elif status in COMPLETED and prepared.pop(tid, epoch) != epoch:
                    caught.append(f"{tid}@{msg.offset()}")
            return position[0] >= end

        wait_until(read_to_end, timeout_s=CLIENT_TIMEOUT_S, message=f"{TXN_STATE}-{partition}")
    finally:
        consumer.close()
    return caught


def _check(producers: list[TxnProducer], read: dict[int, list[bytes]]) -> None:
    """The module docstring's promises, on what read_committed returned."""
    everything = [v for values in read.values() for v in values]
    assert len(everything) == len(set(everything)), "a record read twice"
    found: dict[str, set[bytes]] = {}
    for value in everything:
        found.setdefault(_txn_of(value), set()).add(value)
    outcomes = {name: o for p in producers for name, o in p.ended()}
    assert found.keys() <= outcomes.keys(), f"not committed: {sorted(found.keys() - outcomes)}"
    for name, outcome in outcomes.items():
        whole, got = set(_values(name)), found.get(name, set())
        if outcome == "commit":
            assert got == whole, f"{name} committed, read {sorted(got)}"
        elif outcome == "abort":
            assert not got, f"{name} aborted, read {sorted(got)}"
        else:
            assert got in (set(), whole), f"{name} ({outcome}) read in part: {sorted(got)}"
    for partition, values in read.items():
        for producer in producers:
            mine = [v for v in values if v.startswith(f"{producer.transactional_id}.".encode())]
            assert mine == sorted(mine), f"{producer.transactional_id}: order in {partition}"


def _run_through_a_kill(
    up: UpProcess, topic: str, ids: list[str], killer: Killer
) -> tuple[int, list[TxnProducer]]:
    """The module docstring's run; returns the killed broker and the producers, stopped."""
    committing = threading.Event()
    producers = [TxnProducer(up.bootstrap, topic, tid, committing) for tid in ids[:PRODUCERS]]
    abandoned: Producer | None = None
    for producer in producers:
        producer.start()

    def progress(enough: Callable[[TxnProducer], bool]) -> Callable[[], bool]:
        def probe() -> bool:
            failed = [p.failure for p in producers if p.failure is not None]
            if failed:
                raise failed[0]
            return all(enough(p) for p in producers)

        return probe

    try:
        wait_until(
            progress(lambda p: p.commits() >= WARM_UP_COMMITS),
            timeout_s=RUN_DEADLINE_S,
            message="commits before the kill",
        )
        leader = killer.ready()
        # Begun now, its timeout runs out after the kill: the coordinator leading its id then
        # must abort it (in the coordinator case, one that took the id over from the log).
        abandoned = _abandon_a_transaction(up.bootstrap, topic, ids[PRODUCERS])
        committing.clear()
        wait_until(committing.is_set, timeout_s=CLIENT_TIMEOUT_S, message="a commit under way")
        killed = killer.go()
        assert killed["leader"] == leader
        marks = {p.name: len(p.ended()) for p in producers}
        wait_until(
            progress(lambda p: p.commits(since=marks[p.name]) >= COMMITS_AFTER_KILL),
            timeout_s=RUN_DEADLINE_S,
            interval_s=0.2,
            message="commits after the kill",
        )
    finally:
        killer.close()
        for producer in producers:
            producer.stop.set()
        for producer in producers:
            producer.join(timeout=RUN_DEADLINE_S)
    failed = [p.failure for p in producers if p.failure is not None or p.is_alive()]
    assert not failed, failed
    last = {v for p in producers for v in _values(p.ended()[-1][0])}
    _check(producers, _read(up.bootstrap, topic, "read_committed", last))
    # The aborted and abandoned records are in the log: read_committed left them out.
    raw = _read(up.bootstrap, topic, "read_uncommitted", last)
    logged = {_txn_of(v) for values in raw.values() for v in values}
    assert f"{ids[PRODUCERS]}.0000" in logged
    assert any(o == "abort" and n in logged for p in producers for n, o in p.ended())
    assert abandoned is not None  # kept alive (silent) until here
    for p in producers:  # a figure for the report (pytest -s)
        tally = {o: sum(x == o for _, x in p.ended()) for o in ("commit", "abort", "unknown")}
        print(f"{p.name}: {tally}, {p.producers} producer(s), errors {p.errors[:5]}")
    return leader, producers


@pytest.fixture
def up(shared_up: UpProcess) -> Iterator[UpProcess]:
    shared_up.heal()  # the other case killed a broker
    yield shared_up


def test_transactions_survive_the_death_of_a_data_partition_leader(
    up: UpProcess, tmp_path: Path
) -> None:
    topic = "txkill-data"
    _create(up, topic)
    leaders = _txn_state_leaders(up)
    victim = next(p["leader"] for p in _partitions(up, topic) if p["partition"] == 0)
    ids = _ids("txkill-data", PRODUCERS + 1, len(leaders), lambda p: leaders[p] != victim)
    killer = Killer(up, topic, 0, "--kill-on-stdin", tmp_path / "killer.log")
    leader, _ = _run_through_a_kill(up, topic, ids, killer)
    assert leader == victim
    [partition] = [p for p in _partitions(up, topic) if p["partition"] == 0]
    assert partition["leader_epoch"] > 0, f"leader {leader} was never replaced: {partition}"
    deleted = up.raylog("topics", "delete", topic)  # its replicas would slow the next heal
    assert deleted.returncode == 0, deleted.stderr


def test_transactions_survive_the_crash_of_their_coordinator(up: UpProcess, tmp_path: Path) -> None:
    topic = "txkill-coordinator"
    _create(up, topic)
    leaders = _txn_state_leaders(up)
    coordinated = partition_for("txkill-coord-0", len(leaders))
    ids = _ids("txkill-coord", PRODUCERS + 1, len(leaders), lambda p: p == coordinated)
    killer = Killer(up, TXN_STATE, coordinated, "--crash-on-stdin", tmp_path / "killer.log")
    leader, _ = _run_through_a_kill(up, topic, ids, killer)
    assert leader == leaders[coordinated]
    now = next(p["leader"] for p in _partitions(up, TXN_STATE) if p["partition"] == coordinated)
    assert now not in (leader, -1), "the coordinator's partition has a new leader"
    # Not asserted (a matter of timing): which transactions the crash caught after EndTxn.
    caught = _caught_mid_commit(up.bootstrap, coordinated, ids)
    print(f"caught between EndTxn and completion: {caught}")
