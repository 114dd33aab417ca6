"""The maintenance loop: runs each due step once per tick, with the clock passed in."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from jobs.services import Services

from .timetable import Step

log = logging.getLogger(__name__)


class MaintenanceLoop:
    """Steps run one after another in the caller's thread; one that raises is logged, not fatal."""

    def __init__(self, services: Services, steps: Iterable[Step]) -> None:
        self._services = services
        self._steps = list(steps)
        self._due = {step.name: -math.inf for step in self._steps}  # every step runs on the first tick

    @property
    def step_names(self) -> list[str]:
        return [step.name for step in self._steps]

    def tick(self, now: float) -> float:
        """Run every step due at `now`; returns the seconds until the next one is due."""
        for step in self._steps:
            if now < self._due[step.name]:
                continue
            self._due[step.name] = now + step.every_s  # from now, not from when it was due: no catch-up bursts
            try:
                step.run(self._services, now)
            except Exception:  # last-resort boundary: Redis away, a bug in one step: the others run, and it
                # runs again next time
                log.exception("maintenance step %s failed; it runs again in %ss", step.name, step.every_s)
        if not self._steps:
            return math.inf
        return max(min(self._due.values()) - now, 0.0)
