"""raylog.storage: the write-ahead log (segments, indexes, epochs) and its batch format; the
object store (S3 or a local directory, with conditional writes) and the controller lease on it.

``S3ObjectStore`` is imported lazily, so that importing raylog.storage does not import boto3."""

from raylog.storage.lease import LeaseLogic, LeaseRecord
from raylog.storage.leasekeeper import LeaseKeeper
from raylog.storage.localstore import LocalObjectStore
from raylog.storage.log import AppendInfo, EpochEntry, Log, LogConfig, LogStats, TimestampOffset
from raylog.storage.objectstore import ObjectStore, StoredObject

__all__ = [
    "AppendInfo",
    "EpochEntry",
    "LeaseKeeper",
    "LeaseLogic",
    "LeaseRecord",
    "LocalObjectStore",
    "Log",
    "LogConfig",
    "LogStats",
    "ObjectStore",
    "S3ObjectStore",
    "StoredObject",
    "TimestampOffset",
]


def __getattr__(name: str) -> object:
    if name == "S3ObjectStore":
        from raylog.storage.s3store import S3ObjectStore

        return S3ObjectStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
