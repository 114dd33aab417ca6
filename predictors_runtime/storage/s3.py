"""Storage in S3 or any S3-compatible server (`AWS_ENDPOINT_URL` points boto3 at it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, BinaryIO

from foundation.errors import AccessDenied, BadStorageUri, SluiceError, StorageError, StorageNotFound
from predictors_runtime.extras import needs_extra

# The `s3` extra: `storage_for` imports this module for the first s3:// URI only, so without
# boto3 that URI fails with the extra to install and everything else works.
with needs_extra("s3", "s3:// storage", package="boto3"):
    import boto3
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        ParamValidationError,
        PartialCredentialsError,
    )

from .base import GuardedReader, ObjectInfo, RemoteStorage, translating

_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}
_DENIED = {"AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
           "InvalidToken", "AllAccessDisabled", "AccountProblem"}
_BAD_URI = {"InvalidBucketName", "KeyTooLongError"}


def translate(e: Exception, uri: str) -> SluiceError | None:
    """The Sluice error for a boto3/botocore exception met on `uri`; None for anything else."""
    if isinstance(e, ClientError):
        error = e.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        detail = error.get("Message") or code
        if code in _NOT_FOUND or status == 404:
            return StorageNotFound(f"{uri}: not found ({detail})")
        if code in _DENIED or status == 403:
            return AccessDenied(f"{uri}: access denied ({detail})")
        if code in _BAD_URI:
            return BadStorageUri(f"{uri}: {detail}")
        return StorageError(f"{uri}: S3 error {code or status}: {detail}")
    if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
        return AccessDenied(f"{uri}: no usable AWS credentials ({e})")
    if isinstance(e, ParamValidationError):
        return BadStorageUri(f"{uri}: {e}")
    if isinstance(e, BotoCoreError):
        return StorageError(f"{uri}: {e}")
    return None


def _errors(uri: str) -> AbstractContextManager[None]:
    return translating(translate, uri)


def _version(etag: str) -> str:
    return etag.strip('"')


def _read_all(body: Any, uri: str) -> bytes:
    """The whole of a get_object body, closed afterwards."""
    with _errors(uri):
        try:
            data: bytes = body.read()
        finally:
            body.close()
    return data


class S3Storage(RemoteStorage):
    """`s3://bucket/key` objects through one lazily created boto3 client per process."""

    scheme = "s3"

    def _make_client(self) -> Any:
        # boto3 reads AWS_ENDPOINT_URL, credentials and region here, once.
        with _errors("s3://"):
            return boto3.client("s3")

    def _list(self, uri: str, bucket: str, key: str) -> Iterator[ObjectInfo]:
        with _errors(uri):
            if key and not key.endswith("/"):
                # The object exactly at `key` is the first (smallest) one with that prefix.
                first = self.client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents", [])
                if first and first[0]["Key"] == key:
                    yield self._info(bucket, first[0])
            prefix = key.rstrip("/") + "/" if key else ""
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for page in pages:
                for item in page.get("Contents", []):
                    yield self._info(bucket, item)

    @staticmethod
    def _info(bucket: str, item: dict[str, Any]) -> ObjectInfo:
        return ObjectInfo(uri=f"s3://{bucket}/{item['Key']}", size=int(item["Size"]), version=_version(item["ETag"]))

    def stat(self, uri: str) -> ObjectInfo:
        bucket, key = self._split(uri)
        if not key:
            raise StorageNotFound(f"{uri}: not found (a bucket is not an object)")
        with _errors(uri):
            head = self.client.head_object(Bucket=bucket, Key=key)
        return ObjectInfo(uri=f"s3://{bucket}/{key}", size=int(head["ContentLength"]), version=_version(head["ETag"]))

    def exists(self, uri: str) -> bool:
        try:
            self.stat(uri)
        except StorageNotFound:
            return False
        return True

    def _get(self, uri: str, **extra: Any) -> Any:
        bucket, key = self._split(uri)
        if not key:
            raise StorageNotFound(f"{uri}: not found (a bucket is not an object)")
        with _errors(uri):
            return self.client.get_object(Bucket=bucket, Key=key, **extra)["Body"]

    def open_read(self, uri: str) -> BinaryIO:
        body = self._get(uri)
        return GuardedReader.buffered(body.read, body.close, lambda e: translate(e, uri))

    def read_range(self, uri: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise ValueError(f"bad byte range [{start}, {end})")
        if start == end:
            self.stat(uri)  # still StorageNotFound for a missing object
            return b""
        try:
            body = self._get(uri, Range=f"bytes={start}-{end - 1}")
        except StorageError as e:
            cause = e.__cause__
            if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""  # start lies past the end, as reading a file past its end gives nothing
            raise
        return _read_all(body, uri)

    def read_bytes(self, uri: str) -> bytes:
        return _read_all(self._get(uri), uri)

    def write_bytes(self, uri: str, data: bytes) -> None:
        bucket, key = self._split(uri)
        if not key:
            raise BadStorageUri(f"{uri!r} names no object key")
        with _errors(uri):
            self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def delete(self, uri: str) -> None:
        bucket, key = self._split(uri)
        if not key:
            raise BadStorageUri(f"{uri!r} names no object key")
        with _errors(uri):
            self.client.delete_object(Bucket=bucket, Key=key)  # S3 answers a missing key with success
