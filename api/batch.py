"""The Batch API: submit, watch, list and stop jobs, as Cortex spelled it.

Every operation is served at `/batch/<api_name>`, and the three of Cortex's endpoint (submit,
read, stop) at the API's own path `/<api_name>` too: `api/fallback.py` hands those here when the
name is a BatchAPI's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, request
from flask.typing import ResponseReturnValue

from foundation.api_kinds import ApiKind
from foundation.api_registry import DeployedApi
from foundation.errors import ApiNotFound, BadRequest, Conflict, JobNotFound
from jobs.batch.enqueue import plan_job, stop_job, submit_job
from jobs.batch.status import job_status_view
from jobs.batch.submission import parse_job_request
from jobs.store import JobState

from .context import registry, services
from .json_body import parse_json_body
from .metrics import JOBS_SUBMITTED
from .promises import idempotency_key, idempotent_submission, replay
from .schemas import (
    DryRun,
    FailedBatches,
    JobList,
    JobQuery,
    JobSpec,
    JobsQuery,
    JobStatusAnswer,
    Stopped,
    SubmitQuery,
    parse_query,
)

blueprint = Blueprint("batch", __name__)



def _json_body() -> Any:
    raw = request.get_data(cache=False)
    if not raw:
        raise BadRequest("request body is empty; expected a JSON job submission")
    return parse_json_body(raw)


def endpoint_url(api_name: str) -> str:
    """The API's endpoint as Cortex gave it: its own path at the address the request came to."""
    return f"{request.host_url.rstrip('/')}/{api_name}"


def batch_api(api_name: str) -> DeployedApi:
    """The deployed BatchAPI of that name; any other kind takes no jobs (`api_not_found`)."""
    api = registry().get(api_name)
    if api.kind != ApiKind.BATCH:
        raise ApiNotFound(f"{api_name} is a {api.kind}, not a BatchAPI: it takes no jobs")
    return api


@blueprint.post("/batch/<api_name>")
def submit(api_name: str) -> ResponseReturnValue:
    api = batch_api(api_name)
    query = parse_query(SubmitQuery)
    idempotency_key()  # a key that cannot be one is refused, dry run or not
    plan = plan_job(services(), parse_job_request(_json_body()), api.name)
    if query.dryRun:
        return DryRun.model_validate(plan.dry_run_view()).response()
    with idempotent_submission(f"batch:{api.name}") as claim:
        if claim.job is not None:
            return replay(JobSpec.model_validate(claim.job.spec()).response())
        job = submit_job(services(), plan, api.name, api.spec, api.bundle, api.queue, environment=api.environment,
                         job_id=claim.job_id)
    JOBS_SUBMITTED.labels(api=api.name).inc()
    return JobSpec.model_validate(job.spec()).response()


@blueprint.get("/batch/<api_name>")
def get_jobs(api_name: str) -> ResponseReturnValue:
    """With `jobID`: that job's status; without: the API's jobs, newest first."""
    api = batch_api(api_name)
    store = services().store
    query = parse_query(JobsQuery)
    if query.jobID is not None:
        state = store.state(query.jobID, api_name=api.name)
        note = None if state.status.is_terminal else services().worker_hosts.note_of(state.job.job_id)
        return JobStatusAnswer.model_validate(
            {"job_status": job_status_view(state, note), "endpoint": endpoint_url(api.name), "api_spec": api.spec}
        ).response()
    return JobList.model_validate({"jobs": listed_jobs(api.name, query.limit, job_status_view)}).response()


def listed_jobs(api_name: str, limit: int, view: Callable[[JobState], dict[str, Any]]) -> list[dict[str, Any]]:
    """The API's newest `limit` jobs, each as `view` shows it; one that expired since it was listed is left out."""
    store = services().store
    views = []
    for job_id in store.list_ids(api_name, limit=limit):
        try:
            views.append(view(store.state(job_id)))
        except JobNotFound:  # expired since it was listed
            continue
    return views


def stop_job_of(api: DeployedApi) -> Response:
    """`DELETE ...?jobID=` of a batch or task API: the job stopped, or a 409 if it has already ended."""
    state = services().store.state(parse_query(JobQuery).jobID, api_name=api.name)
    if not stop_job(services(), state.job):
        current = services().store.state(state.job.job_id)
        raise Conflict(f"job {state.job.job_id} has already ended ({current.status.value})")
    return Stopped(message=f"stopped job {state.job.job_id}").response()


@blueprint.delete("/batch/<api_name>")
def stop(api_name: str) -> ResponseReturnValue:
    return stop_job_of(batch_api(api_name))


@blueprint.get("/batch/<api_name>/failed")
def failed_batches(api_name: str) -> ResponseReturnValue:
    """The batches of a job that failed after all their tries, with error and payload."""
    api = batch_api(api_name)
    state = services().store.state(parse_query(JobQuery).jobID, api_name=api.name)
    return FailedBatches.model_validate(
        {"job_id": state.job.job_id, "failed_batches": services().store.failed_batches(state.job.job_id)}
    ).response()


# Cortex's endpoint, `/<api_name>`, as the fallback dispatches it (after checking the API key).
AT_API_PATH: dict[str, Callable[[str], ResponseReturnValue]] = {"POST": submit, "GET": get_jobs, "DELETE": stop}
