"""How raylog's actor processes log: one line per record, with its time, level and logger, on
the process's stderr (Ray keeps it as the worker's ``.err`` file in its session's ``logs``).

Without this, Python's last-resort handler prints warnings and errors as bare messages with no
time, and drops every INFO line. :data:`SETUP_HOOK` is Ray's ``worker_process_setup_hook`` of the
job that starts the cluster, so every raylog actor process runs :func:`configure` before its
first task. ``RAYLOG_LOG_LEVEL`` (a Python level name, INFO unless set) sets the level.
"""

from __future__ import annotations

import logging
import os

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVEL_ENV = "RAYLOG_LOG_LEVEL"
DEFAULT_LEVEL = "INFO"
SETUP_HOOK = "raylog.actors.cluster.logs.configure"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def level_from(environ: dict[str, str] | os._Environ[str]) -> str:
    """The level ``RAYLOG_LOG_LEVEL`` names (any case), else INFO; ValueError if it names none."""
    given = environ.get(LEVEL_ENV, "").strip().upper() or DEFAULT_LEVEL
    if given not in LEVELS:
        raise ValueError(f"{LEVEL_ENV}={environ[LEVEL_ENV]!r}: expected one of {', '.join(LEVELS)}")
    return given


def runtime_env() -> dict[str, object]:
    """The job's runtime environment for Ray: the setup hook, and the level it reads (checked
    here, in the process that starts the cluster, so a bad value fails there)."""
    return {
        "worker_process_setup_hook": SETUP_HOOK,
        "env_vars": {LEVEL_ENV: level_from(os.environ)},
    }


def configure() -> None:
    """Give the ``raylog`` loggers one stderr handler (once per process)."""
    logger = logging.getLogger("raylog")
    if any(isinstance(h, _Handler) for h in logger.handlers):
        return
    handler = _Handler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    try:
        logger.setLevel(level_from(os.environ))
    except ValueError:  # checked where the cluster started; a worker must not fail on it
        logger.setLevel(DEFAULT_LEVEL)
    logger.propagate = False


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """raylog's own handler, told apart from any other on the logger."""


__all__ = ["LEVEL_ENV", "LOG_FORMAT", "SETUP_HOOK", "configure", "level_from", "runtime_env"]
