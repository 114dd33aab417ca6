"""Beat's maintenance runs in beat's own process, one step at a time, with the clock passed in."""

from __future__ import annotations

import logging

import pytest
import redis

from beat.loop import MaintenanceLoop
from beat.scheduler import MaintenanceScheduler
from beat.timetable import Step, maintenance_steps
from foundation.settings import Settings
from jobs.celery_app import create_celery

T0 = 1_700_000_000.0


def test_each_step_runs_when_due_and_the_loop_says_when_the_next_is_due() -> None:
    ran: list[tuple[str, float]] = []
    loop = MaintenanceLoop(
        services=None,  # type: ignore[arg-type]
        steps=[
            Step("often", lambda services, now: ran.append(("often", now)), every_s=1.0),
            Step("rarely", lambda services, now: ran.append(("rarely", now)), every_s=5.0),
        ],
    )

    assert loop.tick(T0) == 1.0
    assert loop.tick(T0 + 0.5) == 0.5
    assert loop.tick(T0 + 1) == 1.0
    assert loop.tick(T0 + 5.2) == 1.0

    assert ran == [("often", T0), ("rarely", T0), ("often", T0 + 1), ("often", T0 + 5.2), ("rarely", T0 + 5.2)]


def test_a_step_that_raises_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    def broken(services: object, now: float) -> None:
        raise redis.ConnectionError("Redis went away")

    loop = MaintenanceLoop(None, [Step("broken", broken, 1.0), Step("fine", lambda s, now: ran.append("fine"), 1.0)])  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR):
        loop.tick(T0)
        loop.tick(T0 + 1)

    assert ran == ["fine", "fine"]
    assert "maintenance step broken failed" in caplog.text


def test_the_default_steps_judge_timeouts_before_placement() -> None:
    names = [step.name for step in maintenance_steps(Settings(beat_interval_s=2.0))]

    assert names.index("check-timeouts") < names.index("reconcile-placement")
    assert {step.every_s for step in maintenance_steps(Settings(beat_interval_s=2.0))} == {2.0}


def test_no_periodic_task_goes_to_the_worker_nodes() -> None:
    app = create_celery(Settings())

    assert app.conf.beat_schedule == {}
    assert app.conf.beat_scheduler == "beat.scheduler:MaintenanceScheduler"
    assert sorted(name for name in app.tasks if name.startswith("sluice.")) == [
        "sluice.finish_job", "sluice.run_async", "sluice.run_async_queued", "sluice.run_batch"]
    assert MaintenanceScheduler(app).schedule == {}  # not even Celery's backend_cleanup
