"""Loading user predictor classes and calling their methods with only the arguments they declare."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from foundation.errors import PredictorError

# Searched in this order; `Handler` is the newer Cortex spelling.
PREDICTOR_CLASS_NAMES = ("Handler", "PythonPredictor", "TensorFlowPredictor", "ONNXPredictor")
# A TaskAPI's class (Cortex's `Task` with `__call__(self, config)`).
TASK_CLASS_NAMES = ("Task",)


def error_text(exc: BaseException) -> str:
    """`Type: message` and the traceback, as users see it in job statuses and logs (for an error
    raised in another process, the traceback there)."""
    remote = getattr(exc, "remote_text", None)
    if isinstance(remote, str) and remote:
        return remote
    return "".join(traceback.format_exception(exc)).strip()


def one_line(text: str) -> str:
    """A failure in one line, for callers who should not see tracebacks or the server's paths: the
    text's first line without a trailing "Traceback ...:", and its last line (the exception)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    first = lines[0].removesuffix("Traceback (most recent call last):").strip()
    if not first:
        return lines[-1]
    return f"{first} {lines[-1]}" if first.endswith(":") else f"{first}: {lines[-1]}"


def load_predictor_class(
    project_dir: Path, predictor_path: str, module_tag: str = "", class_names: tuple[str, ...] = PREDICTOR_CLASS_NAMES,
) -> type:
    """Import `predictor_path` inside `project_dir` (running its global-scope code) and return its class,
    the first of `class_names` it defines.

    Each (project, tag) gets its own module name, so two versions of one API can live in one
    worker process without sharing module state.
    """
    file = (project_dir / predictor_path).resolve()
    if not file.is_file():
        raise PredictorError(f"predictor file {predictor_path} not found in the project folder")
    digest = hashlib.sha1(f"{file}:{module_tag}".encode()).hexdigest()[:12]
    module_name = f"sluice_predictor_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, file)
        if spec is None or spec.loader is None:
            raise PredictorError(f"cannot import {predictor_path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as e:
            del sys.modules[module_name]
            raise PredictorError(f"importing {predictor_path} failed: {error_text(e)}") from e
    for name in class_names:
        cls = getattr(module, name, None)
        if inspect.isclass(cls):
            return cls
    if len(class_names) == 1:
        raise PredictorError(f"{predictor_path} defines no class {class_names[0]}")
    raise PredictorError(f"{predictor_path} defines none of the classes {', '.join(class_names)}")


class DeclaredCall:
    """A user function and the arguments it declares among those Sluice offers, worked out once.

    Batch predictors are called once per batch: inspecting their signature every time would be
    overhead on the hot path.
    """

    def __init__(self, func: Callable[..., Any], offered: Iterable[str]) -> None:
        self.func = func
        offered = set(offered)
        params = inspect.signature(func).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            self.names: tuple[str, ...] = tuple(sorted(offered))
            return
        names = []
        for param in params:
            if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
                continue
            if param.name in offered:
                names.append(param.name)
            elif param.default is inspect.Parameter.empty:
                owner = getattr(func, "__qualname__", getattr(func, "__name__", "predictor method"))
                raise PredictorError(
                    f"{owner} requires an argument {param.name!r}; Sluice provides {', '.join(sorted(offered))}"
                )
        self.names = tuple(names)

    def __call__(self, available: dict[str, Any]) -> Any:
        return self.func(**{name: available[name] for name in self.names})


def call_with_declared(func: Callable[..., Any], available: dict[str, Any]) -> Any:
    """Call `func` passing, by name, only the entries of `available` it declares.

    A parameter it requires that Sluice cannot provide is a predictor error naming it.
    """
    return DeclaredCall(func, available)(available)
