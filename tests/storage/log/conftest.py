"""Fixtures of the Log's tests: ``log_dir`` (a log directory, not created) and ``small_log``
(a Log open there with SMALL segments, closed at the end)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.log_data import SMALL

from raylog.storage import Log


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "topic-0"


@pytest.fixture
def small_log(log_dir: Path) -> Iterator[Log]:
    log = Log.open(log_dir, SMALL)
    yield log
    log.close()
