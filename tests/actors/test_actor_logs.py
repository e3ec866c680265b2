"""How raylog's actor processes log (``raylog.actors.logs``).

Proves: ``RAYLOG_LOG_LEVEL`` names a level in any case (INFO when unset), and a name that is no
level is refused with the choices; ``configure`` gives the ``raylog`` loggers one handler
however often it runs, whose lines carry the time, the level and the logger, at the level the
environment names.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import pytest

from raylog.actors import logs


@pytest.fixture
def raylog_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("raylog")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    logger.handlers = [h for h in logger.handlers if not isinstance(h, logs._Handler)]
    try:
        yield logger
    finally:
        logger.handlers, logger.level, logger.propagate = saved


def test_the_level_comes_from_the_environment() -> None:
    assert logs.level_from({}) == "INFO"
    assert logs.level_from({logs.LEVEL_ENV: " debug "}) == "DEBUG"
    with pytest.raises(ValueError, match="RAYLOG_LOG_LEVEL='loud': expected one of DEBUG"):
        logs.level_from({logs.LEVEL_ENV: "loud"})


def test_configure_adds_one_timestamped_handler(
    raylog_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(logs.LEVEL_ENV, "warning")
    logs.configure()
    logs.configure()  # a second actor in the same process
    [handler] = [h for h in raylog_logger.handlers if isinstance(h, logs._Handler)]
    out = io.StringIO()
    handler.setStream(out)
    logging.getLogger("raylog.actors.test").info("not at WARNING")
    logging.getLogger("raylog.actors.test").warning("broker %d fenced", 3)
    line = out.getvalue()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING raylog\.actors\.test: broker 3 fenced\n",
        line,
    ), line
