"""The Batch API: submit, watch, list and stop jobs (`/batch/<api_name>`), as Cortex spelled it."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, request

from jobs.enqueue import plan_job, stop_job, submit_job
from jobs.status import job_status_view
from jobs.submission import parse_job_request
from predictors_runtime.errors import BadRequest, Conflict

from .context import registry, services
from .json_body import parse_json_body
from .metrics import JOBS_SUBMITTED

blueprint = Blueprint("batch", __name__)


# Jobs `GET /batch/<api>` lists at most.
MAX_LIST_LIMIT = 1000


def _json_body() -> Any:
    raw = request.get_data(cache=False)
    if not raw:
        raise BadRequest("request body is empty; expected a JSON job submission")
    return parse_json_body(raw)


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    """A query parameter that must be an integer in [low, high]: Redis refuses numbers past 64 bits."""
    raw = request.args.get(name)
    if raw is None:
        return default
    text = raw.strip()
    if not (text.isascii() and text.lstrip("-").isdigit()) or len(text) > 20 or not low <= int(text) <= high:
        raise BadRequest(f"query parameter {name} must be an integer from {low} to {high} (got {raw[:40]!r})")
    return int(text)


def _job_id() -> str:
    job_id = request.args.get("jobID")
    if not job_id:
        raise BadRequest("query parameter jobID is required")
    return job_id


def _endpoint(api_name: str) -> str:
    return f"{request.host_url.rstrip('/')}/batch/{api_name}"


@blueprint.post("/batch/<api_name>")
def submit(api_name: str):
    api = registry().get(api_name)
    plan = plan_job(services(), parse_job_request(_json_body()), api.name)
    if request.args.get("dryRun", "").lower() == "true":
        return jsonify(plan.dry_run_view())
    job = submit_job(services(), plan, api.name, api.spec, api.bundle, api.queue)
    JOBS_SUBMITTED.labels(api=api.name).inc()
    return jsonify(job.spec())


@blueprint.get("/batch/<api_name>")
def get_jobs(api_name: str):
    """With `jobID`: that job's status; without: the API's jobs, newest first."""
    api = registry().get(api_name)
    store = services().store
    if "jobID" in request.args:
        state = store.state(_job_id(), api_name=api.name)
        return jsonify({"job_status": job_status_view(state), "endpoint": _endpoint(api.name), "api_spec": api.spec})
    limit = _int_arg("limit", 100, 1, MAX_LIST_LIMIT)
    views = []
    for job_id in store.list_ids(api.name, limit=limit):
        try:
            views.append(job_status_view(store.state(job_id)))
        except Exception:  # expired since it was listed
            continue
    return jsonify({"jobs": views})


@blueprint.delete("/batch/<api_name>")
def stop(api_name: str):
    api = registry().get(api_name)
    state = services().store.state(_job_id(), api_name=api.name)
    if not stop_job(services(), state.job):
        current = services().store.state(state.job.job_id)
        raise Conflict(f"job {state.job.job_id} has already ended ({current.status.value})")
    return jsonify({"message": f"stopped job {state.job.job_id}"})


@blueprint.get("/batch/<api_name>/failed")
def failed_batches(api_name: str):
    """The batches of a job that failed after all their tries, with error and payload."""
    api = registry().get(api_name)
    state = services().store.state(_job_id(), api_name=api.name)
    return jsonify({"job_id": state.job.job_id, "failed_batches": services().store.failed_batches(state.job.job_id)})
