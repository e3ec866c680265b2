"""IncrementalAlterConfigs (key 44), version 0: patch a topic's config overrides (KIP-339).

:func:`apply_ops` is the pure rule, as Kafka's ``ConfigAdminManager`` applies it:

- SET (0) overrides the key; DELETE (1) removes the override (the default applies again; a key
  that is not overridden is a no-op);
- APPEND (2) / SUBTRACT (3) only for list configs (``cleanup.policy``): the current list, the
  override or else the default, gains the given items not already in it / loses them (then
  stored sorted, as ``config_keys`` stores every list: APPEND compact to delete stores
  ``compact,delete``). On any other config they are INVALID_CONFIG (40), naming the key;
- a key named twice in one resource, an unknown operation, or a null value for SET, APPEND or
  SUBTRACT is INVALID_REQUEST (42); an unknown key is INVALID_CONFIG.

The handler reads the topic's overrides from the controller, applies the operations and stores
the result with the controller's AlterConfigs, whose validation (``config_keys``) is the one
gate. Known gap: the read and the write are two controller calls, so two patches of one topic
racing through different brokers can lose one of them; the controller has no compare-and-set
on a topic's configs for the gateway to use yet.

Authorization: as AlterConfigs' (``alter_configs.alter_each``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from kafka.protocol.admin import IncrementalAlterConfigsResponse

from raylog.actors.control import config_keys, config_registry
from raylog.gateway.backend import AdminBackend, AdminResult
from raylog.gateway.handlers.alter_configs import alter_each
from raylog.gateway.handlers.context import RequestContext
from raylog.gateway.protocol import Request
from raylog.storage.errors import InvalidConfigError, InvalidRequestError, RaylogError

API_KEY = 44

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {SET: "set", DELETE: "delete", APPEND: "append", SUBTRACT: "subtract"}


class ConfigOp(NamedTuple):
    name: str
    op: int
    value: str | None


def apply_ops(
    registry: config_registry.ConfigRegistry, current: Mapping[str, str], ops: Sequence[ConfigOp]
) -> dict[str, str]:
    """The overrides after ``ops`` (not yet validated); raises InvalidConfigError (40) or
    InvalidRequestError (42) naming the key."""
    repeated = sorted(k for k, n in Counter(o.name for o in ops).items() if n > 1)
    if repeated:
        raise InvalidRequestError(f"Error due to duplicate config keys: {repeated}")
    out = dict(current)
    for o in ops:
        if o.op not in _OP_NAMES:
            raise InvalidRequestError(f"Unknown config operation {o.op} for {o.name}")
        d = registry.defs.get(o.name)
        if d is None:
            raise InvalidConfigError(f"Unknown configuration {o.name}")
        if o.op == DELETE:
            out.pop(o.name, None)
            continue
        if o.value is None:
            raise InvalidRequestError(f"Null value not supported for : {o.name}")
        if o.op == SET:
            out[o.name] = o.value
            continue
        if d.type != "list":
            raise InvalidConfigError(
                f"Config value {_OP_NAMES[o.op]} is not allowed for config key: {o.name} "
                f"(a {d.type}, not a list)"
            )
        items = _items(out.get(o.name, d.default))
        given = _items(o.value)
        if o.op == APPEND:
            items += [i for i in given if i not in items]
        else:
            items = [i for i in items if i not in given]
        out[o.name] = ",".join(items)
    return out


def _items(value: str) -> list[str]:
    return list(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))


async def handle(context: RequestContext, request: Request) -> Any:
    return await alter_each(context, request, IncrementalAlterConfigsResponse, _alter)


async def _alter(backend: AdminBackend, resource: Any, validate_only: bool) -> AdminResult:
    current = await backend.topic_configs(resource.resource_name)
    if current.error_code:
        return AdminResult(current.error_code, current.message)
    ops = [ConfigOp(c.name, c.config_operation, c.value) for c in resource.configs]
    try:
        overrides = apply_ops(config_keys.TOPIC_CONFIGS, current.overrides, ops)
    except RaylogError as exc:
        return AdminResult(exc.error_code, str(exc))
    return await backend.alter_topic_configs(resource.resource_name, overrides, validate_only)
