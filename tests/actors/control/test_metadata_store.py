"""MetadataStore: the controller's compare-and-swap persistence of the cluster metadata.

Proves, on the local object store (same conditional-write semantics as S3):
- nothing stored reads as None; the first write creates, later writes must name the ETag read;
- a writer holding a stale ETag loses (PreconditionFailedError) and re-reading shows the
  winner's version, with its controller epoch, so the loser can demote;
- a document that breaks a metadata invariant is never written;
- a newly elected controller records its epoch (creating the document for a new cluster, over
  the stored version otherwise), refuses a version naming its epoch or a newer one, and gives
  up once its lease is gone.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from raylog.actors.control import metadata as md_
from raylog.actors.control.metadata import ClusterMetadata
from raylog.actors.control.metadata_store import MetadataStore
from raylog.storage.errors import NotControllerError, PreconditionFailedError
from raylog.storage.localstore import LocalObjectStore


def test_cas_round_trip_and_lost_race(tmp_path: Path) -> None:
    store = MetadataStore(LocalObjectStore(str(tmp_path)))
    assert store.load() is None
    first = store.write(md_.take_controllership(ClusterMetadata(cluster_id="c"), 1), None)
    with pytest.raises(PreconditionFailedError):
        store.write(md_.take_controllership(ClusterMetadata(cluster_id="c"), 1), None)
    loaded = store.load()
    assert loaded is not None and loaded == first

    # Controller 2 takes over and writes; controller 1 still holds the old ETag.
    second = store.write(md_.take_controllership(loaded.metadata, 2), loaded.etag)
    registered = md_.register_broker(first.metadata, 1, "inc", "a", "127.0.0.1", 9092)
    with pytest.raises(PreconditionFailedError):
        store.write(registered, first.etag)
    now = store.load()
    assert (
        now is not None and now.metadata.controller_epoch == 2 == second.metadata.controller_epoch
    )
    assert now.metadata.metadata_epoch > first.metadata.metadata_epoch


def test_invariant_breaking_document_is_never_written(tmp_path: Path) -> None:
    store = MetadataStore(LocalObjectStore(str(tmp_path)))
    md = md_.register_broker(ClusterMetadata(cluster_id="c"), 1, "inc", None, "127.0.0.1", 9092)
    md = md_.create_topic(md, "t", "id1", [[1]])
    t = md.topics["t"]
    broken = msgspec.structs.replace(
        t, partitions=(msgspec.structs.replace(t.partitions[0], leader=7),)
    )
    with pytest.raises(AssertionError):
        store.write(msgspec.structs.replace(md, topics={"t": broken}), None)
    assert store.load() is None


def test_take_controllership_records_the_epoch_once(tmp_path: Path) -> None:
    store = MetadataStore(LocalObjectStore(str(tmp_path)))
    first = store.take_controllership(1, "c", lambda: True)
    assert first.metadata.cluster_id == "c" and first.metadata.controller_epoch == 1
    second = store.take_controllership(3, "c", lambda: True)
    assert second.metadata.controller_epoch == 3
    assert second.metadata.metadata_epoch > first.metadata.metadata_epoch
    with pytest.raises(NotControllerError, match="names controller epoch 3"):
        store.take_controllership(3, "c", lambda: True)  # a stale lease epoch
    with pytest.raises(NotControllerError, match="lost the lease"):
        store.take_controllership(4, "c", lambda: False)
    loaded = store.load()
    assert loaded is not None and loaded.metadata.controller_epoch == 3
