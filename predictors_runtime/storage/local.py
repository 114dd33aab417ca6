"""Storage in local folders (the default for a single host, or a shared mount)."""

from __future__ import annotations

import os
import stat as stat_module
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from predictors_runtime.errors import AccessDenied, BadStorageUri, StorageError, StorageNotFound

from .base import TEMP_SUFFIX, ObjectInfo, Storage, split_uri


@contextmanager
def _errors(uri: str) -> Iterator[None]:
    """Turn `OSError`s into Sluice's storage errors naming `uri`."""
    try:
        yield
    except (FileNotFoundError, NotADirectoryError) as e:
        raise StorageNotFound(f"{uri}: not found") from e
    except IsADirectoryError as e:
        raise StorageNotFound(f"{uri}: is a folder, not a file") from e
    except PermissionError as e:
        raise AccessDenied(f"{uri}: access denied ({e.strerror})") from e
    except OSError as e:
        raise StorageError(f"{uri}: {e}") from e


def _info(path: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(uri=path, size=st.st_size, version=f"{st.st_mtime_ns}-{st.st_size}")


class LocalStorage(Storage):
    """Files under absolute paths; object URIs are the paths themselves."""

    scheme = ""

    @staticmethod
    def _path(uri: str) -> str:
        scheme, _, path = split_uri(uri)
        if scheme:
            raise BadStorageUri(f"{uri!r} is not a local path")
        return path

    def canonical(self, uri: str) -> str:
        return self._path(uri)

    def list(self, uri: str) -> Iterator[ObjectInfo]:
        path = self._path(uri)
        return self._list(path)

    def _list(self, path: str) -> Iterator[ObjectInfo]:
        with _errors(path):
            try:
                st = os.stat(path)  # follows a symlink given explicitly as the root
            except (FileNotFoundError, NotADirectoryError):
                return
        if stat_module.S_ISDIR(st.st_mode):
            yield from self._walk(path)
        else:
            yield _info(path, st)

    def _walk(self, folder: str) -> Iterator[ObjectInfo]:
        """Files under `folder` in the order of their full path strings; no symlinked folders."""
        entries: list[tuple[str, os.DirEntry[str], bool]] = []
        with _errors(folder), os.scandir(folder) as it:
            for entry in it:
                if entry.name.endswith(TEMP_SUFFIX):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    # "a/" sorts as its children do against siblings such as "a-b" or "a0".
                    entries.append((entry.name + "/", entry, True))
                elif entry.is_file():  # a symlink to a file counts; a broken one does not
                    entries.append((entry.name, entry, False))
        entries.sort(key=lambda e: e[0])
        for _, entry, is_folder in entries:
            if is_folder:
                yield from self._walk(entry.path)
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue  # removed while we walked
            except OSError as e:
                raise StorageError(f"{entry.path}: {e}") from e
            yield _info(entry.path, st)

    def stat(self, uri: str) -> ObjectInfo:
        path = self._path(uri)
        with _errors(path):
            st = os.stat(path)
        if not stat_module.S_ISREG(st.st_mode):
            raise StorageNotFound(f"{path}: not found (not a file)")
        return _info(path, st)

    def exists(self, uri: str) -> bool:
        return os.path.isfile(self._path(uri))

    def open_read(self, uri: str) -> BinaryIO:
        path = self._path(uri)
        with _errors(path):
            return open(path, "rb")

    def read_range(self, uri: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise ValueError(f"bad byte range [{start}, {end})")
        path = self._path(uri)
        with _errors(path), open(path, "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def read_bytes(self, uri: str) -> bytes:
        path = self._path(uri)
        with _errors(path), open(path, "rb") as f:
            return f.read()

    def write_bytes(self, uri: str, data: bytes) -> None:
        path = self._path(uri)
        folder, name = os.path.split(path)
        tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
        with _errors(path):
            os.makedirs(folder, exist_ok=True)
            # Write beside, then rename: a reader never sees half a file. os.open with 0o666
            # keeps the umask's permissions (mkstemp would make the file private to us).
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
