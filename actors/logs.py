"""How raylog's actor processes log: one line per record, with its time, level and logger, on
the process's stderr (Ray keeps it as the worker's ``.err`` file in its session's ``logs``).

Without this, Python's last-resort handler prints warnings and errors as bare messages with no
time, and drops every INFO line. Each raylog actor calls :func:`configure` first thing in its
constructor (a Ray ``worker_process_setup_hook`` would do it too, but a job with a runtime
environment gets no pre-started workers: every actor started about twice as slowly).
``RAYLOG_LOG_LEVEL`` (a Python level name, INFO unless set) sets the level; it is read from the
worker's environment, which Ray's processes inherit from `raylog up` (on a real Ray cluster,
from each node's ``ray start``), and checked by `raylog up` (:func:`level_from`).
"""

from __future__ import annotations

import logging
import os

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVEL_ENV = "RAYLOG_LOG_LEVEL"
DEFAULT_LEVEL = "INFO"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def level_from(environ: dict[str, str] | os._Environ[str]) -> str:
    """The level ``RAYLOG_LOG_LEVEL`` names (any case), else INFO; ValueError if it names none."""
    given = environ.get(LEVEL_ENV, "").strip().upper() or DEFAULT_LEVEL
    if given not in LEVELS:
        raise ValueError(f"{LEVEL_ENV}={environ[LEVEL_ENV]!r}: expected one of {', '.join(LEVELS)}")
    return given


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
    except ValueError:  # refused where the cluster started; a worker must not fail on it
        logger.setLevel(DEFAULT_LEVEL)
    logger.propagate = False


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """raylog's own handler, told apart from any other on the logger."""


__all__ = ["LEVEL_ENV", "LOG_FORMAT", "configure", "level_from"]
