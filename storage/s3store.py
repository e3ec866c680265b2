"""The object store on S3, or any S3 API with conditional writes (MinIO, R2, moto's server).

Owns the mapping from raylog's object-store contract (:mod:`raylog.storage.objectstore`) to
boto3 calls and back:

- every call has a connect and a read timeout (botocore ``Config``);
- reads, lists and unconditional writes use botocore's bounded "standard" retries;
- conditional writes and deletes are sent ONCE by botocore (``total_max_attempts=1``): a retry
  after a timeout or a 5xx whose first attempt was in fact applied would come back 412 and
  report a lost compare-and-swap that was really won. So such failures surface as
  ``ObjectStoreError`` (outcome unknown) and the caller re-reads. The one answer retried here
  is 409 ConditionalRequestConflict (S3 refused a write racing another on the same key, and
  applied nothing), a bounded number of times with exponential backoff and jitter;
- 412 PreconditionFailed, and 404 on an ``If-Match`` write, raise ``PreconditionFailedError``;
- ``put_stream`` is a multipart upload (parts of ``PART_BYTES``), aborted on any failure; an
  upload a crash leaves incomplete is aborted by :meth:`S3ObjectStore.abort_uploads` (tiered
  storage calls it for a partition's prefix when a new leader starts copying) or expires by
  the bucket's lifecycle rule (``AbortIncompleteMultipartUpload``, see docs/CONFIG.md).

ETags are S3's, quotes included, passed back verbatim in ``If-Match``: the MD5 of the content,
so identical content written twice keeps its ETag (see the objectstore docstring).

Start-up probe: unless ``probe=False``, the constructor runs :meth:`ObjectStore.probe`, which
refuses (``ObjectStoreUnsupportedError``) a backend that accepts a write whose condition should
have failed. DeleteObject with ``If-Match`` is checked too: AWS S3, MinIO and moto (>= 5.1) honour
it; raylog's lease does not need it (release writes a marker instead), but the probe insists so
that metadata code may rely on it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from raylog.storage.errors import ObjectStoreError, PreconditionFailedError
from raylog.storage.objectstore import (
    LIST_KEYS_MAX,
    UNCHANGED,
    ObjectStore,
    StoredObject,
    validate_key,
    validate_prefix,
    validate_range,
)

# put_stream's part size: S3 needs 5 MiB parts but the last, and at most 10,000 of them, so
# parts of 8 MiB carry objects up to 78 GiB, and a copy holds one part at a time.
PART_BYTES = 8 << 20

logger = logging.getLogger(__name__)


class S3ObjectStore(ObjectStore):
    """Objects under ``s3://<bucket>/<prefix>``; keys passed in are relative to ``prefix``."""

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 5.0,
        read_attempts_max: int = 3,
        conflict_retries_max: int = 5,
        conflict_backoff_s: float = 0.05,
        probe: bool = True,
        sleep: Callable[[float], None] = time.sleep,
        client: Any = None,
    ) -> None:
        """Open the store; with ``probe`` (the default) run the conditional-write probe now.

        ``client``: a ready boto3 S3 client to use for both kinds of call (tests pass one wrapped
        in botocore's ``Stubber``); otherwise two clients are built from the other arguments.
        """
        if read_attempts_max < 1 or conflict_retries_max < 0:
            raise ValueError("read_attempts_max must be >= 1 and conflict_retries_max >= 0")
        self._bucket = bucket
        self._prefix = f"{validate_prefix(prefix).rstrip('/')}/" if prefix else ""
        self._conflict_retries_max = conflict_retries_max
        self._conflict_backoff_s = conflict_backoff_s
        self._sleep = sleep
        if client is not None:
            self._reads = self._writes = client
        else:

            def make(attempts: int) -> Any:
                config = Config(
                    connect_timeout=connect_timeout_s,
                    read_timeout=read_timeout_s,
                    retries={"mode": "standard", "total_max_attempts": attempts},
                )
                return _new_client(
                    endpoint_url=endpoint_url,
                    region_name=region_name,
                    aws_access_key_id=aws_access_key_id,
                    aws_secret_access_key=aws_secret_access_key,
                    config=config,
                )

            self._reads = make(read_attempts_max)
            self._writes = make(1)  # conditional writes: never retried blindly, see docstring
        if probe:
            self.probe()

    @property
    def bucket(self) -> str:
        return self._bucket

    def _full(self, key: str) -> str:
        return self._prefix + validate_key(key)

    # -- reads ------------------------------------------------------------------------------

    def get(self, key: str) -> StoredObject | None:
        return self._get(key, "GetObject")

    def get_unless(self, key: str, etag: str) -> StoredObject | None:
        return self._get(key, "GetObject If-None-Match", IfNoneMatch=etag)

    def _get(self, key: str, what: str, **conditions: str) -> StoredObject | None:
        full = self._full(key)
        try:
            response = self._reads.get_object(Bucket=self._bucket, Key=full, **conditions)
            body = response["Body"].read()
        except ClientError as e:
            if conditions and (_status(e) == 304 or _code(e) in ("304", "NotModified")):
                return UNCHANGED
            if _status(e) == 404 or _code(e) in ("NoSuchKey", "404"):
                return None
            raise _failure(what, full, e) from e
        except BotoCoreError as e:
            raise _failure(what, full, e) from e
        return StoredObject(body=body, etag=response["ETag"])

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        full = self._full(key)
        validate_range(start, length)
        try:
            response = self._reads.get_object(
                Bucket=self._bucket, Key=full, Range=f"bytes={start}-{start + length - 1}"
            )
            body = response["Body"].read(length)  # bounded even if a server ignores Range
        except ClientError as e:
            if _status(e) == 404 or _code(e) in ("NoSuchKey", "404"):
                return None
            if _status(e) == 416 or _code(e) == "InvalidRange":
                return b""  # the range starts at or past the object's end
            raise _failure("GetObject Range", full, e) from e
        except BotoCoreError as e:
            raise _failure("GetObject Range", full, e) from e
        return bytes(body)

    def list(self, prefix: str = "") -> list[str]:
        full = self._prefix + validate_prefix(prefix)
        keys: list[str] = []
        try:
            pages = self._reads.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket, Prefix=full
            )
            for page in pages:  # bounded: stops at LIST_KEYS_MAX keys
                keys.extend(obj["Key"][len(self._prefix) :] for obj in page.get("Contents", []))
                if len(keys) > LIST_KEYS_MAX:
                    raise ObjectStoreError(f"more than {LIST_KEYS_MAX} keys under {full!r}")
        except (ClientError, BotoCoreError) as e:
            raise _failure("ListObjectsV2", full, e) from e
        return sorted(keys)

    # -- writes -----------------------------------------------------------------------------

    def put(self, key: str, body: bytes) -> str:
        full = self._full(key)
        try:
            response = self._reads.put_object(Bucket=self._bucket, Key=full, Body=body)
        except (ClientError, BotoCoreError) as e:
            raise _failure("PutObject", full, e) from e
        return str(response["ETag"])

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> str:
        """A multipart upload of parts of at least ``PART_BYTES`` (the last may be smaller),
        each the chunks that made it up (one chunk as it is); one PutObject when everything
        fits in one part. Any failure aborts the upload."""
        full = self._full(key)
        pieces = iter(chunks)
        part = _next_part(pieces)
        if part is None or len(part) < PART_BYTES:
            return self.put(key, part or b"")  # one part: no multipart upload needed
        try:
            upload = self._reads.create_multipart_upload(Bucket=self._bucket, Key=full)
        except (ClientError, BotoCoreError) as e:
            raise _failure("CreateMultipartUpload", full, e) from e
        upload_id, done = upload["UploadId"], False
        try:
            uploaded: list[dict[str, Any]] = []
            while part is not None:  # bounded by what the caller streams
                uploaded.append(self._upload_part(full, upload_id, len(uploaded) + 1, part))
                part = None  # let it go before the next one is read
                part = _next_part(pieces)
            try:
                response = self._reads.complete_multipart_upload(
                    Bucket=self._bucket,
                    Key=full,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": uploaded},
                )
            except (ClientError, BotoCoreError) as e:
                raise _failure("CompleteMultipartUpload", full, e) from e
            done = True
            return str(response["ETag"])
        finally:
            if not done:
                self._abort_upload(full, upload_id)

    def abort_uploads(self, prefix: str) -> int:
        """ListMultipartUploads under the prefix, then AbortMultipartUpload of each (at most
        ``LIST_KEYS_MAX`` per call; the next call finds the rest)."""
        full = self._prefix + validate_prefix(prefix)
        try:
            pages = self._reads.get_paginator("list_multipart_uploads").paginate(
                Bucket=self._bucket, Prefix=full
            )
            uploads: list[tuple[str, str]] = []
            for page in pages:  # bounded: stops at LIST_KEYS_MAX uploads
                uploads += [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])]
                if len(uploads) >= LIST_KEYS_MAX:
                    break
        except (ClientError, BotoCoreError) as e:
            raise _failure("ListMultipartUploads", full, e) from e
        del uploads[LIST_KEYS_MAX:]
        for key, upload_id in uploads:
            logger.info("S3: aborting the incomplete upload %s of %r", upload_id, key)
            self._abort_upload(key, upload_id)
        return len(uploads)

    def _upload_part(self, full: str, upload_id: str, number: int, body: bytes) -> dict[str, Any]:
        try:
            response = self._reads.upload_part(
                Bucket=self._bucket,
                Key=full,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
            )
        except (ClientError, BotoCoreError) as e:
            raise _failure(f"UploadPart {number}", full, e) from e
        return {"PartNumber": number, "ETag": response["ETag"]}

    def _abort_upload(self, full: str, upload_id: str) -> None:
        """Best effort: an upload left behind (this fails too, or the process dies) costs
        storage until the bucket's lifecycle rule aborts incomplete uploads."""
        try:
            self._reads.abort_multipart_upload(Bucket=self._bucket, Key=full, UploadId=upload_id)
        except (ClientError, BotoCoreError) as e:
            logger.warning("S3 AbortMultipartUpload on %r failed: %s", full, e)

    def put_if_absent(self, key: str, body: bytes) -> str:
        full = self._full(key)
        response = self._conditional(
            "PutObject If-None-Match: *",
            full,
            lambda: self._writes.put_object(
                Bucket=self._bucket, Key=full, Body=body, IfNoneMatch="*"
            ),
        )
        return str(response["ETag"])

    def put_if_match(self, key: str, body: bytes, etag: str) -> str:
        full = self._full(key)
        response = self._conditional(
            f"PutObject If-Match: {etag}",
            full,
            lambda: self._writes.put_object(Bucket=self._bucket, Key=full, Body=body, IfMatch=etag),
        )
        return str(response["ETag"])

    def delete(self, key: str) -> None:
        full = self._full(key)
        try:
            self._reads.delete_object(Bucket=self._bucket, Key=full)
        except (ClientError, BotoCoreError) as e:
            raise _failure("DeleteObject", full, e) from e

    def delete_if_match(self, key: str, etag: str) -> None:
        full = self._full(key)
        self._conditional(
            f"DeleteObject If-Match: {etag}",
            full,
            lambda: self._writes.delete_object(Bucket=self._bucket, Key=full, IfMatch=etag),
        )

    def close(self) -> None:
        for client in {id(self._reads): self._reads, id(self._writes): self._writes}.values():
            client.close()

    def _conditional(self, what: str, full: str, call: Callable[[], Any]) -> Any:
        """Run a conditional request; retry only 409 ConditionalRequestConflict, boundedly."""
        pause_s = self._conflict_backoff_s
        for attempt in range(self._conflict_retries_max + 1):
            try:
                return call()
            except ClientError as e:
                status, code = _status(e), _code(e)
                if status == 412 or code == "PreconditionFailed":
                    raise PreconditionFailedError(f"{what} on {full!r} failed: {code}") from e
                if status == 404 or code in ("NoSuchKey", "404"):
                    # If-Match on a missing key: AWS answers 404; same meaning as a lost match.
                    raise PreconditionFailedError(f"{what} on {full!r}: no such key") from e
                if (status != 409 and code != "ConditionalRequestConflict") or (
                    attempt == self._conflict_retries_max
                ):
                    raise _failure(what, full, e) from e
            except BotoCoreError as e:
                raise _failure(what, full, e) from e
            # Full jitter, so racing writers do not collide again in lockstep.
            self._sleep(random.uniform(0, pause_s))
            pause_s *= 2
        raise AssertionError("unreachable: the loop returns or raises on its last attempt")


_session_lock = threading.Lock()
_session: boto3.session.Session | None = None


def _new_client(**kwargs: Any) -> Any:
    """An S3 client from one boto3 session per process (a new session reloads the service
    models, ~0.2 s); boto3 sessions are not thread-safe, hence the lock."""
    global _session
    with _session_lock:
        if _session is None:
            _session = boto3.session.Session()
        return _session.client("s3", **kwargs)


def _next_part(chunks: Iterator[bytes]) -> bytes | None:
    """The next chunks up to ``PART_BYTES`` or more, as one (None once there are none)."""
    pieces, size = [], 0
    for chunk in chunks:  # bounded: stops at PART_BYTES
        pieces.append(chunk)
        size += len(chunk)
        if size >= PART_BYTES:
            break
    if not pieces:
        return None
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _status(e: ClientError) -> int | None:
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _failure(what: str, key: str, e: Exception) -> ObjectStoreError:
    return ObjectStoreError(f"S3 {what} on {key!r} failed: {e}")
