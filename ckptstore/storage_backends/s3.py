"""Amazon S3 and S3-compatible storage (``s3://bucket/prefix``) on boto3.

Uploads use boto3's transfer manager (parallel multipart upload, with the SDK's default
request checksums so the server verifies every body it stores); downloads stream each
``GetObject`` body (whole, or parallel byte ranges for big objects) straight into place in the
local file, which measured 1.2x the throughput of boto3's ``download_file`` at 0.6x its client
CPU (benchmarks/storage_throughput.py). ``write_if_absent`` is ``PutObject`` with
``IfNoneMatch="*"``. The endpoint comes from ``endpoint_url`` or the ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL`` environment variables; credentials from ``access_key``/``secret_key`` or
boto3's usual chain.

Example::

    from ckptstore.storage_backends import open_storage
    storage = open_storage("s3://my-bucket/ckpts", endpoint_url="http://127.0.0.1:9000",
                           concurrency=32, part_size=64 * 2**20)
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import botocore.exceptions
import botocore.loaders
import botocore.session
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config

from ckptstore import errors
from ckptstore.storage_backends.object_store import (
    ObjectStorage,
    default_translate,
    pwrite_all,
)
from ckptstore.storage_backends.redact import install as _install_log_redaction
from ckptstore.storage_backends.urls import split_bucket_url

_install_log_redaction()  # SDK debug logs carry key ids and SAS signatures

_NOT_FOUND = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
_AUTH = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AuthorizationHeaderMalformed",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
}
_PERMISSION = {"AccessDenied", "403", "AllAccessDisabled", "AccountProblem"}
_TRANSIENT = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
    "502",
    "504",
    "429",
    "ConditionalRequestConflict",
}
_GET_CHUNK = 2**20  # bytes per read of a GetObject body
_CODE_IN_TEXT = re.compile(r"An error occurred \(([^)]+)\)")


def _error_code(exc: BaseException) -> tuple[str, int]:
    """(S3 error code, HTTP status) of a botocore/boto3 exception, ("", 0) if none."""
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
        return str(err.get("Code", "")), int(status)
    cause = exc.__cause__ or exc.__context__
    if (
        cause is not None
        and cause is not exc
        and isinstance(cause, botocore.exceptions.ClientError)
    ):
        return _error_code(cause)
    match = _CODE_IN_TEXT.search(str(exc))
    return (match.group(1), 0) if match else ("", 0)


#: The JSON loader every S3Storage's botocore session shares (see :func:`_new_session`).
_loader: botocore.loaders.Loader | None = None


def _new_session() -> botocore.session.Session:
    """A fresh botocore session (credentials, region and config resolved anew, as before) whose
    data loader is shared with every other S3Storage of this process."""
    global _loader
    session = botocore.session.get_session()
    # A new session parses the S3 service model, endpoints and rule set JSON again for its first
    # client (~0.1 s of CPU, most of opening a storage); the loader caches what it parsed, so a
    # shared one parses them once per process. The first session's loader keeps its search
    # path (AWS_DATA_PATH). Not boto3's Session: it would append its data path to the shared
    # loader's search path on every session (and its resource data is not used here).
    if _loader is None:
        _loader = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _loader)
    return session


class S3Storage(ObjectStorage):
    """Storage in an S3 bucket (AWS or any S3-compatible server).

    Args:
        url: ``s3://bucket`` or ``s3://bucket/prefix``.
        access_key, secret_key: static credentials (else boto3's default chain).
        endpoint_url: S3-compatible endpoint (else ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``).
        region: bucket region (else ``AWS_DEFAULT_REGION`` / boto3 config).
        **options: the common :class:`ObjectStorage` options (concurrency, part_size,
            download_part_size, multipart_threshold, max_attempts, timeout); for S3
            part_size defaults to 64 MiB, download_part_size and multipart_threshold to
            128 MiB. Upload parts are at least 5 MiB (S3's minimum part size; a smaller
            part_size is raised to it for uploads).
    """

    remote = True
    scheme = "s3"
    # Measured on moto (1 GiB tree, benchmarks/storage_throughput.py, medians of 5 rounds):
    # 64 MiB upload parts were the fastest (1.12x 128 MiB parts); moto reads the whole object
    # for every ranged GET, so few big download ranges win (128 MiB ranges: 1.2x the download
    # speed of 64 MiB). s3transfer streams parts from the file and ranges are streamed into
    # it, so big parts cost no memory. On AWS itself smaller parts with more concurrency can
    # be faster: set part_size / download_part_size / concurrency.
    default_part_size = 64 * 2**20
    default_download_part_size = 128 * 2**20
    default_multipart_threshold = 128 * 2**20

    def __init__(
        self,
        url: str,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        **options: Any,
    ) -> None:
        self.bucket, prefix = split_bucket_url(url, "s3")
        super().__init__(f"s3://{self.bucket}/{prefix}".rstrip("/"), prefix, **options)
        if (access_key is None) != (secret_key is None):
            raise errors.InvalidStorageConfig(
                f"Storage {self.url}: give both access_key and secret_key, or neither to use "
                "the default AWS credential chain."
            )
        self.endpoint_url = (
            endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or None
        )
        pool = min(256, max(10, self.concurrency * 4))
        config = Config(
            connect_timeout=self.retry.timeout,
            read_timeout=self.retry.timeout,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=pool,
            s3={"addressing_style": "path"} if self.endpoint_url else None,
            # Uploads carry the SDK's default CRC checksum (S3 rejects a body that arrives
            # damaged; on moto this was also ~10% faster for multipart uploads than sending
            # none). Downloads skip the SDK's response check: ranged GETs cannot use it and
            # checkpoint downloads verify each file's CRC32C against the manifest anyway.
            # An S3-compatible server that rejects checksums: AWS_REQUEST_CHECKSUM_CALCULATION=
            # when_required (boto3's own switch) turns them off.
            request_checksum_calculation=os.environ.get(
                "AWS_REQUEST_CHECKSUM_CALCULATION", "when_supported"
            ).lower(),
            response_checksum_validation="when_required",
        )
        self._client = _new_session().create_client(
            "s3",
            region_name=region,
            endpoint_url=self.endpoint_url,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            config=config,
        )
        # Uploads only (downloads stream through _get_into).
        self._transfer = TransferConfig(
            multipart_threshold=self.multipart_threshold,
            multipart_chunksize=self.part_size,
            # Every file's parts share this one manager (``concurrency`` requests at once);
            # 2 x concurrency was measured slower on moto (uploads 0.55x).
            max_concurrency=self.concurrency,
            use_threads=True,
        )
        # One transfer manager per storage: its thread pool bounds parts *and* files together,
        # instead of a new pool per file.
        self._manager = create_transfer_manager(self._client, self._transfer)

    # ---- errors -------------------------------------------------------------------------------
    def _is_transient(self, exc: BaseException) -> bool:
        # boto3/s3transfer wrap the last streaming/timeout error of their own retries in
        # RetriesExceededError; classify what it wraps (a stalled download is transient).
        last = getattr(exc, "last_exception", None)
        if isinstance(last, BaseException) and last is not exc:
            return self._is_transient(last)
        if isinstance(
            exc,
            (
                botocore.exceptions.EndpointConnectionError,
                botocore.exceptions.ConnectionClosedError,
                botocore.exceptions.ConnectTimeoutError,
                botocore.exceptions.ReadTimeoutError,
                botocore.exceptions.ResponseStreamingError,
                botocore.exceptions.IncompleteReadError,
                ConnectionError,
                TimeoutError,
            ),
        ):
            return True
        code, status = _error_code(exc)
        return code in _TRANSIENT or status >= 500 or status == 429

    def _translate(self, exc: BaseException, name: str, exhausted: bool) -> errors.StorageError:
        url = self.object_url(name)
        if exhausted:
            return default_translate(exc, url, True, self.retry.max_attempts)
        if isinstance(exc, botocore.exceptions.NoCredentialsError):
            return errors.StorageAuthError(
                f"No AWS credentials found for {url}; set AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY, a profile, or access_key/secret_key in the config."
            )
        code, status = _error_code(exc)
        if code == "NoSuchBucket":
            return errors.StorageNotFound(
                f"Bucket s3://{self.bucket} does not exist ({url}); create it or fix the "
                "bucket name / endpoint_url."
            )
        if code in _NOT_FOUND or status == 404:
            return errors.StorageNotFound(f"{url} does not exist; check the key and prefix.")
        if code in _AUTH:
            return errors.StorageAuthError(
                f"S3 rejected the credentials for {url} ({code}); check the access key, secret "
                "key, session token and clock."
            )
        if code in _PERMISSION or status == 403:
            return errors.StoragePermissionError(
                f"Access denied to {url} ({code or status}); grant s3:GetObject/PutObject/"
                "ListBucket/DeleteObject on the bucket and prefix."
            )
        if isinstance(exc, botocore.exceptions.BotoCoreError) and not code:
            return errors.StorageUnavailable(
                f"S3 request to {url} failed ({type(exc).__name__}); check endpoint_url and "
                "the network."
            )
        return errors.StorageError(
            f"S3 request to {url} failed ({code or type(exc).__name__}); see the cause above."
        )

    # ---- primitives ---------------------------------------------------------------------------
    def _list_objects(self, prefix: str) -> dict[str, int]:
        out: dict[str, int] = {}
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", ()):
                out[item["Key"]] = int(item["Size"])
        return out

    def _upload_file(self, name: str, path: str, size: int) -> None:
        self._manager.upload(path, self.bucket, name).result()

    _streams_pieces = True

    def _get_into(
        self,
        name: str,
        fd: int,
        start: int,
        length: int | None,
        on_piece: Callable[[bytes], None] | None = None,
    ) -> int:
        """GET ``name`` (all of it, or ``length`` bytes from ``start``) into ``fd`` at offset
        ``start``, 1 MiB at a time as the body arrives. boto3's ``download_file`` hands every
        256 KiB to one writer thread per transfer manager; writing from the request thread
        took 0.6x the client CPU per GB and 1.2x the throughput on moto."""
        extra = {} if length is None else {"Range": f"bytes={start}-{start + length - 1}"}
        response = self._client.get_object(Bucket=self.bucket, Key=name, **extra)
        body = response["Body"]
        if length is not None and response.get("ContentLength") != length:
            body.close()
            raise errors.StorageError(
                f"{self.object_url(name)}: the server ignored the byte range request; set "
                "multipart_threshold above the object size to download it whole."
            )
        offset = start
        try:
            for chunk in body.iter_chunks(_GET_CHUNK):
                if on_piece is not None:
                    on_piece(chunk)
                offset += pwrite_all(fd, chunk, offset)
        finally:
            body.close()
        expected = length if length is not None else int(response.get("ContentLength", 0))
        if offset - start != expected:
            raise ConnectionError(
                f"short read at offset {start}: got {offset - start} of {expected} bytes"
            )
        return expected

    def _read(self, name: str) -> bytes:
        return self._client.get_object(Bucket=self.bucket, Key=name)["Body"].read()

    def _write(self, name: str, data: bytes) -> None:
        self._client.put_object(Bucket=self.bucket, Key=name, Body=data)

    def _write_if_absent(self, name: str, data: bytes) -> bool:
        try:
            self._client.put_object(Bucket=self.bucket, Key=name, Body=data, IfNoneMatch="*")
        except botocore.exceptions.ClientError as exc:
            code, status = _error_code(exc)
            if code == "PreconditionFailed" or status == 412:
                return False
            raise
        return True

    def _replace_if_match(self, name: str, expected: bytes, data: bytes) -> bool:
        try:
            got = self._client.get_object(Bucket=self.bucket, Key=name)
            if got["Body"].read() != expected:
                return False
            self._client.put_object(Bucket=self.bucket, Key=name, Body=data, IfMatch=got["ETag"])
        except botocore.exceptions.ClientError as exc:
            code, status = _error_code(exc)
            if code == "PreconditionFailed" or status == 412 or code in _NOT_FOUND:
                return False
            raise
        return True

    def _delete_objects(self, names: list[str]) -> None:
        if not names:
            return
        response = self._client.delete_objects(
            Bucket=self.bucket,
            Delete={"Objects": [{"Key": n} for n in names], "Quiet": True},
        )
        failed = [e for e in response.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
        if failed:
            first = failed[0]
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": first.get("Code", ""), "Message": first.get("Message", "")}},
                "DeleteObjects",
            )

    def _is_object(self, name: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=name)
        except botocore.exceptions.ClientError as exc:
            code, status = _error_code(exc)
            if code in _NOT_FOUND or status == 404:
                return False
            raise
        return True

    def _modified(self, name: str) -> float:
        head = self._client.head_object(Bucket=self.bucket, Key=name)
        return head["LastModified"].timestamp()

    def _close_clients(self) -> None:
        self._manager.shutdown()
        self._client.close()
