"""Sluice's Celery side: `celery -A jobs worker -Q cpu|gpu|inf` and `celery -A jobs beat`.

The app is made on first access of `jobs.app` from `SLUICE_*` settings, so importing this
package connects to nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app"]

_app = None


def __getattr__(name: str) -> Any:
    global _app
    if name in ("app", "celery"):
        if _app is None:
            from foundation.settings import Settings
            from jobs.celery_app import create_celery

            _app = create_celery(Settings.from_env())
        return _app
    raise AttributeError(name)
