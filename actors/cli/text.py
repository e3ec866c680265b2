"""What commands read from their arguments and print: ``KEY=VALUE`` pairs, broker id lists,
JSON for scripts, and Kafka's error names for error codes."""

from __future__ import annotations

import json
from typing import Any

from raylog.actors.cli.client import CliError
from raylog.storage.errors import RaylogError


def parse_configs(pairs: list[str], flag: str = "--config") -> dict[str, str]:
    """``["k=v", ...]`` as a dict; a pair without ``=`` or key is a CliError naming ``flag``."""
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"{flag} wants key=value, got {pair!r}")
        configs[key] = value
    return configs


def ids(values: Any) -> str:
    """Broker ids as Kafka's tools print them: ``1,2,3``."""
    return ",".join(str(i) for i in values)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True), flush=True)


def error_names() -> dict[int, str]:
    """Kafka error code -> the name of raylog's exception for it."""
    names = {}
    pending = list(RaylogError.__subclasses__())
    while pending:  # bounded by the (finite) class tree
        cls = pending.pop()
        names[cls.error_code] = cls.__name__
        pending.extend(cls.__subclasses__())
    return names
