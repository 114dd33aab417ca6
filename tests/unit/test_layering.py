"""The architecture as pyproject.toml's `[tool.importlinter]` declares it, held by every import in the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ROOT / "pyproject.toml"
_ARROW = re.compile(r"(?P<importer>[\w.]+) -> (?P<imported>[\w.]+) \(l\.(?P<line>\d+)\)")


def _file_of(module: str) -> str:
    """`jobs.settings` -> `jobs/settings.py` (or the package's `__init__.py`)."""
    path = ROOT.joinpath(*module.split("."))
    return (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(ROOT).as_posix()


def broken_arrows(report: str) -> list[str]:
    """Each forbidden import of an import-linter report as `file:line: importer -> imported`."""
    arrows = (f"{_file_of(m['importer'])}:{m['line']}: {m['importer']} -> {m['imported']}"
              for m in _ARROW.finditer(report))
    return list(dict.fromkeys(arrows))  # a chain shows an arrow once per contract it breaks


def test_every_import_keeps_to_the_declared_layers(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from importlinter import configuration
    from importlinter.application.use_cases import lint_imports

    configuration.configure()
    monkeypatch.chdir(ROOT)  # the packages are found from the repository's root
    kept = lint_imports(config_filename=str(LAYERS), cache_dir=None, no_logo=True)
    report = capsys.readouterr().out
    assert kept, "imports break the layers of pyproject.toml:\n" + "\n".join(broken_arrows(report)) + "\n\n" + report


def test_a_broken_arrow_is_named_by_file_line_and_arrow() -> None:
    report = "jobs is not allowed to import api:\n\n- jobs.settings -> api.auth (l.100)\n"
    assert broken_arrows(report) == ["jobs/settings.py:100: jobs.settings -> api.auth"]


# Literals that look like keys but are not: (file, literal prefix).
NOT_KEYS = {
    ("jobs/batch/steps.py", "sluice:"),  # the uuid5 name of a batch id, not a key
}


def _key_literals(path: Path) -> list[str]:
    """String literals (and the leading text of f-strings) in `path` that look like Sluice's Redis keys."""
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


def test_every_redis_key_is_named_in_foundation_keys() -> None:
    stray = []
    for package in ("foundation", "jobs", "beat", "api", "sluice"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == "foundation/keys.py":
                continue
            literals = [text for text in _key_literals(path) if (relative, text) not in NOT_KEYS]
            stray.extend(f"{relative}: {text!r}" for text in literals)
    assert not stray, "name these keys in foundation/keys.py: " + "; ".join(stray)


def test_every_module_of_jobs_but_the_fakes_is_held_from_importing_them() -> None:
    import tomllib

    contracts = tomllib.loads(LAYERS.read_text())["tool"]["importlinter"]["contracts"]
    [fakes] = [c for c in contracts if c["id"] == "fakes"]
    modules = {".".join(path.relative_to(ROOT).with_suffix("").parts) for path in (ROOT / "jobs").rglob("*.py")
               if path.name != "__init__.py" and path.stem != "memory"}
    assert modules - set(fakes["source_modules"]) == set(), "add them to the fakes contract in pyproject.toml"
    assert {m for m in fakes["forbidden_modules"] if m.startswith("jobs.")} == {
        ".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "jobs").rglob("memory.py")}
