"""The AsyncAPI store's Lua scripts are files of their package, each used and each shipped."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from jobs.asyncapi import store

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "jobs" / "asyncapi" / "lua"


def test_every_script_file_is_used_by_the_store_and_every_one_it_uses_is_a_file() -> None:
    used = set(re.findall(r'source\("(\w+)"\)', (ROOT / "jobs" / "asyncapi" / "store.py").read_text()))
    assert used == {path.stem for path in FOLDER.glob("*.lua")}
    assert all(store.source(name).strip() for name in used)


def test_the_distribution_ships_them() -> None:
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert package_data["jobs.asyncapi"] == ["lua/*.lua"]
