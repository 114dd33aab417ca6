"""An AsyncAPI at Sluice's public address, as Cortex served it.

`POST /<name>` stores the request and answers `{"id"}` at once (the client's `X-Request-ID` is
the id when it is a valid one); `GET /<name>/<id>` answers its status, and once completed its
result and when it completed. The proxy routes both here (an AsyncAPI has no replicas); the POST
is answered in front of Flask (`api/async_front.py`), or, when that layer leaves it to Flask (a
refused key, a body over the limit), by `api/fallback.py`'s `/<name>`. Requests run on worker nodes
(`jobs/asyncapi/runner.py`).
"""

from __future__ import annotations

import json
import time
from typing import Any

from flask import Blueprint, Response, request

from foundation.api_kinds import ApiKind
from foundation.api_registry import DeployedApi
from foundation.errors import ApiNotFound, NotFound
from foundation.idempotency import HEADER, checked_key, derived_id
from jobs.asyncapi.request import RequestStatus
from jobs.asyncapi.submit import Submission, submit_request

from .context import registry, services
from .schemas import AsyncRequestStatus, AsyncSubmitted

blueprint = Blueprint("async_api", __name__)


class RequestNotFound(NotFound):
    """No AsyncAPI request of that id is kept (never submitted, or its retention has passed)."""

    kind = "request_not_found"


def is_batched(api: DeployedApi) -> bool:
    """Whether an AsyncAPI has `server_side_batching` (its requests are queued for nodes to claim)."""
    return (api.spec.get("predictor") or {}).get("server_side_batching") is not None


def request_id_asked(request_id: str | None, idempotency_key: str | None) -> str | None:
    """The id a submission asks for: its `X-Request-ID`, else one its `Idempotency-Key` alone gives
    (a request of an id that exists is not made again, so the same key gives the same request)."""
    key = checked_key(idempotency_key)
    return request_id if request_id or key is None else derived_id(key)


def submit(api_name: str, batched: bool = False) -> Response:
    """`POST /<name>` of an AsyncAPI (`api/fallback.py` hands it here); `batched`: it has `server_side_batching`."""
    svc = services()
    submission = Submission(
        api_name=api_name, body=request.get_data(cache=False),
        content_type=request.headers.get("Content-Type"),
        client_request_id=request_id_asked(request.headers.get("X-Request-ID"), request.headers.get(HEADER)),
        batched=batched,
    )
    request_id = submit_request(svc.async_requests, svc.request_objects, svc.celery, submission, time.time(),
                                svc.task_messages)
    response = AsyncSubmitted(id=request_id).response()
    response.headers["X-Request-ID"] = request_id
    return response


@blueprint.route("/<unreserved:api_name>/<request_id>", methods=["GET"])
def get_request(api_name: str, request_id: str) -> Any:
    """A request's status; `result` and `timestamp` once completed, `message` once failed."""
    api = registry().get(api_name)
    if api.kind != ApiKind.ASYNC:
        raise ApiNotFound(f"{api_name} is a {api.kind}, not an {ApiKind.ASYNC}: it keeps no requests")
    svc = services()
    record = svc.async_requests.get(api_name, request_id)
    if record is None:
        raise RequestNotFound(f"api {api_name} has no request {request_id} (never submitted, or expired)")
    answer: dict[str, Any] = {"id": request_id, "status": record.status.value}
    if record.status is RequestStatus.COMPLETED:
        encoded = record.result if record.result is not None else svc.request_objects.read(record.result_uri)
        answer["result"] = json.loads(encoded)
        answer["timestamp"] = record.timestamp
    elif record.status is RequestStatus.FAILED:
        answer["message"] = record.message
        answer["timestamp"] = record.timestamp
    return AsyncRequestStatus.model_validate(answer).response()
