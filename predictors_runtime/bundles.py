"""Project bundles: a deployed project folder stored once, by content, for any host to fetch."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .errors import ConfigError
from .project import bundle_digest, unpack_project
from .storage import Storage


class BundleStore:
    """Puts bundles into Sluice's storage and unpacks them into a local cache on demand."""

    def __init__(self, storage: Storage, cache_dir: str | Path) -> None:
        self._storage = storage
        self._cache = Path(cache_dir).expanduser() / "bundles"

    @staticmethod
    def _key(digest: str) -> str:
        return f"bundles/{digest}.tar.gz"

    def put(self, data: bytes) -> str:
        """Store a packed project; returns its content digest. Storing the same content twice is free."""
        digest = bundle_digest(data)
        if not self._storage.exists(self._key(digest)):
            self._storage.write_bytes(self._key(digest), data)
        return digest

    def local_folder(self, digest: str) -> Path:
        """The unpacked project folder of a bundle, fetched and unpacked on first use."""
        if not digest or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(f"invalid bundle digest {digest!r}")
        folder = self._cache / digest
        if folder.is_dir():
            return folder
        data = self._storage.read_bytes(self._key(digest))
        self._cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=self._cache, prefix=f".{digest}."))
        try:
            unpack_project(data, staging)
            try:
                os.rename(staging, folder)
            except OSError:
                if not folder.is_dir():  # another process won the race only if the folder is there
                    raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return folder
