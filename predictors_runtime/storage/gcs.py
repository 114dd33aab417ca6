"""Storage in Google Cloud Storage, or an emulator when `STORAGE_EMULATOR_HOST` is set."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, BinaryIO

from foundation.errors import AccessDenied, BadStorageUri, SluiceError, StorageError, StorageNotFound
from predictors_runtime.extras import needs_extra

# The `gcs` extra: `storage_for` imports this module for the first gs:// URI only, so without
# google-cloud-storage that URI fails with the extra to install and everything else works.
with needs_extra("gcs", "gs:// storage", package="google-cloud-storage"):
    import google.auth.exceptions
    from google.api_core import exceptions as api_exceptions
    from google.cloud import storage

from .base import GuardedReader, ObjectInfo, RemoteStorage, translating

# blob.open("rb") fetches this much per request (a multiple of 256 KiB); the default is 40 MiB.
READ_CHUNK = 8 * 1024 * 1024


def translate(e: Exception, uri: str) -> SluiceError | None:
    """The Sluice error for a google-cloud exception met on `uri`; None for anything else."""
    if isinstance(e, api_exceptions.NotFound):
        return StorageNotFound(f"{uri}: not found ({e.message})")
    if isinstance(e, (api_exceptions.Forbidden, api_exceptions.Unauthorized)):
        return AccessDenied(f"{uri}: access denied ({e.message})")
    if isinstance(e, google.auth.exceptions.DefaultCredentialsError):
        return AccessDenied(f"{uri}: no Google credentials found ({e})")
    if isinstance(e, google.auth.exceptions.RefreshError):
        return AccessDenied(f"{uri}: Google credentials were refused ({e})")
    if isinstance(e, api_exceptions.GoogleAPICallError):
        return StorageError(f"{uri}: GCS error {e.code}: {e.message}")
    # Transport failures surface as requests/urllib3/google.* exceptions of many kinds.
    module = type(e).__module__ or ""
    if module.split(".")[0] in ("google", "requests", "urllib3"):
        return StorageError(f"{uri}: {type(e).__name__}: {e}")
    return None


def _errors(uri: str) -> AbstractContextManager[None]:
    return translating(translate, uri)


def _version(blob: Any) -> str:
    return blob.md5_hash or blob.etag or str(blob.generation)


class GCSStorage(RemoteStorage):
    """`gs://bucket/key` objects through one lazily created client per process."""

    scheme = "gs"

    def _make_client(self) -> Any:
        with _errors("gs://"):
            if os.environ.get("STORAGE_EMULATOR_HOST"):
                from google.auth.credentials import AnonymousCredentials

                return storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "test",
                                      credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
            return storage.Client()

    def _blob(self, uri: str) -> Any:
        bucket, key = self._split(uri)
        if not key:
            raise StorageNotFound(f"{uri}: not found (a bucket is not an object)")
        return self.client.bucket(bucket).blob(key)

    @staticmethod
    def _info(bucket: str, blob: Any) -> ObjectInfo:
        return ObjectInfo(uri=f"gs://{bucket}/{blob.name}", size=int(blob.size or 0), version=_version(blob))

    def _list(self, uri: str, bucket: str, key: str) -> Iterator[ObjectInfo]:
        with _errors(uri):
            if key and not key.endswith("/"):
                exact = self.client.bucket(bucket).get_blob(key)
                if exact is not None:
                    yield self._info(bucket, exact)
            prefix = key.rstrip("/") + "/" if key else ""
            # The iterator fetches one page at a time; a missing bucket raises NotFound here.
            for blob in self.client.list_blobs(bucket, prefix=prefix or None):
                yield self._info(bucket, blob)

    def stat(self, uri: str) -> ObjectInfo:
        bucket, key = self._split(uri)
        if not key:
            raise StorageNotFound(f"{uri}: not found (a bucket is not an object)")
        with _errors(uri):
            blob = self.client.bucket(bucket).get_blob(key)
        if blob is None:
            raise StorageNotFound(f"{uri}: not found")
        return self._info(bucket, blob)

    def exists(self, uri: str) -> bool:
        bucket, key = self._split(uri)
        if not key:
            return False
        with _errors(uri):
            return bool(self.client.bucket(bucket).blob(key).exists())

    def open_read(self, uri: str) -> BinaryIO:
        blob = self._blob(uri)
        with _errors(uri):
            blob.reload()  # raises NotFound now, and pins the generation every chunk is read from
            reader = blob.open("rb", chunk_size=READ_CHUNK)
        return GuardedReader.buffered(reader.read, reader.close, lambda e: translate(e, uri))

    def read_range(self, uri: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise ValueError(f"bad byte range [{start}, {end})")
        blob = self._blob(uri)
        if start == end:
            self.stat(uri)
            return b""
        try:
            with _errors(uri):
                data: bytes = blob.download_as_bytes(start=start, end=end - 1, checksum=None)
            return data
        except StorageError as e:
            if isinstance(e.__cause__, api_exceptions.RequestRangeNotSatisfiable):
                return b""  # start lies past the end
            raise

    def read_bytes(self, uri: str) -> bytes:
        blob = self._blob(uri)
        with _errors(uri):
            data: bytes = blob.download_as_bytes()
        return data

    def write_bytes(self, uri: str, data: bytes) -> None:
        bucket, key = self._split(uri)
        if not key:
            raise BadStorageUri(f"{uri!r} names no object key")
        with _errors(uri):
            self.client.bucket(bucket).blob(key).upload_from_string(data, content_type="application/octet-stream")

    def delete(self, uri: str) -> None:
        bucket, key = self._split(uri)
        if not key:
            raise BadStorageUri(f"{uri!r} names no object key")
        try:
            with _errors(uri):
                self.client.bucket(bucket).blob(key).delete()
        except StorageNotFound:
            return
