"""Log lines gathered from every host: a batch or task job's (`/batch/<api>/<job_id>/logs`, or
`/tasks/<api>/<job_id>/logs`), a realtime API's replicas' or an AsyncAPI's nodes' (`/apis/<api>/logs`),
a page at a time (`foundation/log_streams.py`); an AsyncAPI request's (`/apis/<api>/requests/<id>/logs`).

Both answer `{"lines": [...], "next": "<position>"}`; passing `next` back as `after` gives only
the lines written since, which is how `sluice logs --follow` follows.
"""

from __future__ import annotations

from flask import Blueprint, Response

from foundation.api_kinds import ApiKind
from foundation.errors import BadRequest
from foundation.log_streams import api_stream, job_stream, request_stream

from .async_api import RequestNotFound
from .context import log_streams, registry, services
from .schemas import LogPage, LogsQuery, parse_query

blueprint = Blueprint("logs", __name__)


def _page(stream: str) -> Response:
    query = parse_query(LogsQuery)
    page = log_streams().read(stream, after=query.after, limit=query.limit)
    return LogPage(lines=page.lines, next=page.next).response()


@blueprint.get("/batch/<api_name>/<job_id>/logs")
@blueprint.get("/tasks/<api_name>/<job_id>/logs")
def job_logs(api_name: str, job_id: str) -> Response:
    """The job's lines from every worker (its batches and its `on_job_complete`, a task's run), oldest first."""
    api = registry().get(api_name)
    services().store.get(job_id, api_name=api.name)  # job_not_found, as every job endpoint answers
    return _page(job_stream(job_id))


@blueprint.get("/apis/<api_name>/logs")
def api_logs(api_name: str) -> Response:
    """An API's recent lines, oldest first: a realtime API's from every process of its replicas, an
    AsyncAPI's from every node while it ran the API's requests (each request's alone are at
    /apis/<api>/requests/<id>/logs)."""
    api = registry().get(api_name)
    if api.kind not in (ApiKind.REALTIME, ApiKind.ASYNC):
        prefix = "tasks" if api.kind == ApiKind.TASK else "batch"
        raise BadRequest(f"api {api.name} is a {api.kind}: its logs are per job, at /{prefix}/{api.name}/<job_id>/logs")
    return _page(api_stream(api.name))


@blueprint.get("/apis/<api_name>/requests/<request_id>/logs")
def request_logs(api_name: str, request_id: str) -> Response:
    """An AsyncAPI request's lines, logged by the node (its predictor included) while it ran the request."""
    api = registry().get(api_name)
    if api.kind != ApiKind.ASYNC:
        raise BadRequest(f"api {api.name} is a {api.kind}, not an {ApiKind.ASYNC}: it keeps no requests")
    if services().async_requests.get(api.name, request_id) is None:
        raise RequestNotFound(f"api {api.name} has no request {request_id} (never submitted, or expired)")
    return _page(request_stream(api.name, request_id))
