"""A TaskAPI's job: one run of its `Task`, carried by the batch job machinery as a job of one batch.

Cortex ran a task as a one-off job; Sluice runs it as a job whose only batch carries nothing and
whose predictor is the API's `Task` (`predictors_runtime/task_predictor.py`). Everything a batch
job has, a task job has the same way: the job record and its statuses, placement on one node of
the API's hardware queue, the job's `timeout` (beat times it out, and the node's watchdog ends a
task still running), stop, the job's log stream, a node that dies giving its work back. What is
the task's own: the submission body (`{"timeout"?, "config"?}`), Cortex's spec and status shapes
(`Job.spec`, `jobs.batch.status.task_status_view`), and a `Task` that raises ending the job
`status_worker_error` with its error as the job's message (`jobs/batch/completion.py`).
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from foundation.api_kinds import ApiKind
from foundation.errors import BadRequest
from jobs.batch.enqueue import start_job
from jobs.batch.job import Job, new_job_id
from jobs.batch.submission import MAX_JOB_TIMEOUT_S, describe_error
from jobs.services import Services

# The `source` a task job's record carries in place of a batch job's input source.
TASK_SOURCE = "task"


class TaskRequest(BaseModel):
    """A task submission: `timeout` (seconds from submission) and `config` merged over the API's."""

    model_config = ConfigDict(extra="forbid")

    timeout: int | None = Field(default=None, ge=1, le=MAX_JOB_TIMEOUT_S)
    config: dict[str, Any] = Field(default_factory=dict)


def parse_task_request(body: Any) -> TaskRequest:
    """Validate a decoded JSON body (None: an empty body, a task with no options); every problem is
    a `BadRequest` naming the field."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise BadRequest("the task submission must be a JSON object")
    try:
        return TaskRequest.model_validate(body)
    except ValidationError as e:
        raise BadRequest("; ".join(describe_error(err, TaskRequest) for err in e.errors())) from e


def task_job(request: TaskRequest, api_name: str, api_spec: dict[str, Any], bundle: str, hardware_queue: str,
             now: float, environment: dict[str, Any] | None = None, job_id: str | None = None) -> Job:
    """The job record of a task: one worker, one batch, one try, no batch time limit (`timeout` is its limit)."""
    return Job(
        job_id=job_id or new_job_id(now),
        api_name=api_name,
        workers=1,
        config=request.config,
        timeout=request.timeout,
        total_batch_count=1,
        start_time=now,
        api_spec=api_spec,
        bundle=bundle,
        hardware_queue=hardware_queue,
        tries=1,
        source=TASK_SOURCE,
        batch_timeout=None,
        kind=ApiKind.TASK,
        environment=environment,
    )


def submit_task(
    services: Services, request: TaskRequest, api_name: str, api_spec: dict[str, Any], bundle: str,
    hardware_queue: str, now: float | None = None, environment: dict[str, Any] | None = None,
    job_id: str | None = None,
) -> Job:
    """Create the task's job and publish its one batch; returns once it is queued (`status_running`).
    `job_id`: the id to give it (one an idempotency key was claimed for); else a new one."""
    now = time.time() if now is None else now
    job = task_job(request, api_name, api_spec, bundle, hardware_queue, now, environment, job_id)
    start_job(services, job, [(None, None)], now, background=False)
    return job
