"""Bulk reads of committed offset ranges over Ray: shared by the Spark and Ray Data readers.

Owns three things:

1. Joining the cluster (:func:`connect`): once per process, with the cluster's token. Spark's
   Python workers are processes the JVM starts; Ray reads ``RAY_AUTH_MODE`` and
   ``RAY_AUTH_TOKEN_PATH`` when it is imported, so they are set here before ``import ray``.
   The connection is cached at module level and reused by every partition the worker reads.
   :func:`controller_catalog` asks the active controller for the cluster's metadata.
2. Planning (:func:`plan`): topics and partitions from a :class:`~raylog.pipelines.catalog.
   Catalog`, start/end offsets resolved against the partitions' log start offset and last
   fetchable offset (asked of the leader: the high watermark, or for read_committed the last
   stable offset), ``failOnDataLoss`` applied, ranges split for ``minPartitions``. Planning is
   pure given the bounds, so it is tested without Ray.
3. Reading one range (:func:`read_range`): ``ReplicaActor.read_committed`` in a loop with the
   next fetch in flight while the previous response is decoded, from the preferred replica
   (:func:`~raylog.pipelines.catalog.read_order`), yielding Arrow record batches. A replica on
   this process's Ray node is read short-circuit: it says where the batches lie in its segment
   files and they are read here (:class:`_Fetcher`).

Kafka's ``isolation.level`` applies to all three: read_uncommitted (the default, as for
Kafka's consumer) reads up to the high watermark; read_committed (:data:`READ_COMMITTED`)
plans and reads up to the last stable offset (the replica clips its answers there) and drops
the records of aborted transactions (:class:`~raylog.pipelines.records.AbortedTransactions`).
Control batches (transaction markers) are never rows.
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from raylog.actors import raycluster
from raylog.actors.calls import (
    CONTROLLERS,
    NAMESPACE,
    controller_actor_name,
    replica_actor_name,
)
from raylog.pipelines import records
from raylog.pipelines.catalog import (
    Catalog,
    PartitionInfo,
    StaticCatalog,
    catalog_from_metadata,
    read_order,
)
from raylog.storage import batch as rb
from raylog.storage import short_circuit
from raylog.storage.errors import RaylogError
from raylog.storage.short_circuit import ReadStats

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
OFFSET_OUT_OF_RANGE = 1  # Kafka error code
READ_UNCOMMITTED = 0  # Kafka's IsolationLevel, as the replica's calls take it
READ_COMMITTED = 1
ISOLATION_LEVELS = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}
FETCH_MAX_BYTES = 8 << 20  # per fetch call: few round trips, bounded memory per task
# The planner locates up to this much of each range's start (:func:`locate`), so that a task on
# the replica's node reads it with no call at all (within the replica's consumer fetch cap).
LOCATE_MAX_BYTES = 48 << 20
CALL_TIMEOUT_S = 30.0  # a replica that does not answer a call in this long is skipped
# A replica whose high watermark is still below the planned end (a follower catching up) is
# long-polled this long in total before the reader moves to the next replica.
CATCH_UP_WAIT_S = 10.0
LONG_POLL_MS = 500
FETCH_CALLS_MAX = 1_000_000  # bound on the fetch loop of one range (each call advances)
READ_PASSES_MAX = 3  # passes over a range's replicas before a read fails
READ_PASS_PAUSE_S = 2.0  # between passes: about the controller's failover time


class DataLossError(RuntimeError):
    """Requested offsets are no longer in the log (below its log start offset)."""


# ---------------------------------------------------------------------------------------------
# 1. Joining the cluster.


@dataclass(frozen=True)
class ClusterTarget:
    """How a process joins a raylog cluster: a Ray address and the env it needs (token)."""

    ray_address: str
    env: tuple[tuple[str, str], ...]

    @classmethod
    def resolve(cls, cluster: str) -> ClusterTarget:
        """``cluster`` is a data dir holding ``cluster.json`` or a Ray address.

        With an address, the token and the other Ray variables come from this process's
        environment (a driver that has joined the cluster, or was set up to).
        """
        path = Path(cluster)
        if (path / raycluster.CLUSTER_FILE).exists():
            info = raycluster.read_cluster_info(path)
            if info is None:
                raise ValueError(f"cluster {cluster!r}: cluster.json names no running cluster")
            # What raycluster.ray_env gives a joining process, from the recorded values
            # (ray_env itself would create a token file in a data dir that lacks one).
            env = {
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": info.token_path,
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                "RAY_TMPDIR": info.ray_temp_dir,
                "RAY_USAGE_STATS_ENABLED": "0",
            }
            return cls(info.ray_address, tuple(sorted(env.items())))
        if path.is_dir():
            raise ValueError(f"cluster {cluster!r} is a directory without cluster.json")
        keys = (
            "RAY_AUTH_MODE",
            "RAY_AUTH_TOKEN_PATH",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
            "RAY_TMPDIR",
            "RAY_USAGE_STATS_ENABLED",
        )
        env = {k: os.environ[k] for k in keys if k in os.environ}
        return cls(cluster, tuple(sorted(env.items())))

    def to_json(self) -> str:
        return json.dumps({"ray_address": self.ray_address, "env": dict(self.env)})

    @classmethod
    def from_json(cls, text: str) -> ClusterTarget:
        data = json.loads(text)
        return cls(data["ray_address"], tuple(sorted(data["env"].items())))


_connected: str | None = None  # the Ray address this process joined (module-level cache)

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


@functools.cache
def keep_large_buffers_on_the_heap() -> bool:
    """Apply raylog's malloc settings (``raycluster.MALLOC_ENV``) to this process, now.

    A reading process (a Spark Python worker, a Ray Data task, a driver) receives an 8 MiB
    answer per fetch. With glibc's defaults each one is mapped and unmapped again, and every
    page is faulted in zeroed; kept on the heap, the buffers are reused and the reader's CPU
    goes to decoding. Processes of a cluster raylog starts get these settings from their
    environment; a Spark worker has no such hook, so joining sets them with
    ``mallopt`` (once per process). A process started with either variable set keeps its
    own. Returns whether the settings were applied (glibc only).
    """
    if any(key in os.environ for key in raycluster.MALLOC_ENV) or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(M_MMAP_THRESHOLD, int(raycluster.MALLOC_ENV["MALLOC_MMAP_THRESHOLD_"]))
    ok &= mallopt(M_TRIM_THRESHOLD, int(raycluster.MALLOC_ENV["MALLOC_TRIM_THRESHOLD_"]))
    return bool(ok)


def connect(target: ClusterTarget) -> Any:
    """Join the cluster once per process; returns the ``ray`` module.

    A process already in Ray (the test driver, a Ray Data task) is reused as it is.
    """
    global _connected
    if "ray" not in sys.modules:
        # Ray reads these at import time; a process that imported it already keeps its own.
        os.environ.update(dict(target.env))
    import ray

    keep_large_buffers_on_the_heap()
    if ray.is_initialized():
        return ray
    if _connected is not None and _connected != target.ray_address:
        raise RuntimeError(f"already joined {_connected}, cannot also join {target.ray_address}")
    ray.init(
        address=target.ray_address,
        namespace=NAMESPACE,
        logging_level="WARNING",
        log_to_driver=False,
    )
    _connected = target.ray_address
    return ray


CONTROLLER_WAIT_S = 20.0  # an active controller found (a standby takes over within its lease)
_controller: Any = None  # the last active controller's handle (module-level cache)


def controller_catalog(timeout_s: float = CONTROLLER_WAIT_S) -> StaticCatalog:
    """Topics, partitions, leaders and ISR from the active controller's ``metadata()``.

    Asked again on every call (a streaming query re-plans every trigger, and leaders move);
    only the controller's handle is cached."""
    return catalog_from_metadata(ask_controller("metadata", timeout_s))


def ask_controller(method: str, timeout_s: float = CONTROLLER_WAIT_S) -> Any:
    """The answer of the active controller's ``method()`` (no arguments). A controller that
    is a standby, dead or slow is skipped; the other one is asked, until ``timeout_s``."""
    global _controller
    import ray

    deadline = time.monotonic() + timeout_s
    errors: list[str] = []
    while True:
        candidates = [_controller] if _controller is not None else []
        for i in range(CONTROLLERS):
            try:
                candidates.append(ray.get_actor(controller_actor_name(i), namespace=NAMESPACE))
            except ValueError as exc:  # no actor of that name (yet)
                errors.append(str(exc))
        for handle in candidates:
            try:
                answer = ray.get(getattr(handle, method).remote(), timeout=CALL_TIMEOUT_S)
            except (ray.exceptions.RayError, TimeoutError) as exc:  # standby, dead or slow
                errors.append(repr(exc).splitlines()[0])
                continue
            _controller = handle
            return answer
        _controller = None
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"no active raylog controller answered within {timeout_s:.0f} s: "
                + "; ".join(errors[-3:])
            )
        time.sleep(0.2)


_handles: dict[str, Any] = {}


def replica_handle(topic: str, partition: int, replica_id: int) -> Any:
    """The replica's actor handle (cached per process: ``get_actor`` is a GCS round trip)."""
    import ray

    name = replica_actor_name(topic, partition, replica_id)
    handle = _handles.get(name)
    if handle is None:
        handle = ray.get_actor(name, namespace=NAMESPACE)
        _handles[name] = handle
    return handle


def forget_handle(topic: str, partition: int, replica_id: int) -> None:
    """Drop a cached handle that failed: a restarted broker makes a new actor of that name."""
    _handles.pop(replica_actor_name(topic, partition, replica_id), None)


# ---------------------------------------------------------------------------------------------
# 2. Planning.


@dataclass(frozen=True)
class OffsetRange:
    """Records ``[start, end)`` of one partition, and the replicas to read them from, in order."""

    topic: str
    partition: int
    start: int
    end: int
    replica_ids: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Bounds:
    """A partition's readable range: ``[log_start_offset, high_watermark)``.

    ``high_watermark`` is Kafka's last fetchable offset: the high watermark, or with
    ``read_committed`` the last stable offset (LSO), which readers never go past."""

    log_start_offset: int
    high_watermark: int
    read_committed: bool = False

    @property
    def end_name(self) -> str:
        """What ``high_watermark`` is, for messages."""
        return "last stable offset" if self.read_committed else "high watermark"


def parse_isolation_level(text: str, option: str) -> int:
    """Kafka's ``isolation.level`` values: read_uncommitted or read_committed."""
    level = ISOLATION_LEVELS.get(str(text).strip().lower())
    if level is None:
        raise ValueError(f"{option}: expected read_uncommitted or read_committed, got {text!r}")
    return level


OffsetSpec = int | Mapping[str, Mapping[int, int]]  # EARLIEST / LATEST, or per partition


def parse_offsets(text: str, option: str) -> OffsetSpec:
    """``earliest``, ``latest``, or Spark's JSON ``{"t": {"0": 23, "1": -2}}``."""
    lowered = text.strip().lower()
    if lowered == "earliest":
        return EARLIEST
    if lowered == "latest":
        return LATEST
    return _per_partition(text, option, "23", int, "expected earliest, latest or JSON")


def _per_partition(
    text: str, option: str, example: str, value: Callable[[Any], int], expected: str
) -> dict[str, dict[int, int]]:
    """Spark's per-partition JSON ``{"topic": {"0": value}}``, each value through ``value``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option}: {expected}, got {text!r}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f'{option}: JSON must look like {{"t": {{"0": {example}}}}}, got {text!r}')
    try:
        return {t: {int(p): value(v) for p, v in ps.items()} for t, ps in data.items()}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{option}: {exc}: {text!r}") from exc


TopicPartition = tuple[str, int]
TIMESTAMP_STRATEGIES = ("error", "latest")  # startingOffsetsByTimestampStrategy


def parse_timestamp(value: object, option: str) -> int:
    try:
        ts = int(str(value).strip())
    except ValueError as exc:
        raise ValueError(f"{option}: not a timestamp in milliseconds: {value!r}") from exc
    if ts < 0:
        raise ValueError(f"{option}: timestamps are milliseconds since the epoch, got {ts}")
    return ts


@dataclass(frozen=True)
class ByTimestamp:
    """Spark's ``startingTimestamp`` / ``startingOffsetsByTimestamp`` (or the ending pair):
    one timestamp for every partition read, or one per partition named in JSON."""

    option: str
    every: int | None = None
    per_partition: Mapping[str, Mapping[int, int]] | None = None

    @classmethod
    def parse(cls, every: str | None, per_partition: str | None, prefix: str) -> ByTimestamp | None:
        """``prefix`` is "starting" or "ending". The single timestamp takes precedence."""
        if every is not None:
            return cls(f"{prefix}Timestamp", every=parse_timestamp(every, f"{prefix}Timestamp"))
        if per_partition is None:
            return None
        option = f"{prefix}OffsetsByTimestamp"
        parsed = _per_partition(
            per_partition,
            option,
            "1700000000000",
            lambda ts: parse_timestamp(ts, option),
            "expected JSON",
        )
        return cls(option, per_partition=parsed)

    def wanted(self, partitions: Sequence[PartitionInfo]) -> dict[TopicPartition, int]:
        """The timestamp to look up per partition read; partitions it does not name are absent.
        Naming a partition that is not read is an error."""
        if self.every is not None:
            return {(p.topic, p.partition): self.every for p in partitions}
        assert self.per_partition is not None
        chosen = {(p.topic, p.partition) for p in partitions}
        named = {(t, p): ts for t, ps in self.per_partition.items() for p, ts in ps.items()}
        extra = sorted(tp for tp in named if tp not in chosen)
        if extra:
            raise ValueError(f"{self.option} names partitions that are not read: {extra}")
        return named


def resolve_by_timestamp(
    partitions: Sequence[PartitionInfo],
    by: ByTimestamp,
    found: Mapping[TopicPartition, int | None],
    fallback: OffsetSpec,
    bounds: Mapping[TopicPartition, Bounds],
    *,
    if_missing: str,
) -> dict[str, dict[int, int]]:
    """Offsets per partition: where ``found`` (see :func:`offsets_for_times`) has the first
    offset at or after the partition's timestamp; ``fallback``'s value for a partition ``by``
    does not name. No record that late: ``if_missing`` "latest" gives the high watermark,
    "error" fails naming the partition and the timestamp (Spark's strategies)."""
    wanted = by.wanted(partitions)
    out: dict[str, dict[int, int]] = {}
    for info in partitions:
        tp = (info.topic, info.partition)
        if tp not in wanted:
            offset = _offset_for(fallback, info.topic, info.partition, EARLIEST)
        elif found.get(tp) is not None:
            offset = found[tp]  # type: ignore[assignment]
        elif if_missing == "latest":
            offset = bounds[tp].high_watermark
        else:
            raise ValueError(
                f"{by.option}: {info.topic}-{info.partition} has no committed record at or after "
                f"timestamp {wanted[tp]} (startingOffsetsByTimestampStrategy=latest starts such "
                "a partition at its end instead)"
            )
        out.setdefault(info.topic, {})[info.partition] = offset
    return out


def _offset_for(spec: OffsetSpec, topic: str, partition: int, default: int) -> int:
    if isinstance(spec, int):
        return spec
    return spec.get(topic, {}).get(partition, default)


def select_partitions(
    catalog: Catalog,
    *,
    subscribe: Sequence[str] = (),
    subscribe_pattern: str | None = None,
    assign: Mapping[str, Sequence[int]] | None = None,
    missing_ok: bool = False,
) -> list[PartitionInfo]:
    """The partitions one of Spark's three subscription options names (exactly one given).

    ``missing_ok``: a subscribed topic that does not exist (yet) is skipped instead of being
    an error (a streaming query picks it up once it is created, as Spark's Kafka source does).
    """
    if assign is not None:
        out = []
        for topic, parts in assign.items():
            known = {p.partition: p for p in catalog.partitions(topic)}
            for p in parts:
                if p not in known:
                    raise ValueError(f"assign: {topic}-{p} is not a known partition")
                out.append(known[p])
        return out
    if subscribe_pattern is not None:
        regex = re.compile(subscribe_pattern)
        topics = [t for t in catalog.topics() if regex.fullmatch(t)]
    else:
        topics = list(subscribe)
    out = []
    for topic in topics:
        parts = catalog.partitions(topic)
        if not parts and not missing_ok:
            raise ValueError(f"topic {topic!r} is not in the catalog")
        out += parts
    return out


def plan(
    partitions: Sequence[PartitionInfo],
    bounds: Mapping[tuple[str, int], Bounds],
    starting: OffsetSpec,
    ending: OffsetSpec,
    *,
    min_partitions: int = 0,
    fail_on_data_loss: bool = True,
) -> list[OffsetRange]:
    """Offset ranges to read, one per partition, then split until ``min_partitions``.

    Start and end resolve -2 to the log start offset and -1 to the high watermark (the
    bounds' last fetchable offset: for read_committed, the last stable offset). A start
    below the log start offset is data loss: an error naming the topic, partition and
    offsets, or with ``fail_on_data_loss=False`` a warning and a start at the log start.
    An end beyond the high watermark, or a start beyond the end, is an error (the records
    are not committed yet).
    """
    if starting == LATEST:
        raise ValueError("startingOffsets=latest is for streaming queries, not batch reads")
    if ending == EARLIEST:
        raise ValueError("endingOffsets=earliest is not allowed for batch reads")
    if isinstance(ending, Mapping) and any(
        o == EARLIEST for ps in ending.values() for o in ps.values()
    ):
        raise ValueError("endingOffsets: -2 (earliest) is not allowed for a partition")
    if isinstance(starting, Mapping) and any(
        o == LATEST for ps in starting.values() for o in ps.values()
    ):
        raise ValueError("startingOffsets: -1 (latest) is not allowed for batch reads")
    for spec, name in ((starting, "startingOffsets"), (ending, "endingOffsets")):
        if isinstance(spec, Mapping):
            chosen = {(p.topic, p.partition) for p in partitions}
            extra = [(t, p) for t, ps in spec.items() for p in ps if (t, p) not in chosen]
            if extra:
                raise ValueError(f"{name} names partitions that are not read: {extra}")
    ranges = []
    for info in partitions:
        b = bounds[(info.topic, info.partition)]
        start = _offset_for(starting, info.topic, info.partition, EARLIEST)
        end = _offset_for(ending, info.topic, info.partition, LATEST)
        start = b.log_start_offset if start == EARLIEST else start
        end = b.high_watermark if end == LATEST else end
        if start < 0 or end < 0:
            raise ValueError(f"{info.topic}-{info.partition}: offsets {start}..{end} invalid")
        if start < b.log_start_offset:
            message = (
                f"{info.topic}-{info.partition}: offsets {start}..{b.log_start_offset - 1} "
                f"are no longer in the log (log start offset {b.log_start_offset})"
            )
            if fail_on_data_loss:
                raise DataLossError(message + "; set failOnDataLoss=false to skip them")
            log.warning("%s; skipping them (failOnDataLoss=false)", message)
            start = b.log_start_offset
        if end > b.high_watermark:
            raise ValueError(
                f"{info.topic}-{info.partition}: ending offset {end} is beyond the "
                f"{b.end_name} {b.high_watermark}"
            )
        if start > end:
            raise ValueError(
                f"{info.topic}-{info.partition}: starting offset {start} > ending offset {end}"
            )
        ranges.append(OffsetRange(info.topic, info.partition, start, end, tuple(read_order(info))))
    return split(ranges, min_partitions)


def split(ranges: list[OffsetRange], min_partitions: int) -> list[OffsetRange]:
    """Split the largest range in two until there are ``min_partitions`` ranges (or every
    range is a single record). Empty ranges are dropped: they read nothing."""
    out = [r for r in ranges if r.size > 0]
    for _ in range(max(0, min_partitions - len(out))):  # bounded: one split per pass
        largest = max(out, key=lambda r: r.size, default=None)
        if largest is None or largest.size < 2:
            break
        mid = largest.start + largest.size // 2
        i = out.index(largest)
        out[i : i + 1] = [
            OffsetRange(largest.topic, largest.partition, largest.start, mid, largest.replica_ids),
            OffsetRange(largest.topic, largest.partition, mid, largest.end, largest.replica_ids),
        ]
    return sorted(out, key=lambda r: (r.topic, r.partition, r.start))


def fetch_bounds(
    partitions: Sequence[PartitionInfo], isolation_level: int = READ_UNCOMMITTED
) -> dict[tuple[str, int], Bounds]:
    """Each partition's log start offset and last fetchable offset (the high watermark; for
    read_committed the last stable offset), from its leader (else the first replica in read
    order that answers). All calls are in flight at once."""
    read_committed = isolation_level == READ_COMMITTED
    import ray

    out: dict[tuple[str, int], Bounds] = {}
    errors: list[str] = []
    pending = {}
    for info in partitions:
        order = [info.leader_id] if info.leader_id >= 0 else []
        order += [r for r in read_order(info) if r not in order]
        pending[(info.topic, info.partition)] = order
    for _ in range(max((len(o) for o in pending.values()), default=0)):  # one try per replica
        if not pending:
            break
        refs = {}
        for key, order in pending.items():
            rid = order.pop(0)
            try:
                refs[key] = (rid, replica_handle(key[0], key[1], rid).state.remote())
            except ValueError as exc:  # no actor of that name
                errors.append(f"{key[0]}-{key[1]} replica {rid}: {exc}")
        for key, (rid, ref) in refs.items():
            try:
                state = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except (ray.exceptions.RayError, TimeoutError) as exc:
                forget_handle(key[0], key[1], rid)
                errors.append(f"{key[0]}-{key[1]} replica {rid}: {exc!r}")
                continue
            if state.offline is None:
                end = state.last_stable_offset if read_committed else state.high_watermark
                out[key] = Bounds(state.log_start_offset, end, read_committed)
            else:
                errors.append(f"{key[0]}-{key[1]} replica {rid}: offline {state.offline}")
        pending = {k: o for k, o in pending.items() if k not in out and o}
    missing = [k for k in (p for p in ((i.topic, i.partition) for i in partitions)) if k not in out]
    if missing:
        raise RuntimeError(f"no replica of {missing} answered: {'; '.join(errors)}")
    return out


@dataclass(frozen=True)
class Located:
    """Where a range's first records lay when it was planned: a replica's answer to
    ``fetch_extents`` at the range's start (the runs of whole batches in its segment files,
    the offsets they span) and the Ray node of that replica."""

    node_id: str
    runs: tuple[tuple[str, int, int], ...]
    first_offset: int
    next_offset: int
    # read_committed: the answer's aborted transactions (producer id, first offset).
    aborted_transactions: tuple[tuple[int, int], ...] = ()


def locate(
    ranges: Sequence[OffsetRange], isolation_level: int = READ_UNCOMMITTED
) -> list[Located | None]:
    """For each range, where its first records lie (up to LOCATE_MAX_BYTES, for
    read_committed below the last stable offset), asked of its first replica in read order,
    all calls at once; None where that replica erred, did not answer or has nothing there,
    and everywhere when short-circuit reads are off. A task on that replica's node reads them
    without a call (:func:`read_range`); the others ignore it. Only a head start: every read
    is checked."""
    import ray

    if not short_circuit.enabled():
        return [None] * len(ranges)
    refs: list[Any] = []
    for r in ranges:
        try:
            handle = replica_handle(r.topic, r.partition, r.replica_ids[0])
            refs.append(
                handle.fetch_extents.remote(
                    r.start, LOCATE_MAX_BYTES, 0, isolation_level=isolation_level
                )
            )
        except (ValueError, IndexError):
            refs.append(None)
    out: list[Located | None] = []
    for ref in refs:
        located = None
        if ref is not None:
            try:
                answer = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except (ray.exceptions.RayError, TimeoutError) as exc:
                log.info("could not locate a range ahead of its task: %r", exc)
            else:
                if answer.error_code == 0 and answer.extents is not None and answer.extents.runs:
                    extents = answer.extents
                    located = Located(
                        answer.node_id,
                        extents.runs,
                        extents.first_offset,
                        extents.next_offset,
                        tuple(answer.aborted_transactions),
                    )
        out.append(located)
    return out


TIMESTAMP_REFINE_FETCHES_MAX = 16  # fetches past the batch ListOffsets found (one suffices)
TIMESTAMP_REFINE_BYTES = 1  # a fetch returns at least its first whole batch


def offsets_for_times(
    partitions: Sequence[PartitionInfo],
    wanted: Mapping[TopicPartition, int],
    isolation_level: int = READ_UNCOMMITTED,
) -> dict[TopicPartition, int | None]:
    """Per partition in ``wanted``: the first committed offset whose record timestamp is at or
    after the timestamp (Kafka's offsetsForTimes), or None when no record is that late (below
    the last stable offset, for read_committed).

    The leader's ListOffsets finds the first batch whose max timestamp is that late; its
    records are then decoded here, so the offset is a record's, not the batch's start.
    """
    import ray

    infos = {(p.topic, p.partition): p for p in partitions}
    handles: dict[TopicPartition, tuple[int, Any]] = {}
    refs = {}
    for tp, ts in wanted.items():
        leader = infos[tp].leader_id
        if leader < 0:
            raise RuntimeError(f"{tp[0]}-{tp[1]} has no leader to look up timestamp {ts}")
        handle = replica_handle(tp[0], tp[1], leader)
        handles[tp] = (leader, handle)
        refs[tp] = handle.list_offsets.remote(ts, isolation_level=isolation_level)
    out: dict[TopicPartition, int | None] = {}
    for tp, ref in refs.items():
        try:
            error_code, _, offset, _ = ray.get(ref, timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            forget_handle(tp[0], tp[1], handles[tp][0])
            raise RuntimeError(f"{tp[0]}-{tp[1]}: timestamp lookup failed: {exc!r}") from exc
        if error_code:
            raise RuntimeError(f"{tp[0]}-{tp[1]}: timestamp lookup failed with error {error_code}")
        out[tp] = None if offset < 0 else _first_at_or_after(handles[tp][1], offset, wanted[tp])
    return out


def offsets_by_time(
    chosen: Sequence[PartitionInfo],
    bounds: Mapping[TopicPartition, Bounds],
    by: ByTimestamp | None,
    fallback: OffsetSpec,
    *,
    if_missing: str,
    isolation_level: int = READ_UNCOMMITTED,
) -> OffsetSpec:
    """``fallback``, or, when ``by`` is given, the offsets its timestamps find in ``chosen``
    (:func:`offsets_for_times`, then :func:`resolve_by_timestamp`)."""
    if by is None:
        return fallback
    found = offsets_for_times(chosen, by.wanted(chosen), isolation_level)
    return resolve_by_timestamp(chosen, by, found, fallback, bounds, if_missing=if_missing)


def _first_at_or_after(handle: Any, offset: int, timestamp: int) -> int | None:
    """The first record at or after ``offset`` (the start of a batch whose max timestamp is
    >= ``timestamp``) whose own timestamp is >= ``timestamp``."""
    import ray

    batch_start = offset
    for _ in range(TIMESTAMP_REFINE_FETCHES_MAX):
        outcome = ray.get(
            handle.fetch.remote(offset, TIMESTAMP_REFINE_BYTES), timeout=CALL_TIMEOUT_S
        )
        if outcome.error_code:
            raise RuntimeError(
                f"fetch at {offset} for a timestamp lookup: error {outcome.error_code}"
            )
        if not outcome.records:
            return None
        cols = records.new_columns()
        next_offset = records.decode_into(outcome.records, cols, offset, outcome.high_watermark)
        batch = records.to_arrow(cols, "", 0, False)
        stamps = batch.column("timestamp").cast(pa.int64()).to_pylist()
        for o, ts in zip(batch.column("offset").to_pylist(), stamps, strict=True):
            if ts >= timestamp:
                return int(o)
        if next_offset <= offset:
            break
        offset = next_offset
    return batch_start  # not reached for a batch ListOffsets found: batch precision then


# ---------------------------------------------------------------------------------------------
# 3. Reading one range.


def read_range(
    r: OffsetRange,
    *,
    include_headers: bool = False,
    fail_on_data_loss: bool = True,
    max_bytes: int = FETCH_MAX_BYTES,
    stats: ReadStats | None = None,
    located: Located | None = None,
    isolation_level: int = READ_UNCOMMITTED,
) -> Iterator[pa.RecordBatch]:
    """Yield the committed records of ``r`` as Arrow batches (one per fetch), in order.

    ``isolation_level`` :data:`READ_COMMITTED`: every answer stops at the replica's last
    stable offset, and the records of the aborted transactions it names are left out.

    ``located`` (from :func:`locate`, on this process's Ray node) is read first, with no call
    to any replica; the rest of the range, or all of it when that read does not hold, is
    fetched. Tries the range's replicas in order. The next fetch is issued as soon as the
    previous one returns, so one call is in flight while its predecessor is decoded. A replica
    that errs, dies, or stays below the needed offset for CATCH_UP_WAIT_S is left for the next.
    A replica on this process's Ray node is read short-circuit (:class:`_Fetcher`).
    """
    import ray

    offset = r.start
    if located is not None and short_circuit.enabled() and located.node_id == _node_id():
        for offset, batch in _read_located(r, located, include_headers, max_bytes, stats):
            yield batch
            if offset >= r.end:
                return
    errors: list[str] = []
    for rid in _replica_passes(r.replica_ids):
        if offset >= r.end:
            return
        try:
            handle = replica_handle(r.topic, r.partition, rid)
        except ValueError as exc:
            errors.append(f"replica {rid}: {exc}")
            continue
        fetcher = _Fetcher(handle, max_bytes, stats, isolation_level)
        caught_up_by = time.monotonic() + CATCH_UP_WAIT_S
        ref = fetcher.call(offset)
        for _ in range(FETCH_CALLS_MAX):
            try:
                outcome = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except (ray.exceptions.RayError, TimeoutError) as exc:
                forget_handle(r.topic, r.partition, rid)
                errors.append(f"replica {rid}: {exc!r}")
                break
            if outcome.error_code == OFFSET_OUT_OF_RANGE and offset < outcome.log_start_offset:
                message = (
                    f"{r.topic}-{r.partition}: offsets {offset}..{outcome.log_start_offset - 1} "
                    f"were deleted before they were read (log start {outcome.log_start_offset})"
                )
                if fail_on_data_loss:
                    raise DataLossError(message + "; set failOnDataLoss=false to skip them")
                log.warning("%s; skipping them", message)
                offset = outcome.log_start_offset
                if offset >= r.end:
                    return
                ref = fetcher.call(offset)
                continue
            if outcome.error_code:
                errors.append(f"replica {rid}: error {outcome.error_code} {outcome.message}")
                break
            if not outcome.size:
                # This replica's high watermark (or LSO) is below ``offset`` (a follower
                # catching up): long-poll it for a while, then move on.
                if time.monotonic() > caught_up_by:
                    errors.append(
                        f"replica {rid}: last stable offset {outcome.last_stable_offset}"
                        if isolation_level == READ_COMMITTED
                        else f"replica {rid}: high watermark {outcome.high_watermark}"
                    )
                    break
                ref = fetcher.call(offset, LONG_POLL_MS)
                continue
            decoded = fetcher.decode(outcome, offset, r.end, include_headers)
            if decoded is None:  # a short-circuit read that did not hold: ask again by Ray
                ref = fetcher.call(offset)
                continue
            next_offset, cols = decoded
            if next_offset <= offset:
                raise RuntimeError(f"{r.topic}-{r.partition}: fetch at {offset} did not advance")
            offset = next_offset
            if offset < r.end:  # 1. keep a call in flight while ...
                ref = fetcher.call(offset)
            # 2. ... this response becomes rows.
            yield records.to_arrow(cols, r.topic, r.partition, include_headers)
            if offset >= r.end:
                return
    raise RuntimeError(
        f"{r.topic}-{r.partition}: could not read offsets {offset}..{r.end}: "
        + "; ".join(errors[-2 * len(r.replica_ids) :])
    )


def _read_located(
    r: OffsetRange,
    located: Located,
    include_headers: bool,
    max_bytes: int,
    stats: ReadStats | None,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(next offset, batch)`` for the records of ``r`` in the runs the planner located,
    read from the segment files here and decoded a slice of whole batches at a time, about
    ``max_bytes`` each (:func:`short_circuit.read_slices`), every CRC checked: the first
    batches reach Spark while the later ones are still in the file.

    The first batch must be the one located at ``r.start``, every later one must start at or
    after the offset the one before it ends, and the last must end where the located span
    ends. Whatever breaks that (a file gone, cut or replaced since, a CRC failing) ends it
    after the batches before, which held; the caller fetches the rest from there."""
    stats = stats if stats is not None else ReadStats()
    if located.first_offset > r.start or located.next_offset <= r.start:
        return  # not the range's start (a plan made for other offsets)
    offset, expected, first = r.start, located.first_offset, True
    aborted = records.AbortedTransactions(located.aborted_transactions)
    try:
        for data, last in short_circuit.read_slices(located.runs, max_bytes):
            base = rb.parse_header(data, 0).base_offset
            if (base != expected) if first else (base < expected):
                raise RaylogError(f"a batch at offset {base} where {expected} was due")
            expected, first = rb.parse_header(data, last).next_offset, False
            cols = records.new_columns(include_headers)
            next_offset = records.decode_into(
                memoryview(data), cols, offset, r.end, aborted=aborted
            )
            stats.planned_bytes += len(data)
            if next_offset > offset:
                offset = next_offset
                yield offset, records.to_arrow(cols, r.topic, r.partition, include_headers)
            if offset >= r.end:
                return
        if expected != located.next_offset:
            raise RaylogError(f"the runs end at {expected}, not {located.next_offset}")
    except (OSError, RaylogError) as exc:
        log.info("%s-%d: located runs did not hold (%s); fetching", r.topic, r.partition, exc)
        stats.fallbacks += 1


class _Fetcher:
    """The fetch calls of one range to one replica.

    A replica on this process's Ray node is asked where the batches lie
    (``fetch_extents``) and the segment files are read here, so no bytes cross Ray.
    The first answer tells whether the replica is on this node; if not, or once a
    short-circuit read does not hold (a file gone, cut or replaced by retention, compaction or
    truncation: the read spans other offsets, or its CRCs fail), every later call is
    ``read_committed``, whose bytes cross Ray.
    """

    def __init__(
        self,
        handle: Any,
        max_bytes: int,
        stats: ReadStats | None,
        isolation_level: int = READ_UNCOMMITTED,
    ) -> None:
        self.handle = handle
        self.max_bytes = max_bytes
        self.stats = stats if stats is not None else ReadStats()
        self.short_circuit = short_circuit.enabled()
        self.isolation_level = isolation_level

    def call(self, offset: int, max_wait_ms: int = 0) -> Any:
        method = self.handle.fetch_extents if self.short_circuit else self.handle.read_committed
        return method.remote(
            offset, self.max_bytes, max_wait_ms, isolation_level=self.isolation_level
        )

    def decode(
        self, outcome: Any, offset: int, end: int, include_headers: bool
    ) -> tuple[int, Any] | None:
        """The answer's records in ``[offset, end)`` as decoded columns, with the offset the
        next fetch starts at; None when a short-circuit read did not hold (call again). For
        read_committed, the records of the aborted transactions the answer names are left
        out."""
        cols = records.new_columns(include_headers)
        aborted = records.AbortedTransactions(outcome.aborted_transactions)
        if outcome.extents is None:
            self.stats.ray_bytes += len(outcome.records)
            return records.decode_into(outcome.records, cols, offset, end, aborted=aborted), cols
        self.short_circuit = False  # until a read holds
        if outcome.node_id != _node_id():
            return None
        extents = outcome.extents
        try:
            data = short_circuit.read_runs(extents.runs)
            next_offset = records.decode_into(data, cols, offset, end, aborted=aborted)
        except (OSError, RaylogError) as exc:
            log.info("short-circuit read at %d did not hold (%s); reading through Ray", offset, exc)
            self.stats.fallbacks += 1
            return None
        # decode_into checked every CRC
        spanned = short_circuit.spans(data, extents.first_offset, extents.next_offset, verify=False)
        if next_offset <= offset or not spanned:
            self.stats.fallbacks += 1
            return None
        self.stats.local_bytes += len(data)
        self.short_circuit = True
        return next_offset, cols


@functools.cache
def _node_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def _replica_passes(replica_ids: Sequence[int]) -> Iterator[int]:
    """Replica ids in read order, READ_PASSES_MAX times, with a pause between passes.

    During a failover every replica can fail at once for a moment (the old leader is dead,
    the others wait for the controller); a later pass finds the new leader.
    """
    for attempt in range(READ_PASSES_MAX):
        if attempt:
            time.sleep(READ_PASS_PAUSE_S)
        yield from replica_ids
