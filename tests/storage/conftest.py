"""Fixtures of the storage tests: ``store``, one object store of each implementation (the
local directory store, and the S3 store against moto's real S3 server), so that a test runs
against both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raylog.storage.localstore import LocalObjectStore
from raylog.storage.objectstore import ObjectStore
from raylog.storage.s3store import S3ObjectStore


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield LocalObjectStore(tmp_path / "store")
        return
    kwargs: dict[str, Any] = request.getfixturevalue("s3_client_kwargs")
    bucket = request.getfixturevalue("create_bucket")()
    s3 = S3ObjectStore(bucket, prefix="cluster-1", **kwargs)  # runs the probe
    yield s3
    s3.close()
