"""Every error -> HTTP response mapping, in one place. Bodies are `{"kind", "message"}`."""

from __future__ import annotations

import logging

from flask import Flask, Response, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as BaseResponse

from foundation.errors import SluiceError

from .schemas import Error

log = logging.getLogger(__name__)


def error_response(status: int, kind: str, message: str) -> Response:
    return Error(kind=kind, message=message).response(status)


# Largest refused body read to its end before answering; beyond it the connection is just closed.
DRAIN_LIMIT_BYTES = 256 * 1024 * 1024


def _drain_body() -> None:
    """Read a refused body to its end, so the answer reaches the client.

    A server that answers 413 and closes while the body is still arriving makes the kernel reset
    the connection, and the proxy (or the client) loses the answer along with it.
    """
    length = request.content_length
    if not length or length > DRAIN_LIMIT_BYTES:
        return
    stream = request.environ.get("wsgi.input")
    if stream is None:
        return
    left = length
    try:
        while left > 0:
            chunk = stream.read(min(left, 1024 * 1024))
            if not chunk:
                break
            left -= len(chunk)
    except OSError:
        pass


def with_exception_headers(response: BaseResponse, e: HTTPException) -> BaseResponse:
    """Keep the headers the exception carries (a 405's `Allow`, RFC 9110), but not its HTML content type."""
    for name, value in e.get_headers():
        if name.lower() != "content-type":
            response.headers[name] = value
    return response


def error_of(e: Exception) -> tuple[int, Error]:
    """The status and body every handler answers an exception with (logged when it is the server's fault):
    a `SluiceError` its own, anything else a 500 `unexpected_error`. Werkzeug's HTTP errors are Flask's."""
    if isinstance(e, SluiceError):
        if e.http_status >= 500:
            log.error("%s: %s", e.kind, e.message)
        return e.http_status, Error(kind=e.kind, message=e.message)
    log.exception("unexpected error", exc_info=e)
    return 500, Error(kind="unexpected_error", message=f"{type(e).__name__}: {e}")


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(SluiceError)
    def _sluice_error(e: SluiceError) -> Response:
        status, body = error_of(e)
        return body.response(status)

    @app.errorhandler(HTTPException)
    def _http_error(e: HTTPException) -> ResponseReturnValue:
        kinds = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        status = e.code or 500
        message = e.description or e.name
        if status == 413:
            limit = request.max_content_length
            message = f"request body is larger than the limit of {limit} bytes" if limit else message
            _drain_body()
        response = error_response(status, kinds.get(status, e.name.lower().replace(" ", "_")), message)
        return with_exception_headers(response, e)

    @app.errorhandler(Exception)
    def _unexpected(e: Exception) -> Response:
        status, body = error_of(e)
        return body.response(status)
