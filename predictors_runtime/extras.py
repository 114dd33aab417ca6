"""The optional parts of Sluice ("extras", pyproject.toml) a feature needs, and the error naming a missing one.

A client-only install (`pip install sluice`) has the `sluice` command and the Python client;
running Sluice, the model runtimes and the cloud storage clients come with extras. Code that
needs one imports it where it is used, inside `needs_extra`, so that a missing package is
reported as the extra to install rather than as a bare `ModuleNotFoundError` from deep inside.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

from foundation.errors import MissingExtra

# Sluice's own top-level packages: a module of these that cannot be imported is a bug or a
# broken checkout, never an extra to install.
_OWN_PACKAGES = frozenset({"api", "beat", "cortex", "cortex_internal", "jobs", "predictors_runtime", "sluice"})

# Predictor type -> (the module its model client loads models with, the extra that installs it).
PREDICTOR_RUNTIMES: dict[str, tuple[str, str]] = {
    "onnx": ("onnxruntime", "onnx"),
    "tensorflow": ("tensorflow", "tensorflow"),
}


def install_hint(extra: str) -> str:
    """The command that installs `extra`, as error messages spell it."""
    hint = f"pip install 'sluice[{extra}]'"
    if extra == "tensorflow":
        hint += " (or 'sluice[tensorflow-cpu]' without a GPU)"
    return hint


def missing_extra(needed_for: str, package: str, extra: str) -> MissingExtra:
    """The error for `needed_for` (e.g. "s3:// storage") lacking `package` of `extra`."""
    return MissingExtra(f"{needed_for} needs {package}, which is not installed: {install_hint(extra)}")


@contextmanager
def needs_extra(extra: str, needed_for: str, package: str | None = None) -> Iterator[None]:
    """Imports in this block that fail for want of a package raise `MissingExtra` naming `extra`.

    `package` is the distribution to name (e.g. "boto3"); by default the module that was
    missing. A missing module of Sluice's own packages is re-raised as it is: no extra brings it.
    """
    try:
        yield
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        if not top or top in _OWN_PACKAGES:
            raise
        raise missing_extra(needed_for, package or top, extra) from e


def is_installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it (TensorFlow takes seconds to)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing, or an import hook refuses the module
        return False


def require_predictor_runtime(predictor_type: str) -> None:
    """Raise `MissingExtra` when the runtime `predictor_type`'s models need is not installed.

    Checked when a predictor is built, so a worker or replica without the runtime fails the job
    or the replica at once with the extra to install, not at its first model load.
    """
    runtime = PREDICTOR_RUNTIMES.get(predictor_type)
    if runtime is not None and not is_installed(runtime[0]):
        module, extra = runtime
        raise missing_extra(f"the {predictor_type} predictor type", module, extra)
