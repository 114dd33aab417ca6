"""The beat schedule: what runs periodically, and how often."""

from __future__ import annotations

from typing import Any

from jobs.settings import Settings


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Every entry expires after one interval: a tick that no node picked up in time is dropped,
    not piled up behind long batches."""
    every = settings.beat_interval_s
    return {
        "sluice-check-timeouts": {
            "task": "sluice.check_timeouts",
            "schedule": every,
            "options": {"expires": every},
        },
        "sluice-reconcile-placement": {
            "task": "sluice.reconcile_placement",
            "schedule": every,
            "options": {"expires": every},
        },
    }
