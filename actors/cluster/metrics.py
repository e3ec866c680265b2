"""The Prometheus endpoint of `raylog up`: Kafka's health metrics, gathered on every scrape.

Owns the names and shapes of raylog's metrics and the HTTP listener (prometheus-client's
``start_http_server``; nothing here formats text). :class:`ClusterCollector` is a custom
prometheus-client collector: each scrape asks, in parallel and with one bounded wait,

- the active controller for the metadata and its counters (ISR shrinks/expands, elections);
- every running gateway for its request counts, latency histograms and bytes in/out;
- every running broker for the state of its replicas (log end offset, high watermark, role);

and turns the answers into metric families. Partition health (offline, under-replicated,
under min ISR) is computed by ``raylog.actors.control.health``, the same code `raylog status` uses.
A part that does not answer in time is left out of that scrape (``raylog_scrape_errors``
counts what was missing) rather than failing the whole scrape.

Names (all prefixed ``raylog_``; Kafka's MBean in brackets):

- ``active_controller_count`` (ActiveControllerCount), ``offline_partitions_count``,
  ``under_replicated_partitions``, ``under_min_isr_partition_count``,
  ``offline_replica_count`` (OfflineReplicaCount), ``brokers{state}``;
- ``isr_shrinks_total``, ``isr_expands_total``, ``leader_elections_total``,
  ``unclean_leader_elections_total``, ``replica_balancer_moves_total`` (partitions continuous
  balancing started moving) (counted by the active controller since it became active);
- ``requests_total{broker,request}``, ``request_latency_seconds{broker,request}`` (histogram;
  RequestMetrics TotalTimeMs), ``bytes_in_total{broker}``, ``bytes_out_total{broker}``
  (BytesInPerSec / BytesOutPerSec: take ``rate()``);
- ``log_end_offset{topic,partition}``, ``high_watermark{topic,partition}`` (from the leader),
  ``follower_lag{topic,partition,replica}`` (messages behind the leader's log end);
- ``log_size_bytes{topic,partition,replica}`` (Log Size), and for compacted topics
  ``log_cleaner_passes_total{topic,partition,replica}`` and
  ``log_cleaner_records_removed_total{topic,partition,replica}`` (each replica compacts its own
  log; counted since the replica started) and ``log_cleaner_dirty_ratio`` (max-dirty-percent,
  per replica, as a ratio);
- cross-cluster links, per mirror partition (from the gateway of its leader's broker):
  ``link_mirror_lag_records{link,topic,partition}``, ``link_mirror_lag_ms``,
  ``link_mirrored_records_total``, ``link_mirrored_bytes_total``, and per link
  ``link_mirror_partitions_in_error{link}``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import ray
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from raylog.actors.control import health
from raylog.actors.control.metadata import ClusterMetadata
from raylog.gateway import codec

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 5.0  # one scrape waits at most this long for all its Ray calls together
PREFIX = "raylog_"

__all__ = ["ClusterCollector", "MetricsPortError", "serve"]


class MetricsPortError(Exception):
    """The metrics port cannot be listened on; the message is one line."""


def api_name(api_key: int) -> str:
    """Kafka's name of an API key (Produce, Fetch, ...), from the codec's message classes."""
    try:
        return codec.request_class(api_key).__name__.removesuffix("Request")
    except (KeyError, ValueError):
        return f"api{api_key}"


class ClusterCollector(Collector):
    """Builds every raylog metric family from one round of bounded Ray calls.

    ``controllers``: the controller actor handles; ``supervisor``: the SupervisorActor that
    knows the running brokers and gateways.
    """

    def __init__(self, controllers: list[Any], supervisor: Any) -> None:
        self._controllers = controllers
        self._supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        answers, missing = self._gather()
        md: ClusterMetadata | None = answers.get("metadata")
        counters: dict[str, int] = answers.get("counters", {})
        yield from self._cluster_families(md, counters)
        yield from self._gateway_families(answers.get("gateways", []))
        yield from self._partition_families(answers.get("replicas", []))
        errors = GaugeMetricFamily(
            PREFIX + "scrape_errors", "Parts of the cluster that did not answer this scrape"
        )
        errors.add_metric([], missing)
        yield errors

    # --- one round of Ray calls -----------------------------------------------------------------

    def _gather(self) -> tuple[dict[str, Any], int]:
        """Every call in flight at once; one deadline for all of them."""
        statuses = [c.status.remote() for c in self._controllers]
        handles_ref = self._supervisor.handles.remote()
        ready, _ = ray.wait([*statuses, handles_ref], num_returns=len(statuses) + 1,
                            timeout=SCRAPE_TIMEOUT_S)  # fmt: skip
        answers: dict[str, Any] = {}
        missing = 0
        active = None
        for handle, ref in zip(self._controllers, statuses, strict=True):
            status = _value(ref) if ref in ready else None
            if status is not None and status.active:
                active = handle
        handles: dict[int, tuple[Any, Any]] = _value(handles_ref) if handles_ref in ready else {}
        if not handles:
            missing += 1
        refs: dict[str, Any] = {}
        if active is not None:
            refs["metadata"] = active.metadata.remote()
            refs["counters"] = active.metrics.remote()
        else:
            missing += 1
        gateway_refs = [g.metrics.remote() for _, g in handles.values()]
        replica_refs = [b.replica_states.remote(2_000) for b, _ in handles.values()]
        pending = [*refs.values(), *gateway_refs, *replica_refs]
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=SCRAPE_TIMEOUT_S)
        done = set(ready)
        for key, ref in refs.items():
            value = _value(ref) if ref in done else None
            if value is None:
                missing += 1
            else:
                answers[key] = value
        answers["gateways"] = [v for r in gateway_refs if r in done and (v := _value(r))]
        answers["replicas"] = [
            s for r in replica_refs if r in done and (v := _value(r)) is not None for s in v
        ]
        missing += len(gateway_refs) - len(answers["gateways"])
        missing += sum(1 for r in replica_refs if r not in done or _value(r) is None)
        return answers, missing

    # --- families -------------------------------------------------------------------------------

    @staticmethod
    def _cluster_families(md: ClusterMetadata | None, counters: dict[str, int]) -> Iterator[Metric]:
        active = GaugeMetricFamily(
            PREFIX + "active_controller_count", "1 when a controller is active (holds the lease)"
        )
        active.add_metric([], counters.get("active", 0))
        yield active
        if md is not None:
            h = health.cluster_health(health.partition_health(md))
            for name, value, text in (
                ("offline_partitions_count", h.offline_partitions, "Partitions without a leader"),
                ("under_replicated_partitions", h.under_replicated_partitions,
                 "Partitions whose ISR is smaller than their replicas"),
                ("under_min_isr_partition_count", h.under_min_isr_partitions,
                 "Online partitions whose ISR is smaller than min.insync.replicas"),
                ("partitions", h.partitions, "Partitions in the cluster"),
                ("offline_replica_count", h.offline_replicas,
                 "Replicas whose log failed (a full disk, an I/O error), until re-created"),
            ):  # fmt: skip
                family = GaugeMetricFamily(PREFIX + name, text)
                family.add_metric([], value)
                yield family
            brokers = GaugeMetricFamily(
                PREFIX + "brokers", "Registered brokers by state", labels=["state"]
            )
            rows = health.broker_rows(md)
            for state in health.BROKER_STATES:
                brokers.add_metric([state], sum(r.state == state for r in rows))
            yield brokers
        for key, text in (
            ("isr_shrinks", "ISR shrinks decided by the active controller"),
            ("isr_expands", "ISR expands decided by the active controller"),
            ("leader_elections", "Leader elections (any kind) by the active controller"),
            ("unclean_leader_elections", "Unclean leader elections by the active controller"),
            ("replica_balancer_moves", "Partitions replica.balancer.enable started moving"),
        ):
            family = CounterMetricFamily(PREFIX + key, text)
            family.add_metric([], counters.get(key, 0))
            yield family

    @staticmethod
    def _gateway_families(gateways: list[dict[str, Any]]) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            PREFIX + "requests", "Requests answered by a gateway", labels=["broker", "request"]
        )
        latency = HistogramMetricFamily(
            PREFIX + "request_latency_seconds",
            "Time from a request's arrival to its response being ready",
            labels=["broker", "request"],
        )
        bytes_in = CounterMetricFamily(
            PREFIX + "bytes_in", "Bytes read from client connections", labels=["broker"]
        )
        bytes_out = CounterMetricFamily(
            PREFIX + "bytes_out", "Bytes of responses written to clients", labels=["broker"]
        )
        for g in gateways:
            broker = str(g["broker_id"])
            bytes_in.add_metric([broker], g["bytes_in"])
            bytes_out.add_metric([broker], g["bytes_out"])
            for api_key, r in g["requests"].items():
                labels = [broker, api_name(api_key)]
                requests.add_metric(labels, r["count"])
                latency.add_metric(labels, buckets=r["buckets"], sum_value=r["sum_s"])
        yield from (requests, latency, bytes_in, bytes_out)
        yield from ClusterCollector._link_families(gateways)

    @staticmethod
    def _link_families(gateways: list[dict[str, Any]]) -> Iterator[Metric]:
        """Each mirror partition's link fetcher, from the gateway of its leader's broker."""
        labels = ["link", "topic", "partition"]
        lag = GaugeMetricFamily(
            PREFIX + "link_mirror_lag_records",
            "Records the mirror partition is behind its source's high watermark",
            labels=labels,
        )
        lag_ms = GaugeMetricFamily(
            PREFIX + "link_mirror_lag_ms",
            "How long the mirror partition has been behind its source (0: caught up)",
            labels=labels,
        )
        records = CounterMetricFamily(
            PREFIX + "link_mirrored_records",
            "Records mirrored by this leader's fetcher since it started",
            labels=labels,
        )
        size = CounterMetricFamily(
            PREFIX + "link_mirrored_bytes",
            "Batch bytes mirrored by this leader's fetcher since it started",
            labels=labels,
        )
        errors = GaugeMetricFamily(
            PREFIX + "link_mirror_partitions_in_error",
            "Mirror partitions whose last fetch or append failed",
            labels=["link"],
        )
        failing: dict[str, int] = {}
        for g in gateways:
            for m in g.get("link_mirrors", []):
                key = [m["link"], m["topic"], str(m["partition"])]
                if m["lag_records"] >= 0:
                    lag.add_metric(key, m["lag_records"])
                lag_ms.add_metric(key, m["lag_ms"])
                records.add_metric(key, m["records"])
                size.add_metric(key, m["bytes"])
                failing[m["link"]] = failing.get(m["link"], 0) + (1 if m["error"] else 0)
        for link, count in sorted(failing.items()):
            errors.add_metric([link], count)
        yield from (lag, lag_ms, records, size, errors)

    @staticmethod
    def _partition_families(states: list[Any]) -> Iterator[Metric]:
        leo = GaugeMetricFamily(
            PREFIX + "log_end_offset",
            "The leader's log end offset",
            labels=["topic", "partition"],
        )
        hw = GaugeMetricFamily(
            PREFIX + "high_watermark", "The leader's high watermark", labels=["topic", "partition"]
        )
        lag = GaugeMetricFamily(
            PREFIX + "follower_lag",
            "Messages a follower is behind its leader's log end offset",
            labels=["topic", "partition", "replica"],
        )
        for s in sorted(states, key=lambda s: (s.topic, s.partition, s.replica_id)):
            if s.role == "leader":
                labels = [s.topic, str(s.partition)]
                leo.add_metric(labels, s.log_end_offset)
                hw.add_metric(labels, s.high_watermark)
        for (topic, partition, replica), value in sorted(health.follower_lags(states).items()):
            lag.add_metric([topic, str(partition), str(replica)], value)
        yield from (leo, hw, lag)
        per_replica = ["topic", "partition", "replica"]
        size = GaugeMetricFamily(
            PREFIX + "log_size_bytes", "Bytes in a replica's log segments", labels=per_replica
        )
        passes = CounterMetricFamily(
            PREFIX + "log_cleaner_passes",
            "Log compaction passes a replica ran since it started",
            labels=per_replica,
        )
        removed = CounterMetricFamily(
            PREFIX + "log_cleaner_records_removed",
            "Records log compaction removed from a replica's log since it started",
            labels=per_replica,
        )
        dirty = GaugeMetricFamily(
            PREFIX + "log_cleaner_dirty_ratio",
            "Share of a compacted replica's closed segment bytes not cleaned yet",
            labels=per_replica,
        )
        for s in sorted(states, key=lambda s: (s.topic, s.partition, s.replica_id)):
            labels = [s.topic, str(s.partition), str(s.replica_id)]
            size.add_metric(labels, s.log_size_bytes)
            if s.cleaner_passes:
                passes.add_metric(labels, s.cleaner_passes)
                removed.add_metric(labels, s.cleaner_records_removed)
            if s.cleaner_dirty_ratio:
                dirty.add_metric(labels, s.cleaner_dirty_ratio)
        yield from (size, passes, removed, dirty)


def _value(ref: Any) -> Any:
    """The result of a finished call, or None when it raised (dead actor, remote error)."""
    try:
        return ray.get(ref, timeout=0)
    except Exception as exc:
        log.debug("metrics call failed: %s", exc)
        return None


def serve(host: str, port: int, collector: ClusterCollector) -> Any:
    """Serve ``collector`` (alone: no process metrics of the CLI) at http://host:port/metrics in
    a daemon thread; returns the server (``shutdown()`` stops it)."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise MetricsPortError(
            f"metrics port {host}:{port} is not available: {e.strerror or e}"
        ) from e
    return server
