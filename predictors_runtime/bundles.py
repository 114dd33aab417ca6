"""Project bundles: a deployed project folder stored once, by content, for any host to fetch.

Each host keeps the bundles it runs unpacked in a cache folder, `<cache_dir>/bundles/<digest>`,
bounded in size: when a new bundle is unpacked, the least recently used others are removed
until the cache fits again. A bundle in use is never removed under its user. A process holds a
shared `flock` on `<digest>.lock` for every bundle it has taken with `local_folder` and not yet
given back with `release` (one that never releases holds its bundles while it lives), and
eviction removes a folder only under an exclusive lock it can take at once. Each use touches
the folder, so folder mtimes order the cache; the lock file holds the folder's size in bytes,
so eviction never walks a tree.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from foundation.errors import ConfigError
from foundation.limits import DEFAULT_BUNDLE_CACHE_BYTES

from .project import BundleLimits, bundle_digest, unpack_project
from .storage import join_uri, storage_for

log = logging.getLogger(__name__)

_LOCK_SUFFIX = ".lock"
_TRASH_PREFIX = ".evicted."


# What a bundle may unpack to unless the settings say otherwise.
DEFAULT_LIMITS = BundleLimits()


class BundleStore:
    """Puts bundles into Sluice's storage and unpacks them into a local cache on demand."""

    def __init__(
        self, root_uri: str, cache_dir: str | Path, *, limits: BundleLimits = DEFAULT_LIMITS,
        cache_bytes: int = DEFAULT_BUNDLE_CACHE_BYTES,
    ) -> None:
        self._root = root_uri
        self._storage = storage_for(root_uri)
        self._cache = Path(cache_dir).expanduser() / "bundles"
        self.limits = limits
        self._cache_bytes = cache_bytes
        self._held: dict[str, tuple[int, int]] = {}  # digest -> (fd of its shared-locked lock file, uses)
        self._lock = threading.Lock()

    def _uri(self, digest: str) -> str:
        """The URI of a bundle: `<root>/bundles/<digest>.tar.gz`."""
        return join_uri(self._root, "bundles", f"{digest}.tar.gz")

    def put(self, data: bytes) -> str:
        """Store a packed project; returns its content digest. Storing the same content twice is free."""
        digest = bundle_digest(data, self.limits)
        if not self._storage.exists(self._uri(digest)):
            self._storage.write_bytes(self._uri(digest), data)
        return digest

    def unpack(self, data: bytes, dest: Path) -> int:
        """Unpack a packed project into `dest` within this store's limits; returns its bytes."""
        return unpack_project(data, dest, self.limits)

    def local_folder(self, digest: str) -> Path:
        """The unpacked project folder of a bundle, fetched and unpacked on first use.

        The folder stays in place until this process gives it back with `release(digest)` (once
        per call) or ends.
        """
        if not digest or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(f"invalid bundle digest {digest!r}")
        folder = self._cache / digest
        with self._lock:
            self._cache.mkdir(parents=True, exist_ok=True)
            self._hold(digest)  # before looking: an eviction in progress finishes first
            try:
                if folder.is_dir():
                    os.utime(folder)
                    return folder
                self._fetch(digest, folder)
            except BaseException:
                self._let_go(digest)
                raise
            self.evict(keep=digest)
        return folder

    def release(self, digest: str) -> None:
        """One use of `local_folder(digest)` is over; after the last, eviction may remove the folder."""
        with self._lock:
            self._let_go(digest)

    def evict(self, keep: str = "") -> list[str]:
        """Remove least recently used bundles until the cache fits its bound; returns their digests.

        Bundles in use by any process (a shared lock held) and `keep` are left alone.
        """
        folders = []
        for entry in os.scandir(self._cache) if self._cache.is_dir() else []:
            if entry.name.startswith(_TRASH_PREFIX):  # left by a process that died while deleting
                shutil.rmtree(entry.path, ignore_errors=True)
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                folders.append((entry.stat(follow_symlinks=False).st_mtime, entry.name, self._size_of(entry.name)))
            except FileNotFoundError:
                continue  # removed by another process meanwhile
        total = sum(size for _, _, size in folders)
        removed: list[str] = []
        for _, digest, size in sorted(folders):
            if total <= self._cache_bytes:
                break
            if digest == keep or digest in self._held:
                continue
            if self._remove_if_unused(digest):
                removed.append(digest)
                total -= size
        if removed:
            log.info("bundle cache: removed %d least recently used bundle(s) to stay under %d bytes",
                     len(removed), self._cache_bytes)
        return removed

    def _fetch(self, digest: str, folder: Path) -> None:
        """Unpack the stored bundle beside `folder`, then rename it into place."""
        data = self._storage.read_bytes(self._uri(digest))
        staging = Path(tempfile.mkdtemp(dir=self._cache, prefix=f".{digest}."))
        try:
            size = self.unpack(data, staging)
            self._lock_path(digest).write_text(str(size))
            try:
                os.rename(staging, folder)
            except OSError:
                if not folder.is_dir():  # another process won the race only if the folder is there
                    raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    # -- locks ---------------------------------------------------------------------------------
    def _lock_path(self, digest: str) -> Path:
        return self._cache / f"{digest}{_LOCK_SUFFIX}"

    def _hold(self, digest: str) -> None:
        if digest in self._held:
            fd, uses = self._held[digest]
            self._held[digest] = (fd, uses + 1)
            return
        fd = os.open(self._lock_path(digest), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while another process evicts this bundle
        self._held[digest] = (fd, 1)

    def _let_go(self, digest: str) -> None:
        fd, uses = self._held.get(digest, (-1, 0))
        if uses > 1:
            self._held[digest] = (fd, uses - 1)
        elif uses == 1:
            del self._held[digest]
            os.close(fd)  # closing drops the flock

    def _size_of(self, digest: str) -> int:
        try:
            return int(self._lock_path(digest).read_text() or 0)
        except (OSError, ValueError):
            return 0  # unpacked by an older version: counted as nothing, evicted when oldest

    def _remove_if_unused(self, digest: str) -> bool:
        try:
            fd = os.open(self._lock_path(digest), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # some process is using it
            # Out of the way at once (a rename is atomic), then deleted without the lock held.
            trash = self._cache / f"{_TRASH_PREFIX}{digest}.{os.getpid()}"
            try:
                os.rename(self._cache / digest, trash)
            except FileNotFoundError:
                return False
        finally:
            os.close(fd)
        shutil.rmtree(trash, ignore_errors=True)
        return True
