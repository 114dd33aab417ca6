"""Storage in a local folder (the default for a single host, or a shared mount)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from predictors_runtime.errors import BadRequest, NotFound

from .base import Storage


class LocalStorage(Storage):
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root):
            raise BadRequest(f"storage key {key!r} escapes {self.root}")
        return path

    def read_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as e:
            raise NotFound(f"{self.describe(key)} not found") from e

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write beside, then rename: a reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def describe(self, key: str) -> str:
        return str(self.root / key)
