"""The benchmarks stand on the product and `testbed/`, never on the tests: a test may change
without a benchmark breaking, and a benchmark never runs a test's fixture by accident."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_benchmark_imports_from_the_tests() -> None:
    offenders = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            offenders += [f"{path.name}:{node.lineno} {name}" for name in names if name.split(".")[0] == "tests"]
    assert offenders == []


FIRST_PARTY = ("api", "beat", "jobs", "foundation", "predictors_runtime", "sluice", "cortex", "testbed")


def test_every_name_a_benchmark_imports_from_sluice_exists() -> None:
    """Benchmarks are run by hand (`make bench`), not by the suite: an import a move broke would
    only show there (imports inside functions included)."""
    import importlib

    missing = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in FIRST_PARTY:
                module = importlib.import_module(node.module)
                missing += [f"{path.name}:{node.lineno} {node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name)]
    assert missing == []
