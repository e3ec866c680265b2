"""Compare-and-swap persistence of the cluster metadata in the object store.

This module owns the one object that holds :class:`~raylog.actors.control.metadata.ClusterMetadata`
(``metadata/cluster.json``) and the read-modify-write protocol on it:

1. ``load()`` returns the document and the ETag of that version (or ``None`` before the first
   controller ever wrote);
2. the controller decides a new version with the pure transitions of
   ``raylog.actors.control.metadata`` and ``raylog.actors.control.election``;
3. ``write(new, etag)`` replaces exactly the version it read (``put_if_match``), or creates the
   object (``put_if_absent``) when there was none. A lost race raises
   :class:`~raylog.storage.errors.PreconditionFailedError`: another controller wrote in between,
   so the caller re-reads and, if that version names a newer controller epoch, demotes.

Invariant: every version written has a ``metadata_epoch`` above the one it replaces (the pure
transitions bump it), so versions are totally ordered and a controller that re-reads resumes
exactly where the last writer stopped. Nothing here reads a clock or talks to Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from raylog.actors.control import metadata as md_
from raylog.actors.control.metadata import ClusterMetadata
from raylog.storage.errors import NotControllerError, PreconditionFailedError
from raylog.storage.objectstore import ObjectStore

METADATA_KEY = "metadata/cluster.json"
CAS_RETRIES_MAX = 5


class VersionedMetadata(NamedTuple):
    """A metadata version and the ETag that a compare-and-swap on it must name."""

    metadata: ClusterMetadata
    etag: str


class MetadataStore:
    """Reads and compare-and-swaps the cluster metadata document in ``store``."""

    def __init__(self, store: ObjectStore, key: str = METADATA_KEY) -> None:
        self._store = store
        self._key = key

    def load(self) -> VersionedMetadata | None:
        """The stored version, checked against every metadata invariant; None if absent."""
        found = self._store.get(self._key)
        if found is None:
            return None
        return VersionedMetadata(md_.decode_json(found.body), found.etag)

    def write(self, new: ClusterMetadata, etag: str | None) -> VersionedMetadata:
        """Write ``new`` over the version ``etag`` names (None: create the first version).

        Raises PreconditionFailedError when the stored version is no longer ``etag``.
        """
        md_.check(new)  # nothing that breaks an invariant is ever stored
        body = md_.encode_json(new)
        if etag is None:
            new_etag = self._store.put_if_absent(self._key, body)
        else:
            new_etag = self._store.put_if_match(self._key, body, etag)
        return VersionedMetadata(new, new_etag)

    def take_controllership(
        self, controller_epoch: int, cluster_id: str, holds: Callable[[], bool]
    ) -> VersionedMetadata:
        """Record a newly elected controller's epoch in the metadata (a new document for a new
        cluster): 1. re-read; 2. refuse a version naming this epoch or a newer one; 3. CAS the
        version with the epoch; a lost race (a late write of the previous controller) starts
        again, at most CAS_RETRIES_MAX times and while ``holds()`` (the lease is still ours).

        Raises NotControllerError when it could not (the message says why).
        """
        for _ in range(CAS_RETRIES_MAX):
            if not holds():
                raise NotControllerError(f"lost the lease of controller epoch {controller_epoch}")
            current = self.load()
            base = current.metadata if current else ClusterMetadata(cluster_id=cluster_id)
            if base.controller_epoch >= controller_epoch:
                raise NotControllerError(
                    f"metadata names controller epoch {base.controller_epoch} >= our lease "
                    f"epoch {controller_epoch}"
                )
            new = md_.take_controllership(base, controller_epoch)
            try:
                return self.write(new, current.etag if current else None)
            except PreconditionFailedError:
                continue
        raise NotControllerError(f"could not record controller epoch {controller_epoch}")
