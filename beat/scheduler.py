"""`celery -A jobs beat` with Sluice's maintenance in its own process.

Beat used to send the maintenance steps as tasks to a queue the worker nodes consumed, so the
nodes policed themselves: a node whose predictor hung held the step that should time its job out.
Here beat's scheduler runs the steps itself, on every tick of beat's loop, where no user code
runs; Celery's own periodic entries (none by default) are sent as usual. The app names this class
in `beat_scheduler` (`jobs/celery_app.py`), so `celery -A jobs beat` stays the way to run it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.beat import Scheduler

from foundation.settings import Settings
from jobs.wiring import init_services

from .loop import MaintenanceLoop
from .timetable import maintenance_steps

log = logging.getLogger(__name__)


class MaintenanceScheduler(Scheduler):  # type: ignore[misc]  # Celery ships no types
    """Celery's in-memory scheduler, ticking Sluice's `MaintenanceLoop` too."""

    def __init__(self, app: Celery, *args: Any, clock: Callable[[], float] = time.time, **kwargs: Any) -> None:
        self._clock = clock
        self._maintenance: MaintenanceLoop | None = None
        super().__init__(app, *args, **kwargs)

    def install_default_entries(self, data: Any) -> None:
        """None: Celery would add `celery.backend_cleanup` for a result backend Sluice does not use."""

    @property
    def maintenance(self) -> MaintenanceLoop:
        if self._maintenance is None:
            settings = Settings.from_env()
            self._maintenance = MaintenanceLoop(init_services(self.app, settings), maintenance_steps(settings))
            log.info("beat runs maintenance in its own process: %s", ", ".join(self._maintenance.step_names))
        return self._maintenance

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Send Celery's due entries, run the due maintenance steps; seconds until either is due."""
        wait = float(super().tick(*args, **kwargs))
        return min(wait, self.maintenance.tick(self._clock()))
