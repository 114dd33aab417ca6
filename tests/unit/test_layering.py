"""Layers import downwards only: `beat` drives `jobs`, never the other way round."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules_loaded_by(package: str) -> set[str]:
    """Top-level packages loaded when every module of `package` is imported, in a fresh interpreter."""
    code = (
        "import importlib, pkgutil, sys\n"
        f"import {package}\n"
        f"for info in pkgutil.iter_modules({package}.__path__):\n"
        f"    importlib.import_module('{package}.' + info.name)\n"
        "print('\\n'.join(sorted({name.split('.')[0] for name in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_importing_every_module_of_jobs_loads_nothing_of_beat() -> None:
    loaded = _modules_loaded_by("jobs")
    assert "jobs" in loaded
    assert "beat" not in loaded


# Literals that look like keys but are not: (file, literal prefix).
NOT_KEYS = {
    ("jobs/batch_steps.py", "sluice:"),  # the uuid5 name of a batch id, not a key
}


def _key_literals(path: Path) -> list[str]:
    """String literals (and the leading text of f-strings) in `path` that look like Sluice's Redis keys."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            text = node.values[0].value
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if isinstance(text, str) and text.startswith("sluice:"):
            found.append(text)
    return found


def test_every_redis_key_is_named_in_jobs_keys() -> None:
    stray = []
    for package in ("jobs", "beat", "api", "sluice"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == "jobs/keys.py":
                continue
            literals = [text for text in _key_literals(path) if (relative, text) not in NOT_KEYS]
            stray.extend(f"{relative}: {text!r}" for text in literals)
    assert not stray, "name these keys in jobs/keys.py: " + "; ".join(stray)
