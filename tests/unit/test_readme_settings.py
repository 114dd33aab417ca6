"""Every `SLUICE_*` variable that Sluice's code reads is documented in docs/settings.md's tables,
so an operator can find what a setting does and its default without reading the source.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("foundation", "api", "jobs", "beat", "sluice", "predictors_runtime")
# A name, not the tail of a longer one (the header variable HTTP_X_SLUICE_DEADLINE_MS is a header).
NAME = re.compile(r"(?<![A-Za-z0-9_])SLUICE_[A-Z0-9_]+")


def names_in_source() -> dict[str, list[str]]:
    """Each SLUICE_* name in the packages' source, with the files that mention it."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in set(NAME.findall(path.read_text(encoding="utf-8"))):
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def names_in_readme_tables() -> set[str]:
    """The names in the first column of docs/settings.md's tables (where settings are documented)."""
    documented: set[str] = set()
    for line in (ROOT / "docs" / "settings.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and len(cells) >= 3:
            documented.update(NAME.findall(cells[0]))
    return documented


def test_the_source_is_searched_where_settings_are_read() -> None:
    found = names_in_source()
    assert "SLUICE_REDIS_URL" in found and "foundation/settings.py" in found["SLUICE_REDIS_URL"]
    assert "SLUICE_DEADLINE_MS" not in found, "a header's name is not a setting"


@pytest.mark.parametrize("name", sorted(names_in_source()))
def test_every_sluice_variable_read_in_the_source_is_documented_in_the_readme(name: str) -> None:
    documented = names_in_readme_tables()
    if name.endswith("_"):  # a family named by its prefix (`SLUICE_REPLICA_*` in a docstring)
        assert any(entry.startswith(name) for entry in documented), f"no {name}* variable in docs/settings.md's tables"
        return
    assert name in documented, (
        f"{name} (read in {', '.join(names_in_source()[name])}) is missing from docs/settings.md's tables: "
        "add a row with its default and meaning"
    )
