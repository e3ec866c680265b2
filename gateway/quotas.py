"""Pure: client quota enforcement on one broker (KIP-13, KIP-55, KIP-124, KIP-219).

Kafka's quotas are per broker: each gateway measures what each client sends and fetches through
it and answers a client over its quota with ``throttle_time_ms``; the server then reads nothing
more from that connection for that long (KIP-219's muting). Three quotas, as Kafka's
ClientQuotaManagers:

- ``producer_byte_rate``: Produce bytes per second;
- ``consumer_byte_rate``: Fetch response bytes per second;
- ``request_percentage``: handler time per second, in percent of one thread (KIP-124), over
  every request but the authentication ones.

**Which quota applies** (KIP-55). For a client of user ``u`` (the principal's name; ``ANONYMOUS``
without authentication) and client id ``c``, each quota key is taken from the first entity that
sets it, in Kafka's order: ``(u, c)``, ``(u, <default>)``, ``(u, -)``, ``(<default>, c)``,
``(<default>, <default>)``, ``(<default>, -)``, ``(-, c)``, ``(-, <default>)`` (``-``: the entity
has no such part). Clients that match the same entity share one measurement, keyed as Kafka's
metric tags: (user, client id) for the first, second, fourth and fifth, (user, "") for the
third and sixth, ("", client id) for the last two and for a client without a quota.

**How a rate is measured**: Kafka's ``Rate`` over a ``SampledStat`` of ``quota.window.num``
samples of ``quota.window.size.seconds`` each (:class:`SampledRate`). A sample older than the
whole window is reset; the rate divides the samples' sum by the time they span, counted as at
least ``samples - 1`` full windows (so a client's first burst is spread over the whole window).

**Throttle time**: the value is recorded first; when the rate then exceeds the quota the client
is throttled for ``(rate - quota) / quota * window_ms`` (Kafka's ``QuotaUtils.throttleTime``,
the window being the one the rate was measured over). request_percentage's is at most one
sample's length (Kafka's ``ClientRequestQuotaManager.maxThrottleTimeMs``); a byte rate's at
most the whole window, by when everything measured has expired (Kafka does not bound it).

Time is an argument (``now_ms``, monotonic); this module does no I/O.
"""

from __future__ import annotations

import types
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "CONSUMER_BYTE_RATE",
    "DEFAULT",
    "PRODUCER_BYTE_RATE",
    "REQUEST_PERCENTAGE",
    "ClientQuotas",
    "QuotaTable",
    "SampledRate",
    "busy_time",
    "resolve",
    "throttle_time_ms",
    "user_of",
]

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
DEFAULT = "<default>"  # the default entity (``actors/control/client_quotas.DEFAULT``)
QUOTA_WINDOW_NUM = 11  # quota.window.num
QUOTA_WINDOW_SIZE_SECONDS = 1  # quota.window.size.seconds
SENSORS_MAX = 10_000  # measurements kept per quota key; the least recently used go first
SENSOR_EXPIRY_MS = 3_600_000  # Kafka's InactiveSensorExpirationTimeSeconds
# Requests a request_percentage quota does not count or throttle: ApiVersions and the SASL
# exchange (Kafka exempts them too: a client must be able to connect to learn its throttle).
EXEMPT_APIS = frozenset({17, 18, 36})

_T = TypeVar("_T")
# (user, client id) of a quota entity: a name, DEFAULT, or None (the entity has no such part).
EntityKey = tuple[str | None, str | None]
QuotaTable = Mapping[EntityKey, Mapping[str, float]]
# Kafka's metric tags of a measurement: (user, client id), "" where the quota has no such part.
Tags = tuple[str, str]


def user_of(principal: str | None) -> str:
    """The quota user of a session's principal (``User:alice`` -> ``alice``)."""
    if not principal:
        return "ANONYMOUS"
    _, _, name = principal.partition(":")
    return name or principal


def _levels(user: str, client_id: str) -> list[tuple[EntityKey, Tags]]:
    """KIP-55's eight entities, most specific first, each with the tags it measures under."""
    return [
        ((user, client_id), (user, client_id)),
        ((user, DEFAULT), (user, client_id)),
        ((user, None), (user, "")),
        ((DEFAULT, client_id), (user, client_id)),
        ((DEFAULT, DEFAULT), (user, client_id)),
        ((DEFAULT, None), (user, "")),
        ((None, client_id), ("", client_id)),
        ((None, DEFAULT), ("", client_id)),
    ]


def resolve(table: QuotaTable, key: str, user: str, client_id: str) -> tuple[float | None, Tags]:
    """The quota ``key`` for (user, client id) and the tags it is measured under; (None,
    ("", client id)) when no entity sets it."""
    for entity, tags in _levels(user, client_id):
        values = table.get(entity)
        if values is not None and key in values:
            return values[key], tags
    return None, ("", client_id)


@dataclass(slots=True)
class _Sample:
    window_start_ms: int
    value: float = 0.0


@dataclass(slots=True)
class SampledRate:
    """Kafka's ``Rate`` (per second) over a ``SampledStat``: ``samples`` windows of
    ``window_ms`` each."""

    samples: int = QUOTA_WINDOW_NUM
    window_ms: int = QUOTA_WINDOW_SIZE_SECONDS * 1000
    _samples: list[_Sample] = field(default_factory=list)
    _current: int = 0

    def record(self, value: float, now_ms: int) -> None:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        sample = self._samples[self._current]
        if now_ms - sample.window_start_ms >= self.window_ms:  # complete: advance
            self._current = (self._current + 1) % self.samples
            if self._current >= len(self._samples):
                self._samples.append(_Sample(now_ms))
            else:
                self._samples[self._current] = _Sample(now_ms)
            sample = self._samples[self._current]
        sample.value += value

    def _purge(self, now_ms: int) -> None:
        expire_ms = self.samples * self.window_ms
        for i, sample in enumerate(self._samples):
            if now_ms - sample.window_start_ms >= expire_ms:
                self._samples[i] = _Sample(now_ms)

    def window_size_ms(self, now_ms: int) -> int:
        """The time the rate is measured over (Kafka's ``Rate.windowSize``)."""
        self._purge(now_ms)
        oldest = min((s.window_start_ms for s in self._samples), default=now_ms)
        elapsed_ms = now_ms - oldest
        full_windows = elapsed_ms // self.window_ms
        if full_windows < self.samples - 1:
            elapsed_ms += (self.samples - 1 - full_windows) * self.window_ms
        return max(elapsed_ms, 1)

    def measure(self, now_ms: int) -> float:
        """The rate per second at ``now_ms``."""
        self._purge(now_ms)
        total = sum(s.value for s in self._samples)
        return total / (self.window_size_ms(now_ms) / 1000)


def throttle_time_ms(rate: float, quota: float, window_ms: int, max_ms: int) -> int:
    """Kafka's throttle time for a client measured at ``rate`` against ``quota`` over
    ``window_ms``: 0 within the quota, else ``(rate - quota) / quota * window_ms``, rounded,
    at most ``max_ms``."""
    if rate <= quota:
        return 0
    return min(round((rate - quota) / quota * window_ms), max_ms)


@dataclass(slots=True)
class _Sensor:
    rate: SampledRate
    last_ms: int
    quota: float | None = None  # the quota last applied
    total: float = 0.0  # everything recorded, for the metrics
    throttle_ms_total: int = 0
    throttled: int = 0  # responses that carried a throttle time


class ClientQuotas:
    """One broker's quotas: the cluster's quota table, and per quota key a measurement per
    (user, client id) tags (:func:`resolve`). ``record`` returns the throttle time."""

    def __init__(
        self,
        window_num: int = QUOTA_WINDOW_NUM,
        window_size_seconds: int = QUOTA_WINDOW_SIZE_SECONDS,
    ) -> None:
        if window_num < 1 or window_size_seconds < 1:
            raise ValueError("quota.window.num and quota.window.size.seconds must be at least 1")
        self.window_num = window_num
        self.window_ms = window_size_seconds * 1000
        # Per quota key: see the module docstring.
        self.max_throttle_ms = {
            PRODUCER_BYTE_RATE: window_num * self.window_ms,
            CONSUMER_BYTE_RATE: window_num * self.window_ms,
            REQUEST_PERCENTAGE: self.window_ms,
        }
        self._table: dict[EntityKey, dict[str, float]] = {}
        self._limited: dict[tuple[str | None, str | None], bool] = {}  # limited()'s answers
        self._sensors: dict[str, OrderedDict[Tags, _Sensor]] = {
            k: OrderedDict() for k in QUOTA_KEYS
        }

    def update(self, entries: Iterable[tuple[EntityKey, Mapping[str, float]]]) -> None:
        """Take the cluster's quota table (from the metadata's ``client_quotas``)."""
        self._table = {entity: dict(values) for entity, values in entries}
        self._limited.clear()

    @property
    def table(self) -> QuotaTable:
        return self._table

    def record(
        self, key: str, principal: str | None, client_id: str | None, value: float, now_ms: int
    ) -> int:
        """Record ``value`` (bytes, or percent for request_percentage) for the client and
        return its throttle time in ms (0: within its quota, or it has none)."""
        user = user_of(principal)
        quota, tags = resolve(self._table, key, user, client_id or "")
        sensors = self._sensors[key]
        sensor = sensors.pop(tags, None)
        if sensor is None or now_ms - sensor.last_ms >= SENSOR_EXPIRY_MS:
            sensor = _Sensor(SampledRate(self.window_num, self.window_ms), now_ms)
        sensors[tags] = sensor  # most recently used last
        while len(sensors) > SENSORS_MAX:
            sensors.popitem(last=False)
        sensor.last_ms = now_ms
        sensor.quota = quota
        sensor.total += value
        sensor.rate.record(value, now_ms)
        if quota is None:
            return 0
        throttle_ms = throttle_time_ms(
            sensor.rate.measure(now_ms),
            quota,
            sensor.rate.window_size_ms(now_ms),
            self.max_throttle_ms[key],
        )
        if throttle_ms:
            sensor.throttled += 1
            sensor.throttle_ms_total += throttle_ms
        return throttle_ms

    def limited(self, principal: str | None, client_id: str | None) -> bool:
        """Whether any quota applies to the client (its connections are served one request at a
        time, so that pipelining cannot outrun a throttle)."""
        found = self._limited.get((principal, client_id))
        if found is None:
            if len(self._limited) >= SENSORS_MAX:
                self._limited.clear()
            user = user_of(principal)
            found = any(resolve(self._table, k, user, client_id or "")[0] for k in QUOTA_KEYS)
            self._limited[(principal, client_id)] = found
        return found

    def unrecord(
        self, key: str, principal: str | None, client_id: str | None, value: float, now_ms: int
    ) -> None:
        """Take back ``value`` (Kafka's ``unrecordQuotaSensor``: a throttled Fetch is answered
        without its data, which must not count)."""
        user = user_of(principal)
        _, tags = resolve(self._table, key, user, client_id or "")
        sensor = self._sensors[key].get(tags)
        if sensor is not None:
            sensor.total -= value
            sensor.rate.record(-value, now_ms)

    def record_request_time(
        self,
        api_key: int,
        principal: str | None,
        client_id: str | None,
        handler_s: float,
        now_ms: int,
    ) -> int:
        """Record a request's handler time against request_percentage; its throttle time."""
        if api_key in EXEMPT_APIS:
            return 0
        return self.record(REQUEST_PERCENTAGE, principal, client_id, handler_s * 100, now_ms)

    def metrics(self, now_ms: int) -> dict[str, list[dict[str, Any]]]:
        """Per quota key, per (user, client id) measured: the quota, the rate now, the total
        recorded, and the throttle times given."""
        out: dict[str, list[dict[str, Any]]] = {}
        for key, sensors in self._sensors.items():
            rows = []
            for (user, client_id), sensor in sensors.items():
                rows.append(
                    {
                        "user": user,
                        "client_id": client_id,
                        "quota": sensor.quota,
                        "rate": sensor.rate.measure(now_ms),
                        "total": sensor.total,
                        "throttled": sensor.throttled,
                        "throttle_time_ms_total": sensor.throttle_ms_total,
                    }
                )
            out[key] = rows
        return out


@types.coroutine
def busy_time(
    awaitable: Awaitable[_T], clock: Callable[[], float]
) -> Generator[Any, Any, tuple[_T, float]]:
    """Await ``awaitable`` and return (its result, the seconds it ran on the event loop): the
    time between ``clock()`` readings around each of its steps, not the time it waited. This
    is the handler time request_percentage counts (Kafka counts the request's thread time, not
    the time it waits in purgatory); tasks the awaitable starts are not counted."""
    steps = awaitable.__await__()
    busy_s = 0.0
    value: Any = None
    error: BaseException | None = None
    while True:
        started = clock()
        try:
            yielded = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value, busy_s + clock() - started
        busy_s += clock() - started
        try:
            value, error = (yield yielded), None
        except BaseException as exc:  # cancellation and throw(): handed to the awaitable
            value, error = None, exc
