"""What every section model of `cortex.yaml` shares: the pydantic settings and the sub-field problem.

Kept apart from `config.py` so that a section with a module of its own (`autoscaling_config.py`)
validates and reports errors exactly as the sections inside `config.py` do, without importing it.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

# Names become URL paths (`/<name>`, `/batch/<name>`) and Redis keys, so they are kept plain.
API_NAME_RE = re.compile(r"^[a-z][a-z0-9-]*$")
MAX_API_NAME = 63
RESERVED_NAMES = frozenset({"apis", "batch", "docs", "healthz", "metrics", "openapi.json", "tasks"})


class FieldProblem(ValueError):
    """A validator's complaint about a sub-field, so the error path can name that field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ConfigModel(BaseModel):
    """Shared settings: unknown fields are errors and parsed configs are not edited in place."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def checked_api_name(value: str) -> str:
    """`value` as an API's name, or a ValueError saying which rule it breaks."""
    if len(value) > MAX_API_NAME:
        raise ValueError(f"must be at most {MAX_API_NAME} characters (got {len(value)})")
    if not API_NAME_RE.match(value):
        raise ValueError(
            "must contain only lowercase letters, digits and '-', "
            f"and start with a letter (got {value!r})"
        )
    if value in RESERVED_NAMES:
        raise ValueError(f"{value!r} is reserved (reserved: {', '.join(sorted(RESERVED_NAMES))})")
    return value
