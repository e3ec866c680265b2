"""How a configuration key is defined, parsed, validated and described: the machinery under
raylog's config registries (``config_keys.py``: topic and broker keys; ``security_config_keys.py``:
the client listeners' and security keys).

Rules followed from Kafka:

- values are trimmed; booleans are ``true``/``false`` in any case; ints and longs are decimal
  (Java's ``parseInt``: an optional sign, digits only) within the 32/64-bit range; doubles are
  decimal as Java's ``parseDouble`` reads them (``0.5``, ``1``, ``1e-1``, ``.5d``; not NaN or
  infinite) and stored as Java's ``Double.toString`` writes them, as Kafka shows them
  (``1`` -> ``1.0``);
- a list is stored with its items sorted and each once: ``cleanup.policy``, the only list, is
  a set of policies, so ``delete,compact`` and ``compact, delete`` are one value
  (``compact,delete``). Kafka stores a list as given;
- unknown keys and bad values raise :class:`~raylog.storage.errors.InvalidConfigError` (Kafka
  code 40) whose message names the key and the value, as Kafka does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any, Literal

import msgspec

from raylog.storage.errors import InvalidConfigError

ConfigType = Literal["boolean", "string", "int", "long", "double", "list"]

# DescribeConfigs ``config_type`` codes (Kafka's ConfigEntry.ConfigType).
CONFIG_TYPE_CODES: dict[ConfigType, int] = {
    "boolean": 1,
    "string": 2,
    "int": 3,
    "long": 5,
    "double": 6,
    "list": 7,
}

# DescribeConfigs ``config_source`` codes (Kafka's DescribeConfigsResponse.ConfigSource).
SOURCE_TOPIC_CONFIG = 1  # DYNAMIC_TOPIC_CONFIG: an override stored with the topic
SOURCE_STATIC_BROKER_CONFIG = 4  # set in the broker's configuration at start-up
SOURCE_DEFAULT_CONFIG = 5  # the registry's default

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
_INTEGER = re.compile(r"[+-]?[0-9]+")
# Java's Double.parseDouble, decimal forms: digits with an optional point, exponent and type
# suffix. Its NaN, Infinity and hexadecimal forms are refused.
_DOUBLE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?")


class ConfigDef(msgspec.Struct, frozen=True, kw_only=True):
    """One key: its Kafka name, type, default (as its normalised string) and rule."""

    name: str
    type: ConfigType
    default: str
    doc: str
    minimum: int | None = None  # ints, longs and doubles: inclusive lower bound
    maximum: int | None = None  # ints, longs and doubles: inclusive upper bound
    choices: tuple[str, ...] = ()  # strings and list items: the allowed values (case-sensitive)
    note: str = ""  # why raylog's default or rule differs from Kafka's
    sensitive: bool = False  # a secret: DescribeConfigs shows no value (Kafka's is_sensitive)


class ConfigEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One row of a DescribeConfigs answer."""

    name: str
    value: str | None  # None for a sensitive key, as Kafka answers
    is_default: bool
    source: int  # SOURCE_* code
    config_type: int  # CONFIG_TYPE_CODES value
    read_only: bool = False
    is_sensitive: bool = False
    documentation: str = ""


def invalid(key: str, value: object, why: str) -> InvalidConfigError:
    return InvalidConfigError(f"Invalid value {value!r} for configuration {key}: {why}")


def _parse(d: ConfigDef, raw: str) -> Any:
    """Parse and check one value; return the typed value (raises InvalidConfigError)."""
    if not isinstance(raw, str):
        raise invalid(d.name, raw, f"expected a string holding a {d.type}")
    text = raw.strip()
    if d.type == "boolean":
        low = text.lower()
        if low not in ("true", "false"):
            raise invalid(d.name, raw, "expected true or false")
        return low == "true"
    if d.type in ("int", "long", "double"):
        value = _number(d, raw, text)
        if d.minimum is not None and value < d.minimum:
            raise invalid(d.name, raw, f"value must be at least {d.minimum}")
        if d.maximum is not None and value > d.maximum:
            raise invalid(d.name, raw, f"value must be at most {d.maximum}")
        return value
    items = [t.strip() for t in text.split(",")] if d.type == "list" else [text]
    if d.type == "list":
        items = sorted({t for t in items if t})
        if not items:
            raise invalid(d.name, raw, f"expected at least one of {', '.join(d.choices)}")
    for item in items:
        if d.choices and item not in d.choices:
            raise invalid(d.name, raw, f"must be one of {', '.join(d.choices)}")
    return ",".join(items) if d.type == "list" else text


def _number(d: ConfigDef, raw: str, text: str) -> int | float:
    """An int, long or double as Java parses it, within its type's range."""
    if d.type == "double":
        if not _DOUBLE.fullmatch(text):
            raise invalid(d.name, raw, "expected a decimal number (double)")
        value = float(text.rstrip("fFdD"))
        if math.isinf(value):
            raise invalid(d.name, raw, "out of the double range")
        return value
    if not _INTEGER.fullmatch(text):
        raise invalid(d.name, raw, f"expected a decimal integer ({d.type})")
    bound = INT32_MAX if d.type == "int" else INT64_MAX
    if not -bound - 1 <= int(text) <= bound:
        raise invalid(d.name, raw, f"out of the {d.type} range")
    return int(text)


def _normalise(d: ConfigDef, value: Any) -> str:
    if d.type == "boolean":
        return "true" if value else "false"
    if d.type == "double":
        return _java_double(value)
    return str(value)


def _java_double(value: float) -> str:
    """``value`` as Java's ``Double.toString`` writes it: the shortest digits that read back
    as ``value`` (Python's ``repr`` finds the same), plain from 1e-3 up to 1e7 with at least
    one digit after the point (``1.0``, ``0.5``), else ``1.0E-4`` style."""
    if value == 0:
        return "0.0"
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + int(exponent)  # the decimal point sits after this many digits
    digits = digits.rstrip("0")
    sign = "-" if value < 0 else ""
    if point > 7 or point < -2:
        return f"{sign}{digits[0]}.{digits[1:] or '0'}E{point - 1}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    return f"{sign}{digits[:point].ljust(point, '0')}.{digits[point:] or '0'}"


CrossCheck = Callable[["ConfigRegistry", Mapping[str, str]], None]


class ConfigRegistry:
    """A set of :class:`ConfigDef` and the typed struct its resolved values fill.

    Invariant (checked at construction): the struct's fields are exactly the keys with ``.``
    replaced by ``_``, and every default passes its own rule.
    """

    def __init__(
        self,
        defs: Iterable[ConfigDef],
        struct: type[msgspec.Struct],
        checks: Iterable[CrossCheck] = (),
    ) -> None:
        self.defs: dict[str, ConfigDef] = {d.name: d for d in defs}
        self.struct = struct
        # Rules across keys; validate() runs them so that it stays the only gate.
        self.checks = tuple(checks)
        fields = set(struct.__struct_fields__)
        keys = {_field(k) for k in self.defs}
        if fields != keys:
            raise RuntimeError(f"{struct.__name__} fields {fields ^ keys} do not match the keys")
        for d in self.defs.values():
            if _normalise(d, _parse(d, d.default)) != d.default:
                raise RuntimeError(f"default of {d.name} is not normalised: {d.default!r}")

    def validate(self, overrides: Mapping[str, str]) -> dict[str, str]:
        """Check every key and value; return the overrides normalised, sorted by key."""
        out: dict[str, str] = {}
        for key in sorted(overrides):
            d = self.defs.get(key)
            if d is None:
                raise InvalidConfigError(
                    f"Unknown configuration {key} (value {overrides[key]!r}); "
                    f"known keys: {', '.join(sorted(self.defs))}"
                )
            out[key] = _normalise(d, _parse(d, overrides[key]))
        for check in self.checks:
            check(self, out)
        return out

    def effective(self, overrides: Mapping[str, str]) -> Any:
        """The typed struct with every key resolved: overrides over defaults."""
        given = self.validate(overrides)
        values = {_field(k): _parse(d, given.get(k, d.default)) for k, d in self.defs.items()}
        return self.struct(**values)

    def describe(
        self,
        overrides: Mapping[str, str],
        keys: Iterable[str] | None = None,
        *,
        override_source: int = SOURCE_TOPIC_CONFIG,
    ) -> list[ConfigEntry]:
        """DescribeConfigs rows for ``keys`` (all keys when None), sorted by key.

        A key DescribeConfigs asks about that the registry does not hold raises
        InvalidConfigError, like any unknown key.
        """
        given = self.validate(overrides)
        wanted = sorted(self.defs) if keys is None else list(keys)
        rows = []
        for key in wanted:
            d = self.defs.get(key)
            if d is None:
                raise InvalidConfigError(f"Unknown configuration {key}")
            is_default = key not in given
            rows.append(
                ConfigEntry(
                    name=key,
                    value=None if d.sensitive else d.default if is_default else given[key],
                    is_default=is_default,
                    source=SOURCE_DEFAULT_CONFIG if is_default else override_source,
                    config_type=CONFIG_TYPE_CODES[d.type],
                    is_sensitive=d.sensitive,
                    documentation=d.doc,
                )
            )
        return rows

    def apply_incremental(
        self,
        current: Mapping[str, str],
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Iterable[str] = (),
    ) -> dict[str, str]:
        """IncrementalAlterConfigs SET/DELETE on ``current``; returns the validated result.

        Deleting a key that is not overridden is a no-op, as in Kafka; deleting an unknown key
        raises.
        """
        out = dict(current)
        for key in delete_configs:
            if key not in self.defs:
                raise InvalidConfigError(f"Unknown configuration {key}")
            out.pop(key, None)
        out.update(set_configs or {})
        return self.validate(out)


def _field(key: str) -> str:
    return key.replace(".", "_")
