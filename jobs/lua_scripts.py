"""Redis Lua scripts kept as files of their package's `lua/` folder (shipped as package data:
pyproject.toml), so that each reads as Lua, with its comments, and a reviewer sees one per file."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def lua_source(package: str, name: str) -> str:
    """The text of `<package>/lua/<name>.lua`, read once per process."""
    return resources.files(package).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")
