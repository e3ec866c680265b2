"""Bulk reads of committed offset ranges over Ray: shared by the Spark and Ray Data readers.

Owns three things:

1. Joining the cluster (:func:`connect`): once per process, with the cluster's token. Spark's
   Python workers are processes the JVM starts; Ray reads ``RAY_AUTH_MODE`` and
   ``RAY_AUTH_TOKEN_PATH`` when it is imported, so they are set here before ``import ray``.
   The connection is cached at module level and reused by every partition the worker reads.
   :func:`controller_catalog` asks the active controller for the cluster's metadata.
2. Planning (:func:`plan`): topics and partitions from a :class:`~raylog.pipelines.catalog.
   Catalog`, start/end offsets resolved against the partitions' log start offset and high
   watermark (asked of the leader), ``failOnDataLoss`` applied, ranges split for
   ``minPartitions``. Planning is pure given the bounds, so it is tested without Ray.
3. Reading one range (:func:`read_range`): ``ReplicaActor.fetch`` in a loop with the next fetch
   in flight while the previous response is decoded, from the preferred replica
   (:func:`~raylog.pipelines.catalog.read_order`), yielding Arrow record batches.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from raylog.pipelines import records
from raylog.pipelines.catalog import (
    Catalog,
    PartitionInfo,
    StaticCatalog,
    catalog_from_metadata,
    read_order,
)

log = logging.getLogger(__name__)

NAMESPACE = "raylog"  # the replicas' Ray namespace (raylog.actors.replica.NAMESPACE)
EARLIEST = -2
LATEST = -1
OFFSET_OUT_OF_RANGE = 1  # Kafka error code
FETCH_MAX_BYTES = 8 << 20  # per fetch call: few round trips, bounded memory per task
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
        from raylog.actors import raycluster

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


def connect(target: ClusterTarget) -> Any:
    """Join the cluster once per process; returns the ``ray`` module.

    A process already in Ray (the test driver, a Ray Data task) is reused as it is.
    """
    global _connected
    if "ray" not in sys.modules:
        # Ray reads these at import time; a process that imported it already keeps its own.
        os.environ.update(dict(target.env))
    import ray

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
    only the controller's handle is cached. A controller that is a standby, dead or slow is
    skipped; the other one is asked, until ``timeout_s``.
    """
    global _controller
    import ray

    from raylog.actors.cli import CONTROLLERS
    from raylog.actors.controller import controller_actor_name

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
                metadata = ray.get(handle.metadata.remote(), timeout=CALL_TIMEOUT_S)
            except (ray.exceptions.RayError, TimeoutError) as exc:  # standby, dead or slow
                errors.append(repr(exc).splitlines()[0])
                continue
            _controller = handle
            return catalog_from_metadata(metadata)
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

    from raylog.actors.replica import replica_actor_name

    name = replica_actor_name(topic, partition, replica_id)
    handle = _handles.get(name)
    if handle is None:
        handle = ray.get_actor(name, namespace=NAMESPACE)
        _handles[name] = handle
    return handle


def forget_handle(topic: str, partition: int, replica_id: int) -> None:
    """Drop a cached handle that failed: a restarted broker makes a new actor of that name."""
    from raylog.actors.replica import replica_actor_name

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
    """A partition's readable range: ``[log_start_offset, high_watermark)``."""

    log_start_offset: int
    high_watermark: int


OffsetSpec = int | Mapping[str, Mapping[int, int]]  # EARLIEST / LATEST, or per partition


def parse_offsets(text: str, option: str) -> OffsetSpec:
    """``earliest``, ``latest``, or Spark's JSON ``{"t": {"0": 23, "1": -2}}``."""
    lowered = text.strip().lower()
    if lowered == "earliest":
        return EARLIEST
    if lowered == "latest":
        return LATEST
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option}: expected earliest, latest or JSON, got {text!r}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f'{option}: JSON must look like {{"topic": {{"0": 23}}}}, got {text!r}')
    try:
        return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in data.items()}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{option}: partitions and offsets must be integers: {text!r}") from exc


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

    Start and end resolve -2 to the log start offset and -1 to the high watermark. A start
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
                f"{info.topic}-{info.partition}: ending offset {end} is beyond the high "
                f"watermark {b.high_watermark}"
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


def fetch_bounds(partitions: Sequence[PartitionInfo]) -> dict[tuple[str, int], Bounds]:
    """Each partition's log start offset and high watermark, from its leader (else the first
    replica in read order that answers). All calls are in flight at once."""
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
                out[key] = Bounds(state.log_start_offset, state.high_watermark)
            else:
                errors.append(f"{key[0]}-{key[1]} replica {rid}: offline {state.offline}")
        pending = {k: o for k, o in pending.items() if k not in out and o}
    missing = [k for k in (p for p in ((i.topic, i.partition) for i in partitions)) if k not in out]
    if missing:
        raise RuntimeError(f"no replica of {missing} answered: {'; '.join(errors)}")
    return out


# ---------------------------------------------------------------------------------------------
# 3. Reading one range.


def read_range(
    r: OffsetRange,
    *,
    include_headers: bool = False,
    fail_on_data_loss: bool = True,
    max_bytes: int = FETCH_MAX_BYTES,
) -> Iterator[pa.RecordBatch]:
    """Yield the committed records of ``r`` as Arrow batches (one per fetch), in order.

    Tries the range's replicas in order. The next fetch is issued as soon as the previous
    one returns, so one call is in flight while its predecessor is decoded. A replica that
    errs, dies, or stays below the needed offset for CATCH_UP_WAIT_S is left for the next.
    """
    import ray

    offset = r.start
    errors: list[str] = []
    for rid in _replica_passes(r.replica_ids):
        if offset >= r.end:
            return
        try:
            handle = replica_handle(r.topic, r.partition, rid)
        except ValueError as exc:
            errors.append(f"replica {rid}: {exc}")
            continue
        caught_up_by = time.monotonic() + CATCH_UP_WAIT_S
        ref = handle.fetch.remote(offset, max_bytes)
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
                ref = handle.fetch.remote(offset, max_bytes)
                continue
            if outcome.error_code:
                errors.append(f"replica {rid}: error {outcome.error_code} {outcome.message}")
                break
            if not outcome.records:
                # This replica's high watermark is below ``offset`` (a follower catching up):
                # long-poll it for a while, then move on.
                if time.monotonic() > caught_up_by:
                    errors.append(f"replica {rid}: high watermark {outcome.high_watermark}")
                    break
                ref = handle.fetch.remote(offset, max_bytes, LONG_POLL_MS)
                continue
            cols = records.new_columns(include_headers)
            next_offset = records.decode_into(outcome.records, cols, offset, r.end)
            if next_offset <= offset:
                raise RuntimeError(f"{r.topic}-{r.partition}: fetch at {offset} did not advance")
            offset = next_offset
            if offset < r.end:  # 1. keep a call in flight while ...
                ref = handle.fetch.remote(offset, max_bytes)
            # 2. ... this response becomes rows.
            yield records.to_arrow(cols, r.topic, r.partition, include_headers)
            if offset >= r.end:
                return
    raise RuntimeError(
        f"{r.topic}-{r.partition}: could not read offsets {offset}..{r.end}: "
        + "; ".join(errors[-2 * len(r.replica_ids) :])
    )


def _replica_passes(replica_ids: Sequence[int]) -> Iterator[int]:
    """Replica ids in read order, READ_PASSES_MAX times, with a pause between passes.

    During a failover every replica can fail at once for a moment (the old leader is dead,
    the others wait for the controller); a later pass finds the new leader.
    """
    for attempt in range(READ_PASSES_MAX):
        if attempt:
            time.sleep(READ_PASS_PAUSE_S)
        yield from replica_ids
