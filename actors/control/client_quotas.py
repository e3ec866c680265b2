"""Pure: client quotas in the cluster metadata (KIP-55, KIP-546): altering and describing them.

A quota entity is a user, a client id, or both (Kafka's ClientQuotaEntity), each a name or the
default entity (``<default>``, null on the wire); its values are Kafka's quota keys:

- ``producer_byte_rate``, ``consumer_byte_rate``: bytes/s, integral (Kafka's LONG keys);
- ``request_percentage``: percent of one handler thread's time per second (DOUBLE).

AlterClientQuotas and DescribeClientQuotas are carried out as Kafka's controller does
(ClientQuotaControlManager, ClientQuotasImage.describe), with its error codes and messages:
an empty entity, an entity type named twice, an empty name, an unknown key or a value that is
not positive (or fractional for a byte rate) is INVALID_REQUEST (42) for that entry; an entity
type other than ``user`` / ``client-id`` is UNSUPPORTED_VERSION (35) (raylog has no ``ip``
quotas). The gateways enforce the values (``gateway/quotas.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from raylog.actors.control.metadata import ClientQuotaRecord, ClusterMetadata, _bump

__all__ = [
    "CLIENT_ID",
    "DEFAULT",
    "QUOTA_KEYS",
    "USER",
    "ClientQuotaEntry",
    "EntityResult",
    "alter_client_quotas",
    "describe_client_quotas",
    "entity_of",
]

USER, CLIENT_ID = "user", "client-id"  # Kafka's ClientQuotaEntity types
DEFAULT = "<default>"  # the default entity, as Kafka's ZooKeeper paths and tools name it
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
# Kafka's QuotaConfigs: key -> integral (LONG) or not (DOUBLE).
QUOTA_KEYS = {PRODUCER_BYTE_RATE: True, CONSUMER_BYTE_RATE: True, REQUEST_PERCENTAGE: False}
LONG_MAX = float(2**63 - 1)
# DescribeClientQuotas' match types.
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
INVALID_REQUEST, UNSUPPORTED_VERSION = 42, 35

# An entity as on the wire: (entity type, name or None for the default), in any order.
WireEntity = Sequence[tuple[str, str | None]]
# One AlterClientQuotas op: (key, value, remove).
QuotaOp = tuple[str, float, bool]


class ClientQuotaEntry(NamedTuple):
    """One entry of AlterClientQuotas."""

    entity: WireEntity
    ops: Sequence[QuotaOp]


class EntityResult(NamedTuple):
    """Per entry of AlterClientQuotas: Kafka's error code and message (0, "" = done)."""

    entity: WireEntity
    error_code: int
    message: str


class _Invalid(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def entity_of(record: ClientQuotaRecord) -> list[tuple[str, str | None]]:
    """A stored record's entity as on the wire (None: the default entity)."""
    out: list[tuple[str, str | None]] = []
    for entity_type, name in ((USER, record.user), (CLIENT_ID, record.client_id)):
        if name is not None:
            out.append((entity_type, None if name == DEFAULT else name))
    return out


def _key(entity: WireEntity) -> tuple[str | None, str | None]:
    """(user, client id) of a wire entity, each a name, DEFAULT or None (absent); raises
    _Invalid with Kafka's code and message."""
    if not entity:
        raise _Invalid(INVALID_REQUEST, "Invalid empty client quota entity")
    seen: dict[str, str] = {}
    for entity_type, name in entity:
        if entity_type in seen:
            raise _Invalid(
                INVALID_REQUEST,
                f"Invalid empty client quota entity, duplicate entity entry {entity_type}",
            )
        if entity_type not in (USER, CLIENT_ID):
            raise _Invalid(
                UNSUPPORTED_VERSION, f"Unhandled client quota entity type: {entity_type}"
            )
        if name is not None and not name:
            raise _Invalid(INVALID_REQUEST, f"Empty {entity_type} not supported")
        if name == DEFAULT:  # stored as the default's name: a literal one would be ambiguous
            raise _Invalid(INVALID_REQUEST, f"{DEFAULT} names the default {entity_type}")
        seen[entity_type] = DEFAULT if name is None else name
    return seen.get(USER), seen.get(CLIENT_ID)


def _check_value(key: str, value: float) -> None:
    if key not in QUOTA_KEYS:
        raise _Invalid(INVALID_REQUEST, f"Invalid configuration key {key}")
    if not value > 0.0:  # also NaN
        raise _Invalid(INVALID_REQUEST, f"Quota {key} must be greater than 0")
    if QUOTA_KEYS[key]:
        if value > LONG_MAX:
            raise _Invalid(INVALID_REQUEST, f"Proposed value for {key} is too large for a LONG.")
        if abs(value % 1.0) > 1e-6:
            raise _Invalid(INVALID_REQUEST, f"{key} cannot be a fractional value.")


def _apply(values: dict[str, float], ops: Sequence[QuotaOp]) -> dict[str, float]:
    out = dict(values)
    for key, value, remove in ops:
        if remove:
            if key not in QUOTA_KEYS:
                raise _Invalid(INVALID_REQUEST, f"Invalid configuration key {key}")
            out.pop(key, None)
        else:
            _check_value(key, value)
            out[key] = float(value)
    return out


def alter_client_quotas(
    md: ClusterMetadata, entries: Iterable[ClientQuotaEntry], validate_only: bool = False
) -> tuple[ClusterMetadata, list[EntityResult]]:
    """AlterClientQuotas: each entry is checked on its own and the valid ones applied together
    (none when ``validate_only``); an entity left without values is removed. One result per
    entry, in the request's order."""
    table = {(r.user, r.client_id): r.values for r in md.client_quotas}
    results: list[EntityResult] = []
    changed = False
    for entity, ops in entries:
        try:
            key = _key(entity)
            values = _apply(table.get(key, {}), ops)
        except _Invalid as exc:
            results.append(EntityResult(entity, exc.code, str(exc)))
            continue
        results.append(EntityResult(entity, 0, ""))
        if values != table.get(key, {}):
            changed = True
            if values:
                table[key] = values
            else:
                del table[key]
    if validate_only or not changed:
        return md, results
    records = tuple(
        ClientQuotaRecord(user=user, client_id=client_id, values=dict(sorted(values.items())))
        for (user, client_id), values in sorted(
            table.items(), key=lambda kv: (kv[0][0] or "", kv[0][1] or "")
        )
    )
    return _bump(md, client_quotas=records), results


class DescribeResult(NamedTuple):
    """DescribeClientQuotas: the request's error code and message, or the matching entities
    with their values."""

    error_code: int
    message: str
    entries: list[tuple[list[tuple[str, str | None]], dict[str, float]]]


def _filter(
    components: Sequence[tuple[str, int, str | None]],
) -> tuple[dict[str, str | None], set[str]]:
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for entity_type, match_type, match in components:
        if not entity_type:
            raise _Invalid(INVALID_REQUEST, "Invalid empty entity type.")
        if entity_type in exact or entity_type in specified:
            raise _Invalid(
                INVALID_REQUEST,
                f"Entity type {entity_type} cannot appear more than once in the filter.",
            )
        if entity_type not in (USER, CLIENT_ID):
            raise _Invalid(UNSUPPORTED_VERSION, f"Unsupported entity type {entity_type}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise _Invalid(
                    INVALID_REQUEST,
                    "Request specified MATCH_TYPE_EXACT, but set match string to null.",
                )
            exact[entity_type] = match
        elif match_type in (MATCH_DEFAULT, MATCH_SPECIFIED):
            if match is not None:
                name = (
                    "MATCH_TYPE_DEFAULT" if match_type == MATCH_DEFAULT else "MATCH_TYPE_SPECIFIED"
                )
                raise _Invalid(
                    INVALID_REQUEST, f"Request specified {name}, but also specified a match string."
                )
            if match_type == MATCH_DEFAULT:
                exact[entity_type] = None
            else:
                specified.add(entity_type)
        else:
            raise _Invalid(UNSUPPORTED_VERSION, f"Unknown match type {match_type}")
    return exact, specified


def describe_client_quotas(
    md: ClusterMetadata, components: Sequence[tuple[str, int, str | None]], strict: bool
) -> DescribeResult:
    """DescribeClientQuotas as Kafka answers it (ClientQuotasImage.describe): ``components``
    are (entity type, match type, match): exact name (0), the default (1) or any name (2); a
    ``strict`` filter excludes entities with types the filter does not name."""
    try:
        exact, specified = _filter(components)
    except _Invalid as exc:
        return DescribeResult(exc.code, str(exc), [])
    found = []
    for record in md.client_quotas:
        entity = dict(entity_of(record))
        if strict and len(entity) != len(exact) + len(specified):
            continue
        if any(t not in entity or entity[t] != name for t, name in exact.items()):
            continue
        if any(entity.get(t) is None for t in specified):
            continue
        found.append((entity_of(record), dict(record.values)))
    return DescribeResult(0, "", found)
