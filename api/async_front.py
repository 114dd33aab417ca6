"""`POST /<name>` of an AsyncAPI, answered in front of Flask: the one management route that clients
call at the rate of their own traffic.

A submission's own work is small (read the body, one Redis script, a two-field answer), and
Flask's around it (a request context, URL matching, the before- and after-request hooks, a
response object) was a quarter of the CPU that the whole system spent per request under
`bench/async_api.py`'s stream of submissions: the API's processes share the hosts' cores with the
proxy, Redis and the worker nodes. This WSGI layer, wrapped around Flask's own (`Flask.wsgi_app`),
answers the common case itself and hands every other request to Flask untouched:

- taken here: `POST` to exactly `/<name>` of a deployed AsyncAPI (the same kept routes as
  `api/fallback.py`'s), with a `Content-Length` within `SLUICE_MAX_BODY_BYTES`, from a caller
  the API-key check admits (a valid key when keys are set; without keys, a connection that
  arrived on loopback, or `SLUICE_ALLOW_ANONYMOUS`);
- left to Flask, which answers them as before: every other method, path and API kind, a refused
  key (401) or open bind (403), a body over the limit (413) or sent chunked.

A submission costs one round trip to Redis: the route this process keeps is used without asking
the registry whether it moved on (a second round trip, a tenth of this layer's CPU), and the
submission's script stores nothing unless the registry is still at the generation the route was
read at; when it is not (a deploy or delete since), Flask answers the request on the route as it is
now.

What submitting raises is answered as Flask's handlers answer it (`api.errors.error_of`); the
answer's body is `schemas.AsyncSubmitted`'s, and it is counted in `sluice_http_responses_total`
like any other.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

from flask import Flask

from foundation.api_keys import authenticate
from foundation.api_kinds import ApiKind
from foundation.api_registry import DeployedApi
from foundation.errors import ApiNotFound, NotAcknowledged, Unauthorized
from foundation.idempotency import HEADER
from foundation.settings import Settings
from jobs.asyncapi.store import RouteChanged
from jobs.asyncapi.submit import Submission, submit_request
from jobs.services import Services
from predictors_runtime.config_base import RESERVED_NAMES

from . import context
from .async_api import is_batched, request_id_asked
from .auth import open_bind_address
from .errors import error_of
from .metrics import HTTP_RESPONSES
from .schemas import AsyncSubmitted, Error

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class AsyncSubmitFront:
    """A WSGI app: AsyncAPI submissions answered here, everything else by `flask_wsgi`."""

    def __init__(self, app: Flask, flask_wsgi: WsgiApp, settings: Settings) -> None:
        self._extensions = app.extensions  # read per request: a fast test may replace what they hold
        self._flask = flask_wsgi
        self._settings = settings

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        route = self._submission_to(environ)
        if route is None:
            return self._flask(environ, start_response)
        generation, api = route
        length = int(environ["CONTENT_LENGTH"])
        body = environ["wsgi.input"].read(length) if length else b""
        if len(body) != length:  # the client went away mid-body: nothing half-sent is stored
            error = Error(kind="bad_request", message=f"the body ended after {len(body)} of its {length} bytes")
            return _answer(start_response, 400, error.model_dump_json().encode())
        services: Services = self._extensions[context.SERVICES]
        key = environ.get("HTTP_IDEMPOTENCY_KEY")
        try:
            submission = Submission(api_name=api.name, body=body, content_type=environ.get("CONTENT_TYPE") or None,
                                    client_request_id=request_id_asked(environ.get("HTTP_X_REQUEST_ID"), key),
                                    batched=is_batched(api), route_generation=generation)
            request_id = submit_request(services.async_requests, services.request_objects, services.celery,
                                        submission, time.time(), services.task_messages)
            # Answered only once Redis's replicas have it (api/promises.py).
            services.acknowledgements.confirm(retry_by=key)
        except RouteChanged:
            # A deploy or delete since this process read the route, and nothing stored: Flask answers
            # the request on the route as the registry has it now (and this process keeps that one).
            environ["wsgi.input"] = io.BytesIO(body)
            return self._flask(environ, start_response)
        except Exception as e:  # noqa: BLE001 - answered as Flask's handlers answer it, then the next request
            status, error = error_of(e)
            retry = [(HEADER, key), ("Retry-After", "1")] if key and isinstance(e, NotAcknowledged) else []
            return _answer(start_response, status, error.model_dump_json(exclude_unset=True).encode(), retry)
        answer = AsyncSubmitted(id=request_id).model_dump_json(exclude_unset=True).encode()
        return _answer(start_response, 200, answer, [("X-Request-ID", request_id)])

    def _submission_to(self, environ: dict[str, Any]) -> tuple[int, DeployedApi] | None:
        """The AsyncAPI this request submits to and the registry generation its route was read at, when
        it is one this layer answers; else None.

        The route this process keeps is used as it is, without a round trip to Redis to ask whether
        the registry moved on: the submission's own script refuses it if so (`RouteChanged`)."""
        if environ.get("REQUEST_METHOD") != "POST":
            return None
        path = environ.get("PATH_INFO") or ""
        name = path[1:]
        if not path.startswith("/") or not name or "/" in name or name in RESERVED_NAMES:
            return None
        if not self._admitted(environ) or not self._within_limit(environ):
            return None
        route = context.kept_route(self._extensions, name)
        if route is None:
            try:
                route = context.read_route(self._extensions, name)
            except ApiNotFound:
                return None  # Flask's fallback says so
        return route if route[1].kind == ApiKind.ASYNC else None

    def _admitted(self, environ: dict[str, Any]) -> bool:
        """Whether the API-key check lets this request submit (`api/auth.py` answers those it does not)."""
        keys = self._settings.api_keys
        if not keys:
            return self._settings.allow_anonymous or open_bind_address(environ) is None
        try:
            authenticate(environ.get("HTTP_AUTHORIZATION"), keys)
        except Unauthorized:
            return False
        return True

    def _within_limit(self, environ: dict[str, Any]) -> bool:
        """A body of a stated length within the limit (Flask answers a larger one 413, and reads a chunked one)."""
        if environ.get("HTTP_TRANSFER_ENCODING"):
            return False
        try:
            length = int(environ.get("CONTENT_LENGTH") or "")
        except ValueError:
            return False
        return 0 <= length <= self._settings.max_body_bytes


def _answer(start_response: StartResponse, status: int, body: bytes,
            headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    HTTP_RESPONSES.labels(status=f"{status // 100}xx").inc()
    start_response(f"{status} {HTTPStatus(status).phrase}", [
        ("Content-Type", "application/json"), ("Content-Length", str(len(body))), *(headers or [])])
    return [body]
