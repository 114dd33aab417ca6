"""Model versions on local disk: one folder per version and fingerprint, written atomically.

A version lands in `<cache_dir>/<model name>/<version>-<fingerprint hash>/`. It is downloaded to
a temporary folder beside that and renamed into place, so a folder of that name is always
complete; a process that finds it already there (another worker sharing the cache finished
first) uses it as it is.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from foundation.errors import StorageError
from predictors_runtime.storage import storage_for

from .layout import ModelVersion

_SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def digest(version: ModelVersion) -> str:
    """A short hash of a version's fingerprint (its files and their storage versions)."""
    text = "\n".join(f"{path}\0{tag}" for path, tag in version.files)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def folder_name(name: str) -> str:
    """`name` as one safe path segment (a name from `paths:` may hold any character)."""
    if _SAFE_NAME_RE.match(name):
        return name
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "model"
    return f"{cleaned}-{hashlib.sha256(name.encode('utf-8')).hexdigest()[:8]}"


def version_folder(cache_dir: Path, version: ModelVersion) -> Path:
    """Where `version`, with exactly these files, lives on disk."""
    return cache_dir / folder_name(version.name) / f"{version.version}-{digest(version)}"


def download(version: ModelVersion, folder: Path) -> None:
    """Download the files of `version` to `folder` through a temporary folder renamed into place."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    except OSError as e:
        raise StorageError(f"{folder.parent}: cannot create the model cache folder: {e}") from e
    try:
        storage_for(version.uri).download_folder(version.uri, tmp)
        try:
            os.rename(tmp, folder)
        except OSError as e:
            if not folder.is_dir():  # else another process finished the same download first
                raise StorageError(f"{folder}: cannot move the downloaded model into place: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove(folders: Iterable[Path]) -> None:
    """Delete model folders (those already gone are fine)."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
