"""What every section model of `cortex.yaml` shares: the pydantic settings and the sub-field problem.

Kept apart from `config.py` so that a section with a module of its own (`autoscaling_config.py`)
validates and reports errors exactly as the sections inside `config.py` do, without importing it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class FieldProblem(ValueError):
    """A validator's complaint about a sub-field, so the error path can name that field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ConfigModel(BaseModel):
    """Shared settings: unknown fields are errors and parsed configs are not edited in place."""

    model_config = ConfigDict(extra="forbid", frozen=True)
