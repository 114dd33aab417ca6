"""The one error tree of Sluice.

Every error a user can cause or meet is a `SluiceError`; each class names the HTTP status it
maps to, so `api/errors.py` turns any of them into a response in one place.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

TRACEBACK = "Traceback (most recent call last):"


def summary_line(message: str) -> str:
    """A message on one line: a predictor's traceback is cut down to the exception it ended with."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return "failed"
    for index, line in enumerate(lines):
        if TRACEBACK in line:
            before = line.split(TRACEBACK, 1)[0]
            after = [rest for rest in lines[index + 1:] if not rest.startswith(("File ", "^", "~"))]
            return before + (after[-1] if after else "(traceback)")
    return lines[0] + (" (...)" if len(lines) > 1 else "")


def did_you_mean(written: str, known: Iterable[str]) -> str:
    """` (did you mean X?)` for the known name closest to a misspelled one, "" when none is close:
    for messages about an unknown field or an API that is not deployed."""
    close = difflib.get_close_matches(written, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


class SluiceError(Exception):
    """Base of every error Sluice raises on purpose."""

    http_status = 500
    kind = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(SluiceError):
    """An API configuration (cortex.yaml) or project folder is invalid."""

    http_status = 400
    kind = "invalid_config"


class BadRequest(SluiceError):
    """A request body or parameter is malformed or breaks a rule."""

    http_status = 400
    kind = "bad_request"


class NotFound(SluiceError):
    """A named thing (API, job, bundle, file) does not exist."""

    http_status = 404
    kind = "not_found"


class ApiNotFound(NotFound):
    """No API of that name is deployed."""

    kind = "api_not_found"


class JobNotFound(NotFound):
    """No job of that id exists for that API."""

    kind = "job_not_found"


class Conflict(SluiceError):
    """The thing exists but is in the wrong state for the request."""

    http_status = 409
    kind = "conflict"


class PayloadTooLarge(SluiceError):
    """A request body is larger than Sluice accepts."""

    http_status = 413
    kind = "payload_too_large"


class PredictorError(SluiceError):
    """User predictor code failed to load or raised while running."""

    http_status = 500
    kind = "predictor_error"


class NotReady(SluiceError):
    """A dependency (Redis, a model, a worker) is not available yet."""

    http_status = 503
    kind = "not_ready"


class NotAcknowledged(SluiceError):
    """Redis's primary took a write, but no replica confirmed having it in time: a failover now
    could lose it. The caller may retry with the same idempotency key (the answer says it)."""

    http_status = 503
    kind = "not_acknowledged"


class RequestTimeout(SluiceError):
    """A realtime request was not answered by its deadline (the API's `request_timeout`)."""

    http_status = 504
    kind = "request_timeout"


class Forbidden(SluiceError):
    """A valid API key whose role may not make this request."""

    http_status = 403
    kind = "forbidden"


class OutOfMemory(SluiceError):
    """A request's predictor grew past its API's `compute.mem`: the request ends, and so does the
    process that ran it (foundation/memory_guard.py)."""

    http_status = 507
    kind = "out_of_memory"


class StorageError(SluiceError):
    """A storage backend failed in a way that is not the user's input."""

    http_status = 502
    kind = "storage_error"


class StorageNotFound(NotFound):
    """No object or folder exists at a storage URI."""

    kind = "storage_not_found"


class AccessDenied(SluiceError):
    """Storage refused access to a URI (credentials or permissions)."""

    http_status = 403
    kind = "access_denied"


class BadStorageUri(BadRequest):
    """A storage URI is malformed, of an unknown scheme, or outside the allowed local roots."""

    kind = "bad_storage_uri"


class ModelInputError(BadRequest):
    """A model input passed to a client's predict() does not fit the model's input signature."""

    kind = "invalid_model_input"


class ModelNotFound(NotFound):
    """No model of that name, or no version of that number, is served by the API."""

    kind = "model_not_found"


class Unauthorized(SluiceError):
    """The request carries no API key, or one Sluice does not know."""

    http_status = 401
    kind = "unauthorized"


class InsecureBind(SluiceError):
    """Sluice was asked to listen beyond loopback with no API key to ask for."""

    kind = "insecure_bind"


class MissingExtra(SluiceError):
    """This installation lacks the extra a feature needs (`pip install 'sluice[s3]'`); see pyproject.toml."""

    kind = "missing_extra"


class DependencyConflict(ConfigError):
    """A project's requirements would replace a library Sluice runs on (refused at deploy, both versions named)."""

    kind = "dependency_conflict"


class EnvironmentBuildFailed(SluiceError):
    """An API's Python environment could not be built on a host (the installer's or `dependencies.sh`'s message)."""

    kind = "environment_build_failed"
