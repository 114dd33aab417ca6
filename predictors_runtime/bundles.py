"""Project bundles: a deployed project folder stored once, by content, for any host to fetch."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .errors import ConfigError
from .project import bundle_digest, unpack_project
from .storage import join_uri, storage_for


class BundleStore:
    """Puts bundles into Sluice's storage and unpacks them into a local cache on demand."""

    def __init__(self, root_uri: str, cache_dir: str | Path) -> None:
        self._root = root_uri
        self._storage = storage_for(root_uri)
        self._cache = Path(cache_dir).expanduser() / "bundles"

    def _uri(self, digest: str) -> str:
        """The URI of a bundle: `<root>/bundles/<digest>.tar.gz`."""
        return join_uri(self._root, "bundles", f"{digest}.tar.gz")

    def put(self, data: bytes) -> str:
        """Store a packed project; returns its content digest. Storing the same content twice is free."""
        digest = bundle_digest(data)
        if not self._storage.exists(self._uri(digest)):
            self._storage.write_bytes(self._uri(digest), data)
        return digest

    def local_folder(self, digest: str) -> Path:
        """The unpacked project folder of a bundle, fetched and unpacked on first use."""
        if not digest or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(f"invalid bundle digest {digest!r}")
        folder = self._cache / digest
        if folder.is_dir():
            return folder
        data = self._storage.read_bytes(self._uri(digest))
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
