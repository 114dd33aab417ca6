"""What an upgrade moved: the locked versions of uv.lock against the last committed uv.lock.

`make lock` prints it after refreshing the lock, so that whoever takes an upgrade reads what changed
(docs/dependencies.md) before running `make test` and committing: `python -m testbed.lock_report`.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def locked_versions(lock_text: str) -> dict[str, set[str]]:
    """Package name -> the versions a uv.lock holds for it (more than one where Pythons differ)."""
    versions: dict[str, set[str]] = {}
    for package in tomllib.loads(lock_text).get("package", []):
        versions.setdefault(package["name"], set()).add(str(package.get("version", "(source)")))
    return versions


def changes(before: dict[str, set[str]], after: dict[str, set[str]]) -> list[str]:
    """One line per package whose locked versions differ, sorted by name."""
    lines = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name, set()), after.get(name, set())
        if old == new:
            continue
        if not old:
            lines.append(f"  + {name} {', '.join(sorted(new))}")
        elif not new:
            lines.append(f"  - {name} {', '.join(sorted(old))}")
        else:
            lines.append(f"  ~ {name} {', '.join(sorted(old))} -> {', '.join(sorted(new))}")
    return lines


def committed_lock() -> str:
    """uv.lock as the last commit holds it ("" where it holds none)."""
    shown = subprocess.run(["git", "show", "HEAD:uv.lock"], cwd=ROOT, capture_output=True, text=True, check=False)
    return shown.stdout if shown.returncode == 0 else ""


def main() -> int:
    moved = changes(locked_versions(committed_lock()), locked_versions((ROOT / "uv.lock").read_text()))
    if not moved:
        print("uv.lock: nothing moved against the last commit")
        return 0
    print(f"uv.lock: {len(moved)} packages moved against the last commit (+ added, - removed, ~ changed):")
    print("\n".join(moved))
    print("Next: `make test`, read the changelogs of what Sluice leans on (Celery, kombu, redis-py), commit uv.lock.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
