"""The one wiring point of a process: its `Services`, built once, and its worker runtime over them.

In the spirit of Flask's `celery_init_app`: every part of a process that needs the connected
services (a worker node's hooks, its tasks, beat's scheduler, the management API) asks here for
the ones of its Celery app, and the first to ask builds them. So a process has one set of Redis
clients, one job store and one placement, however many hooks it runs; nothing is connected at
import time, and Redis is contacted only when first used.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from celery import Celery

from foundation.settings import Settings
from jobs.services import Services

if TYPE_CHECKING:
    from jobs.runner import WorkerRuntime

_lock = threading.RLock()
_ATTRIBUTE = "_sluice_wired"  # kept on the app: it lives and goes with the app


@dataclass
class _Wired:
    """What this process built for one app (a forked child builds its own)."""

    pid: int
    services: Services
    runtime: WorkerRuntime | None = None


def _wired(app: Celery, settings: Settings) -> _Wired:
    wired: _Wired | None = getattr(app, _ATTRIBUTE, None)
    if wired is None or wired.pid != os.getpid():
        wired = _Wired(os.getpid(), Services.connect(settings, app))
        setattr(app, _ATTRIBUTE, wired)
    return wired


def init_services(app: Celery, settings: Settings) -> Services:
    """This process's `Services` for `app`: built from `settings` on the first call, the same ones after."""
    with _lock:
        return _wired(app, settings).services


def worker_runtime(app: Celery, settings: Settings) -> WorkerRuntime:
    """This process's worker runtime for `app`, made on its first task (after any fork: it loads models)."""
    from jobs.runner import WorkerRuntime  # only a worker runs tasks: the API and beat never load it

    with _lock:
        wired = _wired(app, settings)
        if wired.runtime is None:
            wired.runtime = WorkerRuntime.start(wired.services)
        return wired.runtime
