"""The object-store contract, proved once and run against both implementations.

One conformance suite, parametrized over the local directory store and the S3 store (against
moto's real S3 server): conditional create/replace/delete answer 412 exactly when they must,
keys are validated alike, listing is by prefix, byte ranges read what they name and are bounded.
Then what is specific to each: the local store's ETags never repeat (no ABA) and its conditional
writes stay exclusive across racing processes; the S3 store aborts the incomplete multipart
uploads under a prefix (and no others), retries 409 a bounded number of
times, maps errors, times out, and its start-up probe refuses a backend that ignores conditions.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from raylog.storage.errors import (
    ObjectStoreError,
    ObjectStoreUnsupportedError,
    PreconditionFailedError,
)
from raylog.storage.localstore import LocalObjectStore
from raylog.storage.objectstore import RANGE_LENGTH_MAX, UNCHANGED, ObjectStore, StoredObject
from raylog.storage.s3store import S3ObjectStore

# -- conformance: both implementations -------------------------------------------------------


def test_get_missing_key_returns_none(store: ObjectStore) -> None:
    assert store.get("meta/nothing") is None


def test_put_if_absent_creates_once(store: ObjectStore) -> None:
    etag = store.put_if_absent("meta/lease", b"one")
    assert store.get("meta/lease") == StoredObject(b"one", etag)
    with pytest.raises(PreconditionFailedError):
        store.put_if_absent("meta/lease", b"two")
    body, etag_after = store.get("meta/lease")  # unpacks as (body, etag)
    assert (body, etag_after) == (b"one", etag)


def test_put_if_match_needs_current_etag(store: ObjectStore) -> None:
    first = store.put_if_absent("k", b"v1")
    second = store.put_if_match("k", b"v2", first)
    assert second != first
    with pytest.raises(PreconditionFailedError):
        store.put_if_match("k", b"v3", first)  # stale
    assert store.get("k") == StoredObject(b"v2", second)
    with pytest.raises(PreconditionFailedError):
        store.put_if_match("missing", b"v", second)  # missing key counts as a lost match
    assert store.get("missing") is None


def test_delete_if_match(store: ObjectStore) -> None:
    first = store.put_if_absent("k", b"v1")
    second = store.put_if_match("k", b"v2", first)
    with pytest.raises(PreconditionFailedError):
        store.delete_if_match("k", first)
    assert store.get("k") is not None
    store.delete_if_match("k", second)
    assert store.get("k") is None
    with pytest.raises(PreconditionFailedError):
        store.delete_if_match("k", second)


def test_plain_put_and_delete(store: ObjectStore) -> None:
    etag = store.put("k", b"")
    assert store.get("k") == StoredObject(b"", etag)
    overwritten = store.put("k", b"x")
    assert store.get("k") == StoredObject(b"x", overwritten)
    store.delete("k")
    store.delete("k")  # deleting a missing key is not an error
    assert store.get("k") is None


def test_list_by_prefix(store: ObjectStore) -> None:
    for key in ["topics/b", "topics/a", "topics/a/partitions/0", "brokers/1", "topicsx"]:
        store.put(key, key.encode())
    assert store.list("topics/") == ["topics/a", "topics/a/partitions/0", "topics/b"]
    assert store.list("topics") == ["topics/a", "topics/a/partitions/0", "topics/b", "topicsx"]
    assert store.list("nothing/") == []
    assert set(store.list()) >= {"brokers/1", "topicsx"}
    assert store.get("topics/a") == StoredObject(b"topics/a", store.get("topics/a").etag)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "key", ["", "/etc/passwd", "../escape", "a/../../b", "a//b", "a/./b", "a/", "a\\b", "a\x00"]
)
def test_invalid_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError):
        store.put(key, b"x")
    with pytest.raises(ValueError):
        store.get(key)


def test_rewrite_with_new_content_changes_etag(store: ObjectStore) -> None:
    etags = [store.put("k", b"a"), store.put("k", b"b"), store.put("k", b"a")]
    assert etags[0] != etags[1] and etags[1] != etags[2]


def test_get_range_reads_a_byte_range(store: ObjectStore) -> None:
    body = bytes(range(256)) * 4
    store.put("seg/log", body)
    assert store.get_range("seg/log", 0, 10) == body[:10]
    assert store.get_range("seg/log", 300, 200) == body[300:500]
    assert store.get_range("seg/log", 1000, 100) == body[1000:]  # the object ends first
    assert store.get_range("seg/log", len(body), 5) == b""
    assert store.get_range("seg/log", len(body) + 7, 5) == b""
    assert store.get_range("seg/missing", 0, 5) is None
    store.put("seg/empty", b"")
    assert store.get_range("seg/empty", 0, 5) == b""


@pytest.mark.parametrize("start, length", [(-1, 5), (0, 0), (0, -3), (0, RANGE_LENGTH_MAX + 1)])
def test_get_range_is_bounded(store: ObjectStore, start: int, length: int) -> None:
    store.put("k", b"value")
    with pytest.raises(ValueError):
        store.get_range("k", start, length)


CHUNK = bytes(range(256)) * (12 << 10)  # 3 MiB: five make two S3 parts of 8 MiB and a rest


def test_put_stream_writes_the_chunks_as_one_object(store: ObjectStore) -> None:
    chunks = [bytes([i]) + CHUNK[1:] for i in range(5)]
    etag = store.put_stream("seg/log", iter(chunks))
    assert store.get("seg/log") == StoredObject(b"".join(chunks), etag)
    assert store.get_range("seg/log", len(CHUNK) * 3, 4) == bytes([3]) + CHUNK[1:4]
    small = store.put_stream("seg/index", iter([b"ab", b"", b"cd"]))  # under one part
    assert store.get("seg/index") == StoredObject(b"abcd", small)
    assert store.put_stream("seg/none", iter([])) and store.get("seg/none").body == b""


def _failing_chunks(count: int) -> Iterator[bytes]:
    for _ in range(count):
        yield CHUNK
    raise OSError("the disk went away mid-copy")


@pytest.mark.parametrize("count", [1, 5])  # within the first part, and parts uploaded
def test_put_stream_that_fails_writes_nothing(
    store: ObjectStore, count: int, request: pytest.FixtureRequest
) -> None:
    store.put("seg/log", b"before")
    with pytest.raises(OSError, match="mid-copy"):
        store.put_stream("seg/log", _failing_chunks(count))
    assert store.get("seg/log") is not None and store.get("seg/log").body == b"before"
    if isinstance(store, S3ObjectStore):  # the multipart upload was aborted, not left behind
        client = boto3.client("s3", **request.getfixturevalue("s3_client_kwargs"))
        assert client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []
    else:
        assert isinstance(store, LocalObjectStore)
        assert list((store.root / "tmp").iterdir()) == []


def test_abort_uploads_ends_the_incomplete_uploads_under_a_prefix(
    store: ObjectStore, request: pytest.FixtureRequest
) -> None:
    if isinstance(store, LocalObjectStore):  # a dead writer's temp file goes when it opens
        assert store.abort_uploads("seg/") == 0
        return
    assert isinstance(store, S3ObjectStore)
    client = boto3.client("s3", **request.getfixturevalue("s3_client_kwargs"))

    def start(key: str) -> str:  # what a crash in the middle of put_stream leaves
        return str(client.create_multipart_upload(Bucket=store.bucket, Key=key)["UploadId"])

    start("cluster-1/seg/a/log")
    start("cluster-1/seg/b/log")
    kept = {("cluster-1/other/log", start("cluster-1/other/log")), ("seg/x", start("seg/x"))}
    assert store.abort_uploads("seg/") == 2
    left = client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    assert {(u["Key"], u["UploadId"]) for u in left} == kept  # other prefixes, other stores
    assert store.abort_uploads("seg/") == 0


def test_get_unless_answers_unchanged_while_the_etag_holds(store: ObjectStore) -> None:
    etag = store.put("meta", b"v1")
    assert store.get_unless("meta", etag) is UNCHANGED
    newer = store.put("meta", b"v2")
    assert store.get_unless("meta", etag) == StoredObject(b"v2", newer)
    assert store.get_unless("meta", newer) is UNCHANGED
    assert store.get_unless("missing", etag) is None


def test_probe_accepts_both(store: ObjectStore) -> None:
    store.probe()
    assert store.list("_raylog/") == []  # the probe leaves nothing behind


# -- local store --------------------------------------------------------------------------


def test_local_etag_changes_even_for_identical_content(tmp_path: Path) -> None:
    """No ABA: an ETag is never handed out twice, even after delete and re-create."""
    store = LocalObjectStore(tmp_path)
    first = store.put_if_absent("k", b"same")
    second = store.put("k", b"same")
    store.delete("k")
    third = store.put_if_absent("k", b"same")
    assert len({first, second, third}) == 3
    with pytest.raises(PreconditionFailedError):
        store.put_if_match("k", b"same", first)
    # A second instance on the same root (another process, or a restart) continues the counter.
    assert LocalObjectStore(tmp_path).put("k", b"same") not in {first, second, third}


def test_local_keys_stay_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalObjectStore(root)
    for key in ["a/b", "a/b/c", "%2F..%2Fx", "..x/y..", "~/z"]:
        store.put(key, b"v")
    assert sorted(store.list()) == sorted(["a/b", "a/b/c", "%2F..%2Fx", "..x/y..", "~/z"])
    outside = [p for p in tmp_path.rglob("*") if root not in p.parents and p != root]
    assert outside == []
    assert all(p.parent == root / "objects" for p in (root / "objects").iterdir())


def test_local_corrupt_file_is_a_storage_error(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    store.put("k", b"v")
    (tmp_path / "objects" / "k").write_bytes(b"garbage")
    with pytest.raises(ObjectStoreError):
        store.get("k")


def _race(
    root: str, key: str, etags: list[str] | None, rounds: int, barrier: Any, results: Any
) -> None:
    store = LocalObjectStore(root)
    for round_index in range(rounds):
        barrier.wait(timeout=30)
        round_key = f"{key}/{round_index}"
        try:
            if etags is None:
                store.put_if_absent(round_key, str(os.getpid()).encode())
            else:
                store.put_if_match(round_key, str(os.getpid()).encode(), etags[round_index])
            results.put((round_index, os.getpid(), True))
        except PreconditionFailedError:
            results.put((round_index, os.getpid(), False))


def _run_race(root: Path, etags: list[str] | None, processes: int, rounds: int) -> list[int]:
    """Race ``processes`` processes for ``rounds`` rounds; return each round's winner pid."""
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    workers = [
        ctx.Process(target=_race, args=(str(root), "race", etags, rounds, barrier, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=60) for _ in range(processes * rounds)]
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    winners = []
    for round_index in range(rounds):
        won = [pid for r, pid, ok in outcomes if r == round_index and ok]
        assert len(won) == 1, f"round {round_index}: winners {won}"
        winners.append(won[0])
    return winners


def test_local_put_if_absent_race_across_processes(tmp_path: Path) -> None:
    winners = _run_race(tmp_path, None, processes=4, rounds=5)
    store = LocalObjectStore(tmp_path)
    for round_index, pid in enumerate(winners):
        assert store.get(f"race/{round_index}").body == str(pid).encode()  # type: ignore[union-attr]


def test_local_put_if_match_race_across_processes(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    etags = [store.put_if_absent(f"race/{i}", b"start") for i in range(5)]
    winners = _run_race(tmp_path, etags, processes=4, rounds=5)
    for round_index, pid in enumerate(winners):
        assert store.get(f"race/{round_index}").body == str(pid).encode()  # type: ignore[union-attr]


def test_local_probe_refuses_a_store_that_ignores_conditions(tmp_path: Path) -> None:
    class IgnoresIfNoneMatch(LocalObjectStore):
        def put_if_absent(self, key: str, body: bytes) -> str:
            return self.put(key, body)

    with pytest.raises(ObjectStoreUnsupportedError, match="If-None-Match"):
        IgnoresIfNoneMatch(tmp_path).probe()


# -- S3 store -----------------------------------------------------------------------------


@pytest.fixture
def stubbed(s3_client_kwargs: dict[str, Any]) -> Iterator[tuple[Stubber, Any]]:
    """botocore's own Stubber: scripted S3 answers for the cases moto cannot produce (409)."""
    client = boto3.client("s3", **s3_client_kwargs)
    with Stubber(client) as stubber:
        yield stubber, client
    client.close()


def test_s3_retries_409_with_bounded_backoff(stubbed: tuple[Stubber, Any]) -> None:
    stubber, client = stubbed
    pauses: list[float] = []
    store = S3ObjectStore(
        "b", client=client, probe=False, conflict_retries_max=2, sleep=pauses.append
    )
    for _ in range(2):
        stubber.add_client_error("put_object", "ConditionalRequestConflict", http_status_code=409)
    stubber.add_response("put_object", {"ETag": '"abc"'})
    assert store.put_if_absent("k", b"v") == '"abc"'
    assert len(pauses) == 2 and all(0 <= p <= 0.1 for p in pauses)

    for _ in range(3):
        stubber.add_client_error("put_object", "ConditionalRequestConflict", http_status_code=409)
    with pytest.raises(ObjectStoreError, match="ConditionalRequestConflict"):
        store.put_if_absent("k", b"v")
    assert len(pauses) == 4  # two more pauses, then the third 409 is final


def test_s3_maps_412_and_404_to_precondition_failed(stubbed: tuple[Stubber, Any]) -> None:
    stubber, client = stubbed
    store = S3ObjectStore("b", client=client, probe=False)
    stubber.add_client_error("put_object", "PreconditionFailed", http_status_code=412)
    with pytest.raises(PreconditionFailedError):
        store.put_if_match("k", b"v", '"old"')
    stubber.add_client_error("put_object", "NoSuchKey", http_status_code=404)
    with pytest.raises(PreconditionFailedError):
        store.put_if_match("k", b"v", '"old"')
    stubber.add_client_error("delete_object", "InternalError", http_status_code=500)
    with pytest.raises(ObjectStoreError):
        store.delete_if_match("k", '"old"')


def test_s3_unreachable_endpoint_fails_fast(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = S3ObjectStore(
        "b",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        connect_timeout_s=0.5,
        read_timeout_s=0.5,
        read_attempts_max=1,
        probe=False,
    )
    with pytest.raises(ObjectStoreError):
        store.get("k")
    with pytest.raises(ObjectStoreError):
        store.put_if_absent("k", b"v")


def test_s3_probe_refuses_a_backend_that_ignores_if_match(
    s3_client_kwargs: dict[str, Any], create_bucket: Callable[..., str]
) -> None:
    class IgnoresIfMatch(S3ObjectStore):
        def put_if_match(self, key: str, body: bytes, etag: str) -> str:
            return self.put(key, body)

    with pytest.raises(ObjectStoreUnsupportedError, match="stale If-Match"):
        IgnoresIfMatch(create_bucket(), **s3_client_kwargs)
