"""`GET/POST /<name>` when the proxy has no replica to send them to.

The proxy routes `/<name>` of a realtime API to its ready replicas; anything else comes here,
so these answers say why there was no replica: the API is a BatchAPI (jobs go to
`/batch/<name>`), is not deployed, or is a realtime API whose replicas are not ready yet.
"""

from __future__ import annotations

import time
import uuid

from flask import Blueprint, jsonify, request
from werkzeug.exceptions import MethodNotAllowed

from predictors_runtime.config import RESERVED_NAMES
from predictors_runtime.errors import ApiNotFound

from .apis import REALTIME_KIND
from .context import registry, services
from .replicas import ReplicaDirectory

blueprint = Blueprint("fallback", __name__)

RESERVED_METHODS = {"apis": ["GET", "POST"], "openapi.json": ["GET"], "healthz": ["GET"], "metrics": ["GET"]}


def _answer(status: int, kind: str, message: str, request_id: str | None = None):
    body = {"kind": kind, "message": message}
    if request_id is not None:
        body["request_id"] = request_id
    response = jsonify(body)
    response.status_code = status
    if request_id is not None:
        response.headers["X-Request-ID"] = request_id
    return response


@blueprint.route("/<name>", methods=["GET", "POST"])
def unrouted_api(name: str):
    if name in RESERVED_NAMES:  # e.g. POST /healthz: the reserved paths keep their own methods
        raise MethodNotAllowed(valid_methods=RESERVED_METHODS.get(name, ["GET"]))
    try:
        api = registry().get(name)
    except ApiNotFound:
        return _answer(404, ApiNotFound.kind, f"api {name} is not deployed")
    if api.kind != REALTIME_KIND:
        return _answer(404, ApiNotFound.kind, f"{name} is a {api.kind}: submit jobs with POST /batch/{name}")
    request_id = request.headers.get("X-Request-ID") or uuid.uuid4().hex
    replicas = ReplicaDirectory(services().redis).live(time.time(), name)
    reasons = [r.message for r in replicas if r.message and not r.ready]
    if not replicas:
        message = f"api {name} has no replica running yet"
    elif reasons:
        message = f"api {name} is not ready: {reasons[0]}"
    else:
        message = f"api {name} is not ready yet (its replicas are starting)"
    return _answer(503, "not_ready", message, request_id)
