"""What a predictor imports that nothing will provide: a warning at deploy, not a failure at the first batch.

A project without a `requirements.txt` (or `dependencies.sh`) runs in Sluice's own environment, so a
predictor that imports a package Sluice does not have deploys cleanly and fails only when a node
or replica first builds it. At deploy, the predictor's file and the project's own modules it
imports (followed through the project) are read, not run; every top-level module they import that
is neither the project's own, the standard library's, nor importable beside Sluice is named.

A project with an environment of its own is not checked: a requirement's distribution name says
nothing certain of the modules it provides (scikit-learn gives `sklearn`), so a warning there would
too often be wrong. Imports inside a `try` block are left out too: they are how code says a module
is optional.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path


def unprovided_imports(project_dir: Path, predictor_path: str) -> list[str]:
    """The top-level modules the predictor (and the project's modules it imports) import that this
    environment cannot import, sorted; each as `module (file line N)`."""
    found: dict[str, str] = {}
    seen: set[Path] = set()
    pending = [project_dir / predictor_path]
    # The project's modules are imported from its root, and from the predictor's own folder.
    roots = list(dict.fromkeys([project_dir, (project_dir / predictor_path).parent]))
    while pending:
        path = pending.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):  # compile_project refuses these, naming the line
            continue
        for module, line in _imports(tree, path, project_dir):
            top = module.split(".")[0]
            own = [root for root in roots if (root / f"{top}.py").is_file() or (root / top).is_dir()]
            if own:
                pending.extend(file for root in own for file in _own_files(root, module))
            elif not _provided(top):
                found.setdefault(top, f"{top} ({path.relative_to(project_dir).as_posix()} line {line})")
    return [found[name] for name in sorted(found)]


def _imports(tree: ast.AST, path: Path, project_dir: Path) -> Iterator[tuple[str, int]]:
    """(dotted module, line) of every import outside a `try` block; relative ones resolved against
    the project (as dotted paths from its root)."""
    optional = {id(node) for block in ast.walk(tree) if isinstance(block, ast.Try)
                for statement in block.body for node in ast.walk(statement)}
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                yield node.module, node.lineno
                yield from ((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)
            elif node.level > 0:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                try:
                    package = ".".join(base.relative_to(project_dir).parts)
                except ValueError:  # above the project: not for Sluice to follow
                    continue
                module = ".".join(part for part in (package, node.module or "") if part)
                for alias in node.names:
                    yield (f"{module}.{alias.name}" if module else alias.name), node.lineno


def _own_files(root: Path, module: str) -> list[Path]:
    """The project's own file a dotted module name under `root` stands for (`a.b`: a/b.py or
    a/b/__init__.py; for `from a import name`, `name` may be an attribute: a/__init__.py)."""
    parts = module.split(".")
    while parts:
        target = root.joinpath(*parts)
        if target.with_suffix(".py").is_file():
            return [target.with_suffix(".py")]
        if (target / "__init__.py").is_file():
            return [target / "__init__.py"]
        parts = parts[:-1]
    return []


def _provided(top: str) -> bool:
    """Whether a top-level module is the standard library's or importable here."""
    if top in sys.stdlib_module_names or top in sys.builtin_module_names or top == "__future__":
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False
