"""Per-API Python environments: a project's `requirements.txt` and `dependencies.sh`, locked at deploy
(`lock.py`), built once per host (`host.py`), and a predictor run in one (`remote.py`, `child.py`)."""

from .host import Environment, HostEnvironments
from .lock import lock_environment, server_pins
from .project_files import DependencyFiles, read_dependency_files
from .spec import EnvironmentSpec

__all__ = [
    "DependencyFiles",
    "Environment",
    "EnvironmentSpec",
    "HostEnvironments",
    "lock_environment",
    "read_dependency_files",
    "server_pins",
]
