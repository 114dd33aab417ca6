"""Sluice's own version, as installed: what `sluice --version`, the front page and an environment's
key all name (one reader, so they cannot disagree)."""

from __future__ import annotations

from importlib import metadata

# A checkout that was never installed (no distribution metadata) still has a version to show.
UNINSTALLED = "0+checkout"


def sluice_version() -> str:
    try:
        return metadata.version("sluice")
    except metadata.PackageNotFoundError:
        return UNINSTALLED
