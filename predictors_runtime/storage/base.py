"""The storage contract every backend keeps, URI helpers, and the registry that picks a backend by scheme.

Every method of a `Storage` takes full URIs of its scheme: a local path (or `file://` URI),
`s3://bucket/key` or `gs://bucket/key`. Backends raise only errors of Sluice's tree:
`StorageNotFound`, `AccessDenied`, `BadStorageUri` or `StorageError`.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import io
import os
import re
import shutil
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from foundation.errors import BadStorageUri, SluiceError, StorageError, StorageNotFound

# Suffix of the files `write_bytes` and `download_folder` write beside their target before the
# rename; `LocalStorage.list` skips them, so readers never list half-written files.
TEMP_SUFFIX = ".sluice-tmp"

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# A known scheme written without `//` ("s3:bucket/key") is a typo, not a local file name.
_NEAR_MISS_RE = re.compile(r"^(s3|gs|file):(?!//)", re.IGNORECASE)
_COPY_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: its full URI, its size in bytes, and a version that changes with its content."""

    uri: str
    size: int
    version: str


class Storage(ABC):
    """One backend; a process holds one instance per scheme (see `storage_for`)."""

    scheme: str = ""

    @abstractmethod
    def list(self, uri: str) -> Iterator[ObjectInfo]:
        """Every object at `uri` or under `uri` as a folder, sorted by URI, fetched page by page."""

    @abstractmethod
    def stat(self, uri: str) -> ObjectInfo:
        """The object at `uri`; `StorageNotFound` when there is none."""

    @abstractmethod
    def exists(self, uri: str) -> bool:
        """Whether an object (not a folder) is stored at `uri`."""

    @abstractmethod
    def open_read(self, uri: str) -> BinaryIO:
        """A streaming, buffered binary reader of the object (iterable by lines); `StorageNotFound` when absent."""

    @abstractmethod
    def read_range(self, uri: str, start: int, end: int) -> bytes:
        """Bytes `[start, end)` of the object; fewer (or none) past its end."""

    @abstractmethod
    def read_bytes(self, uri: str) -> bytes:
        """The whole object; `StorageNotFound` when absent."""

    @abstractmethod
    def write_bytes(self, uri: str, data: bytes) -> None:
        """Store `data` at `uri`, replacing any object there; readers see the old or the new bytes, never half."""

    @abstractmethod
    def delete(self, uri: str) -> None:
        """Remove the object at `uri`; nothing happens when there is none."""

    @abstractmethod
    def canonical(self, uri: str) -> str:
        """`uri` spelled as `list` spells object URIs (local: absolute path; s3/gs: `scheme://bucket/key`)."""

    def download_folder(self, uri: str, dest: Path) -> builtins.list[Path]:
        """Copy every object of `list(uri)` to `dest/<path relative to uri>`; returns the paths written.

        An object exactly at `uri` lands as `dest/<its name>`. Raises `StorageNotFound` when
        nothing is there.
        """
        dest = Path(dest)
        base = self.canonical(uri)
        folder = base.rstrip("/") + "/"
        written: builtins.list[Path] = []
        found = False
        for info in self.list(uri):
            found = True
            relative = base.rstrip("/").rsplit("/", 1)[-1] if info.uri == base else info.uri[len(folder):]
            if not relative or relative.endswith("/"):
                continue  # a zero-byte "folder marker" some S3/GCS tools create
            parts = [p for p in relative.split("/") if p]
            if any(p in (".", "..") for p in parts):
                raise StorageError(f"{info.uri}: refusing to download a name that leaves {dest}")
            target = dest.joinpath(*parts)
            self._download_one(info.uri, target)
            written.append(target)
        if not found:
            raise StorageNotFound(f"{uri}: no objects to download")
        return written

    def _download_one(self, uri: str, target: Path) -> None:
        """Stream one object to `target` through a temporary file beside it."""
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with self.open_read(uri) as source, open(tmp, "wb") as sink:
                shutil.copyfileobj(source, sink, _COPY_CHUNK)
            os.replace(tmp, target)
        except OSError as e:
            raise StorageError(f"{uri}: cannot write {target}: {e}") from e
        finally:
            tmp.unlink(missing_ok=True)


class GuardedReader(io.RawIOBase):
    """A raw stream over a backend's body whose read errors become Sluice errors.

    `reader(n)` returns up to `n` bytes (b"" at the end); `translate(exc)` returns the Sluice
    error for a backend exception, or None to let it through. Wrap in `io.BufferedReader` for
    lines, iteration and `peek` (see `buffered`).
    """

    def __init__(self, reader: Callable[[int], bytes], close: Callable[[], None],
                 translate: Callable[[Exception], Exception | None]) -> None:
        super().__init__()
        self._reader = reader
        self._close = close
        self._translate = translate

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        try:
            data = self._reader(len(view))
        except Exception as e:
            mapped = self._translate(e)
            if mapped is None:
                raise
            raise mapped from e
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            # Closing a half-read HTTP body may fail in any way; nothing to report to the reader.
            with contextlib.suppress(Exception):
                self._close()
        super().close()

    @classmethod
    def buffered(cls, reader: Callable[[int], bytes], close: Callable[[], None],
                 translate: Callable[[Exception], Exception | None],
                 buffer_size: int = 256 * 1024) -> BinaryIO:
        return io.BufferedReader(cls(reader, close, translate), buffer_size)


@contextmanager
def translating(translate: Callable[[Exception, str], Exception | None], uri: str) -> Iterator[None]:
    """Turn a backend's exceptions met on `uri` into Sluice errors; Sluice's own pass through, and
    anything `translate` does not know is re-raised as it is."""
    try:
        yield
    except SluiceError:
        raise
    except Exception as e:
        mapped = translate(e, uri)
        if mapped is None:
            raise
        raise mapped from e


class RemoteStorage(Storage):
    """A bucket store reached through one client per process, made on first use and again after
    a fork (HTTP clients do not survive one: Celery's prefork workers would share sockets)."""

    scheme = ""

    def __init__(self) -> None:
        self._client: Any = None
        self._pid = 0
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        client = self._client
        if client is None or self._pid != os.getpid():
            with self._lock:
                if self._client is None or self._pid != os.getpid():
                    self._client = self._make_client()
                    self._pid = os.getpid()
                client = self._client
        return client

    @abstractmethod
    def _make_client(self) -> Any:
        """The backend's client; the environment is read here, once per process."""

    def _split(self, uri: str) -> tuple[str, str]:
        scheme, bucket, key = split_uri(uri)
        if scheme != self.scheme:
            raise BadStorageUri(f"{uri!r} is not a {self.scheme}:// URI")
        return bucket, key

    def canonical(self, uri: str) -> str:
        bucket, key = self._split(uri)
        return f"{self.scheme}://{bucket}/{key}"

    def list(self, uri: str) -> Iterator[ObjectInfo]:
        bucket, key = self._split(uri)  # here, so a bad URI fails at the call, not at first iteration
        return self._list(uri, bucket, key)

    @abstractmethod
    def _list(self, uri: str, bucket: str, key: str) -> Iterator[ObjectInfo]:
        """The object at `key`, or those under the prefix `key`, as `list` promises."""


# The registry: scheme -> (module, class). Modules are imported on first use, so boto3 and
# google-cloud-storage load only in processes that touch s3:// or gs://.
_BACKENDS: dict[str, tuple[str, str]] = {
    "": ("predictors_runtime.storage.local", "LocalStorage"),
    "s3": ("predictors_runtime.storage.s3", "S3Storage"),
    "gs": ("predictors_runtime.storage.gcs", "GCSStorage"),
}
_INSTANCES: dict[str, Storage] = {}
_LOCK = threading.Lock()


def _scheme_of(uri: str) -> str:
    """The URI's scheme, lower-case; "" for a local path or `file://` URI."""
    if not isinstance(uri, str) or not uri:
        raise BadStorageUri(f"storage URI {uri!r} is empty or not a string")
    match = _SCHEME_RE.match(uri)
    if match is None:
        if "://" in uri or _NEAR_MISS_RE.match(uri):
            raise BadStorageUri(f"malformed storage URI {uri!r}")
        return ""
    scheme = match.group(1).lower()
    return "" if scheme == "file" else scheme


def storage_for(uri: str) -> Storage:
    """The backend for `uri`: local for a path or `file://`, `S3Storage` for `s3://`, `GCSStorage` for `gs://`."""
    scheme = _scheme_of(uri)
    instance = _INSTANCES.get(scheme)
    if instance is not None:
        return instance
    target = _BACKENDS.get(scheme)
    if target is None:
        known = ", ".join(f"{s}://" for s in sorted(_BACKENDS) if s)
        raise BadStorageUri(f"storage URI {uri!r}: unknown scheme {scheme!r} (use a local path, file://, {known})")
    with _LOCK:
        instance = _INSTANCES.get(scheme)
        if instance is None:
            module_name, class_name = target
            instance = getattr(importlib.import_module(module_name), class_name)()
            _INSTANCES[scheme] = instance
    return instance


def split_uri(uri: str) -> tuple[str, str, str]:
    """`(scheme, bucket, key)` for s3/gs URIs; `("", "", absolute path)` for local ones."""
    scheme = _scheme_of(uri)
    if scheme == "":
        return "", "", _local_path(uri)
    rest = uri[len(scheme) + 3:]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise BadStorageUri(f"storage URI {uri!r} names no bucket")
    return scheme, bucket, key


def join_uri(base: str, *parts: str) -> str:
    """`base` with `parts` appended as path segments: `join_uri("s3://b/a", "x", "y.json") == "s3://b/a/x/y.json"`."""
    cleaned = [p.strip("/") for p in parts if p and p.strip("/")]
    if not cleaned:
        return base
    head = base.rstrip("/")
    if head.endswith(":"):  # "s3://" alone: keep the scheme's slashes
        return base + "/".join(cleaned)
    return head + "/" + "/".join(cleaned)


def _local_path(uri: str) -> str:
    """The absolute path of a local path or `file://` URI (symlinks kept, `~` expanded)."""
    if uri[:7].lower() == "file://":
        rest = uri[7:]
        host, slash, path = rest.partition("/")
        if host not in ("", "localhost") or not slash:
            raise BadStorageUri(f"file URI {uri!r} must be file:///absolute/path")
        uri = "/" + path
    return os.path.abspath(os.path.expanduser(uri))
