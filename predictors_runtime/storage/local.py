"""Storage in local folders (the default for a single host, or a shared mount)."""

from __future__ import annotations

import os
import stat as stat_module
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import BinaryIO

from foundation.errors import AccessDenied, BadStorageUri, StorageError, StorageNotFound

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
    except ValueError as e:  # a NUL byte, or a lone surrogate the file system cannot encode
        raise BadStorageUri(f"{uri!r}: not a usable local path ({e})") from e


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
                with suppress(OSError):
                    os.unlink(tmp)
                raise

    def delete(self, uri: str) -> None:
        path = self._path(uri)
        with _errors(path), suppress(FileNotFoundError):
            os.unlink(path)

# -- confinement at open --------------------------------------------------------------------------
# Job inputs may name local files only under the operator's roots (SLUICE_LOCAL_INPUT_ROOTS). The
# API checks that at submission, but a file can be swapped for a link afterwards, so workers
# check again on the file they actually opened: its path as the kernel reports it for the open
# descriptor, which no later swap can change.


def _inside(path: str, roots: Sequence[str]) -> bool:
    """Whether the real path `path` is one of the roots (links resolved) or below one."""
    for root in roots:
        real_root = os.path.realpath(root)
        if path == real_root or path.startswith(real_root.rstrip(os.sep) + os.sep):
            return True
    return False


def _opened_path(fd: int, fallback: str) -> str:
    """The absolute, link-free path of the file open as `fd`."""
    if sys.platform.startswith("linux"):
        return os.readlink(f"/proc/self/fd/{fd}")
    if sys.platform == "darwin":  # pragma: no cover - Sluice's workers run on Linux
        import fcntl

        return os.fsdecode(fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024)).rstrip(b"\0"))
    return os.path.realpath(fallback)  # pragma: no cover - best effort elsewhere


def open_confined(path: str, roots: Sequence[str]) -> BinaryIO:
    """Open a local file for reading, refused unless the file opened lies under one of `roots`.

    On Linux the path is first opened with `O_PATH` (nothing is read, no device is woken), the
    opened file's real path and type are checked, and only then is that same file opened for
    reading through its descriptor. Refusals are `AccessDenied` naming `path` as the job gave it
    and the allowed roots, never where a link pointed.
    """
    if not roots:
        raise AccessDenied(
            f"{path}: local paths are not allowed here; the operator can allow folders with "
            "SLUICE_LOCAL_INPUT_ROOTS (on the workers as on the API)"
        )
    o_path = getattr(os, "O_PATH", 0)
    flags = (o_path or (os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))) | os.O_CLOEXEC
    with _errors(path):
        fd = os.open(path, flags)
    try:
        with _errors(path):
            st = os.fstat(fd)
            real = _opened_path(fd, path)
        if not _inside(real, roots):
            raise AccessDenied(
                f"{path}: refused, it leads outside the allowed local roots ({os.pathsep.join(roots)}); "
                "a link inside a root may only point inside a root"
            )
        if not stat_module.S_ISREG(st.st_mode):
            raise AccessDenied(f"{path}: refused, not a regular file")
        if o_path:
            with _errors(path):
                readable = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
            os.close(fd)
            fd = readable
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def write_bytes_confined(path: str, data: bytes, roots: Sequence[str]) -> None:
    """Write a local file (beside, then renamed over), refused unless its folder lies under one of `roots`.

    A job's output folder was checked at submission, but a folder on the way may have been
    swapped for a link since. The folder is opened first (`O_PATH`), its real path checked, and
    the file created and renamed relative to that open folder, with `O_NOFOLLOW`: no later swap
    can send the bytes elsewhere.
    """
    if not roots:
        raise AccessDenied(
            f"{path}: local paths are not allowed here; the operator can allow folders with "
            "SLUICE_LOCAL_INPUT_ROOTS (on the workers as on the API)"
        )
    folder, name = os.path.split(path)
    tmp = f".{name}.{uuid.uuid4().hex}{TEMP_SUFFIX}"
    with _errors(path):
        os.makedirs(folder, exist_ok=True)
        dir_fd = os.open(folder, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with _errors(path):
            real = _opened_path(dir_fd, folder)
        if not _inside(real, roots):
            raise AccessDenied(
                f"{path}: refused, its folder leads outside the allowed local roots ({os.pathsep.join(roots)}); "
                "a link inside a root may only point inside a root"
            )
        with _errors(path):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                         dir_fd=dir_fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
    finally:
        os.close(dir_fd)


def read_range_confined(path: str, start: int, end: int, roots: Sequence[str]) -> bytes:
    """Bytes `[start, end)` of a local file, opened with `open_confined`."""
    if start < 0 or end < start:
        raise ValueError(f"bad byte range [{start}, {end})")
    with open_confined(path, roots) as f, _errors(path):
        f.seek(start)
        return f.read(end - start)
