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
