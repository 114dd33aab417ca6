"""What a project asks to have installed: `requirements.txt`, `dependencies.sh`, `conda-packages.txt`.

Cortex ran `dependencies.sh`, then conda, then `pip install -r requirements.txt` in each API's own
container. Sluice honours the first and the last in an environment of the API's own (`host.py`);
conda is not what environments are built with, so a project that lists conda packages is refused
at deploy with a message saying what to do instead.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from foundation.errors import ConfigError

from ..config import ApiConfig, DependenciesConfig


@dataclass(frozen=True)
class DependencyFiles:
    """The texts of a project's dependency files (empty when the file is not there) and their names."""

    requirements: str = ""
    shell: str = ""
    pip_path: str = "requirements.txt"
    shell_path: str = "dependencies.sh"

    @property
    def empty(self) -> bool:
        """Nothing to install: the API runs in Sluice's own environment, as it always did."""
        return not _meaningful(self.requirements) and not _meaningful(self.shell)


def _meaningful(text: str) -> bool:
    """Whether a requirements file or a shell script says anything (more than comments and blank lines)."""
    return any(line.strip() and not line.strip().startswith("#") for line in text.splitlines())


def _read(project_dir: Path, relative: str, what: str) -> str:
    path = project_dir / relative
    if not path.is_file():
        return ""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what}: {relative} cannot be read as UTF-8 text: {e}") from e


def read_dependency_files(project_dir: Path, api: ApiConfig, source: str = "cortex.yaml") -> DependencyFiles:
    """The API's dependency files in its project folder; `ConfigError` for conda packages without conda."""
    paths = api.predictor.dependencies or DependenciesConfig()
    what = f"{source}: api {api.name}: {api.code_section}.dependencies"
    conda = _read(project_dir, paths.conda, what)
    if conda.strip() and shutil.which("conda") is None:
        raise ConfigError(f"{what}.conda: {paths.conda} lists conda packages, but conda is not installed on this "
                          "host and Sluice builds environments with uv: list them as pip requirements in "
                          f"{paths.pip}, or install system libraries in {paths.shell}")
    if conda.strip():
        raise ConfigError(f"{what}.conda: {paths.conda}: conda packages are not installed into an API's "
                          f"environment by this version of Sluice: list them in {paths.pip} instead")
    return DependencyFiles(_read(project_dir, paths.pip, what), _read(project_dir, paths.shell, what),
                           paths.pip, paths.shell)
