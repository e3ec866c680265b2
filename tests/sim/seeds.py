"""Which seeds the simulator runs, and the one command that replays a failing one.

Every kind of run (clean elections, failed logs, transactions, unclean elections) takes two
sets of seeds:
- fixed seeds, the same on every run, so that whatever they once caught stays caught (with the
  seeds that found bugs, ``FOUND_BUGS`` in test_sim.py);
- fresh seeds, counted from a base derived from the commit under test (git HEAD), or from the
  date where git cannot say: each commit explores seeds no other commit ran. The base is
  printed in pytest's header and in the name of every test case (``seeds<first>-<last>``), and
  a failing seed prints the command that replays it exactly, its scenario's overrides included.

Environment:
- ``RAYLOG_SIM_SEEDS`` (or ``--sim-seeds``), ``RAYLOG_SIM_LOG_FAILURE_SEEDS``,
  ``RAYLOG_SIM_TXN_SEEDS``, ``RAYLOG_SIM_UNCLEAN_SEEDS``, ``RAYLOG_SIM_LINK_SEEDS``,
  ``RAYLOG_SIM_SYNC_LINK_SEEDS``: how many fresh seeds each kind runs;
- ``RAYLOG_SIM_SEED_BASE``: the first fresh seed (to re-run the seeds of another run);
- ``RAYLOG_SIM_SEED``, ``RAYLOG_SIM_OVERRIDES`` (JSON, as a failure prints it),
  ``RAYLOG_SIM_TRACE``: what ``test_replay`` runs, and whether it prints every event.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import json
import os
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED_BASE = 1_000_000  # the clean and failed-log runs' fixed seeds start here
FRESH_SEED_MIN = 10_000_000  # fresh seeds lie in [FRESH_SEED_MIN, FRESH_SEED_MIN + SPAN)
FRESH_SEED_SPAN = 990_000_000
GIT_TIMEOUT_S = 10.0
REPLAY_TEST = "tests/sim/test_sim.py::test_replay"

_CLASS = "class"  # how an override that is a class (a mutated replica, controller) is encoded
_DATACLASS = "dataclass"  # and one that is a dataclass instance (a NetworkConfig)


def _fresh_base_from(text: str) -> int:
    return FRESH_SEED_MIN + int(text, 16) % FRESH_SEED_SPAN


@functools.cache
def _git_head() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    head = out.stdout.strip()
    return head if len(head) >= 12 and all(c in "0123456789abcdef" for c in head) else None


def fresh_seed_base() -> tuple[int, str]:
    """The first fresh seed, and where it comes from (for the header)."""
    given = os.environ.get("RAYLOG_SIM_SEED_BASE")
    if given:
        return int(given), "RAYLOG_SIM_SEED_BASE"
    head = _git_head()
    if head is not None:
        return _fresh_base_from(head[:12]), f"commit {head[:12]}"
    today = datetime.date.today()
    return _fresh_base_from(f"{today.toordinal():x}"), f"date {today.isoformat()}"


@dataclasses.dataclass(frozen=True)
class SeedKind:
    """One kind of run: its scenario overrides, its fixed seeds, how many fresh ones (the
    environment variable ``fresh_env``, else ``fresh_default``), and how many per test case."""

    overrides: dict[str, Any]
    fixed: range
    fresh_env: str
    fresh_default: int
    # Fresh seeds of different kinds start at different offsets from the base, so that two
    # kinds never run the same seeds of one commit.
    fresh_offset: int
    chunk: int

    def fresh(self, base: int, option: int | None = None) -> range:
        if option is None:
            option = int(os.environ.get(self.fresh_env, self.fresh_default))
        start = base + self.fresh_offset
        return range(start, start + option)

    def chunks(self, base: int, option: int | None = None) -> list[range]:
        """The fixed seeds, then the fresh ones, in ranges of at most ``chunk`` seeds."""
        fresh = self.fresh(base, option)
        step = self.chunk
        return [r[i : i + step] for r in (self.fixed, fresh) for i in range(0, len(r), step)]


def chunk_id(seeds: range) -> str:
    return f"seeds{seeds.start}-{seeds.stop - 1}"


# --- overrides: encoded for a command line, decoded for the replay ------------------------------


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, type):
        return {_CLASS: f"{value.__module__}:{value.__qualname__}"}
    if dataclasses.is_dataclass(value):
        fields = {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        kind = type(value)
        return {_DATACLASS: f"{kind.__module__}:{kind.__qualname__}", "fields": fields}
    raise TypeError(f"a scenario override cannot be replayed from the command line: {value!r}")


def _resolve(name: str) -> Any:
    module, _, qualname = name.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and _CLASS in value:
        return _resolve(value[_CLASS])
    if isinstance(value, dict) and _DATACLASS in value:
        kind: Callable[..., Any] = _resolve(value[_DATACLASS])
        return kind(**{k: _decode(v) for k, v in value["fields"].items()})
    return value


def encode_overrides(overrides: dict[str, Any]) -> str:
    return json.dumps({k: _encode(v) for k, v in sorted(overrides.items())}, sort_keys=True)


def decode_overrides(text: str) -> dict[str, Any]:
    return {k: _decode(v) for k, v in json.loads(text).items()} if text else {}


def replay_command(seed: int, overrides: dict[str, Any]) -> str:
    """The command that re-runs ``seed`` with ``overrides`` (add RAYLOG_SIM_TRACE=1 and -s to
    print every event)."""
    env = f"RAYLOG_SIM_SEED={seed}"
    if overrides:
        env += f" RAYLOG_SIM_OVERRIDES={shlex.quote(encode_overrides(overrides))}"
    return f"{env} .venv/bin/python -m pytest {REPLAY_TEST}"


def replay_request() -> tuple[int, dict[str, Any], bool]:
    """What ``test_replay`` runs: (seed, overrides, trace) from the environment."""
    seed = int(os.environ.get("RAYLOG_SIM_SEED", SEED_BASE))
    overrides = decode_overrides(os.environ.get("RAYLOG_SIM_OVERRIDES", ""))
    return seed, overrides, bool(os.environ.get("RAYLOG_SIM_TRACE"))
