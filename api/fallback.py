"""`/<name>` when the proxy has no replica to send it to.

The proxy routes `/<name>` of a realtime API to its ready replicas; anything else comes here.
A BatchAPI's `/<name>` is Cortex's job endpoint (`POST` submits, `GET ?jobID=` reads, `DELETE
?jobID=` stops), served by the Batch API's own handlers behind the API key; a TaskAPI's likewise
by the Task API's. For the rest these
answers say why there was no replica: the API is not deployed, or is a realtime API whose
replicas are not ready yet.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable

from flask import Blueprint, Response, make_response, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import MethodNotAllowed
from werkzeug.routing import BaseConverter

from foundation import figure_sink as figures
from foundation.api_kinds import ApiKind
from foundation.errors import ApiNotFound
from foundation.figures import REALTIME_REJECTED, REALTIME_REQUESTS
from foundation.proxy_registry import RedisProxyRegistry, routed_everywhere
from foundation.replica_directory import ReplicaRecord
from predictors_runtime.config_base import RESERVED_NAMES
from predictors_runtime.grpc_proto import grpc_path_prefix, is_grpc
from predictors_runtime.loader import one_line

from . import async_api, auth, batch, tasks
from .context import replica_directory, routed_api, services
from .schemas import Readiness, RealtimeError

blueprint = Blueprint("fallback", __name__)


class UnreservedName(BaseConverter):
    """A path segment that is not one of Sluice's own (`apis`, `healthz`, ...).

    Only such names reach the fallback, so `POST /healthz` is Flask's own 405 whose `Allow` lists
    what /healthz answers (a fallback route matching every name made it offer POST as well).
    """

    regex = "(?!(?:" + "|".join(re.escape(n) for n in sorted(RESERVED_NAMES)) + ")$)[^/]+"


def _answer(status: int, kind: str, message: str, request_id: str | None = None) -> Response:
    body = RealtimeError(kind=kind, message=message)
    if request_id is not None:
        body.request_id = request_id
    response = body.response(status)
    if request_id is not None:
        response.headers["X-Request-ID"] = request_id
    return response


# What `/<name>` of a realtime API answers (its replicas serve these two).
REALTIME_METHODS = ("GET", "POST")


def _grpc_api_path(name: str, replicas: list[ReplicaRecord], request_id: str) -> Response | None:
    """`/<name>` of a gRPC API, whose calls are routed by their gRPC paths (`/<package>.<Service>/<Method>`):
    a POST is refused saying so, and a GET says it is ready (for `sluice get` and the client), as an
    HTTP API's replicas do. None: not ready, for the caller to say why."""
    if request.method == "POST":
        return _answer(400, "bad_request", f"api {name} is served over gRPC: call its service at this address with "
                       f"a gRPC client (its methods are at {grpc_path_prefix(name)}<Service>/<Method>)", request_id)
    # Ready once a ready replica is what every proxy routes its calls to (an HTTP API's readiness
    # comes from a replica through the proxy, so it cannot be told before the proxy routes it).
    ready = [r.replica_id for r in replicas if r.ready and not r.draining]
    proxies = RedisProxyRegistry(services().redis).live(time.time())
    if any(routed_everywhere(proxies, {replica_id}) for replica_id in ready):
        return Readiness(ready=True, models=[]).response()
    if ready:
        return _answer(503, "not_ready", f"api {name} has a ready replica that no proxy routes yet", request_id)
    return None


@blueprint.route("/<unreserved:api_name>", methods=["GET", "POST", "DELETE"])
def unrouted_api(api_name: str) -> Response:
    name = api_name
    try:
        api = routed_api(name)
    except ApiNotFound:
        return _answer(404, ApiNotFound.kind, f"api {name} is not deployed")
    endpoints: dict[str, dict[str, Callable[[str], ResponseReturnValue]]] = {
        ApiKind.BATCH: batch.AT_API_PATH, ApiKind.TASK: tasks.AT_API_PATH}
    job_endpoints = endpoints.get(api.kind)
    if job_endpoints is not None:
        # Open only as far as realtime APIs are: a job submission always wants the key.
        refusal = auth.key_refusal(services().settings.api_keys)
        if refusal is not None:
            return refusal
        return make_response(job_endpoints[request.method](name))
    if api.kind == ApiKind.ASYNC:
        # As a BatchAPI's: submitting wants the key whenever keys are set.
        refusal = auth.key_refusal(services().settings.api_keys)
        if refusal is not None:
            return refusal
        if request.method != "POST":
            raise MethodNotAllowed(valid_methods=["POST"])
        return async_api.submit(name, batched=async_api.is_batched(api))
    if api.kind == ApiKind.TRAFFIC_SPLITTER:
        # The proxy shares a splitter's requests; one reaches here only before the proxy has taken in
        # a new splitter, or when sent to the management API's own address.
        return _answer(503, "not_ready", f"traffic splitter {name} is shared among its APIs by the proxy, which has "
                       "not routed it yet: retry shortly, at the proxy's address")
    if api.kind != ApiKind.REALTIME:
        return _answer(404, ApiNotFound.kind, f"{name} is a {api.kind}: it answers nothing at /{name}")
    if request.method not in REALTIME_METHODS:
        raise MethodNotAllowed(valid_methods=list(REALTIME_METHODS))
    request_id = request.headers.get("X-Request-ID") or uuid.uuid4().hex
    replicas = replica_directory().live(time.time(), name)
    if is_grpc(api.spec):
        answered = _grpc_api_path(name, replicas, request_id)
        if answered is not None:
            return answered
    reasons = [r.message for r in replicas if r.message and not r.ready]
    if not replicas:
        message = f"api {name} has no replica running yet"
    elif reasons:
        # One line for the caller; the whole reason (a traceback, the server's paths) is in the
        # replica's record, which `GET /apis/<name>` shows behind the API keys.
        message = f"api {name} is not ready: {one_line(reasons[0])}"
    else:
        message = f"api {name} is not ready yet (its replicas are starting)"
    # A realtime request refused for want of a ready replica: counted as the proxy's refusals are.
    figures.count(REALTIME_REQUESTS.name, (name, "503"))
    figures.count(REALTIME_REJECTED.name, (name, "not_ready"))
    return _answer(503, "not_ready", message, request_id)
