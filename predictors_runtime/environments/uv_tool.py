"""Running uv, the installer every environment is resolved and built with."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from foundation.errors import EnvironmentBuildFailed

# Longest a resolve or an install may take before it is given up (a package index that hangs).
UV_TIMEOUT_S = 900.0
# What of uv's output a message keeps: its last lines, where it says what failed.
MESSAGE_LINES = 12


def uv_binary() -> str:
    """The uv executable: the one the `uv` distribution installed beside Sluice, else one on PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise EnvironmentBuildFailed("uv is not installed on this host: it comes with `pip install 'sluice[server]'`")


# What uv puts before the line saying what failed (a multiplication sign, U+00D7).
UV_FAILURE_MARK = "\u00d7"


def tail(text: str, lines: int = MESSAGE_LINES) -> str:
    """The last non-empty lines of an installer's output, for a message, after the line that says what
    failed (uv's `error: ...` or `x ...` headline) where the last lines leave it out: a build's output
    is long, and its headline (`Failed to build scikit-learn==0.21.3`) names the requirement."""
    kept = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    last = kept[-lines:]
    headline = next((line for line in kept if line.lstrip().startswith(("error:", UV_FAILURE_MARK))), None)
    if headline is not None and headline not in last:
        return "\n".join([headline, "...", *last])
    return "\n".join(last)


def run_uv(args: Sequence[str], *, cwd: Path, cache_dir: Path, env: Mapping[str, str] | None = None,
           timeout_s: float = UV_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`uv <args>` with Sluice's cache folder and no progress bars; the caller reads the return code."""
    child_env = dict(os.environ if env is None else env)
    child_env.update({"UV_CACHE_DIR": str(cache_dir), "UV_NO_PROGRESS": "1", "NO_COLOR": "1"})
    # Ours to decide: an inherited VIRTUAL_ENV or a project uv.toml must not redirect an install.
    child_env.pop("VIRTUAL_ENV", None)
    child_env["UV_NO_CONFIG"] = "1"
    try:
        return subprocess.run([uv_binary(), *args], cwd=cwd, env=child_env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise EnvironmentBuildFailed(f"uv {args[0]} {args[1] if len(args) > 1 else ''} did not finish within "
                                     f"{timeout_s:.0f} s") from e
