"""A node started with task events on (`SLUICE_TASK_EVENTS=1`) runs its batches through Celery's own
request and tracer, not Sluice's batch strategy (`jobs/transport/batch_strategy.py`), and the job runs
as on any node. The tracer's own log line for each batch (at INFO, the stack's level) says which path
ran; the batch strategy writes none."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.embedded import Stack, free_port

from .conftest import FAST_LOOPS, ROOM, closing_client, read_events, write_project


def _tracer_lines(stack: Stack, task: str) -> list[str]:
    """The worker log's lines in which Celery's tracer says a `task` succeeded."""
    log = (stack.data_dir / "logs" / "worker1.log").read_text(errors="replace")
    return [line for line in log.splitlines() if f"Task {task}[" in line and "succeeded in" in line]


@pytest.fixture(scope="module")
def events_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("events-stack")
    env = {**FAST_LOOPS, "SLUICE_TASK_EVENTS": "1"}
    with Stack(port=free_port(), offers=ROOM, workers=1, proxy=False, realtime=False, data_dir=data_dir,
               env=env) as running:
        yield running
        print(running.logs())


def test_with_task_events_on_every_batch_runs_through_celerys_tracer(events_stack: Stack, tmp_path: Path) -> None:
    client = closing_client(events_stack.url)
    events = tmp_path / "events.jsonl"
    client.deploy(write_project(tmp_path / "p", "with-events", {"events": str(events)}))

    job = client.submit("with-events", list(range(12)), batch_size=4)
    status = client.wait_job("with-events", job["job_id"], timeout=60)

    assert status["status"] == "status_succeeded" and status["batch_metrics"]["succeeded"] == 3
    predicted = [item for e in read_events(events) if e["event"] == "predict" for item in e["items"]]
    assert sorted(predicted) == list(range(12))
    for _ in range(50):  # the log line follows the batch's record by a moment
        if len(_tracer_lines(events_stack, "sluice.run_batch")) >= 3:
            break
        time.sleep(0.1)
    assert len(_tracer_lines(events_stack, "sluice.run_batch")) == 3
