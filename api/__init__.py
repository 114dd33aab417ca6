"""Sluice's HTTP side: the management API (`gunicorn 'api:create_app()'`) and the realtime
replica app (`api/realtime.py`).

`create_app` is imported on first use, so a replica process, which needs `api.realtime` alone,
loads nothing of the management app (its blueprints, schemas and OpenAPI generator).
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
