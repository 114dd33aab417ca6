"""The maintenance schedule: which steps beat's process runs, in order, and how often.

A new periodic concern is one more `Step` here: a function `(services, now)` in `beat/steps.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from jobs.services import Services
from foundation.settings import Settings

from . import steps
from .completions import completion_grace_s, resend_completions
from .lost_batches import LostBatchWatch, lost_grace_s


@dataclass(frozen=True)
class Step:
    """One periodic step: `run(services, now)` every `every_s` seconds."""

    name: str
    run: Callable[[Services, float], object]
    every_s: float


def maintenance_steps(settings: Settings) -> list[Step]:
    """Timeouts are judged before placement, so a job ended in this round frees its nodes for the next."""
    every = settings.beat_interval_s
    stale_after_s = settings.enqueue_stale_s
    grace_s = completion_grace_s(settings)
    return [
        Step("check-timeouts", steps.check_timeouts, every),
        Step("fail-stalled-enqueues", lambda services, now: steps.fail_stalled_enqueues(services, now, stale_after_s), every),
        Step("reconcile-placement", steps.reconcile_placement, every),
        Step("resend-completions", lambda services, now: resend_completions(services, now, grace_s), every),
        Step("recover-lost-batches", LostBatchWatch(lost_grace_s(settings)), every),
    ]
