"""The Task API: submit, read, list and stop a TaskAPI's jobs, as Cortex spelled it.

Every operation is served at `/tasks/<api_name>`, and Cortex's three (submit, read, stop) at the
API's own path `/<api_name>` too: `api/fallback.py` hands those here when the name is a TaskAPI's.
A task job is a job of the batch machinery (`jobs/batch/taskapi_jobs.py`): reading and stopping one is
the batch API's reading and stopping, with Cortex's task shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from foundation.api_kinds import ApiKind
from foundation.api_registry import DeployedApi
from foundation.errors import ApiNotFound
from jobs.batch.status import task_status_view
from jobs.batch.taskapi_jobs import parse_task_request, submit_task
from predictors_runtime.config import cortex_api_spec

from .batch import endpoint_url, listed_jobs, stop_job_of
from .context import registry, services
from .json_body import parse_json_body
from .metrics import JOBS_SUBMITTED
from .promises import idempotent_submission, replay
from .schemas import (
    JobsQuery,
    TaskJobList,
    TaskJobSpec,
    TaskJobStatusAnswer,
    parse_query,
)

blueprint = Blueprint("tasks", __name__)


def task_api(api_name: str) -> DeployedApi:
    """The deployed TaskAPI of that name; any other kind runs no tasks (`api_not_found`)."""
    api = registry().get(api_name)
    if api.kind != ApiKind.TASK:
        raise ApiNotFound(f"{api_name} is a {api.kind}, not a TaskAPI: it runs no tasks")
    return api


def _body() -> Any:
    """The submission's JSON; an empty body is a task with no options (Cortex's `{}`)."""
    raw = request.get_data(cache=False)
    return parse_json_body(raw) if raw.strip() else None


@blueprint.post("/tasks/<api_name>")
def submit(api_name: str) -> ResponseReturnValue:
    api = task_api(api_name)
    task = parse_task_request(_body())
    with idempotent_submission(f"task:{api.name}") as claim:
        if claim.job is not None:
            return replay(TaskJobSpec.model_validate(claim.job.spec()).response())
        job = submit_task(services(), task, api.name, api.spec, api.bundle, api.queue, environment=api.environment,
                          job_id=claim.job_id)
    JOBS_SUBMITTED.labels(api=api.name).inc()
    return TaskJobSpec.model_validate(job.spec()).response()


@blueprint.get("/tasks/<api_name>")
def get_jobs(api_name: str) -> ResponseReturnValue:
    """With `jobID`: that task job's status; without: the API's task jobs, newest first."""
    api = task_api(api_name)
    store = services().store
    query = parse_query(JobsQuery)
    if query.jobID is not None:
        state = store.state(query.jobID, api_name=api.name)
        return TaskJobStatusAnswer.model_validate(
            {"job_status": task_status_view(state), "endpoint": endpoint_url(api.name),
             "api_spec": cortex_api_spec(api.spec)}
        ).response()
    return TaskJobList.model_validate({"jobs": listed_jobs(api.name, query.limit, task_status_view)}).response()


@blueprint.delete("/tasks/<api_name>")
def stop(api_name: str) -> ResponseReturnValue:
    return stop_job_of(task_api(api_name))


# Cortex's endpoint, `/<api_name>`, as the fallback dispatches it (after checking the API key).
AT_API_PATH: dict[str, Callable[[str], ResponseReturnValue]] = {"POST": submit, "GET": get_jobs, "DELETE": stop}
